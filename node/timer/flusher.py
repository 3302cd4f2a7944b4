"""The flusher: group commit of partition logs, and the timer process's thread for background I/O.

Group commit, as a database's log writer does it: at most one flush round is in flight. When something
waits for durability (an acks=all produce, a committed offset) and no round runs, a round starts at
once; whatever comes to wait while a round runs shares the next one, which starts as soon as the
running one ends. So a lone waiter pays one fdatasync, and under load every round carries all the
waiters that arrived during the previous one: rounds never wait on a clock.

Invariants:
- Dirty means `end_bytes > flushed_bytes` in the shared table: the table, not a message, says
  what needs a sync, so appends made while the timer was down are flushed after its restart.
- A round syncs every dirty partition (its log data: index pages are never needed by recovery),
  then reports their rows (`reports`, one FlushReport per round, in round order); waiters on those
  rows are re-checked by the timer loop. The syncs of a
  round are issued concurrently, by up to `sync_threads` threads: the filesystem's journal joins
  concurrent fdatasyncs into one commit (measured on ext4, 4 files: 12 ms one after the other,
  0.8 ms at once), so a round costs about one sync however many partitions it carries.
- Rows whose sync met a storage fault are reported too (`failed`), so their waiters are answered
  KAFKA_STORAGE_ERROR at once; they stay dirty and are tried again by the next rounds. The fault is
  logged by the partition (once per interval, node-wide), never as a traceback per round.
- `request()` (a waiter arrived) makes the next round start without delay: at once if the thread
  is idle, right after the running round otherwise. A request made during a round is never lost:
  the event is cleared before the round reads the table, so a later request sets it again.
- Appends nobody waits on (acks=0/1) are flushed by a round at least every `flush_interval_ms`,
  the upper bound of background flushing (or a topic's shorter flush.ms; a topic's flush.messages
  asks for a round through `request()`): like Kafka, acks=1 is answered from the page cache,
  which survives any process crash.
- Jobs handed to `submit()` (the timer's periodic chores, record deletion) run on this thread
  between rounds, with its store, in the order submitted; a job that fails is logged and the
  thread goes on. A round requested while jobs run goes before the next job, and at least one
  job runs after every round, so neither waiters nor jobs starve.
- The thread owns its own PartitionStore (no sharing with the timer loop); syncs release the
  GIL, so the timer loop keeps serving timers during a round.
- Urgent syncs (`sync_now(rows)`): a few small rows on a client's path that must not wait for the
  round in flight and then a round of every dirty partition (the transaction coordinator's state
  records: each AddPartitionsToTxn and EndTxn waits for one) are fsync'd at once by a thread of
  their own, beside any round, with a store of its own, and reported like a round's rows (under
  the latest round started). A row it cannot sync is left to the next round, requested then, which
  reports the failure: a failed fsync is handled in one place. A row synced twice (by both) costs
  the second an early return or a sync of nothing new.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple

from shmbroker.node.config import NodeConfig
from shmbroker.node.storage.records import StorageError
from shmbroker.node.storage.store import PartitionStore
from shmbroker.shm.table import PartitionTable

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
        self._jobs: queue.SimpleQueue[tuple[str, Job, Callable[[object], None] | None]] = queue.SimpleQueue()
        self.finished: queue.SimpleQueue[tuple[Callable[[object], None], object]] = queue.SimpleQueue()
        self._wanted = threading.Event()  # a round is wanted now (a waiter, a job, a stop)
        self._wanted.set()  # first round at once: a restarted timer inherits unflushed appends
        self._stopping = threading.Event()
        self.rounds = 0
        self.rounds_started = 0  # read by the timer loop: a produce waits on rounds started after it
        self.errors = 0
        # For the stats segment; written by this thread only, read by the timer loop (ints: no torn reads).
        self.fsyncs = 0
        self.fsync_ns_total = 0
        self.fsync_ns_max = 0  # since the timer loop last reset it
        self.bytes_flushed = 0
        self._urgent_rows: queue.SimpleQueue[list[int] | None] = queue.SimpleQueue()
        self._urgent = threading.Thread(target=self._urgent_syncs, name="urgent-sync", daemon=True)
        self.urgent_fsyncs = 0  # written by the urgent thread only

    def request(self) -> None:
        """Something waits for durability: the next round starts without delay."""
        self._wanted.set()

    def sync_now(self, rows: list[int]) -> None:
        """Fsync these rows at once, beside any round in flight (see the invariants)."""
        self._urgent_rows.put(rows)

    def submit(self, name: str, job: Job, then: Callable[[object], None] | None = None) -> None:
        """Run job(store) on this thread soon (after the next round). `then(result)` runs afterwards on the timer
        loop's thread (`run_finished`), with the job's result, or None if it failed."""
        self._jobs.put((name, job, then))
        self._wanted.set()

    def run_finished(self) -> None:
        """On the timer loop's thread: the `then` of every finished job."""
        while not self.finished.empty():
            then, result = self.finished.get_nowait()
            then(result)

    def start(self) -> None:
        super().start()
        self._urgent.start()

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        self._wanted.set()
        self._urgent_rows.put(None)
        self.join(timeout)
        self._urgent.join(timeout)

    def run(self) -> None:
        store = PartitionStore(os.path.abspath(self.config.server.data_dir), self.table, self.config.log,
                               self.config.topics.max_partitions)
        self._syncs = ThreadPoolExecutor(self.config.flush.sync_threads, thread_name_prefix="sync")
        background_s = self._background_s(store)
        try:
            while True:
                self._wanted.wait(background_s)
                self._wanted.clear()  # before the round reads the table: a later request() means a later round
                if store.version != self.catalog_version:
                    store.reload()
                    background_s = self._background_s(store)
                self._flush_round(store)
                if self._stopping.is_set():
                    return
                self._run_jobs(store)
        finally:
            self._syncs.shutdown()
            store.close()

    def _background_s(self, store: PartitionStore) -> float:
        """The longest wait between rounds: flush_interval_ms, or a topic's shorter flush.ms."""
        return max(0.0, min(self.config.flush.flush_interval_ms, store.min_flush_ms())) / 1000

    def _flush_round(self, store: PartitionStore) -> None:
        self.rounds_started += 1
        flush_round = self.rounds_started
        done, failed = [], []
        logs = []
        for row in store.dirty_rows():
            try:
                state = self.table.read(row)
                self.bytes_flushed += max(0, state.end_bytes - state.flushed_bytes)
                logs.append((row, store.log(row)))  # opened here: the store is not shared with the sync threads
            except Exception:
                self.errors += 1
                failed.append(row)
                log.exception("partition row %d cannot be opened for its flush", row)
        # This thread syncs the first partition itself while the pool takes the others: one thread handoff
        # fewer per round (a handoff costs a GIL wait while the timer loop runs).
        others = [self._syncs.submit(_sync, plog) for _, plog in logs[1:]]
        results = [_sync(logs[0][1])] if logs else []
        results += [future.result() for future in others]
        for (row, _), (error, took) in zip(logs, results):
            self.fsyncs += 1
            self.fsync_ns_total += took
            self.fsync_ns_max = max(self.fsync_ns_max, took)
            if error is None:
                done.append(row)
                continue
            self.errors += 1
            failed.append(row)  # tried again next round
            if not isinstance(error, StorageError):  # a storage fault was logged by the partition; this is a bug
                log.error("flush of partition row %d failed", row, exc_info=error)
        self.rounds += 1
        if done or failed:
            self.reports.put(FlushReport(flush_round, done, failed))
            self.wake()

    def _urgent_syncs(self) -> None:
        store = PartitionStore(os.path.abspath(self.config.server.data_dir), self.table, self.config.log,
                               self.config.topics.max_partitions)
        try:
            while (rows := self._urgent_rows.get()) is not None:
                wanted = set(rows)
                while not self._urgent_rows.empty():  # those that came meanwhile share this turn
                    more = self._urgent_rows.get_nowait()
                    if more is None:
                        return
                    wanted.update(more)
                if store.version != self.catalog_version:
                    store.reload()
                flushed = []
                for row in sorted(wanted):
                    try:
                        store.log(row).flush()
                    except Exception:  # noqa: BLE001 - the next round syncs it again and reports what is wrong
                        self.request()
                        continue
                    self.urgent_fsyncs += 1
                    flushed.append(row)
                if flushed:
                    self.reports.put(FlushReport(self.rounds_started, flushed, []))
                    self.wake()
        finally:
            store.close()

    def _run_jobs(self, store: PartitionStore) -> None:
        ran = 0
        while not self._jobs.empty():
            if ran and self._wanted.is_set() and not self._stopping.is_set():
                return  # a waiter came: its round next, the remaining jobs after it (one per round at least)
            ran += 1
            name, job, then = self._jobs.get_nowait()
            result = None
            try:
                result = job(store)
            except Exception:
                log.exception("%s failed", name)
            if then is not None:
                self.finished.put((then, result))
                self.wake()


def _sync(plog) -> tuple[Exception | None, int]:
    """Flush one partition: (the failure or None, nanoseconds it took)."""
    started = time.perf_counter_ns()
    try:
        plog.flush()
        return None, time.perf_counter_ns() - started
    except Exception as exc:
        return exc, time.perf_counter_ns() - started
