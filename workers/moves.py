"""Connections moving between workers, this worker's side; the sockets travel over shm.handoff.

Arriving: a connection a peer passed here (balanced at its accept, workers.balance, or moved by affinity) is
served as if accepted here and read at once: what its client sent meanwhile waits unread in the socket. One
whose client left on the way is closed without a log line; a malformed handoff is dropped with one.

Leaving: workers.affinity decides which connection moves, and where to; this side moves it.

Invariants:
- A connection leaves only when nothing of it is in flight here (no request read and unanswered, no byte
  buffered either way, no delayed request, no pause) and only between requests served: the worker offers the
  due connections it wrote out, before it sleeps (`move_quiet`). One not quiet yet is offered again after its
  next write; one the destination cannot take now stays (workers.affinity forgets the move when the balance
  forbids it).
- A connection that left is closed here as if its client had gone (this worker's copy and accounting only);
  the socket and every byte its client sent since live on in the peer.
- Counts for the stats segment: `balanced_in` here; moves in and out in workers.affinity.
"""

from __future__ import annotations

import logging
import socket
from typing import Any, Callable, Iterable

from shmbroker.shm.handoff import AFFINITY, BALANCE, Handoffs
from shmbroker.workers.affinity import ConnectionAffinity
from shmbroker.workers.connection import Connection
from shmbroker.workers.eventloop import EventLoop
from shmbroker.workers.limits import ConnectionLimits

log = logging.getLogger("shmbroker.worker")

_STREAM = socket.SocketKind.SOCK_STREAM


class ConnectionMoves:
    def __init__(self, handoffs: Handoffs, affinity: ConnectionAffinity | None, waits: Callable[[Connection], bool],
                 limits: ConnectionLimits, loop: EventLoop, adopt: Callable[[socket.socket, Any, int], Connection],
                 read: Callable[[Connection], None], close: Callable[[Connection], None]) -> None:
        self.handoffs = handoffs
        self.affinity = affinity
        self._waits = waits  # whether a connection has a request waiting on the timer (it stays then)
        self.limits = limits
        self.loop = loop
        self._adopt = adopt  # serve a socket here (the worker's, as for an accepted one)
        self._read = read  # the worker's read handler of a connection
        self._close = close  # the worker's close: forgets a connection here
        self.balanced_in = 0  # for the stats segment

    def start(self) -> None:
        self.loop.watch(self.handoffs.receiving_fd, self.receive)

    def close(self) -> None:
        self.handoffs.close()

    def receive(self) -> None:
        """The connections peers passed here: adopted, then read at once."""
        for fd, sender, reason in self.handoffs.receive():
            sock = socket.socket(fileno=fd)
            if sender is None or sock.type != _STREAM:
                log.warning("dropping a malformed handoff (sender %s, %r)", sender, sock.type)
                sock.close()
                continue
            try:
                peer = sock.getpeername()
            except OSError:  # its client left while it was on the way: nothing to serve
                sock.close()
                continue
            conn = self._adopt(sock, peer, self.limits.bucket_of(peer[0] if isinstance(peer, tuple) else str(peer)))
            if reason == BALANCE:
                self.balanced_in += 1
            elif self.affinity is not None:
                self.affinity.adopted(conn, self.loop.now)
            self._read(conn)

    def move_quiet(self, written: Iterable[Connection]) -> None:
        """Before sleeping, when no request is being served: pass each due connection written out this turn to
        its peer, if nothing of it is in flight here."""
        for conn in written:
            if (conn.closed or conn.slots or conn.outq or conn.held or conn.paused or conn.mutes
                    or conn.partial_bytes or self._waits(conn)):
                continue
            peer = self.affinity.destination(conn)
            if peer is None or not self.handoffs.send(peer, conn.fd, AFFINITY):
                continue
            self._close(conn)  # this worker's copy and its accounting only: the socket lives on in the peer
            self.affinity.sent()
