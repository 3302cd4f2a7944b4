"""The flusher: group commit of partition logs, and the timer process's thread for background I/O.

Invariants:
- Dirty means `end_bytes > flushed_bytes` in the shared table: the table, not a message, says
  what needs an fsync, so appends made while the timer was down are flushed after its restart.
- A flush round fsyncs every dirty partition, then reports their rows; acks=all produces waiting
  on those rows are re-checked by the timer loop. After `mark_dirty()` (an acks=all produce
  waits) the next round runs within `flush_interval_ms` (the group-commit window), or at once
  after `kick()` (when `flush_bytes` are waiting). Appends nobody waits on (acks=0/1) are flushed
  by the background round every `background_flush_interval_ms`: like Kafka, acks=1 is answered
  from the page cache, which survives any process crash.
- Jobs handed to `submit()` (the timer's periodic chores) run on this thread between flush rounds,
  with its store, in the order submitted; a job that fails is logged and the thread goes on.
- The thread owns its own PartitionStore (no sharing with the timer loop); fsync releases the
  GIL, so the timer loop keeps serving timers during a flush.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Callable

from node.config import NodeConfig
from node.storage.store import PartitionStore
from shm.table import PartitionTable

log = logging.getLogger("shmbroker.flusher")

Job = Callable[[PartitionStore], object]


class Flusher(threading.Thread):
    def __init__(self, config: NodeConfig, table: PartitionTable, wake: Callable[[], None]) -> None:
        super().__init__(name="flusher", daemon=True)
        self.config = config
        self.table = table
        self.wake = wake
        self.flushed: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
        self.catalog_version = 0  # set by the timer loop after it changes the catalog
        self._jobs: queue.SimpleQueue[tuple[str, Job]] = queue.SimpleQueue()
        self._kick = threading.Event()
        self._dirty = threading.Event()
        self._dirty.set()  # first round at once: a restarted timer inherits unflushed appends
        self._stopping = threading.Event()
        self.rounds = 0
        self.errors = 0
        # For the stats segment; written by this thread only, read by the timer loop (ints: no torn reads).
        self.fsyncs = 0
        self.fsync_ns_total = 0
        self.fsync_ns_max = 0  # since the timer loop last reset it
        self.bytes_flushed = 0

    def mark_dirty(self) -> None:
        self._dirty.set()

    def kick(self) -> None:
        self._kick.set()
        self._dirty.set()

    def submit(self, name: str, job: Job) -> None:
        """Run job(store) on this thread soon (after the current flush round)."""
        self._jobs.put((name, job))
        self.kick()

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        self.kick()
        self.join(timeout)

    def run(self) -> None:
        store = PartitionStore(os.path.abspath(self.config.server.data_dir), self.table, self.config.log,
                               self.config.topics.max_partitions)
        interval_s = self.config.flush.flush_interval_ms / 1000
        idle_s = self.config.flush.background_flush_interval_ms / 1000
        try:
            while True:
                # A round at start too: appends made while no timer ran still need their fsync.
                if self._dirty.wait(idle_s):
                    self._kick.wait(interval_s)
                self._dirty.clear()
                self._kick.clear()
                if store.version != self.catalog_version:
                    store.reload()
                self._flush_round(store)
                if self._stopping.is_set():
                    return
                self._run_jobs(store)
        finally:
            store.close()

    def _flush_round(self, store: PartitionStore) -> None:
        done = []
        for row in store.dirty_rows():
            try:
                state = self.table.read(row)
                started = time.perf_counter_ns()
                store.log(row).flush()
                took = time.perf_counter_ns() - started
                self.fsyncs += 1
                self.fsync_ns_total += took
                self.fsync_ns_max = max(self.fsync_ns_max, took)
                self.bytes_flushed += max(0, state.end_bytes - state.flushed_bytes)
                done.append(row)
            except Exception:  # a deleted topic, a full disk: log, retry next round
                self.errors += 1
                log.exception("flush of partition row %d failed", row)
        self.rounds += 1
        if done:
            self.flushed.put(done)
            self.wake()

    def _run_jobs(self, store: PartitionStore) -> None:
        while not self._jobs.empty():
            name, job = self._jobs.get_nowait()
            try:
                job(store)
            except Exception:
                log.exception("%s failed", name)
