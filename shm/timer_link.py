"""A child's end of its two rings to the timer process (a network worker's, a log cleaner's): frames out,
messages in.

Invariants:
- Sending never blocks: frames go to a local backlog, and `flush()` moves as many as the request
  ring takes (one head update for the batch); the rest wait for the next turn, in order.
- A frame sent with `needed_by_ms` (NOT_URGENT: a cancel) may wait in the ring until the timer wakes by itself,
  if it sleeps until no later than that (shm.ring, "Lazy wakeups"); a flush that carries any other frame rings
  the timer as always. (Long polls' DELAY_FETCHes were tried so, needed by their deadline: the timer's CPU per
  long poll fell 7-18% at 1,000-5,000/s, but at 1,000/s the clients' lateness p99 went from 2-3 ms to 5-14 ms
  on this 2-core VM, so they ring.)
- Both ring ends are taken over on attach (`takeover=True`): a restarted child resumes from the
  committed head and tail its dead predecessor left.
- What comes back is decoded with the contract (shm.messages); a frame that does not decode, or that
  is not a timer -> worker kind, is logged and dropped: it never stops the worker.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from shmbroker.shm import instance as shm_instance
from shmbroker.shm import messages as M
from shmbroker.shm.doorbell import EventfdDoorbell, SemaphoreDoorbell
from shmbroker.shm.ring import RingConfig, RingReader, RingWriter

log = logging.getLogger("shmbroker.timer_client")
NOT_URGENT = 1 << 62  # needed_by_ms of a frame the timer may take whenever it wakes (a cancel)


class TimerLink:
    def __init__(self, instance: str, index: int, rings: RingConfig, bell_fd: int) -> None:
        self.bell = EventfdDoorbell(bell_fd)
        self.timer_bell = SemaphoreDoorbell(shm_instance.timer_doorbell_name(instance))
        self.writer = RingWriter(shm_instance.request_ring_name(instance, index), self.timer_bell,
                                 config=rings, takeover=True)
        self.reader = RingReader(shm_instance.completion_ring_name(instance, index), config=rings, takeover=True)
        self.backlog: deque[bytes] = deque()
        self._needed_by_ms: int | None = NOT_URGENT  # the backlog's earliest need; None: at once
        self.frames_sent = 0  # for the stats segment
        self.frames_received = 0

    @property
    def doorbell_fd(self) -> int:
        return self.bell.fileno()

    # -- sending -----------------------------------------------------------------------------

    def send(self, frame: bytes, needed_by_ms: int | None = None) -> None:
        """Queue a frame for the next flush; `needed_by_ms`: the timer needs it by then (None: at once)."""
        self.backlog.append(frame)
        if self._needed_by_ms is not None:
            self._needed_by_ms = None if needed_by_ms is None else min(self._needed_by_ms, needed_by_ms)

    def flush(self) -> None:
        if not self.backlog:
            return
        self.writer.lazy_until_ms = self._needed_by_ms
        try:
            written = self.writer.write_many(self.backlog)
        finally:
            self.writer.lazy_until_ms = None
        self.frames_sent += written
        for _ in range(written):
            self.backlog.popleft()
        if not self.backlog:
            self._needed_by_ms = NOT_URGENT  # what stays keeps its need (at worst a ring too many)

    def backlogged(self) -> bool:
        return bool(self.backlog)

    # -- receiving ---------------------------------------------------------------------------

    def announce_sleep(self) -> bool:
        return self.reader.announce_sleep()

    def woke(self) -> None:
        self.reader.woke()

    def drain_doorbell(self) -> None:
        self.bell.drain()

    def receive(self) -> list[Any]:
        """The messages the timer sent since the last call, decoded (shm.messages named tuples)."""
        frames = self.reader.read_batch()
        if not frames:
            return []
        out = []
        self.frames_received += len(frames)
        for frame in frames:
            try:
                message = M.decode(frame)
            except M.MessageError as exc:
                log.warning("dropping an undecodable frame from the timer: %s", exc)
                continue
            if message.kind < M.FIRST_TIMER_KIND:
                log.warning("dropping a %s frame: not a message from the timer", message.kind.name)
                continue
            out.append(message)
        self.reader.release()
        return out

    def close(self) -> None:
        self.flush()
        for end in (self.writer, self.reader):
            end.close()
        self.bell.close()
        self.timer_bell.close()
