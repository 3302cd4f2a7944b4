"""The aborted-transaction index of one segment (`<base offset, 20 digits>.txnindex`), Kafka's format.

Each entry is 34 bytes, big-endian: version int16 (0), producer id int64, first offset int64, last offset
int64 (the offset of the ABORT marker), last stable offset int64 (the partition's LSO once the marker was
appended). An entry lives in the index of the segment that holds its marker, so entries of one index are in
marker (last offset) order, and a read_committed fetch of [start, end) needs the indexes of the segments from
the one holding `start` onward, stopping at the first entry whose LSO reaches `end` (Kafka's
collectAbortedTransactions).

Invariants:
- Entries are appended only by the holder of the partition lock, before the marker's append is published: a
  writer killed in between leaves an entry whose last offset is at or past the published log end, which
  readers ignore while it is, and the next append() to the index (or recovery's truncate_from) removes. Once
  the log grows past it (a later batch takes that offset, maybe after a roll), readers still skip it: an entry
  counts only if the batch at its last offset is that producer's ABORT marker (checked once per entry).
- Readers count whole entries only (size // 34): a torn trailing entry is invisible, and removed the same way.
- Recovery rebuilds the entries of every segment it replays (truncate_from the replay's start, then one
  append per ABORT marker found), and the whole index of a segment whose file is missing, so a lost or torn
  index never outlives a restart.
- Durable: every entry whose marker is below the partition's flushed offset, and every entry before a producer
  snapshot's offset (recovery replays only what follows its snapshot). So a flush or a snapshot fdatasyncs the
  file only when it holds an entry whose marker is at or past the flushed offset (entries are in marker order:
  the last one tells) or one this object wrote since its last sync (recovery's rebuild, whose markers count as
  flushed): an unchanged index costs an fstat, not a sync, and nothing at all while no batch with a producer
  id came since the flushed offset. (The writer, the timer loop, and the flusher hold different objects, so
  what changed is read from the partition's row and the file, not remembered.)
"""

from __future__ import annotations

import os
import struct
from typing import Callable, NamedTuple

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")
ENTRY_VERSION = 0


class AbortedTransaction(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TransactionIndex:
    """One segment's .txnindex file, opened in this process."""

    def __init__(self, path: str, create: bool = False):
        """Open the file (FileNotFoundError if it is missing and not `create`)."""
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o644)
        self._cache: tuple[int, int, tuple[AbortedTransaction, ...]] | None = None  # (inode, size, entries)
        self._sealed = False  # the cache was read once the segment was sealed: it is final
        self._verified: dict[AbortedTransaction, bool] = {}
        self.written = False  # changed by this object since its last sync (see needs_sync)

    def entries(self, sealed: bool = False) -> tuple[AbortedTransaction, ...]:
        """Every whole entry, in file order (re-read only when the file's size or inode changed). A sealed
        segment's index never changes (markers go to the active segment; a cleaning makes a new file), so once
        read as `sealed` it is not looked at again: a read_committed fetch costs at most the active one's fstat."""
        if sealed and self._sealed:
            return self._cache[2]
        stat = os.fstat(self.fd)
        cache = self._cache
        if cache is not None and cache[0] == stat.st_ino and cache[1] == stat.st_size:
            self._sealed = sealed
            return cache[2]
        whole = stat.st_size - stat.st_size % ENTRY.size
        data = os.pread(self.fd, whole, 0) if whole else b""
        entries = tuple(AbortedTransaction(*ENTRY.unpack_from(data, at)[1:])
                        for at in range(0, len(data) - len(data) % ENTRY.size, ENTRY.size))
        self._cache = (stat.st_ino, stat.st_size, entries)
        self._sealed = sealed
        return entries

    def verified(self, entry: AbortedTransaction, is_marker: Callable[[AbortedTransaction], bool]) -> bool:
        """Whether a published entry names its producer's ABORT marker (checked once: a published offset's batch
        never changes)."""
        known = self._verified.get(entry)
        if known is None:
            known = self._verified[entry] = is_marker(entry)
        return known

    def append(self, entry: AbortedTransaction) -> None:
        """Add an entry after removing stale ones at or past its marker (see the invariants)."""
        kept = self._kept_before(entry.last_offset)
        self.written = True
        os.pwrite(self.fd, ENTRY.pack(ENTRY_VERSION, *entry), kept * ENTRY.size)
        os.ftruncate(self.fd, (kept + 1) * ENTRY.size)

    def truncate_from(self, offset: int) -> None:
        """Drop the entries whose marker is at or past `offset` (and a torn tail)."""
        kept = self._kept_before(offset)
        if os.fstat(self.fd).st_size != kept * ENTRY.size:
            self.written = True
            os.ftruncate(self.fd, kept * ENTRY.size)

    def _kept_before(self, offset: int) -> int:
        kept = 0
        for entry in self.entries():
            if entry.last_offset >= offset:
                break
            kept += 1
        return kept

    def needs_sync(self, flushed_offset: int, producer_batches_end: int) -> bool:
        """Whether the file may hold an entry that is not durable yet, given that the entries of markers below
        the partition's `flushed_offset` are (see the invariants). A marker is a batch with a producer id: with
        none since the flushed offset (`producer_batches_end`, the end of the newest, is not past it), there is
        no new entry either, and the file is not looked at."""
        if self.written:
            return True
        if producer_batches_end <= flushed_offset:
            return False
        entries = self.entries()
        return bool(entries) and entries[-1].last_offset >= flushed_offset

    def flush(self) -> None:
        os.fdatasync(self.fd)
        self.written = False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def collect_aborted(indexes, start: int, end: int, log_end: int,
                    is_marker: Callable[[AbortedTransaction], bool] = lambda entry: True) -> list[AbortedTransaction]:
    """The aborted transactions overlapping [start, end) from the (index, sealed) pairs of the segments in offset
    order, starting with the segment holding `start`; entries at or past `log_end` are a killed writer's,
    unseen, and so are those `is_marker` says name no ABORT marker of theirs (see the invariants)."""
    found = []
    for index, sealed in indexes:
        for entry in index.entries(sealed):
            if entry.last_offset >= log_end:
                return found
            if not index.verified(entry, is_marker):
                continue
            if entry.last_offset >= start and entry.first_offset < end:
                found.append(entry)
            if entry.last_stable_offset >= end:
                return found
    return found
