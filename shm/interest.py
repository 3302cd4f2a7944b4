"""A shared array of per-row interest counts: how many waiters watch each row.

The timer process counts, per partition row, the delayed fetches watching it; workers read the
count after an append and tell the timer about the append only when someone waits. So a node
under produce load without long polls sends no per-append traffic to the timer at all.

Invariants:
- One writer (the timer process); any number of readers, without locks. Counts are aligned
  u32 words: each load and store is a single instruction, so a reader sees an old or a new
  count, never a torn one.
- No lost wakeup (a Dekker pattern, as the ring's sleep flag): the writer raises a count,
  then `full_fence()`, then reads the partition table; a reader publishes its append to the
  table, then `full_fence()`, then reads the count. At least one of them sees the other's
  store, so either the worker reports the append or the timer finds it in the table.
- A count is only a hint to report appends; a spurious non-zero count costs one event frame.
  Segments are named by the caller under the node instance, whose shutdown unlinks them.
"""

from __future__ import annotations

import mmap

import numpy as np
import posix_ipc

from shm.fence import full_fence

__all__ = ["InterestTable", "WorkerWatches", "full_fence"]


class InterestTable:
    def __init__(self, name: str, memory: posix_ipc.SharedMemory, rows: int) -> None:
        self.name = name
        self.rows = rows
        self._map = mmap.mmap(memory.fd, rows * 4)
        memory.close_fd()
        self.counts = np.frombuffer(self._map, dtype=np.uint32, count=rows)

    @classmethod
    def create(cls, name: str, rows: int) -> "InterestTable":
        memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=rows * 4)
        return cls(name, memory, rows)

    @classmethod
    def attach(cls, name: str) -> "InterestTable":
        memory = posix_ipc.SharedMemory(name)
        return cls(name, memory, memory.size // 4)

    def watched(self, row: int) -> bool:
        return bool(self.counts[row])

    def add(self, rows: list[int], delta: int) -> None:
        """Writer only: change the counts of `rows` (distinct) by `delta` (never below zero)."""
        counts = self.counts
        for row in rows:
            counts[row] = max(0, int(counts[row]) + delta)

    def close(self) -> None:
        self.counts = None
        self._map.close()


class WorkerWatches:
    """Per network worker, per partition row: how many of that worker's own delayed fetches watch the row.

    A worker that appends to a watched row rings the doorbell of each other worker that counts a watch
    there, which then checks its own waits against the partition table: the wait is answered one
    cross-process hop after the append instead of two (worker -> timer -> worker).

    Invariants:
    - Row i of the (workers x rows) matrix is written by worker i only; a restarted worker zeroes its
      row first. Counts are aligned u32 words, read without locks (as InterestTable's).
    - A count is only a hint to ring: a missed ring costs latency, never an answer, because the timer
      (InterestTable, the APPEND message) still completes every wait; a spurious one costs a wakeup.
    """

    def __init__(self, name: str, memory: posix_ipc.SharedMemory, rows: int) -> None:
        self.name = name
        self.rows = rows
        self.workers = memory.size // (rows * 4)
        self._map = mmap.mmap(memory.fd, self.workers * rows * 4)
        memory.close_fd()
        self.counts = np.frombuffer(self._map, dtype=np.uint32).reshape(self.workers, rows)

    @classmethod
    def create(cls, name: str, workers: int, rows: int) -> "WorkerWatches":
        memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=workers * rows * 4)
        return cls(name, memory, rows)

    @classmethod
    def attach(cls, name: str, rows: int) -> "WorkerWatches":
        return cls(name, posix_ipc.SharedMemory(name), rows)

    def close(self) -> None:
        self.counts = None
        self._map.close()
