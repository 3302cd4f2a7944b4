"""Kafka record batches (magic v2): the one codec of the format in the tree (header layout, CRC, records,
varints), the cheap validation done on produce, and the builder every writer of batches uses (the node's
offsets log, the benchmarks' raw client, the tests; the Spark connector's vectorised encoder takes its
header layout and producer fields from here).

A v2 record batch is a 61-byte big-endian header followed by the (possibly compressed) records:

    offset  size  field
         0     8  baseOffset            rewritten by the broker on append; nothing else is
         8     4  batchLength           bytes after this field (= total size - 12)
        12     4  partitionLeaderEpoch
        16     1  magic                 must be 2
        17     4  crc                   CRC-32C of bytes 21..end (attributes onward)
        21     2  attributes            bits 0-2 compression, 3 timestamp type, 4 transactional, 5 control
        23     4  lastOffsetDelta
        27     8  baseTimestamp
        35     8  maxTimestamp
        43     8  producerId            -1 when not idempotent
        51     2  producerEpoch
        53     4  baseSequence
        57     4  recordCount
        61     .  records

Invariants:
- The CRC does not cover baseOffset, batchLength or partitionLeaderEpoch, so rewriting baseOffset keeps a
  batch valid; batches are stored byte-for-byte as received apart from that field.
- A record set is batches back to back; iter_batches() yields only the whole ones (a fetch may end inside
  a batch), from their headers alone.
- validate_client_batch() either returns the parsed header or raises StorageError with a Kafka error code;
  it never raises anything else, whatever the input bytes (fuzzed in tests/test_records.py).
- A transactional batch (bit 4) always carries a producer id, epoch and sequence. A control batch (bits 4 and
  5, Kafka's transaction marker) is written by the node only, never accepted from a client: one record whose
  key is (version int16 0, type int16: ABORT 0, COMMIT 1) and whose value is (version int16 0, coordinator
  epoch int32), base sequence -1, as Kafka's EndTransactionMarker.
"""

from __future__ import annotations

import struct
from typing import Iterator, NamedTuple, Sequence

import crc32c
import numpy as np

from shmbroker.node.storage.compression import CodecError, compress, decompress


class ErrorCode:
    """Kafka protocol error codes that storage can produce."""

    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    MESSAGE_TOO_LARGE = 10
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    UNKNOWN_PRODUCER_ID = 59
    KAFKA_STORAGE_ERROR = 56
    INVALID_RECORD = 87


class StorageError(Exception):
    """A request the log refuses; error_code is the Kafka error code to put in the response, and record_errors
    the records of the batch at fault, (index in the batch, message), for Produce v8+'s RecordErrors."""

    def __init__(self, error_code: int, message: str, record_errors: tuple[tuple[int, str], ...] = ()):
        super().__init__(message)
        self.error_code = error_code
        self.record_errors = record_errors


MAGIC_V2 = 2
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE = BATCH_HEADER.size  # 61
LENGTH_FIELDS_SIZE = 12  # baseOffset + batchLength: what batchLength does not count
CRC = struct.Struct(">I")
CRC_AT = 17
CRC_START = 21  # the CRC covers attributes onward
PRODUCER_FIELDS = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence
PRODUCER_FIELDS_AT = 43
BASE_OFFSET = struct.Struct(">q")
OFFSET_AND_LENGTH = struct.Struct(">qi")

# The same layout as a numpy dtype, for reading many headers at once (recovery, tests, tools).
BATCH_HEADER_DTYPE = np.dtype(
    [
        ("base_offset", ">i8"),
        ("batch_length", ">i4"),
        ("partition_leader_epoch", ">i4"),
        ("magic", "i1"),
        ("crc", ">u4"),
        ("attributes", ">i2"),
        ("last_offset_delta", ">i4"),
        ("base_timestamp", ">i8"),
        ("max_timestamp", ">i8"),
        ("producer_id", ">i8"),
        ("producer_epoch", ">i2"),
        ("base_sequence", ">i4"),
        ("record_count", ">i4"),
    ]
)
assert BATCH_HEADER_DTYPE.itemsize == BATCH_HEADER_SIZE

