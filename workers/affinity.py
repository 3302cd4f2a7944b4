"""Connection affinity: a consumer whose long polls another worker's appends keep answering moves to that
worker (shm.handoff passes its socket).

Each worker accepts on its own SO_REUSEPORT listener, so the kernel places a producer and its consumer on
workers by a hash of their addresses. Placed apart, every record costs the appending worker a doorbell
ring and the consumer's worker a wake-up (tens of microseconds each on a virtual CPU, and a second
process's scheduling tail) before the fetch is answered. Placed together, the appending worker answers
the fetch right after the append (workers.timer_client.delayed). So a connection whose last `waits` long polls were
all answered by one peer's appends moves to that peer, at a quiet moment.

Invariants:
- A move needs `waits` answers in a row from the same peer's appends; an answer from this worker's own
  append, or from another peer, starts the count again. A fetch that found its records at once, or that
  expired, does not count either way.
- A connection moves at most once per `cooldown_s` in a worker (its adoption starts the clock), so two
  producers on two workers feeding one consumer cannot bounce it back and forth faster than that.
- Balance: a move never leaves the destination with more than `slack` connections over what this worker
  keeps (the workers' counts are read from shm.connections). A few latency-bound consumers gather with
  their producer; thousands of waiters stay spread over the workers.
- Only the decision lives here: the worker moves a due connection when it is quiet (no request in
  flight, nothing buffered either way, no delayed request, not paused), see workers.moves.
"""

from __future__ import annotations

from typing import Callable

from shmbroker.workers.connection import Connection


class ConnectionAffinity:
    def __init__(self, index: int, waits: int, slack: int, cooldown_s: float,
                 connections_of: Callable[[int], int]) -> None:
        self.index = index
        self.waits = waits
        self.slack = slack
        self.cooldown_s = cooldown_s
        self._connections_of = connections_of  # worker index -> its open connections
        self._streaks: dict[Connection, tuple[int, int]] = {}  # connection -> (answering peer, answers in a row)
        self._adopted_at: dict[Connection, float] = {}
        self.due: dict[Connection, int] = {}  # connection -> the peer it moves to at its next quiet moment
        self.moved_out = 0  # for the stats segment
        self.moved_in = 0

    def answered(self, conn: Connection, appender: int | None, now: float) -> None:
        """An append by worker `appender` (None: unknown) answered one of `conn`'s long polls."""
        if appender is None:
            return
        if appender == self.index:
            self._streaks.pop(conn, None)
            self.due.pop(conn, None)
            return
        peer, count = self._streaks.get(conn, (appender, 0))
        count = count + 1 if peer == appender else 1
        self._streaks[conn] = (appender, count)
        if count >= self.waits and now >= self._adopted_at.get(conn, now - self.cooldown_s) + self.cooldown_s:
            self.due[conn] = appender
        else:
            self.due.pop(conn, None)

    def destination(self, conn: Connection) -> int | None:
        """The peer a due connection may move to now (balance allowing), else None."""
        peer = self.due.get(conn)
        if peer is None:
            return None
        if self._connections_of(peer) + 1 > self._connections_of(self.index) - 1 + self.slack:
            self.due.pop(conn, None)  # counted again from its next answers
            self._streaks.pop(conn, None)
            return None
        return peer

    def sent(self) -> None:
        """A due connection was passed to its peer (the worker then forgets it here)."""
        self.moved_out += 1

    def adopted(self, conn: Connection, now: float) -> None:
        """A connection a peer passed here: its cooldown starts now."""
        self._adopted_at[conn] = now
        self.moved_in += 1

    def forget(self, conn: Connection) -> None:
        self._streaks.pop(conn, None)
        self._adopted_at.pop(conn, None)
        self.due.pop(conn, None)
