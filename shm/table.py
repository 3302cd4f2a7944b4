"""The shared partition-state table: one fixed-size row per partition in POSIX shared memory.

Every process maps the table and reads rows without locks; the writers of a row are serialised by the
partition's cross-process fcntl lock (see node/log.py), so a row has one writer at a time.

Row layout (little-endian int64 words, 448 bytes, cache-line aligned):

    word 0       version   incremented once per publish; its low bit names the slot holding the current state
    words 1-7    padding   keeps the version on its own cache line
    words 8-25   slot 0    PartitionState fields
    words 26-43  slot 1    PartitionState fields
    words 44-49  padding
    words 50-55  cleaning  the log cleaner's figures of a compacted partition (CleaningStats), outside the
                           seqlock: each word has one writer (the cleaner its run's, the timer the dirtiness),
                           stored whole; the last words of the row's cache line, so no other writer shares it

Invariants (a double-buffered seqlock, chosen over a plain seqlock because a writer killed mid-publish
must not leave readers spinning on an odd sequence number forever):
- A writer copies the current slot, writes the new state into the other slot, then stores version + 1
  with one aligned 8-byte store. A writer that dies before that store changes nothing readers can see.
- A reader loads version v, copies slot v & 1, loads version again; the copy is consistent iff the
  version is still v (the writer of v + 2 would be the first to touch slot v & 1 again).
- Relies on x86-64 total store order (stores become visible in program order); other CPUs would need fences.
- Fields only move forward except when recovery (single process, before workers start) fills a row.

Header (shm.segment, first 64 bytes): magic, version, row count, row size.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from shmbroker.shm.segment import HEADER_BYTES, Layout, Segment

WORD = 8
VERSION_WORDS = 8  # version + padding to a cache line
SLOT_WORDS = 18
CACHE_LINE_WORDS = 8
CLEANING_WORDS = 6
TAIL_WORDS = -(VERSION_WORDS + 2 * SLOT_WORDS + CLEANING_WORDS) % CACHE_LINE_WORDS + CLEANING_WORDS
ROW_WORDS = VERSION_WORDS + 2 * SLOT_WORDS + TAIL_WORDS
ROW_BYTES = ROW_WORDS * WORD
VERSION = struct.Struct("<q")
# A reader gives up (TornReadError) after this many copies of a row that kept changing under it: a writer
# publishes in well under a microsecond, so this only trips on a writer stuck mid-publish in a loop.
MAX_READ_ATTEMPTS = 10_000


class PartitionState(NamedTuple):
    """One partition's published state. Offsets are Kafka offsets; positions are byte positions."""

    log_end_offset: int = 0  # offset the next appended record gets
    high_watermark: int = 0  # == log_end_offset on a single node
    log_start_offset: int = 0  # first offset still in the log
    end_bytes: int = 0  # logical count of bytes ever appended (monotonic, for fetch min_bytes)
    end_position: int = 0  # byte position of the end of the active segment; readers never go past it
    active_base_offset: int = 0  # base offset of the active segment; a change means a roll
    flushed_offset: int = 0  # every offset below this is fsync'd
    flushed_bytes: int = 0  # end_bytes at the time of the last fsync (pending = end_bytes - flushed_bytes)
    segments_version: int = 0  # bumped on every roll or deletion: other processes rescan the directory
    active_max_timestamp: int = -1  # largest batch maxTimestamp in the active segment, -1 when empty
    active_first_append_ms: int = -1  # wall-clock ms of the first append to the active segment (age roll)
    online: int = 0  # 1 once recovery has filled the row
    active_index_entries: int = 0  # valid entries in the active segment's offset and time indexes
    storage_errors: int = 0  # disk faults met by writes to this partition since it was recovered
    storage_error_logged_ms: int = 0  # monotonic ms of the last log line about them (one per interval, node-wide)
    flush_failed: int = 0  # 1 after an fsync failed: the unflushed bytes are re-written before the next fsync
    producer_batches_end: int = 0  # offset after the newest batch with a producer id: catch-up scans end there
    first_unstable_offset: int = -1  # first offset of the oldest open transaction, -1 when none (see below)

    @property
    def last_stable_offset(self) -> int:
        """The LSO: read_committed readers see the offsets below it (Kafka's; the high watermark when no
        transaction is open)."""
        first = self.first_unstable_offset
        return self.high_watermark if first < 0 or first > self.high_watermark else first


