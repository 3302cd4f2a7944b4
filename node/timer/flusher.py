"""The flusher: group commit of partition logs, and the timer process's thread for background I/O.

Invariants:
- Dirty means `end_bytes > flushed_bytes` in the shared table: the table, not a message, says
  what needs an fsync, so appends made while the timer was down are flushed after its restart.
- A flush round fsyncs every dirty partition, then reports their rows (`reports`, one FlushReport
  per round, in round order); acks=all produces waiting on those rows are re-checked by the timer
  loop. Rows whose flush met a storage fault are reported too (`failed`), so their waiters are
  answered KAFKA_STORAGE_ERROR at once; they stay dirty and are tried again by the next rounds. The fault is logged by the partition
  (once per interval, node-wide), never as a traceback per round. After `mark_dirty()` (an acks=all produce
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
from typing import Callable, NamedTuple

from node.config import NodeConfig
from node.storage.records import StorageError
from node.storage.store import PartitionStore
from shm.table import PartitionTable

log = logging.getLogger("shmbroker.flusher")

Job = Callable[[PartitionStore], object]


class FlushReport(NamedTuple):
    round: int  # rounds are numbered from 1 by their start (Flusher.rounds_started)
    flushed: list[int]  # rows fsync'd up to the log end they had when the round began
    failed: list[int]  # rows whose fsync met a fault


class Flusher(threading.Thread):
    def __init__(self, config: NodeConfig, table: PartitionTable, wake: Callable[[], None]) -> None:
        super().__init__(name="flusher", daemon=True)
        self.config = config
        self.table = table
        self.wake = wake
        self.reports: queue.SimpleQueue[FlushReport] = queue.SimpleQueue()
        self.catalog_version = 0  # set by the timer loop after it changes the catalog
        self._jobs: queue.SimpleQueue[tuple[str, Job]] = queue.SimpleQueue()
        self._kick = threading.Event()
        self._dirty = threading.Event()
        self._dirty.set()  # first round at once: a restarted timer inherits unflushed appends
        self._stopping = threading.Event()
        self.rounds = 0
        self.rounds_started = 0  # read by the timer loop: a produce waits on rounds started after it
        self.errors = 0

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
        self.rounds_started += 1
        flush_round = self.rounds_started
        done, failed = [], []
        for row in store.dirty_rows():
            try:
                store.log(row).flush()
                done.append(row)
            except StorageError:  # a storage fault (logged by the partition) or a deleted topic
                self.errors += 1
                failed.append(row)
            except Exception:  # a bug: log it, try again next round
                self.errors += 1
                failed.append(row)
                log.exception("flush of partition row %d failed", row)
        self.rounds += 1
        if done or failed:
            self.reports.put(FlushReport(flush_round, done, failed))
            self.wake()

    def _run_jobs(self, store: PartitionStore) -> None:
        while not self._jobs.empty():
            name, job = self._jobs.get_nowait()
            try:
                job(store)
            except Exception:
                log.exception("%s failed", name)
