"""Transaction markers: the COMMIT or ABORT control batch a completing transaction writes to each of its
partitions (Kafka's TransactionMarkerChannelManager, on one node: appends by the timer process itself).

Invariants:
- Markers are written only for a transaction whose PrepareCommit/PrepareAbort record is fsync'd, so a crash
  at any point after the first marker finds the decision durable and writes them all again (a marker of a
  transaction already closed in a partition changes nothing there: node.storage.producer_state).
- A marker append first brings the timer's producer state of its partition up to the log end (every batch the
  workers appended since), which is most of its cost; `prepare` does that ahead, after each flush round, for the
  partitions with an open transaction, so the EndTxn that follows scans only what came after.
- A commit's markers follow its records to disk: the workers answer a transaction's acks=all records once
  appended, so before its PrepareCommit is written the coordinator waits (`wait_records_durable`) until every
  partition of the transaction is fsync'd up to its log end. A decision found durable after any crash therefore
  never commits records that were lost with the page cache (an abort needs no such wait: lost records of an
  aborted transaction are never read); the coordinator aborts, at load, a transaction begun before the machine
  last restarted.
- `done(True)` only once every marker is fsync'd; a partition whose topic is gone is skipped (it has nothing
  left to close), and so is one that refuses the marker for good (logged); a storage fault or an fsync that does not come in time is `done(False)`: the caller tries the
  whole completion again later.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from shmbroker.node.storage.records import ControlType, ErrorCode, StorageError
from shmbroker.node.storage.store import PartitionStore

log = logging.getLogger("shmbroker.transactions")

COORDINATOR_EPOCH = 0  # one node: the coordinator's epoch never changes


class MarkerWriter:
    def __init__(self, store: PartitionStore, wait_flushed: Callable, write_timeout_ms: int) -> None:
        self.store = store
        self._wait_flushed = wait_flushed
        self.write_timeout_ms = write_timeout_ms
        self.written = 0  # markers appended (the stats count them)

    def prepare(self, rows: Iterable[int]) -> None:
        """Catch up the producer state of those of `rows` that hold an open transaction (see the invariants). A
        partition that cannot be read now (a fault, a topic being deleted) is left to its marker append, which
        reports what is wrong."""
        table = self.store.table
        for row in rows:
            try:
                if table.read(row).first_unstable_offset >= 0:
                    self.store.log(row).catch_up_producer_state()
            except (StorageError, OSError, KeyError):
                continue

    def wait_records_durable(self, partitions: Iterable[tuple[str, int]], now_ms: int,
                             done: Callable[[bool, bool], None]) -> None:
        """`done(flushed, fault)` once every partition is fsync'd up to its present log end (at once, beside the
        group commit's round: the producer waits for it); a partition whose topic is gone is skipped."""
        rows, ends = [], []
        for topic, partition in sorted(partitions):
            row = self.store.row(topic, partition)
            if row is not None:
                rows.append(row)
                ends.append(self.store.table.read(row).log_end_offset)
        if not rows:
            done(True, False)
            return
        self._wait_flushed(rows, ends, now_ms + self.write_timeout_ms, done, urgent=True)

    def write(self, producer_id: int, producer_epoch: int, commit: bool, partitions: Iterable[tuple[str, int]],
              now_ms: int, done: Callable[[bool], None]) -> bool:
        """Append the markers, then `done(durable)` once they are fsync'd. Returns False if one could not be
        appended (then `done(False)` was called already)."""
        control = ControlType.COMMIT if commit else ControlType.ABORT
        rows, ends = [], []
        for topic, partition in sorted(partitions):
            row = self.store.row(topic, partition)
            if row is None:
                continue
            try:
                appended = self.store.log(row).append_marker(producer_id, producer_epoch, control, COORDINATOR_EPOCH)
            except StorageError as exc:
                if exc.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    continue  # deleted meanwhile
                if exc.error_code == ErrorCode.KAFKA_STORAGE_ERROR:
                    done(False)  # the partition logged it; the completion is tried again
                    return False
                # Refused for good (a marker older than the producer's epoch there): retrying cannot help.
                log.error("cannot write the %s marker of producer %d to %s-%d: %s",
                          "COMMIT" if commit else "ABORT", producer_id, topic, partition, exc)
                continue
            self.written += 1
            rows.append(row)
            ends.append(appended.last_offset + 1)
        if not rows:
            done(True)
            return True
        self._wait_flushed(rows, ends, now_ms + self.write_timeout_ms, lambda flushed, fault=False: done(flushed))
        return True
