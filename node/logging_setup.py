"""Logging of every process of the node: one line per record on stderr, naming the process's role and pid.

Invariants: each process calls `setup_logging` once, first thing in its main(), so every later record
(a child's boot included) carries its role. What clients can cause over and over is logged through a
RateLimitedLog: one line per cause per interval, counting the ones left out.
"""

from __future__ import annotations

import logging
import sys
import time


def setup_logging(role: str) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {role}[%(process)d] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,  # a child forked by the supervisor replaces the supervisor's handler (node.supervisor)
    )


class RateLimitedLog:
    """Warnings of one kind (`key`) at most once per interval; the next line says how many were left out.

    For causes that a client can repeat at will (refused connections, timeouts), so the log stays readable.
    """

    def __init__(self, logger: logging.Logger, interval_s: float, clock=time.monotonic, marks=None) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        # Where the time of each key's last line is kept: this process (a dict), or shared by the processes
        # of the node (an object whose claim(key, now, interval_s) marks the key and says whether it was due,
        # atomically across the processes: shm.connections.LogMarks).
        self.marks = marks
        self._last: dict[object, float] = {}
        self._left_out: dict[object, int] = {}

    def warning(self, key: object, message: str, *args: object) -> bool:
        """Log `message % args` unless `key` was logged less than an interval ago; True if logged."""
        now = self.clock()
        if self.marks is not None:
            due = self.marks.claim(key, now, self.interval_s)
        else:
            last = self._last.get(key)
            due = last is None or now - last >= self.interval_s
            if due:
                self._last[key] = now
        if not due:
            self._left_out[key] = self._left_out.get(key, 0) + 1
            return False
        left_out = self._left_out.pop(key, 0)
        if left_out:
            message += " (and %d more like it since the last such line)"
            args = args + (left_out,)
        self.logger.warning(message, *args)
        return True
