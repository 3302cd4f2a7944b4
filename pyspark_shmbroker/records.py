"""Kafka record batches (magic v2) decoded into Arrow columns, vectorised with numpy.

A fetch answer's record set is a run of batches: a 61-byte header (node.storage.records) and then the records,
compressed as a whole when the attributes say so.

Algorithm (``decode_record_set``):
1. Walk the batch headers in Python (one ``struct`` unpack each): check magic and CRC-32C, skip control
   batches and the batches of aborted transactions (read_committed: the fetch answer lists them; Kafka's
   consumer algorithm: a producer id is aborting from its listed first offset to its ABORT marker), stop at a
   trailing partial batch, decompress compressed record areas (node.storage.compression).
   All record areas are joined into one arena (or, uncompressed, read in place from the receive buffer).
2. Every record's fields at once, as arrays over the arena (node.storage.record_arrays, which the node's log
   cleaner reads keys with too).
3. Build the Arrow arrays without a per-record Python step: keys, values and header fields become
   ``binary_view`` arrays (16-byte views into the arena) that Arrow's C++ cast turns into ``binary``
   (one copy of the payload bytes); offsets, timestamps and partitions are numpy arrays handed over as
   Arrow buffers. scripts/bench_spark.py's "decode" rows measure it.

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

from dataclasses import dataclass
from typing import Any, Sequence

from pyspark_shmbroker import dependencies  # noqa: F401  (first: without them, an error saying what to do)
import crc32c
import numpy as np
import pyarrow as pa

from shmbroker.node.storage import compression
from shmbroker.node.storage.record_arrays import (ARENA_PADDING, MIN_RECORD_BYTES, CorruptRecords, record_fields,
                                                  select_headers, unaligned)

from shmbroker.node.storage.records import (BATCH_HEADER, BATCH_HEADER_SIZE, COMPRESSION_MASK, CONTROL_BIT, CRC_START,
                                            TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT, ControlType, control_type)
from shmbroker.node.storage.records import LENGTH_FIELDS_SIZE as LOG_OVERHEAD  # baseOffset and batchLength

NO_COMPRESSION, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {NO_COMPRESSION: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
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


@dataclass
class DecodedRecords:
    batch: pa.RecordBatch | None  # None when no record was kept
    next_offset: int | None  # one past the last whole batch, None when there was none
    batches: int = 0  # whole batches seen (control batches included)


def decompress(codec: int, data: memoryview) -> bytes | memoryview:
    """A batch's record area, decompressed (node.storage.compression: raw or xerial snappy, bounded sizes)."""
    if codec == NO_COMPRESSION:
        return data
    try:
        return compression.decompress(codec, data)
    except compression.CodecError as exc:
        raise CorruptRecords(f"{CODEC_NAMES.get(codec, codec)} data does not decompress: {exc}") from exc


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
    views[:, 1] = unaligned(arena, "<i4")[starts]
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
                      buffer: Any = None, records_at: int = 0,
                      aborted_transactions: Sequence[tuple[int, int]] = ()) -> DecodedRecords:
    """Decode the whole batches of one partition's fetched record set into one Arrow RecordBatch, without the
    transactional batches of the aborted transactions listed as (producer id, first offset).

    `buffer`, when given, is the buffer `records` is a view of, starting at `records_at`, with at least
    16 spare bytes after it (shmbroker.clients.wire.FRAME_SLACK): uncompressed records are then decoded in place, with no
    copy into an arena of their own."""
    view = memoryview(records)
    pos, end = 0, len(view)
    areas: list[bytes | memoryview] = []
    area_at: list[int] = []  # where each area starts in `records`
    compressed = False
    base_offsets, first_timestamps, max_timestamps, log_append, counts = [], [], [], [], []
    next_offset = None
    batches = 0
    pending_aborts = sorted(aborted_transactions, key=lambda entry: entry[1])
    aborting: set[int] = set()  # producer ids inside an aborted transaction at this point of the record set
    while end - pos >= BATCH_HEADER_SIZE:
        (base_offset, batch_length, _epoch, magic, crc, attributes, last_delta, first_ts, max_ts,
         producer_id, _pepoch, _seq, count) = BATCH_HEADER.unpack_from(view, pos)
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
        while pending_aborts and pending_aborts[0][1] < next_offset:
            aborting.add(pending_aborts.pop(0)[0])
        if attributes & CONTROL_BIT:
            if producer_id in aborting and control_type(view[pos - size:pos]) == ControlType.ABORT:
                aborting.discard(producer_id)
            continue
        if count <= 0 or attributes & TRANSACTIONAL_BIT and producer_id in aborting:
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
        data = memoryview(b"".join(areas + [ARENA_PADDING]))
        area_ends = [int(e) for e in np.cumsum(area_sizes)]
        area_starts = [e - s for e, s in zip(area_ends, area_sizes)]
    arena = np.frombuffer(data, dtype=np.uint8)

    return DecodedRecords(_decode_fields(arena, data, area_starts, area_ends, counts,
                                         np.array(base_offsets, dtype=np.int64),
                                         np.array(first_timestamps, dtype=np.int64),
                                         np.array(max_timestamps, dtype=np.int64),
                                         np.array(log_append, dtype=np.int32), topic, partition, keep_from,
                                         keep_until, include_headers),
                          next_offset, batches)


def _decode_fields(arena: np.ndarray, data: bytes, area_starts: list[int], area_ends: list[int],
                   counts: list[int], base_offsets: np.ndarray, first_timestamps: np.ndarray,
                   max_timestamps: np.ndarray, log_append: np.ndarray, topic: str, partition: int, keep_from: int,
                   keep_until: int | None, include_headers: bool) -> pa.RecordBatch | None:
    fields = record_fields(arena, data, area_starts, area_ends, counts)
    batch_of = fields.batch_of
    offset_deltas, timestamp_deltas, header_counts = fields.offset_deltas, fields.timestamp_deltas, fields.header_counts
    key_starts, key_lengths = fields.key_starts, fields.key_lengths
    value_starts, value_lengths = fields.value_starts, fields.value_lengths
    header_fields = fields.header_fields

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
            header_fields = select_headers(header_fields, keep)

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