assert len(PartitionState._fields) == SLOT_WORDS
SLOT = struct.Struct("<" + "q" * SLOT_WORDS)
END_BYTES = PartitionState._fields.index("end_bytes")  # field indexes for PartitionTable.read_field
FLUSHED_OFFSET = PartitionState._fields.index("flushed_offset")
SLOT_DTYPE = np.dtype([(name, "<i8") for name in PartitionState._fields])
ROW_DTYPE = np.dtype([("version", "<i8"), ("padding", "<i8", VERSION_WORDS - 1), ("slots", SLOT_DTYPE, 2),
                      ("tail", "<i8", TAIL_WORDS)])
assert ROW_DTYPE.itemsize == ROW_BYTES


class CleaningStats(NamedTuple):
    """A compacted partition's cleaning, as the stats show it (zeros for a partition never cleaned)."""

    last_run_ms: int = 0  # wall-clock ms the last cleaning ended (the cleaner writes 0-3)
    bytes_cleaned: int = 0  # log bytes cleanings read, all runs
    bytes_reclaimed: int = 0  # log bytes cleanings freed, all runs
    errors: int = 0  # cleanings that failed
    dirty_ratio_ppm: int = 0  # dirty share of the cleanable log, in millionths (the timer writes 4-5)
    lag_ms: int = 0  # age of the oldest uncleaned record of the dirty section (Kafka's max compaction delay)


CLEANING_WORD = ROW_WORDS - CLEANING_WORDS  # the row's last words (see the row layout)
assert len(CleaningStats._fields) == CLEANING_WORDS


LAYOUT = Layout("a partition table", magic=0x53484D4250415254, version=2,  # "SHMBPART"
                sizes=("rows", "row_bytes"), fixed={"row_bytes": ROW_BYTES},
                bytes_for=lambda rows, row_bytes: HEADER_BYTES + rows * row_bytes)


class TornReadError(RuntimeError):
    """A row kept changing under a reader for more than max_read_attempts copies."""


