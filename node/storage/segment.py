"""One log segment: a log file of record batches, a sparse offset index and a time index.

Files, named by the segment's base offset in Kafka's 20-digit form:
    00000000000000000000.log        v2 record batches, back to back, exactly as appended
    00000000000000000000.index      entries (relative offset u32, position u32), little-endian
    00000000000000000000.timeindex  entries (timestamp i64, relative offset i64), little-endian
    00000000000000000000.txnindex   aborted transactions whose ABORT marker is in this segment
                                    (node.storage.txn_index; made with the segment, often empty)

Invariants:
- Index entry i of both indexes describes the same batch: its offset relative to the segment base (> 0,
  so an all-zero entry marks the end of the entries) and its byte position; the time index entry holds the
  largest batch maxTimestamp of every batch *before* it in the segment. Both columns are strictly increasing
  (timestamps non-decreasing), so lookups are binary searches. The first batch (position 0) is never indexed;
  a batch is indexed when it starts at least index_interval_bytes after the last indexed batch.
- A sealed (rolled) segment's time index ends with one extra entry: (largest timestamp of the segment,
  next segment's base - base). It is never selected by a lookup and gives retention the segment's age.
- Index files are preallocated (sparse) to their full size and mapped MAP_SHARED in every process that uses
  them, so all processes see each other's entries. They are never shrunk: a mapping past the end of a
  shrunk file would SIGBUS. How many entries are valid for the active segment is published in the shared
  table (active_index_entries); stale entries beyond that (from a killed writer) are overwritten or zeroed.
- An index entry is stored only into blocks reserved beforehand (fallocate, `index_reserve_entries` at a
  time): a store into a hole of a shared mapping on a full disk is a SIGBUS that kills the process, a
  reservation is an ENOSPC error the writer answers with (node.storage.faults).
- Nothing reads an index past its written blocks either: on tmpfs even a read of a hole allocates a page,
  and SIGBUSes on a full one. Entry counts search only up to the first hole (SEEK_HOLE), lookups only
  the published entries, and the append path's look at the entry after them reserves it first.
- `uncached_position` only grows: log bytes before it were dropped from the page cache after their fsync
  (PartitionLog's window); a reader of them reads the disk, nothing else changes.
- The log file may have a torn tail beyond the published end position while it is the active segment;
  nobody reads past that position, the next append overwrites it, and seal() truncates it on roll.
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct

from shmbroker.node.storage.faults import is_storage_fault, reserve
from shmbroker.node.storage.records import BATCH_HEADER, BATCH_HEADER_SIZE, LENGTH_FIELDS_SIZE, stored_batch_is_valid
from shmbroker.node.storage.txn_index import TXN_INDEX_SUFFIX, TransactionIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
INDEX_ENTRY_BYTES = 8
TIME_INDEX_ENTRY_BYTES = 16
OFFSET_AND_LENGTH = struct.Struct(">qi")


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def segment_base_offsets(directory: str) -> list[int]:
    """Base offsets of the segments (those with a .log file) in a partition directory, ascending."""
    bases = []
    for name in os.listdir(directory):
        if name.endswith(LOG_SUFFIX) and len(name) == 20 + len(LOG_SUFFIX) and name[:20].isdigit():
            bases.append(int(name[:20]))
    return sorted(bases)


class BatchScanner:
    """Reads batch headers (and, for recovery, whole batches) from a log file with few pread calls."""

    def __init__(self, fd: int, chunk_bytes: int, first_read_bytes: int = 512):
        self.fd = fd
        self.chunk_bytes = max(chunk_bytes, BATCH_HEADER_SIZE)
        self.first_read_bytes = max(min(first_read_bytes, self.chunk_bytes), BATCH_HEADER_SIZE)

    def headers(self, start: int, end: int):
        """Yield (position, header tuple) of the batches between byte positions start and end.

        Stops early at a header that does not fit before end or has an impossible length.
        Reads grow from first_read_bytes to chunk_bytes: most lookups need one header, some scans many.
        """
        position = start
        chunk_start = start
        chunk = b""
        read_bytes = self.first_read_bytes
        while position + BATCH_HEADER_SIZE <= end:
            if position + BATCH_HEADER_SIZE > chunk_start + len(chunk):
                chunk_start = position
                chunk = os.pread(self.fd, min(read_bytes, end - position), position)
                read_bytes = min(read_bytes * 2, self.chunk_bytes)
                if len(chunk) < BATCH_HEADER_SIZE:
                    return
            header = BATCH_HEADER.unpack_from(chunk, position - chunk_start)
            size = header[1] + LENGTH_FIELDS_SIZE
            if size < BATCH_HEADER_SIZE or position + size > end:
                return
            yield position, header
            position += size


class Segment:
    """A segment's open files in this process. Create with Segment(..., create=True) when rolling."""

    def __init__(
        self,
        directory: str,
        base_offset: int,
        index_max_bytes: int,
        scan_chunk_bytes: int,
        create: bool = False,
        scan_first_read_bytes: int = 512,
        index_reserve_entries: int = 4096,
    ):
        self.directory = directory
        self.base_offset = base_offset
        self.log_path = os.path.join(directory, segment_file_name(base_offset, LOG_SUFFIX))
        self.index_path = os.path.join(directory, segment_file_name(base_offset, INDEX_SUFFIX))
        self.time_index_path = os.path.join(directory, segment_file_name(base_offset, TIME_INDEX_SUFFIX))
        self.txn_index_path = os.path.join(directory, segment_file_name(base_offset, TXN_INDEX_SUFFIX))
        self._txn_index: TransactionIndex | None = None
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        self.log_fd = os.open(self.log_path, flags, 0o644)
        self.inode = os.fstat(self.log_fd).st_ino  # a cleaned segment replaces the file under the same name
        self.capacity = max(index_max_bytes // INDEX_ENTRY_BYTES, 2)
        self._views = []
        self._maps = []
        try:
            self._index_map = self._map(self.index_path, self.capacity * INDEX_ENTRY_BYTES, create)
            self._time_index_map = self._map(self.time_index_path, self.capacity * TIME_INDEX_ENTRY_BYTES, create)
        except BaseException:
            self.close()
            raise
        self.capacity = min(len(self._index_map) // INDEX_ENTRY_BYTES, len(self._time_index_map) // TIME_INDEX_ENTRY_BYTES)
        words = self._view(memoryview(self._index_map).cast("I"))
        self.index_offsets = self._view(words[0::2])
        self.index_positions = self._view(words[1::2])
        time_words = self._view(memoryview(self._time_index_map).cast("q"))
        self.time_index_timestamps = self._view(time_words[0::2])
        self.time_index_offsets = self._view(time_words[1::2])
        self.scanner = BatchScanner(self.log_fd, scan_chunk_bytes, scan_first_read_bytes)
        self._sealed_size = None  # cached once the segment is known to be rolled
        self._sealed_entries = None
        self.index_reserve_entries = max(1, index_reserve_entries)
        self._reserved_entries = 0  # entries whose blocks this process has reserved in both index files
        self.faults: list[OSError] = []  # disk faults recovery lived through (recover() fills it)
        self.uncached_position = 0  # log bytes before it were dropped from the page cache
        if create:
            self.txn_index(create=True)  # every segment has one: recovery rebuilds them all when one is missing

    @staticmethod
    def create_files(directory: str, base_offset: int, index_max_bytes: int) -> None:
        """The files of a new, empty segment, without mapping them (a new partition's first segment): an empty
        log and both indexes preallocated sparse, as Segment(..., create=True) makes them."""
        capacity = max(index_max_bytes // INDEX_ENTRY_BYTES, 2)
        for suffix, size in ((LOG_SUFFIX, 0), (INDEX_SUFFIX, capacity * INDEX_ENTRY_BYTES),
                             (TIME_INDEX_SUFFIX, capacity * TIME_INDEX_ENTRY_BYTES), (TXN_INDEX_SUFFIX, 0)):
            fd = os.open(os.path.join(directory, segment_file_name(base_offset, suffix)),
                         os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                if size:
                    os.ftruncate(fd, size)
            finally:
                os.close(fd)

    def txn_index(self, create: bool = False) -> TransactionIndex | None:
        """The segment's aborted-transaction index; None while it has no file and `create` is False (only the
        lock holder creates it: a reader must not leave a file behind for a segment retention deletes)."""
        if self._txn_index is None:
            try:
                self._txn_index = TransactionIndex(self.txn_index_path, create)
            except FileNotFoundError:
                return None
        return self._txn_index

    def _view(self, view):
        self._views.append(view)
        return view

    def _map(self, path: str, size: int, create: bool) -> mmap.mmap:
        """Map an index file, preallocating it (sparse) when it is new or shorter than `size`."""
        # Only a creator may create: an index missing for anyone else means retention is deleting the segment.
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o644)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # growing only: never shrink a file others may have mapped
            memory = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self._maps.append(memory)
        return memory

    # Sizes and entries ------------------------------------------------------------------------------

    def file_size(self) -> int:
        return os.fstat(self.log_fd).st_size

    def sealed_size(self) -> int:
        """Size of a rolled segment (immutable once rolled, so cached)."""
        if self._sealed_size is None:
            self._sealed_size = self.file_size()
        return self._sealed_size

    def _written_entries(self, path: str, entry_bytes: int) -> int:
        """How many entries of an index file lie before its first hole (the only ones safe to read)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # retention deleted it under us: the mapping still has what was written
            return self.capacity
        try:
            end = os.lseek(fd, 0, os.SEEK_HOLE)
        except OSError:
            end = self.capacity * entry_bytes
        finally:
            os.close(fd)
        return min(self.capacity, end // entry_bytes)

    def count_entries(self) -> int:
        """Entries in the offset index, found by binary search for the first all-zero entry."""
        offsets = self.index_offsets
        limit = self._written_entries(self.index_path, INDEX_ENTRY_BYTES)
        return bisect.bisect_left(range(limit), True, key=lambda i: offsets[i] == 0)

    def count_time_entries(self) -> int:
        """Entries in the time index (a sealed segment's has one more than its offset index)."""
        offsets = self.time_index_offsets
        limit = self._written_entries(self.time_index_path, TIME_INDEX_ENTRY_BYTES)
        return bisect.bisect_left(range(limit), True, key=lambda i: offsets[i] == 0)

    def stale_time_entry(self, slot: int) -> bool:
        """Whether a time index entry is already written at `slot` (past the published ones: a roll or a
        killed writer left it). Reserves the slot first, so looking cannot fault (OSError if no room)."""
        self.reserve_entries(slot)
        return self.time_index_offsets[slot] != 0

    def sealed_entries(self) -> int:
        if self._sealed_entries is None:
            self._sealed_entries = self.count_entries()
        return self._sealed_entries

    def max_timestamp(self) -> int:
        """Largest timestamp of a sealed segment (its final time index entry), -1 if unknown."""
        count = self.count_time_entries()
        return self.time_index_timestamps[count - 1] if count else -1

    # Lookups ---------------------------------------------------------------------------------------

    def position_of(self, offset: int, entries: int, end: int) -> int:
        """Byte position of the batch holding `offset`, or `end` if no batch before `end` holds it.

        Binary search of the offset index, then a short scan of batch headers.
        """
        slot = bisect.bisect_right(self.index_offsets, offset - self.base_offset, 0, entries) - 1
        start = self.index_positions[slot] if slot >= 0 else 0
        for position, header in self.scanner.headers(start, end):
            if header[0] + header[6] >= offset:  # base offset + last offset delta
                return position
        return end

    def boundary_at_or_before(self, start: int, limit: int, entries: int) -> int:
        """The largest batch boundary in (start, limit], or start if the batch at start ends after limit."""
        slot = bisect.bisect_right(self.index_positions, limit, 0, entries) - 1
        boundary = max(self.index_positions[slot] if slot >= 0 else 0, start)
        for position, header in self.scanner.headers(boundary, limit):
            boundary = position + header[1] + LENGTH_FIELDS_SIZE
        return boundary

    def first_batch_with_timestamp(self, timestamp: int, entries: int, end: int, from_offset: int = 0):
        """(position, header) of the first batch whose maxTimestamp >= timestamp and whose last offset is at least
        `from_offset` (the log start: records below it are gone), or None."""
        slot = bisect.bisect_left(self.time_index_timestamps, timestamp, 0, entries) - 1
        start = self.index_positions[slot] if slot >= 0 else 0
        for position, header in self.scanner.headers(start, end):
            if header[8] >= timestamp and header[0] + header[6] >= from_offset:
                return position, header
        return None

    # Writing (caller holds the partition lock) -----------------------------------------------------

    def write_batch(self, position: int, base_offset_bytes: bytes, batch) -> None:
        """Write a batch at `position` with its first 8 bytes replaced (one pwritev, no copy of the batch)."""
        size = len(batch)
        view = memoryview(batch)
        written = os.pwritev(self.log_fd, [base_offset_bytes, view[8:]], position)
        while written < size:  # short writes are rare (disk full raises instead) but allowed by POSIX
            tail = (base_offset_bytes + bytes(view[8:]))[written:]
            written += os.pwrite(self.log_fd, tail, position + written)

    def reserve_entries(self, slot: int) -> None:
        """Reserve the index blocks up to entry `slot` (OSError ENOSPC when the disk is full)."""
        if slot < self._reserved_entries:
            return
        start, end = self._reserved_entries, min(self.capacity, slot + self.index_reserve_entries)
        reserve(self.index_path, start * INDEX_ENTRY_BYTES, (end - start) * INDEX_ENTRY_BYTES)
        reserve(self.time_index_path, start * TIME_INDEX_ENTRY_BYTES, (end - start) * TIME_INDEX_ENTRY_BYTES)
        self._reserved_entries = end

    def write_index_entry(self, slot: int, offset: int, position: int, max_timestamp_before: int) -> None:
        self.reserve_entries(slot)
        relative = offset - self.base_offset
        self.time_index_timestamps[slot] = max_timestamp_before
        self.time_index_offsets[slot] = relative
        self.index_positions[slot] = position
        self.index_offsets[slot] = relative

    def zero_entries_from(self, slot: int) -> None:
        """Clear stale index entries from `slot` up to the first all-zero one."""
        end = max(self.count_entries(), slot, self.count_time_entries())
        if end > slot:
            self._index_map[slot * INDEX_ENTRY_BYTES : end * INDEX_ENTRY_BYTES] = bytes((end - slot) * INDEX_ENTRY_BYTES)
            self._time_index_map[slot * TIME_INDEX_ENTRY_BYTES : end * TIME_INDEX_ENTRY_BYTES] = bytes(
                (end - slot) * TIME_INDEX_ENTRY_BYTES
            )

    def seal(self, end_position: int, entries: int, max_timestamp: int, next_offset: int) -> None:
        """Close the segment for appends: drop any torn tail and stale entries, add the final time entry."""
        os.ftruncate(self.log_fd, end_position)
        self.zero_entries_from(entries)
        if entries < self.capacity:
            self.reserve_entries(entries)
            self.time_index_timestamps[entries] = max_timestamp
            self.time_index_offsets[entries] = next_offset - self.base_offset
        self._sealed_size = end_position
        self._sealed_entries = entries

    def reset(self) -> None:
        """Empty a segment created by a roll that was interrupted before it was published."""
        os.ftruncate(self.log_fd, 0)
        self.zero_entries_from(0)
        self.txn_index(create=True).truncate_from(self.base_offset)

    # Recovery (single process, before workers start) -----------------------------------------------

    def clear_indexes(self) -> None:
        """Zero both index files, keeping them sparse. Recovery only: no other process has them mapped."""
        for path, memory in ((self.index_path, self._index_map), (self.time_index_path, self._time_index_map)):
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, 0)
                os.ftruncate(fd, len(memory))
            finally:
                os.close(fd)

    def valid_entries(self) -> int:
        """Count of leading index entries that are consistent (increasing, inside the file); the rest are junk."""
        size = self.file_size()
        count = self.count_entries()
        previous_offset = previous_position = 0
        for slot in range(count):
            offset, position = self.index_offsets[slot], self.index_positions[slot]
            if offset <= previous_offset or position <= previous_position or position + BATCH_HEADER_SIZE > size:
                return slot
            previous_offset, previous_position = offset, position
        return count

    def entry_points_at_batch(self, slot: int) -> bool:
        """Whether index entry `slot` names a batch that really starts at its position."""
        position = self.index_positions[slot]
        head = os.pread(self.log_fd, 12, position)
        if len(head) < 12:
            return False
        base_offset, _ = OFFSET_AND_LENGTH.unpack(head)
        return base_offset == self.base_offset + self.index_offsets[slot]

    def recover(self, start_slot: int, index_interval_bytes: int, verify_crc: bool, dense: bool = True):
        """Rescan from index entry `start_slot` (-1: from the beginning), rewriting entries after it.

        Checks every batch (and its CRC when verify_crc), truncates the file after the last whole valid
        batch, and returns (end position, entries, next offset, max timestamp, first batch max timestamp).
        Batches follow each other offset by offset; in a segment the log cleaner wrote (not `dense`) a batch
        may start past the previous one's end.
        On a full disk it still recovers: entries that cannot be reserved are not written (lookups scan
        a little further), and a torn tail that cannot be truncated stays past the end, never read.
        """
        if start_slot >= 0:
            position = self.index_positions[start_slot]
            next_offset = self.base_offset + self.index_offsets[start_slot]
            entries = start_slot + 1
            max_timestamp = self.time_index_timestamps[start_slot]
            last_indexed = position
        else:
            position, next_offset, entries, max_timestamp, last_indexed = 0, self.base_offset, 0, -1, 0
        first_timestamp = -1
        size = self.file_size()
        indexing = True
        self.zero_entries_from(entries)
        while position + BATCH_HEADER_SIZE <= size:
            head = os.pread(self.log_fd, BATCH_HEADER_SIZE, position)
            header = BATCH_HEADER.unpack(head)
            batch_size = header[1] + LENGTH_FIELDS_SIZE
            if batch_size < BATCH_HEADER_SIZE or position + batch_size > size or header[0] < next_offset \
                    or dense and header[0] != next_offset:
                break
            if verify_crc and not stored_batch_is_valid(os.pread(self.log_fd, batch_size, position), next_offset,
                                                        dense):
                break
            if (indexing and position > 0 and position - last_indexed >= index_interval_bytes
                    and entries < self.capacity - 1):
                try:
                    self.write_index_entry(entries, next_offset, position, max_timestamp)
                    entries += 1
                    last_indexed = position
                except OSError as exc:
                    if not is_storage_fault(exc):
                        raise
                    indexing = False
                    self.faults.append(exc)
            if position == 0:
                first_timestamp = header[8]
            max_timestamp = max(max_timestamp, header[8])
            next_offset = header[0] + header[6] + 1
            position += batch_size
        if position < size:
            try:
                os.ftruncate(self.log_fd, position)
            except OSError as exc:
                if not is_storage_fault(exc):
                    raise
                self.faults.append(exc)
        if first_timestamp < 0 and start_slot >= 0:
            head = os.pread(self.log_fd, BATCH_HEADER_SIZE, 0)
            if len(head) == BATCH_HEADER_SIZE:
                first_timestamp = BATCH_HEADER.unpack(head)[8]
        return position, entries, next_offset, max_timestamp, first_timestamp

    # Lifetime --------------------------------------------------------------------------------------

    def flush(self, indexes: bool = True, txn_index: bool = True) -> None:
        """fdatasync the log (its data and size: what recovery needs) and, with `txn_index`, the aborted-transaction
        index, and msync both index mappings unless `indexes` is False. Index pages are never needed for
        durability: recovery checks every entry it trusts against the log and rebuilds what is missing, so the
        group commit leaves them to the page cache."""
        os.fdatasync(self.log_fd)
        if txn_index and (index := self.txn_index()) is not None:  # one failed open when the segment has none
            index.flush()
        if indexes:
            for memory in self._maps:
                memory.flush()

    def drop_from_page_cache(self, end: int, whole: bool = False) -> None:
        """Drop the log's pages from uncached_position up to `end` (rounded down to a page, so the next drop
        starts on one), or to the end of the file with `whole`, from the page cache. Only fsync'd bytes may be
        dropped: DONTNEED skips dirty pages, but the caller's window must not depend on that. Advice only: a
        failure changes nothing a reader sees, so it is not an error."""
        start = self.uncached_position
        length = 0 if whole else (end - end % mmap.PAGESIZE) - start  # 0: to the end of the file
        if not whole and length <= 0:
            return
        try:
            os.posix_fadvise(self.log_fd, start, length, os.POSIX_FADV_DONTNEED)
        except OSError:
            return
        self.uncached_position = end if whole else start + length

    def close(self) -> None:
        for view in reversed(self._views):
            view.release()
        self._views.clear()
        for memory in self._maps:
            memory.close()
        self._maps.clear()
        if self.log_fd >= 0:
            os.close(self.log_fd)
            self.log_fd = -1
        if self._txn_index is not None:
            self._txn_index.close()
            self._txn_index = None

    def delete_files(self) -> None:
        for path in (self.log_path, self.index_path, self.time_index_path, self.txn_index_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
