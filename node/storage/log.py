"""A partition log: the directory `<data_dir>/<topic>-<partition>/` of segments, shared by many processes.

Every process that appends to or reads a partition opens its own PartitionLog on the same directory and the
same row of the shared partition table (shm/table.py). The supervisor opens each partition first with
PartitionLog.recover(), alone, before any worker starts.

Invariants:
- Appends, rolls, retention and the table row's updates happen only under the partition's lock: an open
  file description (OFD) fcntl lock on `partition.lock`, which the kernel releases when its holder dies,
  and which also excludes two PartitionLog objects of one process from each other.
- The table row is the truth about the log's extent. A batch is appended at the row's end_position (not at
  the file's size), and only then is the row published with the new end; a writer killed before publishing
  leaves a torn tail that the next append overwrites and that no reader sees: readers never read past the
  row's end_position, and recovery truncates the file to the last whole batch whose CRC checks.
- Offsets are dense: each append's base offset is the row's log_end_offset, and log_end_offset grows by the
  batch's record count. Segment base offsets strictly increase; only the last segment is active.
- So the batch holding offset N, read when N was the log end, starts at that moment's end_position for as
  long as the active segment (and segments_version) is the same: a read at the end remembers it, and the
  read of N after the next append (a tailing consumer's) skips the index lookup and header scan.
- Retention publishes the new log_start_offset before unlinking files; a process that finds a segment file
  gone re-reads the row. Segments dropped from this process's view stay open for
  retired_segment_close_delay_s so that a sendfile of a range already handed out still works.
- Before checking an idempotent batch (and before each roll's producer snapshot) a process applies to its
  producer state the headers of every batch appended since the offset it last saw (node/producer_state.py),
  up to the row's producer_batches_end: the offset after the newest batch with a producer id, published
  with every such append, so the batches after it need no reading.
- Before the log start moves (DeleteRecords, retention) a producer snapshot at the log end is written: a process
  whose producer state ends before the new start takes up the newest snapshot at or after it, and never skips
  batches it did not apply (a skipped marker would leave its transaction open in that process's view).
- Transactions: an append of a transactional batch or a marker (a control batch, only ever appended by
  append_marker) catches the producer state up first, so the row's first_unstable_offset (the first offset of
  the oldest open transaction, -1 when none; the LSO derives from it) is exact after each publish; other appends
  leave it as it is. An ABORT marker's aborted-transaction index entry (node.storage.txn_index) is written
  before the marker is published. A committed read (read_committed) never returns a batch at or past the LSO.
- Disk faults (node.storage.faults: a full disk, I/O errors) never leave servable torn bytes and never
  escape as OSError: a failed append publishes nothing (the next one is written at the row's end_position
  again, over whatever the failed one left), and the caller gets StorageError(KAFKA_STORAGE_ERROR). Each
  fault is counted in the row and logged at most once per storage_error_log_interval_ms per partition,
  across all processes (the row holds the time of the last line). Nothing is remembered between attempts,
  so appends work again as soon as the disk takes writes.
- An fsync that failed marks the row (flush_failed): Linux may have dropped the dirty pages it could not
  write while reporting the error only once, so a later fsync succeeding proves nothing. Until the mark is
  cleared, flush() re-writes the unflushed batches from the page cache (each one CRC-checked first) before
  it fsyncs; only then does the flushed offset move, and the mark goes.
- After each flush, the fsync'd bytes more than page_cache_window_bytes behind the flushed end are dropped
  from the page cache (posix_fadvise DONTNEED), never an unflushed byte: the re-write above needs those.
  Readers lose nothing (a dropped page is read from disk again), and tailing consumers read the window
  from memory. Why: an append into a page the cache already recycled costs a fraction of one into memory
  never touched; measured on this project's VM (a balloon device takes freed memory back), a sequential
  8 KiB writer went from 0.67 to 2.9 s of system CPU per GB once its cache outgrew about 5 GB, and stayed
  at 0.8 with a window. -1 leaves the whole log to the kernel, as Kafka does.
- Recovery on a full disk still opens the partition: what it cannot write (index entries, a torn tail's
  truncation) it leaves, and says so in `faults`; the partition then serves reads and refuses appends
  until there is room.
"""

from __future__ import annotations

import bisect
import functools
import shutil
import fcntl
import logging
import os
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from shmbroker.node.storage.durable import read_offset, write_offset
from shmbroker.node.storage.faults import is_storage_fault, storage_fault

from shmbroker.node.storage.producer_state import (ProducerEntry, ProducerStateTable, delete_snapshots,
                                                   load_latest_snapshot, snapshot_name, snapshot_offsets)
from shmbroker.node.storage.compression import CODECS
from shmbroker.node.storage.records import (BASE_OFFSET, BATCH_HEADER_SIZE, CONTROL_KEY_AT, CONTROL_KEY, CONTROL_BIT,
                                            LENGTH_FIELDS_SIZE, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT, ControlType,
                                            ErrorCode, StorageError, all_record_offsets_and_timestamps,
                                            all_record_timestamps, build_control_batch, control_type,
                                            keyless_records, last_sequence, parse_header,
                                            record_offsets_and_timestamps, rewrite_batch, stored_batch_is_valid,
                                            validate_client_batch)
from shmbroker.node.storage.cleaner import finish_swap, write_manifest
from shmbroker.node.storage.segment import (INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, Segment, segment_base_offsets,
                                            segment_file_name)
from shmbroker.node.storage.txn_index import TXN_INDEX_SUFFIX, AbortedTransaction, collect_aborted
from shmbroker.shm.table import CleaningStats, PartitionState, PartitionTable

log = logging.getLogger("shmbroker.storage")

LOCK_FILE = "partition.lock"
CONTROL_KEY_READ = CONTROL_KEY_AT + CONTROL_KEY.size - BATCH_HEADER_SIZE  # bytes after a header naming a marker
LOG_START_FILE = "log-start-offset"  # DeleteRecords' checkpoint of the log start
LONG_MAX = 2**63 - 1  # Kafka's "no limit" for its long-valued settings
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
# Kafka's compression.type values: "producer" keeps the producer's codec; the others are what the log stores.
COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")
MAX_REFRESH_ATTEMPTS = 100
# struct flock for F_OFD_SETLKW on Linux x86-64: l_type, l_whence, l_start, l_len, l_pid (must be 0), padding.
FLOCK = struct.Struct("hhqqi4x")
LOCK_REQUEST = FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
UNLOCK_REQUEST = FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, 0, 1, 0)


