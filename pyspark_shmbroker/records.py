"""Kafka record batches (magic v2) decoded into Arrow columns, vectorised with numpy.

A fetch answer's record set is a run of batches: a 61-byte header (base offset, length, CRC, attributes,
first and max timestamp, record count, ...) and then the records, compressed as a whole when the
attributes say so. Each record is a varint length and then varint fields: attributes, timestamp delta,
offset delta, key length and key, value length and value, header count and headers.

Algorithm (``decode_record_set``):
1. Walk the batch headers in Python (one ``struct`` unpack each): check magic and CRC-32C, skip control
   batches, stop at a trailing partial batch, decompress compressed record areas (gzip, snappy raw or
   xerial-framed, lz4 frame, zstd; cramjam). All record areas are joined into one arena.
2. Find where each record starts. Records are back to back, each length says where the next one begins,
   so this is sequential; two ways: when a batch's area is exactly its record count times its first
   record's size (fixed-size records, what producers of same-size values send) the starts are an
   arithmetic sequence, checked for every record at once with numpy; otherwise a Python loop reads the
   length varints (~0.12 us a record).
3. Decode every field of every record at once: a varint decoder over an array of positions (one numpy
   pass per varint byte), then the next field's positions from the previous one's; the last position
   must land exactly on each record's end, so a malformed record cannot reach outside its record.
4. Build the Arrow arrays without a per-record Python step: keys, values and header fields become
   ``binary_view`` arrays (16-byte views into the arena) that Arrow's C++ cast turns into ``binary``
   (one copy of the payload bytes); offsets, timestamps and partitions are numpy arrays handed over as
   Arrow buffers.
Measured on this 2-core machine (scripts/bench_spark.py, "decode" rows: one ~1 MiB batch, median of 30):
100-byte values decode in ~160 ns a record along the run path and ~410 ns when sizes vary record to
record (the scalar loop) when the machine is quiet (the median of five runs on the shared machine: 227
and 732 ns); kafka-python's record-by-record decoder takes ~2.8 us a record.

Invariants:
- Only whole, CRC-valid batches are decoded; a bad CRC, a wrong magic or a record whose fields do not
  end exactly at its end raises ``CorruptRecords`` (nothing is guessed).
- Records come out in offset order; ``keep_from``/``keep_until`` drop records outside [from, until)
  (a fetch may start inside a batch), and ``next_offset`` is one past the last batch decoded, control
  batches and dropped records included, so a reader never fetches the same batch twice.
- The Arrow schema is exactly what Spark expects for the Kafka source's columns (``arrow_schema``;
  tests compare it with pyspark's own conversion of the Spark schema).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Sequence

from pyspark_shmbroker import dependencies  # noqa: F401  (first: without them, an error saying what to do)
import cramjam
import crc32c
import numpy as np
import pyarrow as pa

from kio.serial.readers import read_signed_varint

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# firstTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount
BATCH_HEADER_SIZE = BATCH_HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset and batchLength come before what batchLength counts
CRC_START = 21  # the CRC covers attributes onward
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
NO_COMPRESSION, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {NO_COMPRESSION: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16  # magic (8), version (4), compatible version (4); then (i32 length, block) pairs
_I32 = struct.Struct(">i")
# Zero bytes after the arena, so a varint read at a record's last byte never leaves the buffer.
_ARENA_PADDING = bytes(16)
_MAX_VARINT = 5
# The smallest record: length, attributes, timestamp delta, offset delta, key length, value length and
# header count, one byte each.
MIN_RECORD_BYTES = 7
_MAX_VARLONG = 10
_INLINE_VIEW_BYTES = 12  # binary_view keeps values up to this long inside the view itself

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
_BASE_FIELDS = [pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
                pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
                pa.field("timestamp", TIMESTAMP_TYPE), pa.field("timestampType", pa.int32())]


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Kafka source's columns, as Arrow types (what Spark's conversion of the Spark schema gives)."""
    return pa.schema(_BASE_FIELDS + ([pa.field("headers", HEADERS_TYPE)] if include_headers else []))


class CorruptRecords(ValueError):
    """Record bytes that are not a valid v2 record batch."""


@dataclass
class DecodedRecords:
    batch: pa.RecordBatch | None  # None when no record was kept
    next_offset: int | None  # one past the last whole batch, None when there was none
    batches: int = 0  # whole batches seen (control batches included)