class PartitionTable:
    """A mapping of the shared table. Use create() in the supervisor and attach() everywhere else."""

    def __init__(self, segment: Segment, max_read_attempts: int = MAX_READ_ATTEMPTS):
        self.name = segment.name
        self.rows = segment.sizes["rows"]
        self.max_read_attempts = max_read_attempts
        self._segment = segment
        self._memory = segment.memory
        self._array = np.ndarray((self.rows,), dtype=ROW_DTYPE, buffer=self._memory, offset=HEADER_BYTES)

    @classmethod
    def create(cls, name: str, rows: int, **options) -> "PartitionTable":
        """Create (exclusively) and zero a table of `rows` rows named `name` (e.g. /shmbroker-<id>-partitions)."""
        if rows <= 0:
            raise ValueError("a partition table needs at least one row")
        return cls(Segment.create(name, LAYOUT, rows=rows), **options)

    @classmethod
    def attach(cls, name: str, **options) -> "PartitionTable":
        """Map an existing table."""
        return cls(Segment.attach(name, LAYOUT), **options)

    def unlink(self) -> None:
        self._segment.unlink()

    def close(self) -> None:
        self._array = None  # a numpy view handed out by read_rows' caller may still hold the mapping
        self._segment.close()

    def _row_offset(self, row: int) -> int:
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} outside table of {self.rows}")
        return HEADER_BYTES + row * ROW_BYTES

    def read(self, row: int) -> PartitionState:
        """Consistent snapshot of one row, without locks."""
        return self.read_versioned(row)[1]

    def read_versioned(self, row: int) -> tuple[int, PartitionState]:
        """(the row's version, its state at that version), consistent as read() is: while version(row) still
        returns that version, the state is the same."""
        base = self._row_offset(row)
        memory = self._memory
        slots = base + VERSION_WORDS * WORD
        for _ in range(self.max_read_attempts):
            (version,) = VERSION.unpack_from(memory, base)
            state = SLOT.unpack_from(memory, slots + (version & 1) * SLOT_WORDS * WORD)
            if VERSION.unpack_from(memory, base)[0] == version:
                return version, PartitionState._make(state)
        raise TornReadError(f"row {row} of {self.name} changed during {self.max_read_attempts} reads")

    def version(self, row: int) -> int:
        """The row's version: it changes with every publish, so an unchanged version means an unchanged state
        (one load: the cheap check of a state read earlier with read_versioned)."""
        return VERSION.unpack_from(self._memory, self._row_offset(row))[0]

    def read_field(self, row: int, field: int) -> int:
        """One field of a row's current state (its index in PartitionState), consistent as read() is: for the
        timer's conditions, re-checked thousands of times per turn in a fan-out, where building the whole
        state costs more than the check."""
        base = self._row_offset(row)
        memory = self._memory
        at = base + VERSION_WORDS * WORD + field * WORD
        for _ in range(self.max_read_attempts):
            (version,) = VERSION.unpack_from(memory, base)
            (value,) = VERSION.unpack_from(memory, at + (version & 1) * SLOT_WORDS * WORD)
            if VERSION.unpack_from(memory, base)[0] == version:
                return value
        raise TornReadError(f"row {row} of {self.name} changed during {self.max_read_attempts} reads")

    def publish(self, row: int, state: PartitionState) -> None:
        """Make `state` the row's current state. Only the holder of the partition's lock may call this."""
        base = self._row_offset(row)
        memory = self._memory
        (version,) = VERSION.unpack_from(memory, base)
        next_version = version + 1
        SLOT.pack_into(memory, base + VERSION_WORDS * WORD + (next_version & 1) * SLOT_WORDS * WORD, *state)
        VERSION.pack_into(memory, base, next_version)

    def update(self, row: int, **fields) -> PartitionState:
        """publish() the current state with some fields replaced (caller holds the partition's lock)."""
        state = self.read(row)._replace(**fields)
        self.publish(row, state)
        return state

    def cleaning(self, row: int) -> CleaningStats:
        base = self._row_offset(row) + CLEANING_WORD * WORD
        return CleaningStats._make(struct.unpack_from("<" + "q" * CLEANING_WORDS, self._memory, base))

    def set_cleaning(self, row: int, **fields: int) -> None:
        """Store some of a row's cleaning words (each has one writer: see the row layout)."""
        base = self._row_offset(row) + CLEANING_WORD * WORD
        for name, value in fields.items():
            VERSION.pack_into(self._memory, base + CleaningStats._fields.index(name) * WORD, value)

    def read_field_rows(self, rows: np.ndarray, field: int) -> np.ndarray:
        """One field (its index in PartitionState) of many rows' current states, consistent per row as
        read_field() is: the timer's array path reads end_bytes of a drain's worth of rows, where copying whole
        states (read_rows) costs more than the check. int64, in the order of `rows`."""
        array = self._array
        versions = array["version"]
        before = versions[rows]
        result = array["slots"][PartitionState._fields[field]][rows, before & 1]
        changed = np.flatnonzero(versions[rows] != before)
        for position in changed.tolist():  # written meanwhile: that row again, one field at a time
            result[position] = self.read_field(int(rows[position]), field)
        return result

    def read_rows(self, rows=None) -> np.ndarray:
        """Consistent snapshots of many rows at once (default: all) as a structured array of SLOT_DTYPE.

        Vectorised for the timer process, which checks many partitions per tick.
        """
        array = self._array
        index = np.arange(self.rows) if rows is None else np.asarray(rows, dtype=np.int64)
        before = array["version"][index]
        result = array["slots"][index, before & 1]
        after = array["version"][index]
        changed = np.flatnonzero(after != before)
        # Rows that changed under the vectorised copy are read again one by one: read()'s window is
        # ~1 us, where a numpy pass takes ~10 us and would keep losing to a busy writer.
        for position in changed.tolist():
            result[position] = tuple(self.read(int(index[position])))
        return result