@dataclass(frozen=True)
class LogConfig:
    """Storage tunables; defaults are Kafka's where Kafka has the setting."""

    segment_bytes: int = 1 << 30  # log.segment.bytes
    segment_ms: int = 7 * 24 * 3600 * 1000  # log.roll.ms
    index_interval_bytes: int = 4096  # log.index.interval.bytes
    index_max_bytes: int = 10 << 20  # log.index.size.max.bytes
    retention_ms: int = 7 * 24 * 3600 * 1000  # log.retention.ms; -1 keeps data forever
    retention_bytes: int = -1  # log.retention.bytes; -1 means no size limit
    max_message_bytes: int = 1048588  # message.max.bytes: largest batch accepted
    producer_batches_retained: int = 5  # Kafka's max in-flight batches per idempotent producer
    producer_id_expiration_ms: int = 24 * 3600 * 1000  # producer.id.expiration.ms
    producer_snapshots_retained: int = 2  # producer-state snapshots kept per partition
    scan_chunk_bytes: int = 8192  # most bytes read per pread when scanning batch headers
    scan_first_read_bytes: int = 512  # first pread of a scan: a lookup usually needs just one header
    retired_segment_close_delay_s: float = 60.0  # like file.delete.delay.ms: keeps fds valid for sendfile
    # Kafka's other per-topic log settings (node-level defaults here; per topic in the catalog, see
    # node.storage.topic_config for their Kafka names and checks).
    segment_jitter_ms: int = 0  # log.roll.jitter.ms: a segment's age roll comes up to this much earlier
    message_timestamp_type: str = "CreateTime"  # log.message.timestamp.type: or LogAppendTime
    message_timestamp_difference_max_ms: int = LONG_MAX  # log.message.timestamp.difference.max.ms
    message_timestamp_before_max_ms: int = LONG_MAX  # log.message.timestamp.before.max.ms
    # log.message.timestamp.after.max.ms: Kafka 4's default, one hour (3.x had no bound)
    message_timestamp_after_max_ms: int = 3_600_000
    compression_type: str = "producer"  # compression.type: or uncompressed, gzip, snappy, lz4, zstd
    cleanup_policy: str = "delete"  # log.cleanup.policy: delete, compact or compact,delete
    min_cleanable_dirty_ratio: float = 0.5  # log.cleaner.min.cleanable.ratio: the dirty share that makes a log due
    min_compaction_lag_ms: int = 0  # log.cleaner.min.compaction.lag.ms: records younger are not cleaned
    max_compaction_lag_ms: int = LONG_MAX  # log.cleaner.max.compaction.lag.ms: records older make the log due
    delete_retention_ms: int = 24 * 3600 * 1000  # log.cleaner.delete.retention.ms: how long tombstones stay
    min_insync_replicas: int = 1  # min.insync.replicas: this node holds one replica
    flush_messages: int = LONG_MAX  # log.flush.interval.messages: fsync once this many records wait
    flush_ms: int = LONG_MAX  # log.flush.interval.ms: fsync appends at least this often
    index_reserve_entries: int = 4096  # index entries whose disk blocks are reserved at a time
    storage_error_log_interval_ms: int = 60_000  # one log line per partition per interval about disk faults
    rewrite_chunk_bytes: int = 1 << 20  # most bytes read per pread when re-writing after a failed fsync
    # Flushed bytes per partition kept in the page cache behind the flushed end (module invariants); -1: all.
    page_cache_window_bytes: int = 256 << 20
    # Dropped from the cache in steps of at least this much, so a busy group commit adds no syscall per round.
    page_cache_drop_bytes: int = 16 << 20

    def __post_init__(self):
        if not 0 < self.segment_bytes < 2**31:
            raise ValueError("segment_bytes must be in (0, 2**31): index positions are 32-bit")
        if self.page_cache_window_bytes < -1 or self.page_cache_drop_bytes <= 0:
            raise ValueError("page_cache_window_bytes must be -1 (keep all) or >= 0; page_cache_drop_bytes > 0")
        if self.index_max_bytes < 64 or self.index_interval_bytes < 0 or self.max_message_bytes <= 0:
            raise ValueError("index_max_bytes >= 64, index_interval_bytes >= 0 and max_message_bytes > 0")
        if self.message_timestamp_type not in TIMESTAMP_TYPES:
            raise ValueError(f"message_timestamp_type must be one of {', '.join(TIMESTAMP_TYPES)}")
        if self.compression_type not in COMPRESSION_TYPES:
            raise ValueError(f"compression_type must be one of {', '.join(COMPRESSION_TYPES)}")
        if not self.cleanup_policy or set(self.cleanup_policy.split(",")) - {"delete", "compact"}:
            raise ValueError("cleanup_policy must be delete, compact or compact,delete")
        if not 0 <= self.min_cleanable_dirty_ratio <= 1 or self.min_compaction_lag_ms < 0 \
                or self.max_compaction_lag_ms <= 0 or self.delete_retention_ms < 0:
            raise ValueError("min_cleanable_dirty_ratio must be in [0, 1], max_compaction_lag_ms positive, "
                             "min_compaction_lag_ms and delete_retention_ms not negative")
        if self.min_insync_replicas != 1:
            raise ValueError("min_insync_replicas must be 1: this node holds one replica of each partition")
        if min(self.segment_ms, self.flush_messages) <= 0 or min(
                self.flush_ms, self.segment_jitter_ms, self.message_timestamp_difference_max_ms,
                self.message_timestamp_before_max_ms, self.message_timestamp_after_max_ms) < 0:
            raise ValueError("segment_ms and flush_messages must be positive; flush_ms, the jitter and the "
                             "timestamp bounds not negative")

    @property
    def compacts(self) -> bool:
        """cleanup.policy names compact: the log cleaner keeps the latest record of each key."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def deletes(self) -> bool:
        """cleanup.policy names delete: time and size retention drop old segments."""
        return "delete" in self.cleanup_policy.split(",")

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @functools.cached_property
    def stored_codec(self) -> int | None:
        """The codec every stored batch gets, None: the producer's (compression.type=producer)."""
        return CODECS.get(self.compression_type)

    @functools.cached_property
    def timestamp_bounds(self) -> tuple[int, int] | None:
        """(before, after): how far a CreateTime timestamp may be from the node's clock; None: unbounded."""
        before = min(self.message_timestamp_before_max_ms, self.message_timestamp_difference_max_ms)
        after = min(self.message_timestamp_after_max_ms, self.message_timestamp_difference_max_ms)
        return None if before == after == LONG_MAX else (before, after)

    @functools.cached_property
    def rewrites(self) -> bool:
        """Whether appends do more than validate: timestamps checked or written, batches recompressed."""
        return self.log_append_time or self.stored_codec is not None or self.timestamp_bounds is not None

    def roll_jitter_ms(self, base_offset: int) -> int:
        """segment.jitter.ms: a fixed draw per segment, the same in every process."""
        if self.segment_jitter_ms <= 0:
            return 0
        return (base_offset * 2654435761 + 40503) % self.segment_jitter_ms


class AppendResult(NamedTuple):
    base_offset: int
    last_offset: int
    log_start_offset: int
    end_bytes: int  # the row's end_bytes after this append (for waking delayed fetches)
    duplicate: bool  # True: a retried idempotent batch, answered with its original offsets, not appended
    log_append_time: int = -1  # the timestamp written into the batch (LogAppendTime topics), else -1
    wants_flush: bool = False  # flush.messages records wait for an fsync: the caller asks for one


class FetchSlice(NamedTuple):
    """What a fetch returns: file ranges to os.sendfile, whole batches only, plus the partition's offsets."""

    ranges: tuple  # ((fd, position, length), ...)
    size: int  # total bytes in ranges
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    end_bytes: int  # the row's end_bytes in the state this read saw: a waiter counts appends from here
    last_stable_offset: int = -1  # the LSO in that state


