"""The network worker's event loop, as Redis's ae.c: file events, timers, and before/after-sleep hooks, with
no server logic of its own.

One turn: run the before-sleep hooks (each may cap the sleep: None = no cap, 0 = do not sleep), sleep in one
select() until a file event or the first timer is due, run the after-sleep hooks, then the handlers of the
file events that fired (read first, then write), then the timers that are due.

Invariants:
- The loop never blocks anywhere but in its one select(); handlers must not block either.
- A file object is registered at most once, with a read handler and an optional write handler; it is
  selected for reading unless paused, and for writing only while it has a write handler.
- A timer runs once, at or after its time (monotonic seconds), in time order; a cancelled one never runs.
- `stop()` ends the loop after the current turn.
"""

from __future__ import annotations

import heapq
import itertools
import selectors
import time
from typing import Any, Callable

Handler = Callable[[], None]


class Timer:
    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback: Handler) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class EventLoop:
    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self._files: dict[Any, list] = {}  # file object -> [read handler, write handler, reading paused]
        self._timers: list[tuple[float, int, Timer]] = []
        self._sequence = itertools.count()
        self._before_sleep: list[Callable[[], float | None]] = []
        self._after_sleep: list[Handler] = []
        self._stopped = False

    # -- file events --------------------------------------------------------------------------

    def watch(self, fileobj: Any, on_read: Handler, on_write: Handler | None = None) -> None:
        self._files[fileobj] = [on_read, on_write, False]
        self._apply(fileobj)

    def want_write(self, fileobj: Any, on_write: Handler | None) -> None:
        """Select `fileobj` for writing with this handler, or (None) stop selecting it for writing."""
        self._files[fileobj][1] = on_write
        self._apply(fileobj)

    def pause_reading(self, fileobj: Any) -> None:
        """Stop selecting `fileobj` for reading until resume_reading (its write handler, if any, stays)."""
        entry = self._files.get(fileobj)
        if entry is not None and not entry[2]:
            entry[2] = True
            self._apply(fileobj)

    def resume_reading(self, fileobj: Any) -> None:
        entry = self._files.get(fileobj)
        if entry is not None and entry[2]:
            entry[2] = False
            self._apply(fileobj)

    def unwatch(self, fileobj: Any) -> None:
        if self._files.pop(fileobj, None) is not None:
            try:
                self.selector.unregister(fileobj)
            except (KeyError, ValueError):
                pass

    def _apply(self, fileobj: Any) -> None:
        on_read, on_write, paused = self._files[fileobj]
        events = (0 if paused else selectors.EVENT_READ) | (selectors.EVENT_WRITE if on_write else 0)
        try:
            key = self.selector.get_key(fileobj)
        except KeyError:
            key = None
        if not events:
            if key is not None:
                self.selector.unregister(fileobj)
        elif key is None:
            self.selector.register(fileobj, events, (on_read, on_write))
        else:
            self.selector.modify(fileobj, events, (on_read, on_write))

    # -- timers and hooks ---------------------------------------------------------------------

    def call_at(self, when: float, callback: Handler) -> Timer:
        timer = Timer(when, callback)
        heapq.heappush(self._timers, (when, next(self._sequence), timer))
        return timer

    def call_later(self, delay_s: float, callback: Handler) -> Timer:
        return self.call_at(time.monotonic() + delay_s, callback)

    def before_sleep(self, hook: Callable[[], float | None]) -> None:
        """Run `hook` before every sleep; its result caps the sleep in seconds (None: no cap)."""
        self._before_sleep.append(hook)

    def after_sleep(self, hook: Handler) -> None:
        self._after_sleep.append(hook)

    def stop(self) -> None:
        self._stopped = True

    # -- the loop -----------------------------------------------------------------------------

    def _sleep_cap(self) -> float | None:
        cap = None
        for hook in self._before_sleep:
            limit = hook()
            if limit is not None:
                cap = limit if cap is None else min(cap, limit)
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        if self._timers:
            due = max(0.0, self._timers[0][0] - time.monotonic())
            cap = due if cap is None else min(cap, due)
        return cap

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.callback()

    def run(self) -> None:
        while not self._stopped:
            timeout = self._sleep_cap()
            if self._stopped:
                break
            events = self.selector.select(timeout)
            for hook in self._after_sleep:
                hook()
            for key, mask in events:
                on_read, on_write = key.data
                if mask & selectors.EVENT_READ:
                    on_read()
                if mask & selectors.EVENT_WRITE and on_write is not None:
                    on_write()
            self._run_timers()

    def close(self) -> None:
        self.selector.close()
