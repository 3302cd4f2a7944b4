"""The network worker's event loop, as Redis's ae.c: file events, timers, and before/after-sleep hooks, with
no server logic of its own.

One turn: run the before-sleep hooks (each may cap the sleep: None = no cap, 0 = do not sleep), sleep in one
epoll wait until a file event or the first timer is due, note the time (`now`), run the after-sleep hooks, then
the handlers of the file events that fired (read first, then write), then the timers that are due.

Invariants:
- The loop never blocks anywhere but in its one epoll wait; handlers must not block either.
- A file object is registered at most once, with a read handler, an optional write handler and an optional
  hang-up handler. It is selected for writing only while it has a write handler, and for reading unless its
  reads are paused (`pause_reading`, for backpressure: the kernel then holds what the peer sends, and the
  peer's sends block). A paused file object is still watched for its end: if the peer resets or closes it
  (EPOLLHUP, EPOLLERR, EPOLLRDHUP) while paused, its hang-up handler runs (default: the read handler), so a
  connection nobody reads from is still noticed when it goes.
- A timer runs once, at or after its time (monotonic seconds), in time order; a cancelled one never runs.
- `now` is the monotonic time taken when the last sleep ended: one clock read per turn for every handler
  that only needs to know roughly when (activity timestamps).
- `stop()` ends the loop after the current turn (a later `run()` starts it again).
"""

from __future__ import annotations

import heapq
import itertools
import select
import time
from typing import Any, Callable

Handler = Callable[[], None]

_IN = select.EPOLLIN
_OUT = select.EPOLLOUT
_RDHUP = select.EPOLLRDHUP
_GONE = select.EPOLLHUP | select.EPOLLERR  # always reported by epoll, whatever the mask
_HANGUP = _GONE | _RDHUP


class Timer:
    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback: Handler) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.callback = None  # what it holds goes now, not when the timer leaves the heap (no cycle through it)


class _Watch:
    __slots__ = ("fd", "on_read", "on_write", "on_hangup", "reading")

    def __init__(self, fd: int, on_read: Handler, on_write: Handler | None, on_hangup: Handler | None) -> None:
        self.fd = fd
        self.on_read = on_read
        self.on_write = on_write
        self.on_hangup = on_hangup
        self.reading = True

    @property
    def mask(self) -> int:
        # A paused watch asks for RDHUP only: the peer's FIN or reset wakes us, its data does not.
        return (_IN if self.reading else _RDHUP) | (_OUT if self.on_write is not None else 0)


def _fileno(fileobj: Any) -> int:
    return fileobj if isinstance(fileobj, int) else fileobj.fileno()


class EventLoop:
    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._watches: dict[int, _Watch] = {}
        self._timers: list[tuple[float, int, Timer]] = []
        self._sequence = itertools.count()
        self._before_sleep: list[Callable[[], float | None]] = []
        self._after_sleep: list[Handler] = []
        self._stopped = False
        self.now = time.monotonic()

    # -- file events --------------------------------------------------------------------------

    def watch(self, fileobj: Any, on_read: Handler, on_write: Handler | None = None,
              on_hangup: Handler | None = None) -> None:
        fd = _fileno(fileobj)
        if fd in self._watches:
            raise KeyError(f"fd {fd} is already watched")
        watch = _Watch(fd, on_read, on_write, on_hangup)
        self._epoll.register(fd, watch.mask)
        self._watches[fd] = watch

    def _update(self, fileobj: Any, **changes: Any) -> None:
        watch = self._watches[_fileno(fileobj)]
        for name, value in changes.items():
            setattr(watch, name, value)
        self._epoll.modify(watch.fd, watch.mask)

    def want_write(self, fileobj: Any, on_write: Handler | None) -> None:
        """Select `fileobj` for writing with this handler, or (None) stop selecting it for writing."""
        self._update(fileobj, on_write=on_write)

    def pause_reading(self, fileobj: Any) -> None:
        """Stop selecting `fileobj` for reading (its hang-up is still noticed); idempotent."""
        if self._watches[_fileno(fileobj)].reading:
            self._update(fileobj, reading=False)

    def resume_reading(self, fileobj: Any) -> None:
        if not self._watches[_fileno(fileobj)].reading:
            self._update(fileobj, reading=True)

    def reading(self, fileobj: Any) -> bool:
        return self._watches[_fileno(fileobj)].reading

    def unwatch(self, fileobj: Any) -> None:
        try:
            fd = _fileno(fileobj)
        except (OSError, ValueError):
            return
        if self._watches.pop(fd, None) is not None:
            try:
                self._epoll.unregister(fd)
            except OSError:
                pass

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

    def _sleep_cap(self) -> float:
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
        return -1 if cap is None else cap

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.callback()

    def run(self) -> None:
        watches = self._watches
        self._stopped = False
        while not self._stopped:
            timeout = self._sleep_cap()
            if self._stopped:
                break
            try:
                events = self._epoll.poll(timeout)
            except InterruptedError:
                events = []
            self.now = time.monotonic()
            for hook in self._after_sleep:
                hook()
            for fd, mask in events:
                watch = watches.get(fd)
                if watch is None:
                    continue  # unwatched by an earlier handler of this turn
                if watch.reading:
                    if mask & (_IN | _GONE):
                        watch.on_read()
                elif mask & _HANGUP:
                    (watch.on_hangup or watch.on_read)()
                if mask & (_OUT | _GONE) and watches.get(fd) is watch and watch.on_write is not None:
                    watch.on_write()
            self._run_timers()

    def close(self) -> None:
        self._epoll.close()