def partition_directory(data_dir: str, topic: str, partition: int) -> str:
    return os.path.join(data_dir, f"{topic}-{partition}")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class PartitionLock:
    """The partition's cross-process lock (an OFD fcntl lock: dies with its holder, per open file)."""

    def __init__(self, directory: str):
        self.fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def __enter__(self):
        fcntl.fcntl(self.fd, fcntl.F_OFD_SETLKW, LOCK_REQUEST)
        return self

    def __exit__(self, *exc_info):
        fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, UNLOCK_REQUEST)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PartitionLog:
    """This process's handle on one partition. Open with PartitionLog(...) in workers, recover() at start."""

    def __init__(self, directory: str, table: PartitionTable, row: int, config: LogConfig = LogConfig()):
        self.directory = directory
        self.table = table
        self.row = row
        self.config = config
        self.lock = PartitionLock(directory)
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self._segments_version = -1
        # The last read() and its answer: a read is a function of the published state and its arguments, so
        # the many consumers tailing a partition (a long-poll fan-out: thousands answered in one loop turn)
        # share one index lookup and batch scan.
        self._last_read: tuple[tuple, FetchSlice] | None = None
        # Where the log ended when a read found nothing past its end: (end offset, active segment's base,
        # segments_version, end position). The batch that holds that offset starts at that position (appends
        # are contiguous in the active segment), so the long poll answered later needs no index lookup or
        # header scan: the read a tailing consumer does on every append.
        self._tail_hint: tuple[int, int, int, int] | None = None
        self._retired: list[tuple[float, Segment]] = []
        self._producer_state: ProducerStateTable | None = None
        self.faults: list[OSError] = []  # disk faults recovery lived through (recover() fills it)

    # Segment list -----------------------------------------------------------------------------------

    def _segment(self, base_offset: int, create: bool = False) -> Segment:
        config = self.config
        return Segment(
            self.directory,
            base_offset,
            config.index_max_bytes,
            config.scan_chunk_bytes,
            create,
            config.scan_first_read_bytes,
            config.index_reserve_entries,
        )

    def _refresh(self, state: PartitionState) -> PartitionState:
        """Bring the segment list in line with the directory after a roll or retention by anyone."""
        for _ in range(MAX_REFRESH_ATTEMPTS):
            bases = segment_base_offsets(self.directory)
            # Skip segments wholly below the log start: retention is deleting them.
            first = max(0, bisect.bisect_right(bases, state.log_start_offset) - 1)
            bases = [base for base in bases[first:] if base <= state.active_base_offset]
            current = {segment.base_offset: segment for segment in self.segments}
            try:
                segments = [self._same_or_opened(current.get(base), base) for base in bases]
            except FileNotFoundError:
                state = self.table.read(self.row)
                continue
            kept = {id(segment) for segment in segments}
            for segment in self.segments:
                if id(segment) not in kept:
                    self._retired.append((time.monotonic() + self.config.retired_segment_close_delay_s, segment))
            self.segments = segments
            self._bases = bases
            self._segments_version = state.segments_version
            self._close_retired()
            return state
        raise StorageError(ErrorCode.KAFKA_STORAGE_ERROR, f"{self.directory} kept changing while being listed")

    def _same_or_opened(self, segment: Segment | None, base: int) -> Segment:
        """The segment this process has open at `base`, unless the cleaner replaced its file: then the new one."""
        if segment is not None and os.stat(segment.log_path).st_ino == segment.inode:
            return segment
        return self._segment(base)

    def _close_retired(self) -> None:
        if self._retired and self._retired[0][0] <= time.monotonic():
            now = time.monotonic()
            for _, segment in [item for item in self._retired if item[0] <= now]:
                segment.close()
            self._retired = [item for item in self._retired if item[0] > now]

    def _current_state(self) -> PartitionState:
        state = self.table.read(self.row)
        if not state.online:
            raise StorageError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{self.directory} is not online")
        if state.segments_version != self._segments_version:
            state = self._refresh(state)
        return state

    def _extent(self, segment: Segment, state: PartitionState) -> tuple[int, int]:
        """(end position, valid index entries) of a segment as of `state`."""
        if segment.base_offset == state.active_base_offset:
            return state.end_position, state.active_index_entries
        return segment.sealed_size(), segment.sealed_entries()

    @property
    def name(self) -> str:
        """The partition's name, `<topic>-<partition>` (its directory's)."""
        return os.path.basename(self.directory)

    def _fault(self, what: str, exc: BaseException, **marks: int) -> BaseException:
        """The exception to raise for `exc` met during `what` (the caller holds the lock). A disk fault is
        counted in the row (with `marks`, e.g. flush_failed=1), logged if no process logged one for this
        partition within the interval, and becomes StorageError(KAFKA_STORAGE_ERROR); anything else is a
        bug and is returned as it is."""
        error = exc if isinstance(exc, StorageError) else storage_fault(exc, f"{what} of {self.name}")
        if error is exc and not isinstance(exc, StorageError):
            return exc
        now = monotonic_ms()
        state = self.table.read(self.row)
        errors = state.storage_errors + 1
        due = now - state.storage_error_logged_ms >= self.config.storage_error_log_interval_ms \
            or not state.storage_error_logged_ms
        self.table.publish(self.row, state._replace(
            storage_errors=errors, storage_error_logged_ms=now if due else state.storage_error_logged_ms,
            **marks))
        if due:
            log.warning("partition %s: %s failed (%s); answering KAFKA_STORAGE_ERROR (56) until it works "
                        "again (%d storage errors on this partition so far; next line in %d s at the earliest)",
                        self.name, what, exc, errors, self.config.storage_error_log_interval_ms // 1000)
        return error

    # Append -----------------------------------------------------------------------------------------

    def append(self, batch, now: int | None = None) -> AppendResult:
        """Validate and append one client batch (bytes or memoryview, baseOffset 0). Raises StorageError."""
        config = self.config
        header = validate_client_batch(batch, config.max_message_bytes)
        if now is None:
            now = now_ms()
        append_time = -1
        if config.compacts:
            keyless = keyless_records(batch, header)
            if keyless:  # as Kafka's LogValidator: the whole batch is refused, naming the records at fault
                message = f"compacted topic partition {self.name} cannot accept a record without a key"
                raise StorageError(ErrorCode.INVALID_RECORD, message, tuple((i, message) for i in keyless))
        if config.rewrites:
            batch, header, append_time = _conform(batch, header, config, now)
        with self.lock:
            state = self._current_state()
            if header.producer_id >= 0:
                duplicate = self._check_producer(header, state)
                if duplicate is not None:
                    return AppendResult(
                        duplicate.base_offset, duplicate.last_offset, state.log_start_offset, state.end_bytes, True
                    )
            state, segment, position, entries = self._place(state, batch, now)
            base_offset = state.log_end_offset
            last_offset = base_offset + header.last_offset_delta
            first_unstable = state.first_unstable_offset
            producers = self._producer_state
            if producers is not None and producers.end_offset == base_offset:
                producers.apply(
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence,
                    header.last_sequence,
                    base_offset,
                    last_offset,
                    header.max_timestamp,
                    bool(header.attributes & TRANSACTIONAL_BIT),
                )
                if header.producer_id >= 0:  # caught up by _check_producer: it knows every open transaction
                    first_unstable = producers.first_unstable_offset()
            state = self._publish_append(state, header, position, len(batch), entries, now, first_unstable)
        wants_flush = last_offset + 1 - state.flushed_offset >= config.flush_messages
        return AppendResult(base_offset, last_offset, state.log_start_offset, state.end_bytes, False, append_time,
                            wants_flush)

    def append_marker(self, producer_id: int, producer_epoch: int, control: int, coordinator_epoch: int,
                      now: int | None = None) -> AppendResult:
        """Append a transaction marker (ControlType COMMIT or ABORT) for a producer: the node's own control batch,
        the end of that producer's open transaction here. An ABORT of an open transaction gets its entry in the
        active segment's aborted-transaction index before the append is published. Raises StorageError
        (INVALID_PRODUCER_EPOCH for a marker older than the producer's epoch here)."""
        if now is None:
            now = now_ms()
        with self.lock:
            state = self._current_state()
            producers = self._caught_up_producer_state(state)
            producers.check_marker(producer_id, producer_epoch)
            batch = build_control_batch(producer_id, producer_epoch, control, coordinator_epoch, now)
            header = parse_header(batch)
            state, segment, position, entries = self._place(state, batch, now)
            offset = state.log_end_offset
            completed = producers.apply_marker(producer_id, producer_epoch, control == ControlType.ABORT, offset, now)
            first_unstable = producers.first_unstable_offset()
            if completed is not None and completed.aborted:
                stable = first_unstable if first_unstable >= 0 else offset + 1
                try:
                    segment.txn_index(create=True).append(
                        AbortedTransaction(producer_id, completed.first_offset, offset, stable))
                except OSError as exc:
                    self._producer_state = None  # it applied a marker that is not published: rebuilt on next use
                    raise self._fault("aborted-transaction index", exc) from None
            state = self._publish_append(state, header, position, len(batch), entries, now, first_unstable)
        wants_flush = offset + 1 - state.flushed_offset >= self.config.flush_messages
        return AppendResult(offset, offset, state.log_start_offset, state.end_bytes, False, -1, wants_flush)

    def _place(self, state: PartitionState, batch, now: int):
        """Write a batch at the log end, rolling first if the active segment is full or old (caller holds the
        lock). Returns (state, segment, position, index entries) as of the write; publishes nothing."""
        config = self.config
        size = len(batch)
        position = state.end_position
        entries = state.active_index_entries
        segment = self.segments[-1]
        try:
            if position > 0 and (
                position + size > config.segment_bytes
                or entries >= segment.capacity - 1
                or (state.active_first_append_ms >= 0
                    and now - state.active_first_append_ms > config.segment_ms - config.roll_jitter_ms(segment.base_offset))
                # A time entry past the published ones: a roll sealed this segment and died before
                # publishing (or a killed writer left a stale entry); rolling now finishes it either way.
                or segment.stale_time_entry(entries)
            ):
                state = self._roll(state, segment)
                segment, position, entries = self.segments[-1], 0, 0
            base_offset = state.log_end_offset
            segment.write_batch(position, BASE_OFFSET.pack(base_offset), batch)
            last_indexed = segment.index_positions[entries - 1] if entries else 0
            if position > 0 and position - last_indexed >= config.index_interval_bytes:
                segment.write_index_entry(entries, base_offset, position, state.active_max_timestamp)
                entries += 1
        except OSError as exc:
            # Nothing is published: what a failed roll or write left lies past the published end, where no
            # reader looks and the next append writes (or rolls) again.
            raise self._fault("append", exc) from None
        return state, segment, position, entries

    def _publish_append(self, state: PartitionState, header, position: int, size: int, entries: int, now: int,
                        first_unstable: int) -> PartitionState:
        """Publish the batch _place() wrote (caller holds the lock); returns the new state."""
        last_offset = state.log_end_offset + header.last_offset_delta
        state = state._replace(
            log_end_offset=last_offset + 1,
            high_watermark=last_offset + 1,
            end_bytes=state.end_bytes + size,
            end_position=position + size,
            active_max_timestamp=max(state.active_max_timestamp, header.max_timestamp),
            active_first_append_ms=now if position == 0 else state.active_first_append_ms,
            active_index_entries=entries,
            producer_batches_end=last_offset + 1 if header.producer_id >= 0 else state.producer_batches_end,
            first_unstable_offset=first_unstable,
        )
        self.table.publish(self.row, state)
        return state

    def _check_producer(self, header, state: PartitionState):
        producers = self._caught_up_producer_state(state)
        return producers.check(header.producer_id, header.producer_epoch, header.base_sequence, header.last_sequence)

    def active_producers(self) -> list[tuple[int, ProducerEntry]]:
        """(producer id, its entry) of every producer this partition's state keeps, as of the log end now
        (DescribeProducers); entries are copies the caller may keep."""
        with self.lock:
            producers = self._caught_up_producer_state(self._current_state())
            return [(producer_id, ProducerEntry(entry.epoch, deque(entry.batches), entry.last_timestamp,
                                                entry.open_transaction_from))
                    for producer_id, entry in sorted(producers.producers.items())]

    def catch_up_producer_state(self) -> None:
        """Bring this process's producer state up to the log end now, so that a later marker append scans only the
        batches appended after this (the timer, ahead of the markers it will write)."""
        with self.lock:
            self._caught_up_producer_state(self._current_state())

    def _caught_up_producer_state(self, state: PartitionState, rebuild_txn_index: bool = False) -> ProducerStateTable:
        """This process's producer state, brought up to the row's log end (caller holds the lock). Recovery
        (`rebuild_txn_index`) also rewrites the aborted-transaction index entries of the batches it replays."""
        producers = self._producer_state
        if producers is None:
            producers = load_latest_snapshot(
                self.directory, state.log_end_offset, self.config.producer_batches_retained
            ) or ProducerStateTable(self.config.producer_batches_retained, state.log_start_offset)
            # As Kafka loads a snapshot: producers that expired since it was written are not taken in (an idle
            # partition's snapshot is not rewritten, so it may be old).
            producers.expire(now_ms(), self.config.producer_id_expiration_ms)
            self._producer_state = producers
        if producers.end_offset < state.log_start_offset:
            producers = self._producer_state = self._producer_state_past(state, producers)
        if rebuild_txn_index:
            self._truncate_txn_indexes(producers.end_offset)
        if producers.end_offset < state.log_end_offset:
            # Only batches before producer_batches_end can carry a producer id: the scan stops there, so a log
            # of plain (non-idempotent) batches is never read back under the lock, however much of it is new.
            if producers.end_offset < state.producer_batches_end:
                for segment, position, header in self._headers_from(producers.end_offset, state,
                                                                    state.producer_batches_end):
                    if header[5] & CONTROL_BIT:
                        self._replay_marker(producers, segment, position, header, rebuild_txn_index)
                        continue
                    producers.apply(
                        header[9],
                        header[10],
                        header[11],
                        last_sequence(header[11], header[6]),
                        header[0],
                        header[0] + header[6],
                        header[8],
                        bool(header[5] & TRANSACTIONAL_BIT),
                    )
            producers.end_offset = state.log_end_offset
        return producers

    def _snapshot_before_the_start_moves(self, state: PartitionState) -> None:
        """A snapshot at the log end before the log start moves past batches some process may not have applied
        (caller holds the lock; see _producer_state_past). On a disk fault the start moves all the same: retention
        is what frees a full disk (the fault is counted and logged as any other)."""
        try:
            self._snapshot_at_log_end(state)
        except StorageError:
            pass

    def _producer_state_past(self, state: PartitionState, stale: ProducerStateTable) -> ProducerStateTable:
        """This process's producer state ends before the log start (caller holds the lock): another process moved
        the start (DeleteRecords, retention) past batches this one never applied, and they are no longer its to
        read. Skipping them would keep open the transactions their markers closed (the LSO published back at a
        transaction long closed, a later abort indexed from its stale first offset). The newest snapshot at or
        after the log start stands in: one is written before every move of the start (_snapshot_at_log_end).
        Without one (a data dir from before), the stale state goes on from the log start."""
        snapshot = load_latest_snapshot(self.directory, state.log_end_offset, self.config.producer_batches_retained)
        if snapshot is not None and snapshot.end_offset >= state.log_start_offset:
            snapshot.expire(now_ms(), self.config.producer_id_expiration_ms)
            return snapshot
        stale.end_offset = state.log_start_offset
        return stale

    def _replay_marker(self, producers: ProducerStateTable, segment: Segment, position: int, header,
                       rebuild_txn_index: bool) -> None:
        """Apply a stored control batch to the producer state (and, in recovery, index its abort)."""
        head = os.pread(segment.log_fd, BATCH_HEADER_SIZE + CONTROL_KEY_READ, position)
        kind = control_type(head, parse_header(head)) if len(head) == BATCH_HEADER_SIZE + CONTROL_KEY_READ else None
        if kind not in (ControlType.ABORT, ControlType.COMMIT):
            producers.end_offset = header[0] + header[6] + 1  # not a transaction marker: nothing to apply
            return
        offset = header[0]
        completed = producers.apply_marker(header[9], header[10], kind == ControlType.ABORT, offset, header[8])
        if rebuild_txn_index and completed is not None and completed.aborted:
            first_unstable = producers.first_unstable_offset()
            segment.txn_index(create=True).append(AbortedTransaction(
                completed.producer_id, completed.first_offset, offset,
                first_unstable if first_unstable >= 0 else offset + 1))

    def _truncate_txn_indexes(self, offset: int) -> None:
        """Recovery: drop the aborted-transaction entries of markers at or past `offset` (replayed again)."""
        for number, segment in enumerate(self.segments):
            if number == len(self.segments) - 1 or self.segments[number + 1].base_offset > offset:
                segment.txn_index(create=True).truncate_from(offset)

    def _headers_from(self, offset: int, state: PartitionState, stop: int):
        """(segment, position, header tuple) of the batches from the one holding `offset` to the one holding
        `stop - 1`."""
        first = max(0, bisect.bisect_right(self._bases, offset) - 1)
        for segment in self.segments[first:]:
            if segment.base_offset >= stop:
                return
            end, entries = self._extent(segment, state)
            start = segment.position_of(offset, entries, end) if segment.base_offset <= offset else 0
            for position, header in segment.scanner.headers(start, end):
                if header[0] >= stop:
                    return
                if header[0] + header[6] >= offset:
                    yield segment, position, header

    def _roll(self, state: PartitionState, old: Segment) -> PartitionState:
        """Seal the active segment and start a new one at the log end (caller holds the lock)."""
        next_offset = state.log_end_offset
        old.seal(state.end_position, state.active_index_entries, state.active_max_timestamp, next_offset)
        segment = self._segment(next_offset, create=True)
        try:
            segment.reset()  # a roll interrupted before publishing may have left this segment's files behind
            producers = self._caught_up_producer_state(state)
            producers.expire(now_ms(), self.config.producer_id_expiration_ms)
            self._sync_txn_index(old, state)
            producers.write_snapshot(self.directory)
            self._prune_snapshots(state.log_start_offset)
        except BaseException:
            segment.close()  # a roll that fails (a full disk) is tried again by the next append
            raise
        state = state._replace(
            active_base_offset=next_offset,
            end_position=0,
            active_index_entries=0,
            active_max_timestamp=-1,
            active_first_append_ms=-1,
            segments_version=state.segments_version + 1,
        )
        self.table.publish(self.row, state)
        self.segments.append(segment)
        self._bases.append(next_offset)
        self._segments_version = state.segments_version
        return state

    @classmethod
    def _sync_txn_index(cls, segment: Segment, state: PartitionState) -> None:
        """Before a producer snapshot: recovery rebuilds aborted-transaction entries only after the snapshot it
        starts from, so the entries before it must be on disk first (those of flushed markers are)."""
        if cls._txn_index_unsynced(segment, state):
            segment.txn_index().flush()

    @staticmethod
    def _txn_index_unsynced(segment: Segment, state: PartitionState) -> bool:
        """Whether the segment's aborted-transaction index may hold an entry not yet durable
        (node.storage.txn_index)."""
        index = segment.txn_index()
        return index is not None and index.needs_sync(state.flushed_offset, state.producer_batches_end)

    def _prune_snapshots(self, log_start_offset: int) -> None:
        offsets = snapshot_offsets(self.directory)
        keep = set(offsets[-self.config.producer_snapshots_retained :])
        delete_snapshots(self.directory, lambda offset: offset in keep and offset >= log_start_offset)

    def open_transactions(self) -> dict[int, tuple[int, int]]:
        """{producer id: (first offset, producer epoch)} of the transactions open in this partition now."""
        with self.lock:
            producers = self._caught_up_producer_state(self._current_state())
            return {pid: (first, producers.producers[pid].epoch)
                    for pid, first in producers.open_transactions().items()}

    def write_producer_snapshot(self) -> int:
        """Snapshot the producer state at the log end (bounds the scans of recovery and of catching up).

        Meant for the timer process now and then; rolls write one too. Returns the snapshot's offset. A partition
        that already has a snapshot at its log end (nothing appended since the last one, by any process) keeps it,
        as Kafka's takeSnapshot does: an idle node does not rewrite and fsync every partition's snapshot each round.
        """
        with self.lock:
            return self._snapshot_at_log_end(self._current_state())

    def _snapshot_at_log_end(self, state: PartitionState) -> int:
        """write_producer_snapshot's work (caller holds the lock). Also before the log start moves (DeleteRecords,
        retention), so that a snapshot at or after the new start exists for the processes whose producer state
        ends before it (_producer_state_past)."""
        if os.path.exists(os.path.join(self.directory, snapshot_name(state.log_end_offset))):
            return state.log_end_offset
        producers = self._caught_up_producer_state(state)
        producers.expire(now_ms(), self.config.producer_id_expiration_ms)
        try:
            self._sync_txn_index(self.segments[-1], state)
            producers.write_snapshot(self.directory)
            self._prune_snapshots(state.log_start_offset)
        except OSError as exc:
            raise self._fault("producer snapshot", exc) from None
        return producers.end_offset

    def roll(self) -> None:
        """Roll now if the active segment has data (for tests and administrative use)."""
        with self.lock:
            state = self._current_state()
            if state.end_position > 0:
                self._roll(state, self.segments[-1])

    # Read -------------------------------------------------------------------------------------------

    def read(self, fetch_offset: int, max_bytes: int, min_one_batch: bool = True,
             committed: bool = False) -> FetchSlice:
        """File ranges holding whole batches from the one containing fetch_offset, up to max_bytes.

        With min_one_batch (KIP-74) the first batch is returned even if it is larger than max_bytes.
        `committed` (read_committed): only the batches below the last stable offset.
        Raises StorageError(OFFSET_OUT_OF_RANGE) outside [log_start_offset, log_end_offset].
        """
        state = self.table.read(self.row)
        key = (state, fetch_offset, max_bytes, min_one_batch, committed)
        last = self._last_read
        if last is not None and last[0] == key:
            return last[1]
        answer = self._read(state, fetch_offset, max_bytes, min_one_batch)
        if committed:
            answer = self._below_stable(state, fetch_offset, answer)
        self._last_read = (key, answer)
        return answer

    def _below_stable(self, state: PartitionState, fetch_offset: int, answer: FetchSlice) -> FetchSlice:
        """`answer` cut at the batch holding the LSO (a transaction's first batch: batches are never split)."""
        stable = state.last_stable_offset
        if stable >= state.log_end_offset or not answer.ranges:
            return answer
        empty = answer._replace(ranges=(), size=0)
        if fetch_offset >= stable:
            return empty
        fd, start, length = answer.ranges[0]
        segment = next((segment for segment in self.segments if segment.log_fd == fd), None)
        if segment is None:
            return empty  # the segment list changed under this read: the consumer asks again
        end, entries = self._extent(segment, state)
        limit = segment.position_of(stable, entries, min(end, start + length))
        if limit <= start:
            return empty
        return answer._replace(ranges=((fd, start, min(length, limit - start)),), size=min(length, limit - start))

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTransaction]:
        """The aborted transactions with records in [start, end), from the segments' indexes (what a
        read_committed fetch lists so that the client skips their batches)."""
        state = self.table.read(self.row)
        if state.segments_version != self._segments_version:
            state = self._refresh(state)
        first = max(0, bisect.bisect_right(self._bases, start) - 1)
        active = state.active_base_offset
        indexes = ((index, segment.base_offset != active) for segment in self.segments[first:]
                   if (index := segment.txn_index()) is not None)
        return collect_aborted(indexes, start, end, state.log_end_offset,
                               lambda entry: self._is_abort_marker(entry, state))

    def _is_abort_marker(self, entry: AbortedTransaction, state: PartitionState) -> bool:
        """Whether the batch at the entry's last offset is its producer's ABORT marker (node.storage.txn_index:
        an entry a killed writer left names some other batch, or none)."""
        index = bisect.bisect_right(self._bases, entry.last_offset) - 1
        if index < 0:
            return False
        segment = self.segments[index]
        end, entries = self._extent(segment, state)
        position = segment.position_of(entry.last_offset, entries, end)
        if position >= end:
            return False
        head = os.pread(segment.log_fd, BATCH_HEADER_SIZE + CONTROL_KEY_READ, position)
        if len(head) < BATCH_HEADER_SIZE + CONTROL_KEY_READ:
            return False
        header = parse_header(head)
        return header.base_offset == entry.last_offset and header.producer_id == entry.producer_id \
            and control_type(head, header) == ControlType.ABORT

    def _read(self, state: PartitionState, fetch_offset: int, max_bytes: int, min_one_batch: bool) -> FetchSlice:
        if not state.online:
            raise StorageError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{self.directory} is not online")
        log_end = state.log_end_offset
        if fetch_offset == log_end:
            self._tail_hint = (log_end, state.active_base_offset, state.segments_version, state.end_position)
            return FetchSlice((), 0, state.high_watermark, state.log_start_offset, log_end, state.end_bytes,
                              state.last_stable_offset)
        if fetch_offset > log_end or fetch_offset < state.log_start_offset:
            raise StorageError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"offset {fetch_offset} outside [{state.log_start_offset}, {log_end}]",
            )
        if state.segments_version != self._segments_version:
            state = self._refresh(state)
        index = bisect.bisect_right(self._bases, fetch_offset) - 1
        hint = self._tail_hint
        segment = self.segments[index] if index >= 0 else None
        if hint is not None and hint[0] == fetch_offset and hint[1] == state.active_base_offset \
                and hint[2] == state.segments_version and segment is not None \
                and segment.base_offset == state.active_base_offset and hint[3] < state.end_position:
            end, entries = self._extent(segment, state)
            start = hint[3]
        else:
            while index < len(self.segments):
                segment = self.segments[index]
                end, entries = self._extent(segment, state)
                start = segment.position_of(fetch_offset, entries, end)
                if start < end:
                    break
                index += 1  # fetch_offset is past this segment's last batch: it starts the next one
            else:
                return FetchSlice((), 0, state.high_watermark, state.log_start_offset, log_end, state.end_bytes,
                                  state.last_stable_offset)
        length = end - start
        if length > max_bytes:
            boundary = segment.boundary_at_or_before(start, start + max_bytes, entries)
            if boundary == start:
                if not min_one_batch:
                    return FetchSlice((), 0, state.high_watermark, state.log_start_offset, log_end, state.end_bytes,
                                      state.last_stable_offset)
                (first_size,) = struct.unpack(">i", os.pread(segment.log_fd, 4, start + 8))
                boundary = start + first_size + LENGTH_FIELDS_SIZE
            length = boundary - start
        return FetchSlice(
            ((segment.log_fd, start, length),), length, state.high_watermark, state.log_start_offset, log_end,
            state.end_bytes, state.last_stable_offset,
        )

    def state(self) -> PartitionState:
        """The partition's published state (log start/end offsets, high watermark, flushed offset, ...)."""
        return self.table.read(self.row)

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """ListOffsets by timestamp: (offset, timestamp) of the first record at or after the log start with
        timestamp >= `timestamp`.

        Exact for uncompressed batches; for a compressed batch, its base offset and maxTimestamp.
        None when no record is that recent. A cleaned batch (log compaction) lacks some of the offsets between
        its base and last: the records' own offsets count, as Kafka's.
        """
        state = self._current_state()
        for segment in self.segments:
            end, entries = self._extent(segment, state)
            if segment.base_offset == state.active_base_offset:
                newest = state.active_max_timestamp
            else:
                newest = segment.max_timestamp()
            if newest < timestamp:
                continue
            start = state.log_start_offset
            while (found := segment.first_batch_with_timestamp(timestamp, entries, end, start)) is not None:
                position, raw = found
                batch = os.pread(segment.log_fd, raw[1] + LENGTH_FIELDS_SIZE, position)
                header = parse_header(batch)
                found_records = record_offsets_and_timestamps(batch, header)
                if found_records is None:  # compressed: its base offset, as the docstring says
                    return max(header.base_offset, state.log_start_offset), header.max_timestamp
                for offset, record_timestamp in found_records:
                    # As Kafka: only records at or after the log start count (DeleteRecords may cut a batch).
                    if record_timestamp >= timestamp and offset >= state.log_start_offset:
                        return offset, record_timestamp
                # None of this batch's records is both that recent and at or after the log start: look on past it.
                start = header.last_offset + 1
        return None

    def offset_of_max_timestamp(self) -> tuple[int, int] | None:
        """ListOffsets MAX_TIMESTAMP (KIP-734): (offset, timestamp) of the first record with the log's largest
        timestamp, or None when the log has no record. As Kafka: the first segment with the largest max
        timestamp, its first batch with that max timestamp, that batch's first record with it (a compressed
        batch is decompressed to find it). Raises StorageError(CORRUPT_MESSAGE) if that batch does not decode."""
        state = self._current_state()
        newest, holder = -1, None
        for segment in self.segments:
            largest = (state.active_max_timestamp if segment.base_offset == state.active_base_offset
                       else segment.max_timestamp())
            if largest > newest:
                newest, holder = largest, segment
        if holder is None:
            return None
        end, entries = self._extent(holder, state)
        found = holder.first_batch_with_timestamp(newest, entries, end)
        if found is None:
            return None
        position, raw = found
        batch = os.pread(holder.log_fd, raw[1] + LENGTH_FIELDS_SIZE, position)
        header = parse_header(batch)
        for offset, record_timestamp in all_record_offsets_and_timestamps(batch, header):
            if record_timestamp == header.max_timestamp:
                return max(offset, state.log_start_offset), record_timestamp
        return max(header.base_offset, state.log_start_offset), header.max_timestamp

    # Flush and retention (timer process) -------------------------------------------------------------

    def flush(self, indexes: bool = False) -> int:
        """fdatasync every segment holding unflushed data, then publish flushed_offset. Returns it.

        The syncs run outside the lock so appends continue meanwhile; the lock is taken only to publish.
        Index mappings are synced too only with `indexes` (a clean stop): recovery never needs them.
        After a failed fsync (flush_failed) the unflushed batches are re-written first (see the module
        invariants). Raises StorageError(KAFKA_STORAGE_ERROR) on a disk fault.
        """
        state = self._current_state()
        if state.flushed_offset >= state.log_end_offset:
            if indexes:
                for segment in self.segments:
                    segment.flush(indexes=True)
            return state.flushed_offset
        first = 0 if indexes else max(0, bisect.bisect_right(self._bases, state.flushed_offset) - 1)
        try:
            if state.flush_failed:
                self._rewrite_unflushed(state, first)
            for segment in self.segments[first:]:
                segment.flush(indexes, indexes or self._txn_index_unsynced(segment, state))
        except (OSError, StorageError) as exc:
            with self.lock:
                raise self._fault("fsync", exc, flush_failed=1) from None
        with self.lock:
            current = self.table.read(self.row)
            if current.flushed_offset < state.log_end_offset:
                self.table.publish(
                    self.row,
                    current._replace(flushed_offset=state.log_end_offset, flushed_bytes=state.end_bytes,
                                     flush_failed=0),
                )
            elif current.flush_failed:
                self.table.publish(self.row, current._replace(flush_failed=0))
        if state.flush_failed:
            log.info("%s: fsync works again; the data re-written since the failure is on disk", self.name)
        self._drop_flushed_pages(state)
        return max(current.flushed_offset, state.log_end_offset)

    def _drop_flushed_pages(self, flushed: PartitionState) -> None:
        """Drop from the page cache what was fsync'd as of `flushed` beyond the window behind its end (see
        the module invariants), newest segment first; older segments were dropped whole before."""
        window = self.config.page_cache_window_bytes
        if window < 0:
            return
        behind_end = 0  # flushed bytes in the segments newer than this one
        for segment in reversed(self.segments):
            end = self._extent(segment, flushed)[0]
            sealed = segment.base_offset != flushed.active_base_offset
            drop_to = end - max(0, window - behind_end)
            behind_end += end
            if drop_to <= 0:
                continue
            if sealed and segment.uncached_position >= end:
                break  # this one was dropped whole, so were the older ones
            if sealed and behind_end - end >= window:
                segment.drop_from_page_cache(end, whole=True)
            elif drop_to - segment.uncached_position >= self.config.page_cache_drop_bytes:
                segment.drop_from_page_cache(drop_to)

    def _rewrite_unflushed(self, state: PartitionState, first: int) -> None:
        """Write the batches after flushed_offset again, from what the page cache holds, so the next fsync
        really covers them. A batch whose CRC no longer checks was lost with the dropped pages: the
        partition stays marked, and a restart's recovery truncates the log there."""
        chunk = self.config.rewrite_chunk_bytes
        for segment in self.segments[first:]:
            end, entries = self._extent(segment, state)
            start = segment.position_of(state.flushed_offset, entries, end) if segment.base_offset <= \
                state.flushed_offset else 0
            for position, header in segment.scanner.headers(start, end):
                size = header[1] + LENGTH_FIELDS_SIZE
                data = os.pread(segment.log_fd, size, position)
                if not stored_batch_is_valid(data, header[0]):
                    raise StorageError(ErrorCode.KAFKA_STORAGE_ERROR, f"{self.name}: unflushed batch at offset "
                                       f"{header[0]} was lost after a failed fsync")
                for offset in range(0, size, chunk):
                    os.pwrite(segment.log_fd, memoryview(data)[offset:offset + chunk], position + offset)

    def enforce_retention(self, now: int | None = None) -> int:
        """Delete whole old segments past retention_ms or beyond retention_bytes; returns how many."""
        config = self.config
        if not config.deletes or config.retention_ms < 0 and config.retention_bytes < 0:
            return 0
        if now is None:
            now = now_ms()
        with self.lock:
            state = self._current_state()
            sealed = self.segments[:-1]
            doomed = 0
            if config.retention_ms >= 0:
                while doomed < len(sealed) and sealed[doomed].max_timestamp() < now - config.retention_ms:
                    doomed += 1
            if config.retention_bytes >= 0:
                total = state.end_position + sum(segment.sealed_size() for segment in sealed[doomed:])
                while doomed < len(sealed) and total - sealed[doomed].sealed_size() >= config.retention_bytes:
                    total -= sealed[doomed].sealed_size()
                    doomed += 1
            if doomed:
                self._snapshot_before_the_start_moves(state)
            self._delete_oldest(state, doomed)
        return doomed

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: make `offset` the log start (-1: the high watermark), also inside a segment; the whole
        segments below it go. Returns the new log start (the old one if `offset` is below it). Raises
        StorageError(OFFSET_OUT_OF_RANGE) past the high watermark.

        The records up to `offset` are fsync'd and the new start is written to the partition's checkpoint
        (fsync'd, replaced atomically) before it is published, so an acknowledged deletion survives any crash
        and a restarted node never serves a record below it. Meant for one caller at a time (the timer's I/O
        thread, which also runs retention)."""
        state = self._current_state()
        if offset == -1:
            offset = state.high_watermark
        if offset < 0 or offset > state.high_watermark:
            raise StorageError(ErrorCode.OFFSET_OUT_OF_RANGE,
                               f"offset {offset} is outside [0, high watermark {state.high_watermark}]")
        if offset <= state.log_start_offset:
            return state.log_start_offset
        if state.flushed_offset < offset:
            self.flush()
        write_log_start_checkpoint(self.directory, offset)
        with self.lock:
            state = self._current_state()
            if offset <= state.log_start_offset:
                return state.log_start_offset
            self._snapshot_before_the_start_moves(state)
            count = 0
            while count < len(self.segments) - 1 and self.segments[count + 1].base_offset <= offset:
                count += 1
            if count:
                self._delete_oldest(state._replace(log_start_offset=offset), count)
            else:
                state = state._replace(log_start_offset=offset, segments_version=state.segments_version + 1)
                self.table.publish(self.row, state)
                self._refresh(state)
        return offset

    def _delete_oldest(self, state: PartitionState, count: int) -> None:
        """Drop the `count` oldest segments (caller holds the lock): the new log start is published before any
        file goes, as the module invariants require."""
        if count == 0:
            return
        deleted = self.segments[:count]
        state = state._replace(
            log_start_offset=max(state.log_start_offset, self.segments[count].base_offset),
            segments_version=state.segments_version + 1,
        )
        self.table.publish(self.row, state)  # before unlinking: see the module invariants
        try:
            for segment in deleted:
                segment.delete_files()
            self._refresh(state)
            self._prune_snapshots(state.log_start_offset)
        except OSError as exc:
            raise self._fault("retention", exc) from None

    def finish_interrupted_swap(self) -> None:
        """Finish a cleaning swap whose manifest was committed (its cleaner died in it), or discard an
        uncommitted cleaning directory; publish the segment list if the swap changed it."""
        with self.lock:
            state = self._current_state()
            try:
                finished = finish_swap(self.directory)
            except OSError as exc:
                raise self._fault("log cleaning swap", exc) from None
            if finished:
                state = state._replace(segments_version=state.segments_version + 1)
                self.table.publish(self.row, state)
                self._refresh(state)

    def replace_segments(self, staging: str, groups) -> bool:
        """Swap in segments the log cleaner wrote into `staging` (node.storage.cleaner): each group's new segment
        replaces the old sealed segments it names, if they are still the files it read (by inode); otherwise
        nothing changes and False is returned. The manifest written first is the swap's commit point."""
        with self.lock:
            state = self._current_state()
            for group in groups:
                for base, inode in group.old:
                    try:
                        if os.stat(os.path.join(self.directory, segment_file_name(base, LOG_SUFFIX))).st_ino != inode:
                            return False
                    except FileNotFoundError:
                        return False
                    if base >= state.active_base_offset or base < self._bases[0]:
                        return False
            try:
                write_manifest(staging, groups)
                finish_swap(self.directory)
            except OSError as exc:
                raise self._fault("log cleaning swap", exc) from None
            state = state._replace(segments_version=state.segments_version + 1)
            self.table.publish(self.row, state)
            self._refresh(state)
        return True

    def delete(self) -> None:
        """Delete the partition (DeleteTopics): mark its row offline, then remove its directory.

        Other processes get UNKNOWN_TOPIC_OR_PARTITION from then on and should close their handles.
        """
        with self.lock:
            state = self.table.read(self.row)
            self.table.publish(self.row, state._replace(online=0, segments_version=state.segments_version + 1))
            shutil.rmtree(self.directory, ignore_errors=True)
        self.close()

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
        for _, segment in self._retired:
            segment.close()
        self.segments, self._bases, self._retired = [], [], []
        self.lock.close()

    # Creation (timer process, for a partition the catalog does not name yet) -------------------------------

    @staticmethod
    def create(directory: str, table: PartitionTable, row: int, config: LogConfig = LogConfig()) -> None:
        """Make a new, empty partition and put its row online, with no fsync: until the catalog names the
        partition nothing can be in it, and a crash before that leaves only a directory nobody uses; a crash
        after it finds the directory, or recovery makes it again (an empty partition either way). A directory
        left by an earlier life of the name is recovered instead of reused blindly."""
        try:
            os.mkdir(directory)
        except FileExistsError:
            PartitionLog.recover(directory, table, row, config).close()
            return
        Segment.create_files(directory, 0, config.index_max_bytes)  # the lock file comes with its first user
        previous = table.read(row)
        table.publish(row, PartitionState(segments_version=previous.segments_version + 1, active_max_timestamp=-1,
                                          active_first_append_ms=-1, online=1))
        table.set_cleaning(row, **dict.fromkeys(CleaningStats._fields, 0))  # a reused row's figures are not its

    # Recovery (supervisor, one process, before workers start) ------------------------------------------

    def _survive(self, step, *args) -> None:
        """Recovery: run a write step that may meet a disk fault; note the fault and go on without it."""
        try:
            step(*args)
        except OSError as exc:
            if not is_storage_fault(exc):
                raise
            self.faults.append(exc)

    @classmethod
    def recover(
        cls, directory: str, table: PartitionTable, row: int, config: LogConfig = LogConfig(), verify_all_crc=False
    ) -> "PartitionLog":
        """Open a partition after a (possibly unclean) stop and fill its table row.

        Creates the directory if missing. Scans the last segment from its last good index entry,
        CRC-checking each batch and truncating after the last whole valid one; rebuilds any missing or
        inconsistent index; rebuilds producer state from the newest snapshot plus the batches after it.
        verify_all_crc: CRC-check every batch of every segment instead (slow; after a crash of the machine).
        """
        os.makedirs(directory, exist_ok=True)
        if finish_swap(directory):
            logging.getLogger("shmbroker.cleaner").info("%s: finished a log cleaning swap a stop interrupted",
                                                        directory)
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if ".tmp." in name:
                os.unlink(path)  # an interrupted snapshot write
            elif name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)):
                if not os.path.exists(os.path.join(directory, name.rsplit(".", 1)[0] + LOG_SUFFIX)):
                    os.unlink(path)  # indexes of a segment whose log retention already deleted
        bases = segment_base_offsets(directory) or [0]
        # Checked before the segments are opened (which makes their missing files).
        txn_index_lost = not all(os.path.exists(os.path.join(directory, segment_file_name(base, TXN_INDEX_SUFFIX)))
                                 for base in bases)
        log = cls(directory, table, row, config)
        with log.lock:
            log.segments = [log._segment(base, create=True) for base in bases]
            log._bases = list(bases)
            total_bytes = 0
            for number, segment in enumerate(log.segments):
                last = number == len(log.segments) - 1
                next_base = bases[number + 1] if not last else None
                valid = segment.valid_entries()
                if valid and not segment.entry_points_at_batch(valid - 1):
                    valid = 0
                if valid < segment.count_entries():
                    segment.clear_indexes()  # inconsistent: rebuild it from scratch
                if last or verify_all_crc or valid < segment.count_entries() or not _time_index_sealed(segment):
                    # Rescan from the last trusted entry (the whole segment if the index is untrustworthy).
                    start = valid - 1 if (last and valid and not verify_all_crc) else -1
                    # Only sealed segments are ever cleaned: the active one is dense.
                    end, entries, next_offset, max_timestamp, first_timestamp = segment.recover(
                        start, config.index_interval_bytes, verify_crc=last or verify_all_crc, dense=last
                    )
                    if not last:
                        log._survive(segment.seal, end, entries, max_timestamp, next_base)
                else:
                    end = segment.file_size()
                total_bytes += end
                log.faults.extend(segment.faults)
            segment = log.segments[-1]
            log._survive(segment.flush)
            previous = table.read(row)
            # DeleteRecords' checkpoint (never past the fsync'd records, so never past the recovered end).
            log_start = min(max(bases[0], read_log_start_checkpoint(directory)), next_offset)
            state = PartitionState(
                log_end_offset=next_offset,
                high_watermark=next_offset,
                log_start_offset=log_start,
                end_bytes=total_bytes,
                end_position=end,
                active_base_offset=segment.base_offset,
                flushed_offset=next_offset,
                flushed_bytes=total_bytes,
                segments_version=previous.segments_version + 1,
                active_max_timestamp=max_timestamp,
                active_first_append_ms=min(first_timestamp, now_ms()) if end > 0 else -1,
                online=1,
                active_index_entries=entries,
                producer_batches_end=next_offset,  # until the rebuild below knows better
            )
            table.publish(row, state)
            log._segments_version = state.segments_version
            below = 0  # whole segments a DeleteRecords had not yet unlinked when the node stopped
            while below < len(log.segments) - 1 and log.segments[below + 1].base_offset <= log_start:
                below += 1
            if below:
                log._delete_oldest(state, below)
                state = table.read(row)
            delete_snapshots(directory, lambda offset: log_start <= offset <= next_offset)
            if txn_index_lost:
                # An aborted-transaction index is missing (lost, or a log older than transactions): rebuild
                # them all, and the producer state with them, from the log start.
                log._producer_state = ProducerStateTable(config.producer_batches_retained, log_start)
            producers = log._caught_up_producer_state(state, rebuild_txn_index=True)
            if producers.end_offset != next_offset:
                raise StorageError(ErrorCode.KAFKA_STORAGE_ERROR, f"{directory}: producer state rebuild stopped short")
            # The rebuilt entries' markers count as flushed (flushed_offset is the log end): made durable here,
            # so that flushes and snapshots may skip an index nobody changed since (node.storage.txn_index).
            for segment in log.segments:
                if (index := segment.txn_index()) is not None and index.written:
                    log._survive(index.flush)
            table.update(row, producer_batches_end=producers.newest_batch_end(),
                         first_unstable_offset=producers.first_unstable_offset())
        return log


