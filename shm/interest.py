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
- The matrix follows the 64-byte header (shm.segment: magic, version, workers, rows).
"""

from __future__ import annotations

import numpy as np

from shmbroker.shm.fence import full_fence
from shmbroker.shm.segment import HEADER_BYTES, Layout, Segment

__all__ = ["WorkerWatches", "full_fence"]

WORD_BYTES = 4
LAYOUT = Layout("a watches table", magic=0x5345_4843_5441_5753, version=1,  # "SWATCHES" little-endian
                sizes=("workers", "rows"),
                bytes_for=lambda workers, rows: HEADER_BYTES + (workers + 1) * rows * WORD_BYTES)


class WorkerWatches:
    def __init__(self, segment: Segment) -> None:
        self.name = segment.name
        self.rows = rows = segment.sizes["rows"]
        self.workers = workers = segment.sizes["workers"]
        self._segment = segment
        words = np.frombuffer(segment.memory, dtype=np.uint32, count=(workers + 1) * rows,
                              offset=HEADER_BYTES).reshape(workers + 1, rows)
        self.counts = words[:workers]
        self.appenders = words[workers]  # 1 + the worker that last rang a watcher of the row

    @classmethod
    def create(cls, name: str, workers: int, rows: int) -> "WorkerWatches":
        return cls(Segment.create(name, LAYOUT, workers=workers, rows=rows))

    @classmethod
    def attach(cls, name: str) -> "WorkerWatches":
        return cls(Segment.attach(name, LAYOUT))

    def close(self) -> None:
        self.counts = self.appenders = None
        self._segment.close()
