"""A worker's bound on the memory its connections hold: its share of server.queued_max_request_bytes.

What counts (Connection.memory): bytes of requests not yet complete, of complete requests held back by the
output bound, and of responses not yet sent (sendfile ranges hold no memory and do not count). Requests
are served as soon as they are complete, so these are the bytes a client can make the worker keep.

Policy: backpressure, never a close.
- When the worker's total goes over its budget, every connection holding at least `heavy_bytes` (one
  socket read) stops being read, and so does any that gets there while the total stays over, except the
  one whose incomplete request is the oldest (the *exempt* one): it is read on, so something always completes, or times out, and frees memory. Connections
  holding less (clients sending ordinary requests, connections between requests) are read as usual; the
  kernel's socket buffers and then the senders wait for the stopped ones.
- Once the total is back under the budget, stopped connections resume, oldest request first, as many as
  one more read each still fits under it.

Bound: total <= budget + the exempt request (at most server.request_max_bytes) + under two reads per
connection still read (heavy_bytes, plus the read that took it there), whatever the clients send.

Invariants: `total` is the sum of `accounted` over the connections this budget has seen; the worker
calls `update(conn)` after anything that changes conn.memory and `forget(conn)` when it closes; the
budget only asks (pause/resume callbacks), the worker owns the connections and the loop.
"""

from __future__ import annotations

from typing import Callable

from shmbroker.workers.connection import Connection

Action = Callable[[Connection], None]


class MemoryBudget:
    def __init__(self, budget: int, heavy_bytes: int, pause: Action, resume: Action) -> None:
        self.budget = budget
        self.heavy_bytes = heavy_bytes
        self.total = 0
        self.paused: set[Connection] = set()  # stopped by this budget
        self.exempt: Connection | None = None
        self._exempt_order = 0
        self._heavy: set[Connection] = set()
        self._shedding = False  # over the budget since the heavy connections were stopped
        self._pause = pause
        self._resume = resume

    @property
    def engaged(self) -> bool:
        """True while end_turn has work: connections stopped, or over the budget."""
        return bool(self.paused) or self._shedding

    def update(self, conn: Connection) -> None:
        memory = conn.memory
        if memory == conn.accounted and memory < self.heavy_bytes:
            return  # the common case (nothing held before or after): nothing to count or decide
        self.total += memory - conn.accounted
        conn.accounted = memory
        if memory < self.heavy_bytes:
            self._heavy.discard(conn)
            return
        self._heavy.add(conn)
        if self.total > self.budget and conn not in self.paused:
            if self.exempt is None or not self._still_exempt():
                self._choose_exempt()
            for heavy in (list(self._heavy) if not self._shedding else [conn]):
                if heavy is not self.exempt and heavy not in self.paused:
                    self.paused.add(heavy)
                    self._pause(heavy)
            self._shedding = True

    def forget(self, conn: Connection) -> None:
        self.total -= conn.accounted
        conn.accounted = 0
        self._heavy.discard(conn)
        self.paused.discard(conn)
        if conn is self.exempt:
            self.exempt = None

    def end_turn(self) -> None:
        """Before the worker sleeps, while connections are stopped: keep one exempt connection reading (the
        oldest incomplete request: progress, even when the total sits just under the budget with no room for
        another read); resume what fits under the budget."""
        if self.total <= self.budget:
            self._shedding = False
        if not self.paused:
            return
        if self.exempt is None or not self._still_exempt():
            self._choose_exempt()
            if self.exempt in self.paused:
                self._resume_one(self.exempt)
        room = self.budget - self.total
        if room < self.heavy_bytes:
            return
        for conn in sorted(self.paused, key=_age):
            if room < self.heavy_bytes:
                break
            self._resume_one(conn)
            room -= self.heavy_bytes

    # -- internals --------------------------------------------------------------------------------

    def _still_exempt(self) -> bool:
        exempt = self.exempt
        return (not exempt.closed and exempt.request_since is not None
                and exempt.request_order == self._exempt_order)

    def _choose_exempt(self) -> None:
        candidates = [c for c in self._heavy if c.request_since is not None and not c.closed]
        self.exempt = min(candidates, key=_age, default=None)
        self._exempt_order = self.exempt.request_order if self.exempt is not None else 0

    def _resume_one(self, conn: Connection) -> None:
        self.paused.discard(conn)
        self._resume(conn)


def _age(conn: Connection) -> tuple[int, int]:
    """Oldest incomplete request first; connections between requests (held responses) last."""
    return (0, conn.request_order) if conn.request_since is not None else (1, 0)