COMPRESSION_MASK = 0x07
MAX_COMPRESSION_CODEC = 4  # none, gzip, snappy, lz4, zstd
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1  # what clients send; the node's own batches carry 0
MIN_UNCOMPRESSED_RECORD_SIZE = 7  # length, attributes, 3 deltas, key length, value length, header count: 1 byte each
INT32_MAX = 2**31 - 1


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return self.batch_length + LENGTH_FIELDS_SIZE

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def last_sequence(self) -> int:
        return last_sequence(self.base_sequence, self.last_offset_delta)


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """Sequence of the batch's last record; sequences wrap from INT32_MAX to 0 as in Kafka."""
    if base_sequence < 0:
        return NO_SEQUENCE
    if base_sequence > INT32_MAX - last_offset_delta:
        return last_offset_delta - (INT32_MAX - base_sequence) - 1
    return base_sequence + last_offset_delta


def parse_header(buf, position: int = 0) -> BatchHeader:
    """Header of the batch starting at buf[position:]; the caller guarantees 61 bytes are there."""
    return BatchHeader._make(BATCH_HEADER.unpack_from(buf, position))


def iter_batches(record_set) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each whole batch of a record set, from the headers alone; stops at a trailing
    partial batch or a length too short for a header. Nothing is checked beyond the length."""
    position, end = 0, len(record_set)
    unpack, new = BATCH_HEADER.unpack_from, tuple.__new__  # what BatchHeader._make does, without its lookups
    while end - position >= BATCH_HEADER_SIZE:
        header = new(BatchHeader, unpack(record_set, position))
        size = header.batch_length + LENGTH_FIELDS_SIZE
        if size < BATCH_HEADER_SIZE or position + size > end:
            return
        yield position, header
        position += size


def seal(batch: bytearray) -> None:
    """Set the batch's CRC-32C (once built, or after an edit of the bytes it covers)."""
    CRC.pack_into(batch, CRC_AT, crc32c.crc32c(memoryview(batch)[CRC_START:]))


