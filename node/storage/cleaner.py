"""The log cleaner: compaction of a partition's log to the latest record of each key (Kafka's LogCleaner).

A compacted log (cleanup.policy compact) has a clean head and a dirty tail. The cleaner checkpoint
(`cleaner-offset-checkpoint` in the partition's directory) is the offset up to which the log was cleaned;
the dirty section runs from there to the first uncleanable offset: the active segment's base, or the first
sealed segment holding a record younger than min.compaction.lag.ms. Only sealed segments are ever cleaned,
so appends never wait for the cleaner.

One cleaning (`Cleaner.clean`):
1. The offset map: every record of the dirty section is read (numpy, node.storage.record_arrays: every
   record of a read chunk at once) and its key hashed into two 64-bit hashes (a collision of both is as
   unlikely as one of Kafka's 128-bit MD5); per key the latest offset is kept (a stable sort, the last of
   each key's run). The map holds at most `dedupe_buffer_bytes / MAP_ENTRY_BYTES` keys: past that, the
   dirty section ends at the segment that did not fit, and the rest waits for the next cleaning.
2. The rewrite: every sealed segment from the log start to the end of the mapped section, in groups of
   consecutive segments whose sizes add up to at most segment.bytes, is written into one new segment in the
   partition's `cleaning/` directory. A record is kept when its key's latest offset is its own or its key is
   not in the map (a key the dirty section does not hold: already the latest); a record without a key is
   dropped; a tombstone (null value) is dropped once the newest record of its segment is older than
   delete.retention.ms. A batch keeps its base offset, last offset delta, producer id, epoch, base sequence,
   base timestamp and codec (its kept records recompressed), so offsets never change and idempotent producers'
   state survives; its max timestamp becomes its newest kept record's (CreateTime), as Kafka's, so ListOffsets
   and the time index do not point at a removed record; a batch left with no record goes, except the last
   batch of each producer id, kept empty. A batch keeping every record is copied as it is. A group that loses
   nothing and merges nothing is not written.
   Records of aborted transactions (the aborted-transaction indexes say which) never enter the map and are
   dropped, as Kafka's cleaner drops them: an aborted update never supersedes a committed one. Control batches
   (transaction markers) are copied as they are, and the new segment's aborted-transaction index holds the
   entries of the segments it replaces. The dirty section ends before the segment holding the first offset of
   an open transaction (the LSO), so undecided records are never cleaned.
3. The swap (PartitionLog.replace_segments): under the partition's lock, if the replaced segments are still
   the files the cleaner read, a manifest naming each new segment and the old ones it replaces is written
   (fsync'd, renamed into place: the commit point), the new files are renamed over the old and the other
   replaced ones unlinked, the manifest goes and the new segment list is published. Recovery finishes a swap
   whose manifest exists, and otherwise discards `cleaning/`: the log is the old set or the new set, never a
   mix. Processes reading an old file by its descriptor keep reading it.
4. The checkpoint moves to the end of the mapped section.
A cleaning starts by finishing a swap another cleaner committed and was killed in (a cleaner process of a
running node: recovery does the same at start), and by discarding an uncommitted `cleaning/`.

All I/O (reads and writes) goes through an IoLimiter (Kafka's log.cleaner.io.max.bytes.per.second).

Invariants: offsets only ever disappear, never change, and stay strictly increasing; a reader fetching
from an offset inside a removed range gets the next record; nothing of the active segment is touched.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import shutil
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from shmbroker.node.storage import compression
from shmbroker.node.storage.durable import fsync_directory, read_offset, write_durably, write_offset
from shmbroker.node.storage.record_arrays import ARENA_PADDING, CorruptRecords, record_fields, unaligned
from shmbroker.node.storage.records import (BATCH_HEADER, BATCH_HEADER_SIZE, COMPRESSION_MASK, CONTROL_BIT,
                                            LENGTH_FIELDS_SIZE, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT, seal)
from shmbroker.node.storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, Segment, segment_file_name
from shmbroker.node.storage.txn_index import TXN_INDEX_SUFFIX

log = logging.getLogger("shmbroker.cleaner")

CHECKPOINT_FILE = "cleaner-offset-checkpoint"
CLEANING_DIR = "cleaning"
MANIFEST_FILE = "swap.json"
MAP_ENTRY_BYTES = 24  # two 64-bit key hashes and an offset, as Kafka's 16-byte hash and 8-byte offset
SEGMENT_SUFFIXES = (TXN_INDEX_SUFFIX, TIME_INDEX_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX)  # the log last: see finish_swap
_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xC2B2AE3D27D4EB4F)
_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_RECORD_COUNT = struct.Struct(">i")
_NO_PRODUCER = -1
WRITE_CHUNK_BYTES = 1 << 20  # a cleaned segment is written, and handed to writeback, this much at a time
LONG_MAX = 2**63 - 1


@dataclass(frozen=True)
class CleanerConfig:
    """The node's `[cleaner]`: Kafka's log.cleaner.* broker settings."""

    enabled: bool = True  # log.cleaner.enable
    processes: int = 1  # log.cleaner.threads: cleaner processes under the supervisor
    # log.cleaner.io.max.bytes.per.second: reads and writes of each cleaner process (-1: no limit). The
    # default leaves appends and fetches their cores on a small machine (scripts/bench_cleaner.py measures it).
    io_max_bytes_per_second: int = 64 << 20
    dedupe_buffer_bytes: int = 128 << 20  # log.cleaner.dedupe.buffer.size: the offset map's memory
    io_buffer_bytes: int = 4 << 20  # log.cleaner.io.buffer.size: bytes read at a time
    backoff_ms: int = 15_000  # log.cleaner.backoff.ms: how often the node looks for a log to clean
    # The cleaner processes' CPU scheduling: "idle" (SCHED_IDLE: only CPU time nothing else wants, so a busy
    # node's clients lose nothing to it and an idle node's cleaner runs at its full rate; a node saturated
    # for long cleans late) or "normal" at `nice` (0-19; I/O priority follows it), which keeps cleaning under
    # any load at some cost to the clients (scripts/bench_cleaner.py measures both).
    scheduling: str = "idle"
    nice: int = 10  # ... the niceness of "normal"

    def __post_init__(self) -> None:
        if self.processes < 1 or self.dedupe_buffer_bytes < MAP_ENTRY_BYTES or self.io_buffer_bytes < 4096 \
                or self.backoff_ms <= 0 or self.io_max_bytes_per_second == 0 or self.io_max_bytes_per_second < -1 \
                or not 0 <= self.nice <= 19 or self.scheduling not in ("normal", "idle"):
            raise ValueError("processes >= 1, dedupe_buffer_bytes >= 24, io_buffer_bytes >= 4096, backoff_ms > 0, "
                             "io_max_bytes_per_second -1 (no limit) or positive, nice 0-19, "
                             "scheduling normal or idle")

    @property
    def map_capacity(self) -> int:
        return self.dedupe_buffer_bytes // MAP_ENTRY_BYTES


class IoLimiter:
    """At most `bytes_per_second` on average (Kafka's Throttler): callers report what they read or wrote and
    sleep when ahead of the rate, measured over windows of `window_s`."""

    def __init__(self, bytes_per_second: int, window_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = bytes_per_second
        self.window_s = window_s
        self.clock, self.sleep = clock, sleep
        self._start = clock()
        self._bytes = 0
        self.slept_s = 0.0

    def spent(self, size: int) -> None:
        if self.rate <= 0:
            return
        self._bytes += size
        elapsed = self.clock() - self._start
        if elapsed < self.window_s and self._bytes < self.rate * self.window_s:
            return
        ahead = self._bytes / self.rate - elapsed
        if ahead > 0:
            self.sleep(ahead)
            self.slept_s += ahead
        self._start, self._bytes = self.clock(), 0


# -- the dirty section ---------------------------------------------------------------------------------

def read_checkpoint(directory: str) -> int:
    """The offset up to which the log was cleaned (0 if never)."""
    return read_offset(os.path.join(directory, CHECKPOINT_FILE))


def write_checkpoint(directory: str, offset: int) -> None:
    write_offset(os.path.join(directory, CHECKPOINT_FILE), offset)


@dataclass(frozen=True)
class Dirtiness:
    """How much of a compacted log awaits the cleaner."""

    first_dirty: int  # the cleaner checkpoint, at least the log start
    first_uncleanable: int  # the active segment's base, or the first segment too young to clean
    clean_bytes: int  # sealed bytes before the dirty section
    dirty_bytes: int  # sealed bytes of the dirty section (from the segment holding first_dirty)
    overdue: bool  # a dirty record is older than max.compaction.lag.ms
    oldest_dirty_ms: int | None = None  # the first dirty batch's timestamp

    def lag_ms(self, now_ms: int) -> int:
        """How long the oldest uncleaned record has waited (0 when nothing is dirty)."""
        return max(0, now_ms - self.oldest_dirty_ms) if self.oldest_dirty_ms is not None else 0

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def dirtiness(plog, now_ms: int) -> Dirtiness | None:
    """The dirty section of a compacted log, from its segment list, sizes, time indexes and checkpoint (no log
    reads but one batch header); None for a log that does not compact or has nothing sealed."""
    config = plog.config
    if not config.compacts:
        return None
    state = plog._current_state()
    sealed = plog.segments[:-1]
    if not sealed:
        return None
    first_dirty = max(read_checkpoint(plog.directory), state.log_start_offset)
    clean_bytes = dirty_bytes = 0
    first_uncleanable = state.active_base_offset
    oldest_dirty_ms = None
    for number, segment in enumerate(sealed):
        next_base = plog.segments[number + 1].base_offset
        if config.min_compaction_lag_ms > 0 and segment.max_timestamp() > now_ms - config.min_compaction_lag_ms:
            first_uncleanable = segment.base_offset
            break
        if 0 <= state.first_unstable_offset < next_base:  # an open transaction's records are never cleaned
            first_uncleanable = segment.base_offset
            break
        size = segment.sealed_size()
        if next_base <= first_dirty:
            clean_bytes += size
            continue
        dirty_bytes += size
        if oldest_dirty_ms is None and size >= BATCH_HEADER_SIZE:
            oldest_dirty_ms = BATCH_HEADER.unpack(os.pread(segment.log_fd, BATCH_HEADER_SIZE, 0))[8]
    overdue = oldest_dirty_ms is not None and now_ms - oldest_dirty_ms > config.max_compaction_lag_ms
    return Dirtiness(min(first_dirty, first_uncleanable), first_uncleanable, clean_bytes, dirty_bytes, overdue,
                     oldest_dirty_ms)


def due(dirty: Dirtiness | None, min_cleanable_dirty_ratio: float) -> bool:
    """Whether the cleaner should take the log: dirty enough, or a record past max.compaction.lag.ms."""
    return dirty is not None and dirty.dirty_bytes > 0 and (
        dirty.overdue or dirty.ratio >= min_cleanable_dirty_ratio)


# -- reading records -----------------------------------------------------------------------------------

@dataclass
class Chunk:
    """Whole batches read from a segment, and every record of them as arrays (record_arrays) over `arena`."""

    data: bytes  # the batches as stored
    batches: list[tuple[int, tuple]]  # (position in data, header tuple)
    arena: np.ndarray  # the record areas of the batches with records (decompressed), then padding
    area_of: dict[int, int]  # batch number -> its area (batches with records)
    fields: object | None  # RecordFields of every area, in order
    offsets: np.ndarray  # each record's offset
    keyless: np.ndarray  # each record has a null key
    tombstone: np.ndarray  # each record has a null value
    h1: np.ndarray
    h2: np.ndarray
    aborted: np.ndarray  # each record belongs to an aborted transaction


def key_hashes(arena: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two independent 64-bit hashes of each key arena[starts[i]:starts[i] + lengths[i]] (lengths -1: null,
    hashed as empty), eight bytes at a time over every key still that long."""
    lengths = np.maximum(lengths, 0).astype(np.int64)
    seed = lengths.astype(np.uint64)
    h1 = (seed + np.uint64(0x243F6A8885A308D3)) * _M1
    h2 = (seed + np.uint64(0x13198A2E03707344)) * _M2
    words = unaligned(arena, "<u8")
    limit = len(words) - 1
    longest = int(lengths.max()) if len(lengths) else 0
    for word in range((longest + 7) // 8):
        going = np.nonzero(lengths > word * 8)[0] if word else np.nonzero(lengths > 0)[0]
        remaining = lengths[going] - word * 8
        value = words[np.minimum(starts[going] + word * 8, limit)]
        short = remaining < 8
        if short.any():
            shift = (np.minimum(remaining, 7) * 8).astype(np.uint64)
            value = np.where(short, value & ((np.uint64(1) << shift) - np.uint64(1)), value)
        a = (h1[going] ^ value) * _M1
        b = (h2[going] ^ value) * _M2
        h1[going] = a ^ (a >> np.uint64(31))
        h2[going] = b ^ (b >> np.uint64(29))
    return h1, h2


class AbortedBatches:
    """Which transactional batches belong to aborted transactions, from the aborted-transaction indexes: a batch of
    producer P at offset O is aborted when an entry of P has first offset <= O <= its marker's offset."""

    def __init__(self, entries) -> None:
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        for entry in entries:
            self._ranges.setdefault(entry.producer_id, []).append((entry.first_offset, entry.last_offset))
        for ranges in self._ranges.values():
            ranges.sort()

    def __call__(self, header: tuple) -> bool:
        if not header[5] & TRANSACTIONAL_BIT or header[5] & CONTROL_BIT:
            return False
        ranges = self._ranges.get(header[9])
        if not ranges:
            return False
        at = bisect.bisect_right(ranges, (header[0], LONG_MAX)) - 1
        return at >= 0 and ranges[at][0] <= header[0] <= ranges[at][1]


def read_chunks(segment: Segment, end: int, chunk_bytes: int, limiter: IoLimiter,
                aborted: Callable[[tuple], bool] = lambda header: False) -> Iterator[Chunk]:
    """The segment's batches up to byte `end`, a chunk of about chunk_bytes at a time (a larger batch alone);
    `aborted(header)` says which batches' records belong to aborted transactions."""
    position = 0
    while position + BATCH_HEADER_SIZE <= end:
        batches = []
        first = position
        for at, header in segment.scanner.headers(position, end):
            size = header[1] + LENGTH_FIELDS_SIZE
            if batches and at + size - first > chunk_bytes:
                break
            batches.append((at - first, header))
            position = at + size
        if not batches:
            raise CorruptRecords(f"{segment.log_path}: no whole batch at {position}")
        data = os.pread(segment.log_fd, position - first, first)
        limiter.spent(len(data))
        yield _decode_chunk(data, batches, aborted)


def _decode_chunk(data: bytes, batches: list[tuple[int, tuple]], aborted: Callable[[tuple], bool]) -> Chunk:
    areas, area_of, counts, base_offsets, aborted_areas = [], {}, [], [], []
    for number, (at, header) in enumerate(batches):
        attributes, count = header[5], header[12]
        if attributes & CONTROL_BIT or count <= 0:
            continue
        size = header[1] + LENGTH_FIELDS_SIZE
        area = memoryview(data)[at + BATCH_HEADER_SIZE:at + size]
        codec = attributes & COMPRESSION_MASK
        if codec:
            try:
                area = compression.decompress(codec, area)
            except compression.CodecError as exc:
                raise CorruptRecords(f"batch at offset {header[0]}: {exc}") from None
        area_of[number] = len(areas)
        areas.append(area)
        counts.append(count)
        base_offsets.append(header[0])
        aborted_areas.append(aborted(header))
    empty = np.zeros(0, dtype=np.int64)
    if not areas:
        return Chunk(data, batches, np.zeros(len(ARENA_PADDING), np.uint8), area_of, None, empty,
                     empty.astype(bool), empty.astype(bool), empty.astype(np.uint64), empty.astype(np.uint64),
                     empty.astype(bool))
    sizes = [len(area) for area in areas]
    joined = b"".join([*areas, ARENA_PADDING])
    arena = np.frombuffer(joined, dtype=np.uint8)
    ends = np.cumsum(sizes)
    starts = ends - np.asarray(sizes)
    fields = record_fields(arena, joined, starts.tolist(), ends.tolist(), counts, headers=False)
    offsets = np.asarray(base_offsets, dtype=np.int64)[fields.batch_of] + fields.offset_deltas
    h1, h2 = key_hashes(arena, fields.key_starts, fields.key_lengths)
    return Chunk(data, batches, arena, area_of, fields, offsets, fields.key_lengths < 0, fields.value_lengths < 0,
                 h1, h2, np.asarray(aborted_areas, dtype=bool)[fields.batch_of])


# -- the offset map ------------------------------------------------------------------------------------

class OffsetMap:
    """Key (two hashes) -> the latest offset seen, as arrays sorted by key (Kafka's SkimpyOffsetMap).

    The arrays are ordered by the first hash alone, which tells nearly every two keys apart; keys sharing it
    (rare) sit side by side, one entry each, and both methods look through such runs. Sorting by one
    array instead of both (np.lexsort) and looking keys up in sorted order (searchsorted walks the map
    forward) make building and reading the map 2-4 times cheaper (measured with 1M keys).
    """

    def __init__(self) -> None:
        self.h1 = np.zeros(0, dtype=np.uint64)
        self.h2 = np.zeros(0, dtype=np.uint64)
        self.offsets = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.offsets)

    def merged(self, h1: np.ndarray, h2: np.ndarray, offsets: np.ndarray) -> "OffsetMap":
        """A map with these keys added, each at its latest offset (`offsets` newer than the map's, in order)."""
        all1, all2 = np.concatenate((self.h1, h1)), np.concatenate((self.h2, h2))
        all_offsets = np.concatenate((self.offsets, offsets))
        order = np.argsort(all1, kind="stable")  # stable: a key's entries stay in offset order
        s1, s2 = all1[order], all2[order]
        same_key = s1[1:] == s1[:-1]
        if np.any(same_key & (s2[1:] != s2[:-1])):  # keys sharing a first hash: group each key's entries
            order = np.lexsort((all2, all1))
            s1, s2 = all1[order], all2[order]
            same_key = (s1[1:] == s1[:-1]) & (s2[1:] == s2[:-1])
        last = np.ones(len(order), dtype=bool)
        last[:-1] = ~same_key
        out = OffsetMap()
        out.h1, out.h2, out.offsets = s1[last], s2[last], all_offsets[order[last]]
        return out

    def latest(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        """The latest offset of each key, -1 for a key not in the map."""
        if not len(self):
            return np.full(len(h1), -1, dtype=np.int64)
        order = np.argsort(h1)
        first = np.empty(len(h1), dtype=np.intp)
        first[order] = np.searchsorted(self.h1, h1[order])  # each key's first entry with its first hash
        at = np.minimum(first, len(self) - 1)
        same_first = self.h1[at] == h1
        found = np.where(same_first & (self.h2[at] == h2), self.offsets[at], -1)
        after = np.minimum(at + 1, len(self) - 1)
        for i in np.nonzero(same_first & (after > at) & (self.h1[after] == h1))[0]:  # a run sharing it: rare
            j = at[i]
            while j < len(self) and self.h1[j] == h1[i]:
                if self.h2[j] == h2[i]:
                    found[i] = self.offsets[j]
                j += 1
        return found


# -- one cleaning --------------------------------------------------------------------------------------

@dataclass
class CleanResult:
    """What one cleaning did (the cleaner's stats)."""

    first_dirty: int = 0
    cleaned_to: int = 0  # the new checkpoint
    bytes_read: int = 0
    bytes_written: int = 0
    bytes_before: int = 0  # of the replaced segments
    bytes_after: int = 0  # of their replacements
    records_read: int = 0
    records_kept: int = 0
    tombstones_dropped: int = 0
    keys: int = 0  # in the offset map
    segments_replaced: int = 0
    swapped: bool = False
    seconds: float = 0.0

    @property
    def bytes_reclaimed(self) -> int:
        return self.bytes_before - self.bytes_after


@dataclass
class SwapGroup:
    """A new segment in the cleaning directory and the old segments (base, inode) it replaces."""

    base: int
    old: list[tuple[int, int]] = field(default_factory=list)


class Cleaner:
    """Cleans one partition at a time. `progress` is called between chunks (the cleaner process beats its
    heartbeat there, and raises to abandon a cleaning: the log stays as it was)."""

    def __init__(self, config: CleanerConfig, limiter: IoLimiter | None = None,
                 wall_clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
                 progress: Callable[[], None] = lambda: None) -> None:
        self.config = config
        self.limiter = limiter or IoLimiter(config.io_max_bytes_per_second)
        self.now_ms = wall_clock_ms
        self.progress = progress

    def clean(self, plog) -> CleanResult:
        """Clean the log's dirty section, if any (see the module docstring). Raises StorageError,
        CorruptRecords or OSError with the log untouched (an interrupted cleaning leaves only `cleaning/`,
        which the next cleaning or a recovery removes)."""
        started = time.monotonic()
        now = self.now_ms()
        result = CleanResult()
        dirty = dirtiness(plog, now)
        if dirty is None or dirty.first_dirty >= dirty.first_uncleanable:
            return result
        staging = os.path.join(plog.directory, CLEANING_DIR)
        plog.finish_interrupted_swap()  # a cleaner killed in a swap left it committed: finish it, never undo it
        os.mkdir(staging)
        try:
            segments = [s for s in plog.segments[:-1] if s.base_offset < dirty.first_uncleanable]
            aborted = self._aborted(plog, dirty)
            offset_map, cleaned_to = self._build_map(plog, segments, dirty, result, aborted)
            result.first_dirty, result.keys = dirty.first_dirty, len(offset_map)
            cleanable = [s for s in segments if s.base_offset < cleaned_to]
            groups = self._rewrite(plog, cleanable, cleaned_to, offset_map, now, staging, result, aborted)
            if groups:
                result.swapped = plog.replace_segments(staging, groups)
                if not result.swapped:
                    log.info("%s: segments changed while cleaning (retention or DeleteRecords): cleaning again "
                             "later", plog.name)
                    return result
            write_checkpoint(plog.directory, cleaned_to)
            result.cleaned_to = cleaned_to
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            result.seconds = time.monotonic() - started
        return result

    def _build_map(self, plog, segments: list[Segment], dirty: Dirtiness, result: CleanResult,
                   aborted: AbortedBatches | None = None) -> tuple[OffsetMap, int]:
        """The offset map of the dirty section, and where the section it covers ends (`aborted`: the log's
        aborted transactions, read from its indexes when not given)."""
        if aborted is None:
            aborted = self._aborted(plog, dirty)
        offset_map = OffsetMap()
        capacity = self.config.map_capacity
        cleaned_to = dirty.first_uncleanable
        for segment in segments:
            next_base = plog.segments[plog.segments.index(segment) + 1].base_offset
            if next_base <= dirty.first_dirty:
                continue
            pieces = [], [], []
            for chunk in read_chunks(segment, segment.sealed_size(), self.config.io_buffer_bytes, self.limiter,
                                     aborted):
                self.progress()
                result.bytes_read += len(chunk.data)
                # An aborted record never supersedes anything: it is not in the map.
                keep = (chunk.offsets >= dirty.first_dirty) & ~chunk.keyless & ~chunk.aborted
                for piece, values in zip(pieces, (chunk.h1, chunk.h2, chunk.offsets)):
                    piece.append(values[keep])
            if not pieces[0]:
                continue
            bigger = offset_map.merged(*(np.concatenate(p) for p in pieces))
            if len(bigger) > capacity and len(offset_map):
                log.info("%s: the offset map holds %d keys, at most %d (cleaner.dedupe_buffer_bytes): cleaning up "
                         "to offset %d now, the rest later", plog.name, len(bigger), capacity, segment.base_offset)
                return offset_map, segment.base_offset
            offset_map = bigger
        return offset_map, cleaned_to

    @staticmethod
    def _aborted(plog, dirty: Dirtiness) -> AbortedBatches:
        """The aborted transactions with records below the first uncleanable offset (their markers may lie past it)."""
        return AbortedBatches(plog.aborted_transactions(plog.state().log_start_offset, dirty.first_uncleanable))

    def _groups(self, plog, segments: list[Segment]) -> list[list[Segment]]:
        """Consecutive segments whose sizes add up to at most segment.bytes (and offsets fit an index)."""
        groups: list[list[Segment]] = []
        limit = plog.config.segment_bytes
        for segment in segments:
            group = groups[-1] if groups else None
            if group is not None and sum(s.sealed_size() for s in group) + segment.sealed_size() <= limit \
                    and segment.base_offset - group[0].base_offset < 2**31 - 1:
                group.append(segment)
            else:
                groups.append([segment])
        return groups

    def _rewrite(self, plog, segments: list[Segment], cleaned_to: int, offset_map: OffsetMap, now: int,
                 staging: str, result: CleanResult, aborted: AbortedBatches | None = None) -> list[SwapGroup]:
        if aborted is None:
            aborted = AbortedBatches(plog.aborted_transactions(plog.state().log_start_offset, cleaned_to))
        last_batches = self._last_batch_of_each_producer(segments)
        swaps = []
        for group in self._groups(plog, segments):
            next_base = plog.segments[plog.segments.index(group[-1]) + 1].base_offset
            writer = SegmentWriter(staging, group[0].base_offset, plog.config, self.limiter)
            changed = len(group) > 1
            try:
                for segment in group:
                    horizon_passed = segment.max_timestamp() < now - plog.config.delete_retention_ms
                    for chunk in read_chunks(segment, segment.sealed_size(), self.config.io_buffer_bytes,
                                             self.limiter, aborted):
                        self.progress()
                        result.bytes_read += len(chunk.data)
                        result.records_read += len(chunk.offsets)
                        latest = offset_map.latest(chunk.h1, chunk.h2)
                        keep = ((latest < 0) | (chunk.offsets >= latest)) & ~chunk.keyless & ~chunk.aborted
                        if horizon_passed:
                            result.tombstones_dropped += int(np.count_nonzero(keep & chunk.tombstone))
                            keep &= ~chunk.tombstone
                        result.records_kept += int(np.count_nonzero(keep))
                        changed |= not keep.all()
                        for batch in kept_batches(chunk, keep, last_batches):
                            writer.append(batch)
                        result.bytes_before += len(chunk.data)
                writer.carry_aborted_transactions(group)
                writer.seal(next_base)
            finally:
                writer.close()
            result.bytes_after += writer.position
            if changed:
                swaps.append(SwapGroup(group[0].base_offset, [(s.base_offset, os.fstat(s.log_fd).st_ino)
                                                              for s in group]))
                result.segments_replaced += len(group)
                result.bytes_written += writer.position
            else:
                writer.discard()
        return swaps

    def _last_batch_of_each_producer(self, segments: list[Segment]) -> set[int]:
        """Base offsets of each producer id's last batch in these segments (kept, empty if need be, so that
        its sequence survives cleaning)."""
        last: dict[int, int] = {}
        for segment in segments:
            for _, header in segment.scanner.headers(0, segment.sealed_size()):
                if header[9] != _NO_PRODUCER and not header[5] & CONTROL_BIT:  # markers carry no sequence
                    last[header[9]] = header[0]
        return set(last.values())


def kept_batches(chunk: Chunk, keep: np.ndarray, producers_last: set[int]) -> Iterator[bytes]:
    """The chunk's batches with only the kept records: the batch as stored when it keeps them all (or has
    none to lose), rebuilt otherwise; a batch left empty only if it is its producer's last."""
    fields = chunk.fields
    if fields is not None:
        per_batch = np.bincount(fields.batch_of, minlength=len(chunk.area_of))
        kept_per_batch = np.bincount(fields.batch_of, weights=keep, minlength=len(chunk.area_of)).astype(np.int64)
        first_record = np.concatenate(([0], np.cumsum(per_batch)))
    data = memoryview(chunk.data)
    for number, (at, header) in enumerate(chunk.batches):
        size = header[1] + LENGTH_FIELDS_SIZE
        area = chunk.area_of.get(number)
        if area is None or kept_per_batch[area] == per_batch[area]:
            yield bytes(data[at:at + size])
            continue
        if kept_per_batch[area] == 0 and not (header[9] != _NO_PRODUCER and header[0] in producers_last):
            continue
        records = np.nonzero(keep[first_record[area]:first_record[area + 1]])[0] + first_record[area]
        body = b"".join(chunk.arena[fields.starts[i]:fields.ends[i]].tobytes() for i in records)
        max_timestamp = header[8]
        if len(records) and not header[5] & TIMESTAMP_TYPE_BIT:  # CreateTime: the newest record kept, as Kafka
            max_timestamp = header[7] + int(fields.timestamp_deltas[records].max())
        yield rebuild_batch(header, body, len(records), max_timestamp)


def rebuild_batch(header: tuple, records: bytes, count: int, max_timestamp: int | None = None) -> bytes:
    """A stored batch with other records: its header kept (base offset, last offset delta, producer id,
    epoch, base sequence, base timestamp, attributes) but for the length, count, CRC and, when given, max
    timestamp; records compressed with the batch's codec."""
    codec = header[5] & COMPRESSION_MASK
    if codec and records:
        records = compression.compress(codec, records)
    fields = list(header)
    fields[1] = BATCH_HEADER_SIZE - LENGTH_FIELDS_SIZE + len(records)
    fields[12] = count
    if max_timestamp is not None:
        fields[8] = max_timestamp
    batch = bytearray(BATCH_HEADER.pack(*fields))
    batch += records
    seal(batch)
    return bytes(batch)


class SegmentWriter:
    """A new segment in the cleaning directory: batches appended in order, indexed every
    index.interval.bytes as the log indexes appends, sealed with the next segment's base."""

    def __init__(self, directory: str, base_offset: int, config, limiter: IoLimiter) -> None:
        self.segment = Segment(directory, base_offset, config.index_max_bytes, config.scan_chunk_bytes, create=True,
                               index_reserve_entries=config.index_reserve_entries)
        self.segment.reset()
        self.config = config
        self.limiter = limiter
        self.position = 0
        self.entries = 0
        self.last_indexed = 0
        self.max_timestamp = -1
        self._buffer = bytearray()
        self._buffer_at = 0
        self._clean_from = 0  # pages before this were handed to writeback a chunk ago

    def append(self, batch: bytes) -> None:
        header = BATCH_HEADER.unpack_from(batch)
        base_offset, max_timestamp = header[0], header[8]
        if self.position > 0 and self.position - self.last_indexed >= self.config.index_interval_bytes \
                and self.entries < self.segment.capacity - 1:
            self.segment.write_index_entry(self.entries, base_offset, self.position, self.max_timestamp)
            self.entries += 1
            self.last_indexed = self.position
        self._buffer += batch
        self.position += len(batch)
        self.max_timestamp = max(self.max_timestamp, max_timestamp)
        if len(self._buffer) >= WRITE_CHUNK_BYTES:
            self._flush_buffer()

    def carry_aborted_transactions(self, group: list[Segment]) -> None:
        """The aborted-transaction entries of the segments this one replaces (their markers stay: control
        batches are never cleaned)."""
        index = self.segment.txn_index(create=True)
        for old in group:
            old_index = old.txn_index()
            for entry in old_index.entries() if old_index is not None else ():
                index.append(entry)

    def _flush_buffer(self) -> None:
        if self._buffer:
            os.pwrite(self.segment.log_fd, self._buffer, self._buffer_at)
            self.limiter.spent(len(self._buffer))
            written_from = self._buffer_at
            self._buffer_at += len(self._buffer)
            self._buffer = bytearray()
            self._write_behind(written_from)

    def _write_behind(self, written_from: int) -> None:
        # Each chunk goes to the disk as it is written (DONTNEED starts its writeback, no journal commit) and
        # its pages leave the cache on the next chunk's call, clean by then. Dirty pages left for the kernel's
        # flusher and the final fsync would go out in bursts of a whole segment, and the node's own writes
        # stall behind them (scripts/bench_cleaner.py's impact workload measures it).
        os.posix_fadvise(self.segment.log_fd, self._clean_from, self._buffer_at - self._clean_from,
                         os.POSIX_FADV_DONTNEED)
        self._clean_from = written_from

    def seal(self, next_base: int) -> None:
        self._flush_buffer()
        self.segment.seal(self.position, self.entries, self.max_timestamp, next_base)
        self.segment.flush(indexes=True)

    def discard(self) -> None:
        self.segment.delete_files()

    def close(self) -> None:
        self.segment.close()


# -- the swap (the partition's lock held) --------------------------------------------------------------

def write_manifest(staging: str, groups: list[SwapGroup]) -> None:
    """The commit point of a swap: which new segment replaces which old ones, durable."""
    write_durably(os.path.join(staging, MANIFEST_FILE),
                  json.dumps([[g.base, [base for base, _ in g.old]] for g in groups]).encode())


def finish_swap(directory: str) -> bool:
    """Put a committed swap's new segments in place of the old ones (the cleaner, or recovery after a crash:
    every step can be done again); then remove the cleaning directory, whose files, without a manifest, are
    an interrupted cleaning's. True if a swap was finished."""
    staging = os.path.join(directory, CLEANING_DIR)
    try:
        with open(os.path.join(staging, MANIFEST_FILE)) as f:
            groups = json.load(f)
    except (OSError, ValueError):
        shutil.rmtree(staging, ignore_errors=True)
        return False
    for base, old_bases in groups:
        # The log file last: once it is in place the new segment is whole (recovery rebuilds indexes anyway).
        for suffix in SEGMENT_SUFFIXES:
            source = os.path.join(staging, segment_file_name(base, suffix))
            if os.path.exists(source):
                os.replace(source, os.path.join(directory, segment_file_name(base, suffix)))
        for old in old_bases:
            if old != base:
                for suffix in SEGMENT_SUFFIXES:
                    try:
                        os.unlink(os.path.join(directory, segment_file_name(old, suffix)))
                    except FileNotFoundError:
                        pass
    fsync_directory(directory)
    shutil.rmtree(staging, ignore_errors=True)
    fsync_directory(directory)
    return True
