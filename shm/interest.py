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

__all__ = ["InterestTable", "full_fence"]


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