def set_producer(batch: bytearray, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
    """Stamp a batch with a producer id, epoch and base sequence, and seal it."""
    PRODUCER_FIELDS.pack_into(batch, PRODUCER_FIELDS_AT, producer_id, producer_epoch, base_sequence)
    seal(batch)


def validate_client_batch(buf, max_message_bytes: int) -> BatchHeader:
    """Check a produce request's record set for one partition the way Kafka's LogValidator does, cheaply.

    buf must hold exactly one v2 batch with baseOffset 0. Returns its header or raises StorageError.
    """
    size = len(buf)
    if size < BATCH_HEADER_SIZE:
        raise StorageError(ErrorCode.CORRUPT_MESSAGE, f"record set of {size} bytes is shorter than a batch header")
    header = BatchHeader._make(BATCH_HEADER.unpack_from(buf, 0))
    if header.magic != MAGIC_V2:
        # Produce v3+ may carry only v2 batches (Kafka's ProduceRequest.validateRecords): INVALID_RECORD.
        code = ErrorCode.INVALID_RECORD if 0 <= header.magic < MAGIC_V2 else ErrorCode.CORRUPT_MESSAGE
        raise StorageError(code, f"record batch magic {header.magic}, only magic 2 is accepted")
    batch_size = header.batch_length + LENGTH_FIELDS_SIZE
    if batch_size < BATCH_HEADER_SIZE or batch_size > size:
        raise StorageError(ErrorCode.CORRUPT_MESSAGE, f"batch length {header.batch_length} does not fit {size} bytes")
    if batch_size < size:
        raise StorageError(ErrorCode.INVALID_RECORD, "exactly one record batch per partition is allowed")
    if size > max_message_bytes:
        raise StorageError(ErrorCode.MESSAGE_TOO_LARGE, f"batch of {size} bytes exceeds {max_message_bytes}")
    if crc32c.crc32c(buf[CRC_START:]) != header.crc:
        raise StorageError(ErrorCode.CORRUPT_MESSAGE, "record batch CRC-32C mismatch")
    if header.base_offset != 0:
        raise StorageError(ErrorCode.INVALID_RECORD, f"client batch has base offset {header.base_offset}, not 0")
    if header.record_count <= 0 or header.last_offset_delta + 1 != header.record_count:
        raise StorageError(
            ErrorCode.INVALID_RECORD,
            f"lastOffsetDelta {header.last_offset_delta} + 1 != record count {header.record_count}",
        )
    attributes = header.attributes
    if attributes & COMPRESSION_MASK > MAX_COMPRESSION_CODEC:
        raise StorageError(ErrorCode.CORRUPT_MESSAGE, f"unknown compression codec {attributes & COMPRESSION_MASK}")
    if attributes & CONTROL_BIT:
        raise StorageError(ErrorCode.INVALID_RECORD, "clients may not send control batches")
    if attributes & TRANSACTIONAL_BIT and header.producer_id < 0:
        raise StorageError(ErrorCode.INVALID_RECORD, "transactional batch without a producer id")
    if attributes & COMPRESSION_MASK == 0 and not records_can_fit(buf, header):
        raise StorageError(ErrorCode.CORRUPT_MESSAGE, f"{header.record_count} records cannot fit in {size} bytes")
    if header.producer_id >= 0 and (header.base_sequence < 0 or header.producer_epoch < 0):
        raise StorageError(ErrorCode.INVALID_RECORD, "idempotent batch without a sequence number or epoch")
    return header


def stored_batch_is_valid(buf, expected_base_offset: int, dense: bool = True) -> bool:
    """Recovery's check of one whole stored batch: magic, length, CRC and its offsets. A dense batch (as appended)
    starts at `expected_base_offset` and holds a record per offset; one the log cleaner wrote (`dense` False)
    may start later and hold fewer records than offsets, none at all for a producer's last batch."""
    if len(buf) < BATCH_HEADER_SIZE:
        return False
    header = BATCH_HEADER.unpack_from(buf, 0)
    base_offset, batch_length, _, magic, crc = header[:5]
    last_offset_delta, record_count = header[6], header[12]
    if dense:
        offsets_ok = base_offset == expected_base_offset and 0 < record_count == last_offset_delta + 1
    else:
        offsets_ok = base_offset >= expected_base_offset and 0 <= record_count <= last_offset_delta + 1
    return (
        magic == MAGIC_V2
        and batch_length + LENGTH_FIELDS_SIZE == len(buf)
        and offsets_ok
        and crc32c.crc32c(buf[CRC_START:]) == crc
    )


def records_can_fit(buf, header: BatchHeader) -> bool:
    """Whether the uncompressed records after the header can hold record_count records. The count is the
    client's (or, for a compressed batch, unchecked until decompressed): work sized by it is bounded by this."""
    return header.record_count * MIN_UNCOMPRESSED_RECORD_SIZE <= len(buf) - BATCH_HEADER_SIZE


def record_timestamps(buf, header: BatchHeader) -> list[int] | None:
    """Timestamps of an uncompressed batch's records in order, or None if compressed or malformed.

    Used by ListOffsets-by-timestamp to find the exact record, and (through all_record_timestamps, on the
    decompressed records) by a produce to a topic with timestamp bounds; never on the fetch path.
    """
    if header.compression == 0 and header.attributes & TIMESTAMP_TYPE_BIT and records_can_fit(buf, header):
        return [header.max_timestamp] * header.record_count  # LogAppendTime: every record has maxTimestamp
    found = record_offsets_and_timestamps(buf, header)
    return None if found is None else [timestamp for _, timestamp in found]


def record_offsets_and_timestamps(buf, header: BatchHeader) -> list[tuple[int, int]] | None:
    """(offset, timestamp) of each of an uncompressed batch's records in order, or None if compressed or
    malformed. The offsets are the records' own (base offset plus offset delta): a batch the log cleaner
    rewrote keeps its base and last offsets but not every record between them. For ListOffsets by timestamp."""
    if header.compression != 0 or not records_can_fit(buf, header):
        return None
    log_append_time = header.attributes & TIMESTAMP_TYPE_BIT  # every record has maxTimestamp
    view = memoryview(buf)
    position = BATCH_HEADER_SIZE
    found = []
    try:
        for _ in range(header.record_count):
            length, position = read_varint(view, position)
            record_end = position + length
            timestamp_delta, position = read_varint(view, position + 1)  # past the record attributes
            offset_delta, _ = read_varint(view, position)
            found.append((header.base_offset + offset_delta,
                          header.max_timestamp if log_append_time else header.base_timestamp + timestamp_delta))
            position = record_end
    except IndexError:
        return None
    return found


def all_record_offsets_and_timestamps(buf, header: BatchHeader) -> list[tuple[int, int]]:
    """record_offsets_and_timestamps of a batch, compressed or not (a compressed one is decompressed).
    Raises StorageError(CORRUPT_MESSAGE) if the records do not decode."""
    buf, header = uncompressed(buf, header)
    found = record_offsets_and_timestamps(buf, header)
    if found is None or len(found) != header.record_count:
        raise StorageError(ErrorCode.CORRUPT_MESSAGE, "record batch ends inside a record")
    return found


def all_record_timestamps(buf, header: BatchHeader) -> list[int]:
    """Timestamps of every record of a batch, compressed or not (a compressed one is decompressed).
    Raises StorageError(CORRUPT_MESSAGE) if the records do not decode."""
    return [timestamp for _, timestamp in all_record_offsets_and_timestamps(buf, header)]


def uncompressed(buf, header: BatchHeader) -> tuple[bytes | memoryview, BatchHeader]:
    """The batch with its records decompressed (as it is if it is not compressed); raises
    StorageError(CORRUPT_MESSAGE) if they do not decode."""
    if not header.compression:
        return buf, header
    try:
        records = decompress(header.compression, memoryview(buf)[BATCH_HEADER_SIZE:])
    except CodecError as exc:
        raise StorageError(ErrorCode.CORRUPT_MESSAGE, str(exc)) from None
    return bytes(buf[:BATCH_HEADER_SIZE]) + records, header._replace(attributes=header.attributes & ~COMPRESSION_MASK)


def keyless_records(buf, header: BatchHeader) -> list[int]:
    """The indexes of the batch's records (decompressed if need be) whose key is null: what a compacted topic
    refuses. Raises StorageError(CORRUPT_MESSAGE) if the records do not decode."""
    buf, header = uncompressed(buf, header)
    return [index for index, (_, key, _) in enumerate(iter_records(buf, header)) if key is None]


def rewrite_batch(buf, header: BatchHeader, codec: int | None, log_append_time_ms: int | None) -> tuple[bytes, BatchHeader]:
    """The batch as a topic stores it: its records recompressed with `codec` (None: as sent) and, with
    `log_append_time_ms`, marked LogAppendTime with that maxTimestamp (Kafka's LogValidator does both); the
    length and CRC-32C are recomputed. Raises StorageError(CORRUPT_MESSAGE) if the records do not decode."""
    records = memoryview(buf)[BATCH_HEADER_SIZE:]
    attributes = header.attributes
    if codec is not None and codec != header.compression:
        try:
            records = compress(codec, decompress(header.compression, records))
        except CodecError as exc:
            raise StorageError(ErrorCode.CORRUPT_MESSAGE, str(exc)) from None
        attributes = (attributes & ~COMPRESSION_MASK) | codec
    max_timestamp = header.max_timestamp
    if log_append_time_ms is not None:
        attributes |= TIMESTAMP_TYPE_BIT
        max_timestamp = log_append_time_ms
    header = header._replace(batch_length=BATCH_HEADER_SIZE - LENGTH_FIELDS_SIZE + len(records),
                             attributes=attributes, max_timestamp=max_timestamp)
    batch = bytearray(BATCH_HEADER.pack(*header))
    batch += records
    seal(batch)
    return bytes(batch), parse_header(batch)


def read_varint(view, position: int) -> tuple[int, int]:
    """Zig-zag varint at position: (value, next position); IndexError past the end or beyond 64 bits."""
    shift = 0
    raw = 0
    while True:
        byte = view[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), position
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def varint(value: int) -> bytes:
    """Zig-zag varint of value."""
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


_NULL = varint(-1)
Headers = Sequence[tuple[str, "bytes | None"]]


def encode_record(offset_delta: int, key: bytes | None, value: bytes | None, timestamp_delta: int = 0,
                  headers: Headers = ()) -> bytes:
    """One record as it stands in a batch's record area, its length first (None: a null key or value)."""
    body = bytearray(b"\x00")  # attributes, unused
    body += varint(timestamp_delta)
    body += varint(offset_delta)
    for field in (key, value):
        body += _NULL if field is None else varint(len(field)) + field
    body += varint(len(headers))
    for name, header_value in headers:
        raw = name.encode("utf-8")
        body += varint(len(raw)) + raw
        body += _NULL if header_value is None else varint(len(header_value)) + header_value
    return varint(len(body)) + bytes(body)


def pack_header(records_size: int, record_count: int, first_timestamp: int, max_timestamp: int, *,
                attributes: int = 0, base_offset: int = 0, partition_leader_epoch: int = 0,
                producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
                base_sequence: int = NO_SEQUENCE) -> bytes:
    """The header of a batch of record_count records (offset deltas 0 up) in records_size bytes; its CRC
    is 0 until the batch is sealed."""
    return BATCH_HEADER.pack(base_offset, BATCH_HEADER_SIZE - LENGTH_FIELDS_SIZE + records_size,
                             partition_leader_epoch, MAGIC_V2, 0, attributes, record_count - 1, first_timestamp,
                             max_timestamp, producer_id, producer_epoch, base_sequence, record_count)


def build_batch(records: Sequence[tuple[bytes | None, bytes | None]], timestamp_ms: int, *,
                timestamp_deltas: Sequence[int] | None = None, headers: Sequence[Headers] | None = None,
                compression: int = 0, base_offset: int = 0, partition_leader_epoch: int = 0,
                producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
                base_sequence: int = NO_SEQUENCE, transactional: bool = False) -> bytes:
    """A sealed v2 batch of (key, value) records (None: null), create time: record i at timestamp_ms +
    timestamp_deltas[i] (default: all at timestamp_ms) with headers[i] (default none), its records
    compressed with codec `compression`; `transactional` sets the transactional bit."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    deltas = timestamp_deltas if timestamp_deltas is not None else [0] * len(records)
    body = b"".join(encode_record(offset_delta, key, value, deltas[offset_delta],
                                  headers[offset_delta] if headers is not None else ())
                    for offset_delta, (key, value) in enumerate(records))
    if compression:
        body = compress(compression, body)
    batch = bytearray(pack_header(len(body), len(records), timestamp_ms, timestamp_ms + max(deltas),
                                  attributes=compression | (TRANSACTIONAL_BIT if transactional else 0),
                                  base_offset=base_offset,
                                  partition_leader_epoch=partition_leader_epoch, producer_id=producer_id,
                                  producer_epoch=producer_epoch, base_sequence=base_sequence))
    batch += body
    seal(batch)
    return bytes(batch)


class ControlType:
    """The type in a control record's key (Kafka's ControlRecordType)."""

    ABORT = 0
    COMMIT = 1


CONTROL_KEY = struct.Struct(">hh")  # version 0, type
CONTROL_VALUE = struct.Struct(">hi")  # version 0, coordinator epoch
# A control batch's one record: length, attributes, timestamp delta, offset delta, then key and value of fixed
# sizes (each a 1-byte varint length), header count: its key starts at this offset after the batch header.
CONTROL_KEY_AT = BATCH_HEADER_SIZE + 5


def build_control_batch(producer_id: int, producer_epoch: int, control_type: int, coordinator_epoch: int,
                        timestamp_ms: int, base_offset: int = 0) -> bytes:
    """A sealed transaction marker (COMMIT or ABORT) for one producer, in Kafka's on-disk format."""
    body = encode_record(0, CONTROL_KEY.pack(0, control_type), CONTROL_VALUE.pack(0, coordinator_epoch))
    batch = bytearray(pack_header(len(body), 1, timestamp_ms, timestamp_ms,
                                  attributes=TRANSACTIONAL_BIT | CONTROL_BIT, base_offset=base_offset,
                                  producer_id=producer_id, producer_epoch=producer_epoch))
    batch += body
    seal(batch)
    return bytes(batch)


