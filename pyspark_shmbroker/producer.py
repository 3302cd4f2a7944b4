"""Writing records: Arrow columns encoded into v2 record batches, and the idempotent producer that
sends them.

Encoding (``encode_partition``, given one partition's rows: writer.py groups them with Arrow's take) is
vectorised: every record's varint fields are written for all records at once into a byte matrix, one
column per varint byte (``varint_column``), and Arrow's C++ ``binary_join_element_wise`` lays out prefix,
key, value length, value and headers of every record back to back, so the record bytes of a whole
partition come out of one call; they are cut into batches of at most ``kafka.batch.size`` bytes (record
offset deltas restart at 0 in each), compressed if asked (node.storage.compression), each behind a header of
node.storage.records' layout.

``murmur2`` is Kafka's default partitioner's hash (the Java client's, so a key lands where Kafka clients
put it), vectorised over the keys; writer.py routes with it.

The producer (``IdempotentProducer``) is Kafka's idempotent producer: InitProducerId gives a producer id
and epoch; each partition's batches carry consecutive sequence numbers; up to
``max.in.flight.requests.per.connection`` (<= 5, what the node remembers per producer) requests are in
flight, each carrying at most one batch per partition. A retriable error or a broken connection makes
it resend every unacknowledged batch, in order, with the same sequence numbers, so the node writes each
batch once. Should the node forget the producer (UNKNOWN_PRODUCER_ID), a new producer id is taken and the
unacknowledged batches are stamped again: then a batch may be written twice, never lost (at least once).

Invariants:
- A batch is acknowledged only by the node's answer (acks=all: once it is on disk); ``flush`` returns
  only when every batch given to the producer is acknowledged, and raises otherwise.
- Within a partition, batches are sent and written in the order they were added.
- Every wait is bounded: by kafka.request.timeout.ms per answer and kafka.delivery.timeout.ms per batch.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from pyspark_shmbroker import dependencies  # noqa: F401  (first: without them, an error saying what to do)
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from kio.schema.errors import ErrorCode

from shmbroker.node.storage import compression
from shmbroker.node.storage.records import BATCH_HEADER_SIZE, NO_PARTITION_LEADER_EPOCH, pack_header, set_producer
from pyspark_shmbroker.options import ProducerSettings
from shmbroker.clients.wire import (
    BrokerError,
    Connection,
    NodeUnavailable,
    TopicPartition,
    init_producer_id_request,
    produce_request,
    topic_partitions,
)

log = logging.getLogger("pyspark_shmbroker")
CODECS = {"none": compression.NONE, "gzip": compression.GZIP, "snappy": compression.SNAPPY, "lz4": compression.LZ4,
          "zstd": compression.ZSTD}
_JOIN = pc.JoinOptions(null_handling="replace", null_replacement="")
# A record's fixed bytes besides its varints: attributes (1) and timestamp delta 0 (1).
_MAX_VARINT_BYTES = 5
_RECORD_FIXED = 2


class WriteError(RuntimeError):
    """Rows that cannot be written: bad columns, an unknown topic or partition, a refused batch."""


# --------------------------------------------------------------------------- partitioning


def murmur2(keys: pa.Array) -> np.ndarray:
    """Kafka's murmur2 hash (seed 0x9747b28c) of each key of a binary array, as uint32, vectorised:
    one pass per 4-byte word over the keys that are still that long."""
    m = np.uint32(0x5BD1E995)
    starts, lengths, data = _binary_layout(keys)
    n = len(lengths)
    h = np.uint32(0x9747B28C) ^ lengths.astype(np.uint32)
    padded = np.concatenate([data, np.zeros(8, dtype=np.uint8)])
    words = np.ndarray(shape=(len(padded) - 3,), dtype="<u4", buffer=padded, strides=(1,))
    full = lengths // 4
    with np.errstate(over="ignore"):
        for word in range(int(full.max()) if n else 0):
            rows = np.nonzero(full > word)[0]
            k = words[starts[rows] + 4 * word]
            k = k * m
            k ^= k >> np.uint32(24)
            k = k * m
            h[rows] = (h[rows] * m) ^ k
        tail = lengths % 4
        base = starts + 4 * full
        for count, shift in ((3, 16), (2, 8)):
            rows = np.nonzero(tail >= count)[0]
            h[rows] ^= padded[base[rows] + (count - 1)].astype(np.uint32) << np.uint32(shift)
        rows = np.nonzero(tail >= 1)[0]
        h[rows] ^= padded[base[rows]].astype(np.uint32)
        h[rows] = h[rows] * m
        h ^= h >> np.uint32(13)
        h = h * m
        h ^= h >> np.uint32(15)
    return h


def _binary_layout(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, lengths, data) of a binary or string array (nulls have length 0)."""
    if pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type):
        array = array.cast(pa.binary())
    elif pa.types.is_string(array.type):
        array = array.view(pa.binary())
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[array.offset : array.offset + len(array) + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1].astype(np.int64)
    lengths = np.diff(offsets).astype(np.int64)
    return starts, lengths, data


