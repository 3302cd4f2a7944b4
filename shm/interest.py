"""Who waits on a partition row: each network worker's count of its own delayed fetches per row.

A worker that appends to a row must get the fetches waiting on it answered. Those it holds itself it
checks in the same turn; for those another worker holds, it rings that worker's doorbell (an eventfd every
worker inherits), and the rung worker checks its own waits against the partition table. This table tells
the appending worker whom to ring, so a node under produce load without long polls rings nobody.

Invariants:
- Row i of the (workers x rows) matrix is written by worker i only; a restarted worker zeroes its row
  first (its predecessor's waits died with its connections). Counts are aligned u32 words: each load and
  store is a single instruction, so a reader sees an old or a new count, never a torn one.
- No lost wakeup (a Dekker pattern, as the ring's sleep flag): a worker raises its count for a new wait,
  then `full_fence()`, then checks the wait against the partition table; an appending worker publishes
  its append to the table, then `full_fence()`, then reads the counts. At least one of them sees the
  other's store: either the waiter's own check finds the append, or the appender rings it.
- A count is only a hint to ring: a spurious one costs a wakeup and a check. Segments are named by the
  caller under the node instance, whose shutdown unlinks them.
- After the matrix, one more row of u32 words: per partition row, 1 + the index of the worker that last
  rang a watcher of it (0: none yet), stored before the ring. It only says where a long poll's records come
  from (workers.affinity); several appending workers overwrite each other, which costs a wrong guess.
"""

from __future__ import annotations

import mmap

import numpy as np
import posix_ipc

from shm.fence import full_fence

__all__ = ["WorkerWatches", "full_fence"]


class WorkerWatches:
    def __init__(self, name: str, memory: posix_ipc.SharedMemory, rows: int) -> None:
        self.name = name
        self.rows = rows
        self.workers = memory.size // (rows * 4) - 1
        self._map = mmap.mmap(memory.fd, (self.workers + 1) * rows * 4)
        memory.close_fd()
        words = np.frombuffer(self._map, dtype=np.uint32).reshape(self.workers + 1, rows)
        self.counts = words[:self.workers]
        self.appenders = words[self.workers]  # 1 + the worker that last rang a watcher of the row

    @classmethod
    def create(cls, name: str, workers: int, rows: int) -> "WorkerWatches":
        memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=(workers + 1) * rows * 4)
        return cls(name, memory, rows)

    @classmethod
    def attach(cls, name: str, rows: int) -> "WorkerWatches":
        return cls(name, posix_ipc.SharedMemory(name), rows)

    def close(self) -> None:
        self.counts = self.appenders = None
        self._map.close()