def decompress(codec: int, data: memoryview) -> bytes | memoryview:
    """A batch's record area, decompressed."""
    if codec == NO_COMPRESSION:
        return data
    try:
        if codec == GZIP:
            return cramjam.gzip.decompress(data)
        if codec == SNAPPY:
            if bytes(data[:8]) == _XERIAL_MAGIC:  # the Java client's framing: blocks of raw snappy
                return _xerial_snappy(data)
            return cramjam.snappy.decompress_raw(data)
        if codec == LZ4:
            return cramjam.lz4.decompress(data)
        if codec == ZSTD:
            return cramjam.zstd.decompress(data)
    except cramjam.DecompressionError as exc:
        raise CorruptRecords(f"{CODEC_NAMES[codec]} data does not decompress: {exc}") from exc
    raise CorruptRecords(f"unknown compression codec {codec}")


def _xerial_snappy(data: memoryview) -> bytes:
    out = []
    pos = _XERIAL_HEADER
    while pos < len(data):
        if pos + 4 > len(data):
            raise CorruptRecords("truncated xerial snappy block length")
        (size,) = _I32.unpack_from(data, pos)
        if size < 0 or pos + 4 + size > len(data):
            raise CorruptRecords("truncated xerial snappy block")
        out.append(bytes(cramjam.snappy.decompress_raw(data[pos + 4 : pos + 4 + size])))
        pos += 4 + size
    return b"".join(out)


# --------------------------------------------------------------------------- varints


def _unaligned(arena: np.ndarray, dtype: str) -> np.ndarray:
    """`dtype` integers (little-endian) starting at every byte of the arena: a strided view, no copy."""
    size = np.dtype(dtype).itemsize
    return np.ndarray(shape=(len(arena) - size + 1,), dtype=dtype, buffer=arena, strides=(1,))


