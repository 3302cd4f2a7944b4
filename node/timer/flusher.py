"""The flusher: group commit of partition logs, a thread of the timer process.

Invariants:
- Dirty means `end_bytes > flushed_bytes` in the shared table: the table, not a message, says
  what needs an fsync, so appends made while the timer was down are flushed after its restart.
- A flush round fsyncs every dirty partition, then reports their rows; acks=all produces waiting
  on those rows are re-checked by the timer loop. After `mark_dirty()` (an acks=all produce
  waits) the next round runs within `flush_interval_ms` (the group-commit window), or at once
  after `kick()` (when `flush_bytes` are waiting). Appends nobody waits on (acks=0/1) are flushed
  by the background round every `background_flush_interval_ms`: like Kafka, acks=1 is answered
  from the page cache, which survives any process crash.
- The thread owns its own Partitions view (no sharing with the timer loop); fsync releases the
  GIL, so the timer loop keeps serving timers during a flush.
- Now and then it also writes producer-state snapshots (bounding a worker's catch-up scan) and
  enforces retention; a failure there is logged and retried next time, never fatal.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Callable

import numpy as np

from node.config import NodeConfig
from node.storage.partitions import Partitions
from shm.table import PartitionTable

log = logging.getLogger("shmbroker.flusher")


class Flusher(threading.Thread):
    def __init__(self, config: NodeConfig, table: PartitionTable, wake: Callable[[], None]) -> None:
        super().__init__(name="flusher", daemon=True)
        self.config = config
        self.table = table
        self.wake = wake
        self.flushed: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
        self.catalog_version = 0  # set by the timer loop after it changes the catalog
        self._kick = threading.Event()
        self._dirty = threading.Event()
        self._dirty.set()  # first round at once: a restarted timer inherits unflushed appends
        self._stopping = threading.Event()
        self.rounds = 0
        self.errors = 0

    def mark_dirty(self) -> None:
        self._dirty.set()

    def kick(self) -> None:
        self._kick.set()
        self._dirty.set()

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        self.kick()
        self.join(timeout)

    def run(self) -> None:
        partitions = Partitions(os.path.abspath(self.config.server.data_dir), self.table, self.config.log,
                                self.config.topics.max_partitions)
        interval_s = self.config.flush.flush_interval_ms / 1000
        idle_s = self.config.flush.background_flush_interval_ms / 1000
        snapshot_every = self.config.flush.producer_snapshot_interval_ms / 1000
        retention_every = self.config.flush.retention_check_interval_ms / 1000
        next_snapshot = time.monotonic() + snapshot_every
        next_retention = time.monotonic() + retention_every
        try:
            while True:
                # A round at start too: appends made while no timer ran still need their fsync.
                if self._dirty.wait(idle_s):
                    self._kick.wait(interval_s)
                self._dirty.clear()
                self._kick.clear()
                if partitions.version != self.catalog_version:
                    partitions.reload()
                self._flush_round(partitions)
                if self._stopping.is_set():
                    return
                now = time.monotonic()
                if now >= next_snapshot:
                    next_snapshot = now + snapshot_every
                    self._each_partition(partitions, "write_producer_snapshot")
                if now >= next_retention:
                    next_retention = now + retention_every
                    self._each_partition(partitions, "enforce_retention")
        finally:
            partitions.close()

    def _dirty_rows(self, partitions: Partitions) -> list[int]:
        rows = partitions.all_rows()
        if not rows:
            return []
        state = self.table.read_rows(np.asarray(rows, dtype=np.int64))
        dirty = np.flatnonzero(state["end_bytes"] > state["flushed_bytes"])
        return [rows[i] for i in dirty]

    def _flush_round(self, partitions: Partitions) -> None:
        done = []
        for row in self._dirty_rows(partitions):
            try:
                partitions.log(row).flush()
                done.append(row)
            except Exception:  # a deleted topic, a full disk: log, retry next round
                self.errors += 1
                log.exception("flush of partition row %d failed", row)
        self.rounds += 1
        if done:
            self.flushed.put(done)
            self.wake()

    def _each_partition(self, partitions: Partitions, method: str) -> None:
        for row in partitions.all_rows():
            try:
                getattr(partitions.log(row), method)()
            except Exception:
                log.exception("%s of partition row %d failed", method, row)
