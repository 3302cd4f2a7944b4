"""Client-side raw Kafka protocol helpers for load generators (no Kafka client library).

Load generators use this to pre-encode v2 record batches and Produce/Fetch
requests, pipeline them over plain blocking sockets, and count fetched records
from batch headers, so that what gets measured is the broker, not a client.

Invariants:
- Record batches are magic v2, attributes 0 (no compression, create time),
  CRC-32C over attributes..end, baseOffset 0, producer id -1 unless given.
- Every request frame is size prefix + request header v1 (v2, with an empty
  tagged-field section, for flexible versions: ApiVersions >= 3) + body.
- Control requests (ApiVersions, Metadata, CreateTopics, ListOffsets,
  InitProducerId, Fetch) are encoded and their responses decoded with kio,
  Kafka's schemas as data; only the Produce request body and the Fetch
  response walk are written here, because load generators do them at
  high rate and the Fetch walk must not copy record data.
- ``RawConnection`` matches responses to requests by correlation id and
  raises ``RawProtocolError`` on any mismatch or short read; every blocking
  call is bounded by the socket timeout.

Import as ``from scripts.harness import rawkafka``.
"""

from __future__ import annotations

import datetime
import io
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import crc32c
from kio.index import load_payload_module
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
API_VERSIONS = 18
CREATE_TOPICS = 19
DELETE_TOPICS = 20
INIT_PRODUCER_ID = 22

DEFAULT_CLIENT_ID = "rawkafka"
DEFAULT_SOCKET_TIMEOUT_S = 30.0
_RECV_CHUNK = 1 << 20


class RawProtocolError(Exception):
    """The broker's bytes do not match what was asked (bad correlation id, short frame...)."""


# --------------------------------------------------------------------------- record batches

_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# firstTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount
BATCH_HEADER_SIZE = _BATCH_HEADER.size  # 61
_CRC_START = 21  # attributes onward are covered by the CRC
_LOG_OVERHEAD = 12  # baseOffset + batchLength precede what batchLength counts
_BATCH_RECORDS_COUNT_AT = 57
_BATCH_LAST_OFFSET_DELTA_AT = 23
_BATCH_MAGIC_AT = 16


def _zigzag_varint(value: int) -> bytes:
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_record(
    offset_delta: int,
    value: bytes | None,
    key: bytes | None = None,
    timestamp_delta: int = 0,
    headers: Sequence[tuple[str, bytes | None]] = (),
) -> bytes:
    """One v2 record (length-prefixed), as it appears inside a batch."""
    body = bytearray(b"\x00")  # record attributes, unused
    body += _zigzag_varint(timestamp_delta)
    body += _zigzag_varint(offset_delta)
    for blob in (key, value):
        if blob is None:
            body += _zigzag_varint(-1)
        else:
            body += _zigzag_varint(len(blob))
            body += blob
    body += _zigzag_varint(len(headers))
    for name, hvalue in headers:
        raw = name.encode("utf-8")
        body += _zigzag_varint(len(raw)) + raw
        body += _zigzag_varint(-1) if hvalue is None else _zigzag_varint(len(hvalue)) + hvalue
    return _zigzag_varint(len(body)) + bytes(body)


def build_record_batch(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    *,
    first_timestamp_ms: int | None = None,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
) -> bytes:
    """A magic v2 record batch holding one record per value (attributes 0, CRC-32C set)."""
    if not values:
        raise ValueError("a record batch needs at least one record")
    if first_timestamp_ms is None:
        first_timestamp_ms = int(time.time() * 1000)
    records = b"".join(
        encode_record(i, v, None if keys is None else keys[i]) for i, v in enumerate(values)
    )
    count = len(values)
    header = bytearray(
        _BATCH_HEADER.pack(
            base_offset,
            BATCH_HEADER_SIZE - _LOG_OVERHEAD + len(records),
            partition_leader_epoch,
            2,
            0,
            0,
            count - 1,
            first_timestamp_ms,
            first_timestamp_ms,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
    )
    batch = header + records
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[_CRC_START:])))
    return bytes(batch)