def _varints(arena: np.ndarray, positions: np.ndarray, max_width: int,
             strict: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints starting at each position: (values, widths in bytes), as integer arrays (int32 when
    every varint has one or two bytes, int64 otherwise). Both bytes of the one- and two-byte varints
    (nearly all of them) come from one 16-bit gather; later bytes are gathered only for the varints still
    going. One longer than `max_width` raises CorruptRecords, or with strict=False (guessed positions)
    gets width 0."""
    pair = _unaligned(arena, "<u2")[positions].astype(np.int32)  # first byte | second byte << 8
    more = (pair >> 7) & 1
    going = np.nonzero((pair & 0x8080) == 0x8080)[0]
    raw = (pair & 0x7F) | ((pair >> 1) & 0x3F80) * more
    width = more + 1
    if len(going):
        raw = raw.astype(np.int64)
        width = width.astype(np.int64)
        shift = 14
        while len(going):
            if shift >= 7 * max_width:
                if strict:
                    raise CorruptRecords(f"a varint longer than {max_width} bytes")
                width[going] = 0
                break
            byte = arena[positions[going] + width[going]]
            raw[going] |= (byte & 0x7F).astype(np.int64) << shift
            width[going] += 1
            going = going[byte >= 0x80]
            shift += 7
        unsigned = raw.view(np.uint64) >> np.uint64(1)
        return unsigned.view(np.int64) ^ -(raw & 1), width
    return (raw >> 1) ^ -(raw & 1), width


def _scan_starts(data: bytes, start: int, end: int, count: int) -> list[int]:
    """Record starts of one batch area by reading each record's length (the sequential fallback)."""
    starts = []
    pos = start
    for _ in range(count):
        if pos >= end:
            raise CorruptRecords("a batch holds fewer records than its header says")
        starts.append(pos)
        first = data[pos]
        if first < 0x80:  # one-byte length: records under 64 bytes
            raw, pos = first, pos + 1
        elif data[pos + 1] < 0x80:  # two bytes: up to 8 KiB
            raw, pos = (first & 0x7F) | (data[pos + 1] << 7), pos + 2
        else:
            length, width = read_signed_varint(data, pos)
            raw, pos = length << 1, pos + width
        length = (raw >> 1) ^ -(raw & 1)
        if length < 0:
            raise CorruptRecords(f"record length {length}")
        pos += length
    if pos != end:
        raise CorruptRecords(f"records end {end - pos} bytes away from their batch's end")
    return starts


def _offset_delta_extra(index: np.ndarray) -> np.ndarray:
    """Bytes that the offset-delta varints of records 0..index-1 of a batch take beyond one byte each,
    when record j's offset delta is j (as producers write them): zigzag(j) needs a second byte from
    j = 64, a third from 8192, and so on."""
    largest = int(index.max()) if len(index) else 0
    return sum((np.maximum(0, index - first) for first in (64, 8192, 1 << 20, 1 << 27) if first < largest),
               np.zeros_like(index))


class _Runs:
    """Record starts of many batch areas at once, by runs of predictable records.

    Records of a batch mostly have one size, give or take the offset delta's varint (record j's delta is
    j, so it grows a byte at j = 64 and 8192). Each round, every unfinished area guesses where its next
    records start, assuming each has the size of the one at its current position adjusted for its
    offset delta's width; it decodes the length at every guessed start at once and keeps the guesses up
    to its first mismatch. A guess is a true start exactly when every record before it had its guessed
    size, so nothing past the first mismatch is trusted. An area whose runs stay short (sizes that vary
    from record to record) is left to the scalar loop.
    """

    MIN_RUN = 8  # a shorter run hands the rest of its area to _scan_starts
    MAX_ROUNDS = 8

    def __init__(self, arena: np.ndarray, area_starts: Sequence[int], area_ends: Sequence[int],
                 counts: Sequence[int]) -> None:
        self.arena = arena
        self.position = np.array(area_starts, dtype=np.int64)
        self.end = np.array(area_ends, dtype=np.int64)
        self.remaining = np.array(counts, dtype=np.int64)
        self.done = np.zeros(len(counts), dtype=np.int64)  # records of the area found so far
        self.scalar = np.zeros(len(counts), dtype=bool)
        self.found: list[np.ndarray] = []

    def run(self) -> None:
        limit = len(self.arena) - _MAX_VARINT
        for _ in range(self.MAX_ROUNDS):
            active = np.nonzero((self.remaining > 0) & ~self.scalar)[0]
            if not len(active):
                return
            position = self.position[active]
            lengths, widths = _varints(self.arena, position, _MAX_VARINT)
            sizes = lengths + widths
            first_index = self.done[active]
            base_extra = _offset_delta_extra(first_index)
            first_width = 1 + _offset_delta_extra(first_index + 1) - base_extra
            guesses = self.remaining[active]
            first_guess = np.cumsum(guesses) - guesses
            owner = np.repeat(np.arange(len(active)), guesses)
            step = np.arange(int(guesses.sum()), dtype=np.int64) - first_guess[owner]
            index = first_index[owner] + step
            extra = _offset_delta_extra(index)
            expected = sizes[owner] + (1 + _offset_delta_extra(index + 1) - extra) - first_width[owner]
            at = position[owner] + step * (sizes[owner] - first_width[owner] + 1) + extra - base_extra[owner]
            got_length, got_width = _varints(self.arena, np.minimum(at, limit), _MAX_VARINT, strict=False)
            bad = ((at + expected > self.end[active][owner]) | (got_length + got_width != expected)
                   | (got_length < 0) | (got_width == 0))
            runs = guesses.copy()
            bad_owners, first_bad = np.unique(owner[bad], return_index=True)
            runs[bad_owners] = step[bad][first_bad]
            self.found.append(at[step < runs[owner]])
            after = first_index + runs
            self.position[active] = (position + runs * (sizes - first_width + 1)
                                     + _offset_delta_extra(after) - base_extra)
            self.done[active] = after
            self.remaining[active] -= runs
            self.scalar[active] |= (runs < self.MIN_RUN) & (self.remaining[active] > 0)
        self.scalar |= self.remaining > 0


# --------------------------------------------------------------------------- binary columns


def _binary_array(arena: np.ndarray, arena_buffer: pa.Buffer, starts: np.ndarray, lengths: np.ndarray,
                  target: pa.DataType) -> pa.Array:
    """Arrow `target` (binary or string) array of the byte ranges [starts, starts + lengths) of the arena,
    null where lengths is -1: built as binary_view (16-byte views into the arena), then cast by Arrow's
    C++ into contiguous data."""
    n = len(starts)
    valid = lengths >= 0
    nulls = n - int(np.count_nonzero(valid))
    if nulls == n:
        return pa.nulls(n, target)
    sizes = np.where(valid, lengths, 0).astype(np.int32) if nulls else lengths.astype(np.int32)
    # A view: int32 length, then either the value itself (up to 12 bytes, zero padded) or its first
    # 4 bytes, the data buffer's index (0) and the value's offset in that buffer.
    views = np.zeros((n, 4), dtype=np.int32)
    views[:, 0] = sizes
    views[:, 1] = _unaligned(arena, "<i4")[starts]
    views[:, 3] = starts
    short = np.nonzero(sizes <= _INLINE_VIEW_BYTES)[0]
    if len(short):
        inline = arena[starts[short, None] + np.arange(_INLINE_VIEW_BYTES)]
        inline[np.arange(_INLINE_VIEW_BYTES)[None, :] >= sizes[short, None]] = 0
        views[short, 1:4] = inline.view(np.int32)
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    array = pa.Array.from_buffers(pa.binary_view(), n, [validity, pa.py_buffer(views), arena_buffer],
                                  null_count=nulls).cast(pa.binary())
    if target == pa.string():
        try:
            return array.cast(pa.string())  # checks UTF-8
        except pa.ArrowInvalid:
            # As the Java client decodes header keys: malformed UTF-8 becomes U+FFFD (rare: a slow path).
            return pa.array([None if b is None else b.decode("utf-8", "replace") for b in array.to_pylist()],
                            pa.string())
    return array


def _constant_string(text: str, n: int) -> pa.Array:
    raw = text.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


# --------------------------------------------------------------------------- decoding


def decode_record_set(records: bytes | memoryview, topic: str, partition: int, *, keep_from: int = 0,
                      keep_until: int | None = None, include_headers: bool = False, check_crc: bool = True,
                      buffer: Any = None, records_at: int = 0) -> DecodedRecords:
    """Decode the whole batches of one partition's fetched record set into one Arrow RecordBatch.

    `buffer`, when given, is the buffer `records` is a view of, starting at `records_at`, with at least
    16 spare bytes after it (wire.FRAME_SLACK): uncompressed records are then decoded in place, with no
    copy into an arena of their own."""
    view = memoryview(records)
    pos, end = 0, len(view)
    areas: list[bytes | memoryview] = []
    area_at: list[int] = []  # where each area starts in `records`
    compressed = False
    base_offsets, first_timestamps, max_timestamps, log_append, counts = [], [], [], [], []
    next_offset = None
    batches = 0
    while end - pos >= BATCH_HEADER_SIZE:
        (base_offset, batch_length, _epoch, magic, crc, attributes, last_delta, first_ts, max_ts,
         _pid, _pepoch, _seq, count) = BATCH_HEADER.unpack_from(view, pos)
        size = LOG_OVERHEAD + batch_length
        if batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
            raise CorruptRecords(f"batch at offset {base_offset} has length {batch_length}")
        if pos + size > end:
            break  # a partial batch at the end of a fetch: the next fetch starts there
        if magic != 2:
            raise CorruptRecords(f"batch at offset {base_offset} has magic {magic}; only v2 batches are read")
        if check_crc and crc32c.crc32c(view[pos + CRC_START : pos + size]) != crc:
            raise CorruptRecords(f"batch at offset {base_offset} fails its CRC-32C check")
        batches += 1
        next_offset = base_offset + last_delta + 1
        pos += size
        if attributes & CONTROL_BIT or count <= 0:
            continue
        if keep_until is not None and base_offset >= keep_until or next_offset <= keep_from:
            continue
        codec = attributes & COMPRESSION_MASK
        compressed |= codec != NO_COMPRESSION
        area = decompress(codec, view[pos - size + BATCH_HEADER_SIZE : pos])
        # Every array below is sized by record counts: a count the bytes cannot hold is corrupt.
        if count > len(area) // MIN_RECORD_BYTES:
            raise CorruptRecords(f"batch at offset {base_offset} claims {count} records in {len(area)} bytes")
        areas.append(area)
        area_at.append(pos - size + BATCH_HEADER_SIZE)
        base_offsets.append(base_offset)
        first_timestamps.append(first_ts)
        max_timestamps.append(max_ts)
        log_append.append(1 if attributes & TIMESTAMP_TYPE_BIT else 0)
        counts.append(count)
    if not areas:
        return DecodedRecords(None, next_offset, batches)
    area_sizes = [len(a) if not isinstance(a, memoryview) else a.nbytes for a in areas]
    if buffer is not None and not compressed:
        # In place: the arena is the receive buffer (its slack is the padding).
        data = memoryview(buffer).toreadonly()
        area_starts = [records_at + at for at in area_at]
        area_ends = [start + size for start, size in zip(area_starts, area_sizes)]
    else:
        data = memoryview(b"".join(areas + [_ARENA_PADDING]))
        area_ends = [int(e) for e in np.cumsum(area_sizes)]
        area_starts = [e - s for e, s in zip(area_ends, area_sizes)]
    arena = np.frombuffer(data, dtype=np.uint8)

    runs = _Runs(arena, area_starts, area_ends, counts)
    runs.run()
    pieces = list(runs.found)
    for area in np.nonzero(runs.scalar)[0]:
        pieces.append(np.array(_scan_starts(data, int(runs.position[area]), area_ends[area],
                                            int(runs.remaining[area])), dtype=np.int64))
    # Pieces come round by round; arena positions are in record order, so sorting restores it.
    starts = np.sort(np.concatenate(pieces), kind="stable") if len(pieces) > 1 else pieces[0]
    counts_array = np.array(counts, dtype=np.int64)
    batch_of = np.repeat(np.arange(len(counts)), counts_array)
    return DecodedRecords(_decode_fields(arena, data, starts, np.array(area_ends, dtype=np.int64), counts_array,
                                         batch_of, np.array(base_offsets, dtype=np.int64),
                                         np.array(first_timestamps, dtype=np.int64),
                                         np.array(max_timestamps, dtype=np.int64),
                                         np.array(log_append, dtype=np.int32), topic, partition, keep_from,
                                         keep_until, include_headers),
                          next_offset, batches)


def _decode_fields(arena: np.ndarray, data: bytes, starts: np.ndarray, area_ends: np.ndarray,
                   counts: np.ndarray, batch_of: np.ndarray, base_offsets: np.ndarray, first_timestamps: np.ndarray,
                   max_timestamps: np.ndarray, log_append: np.ndarray, topic: str, partition: int, keep_from: int,
                   keep_until: int | None, include_headers: bool) -> pa.RecordBatch | None:
    lengths, widths = _varints(arena, starts, _MAX_VARINT)
    if (lengths < 0).any():
        raise CorruptRecords("a negative record length")
    record_ends = starts + widths + lengths
    # Each record ends where the next one starts, and a batch's last one at its area's end.
    following = np.empty_like(starts)
    following[:-1] = starts[1:]
    last_of_batch = np.cumsum(counts) - 1
    following[last_of_batch] = area_ends
    if not np.array_equal(record_ends, following):
        raise CorruptRecords("record lengths do not tile their batch")
    # Field by field; after each, every position must still be inside its record, so the next varint
    # read stays inside the arena (its padding covers a varint starting at a record's last byte).
    position = starts + widths + 1  # past the record attributes
    timestamp_deltas, width = _varints(arena, _inside(position, record_ends), _MAX_VARLONG)
    position = position + width
    offset_deltas, width = _varints(arena, _inside(position, record_ends), _MAX_VARINT)
    position = position + width
    key_lengths, width = _varints(arena, _inside(position, record_ends), _MAX_VARINT)
    key_starts = position + width
    position = key_starts + np.maximum(key_lengths, 0)
    value_lengths, width = _varints(arena, _inside(position, record_ends), _MAX_VARINT)
    value_starts = position + width
    position = value_starts + np.maximum(value_lengths, 0)
    header_counts, width = _varints(arena, _inside(position, record_ends), _MAX_VARINT)
    position = _inside(position + width, record_ends, allow_end=True)
    if (key_lengths < -1).any() or (value_lengths < -1).any() or (header_counts < 0).any():
        raise CorruptRecords("a negative key, value or header count")

    header_fields = None
    if header_counts.any():
        position, header_fields = _decode_headers(arena, position, header_counts, record_ends)
    if not np.array_equal(position, record_ends):
        raise CorruptRecords("record fields do not end at their record's end")

    offsets = base_offsets[batch_of] + offset_deltas
    keep = offsets >= keep_from
    if keep_until is not None:
        keep &= offsets < keep_until
    n = int(keep.sum())
    if n == 0:
        return None
    timestamps = np.where(log_append[batch_of] == 1, max_timestamps[batch_of],
                          first_timestamps[batch_of] + timestamp_deltas)
    timestamp_types = log_append[batch_of]
    if n != len(keep):
        chosen = np.nonzero(keep)[0]
        key_starts, key_lengths = key_starts[chosen], key_lengths[chosen]
        value_starts, value_lengths = value_starts[chosen], value_lengths[chosen]
        offsets, timestamps, timestamp_types = offsets[chosen], timestamps[chosen], timestamp_types[chosen]
        header_counts = header_counts[chosen]
        if header_fields is not None:
            header_fields = _select_headers(header_fields, keep)

    arena_buffer = pa.py_buffer(data)
    columns = [
        _binary_array(arena, arena_buffer, key_starts, key_lengths, pa.binary()),
        _binary_array(arena, arena_buffer, value_starts, value_lengths, pa.binary()),
        _constant_string(topic, n),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(offsets),
        pa.Array.from_buffers(TIMESTAMP_TYPE, n, [None, pa.py_buffer(timestamps * 1000)]),
        pa.array(np.ascontiguousarray(timestamp_types, dtype=np.int32)),
    ]
    if include_headers:
        columns.append(_headers_array(arena, arena_buffer, header_counts, header_fields))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


def _inside(position: np.ndarray, record_ends: np.ndarray, allow_end: bool = False) -> np.ndarray:
    """`position`, after checking each is before its record's end (or at it, with allow_end)."""
    if (position > record_ends).any() or not allow_end and (position == record_ends).any():
        raise CorruptRecords("record fields run past their record")
    return position


def _decode_headers(arena: np.ndarray, position: np.ndarray, header_counts: np.ndarray,
                    record_ends: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Every header of every record, in record order then header order: (owner record, key start,
    key length, value start, value length) arrays; and each record's position after its headers."""
    position = position.copy()
    owners, key_starts, key_lengths, value_starts, value_lengths, order = [], [], [], [], [], []
    for index in range(int(header_counts.max())):
        has = np.nonzero(header_counts > index)[0]
        at = position[has]
        if (at >= record_ends[has]).any():
            raise CorruptRecords("headers run past their record")
        key_length, width = _varints(arena, at, _MAX_VARINT)
        if (key_length < 0).any():
            raise CorruptRecords("a header without a key")
        key_start = at + width
        at = key_start + key_length
        if (at >= record_ends[has]).any():
            raise CorruptRecords("headers run past their record")
        value_length, width = _varints(arena, at, _MAX_VARINT)
        if (value_length < -1).any():
            raise CorruptRecords("a negative header value length")
        value_start = at + width
        at = value_start + np.maximum(value_length, 0)
        if (at > record_ends[has]).any():
            raise CorruptRecords("headers run past their record")
        position[has] = at
        owners.append(has)
        key_starts.append(key_start)
        key_lengths.append(key_length)
        value_starts.append(value_start)
        value_lengths.append(value_length)
        order.append(np.full(len(has), index))
    owner = np.concatenate(owners)
    sort = np.lexsort((np.concatenate(order), owner))
    fields = (owner[sort], np.concatenate(key_starts)[sort], np.concatenate(key_lengths)[sort],
              np.concatenate(value_starts)[sort], np.concatenate(value_lengths)[sort])
    return position, fields


def _select_headers(fields: tuple[np.ndarray, ...], keep: np.ndarray) -> tuple[np.ndarray, ...]:
    mask = keep[fields[0]]
    return tuple(f[mask] for f in fields)


def _headers_array(arena: np.ndarray, arena_buffer: pa.Buffer, header_counts: np.ndarray,
                   fields: tuple[np.ndarray, ...] | None) -> pa.Array:
    n = len(header_counts)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(header_counts, out=offsets[1:])
    if fields is None:
        empty = np.zeros(0, dtype=np.int64)
        fields = (empty, empty, empty, empty, empty)
    _, key_starts, key_lengths, value_starts, value_lengths = fields
    keys = _binary_array(arena, arena_buffer, key_starts, key_lengths, pa.string())
    values = _binary_array(arena, arena_buffer, value_starts, value_lengths, pa.binary())
    entries = pa.StructArray.from_arrays([keys, values], fields=list(HEADER_TYPE))
    return pa.ListArray.from_arrays(pa.array(offsets), entries, type=HEADERS_TYPE)