def write_log_start_checkpoint(directory: str, offset: int) -> None:
    """The partition's log start as DeleteRecords set it, durable."""
    write_offset(os.path.join(directory, LOG_START_FILE), offset)


def read_log_start_checkpoint(directory: str) -> int:
    """The checkpointed log start, 0 if there is none (or it cannot be read: then the segments say it)."""
    return read_offset(os.path.join(directory, LOG_START_FILE))


def _conform(batch, header, config: LogConfig, now: int):
    """A client batch as the topic's settings want it stored: CreateTime timestamps within the topic's bounds
    (INVALID_TIMESTAMP otherwise), LogAppendTime written, records in the topic's codec. Returns (batch, header,
    the log append time or -1)."""
    append_time = now if config.log_append_time else -1
    bounds = config.timestamp_bounds
    if bounds is not None and not config.log_append_time and not header.attributes & TIMESTAMP_TYPE_BIT:
        before, after = bounds
        # Only a bound on the future (Kafka 4's default: an hour) needs no record decoded: the batch's max
        # timestamp bounds its records' (a compressed batch would be decompressed on every produce otherwise).
        timestamps = ([header.max_timestamp] if before >= LONG_MAX
                      else all_record_timestamps(batch, header))
        for timestamp in timestamps:
            if timestamp < now - before or timestamp > now + after:
                raise StorageError(ErrorCode.INVALID_TIMESTAMP,
                                   f"timestamp {timestamp} is out of the range [{now - before}, {now + after}] "
                                   "the topic allows")
    codec = config.stored_codec
    if append_time >= 0 or (codec is not None and codec != header.compression):
        batch, header = rewrite_batch(batch, header, codec, append_time if append_time >= 0 else None)
    return batch, header, append_time


def _time_index_sealed(segment: Segment) -> bool:
    """A sealed segment's time index has exactly one entry more than its offset index (the final one)."""
    return segment.count_time_entries() == segment.count_entries() + 1
