"""A connection's deadlines: it is closed when idle for server.connections_max_idle_ms (nothing in flight and
nothing held back), or when its request stays incomplete for server.request_timeout_ms while it is read (the
time its reading was paused does not count, workers.connection). 0 turns either off. Each cause logs one
line per server.limit_log_interval_ms for the whole node, counting the rest.

Invariants: one timer per connection (Connection.timer, cancelled by the worker when it closes the
connection), never set further ahead than the shorter of the two periods, so a request that begins meanwhile
is caught in time without re-arming the timer on every read.
"""

from __future__ import annotations

import time
from typing import Callable

from shmbroker.node.config import ServerConfig
from shmbroker.node.logging_setup import RateLimitedLog
from shmbroker.workers.connection import Connection
from shmbroker.workers.eventloop import EventLoop


class ConnectionDeadlines:
    def __init__(self, server: ServerConfig, loop: EventLoop, limit_log: RateLimitedLog,
                 close: Callable[[Connection], None]) -> None:
        self.idle_s = server.connections_max_idle_ms / 1000 if server.connections_max_idle_ms > 0 else None
        self.request_timeout_s = server.request_timeout_ms / 1000 if server.request_timeout_ms > 0 else None
        periods = [s for s in (self.idle_s, self.request_timeout_s) if s is not None]
        self.period_s = min(periods) if periods else None  # None: no deadline at all
        self.loop = loop
        self.limit_log = limit_log
        self._close = close  # the worker's close

    def arm(self, conn: Connection) -> None:
        """A new connection's first look, one period from now."""
        conn.timer = self.loop.call_at(self.loop.now + self.period_s, lambda: self._check(conn))

    def _check(self, conn: Connection) -> None:
        """Close it if idle or if its request is incomplete for too long; else look again by its next deadline."""
        if conn.closed:
            return
        now = time.monotonic()
        due = now + self.period_s
        if conn.request_since is not None:
            if self.request_timeout_s is not None and not conn.paused:
                incomplete_s = now - conn.request_since
                if incomplete_s >= self.request_timeout_s:
                    self._close_for("server.request_timeout_ms", conn, "request incomplete for %d ms",
                                    incomplete_s)
                    return
                due = min(due, conn.request_since + self.request_timeout_s)
        elif self.idle_s is not None and not conn.slots and not conn.held:
            idle_s = now - conn.last_active
            if idle_s >= self.idle_s:
                self._close_for("server.connections_max_idle_ms", conn, "idle for %d ms", idle_s)
                return
            due = min(due, conn.last_active + self.idle_s)
        conn.timer = self.loop.call_at(due, lambda: self._check(conn))

    def _close_for(self, setting: str, conn: Connection, what: str, seconds: float) -> None:
        self.limit_log.warning(setting, "closing connection from %s: " + what + " (%s)", conn.peer,
                               seconds * 1000, setting)
        self._close(conn)