# --------------------------------------------------------------------------- varints


def _zigzag_widths(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag encoding (as uint64) and varint width in bytes of each value."""
    unsigned = ((values << 1) ^ (values >> 63)).view(np.uint64)
    widths = np.ones(len(values), dtype=np.int64)
    largest = int(unsigned.max()) if len(values) else 0
    for bits in range(7, 64, 7):
        if largest < 1 << bits:
            break
        widths += unsigned >= np.uint64(1 << bits)
    return unsigned, widths


def varint_column(*fields: np.ndarray | int) -> tuple[pa.Array, np.ndarray]:
    """Per row, the zigzag varints of `fields` (int64 arrays, or ints meaning a constant) one after the
    other: a binary array, and each row's byte count. Each field gets a slot as wide as its widest
    varint in a (rows x slots) byte matrix, written column by column; a mask of the bytes each row
    really uses then compresses the matrix row by row into the array's data."""
    n = len(next(f for f in fields if isinstance(f, np.ndarray)))
    encoded = [_zigzag_widths(f if isinstance(f, np.ndarray) else np.full(n, f, dtype=np.int64)) for f in fields]
    slots = [int(widths.max()) if n else 1 for _, widths in encoded]
    matrix = np.empty((n, sum(slots)), dtype=np.uint8)
    used = np.empty((n, sum(slots)), dtype=bool)
    column = 0
    for (unsigned, widths), slot in zip(encoded, slots):
        for k in range(slot):
            byte = ((unsigned >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
            if k + 1 < slot:
                byte |= (widths > k + 1).astype(np.uint8) << 7
            matrix[:, column] = byte
            used[:, column] = widths > k
            column += 1
    total = sum(widths for _, widths in encoded)
    data = matrix[used]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(total, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]), total


# --------------------------------------------------------------------------- batches


@dataclass
class EncodedBatch:
    tp: TopicPartition
    records: int
    data: bytearray  # the whole batch; the producer stamps its producer fields and seals it (set_producer)
    created: float = field(default_factory=time.monotonic)


def _lengths(array: pa.Array | None, n: int) -> np.ndarray:
    """Byte length of each value, -1 for null (and for every row when the column is absent)."""
    if array is None:
        return np.full(n, -1, dtype=np.int64)
    _, lengths, _ = _binary_layout(array)
    if array.null_count:
        lengths = np.where(np.asarray(array.is_valid()), lengths, -1)
    return lengths


def _as_binary(array: pa.Array | None) -> pa.Array | None:
    if array is None:
        return None
    if pa.types.is_string(array.type):
        return array.view(pa.binary())
    if not pa.types.is_binary(array.type):
        return array.cast(pa.binary())
    return array


def _headers_column(headers: pa.Array | None, n: int) -> tuple[pa.Array | None, np.ndarray, np.ndarray]:
    """Per row: the encoded headers (without their count), the header count and their byte count."""
    if headers is None or headers.null_count == n:
        return None, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    if headers.null_count:
        headers = headers.fill_null(pa.scalar([], type=headers.type))
    headers = headers.cast(pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    counts = np.asarray(pc.list_value_length(headers).fill_null(0), dtype=np.int64)
    entries = pc.list_flatten(headers)
    keys = entries.field("key")
    if keys.null_count:
        raise WriteError("a header has a null key (header keys are required strings)")
    values = _as_binary(entries.field("value"))
    key_lengths, value_lengths = _lengths(keys, len(entries)), _lengths(values, len(entries))
    key_prefix, key_prefix_bytes = varint_column(key_lengths)
    value_prefix, value_prefix_bytes = varint_column(value_lengths)
    joined = pc.binary_join_element_wise(key_prefix, _as_binary(keys), value_prefix, values, b"", options=_JOIN)
    per_entry = key_prefix_bytes + key_lengths + value_prefix_bytes + np.maximum(value_lengths, 0)
    list_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    per_row = pc.binary_join(pa.ListArray.from_arrays(pa.array(list_offsets), joined), b"")
    per_row_bytes = np.add.reduceat(np.concatenate([per_entry, [0]]), list_offsets[:-1]) * (counts > 0)
    return per_row, counts, per_row_bytes


def encode_partition(tp: TopicPartition, keys: pa.Array | None, values: pa.Array, headers: pa.Array | None,
                     batch_bytes: int, codec: int, timestamp_ms: int) -> list[EncodedBatch]:
    """The rows of one partition as v2 batches of at most `batch_bytes` each (a single larger record gets
    a batch of its own), in row order."""
    n = len(values)
    keys, values = _as_binary(keys), _as_binary(values)
    key_lengths, value_lengths = _lengths(keys, n), _lengths(values, n)
    header_blob, header_counts, header_bytes = _headers_column(headers, n)
    # Cut into batches with an upper bound of each record's size (its offset delta is not known yet).
    bound = (_RECORD_FIXED + 4 * _MAX_VARINT_BYTES + np.maximum(key_lengths, 0) + np.maximum(value_lengths, 0)
             + header_bytes)
    limit = max(1, batch_bytes - BATCH_HEADER_SIZE)
    cuts = [0]
    total = np.cumsum(bound)
    while cuts[-1] < n:
        start = cuts[-1]
        used = total[start - 1] if start else 0
        stop = int(np.searchsorted(total, used + limit, side="right"))
        cuts.append(max(stop, start + 1))
    cuts_array = np.array(cuts, dtype=np.int64)
    index = np.arange(n, dtype=np.int64)
    offset_delta = index - np.repeat(cuts_array[:-1], np.diff(cuts_array))
    body = (_RECORD_FIXED + _zigzag_widths(offset_delta)[1] + _zigzag_widths(key_lengths)[1]
            + np.maximum(key_lengths, 0) + _zigzag_widths(value_lengths)[1] + np.maximum(value_lengths, 0)
            + _zigzag_widths(header_counts)[1] + header_bytes)
    prefix, _ = varint_column(body, 0, 0, offset_delta, key_lengths)  # attributes and timestamp delta are 0
    middle, _ = varint_column(value_lengths)
    suffix, _ = varint_column(header_counts)
    pieces = [prefix, keys if keys is not None else pa.nulls(n, pa.binary()), middle, values, suffix]
    if header_blob is not None:
        pieces.append(header_blob)
    joined = pc.binary_join_element_wise(*pieces, b"", options=_JOIN)
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32)[joined.offset : joined.offset + n + 1]
    data = memoryview(joined.buffers()[2])
    batches = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        records = data[offsets[lo] : offsets[hi]]
        if codec:
            records = compression.compress(codec, records)
        batch = bytearray(pack_header(len(records), hi - lo, timestamp_ms, timestamp_ms, attributes=codec,
                                      partition_leader_epoch=NO_PARTITION_LEADER_EPOCH))
        batch += records
        batches.append(EncodedBatch(tp, hi - lo, batch))
    return batches


# --------------------------------------------------------------------------- producer


@dataclass
class _PartitionQueue:
    next_sequence: int = 0
    unacked: deque = field(default_factory=deque)  # EncodedBatch, in sequence order
    sent: int = 0  # how many of unacked (from the left) are in flight
    acked_records: int = 0
    first_offset: int | None = None
    last_offset: int | None = None


class IdempotentProducer:
    """Sends EncodedBatches with Kafka's idempotent producer protocol; see the module docstring."""

    RETRIABLE_PRODUCE_ERRORS = frozenset({
        ErrorCode.request_timed_out, ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available,
        ErrorCode.not_enough_replicas, ErrorCode.not_enough_replicas_after_append, ErrorCode.corrupt_message,
        ErrorCode.network_exception, ErrorCode.kafka_storage_error, ErrorCode.out_of_order_sequence_number,
        ErrorCode.unknown_server_error, ErrorCode.throttling_quota_exceeded,
    })

    def __init__(self, settings: ProducerSettings, buffer_bytes: int = 32 * 1024 * 1024) -> None:
        self.settings = settings
        self.buffer_bytes = buffer_bytes  # Kafka's buffer.memory: add() waits while more is unacknowledged
        self.queues: dict[TopicPartition, _PartitionQueue] = {}
        self.inflight: deque[dict[TopicPartition, EncodedBatch]] = deque()
        self.unacked_bytes = 0
        self.partition_counts: dict[str, int] = {}
        self.conn: Connection | None = None
        self.resend = False  # an error asked for every unacknowledged batch to go again
        self.reconnects = 0
        self.producer_id, self.epoch = -1, -1
        self._connect()
        self._init_producer_id()

    # -- connection and producer id

    def _connect(self) -> None:
        settings = self.settings
        self.conn = Connection(settings.servers, settings.request_timeout_ms / 1000 + 5, settings.client_id)

    def _reconnect(self, why: Exception) -> None:
        """A new connection after a failure, retried until the oldest unacknowledged batch's delivery
        timeout; what was in flight is unknown, so everything unacknowledged goes again."""
        log.warning("shmbroker producer: %s; reconnecting and resending unacknowledged batches", why)
        self.reconnects += 1
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.inflight.clear()
        for queue in self.queues.values():
            queue.sent = 0
        while True:
            self._check_delivery_timeout(why)
            time.sleep(self.settings.retry_backoff_ms / 1000)
            try:
                self._connect()
                return
            except (NodeUnavailable, OSError) as exc:
                why = exc

    def _init_producer_id(self) -> None:
        deadline = time.monotonic() + self.settings.delivery_timeout_ms / 1000
        while True:
            try:
                answer = self.conn.call(init_producer_id_request())  # type: ignore[union-attr]
            except NodeUnavailable as exc:
                if time.monotonic() > deadline:
                    raise
                self._reconnect(exc)
                continue
            if answer.error_code == ErrorCode.none:
                self.producer_id, self.epoch = int(answer.producer_id), int(answer.producer_epoch)
                return
            error = BrokerError(answer.error_code, "InitProducerId")
            if not error.retriable or time.monotonic() > deadline:
                raise error
            time.sleep(self.settings.retry_backoff_ms / 1000)

    def partitions_of(self, topic: str) -> int:
        """The topic's partition count (the node creates the topic here if it creates topics on demand)."""
        count = self.partition_counts.get(topic)
        if count is None:
            found = topic_partitions(self.conn, [topic], allow_auto_topic_creation=True)  # type: ignore[arg-type]
            if topic not in found:
                raise WriteError(f"topic {topic!r} does not exist and the node does not create topics on demand "
                                 "(its [topics] auto_create_topics is false): create it first")
            count = self.partition_counts[topic] = found[topic]
        return count

    # -- sending

    def add(self, batches: Iterable[EncodedBatch]) -> None:
        """Queue batches (each partition's in order) and send what the in-flight window allows; waits
        while more than buffer_bytes are unacknowledged."""
        for batch in batches:
            queue = self.queues.setdefault(batch.tp, _PartitionQueue())
            set_producer(batch.data, self.producer_id, self.epoch, queue.next_sequence)
            queue.next_sequence += batch.records
            queue.unacked.append(batch)
            self.unacked_bytes += len(batch.data)
            self._pump(block=False)
        while self.unacked_bytes > self.buffer_bytes:
            self._pump(block=True)

    def flush(self) -> None:
        """Return once every added batch is acknowledged."""
        while any(q.unacked for q in self.queues.values()):
            self._pump(block=True)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _pump(self, block: bool) -> None:
        """Send while the window has room (not while a resend waits for the window to drain), then read
        one answer if `block` or if the window is full."""
        try:
            if self.resend and not self.inflight:
                self.resend = False
                for queue in self.queues.values():
                    queue.sent = 0
            while not self.resend and len(self.inflight) < self.settings.max_in_flight and self._send_next():
                pass
            if self.inflight and (block or len(self.inflight) >= self.settings.max_in_flight):
                self._receive()
        except NodeUnavailable as exc:
            self._reconnect(exc)

    def _send_next(self) -> bool:
        request: dict[TopicPartition, EncodedBatch] = {}
        size = 0
        for tp, queue in self.queues.items():
            if queue.sent < len(queue.unacked):
                batch = queue.unacked[queue.sent]
                if request and size + len(batch.data) > self.settings.max_request_bytes:
                    continue
                request[tp] = batch
                size += len(batch.data)
        if not request:
            return False
        self.conn.send(produce_request({tp: memoryview(b.data) for tp, b in request.items()}, self.settings.acks,
                                       self.settings.request_timeout_ms))  # type: ignore[union-attr]
        for tp in request:
            self.queues[tp].sent += 1
        self.inflight.append(request)
        return True

    def _receive(self) -> None:
        answer = self.conn.receive()  # type: ignore[union-attr]
        request = self.inflight.popleft()
        results = {TopicPartition(t.name, int(p.index)): p for t in answer.responses for p in t.partition_responses}
        for tp, batch in request.items():
            queue = self.queues[tp]
            queue.sent -= 1
            result = results.get(tp)
            code = result.error_code if result is not None else ErrorCode.unknown_server_error
            if code in (ErrorCode.none, ErrorCode.duplicate_sequence_number):
                if queue.unacked and queue.unacked[0] is batch:
                    queue.unacked.popleft()
                    self.unacked_bytes -= len(batch.data)
                    queue.acked_records += batch.records
                    if code == ErrorCode.none and result is not None and int(result.base_offset) >= 0:
                        base = int(result.base_offset)
                        queue.first_offset = base if queue.first_offset is None else queue.first_offset
                        queue.last_offset = base + batch.records - 1
                continue
            message = getattr(result, "error_message", None)
            if code == ErrorCode.unknown_topic_or_partition:
                raise WriteError(f"topic-partition {tp} does not exist on the node (the node does not create "
                                 "topics on demand, or the partition number is too large)")
            if code == ErrorCode.unknown_producer_id:
                self._new_producer_id()
                return
            if code in self.RETRIABLE_PRODUCE_ERRORS:
                self._check_delivery_timeout(BrokerError(code, f"Produce to {tp}", message))
                self.resend = True
                continue
            raise WriteError(str(BrokerError(code, f"Produce of {batch.records} records to {tp}", message)))
        if self.resend:
            time.sleep(self.settings.retry_backoff_ms / 1000)

    def _new_producer_id(self) -> None:
        """The node forgot this producer: a new id, every unacknowledged batch stamped again (a batch the
        node did write before may now be written twice: at least once, never lost)."""
        log.warning("shmbroker producer: the node no longer knows producer id %d; taking a new one",
                    self.producer_id)
        while self.inflight:  # what is still in flight is resent anyway
            self.inflight.popleft()
            self.conn.receive()  # type: ignore[union-attr]
        self._init_producer_id()
        for queue in self.queues.values():
            queue.sent = 0
            queue.next_sequence = 0
            for batch in queue.unacked:
                set_producer(batch.data, self.producer_id, self.epoch, queue.next_sequence)
                queue.next_sequence += batch.records

    def _check_delivery_timeout(self, why: Exception) -> None:
        oldest = min((q.unacked[0].created for q in self.queues.values() if q.unacked), default=None)
        if oldest is not None and time.monotonic() - oldest > self.settings.delivery_timeout_ms / 1000:
            raise WriteError(f"records not acknowledged within kafka.delivery.timeout.ms "
                             f"({self.settings.delivery_timeout_ms} ms); last error: {why}")

    def written(self) -> dict[TopicPartition, tuple[int, int | None, int | None]]:
        """{tp: (records acknowledged, first offset, last offset)} so far."""
        return {tp: (q.acked_records, q.first_offset, q.last_offset) for tp, q in self.queues.items()
                if q.acked_records}

