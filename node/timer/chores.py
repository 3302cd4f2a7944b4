"""Periodic chores of the timer process (producer-state snapshots, retention), as timers on a wheel.

Each chore is an entry in a TimingWheel of its own, due every `interval_ms`. The timer loop advances
the scheduler with its clock and sleeps no longer than `next_expiration()`; a chore that comes due is
handed to `run` (the timer process gives it to the flusher thread, which does the node's background
I/O), or, if it is `inline`, called right there (chores on state the timer loop owns, such as committed
offsets), and re-armed one interval after the moment it ran, so a slow chore never piles up runs.

Invariants: every chore is armed exactly once at any time; a chore runs at most once per interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from shmbroker.node.config import WheelConfig
from shmbroker.node.timer.wheel import TimingWheel


@dataclass(frozen=True)
class Chore:
    name: str
    interval_ms: int
    job: Callable[..., Any]
    inline: bool = False  # run in the timer loop's thread (job()), not handed to `run`


class ChoreScheduler:
    def __init__(self, wheel: WheelConfig, start_ms: int, run: Callable[[Chore], None]) -> None:
        self._wheel = TimingWheel(wheel.tick_ms, wheel.wheel_size, start_ms)
        self._armed: dict[int, Chore] = {}
        self._run = run

    def every(self, name: str, interval_ms: int, job: Callable[..., Any], now_ms: int, inline: bool = False) -> None:
        """Run `job` every interval_ms, the first time one interval from now."""
        self._arm(Chore(name, interval_ms, job, inline), now_ms)

    def _arm(self, chore: Chore, now_ms: int) -> None:
        self._armed[self._wheel.add(now_ms + chore.interval_ms)] = chore

    def next_expiration(self) -> int | None:
        return self._wheel.next_expiration()

    def advance(self, now_ms: int) -> None:
        for handle in self._wheel.advance(now_ms).tolist():
            chore = self._armed.pop(handle)
            if chore.inline:
                chore.job()
            else:
                self._run(chore)
            self._arm(chore, now_ms)
