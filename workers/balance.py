"""New connections balanced over the workers (server.balance_connections): the accepting worker passes a new
connection, before any byte of it is read, to the live worker holding the fewest, when that one holds fewer
than this one. The kernel's SO_REUSEPORT hash places a client's few connections on the workers unevenly; this
deals them out as Kafka's acceptor does.

Invariants:
- A connection goes to a peer only if the peer holds fewer than this worker holds now, counting the
  connections passed to it in the same accept call (they are not in its shm.connections count yet): it ends
  with no more than this one keeps.
- Only to a peer whose loop turned within two heartbeat intervals (its beats as the supervisor's HangWatch
  reads them, shm.heartbeat.BeatWatch): a stopped, hung or dead one would leave the connection waiting for
  the supervisor. The peers' beats are looked at every heartbeat interval from `start()` on, so the first
  accept after a peer stopped can tell.
- A connection the peer's inbox refuses (full, or gone) stays with this worker; one passed is closed here (its
  socket lives on in the peer) and counted in `balanced_out`.
"""

from __future__ import annotations

import socket

from shmbroker.shm.connections import WorkerConnections
from shmbroker.shm.handoff import BALANCE, Handoffs
from shmbroker.shm.heartbeat import BeatWatch, HeartbeatTable, worker_slot
from shmbroker.workers.eventloop import EventLoop


class ConnectionBalance:
    def __init__(self, index: int, handoffs: Handoffs, rows: list[WorkerConnections], heartbeats: HeartbeatTable,
                 heartbeat_interval_s: float, loop: EventLoop) -> None:
        self.index = index
        self.handoffs = handoffs
        self.rows = rows  # every worker's connection counts, by worker index
        self.heartbeat_interval_s = heartbeat_interval_s
        self.loop = loop
        self._peer_beats = BeatWatch(heartbeats)
        self.balanced_out = 0  # for the stats segment

    def start(self) -> None:
        self._look_at_peers()

    def pass_to_fewest(self, sock: socket.socket, passed: dict[int, int]) -> bool:
        """Pass a new connection to the live peer holding the fewest, if it holds fewer than this worker;
        `passed` counts the connections passed to each peer in this accept call. True if passed."""
        rows = self.rows
        fewest, count = None, rows[self.index].count  # the peer must hold fewer than this one holds now
        for peer in self.handoffs.peers():
            held = rows[peer].count + passed.get(peer, 0)
            if held < count and self._turning(peer):
                fewest, count = peer, held
        if fewest is None or not self.handoffs.send(fewest, sock.fileno(), BALANCE):
            return False
        sock.close()  # this worker's copy: the socket lives on in the peer
        passed[fewest] = passed.get(fewest, 0) + 1
        self.balanced_out += 1
        return True

    def _turning(self, peer: int) -> bool:
        """Whether a peer's loop turned within two heartbeat intervals."""
        beats, silent_s = self._peer_beats.look(worker_slot(peer), self.loop.now)
        return beats > 0 and silent_s <= 2 * self.heartbeat_interval_s

    def _look_at_peers(self) -> None:
        """Every heartbeat interval: the peers' beats, so that _turning sees a peer that stopped (a first look
        could not tell)."""
        now = self.loop.now
        for peer in self.handoffs.peers():
            self._peer_beats.look(worker_slot(peer), now)
        self.loop.call_later(self.heartbeat_interval_s, self._look_at_peers)
