"""The transaction coordinator's durable state: the internal log `__transaction_state`.

An ordinary partition log of the node (one partition, flagged internal in the catalog, compacted by the log
cleaner: cleanup.policy compact, segments of transactions.state_segment_bytes), made when the first
transactional id needs it, written only by the timer process and fsync'd by the flusher's group commit, as
`__consumer_offsets` is. Each record:

    key    orjson [transactional_id]
    value  orjson TransactionMetadata.to_record(): producer id and epoch, timeout, state, the transaction's
           partitions, groups and pending offsets, its start time (wall ms) and the machine's boot id then
           null (a tombstone): the transactional.id is gone

Lifecycle: load at start (a bounded slice per timer loop turn; meanwhile `loading` is True and the coordinator
answers COORDINATOR_LOAD_IN_PROGRESS), the latest record of each key wins (records are written in order by one
writer, and compaction keeps the latest); then every state change is one record, whose `done(flushed, fault)`
callback hears when it is fsync'd (or that it will not be: a storage fault, or no fsync within the timeout).

Invariants: a state the coordinator writes markers for, or answers EndTxn, InitProducerId, AddOffsetsToTxn or
TxnOffsetCommit with, is in an fsync'd record (an AddPartitionsToTxn that widens an open transaction is answered
once its record is appended: the coordinator's reconciliation at start covers its loss, see coordinator.py); the log is fsync'd as a whole, so a
durable record makes every record before it durable; a record that does not parse is skipped with a log line, never stops the load.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

import orjson

from shmbroker.node.storage.records import (BATCH_HEADER_SIZE, CONTROL_BIT, LENGTH_FIELDS_SIZE, ErrorCode, StorageError,
                                            build_batch, iter_records, parse_header)
from shmbroker.node.storage.store import TOPIC_RESOURCE, PartitionStore
from shmbroker.node.timer.transactions.metadata import TransactionMetadata

log = logging.getLogger("shmbroker.transactions")

STATE_TOPIC = "__transaction_state"

Done = Callable[..., None]  # (flushed: bool, fault: bool = False)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class TransactionStateLog:
    def __init__(self, store: PartitionStore, wait_flushed: Callable, *, segment_bytes: int,
                 load_bytes_per_turn: int, write_timeout_ms: int,
                 catalog_changed: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self._catalog_changed = catalog_changed  # the flusher (which fsyncs the log) and the workers reload it
        self._wait_flushed = wait_flushed  # (rows, offsets, deadline_ms, done(flushed, fault), urgent=) -> None
        self.load_bytes_per_turn = load_bytes_per_turn
        self.write_timeout_ms = write_timeout_ms
        self.loading = True
        self.loaded: dict[str, TransactionMetadata] = {}  # the load's result, handed over once
        self.records = 0
        self.changes = 0  # state writes that ended (durable or not): the coordinator's state may have changed
        self.settings = {"cleanup.policy": "compact", "segment.bytes": str(segment_bytes)}
        self.row = store.row(STATE_TOPIC, 0)  # None until the first transactional id needs the log
        if self.row is not None:
            self._configure()
        self._load_offset = store.log(self.row).state().log_start_offset if self.row is not None else 0

    def _configure(self) -> None:
        if self.store.topic_configs(STATE_TOPIC) != self.settings:  # another setting since it was made
            (code, message), = self.store.alter_configs([(TOPIC_RESOURCE, STATE_TOPIC, "replace", self.settings)],
                                                           internal=True)
            if code:
                raise RuntimeError(f"cannot set the configs of {STATE_TOPIC}: {message}")

    def ensure_created(self) -> bool:
        """Make the log on first use, as Kafka makes its __transaction_state (a node without transactions never
        spends a partition on it); False, logged, if the node has no room for it."""
        if self.row is not None:
            return True
        (code, message) = self.store.create_topics([(STATE_TOPIC, 1, self.settings)], internal=True)[STATE_TOPIC]
        if code:
            log.error("cannot create %s (%s): transactional producers are refused until it can be", STATE_TOPIC,
                      message)
            return False
        self.row = self.store.row(STATE_TOPIC, 0)
        self._catalog_changed()
        return self.row is not None

    # -- load ---------------------------------------------------------------------------------

    def load_step(self) -> bool:
        """Load the next slice of the log; True once everything is loaded (then `loaded` is complete)."""
        if not self.loading:
            return True
        if self.row is None:  # never made: nothing to load
            self.loading = False
            return True
        plog = self.store.log(self.row)
        state = plog.state()
        if self._load_offset >= state.log_end_offset:
            self.loading = False
            log.info("loaded %d transactional ids from %d records of %s", len(self.loaded), self.records, STATE_TOPIC)
            return True
        piece = plog.read(self._load_offset, self.load_bytes_per_turn)
        for fd, position, length in piece.ranges:
            self._apply_batches(os.pread(fd, length, position))
        if not piece.ranges:  # nothing readable although the end is further: skip the gap
            self._load_offset = state.log_end_offset
        return False

    def _apply_batches(self, data: bytes) -> None:
        position = 0
        while position + BATCH_HEADER_SIZE <= len(data):
            header = parse_header(data, position)
            end = position + LENGTH_FIELDS_SIZE + header.batch_length
            if not header.attributes & CONTROL_BIT:
                for offset, key, value in iter_records(data[position:end], header):
                    self.records += 1
                    self._apply_record(key, value)
            self._load_offset = header.last_offset + 1
            position = end

    def _apply_record(self, key: bytes | None, value: bytes | None) -> None:
        try:
            (transactional_id,) = orjson.loads(key)
            transactional_id = str(transactional_id)
            if value is None:
                self.loaded.pop(transactional_id, None)
                return
            self.loaded[transactional_id] = TransactionMetadata.from_record(transactional_id, orjson.loads(value))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("skipping an unreadable record in %s", STATE_TOPIC)

    # -- writes -------------------------------------------------------------------------------

    def write(self, metadata: TransactionMetadata, now_ms: int, done: Done, urgent: bool = True) -> None:
        """Append `metadata` as it is now; `done(True)` once fsync'd, `done(False, fault)` otherwise (at once if the
        append failed). `urgent`: synced at once, beside the group commit's round, rather than by the next round."""
        self._append(orjson.dumps([metadata.transactional_id]), orjson.dumps(metadata.to_record()), now_ms, done,
                     urgent)

    def delete(self, transactional_id: str, now_ms: int, done: Done) -> None:
        self._append(orjson.dumps([transactional_id]), None, now_ms, done, True)

    def _append(self, key: bytes, value: bytes | None, now_ms: int, done: Done, urgent: bool) -> None:
        try:
            appended = self.store.log(self.row).append(build_batch([(key, value)], wall_ms()))
        except StorageError as exc:
            if exc.error_code != ErrorCode.KAFKA_STORAGE_ERROR:  # a disk fault was logged by the partition
                log.error("cannot append to %s: %s", STATE_TOPIC, exc)
            done(False, exc.error_code == ErrorCode.KAFKA_STORAGE_ERROR)
            return
        def ended(flushed: bool, fault: bool = False) -> None:
            self.changes += 1
            done(flushed, fault)

        self._wait_flushed([self.row], [appended.last_offset + 1], now_ms + self.write_timeout_ms, ended,
                           urgent=urgent)