def control_type(buf, header: BatchHeader | None = None) -> int | None:
    """The type (ControlType) of a control batch from its first CONTROL_KEY_AT + 4 bytes; None if the batch is
    not a control batch or its record is not a version-0 control key."""
    if header is None:
        header = parse_header(buf)
    if not header.attributes & CONTROL_BIT or len(buf) < CONTROL_KEY_AT + CONTROL_KEY.size:
        return None
    version, kind = CONTROL_KEY.unpack_from(buf, CONTROL_KEY_AT)
    if version != 0 or buf[CONTROL_KEY_AT - 1] != varint(CONTROL_KEY.size)[0]:
        return None
    return kind


def iter_records(buf, header: BatchHeader):
    """(offset, key, value) of each record of an uncompressed batch (None for a null key or value).
    Raises StorageError(CORRUPT_MESSAGE) on a compressed or malformed batch."""
    if header.compression != 0:
        raise StorageError(ErrorCode.CORRUPT_MESSAGE, "compressed batch where an uncompressed one was expected")
    if not records_can_fit(buf, header):
        raise StorageError(ErrorCode.CORRUPT_MESSAGE, f"{header.record_count} records cannot fit in {len(buf)} bytes")
    view = memoryview(buf)
    position = BATCH_HEADER_SIZE
    try:
        for _ in range(header.record_count):
            length, position = read_varint(view, position)
            record_end = position + length
            position += 1  # attributes
            _, position = read_varint(view, position)  # timestamp delta
            offset_delta, position = read_varint(view, position)
            fields = []
            for _ in range(2):
                size, position = read_varint(view, position)
                fields.append(None if size < 0 else bytes(view[position:position + size]))
                position += max(size, 0)
            yield header.base_offset + offset_delta, fields[0], fields[1]
            position = record_end
    except IndexError:
        raise StorageError(ErrorCode.CORRUPT_MESSAGE, "record batch ends inside a record") from None
