"""The timer process's outbox: every message it sends to the workers, over one completion ring each.

Completions gathered during a loop turn go out as one COMPLETION frame per worker at the end of the
turn, or as soon as `chunk` of them wait for one worker (a long-poll fan-out completes thousands in one
turn: the worker starts on the first ones while the timer completes the rest). Other messages (topic
outcomes, layout changes, the start announcement) keep their order among them.

Invariants:
- Nothing here blocks: frames a full ring does not take wait in that worker's queue, in order, and
  `flush()` retries them every turn; the timer never waits for a worker.
- A worker's messages leave in the order they were queued (completions are queued when a chunk fills
  or the turn's flush begins, behind what was queued before them).
"""

from __future__ import annotations

from shmbroker.shm import messages as M
from shmbroker.shm.ring import RingWriter


class Outbox:
    def __init__(self, writers: list[RingWriter], chunk: int = M.MAX_ITEMS) -> None:
        self.writers = writers
        self.chunk = max(1, min(chunk, M.MAX_ITEMS))
        self._queued: list[list[bytes]] = [[] for _ in writers]
        self._completions: list[list[tuple[int, int, int]]] = [[] for _ in writers]
        self.frames_sent = [0] * len(writers)  # per completion ring, for the stats segment

    @property
    def workers(self) -> int:
        return len(self.writers)

    def complete(self, worker: int, request_id: int, status: M.Status, error_code: int = 0) -> None:
        items = self._completions[worker]
        items.append((request_id, status, error_code))
        if len(items) >= self.chunk:
            self._queue_completions(worker)
            self._write(worker)

    def complete_many(self, worker: int, request_ids: list[int], statuses: list[int]) -> None:
        """complete() of many requests of one worker (error code 0 each), in one call: a wheel slot's expiries."""
        items = self._completions[worker]
        items.extend(zip(request_ids, statuses, [0] * len(request_ids)))
        if len(items) >= self.chunk:
            self._queue_completions(worker)
            self._write(worker)

    def send(self, worker: int, frame: bytes) -> None:
        self._queued[worker].append(frame)

    def broadcast(self, frame: bytes) -> None:
        for queue in self._queued:
            queue.append(frame)

    def pending(self) -> bool:
        return any(self._queued) or any(self._completions)

    def flush(self) -> None:
        for worker in range(len(self.writers)):
            self._queue_completions(worker)
            self._write(worker)

    def _queue_completions(self, worker: int) -> None:
        items = self._completions[worker]
        if items:
            chunk = self.chunk  # <= MAX_ITEMS; complete_many may have gone past it
            for start in range(0, len(items), chunk):
                self._queued[worker].append(M.encode(M.Kind.COMPLETION, items=items[start:start + chunk]))
            self._completions[worker] = []

    def _write(self, worker: int) -> None:
        frames = self._queued[worker]
        if frames:
            written = self.writers[worker].write_many(frames)
            self.frames_sent[worker] += written
            del frames[:written]