def make_batch(record_count: int, record_size: int, **kwargs: Any) -> bytes:
    """A batch of ``record_count`` records whose values are ``record_size`` bytes each."""
    value = bytes((i % 251 for i in range(record_size)))
    return build_record_batch([value] * record_count, **kwargs)


def records_for_batch_bytes(batch_bytes: int, record_size: int) -> int:
    """How many ``record_size`` records fit a batch of about ``batch_bytes`` (at least one)."""
    per_record = len(encode_record(0, bytes(record_size)))
    return max(1, (batch_bytes - BATCH_HEADER_SIZE) // per_record)


@dataclass(slots=True)
class BatchInfo:
    base_offset: int
    record_count: int
    next_offset: int  # base offset + lastOffsetDelta + 1
    size: int  # whole batch bytes, log overhead included


def iter_batches(records: memoryview | bytes) -> Iterable[BatchInfo]:
    """Whole batches in a record set, from their headers only (a trailing partial batch is skipped)."""
    view = memoryview(records)
    pos, end = 0, len(view)
    while end - pos >= BATCH_HEADER_SIZE:
        base_offset, batch_length = struct.unpack_from(">qi", view, pos)
        size = _LOG_OVERHEAD + batch_length
        if batch_length < BATCH_HEADER_SIZE - _LOG_OVERHEAD or pos + size > end:
            return
        if view[pos + _BATCH_MAGIC_AT] != 2:
            raise RawProtocolError(f"batch at {pos} has magic {view[pos + _BATCH_MAGIC_AT]}, not 2")
        (last_delta,) = struct.unpack_from(">i", view, pos + _BATCH_LAST_OFFSET_DELTA_AT)
        (count,) = struct.unpack_from(">i", view, pos + _BATCH_RECORDS_COUNT_AT)
        yield BatchInfo(base_offset, count, base_offset + last_delta + 1, size)
        pos += size


# --------------------------------------------------------------------------- request frames

_HEADER_V1 = struct.Struct(">ihhih")  # size, api_key, api_version, correlation_id, client_id length


def _is_flexible_request(api_key: int, version: int) -> bool:
    return api_key == API_VERSIONS and version >= 3


def encode_request(
    api_key: int, version: int, correlation_id: int, body: bytes, client_id: str | None = DEFAULT_CLIENT_ID
) -> bytes:
    """A whole request frame: size prefix, header v1 (v2 when flexible) and body."""
    cid = b"" if client_id is None else client_id.encode("utf-8")
    tags = b"\x00" if _is_flexible_request(api_key, version) else b""
    size = _HEADER_V1.size - 4 + len(cid) + len(tags) + len(body)
    head = _HEADER_V1.pack(size, api_key, version, correlation_id, -1 if client_id is None else len(cid))
    return b"".join((head, cid, tags, body))


def with_correlation_id(frame: bytes | bytearray, correlation_id: int) -> bytearray:
    """A copy of a pre-encoded request frame with another correlation id."""
    out = bytearray(frame)
    struct.pack_into(">i", out, 8, correlation_id)
    return out


def _kio_body(api_key: int, version: int, request: Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(request))(buffer, request)
    return buffer.getvalue()


def request_schema(api_key: int, version: int) -> Any:
    return load_payload_module(api_key, version, EntityType.request)


def decode_response(api_key: int, version: int, body: bytes | memoryview) -> Any:
    """Decode a response body (after the correlation id) with kio."""
    module = load_payload_module(api_key, version, EntityType.response)
    cls = next(v for v in vars(module).values() if getattr(v, "__type__", None) == EntityType.response)
    value, size = entity_reader(cls)(body, 0)
    if size != len(body):
        raise RawProtocolError(f"api {api_key} v{version}: {len(body) - size} trailing response bytes")
    return value


def _ms(ms: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


def api_versions_body(version: int = 3) -> bytes:
    schema = request_schema(API_VERSIONS, version)
    if version >= 3:
        req = schema.ApiVersionsRequest(client_software_name="rawkafka", client_software_version="1.0")
    else:
        req = schema.ApiVersionsRequest()
    return _kio_body(API_VERSIONS, version, req)


def metadata_body(topics: Sequence[str] | None, version: int = 8, allow_auto_topic_creation: bool = True) -> bytes:
    """Metadata request; ``topics=None`` asks for every topic."""
    schema = request_schema(METADATA, version)
    fields: dict[str, Any] = {
        "topics": None if topics is None else tuple(schema.MetadataRequestTopic(name=t) for t in topics)
    }
    if version >= 4:
        fields["allow_auto_topic_creation"] = allow_auto_topic_creation
    if version >= 8:
        fields["include_cluster_authorized_operations"] = False
        fields["include_topic_authorized_operations"] = False
    return _kio_body(METADATA, version, schema.MetadataRequest(**fields))


def create_topics_body(
    topics: dict[str, int], replication_factor: int = 1, timeout_ms: int = 30000, version: int = 4,
    validate_only: bool = False, configs: dict[str, str | None] | None = None,
) -> bytes:
    """CreateTopics (version 2-4 via kio) for {name: partition count}, each with the same `configs`."""
    schema = request_schema(CREATE_TOPICS, version)
    entries = tuple(schema.CreatableTopicConfig(name=key, value=value) for key, value in (configs or {}).items())
    creatable = tuple(
        schema.CreatableTopic(
            name=name,
            num_partitions=i32(count),
            replication_factor=i16(replication_factor),
            assignments=(),
            configs=entries,
        )
        for name, count in topics.items()
    )
    req = schema.CreateTopicsRequest(topics=creatable, timeout=_ms(timeout_ms), validate_only=validate_only)
    return _kio_body(CREATE_TOPICS, version, req)


def delete_topics_body(names: Sequence[str], timeout_ms: int = 30000, version: int = 3) -> bytes:
    """DeleteTopics (version 0-3: by name, not flexible) via kio."""
    schema = request_schema(DELETE_TOPICS, version)
    return _kio_body(DELETE_TOPICS, version, schema.DeleteTopicsRequest(topic_names=tuple(names),
                                                                       timeout=_ms(timeout_ms)))


def list_offsets_body(partitions: dict[str, Sequence[int]], timestamp: int = -1, version: int = 5) -> bytes:
    """ListOffsets for every given partition at ``timestamp`` (-1 latest, -2 earliest)."""
    schema = request_schema(LIST_OFFSETS, version)
    topics = tuple(
        schema.ListOffsetsTopic(
            name=name,
            partitions=tuple(
                schema.ListOffsetsPartition(
                    partition_index=i32(p),
                    **({"current_leader_epoch": i32(-1)} if version >= 4 else {}),
                    timestamp=i64(timestamp),
                )
                for p in parts
            ),
        )
        for name, parts in partitions.items()
    )
    fields: dict[str, Any] = {"replica_id": i32(-1), "topics": topics}
    if version >= 2:
        fields["isolation_level"] = i8(0)
    return _kio_body(LIST_OFFSETS, version, schema.ListOffsetsRequest(**fields))


_PRODUCE_HEAD = struct.Struct(">hhii")  # transactional_id=-1 (null), acks, timeout_ms, topic count


def produce_body(topic_data: dict[str, dict[int, bytes]], acks: int = 1, timeout_ms: int = 30000) -> bytes:
    """Produce v3-8 request body (same layout in all those versions), non-transactional."""
    parts = [_PRODUCE_HEAD.pack(-1, acks, timeout_ms, len(topic_data))]
    for topic, partitions in topic_data.items():
        name = topic.encode("utf-8")
        parts.append(struct.pack(">h", len(name)) + name + struct.pack(">i", len(partitions)))
        for partition, batch in partitions.items():
            parts.append(struct.pack(">ii", partition, len(batch)))
            parts.append(batch)
    return b"".join(parts)


def produce_request(
    topic: str,
    partition: int,
    batch: bytes,
    acks: int = 1,
    timeout_ms: int = 30000,
    correlation_id: int = 0,
    version: int = 8,
) -> bytes:
    """A whole Produce request frame for one batch to one partition."""
    body = produce_body({topic: {partition: batch}}, acks, timeout_ms)
    return encode_request(PRODUCE, version, correlation_id, body)


def fetch_body(
    offsets: dict[str, dict[int, int]],
    *,
    max_wait_ms: int = 500,
    min_bytes: int = 1,
    max_bytes: int = 50 * 1024 * 1024,
    partition_max_bytes: int = 1024 * 1024,
    isolation_level: int = 0,
    version: int = 11,
) -> bytes:
    """Fetch v4-11 request body for {topic: {partition: fetch offset}} (session 0, no rack)."""
    schema = request_schema(FETCH, version)
    topics = []
    for topic, parts in offsets.items():
        partitions = []
        for p, offset in parts.items():
            pf: dict[str, Any] = {
                "partition": i32(p),
                "fetch_offset": i64(offset),
                "partition_max_bytes": i32(partition_max_bytes),
            }
            if version >= 9:
                pf["current_leader_epoch"] = i32(-1)
            if version >= 5:
                pf["log_start_offset"] = i64(-1)
            partitions.append(schema.FetchPartition(**pf))
        topics.append(schema.FetchTopic(topic=topic, partitions=tuple(partitions)))
    fields: dict[str, Any] = {
        "replica_id": i32(-1),
        "max_wait": _ms(max_wait_ms),
        "min_bytes": i32(min_bytes),
        "max_bytes": i32(max_bytes),
        "isolation_level": i8(isolation_level),
        "topics": tuple(topics),
    }
    if version >= 7:
        fields.update(session_id=i32(0), session_epoch=i32(-1), forgotten_topics_data=())
    if version >= 11:
        fields["rack_id"] = ""
    return _kio_body(FETCH, version, schema.FetchRequest(**fields))


# --------------------------------------------------------------------------- fetch responses


@dataclass(slots=True)
class FetchedPartition:
    topic: str
    partition: int
    error_code: int
    high_watermark: int
    record_count: int = 0
    batch_count: int = 0
    next_offset: int | None = None  # None: no whole batch came back
    records_bytes: int = 0


@dataclass(slots=True)
class FetchResult:
    throttle_time_ms: int
    error_code: int
    session_id: int
    partitions: list[FetchedPartition] = field(default_factory=list)

    @property
    def record_count(self) -> int:
        return sum(p.record_count for p in self.partitions)


class _Cursor:
    __slots__ = ("view", "pos")

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0

    def take(self, fmt: struct.Struct) -> tuple:
        if self.pos + fmt.size > len(self.view):
            raise RawProtocolError("fetch response truncated")
        values = fmt.unpack_from(self.view, self.pos)
        self.pos += fmt.size
        return values

    def skip(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.view):
            raise RawProtocolError("fetch response truncated")
        out = self.view[self.pos : self.pos + n]
        self.pos += n
        return out


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I16I32 = struct.Struct(">hi")
_PART_V4 = struct.Struct(">ihqq")  # partition, error, high watermark, last stable offset
_I64 = struct.Struct(">q")
_ABORTED = struct.Struct(">qq")


def parse_fetch_response(version: int, body: bytes | memoryview) -> FetchResult:
    """Walk a Fetch v4-11 response body (after the correlation id): per-partition counts
    from batch headers, without copying record data."""
    cur = _Cursor(memoryview(body))
    throttle = cur.take(_I32)[0]
    error_code = session_id = 0
    if version >= 7:
        error_code, session_id = cur.take(_I16I32)
    result = FetchResult(throttle, error_code, session_id)
    (topic_count,) = cur.take(_I32)
    for _ in range(topic_count):
        (name_len,) = cur.take(_I16)
        topic = str(cur.skip(name_len), "utf-8")
        (part_count,) = cur.take(_I32)
        for _ in range(part_count):
            partition, err, hwm, _lso = cur.take(_PART_V4)
            if version >= 5:
                cur.take(_I64)  # log start offset
            (aborted,) = cur.take(_I32)
            for _ in range(max(aborted, 0)):
                cur.take(_ABORTED)
            if version >= 11:
                cur.take(_I32)  # preferred read replica
            (records_len,) = cur.take(_I32)
            fetched = FetchedPartition(topic, partition, err, hwm)
            if records_len > 0:
                records = cur.skip(records_len)
                fetched.records_bytes = records_len
                for batch in iter_batches(records):
                    fetched.record_count += batch.record_count
                    fetched.batch_count += 1
                    fetched.next_offset = batch.next_offset
            result.partitions.append(fetched)
    if cur.pos != len(cur.view):
        raise RawProtocolError(f"{len(cur.view) - cur.pos} trailing bytes in fetch response")
    return result


# --------------------------------------------------------------------------- connection


class RawConnection:
    """A blocking connection that pipelines requests and reads responses in order."""

    def __init__(
        self,
        host: str,
        port: int,
        timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
        client_id: str | None = DEFAULT_CLIENT_ID,
    ) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client_id = client_id
        self._next_correlation_id = 0
        self._inflight: list[tuple[int, int, int]] = []  # (correlation id, api key, version), in order
        self._inbuf = bytearray()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def _take_correlation_id(self) -> int:
        cid = self._next_correlation_id
        self._next_correlation_id = (cid + 1) & 0x7FFFFFFF
        return cid

    def send(self, api_key: int, version: int, body: bytes, expect_response: bool = True) -> int:
        """Send one request; returns its correlation id. Use expect_response=False for acks=0 produce."""
        cid = self._take_correlation_id()
        self.sock.sendall(encode_request(api_key, version, cid, body, self.client_id))
        if expect_response:
            self._inflight.append((cid, api_key, version))
        return cid

    def send_frames(self, frames: Sequence[tuple[int, int, bytes | bytearray]]) -> list[int]:
        """Send pre-encoded frames (api_key, version, frame) in one write, renumbering their
        correlation ids; every one must expect a response."""
        out = bytearray()
        cids = []
        for api_key, version, frame in frames:
            cid = self._take_correlation_id()
            start = len(out)
            out += frame
            struct.pack_into(">i", out, start + 8, cid)
            self._inflight.append((cid, api_key, version))
            cids.append(cid)
        self.sock.sendall(out)
        return cids

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def _recv_more(self) -> None:
        chunk = self.sock.recv(_RECV_CHUNK)
        if not chunk:
            raise RawProtocolError("broker closed the connection")
        self._inbuf += chunk

    def _read_exact_frame(self) -> memoryview:
        buf = self._inbuf
        while len(buf) < 4:
            self._recv_more()
        (size,) = _I32.unpack_from(buf, 0)
        if size < 4:
            raise RawProtocolError(f"response size {size}")
        if len(buf) >= 4 + size:
            frame = bytes(buf[4 : 4 + size])
            del buf[: 4 + size]
            return memoryview(frame)
        # A large response (a fetch): read the rest straight into its own buffer, exactly,
        # so nothing is copied twice and nothing of the next response is consumed.
        frame = bytearray(size)
        have = len(buf) - 4
        frame[:have] = buf[4:]
        buf.clear()
        view = memoryview(frame)
        while have < size:
            n = self.sock.recv_into(view[have:])
            if n == 0:
                raise RawProtocolError("broker closed the connection mid-response")
            have += n
        return view

    def recv_response(self) -> tuple[int, int, int, memoryview]:
        """The next response: (correlation id, api key, version, body after the header)."""
        if not self._inflight:
            raise RawProtocolError("no request in flight")
        frame = self._read_exact_frame()
        (cid,) = _I32.unpack_from(frame, 0)
        expected, api_key, version = self._inflight.pop(0)
        if cid != expected:
            raise RawProtocolError(f"correlation id {cid}, expected {expected}")
        return cid, api_key, version, frame[4:]

    def request(self, api_key: int, version: int, body: bytes) -> memoryview:
        """One request, waiting for its response body (earlier in-flight responses are consumed first)."""
        cid = self.send(api_key, version, body)
        while True:
            got, _, _, resp = self.recv_response()
            if got == cid:
                return resp

    def call(self, api_key: int, version: int, body: bytes) -> Any:
        """One request, response decoded by kio."""
        return decode_response(api_key, version, self.request(api_key, version, body))
