"""Client-side raw Kafka protocol helpers for load generators (no Kafka client library).

Load generators use this to pre-encode v2 record batches and Produce/Fetch
requests, pipeline them over plain blocking sockets, and count fetched records
from batch headers, so that what gets measured is the broker, not a client.

Invariants:
- Record batches are built by node.storage.records (the one codec of the
  format), as a client sends them: attributes 0 unless compressed, partition
  leader epoch -1, producer id -1 unless given.
- Requests are encoded, and responses decoded, through the Spark connector's
  wire module (kio entities of any version, one frame header, one Fetch walk);
  only the Produce request body is written here, because load generators build
  many and it must not copy the batches through kio.
- ``RawConnection`` matches responses to requests by correlation id and
  raises ``RawProtocolError`` on any mismatch or short read; every blocking
  call is bounded by the socket timeout. It stays apart from the connector's
  ``wire.Connection``: it pipelines pre-encoded frames, sends requests that
  get no answer (acks=0), and hands out raw bodies, with no version check.

Import as ``from scripts.harness import rawkafka``.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from kio.static.primitive import i16, i32

from shmbroker.node.storage import records
from shmbroker.workers.codecs.tagged_fields import uvarint
from shmbroker.clients import wire
# The API keys are re-exported for the scripts and tests (rawkafka.FETCH ...).
from shmbroker.clients.wire import (API_VERSIONS, FETCH, INIT_PRODUCER_ID, LIST_OFFSETS, METADATA, PRODUCE,
                                   TopicPartition, encode_body, entity, millis)

CREATE_TOPICS = 19
DELETE_TOPICS = 20

DEFAULT_CLIENT_ID = "rawkafka"
DEFAULT_SOCKET_TIMEOUT_S = 30.0
_RECV_CHUNK = 1 << 20


class RawProtocolError(Exception):
    """The broker's bytes do not match what was asked (bad correlation id, short frame...)."""


# --------------------------------------------------------------------------- record batches


def build_record_batch(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    *,
    first_timestamp_ms: int | None = None,
    base_offset: int = 0,
    producer_id: int = records.NO_PRODUCER_ID,
    producer_epoch: int = records.NO_PRODUCER_EPOCH,
    base_sequence: int = records.NO_SEQUENCE,
    partition_leader_epoch: int = records.NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A client's v2 batch of one record per value, all at first_timestamp_ms (default now)."""
    if first_timestamp_ms is None:
        first_timestamp_ms = int(time.time() * 1000)
    return records.build_batch(list(zip(keys if keys is not None else [None] * len(values), values)),
                               first_timestamp_ms, base_offset=base_offset,
                               partition_leader_epoch=partition_leader_epoch, producer_id=producer_id,
                               producer_epoch=producer_epoch, base_sequence=base_sequence)


def make_batch(record_count: int, record_size: int, **kwargs: Any) -> bytes:
    """A batch of ``record_count`` records whose values are ``record_size`` bytes each."""
    value = bytes((i % 251 for i in range(record_size)))
    return build_record_batch([value] * record_count, **kwargs)


def records_for_batch_bytes(batch_bytes: int, record_size: int) -> int:
    """How many ``record_size`` records fit a batch of about ``batch_bytes`` (at least one)."""
    per_record = len(records.encode_record(0, None, bytes(record_size)))
    return max(1, (batch_bytes - records.BATCH_HEADER_SIZE) // per_record)


# --------------------------------------------------------------------------- request frames


def encode_request(
    api_key: int, version: int, correlation_id: int, body: bytes, client_id: str | None = DEFAULT_CLIENT_ID
) -> bytes:
    """A whole request frame: size prefix, header v1 (v2 when flexible) and body."""
    cid = None if client_id is None else client_id.encode("utf-8")
    return wire.request_head(api_key, version, correlation_id, cid, len(body)) + body


def request_schema(api_key: int, version: int) -> Any:
    return wire.request_schema(api_key, version)


def request_entity(api_key: int, version: int, class_name: str, /, **fields: Any) -> Any:
    """The kio request class `class_name` of `api_key` at `version` built from `fields` (those the version
    lacks left out)."""
    return entity(getattr(wire.request_schema(api_key, version), class_name), **fields)


def request_body(api_key: int, version: int, class_name: str, /, **fields: Any) -> bytes:
    """The encoded body of request_entity(...)."""
    return encode_body(request_entity(api_key, version, class_name, **fields))


def decode_response(api_key: int, version: int, body: bytes | memoryview) -> Any:
    """Decode a response body (after the correlation id) with kio."""
    try:
        return wire.decode_response(api_key, version, body)
    except ValueError as exc:
        raise RawProtocolError(f"api {api_key} v{version}: {exc}") from None


def api_versions_body(version: int = 3) -> bytes:
    return request_body(API_VERSIONS, version, "ApiVersionsRequest", client_software_name="rawkafka",
                        client_software_version="1.0")


def metadata_body(topics: Sequence[str] | None, version: int = 8, allow_auto_topic_creation: bool = True) -> bytes:
    """Metadata request; ``topics=None`` asks for every topic."""
    return encode_body(wire.metadata_request(topics, allow_auto_topic_creation, version=version))


def topic_ids(host: str, port: int, topics: Sequence[str]) -> dict[str, uuid.UUID]:
    """{topic: its topic id} from a Metadata v12 request (topics that exist; none are created)."""
    with RawConnection(host, port) as conn:
        answer = conn.call(METADATA, 12, metadata_body(list(topics), version=12, allow_auto_topic_creation=False))
    return {t.name: t.topic_id for t in answer.topics if t.error_code == 0 and t.topic_id is not None}


def create_topics_body(
    topics: dict[str, int], replication_factor: int = 1, timeout_ms: int = 30000, version: int = 4,
    validate_only: bool = False, configs: dict[str, str | None] | None = None,
) -> bytes:
    """CreateTopics (version 2-4) for {name: partition count}, each with the same `configs`."""
    entries = tuple(request_entity(CREATE_TOPICS, version, "CreatableTopicConfig", name=key, value=value)
                    for key, value in (configs or {}).items())
    creatable = tuple(
        request_entity(CREATE_TOPICS, version, "CreatableTopic", name=name, num_partitions=i32(count),
                       replication_factor=i16(replication_factor), assignments=(), configs=entries)
        for name, count in topics.items()
    )
    return request_body(CREATE_TOPICS, version, "CreateTopicsRequest", topics=creatable, timeout=millis(timeout_ms),
                        validate_only=validate_only)


def delete_topics_body(names: Sequence[str], timeout_ms: int = 30000, version: int = 3) -> bytes:
    """DeleteTopics (version 0-3: by name, not flexible)."""
    return request_body(DELETE_TOPICS, version, "DeleteTopicsRequest", topic_names=tuple(names),
                        timeout=millis(timeout_ms))


def list_offsets_body(partitions: dict[str, Sequence[int]], timestamp: int = -1, version: int = 5) -> bytes:
    """ListOffsets for every given partition at ``timestamp`` (-1 latest, -2 earliest)."""
    timestamps = {TopicPartition(name, p): timestamp for name, parts in partitions.items() for p in parts}
    return encode_body(wire.list_offsets_request(timestamps, version=version))


_PRODUCE_HEAD = struct.Struct(">hhii")  # transactional_id=-1 (null), acks, timeout_ms, topic count
_FLEXIBLE_PRODUCE_HEAD = struct.Struct(">Bhi")  # transactional_id null (compact: 0), acks, timeout_ms
PRODUCE_FIRST_FLEXIBLE = 9


def produce_body(topic_data: dict[str, dict[int, bytes]], acks: int = 1, timeout_ms: int = 30000,
                 version: int = 8) -> bytes:
    """Produce request body, non-transactional: v3-8 share one layout, v9-11 its flexible form (compact
    strings, arrays and records, an empty tagged-field section after each structure)."""
    if version >= PRODUCE_FIRST_FLEXIBLE:
        parts = [_FLEXIBLE_PRODUCE_HEAD.pack(0, acks, timeout_ms), uvarint(len(topic_data) + 1)]
        for topic, partitions in topic_data.items():
            name = topic.encode("utf-8")
            parts.append(uvarint(len(name) + 1) + name + uvarint(len(partitions) + 1))
            for partition, batch in partitions.items():
                parts.append(struct.pack(">i", partition) + uvarint(len(batch) + 1))
                parts.append(batch)
                parts.append(b"\x00")
            parts.append(b"\x00")
        parts.append(b"\x00")
        return b"".join(parts)
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
    body = produce_body({topic: {partition: batch}}, acks, timeout_ms, version)
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
    topic_ids: dict[str, uuid.UUID] | None = None,
) -> bytes:
    """Fetch v4-17 request body for {topic: {partition: fetch offset}} (session 0, no rack); v13+ name each
    topic by its id in `topic_ids` (see `topic_ids`)."""
    request = wire.fetch_request({TopicPartition(t, p): o for t, parts in offsets.items() for p, o in parts.items()},
                                 max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                                 partition_max_bytes=partition_max_bytes, isolation_level=isolation_level,
                                 version=version, topic_ids=topic_ids)
    return encode_body(request)


# --------------------------------------------------------------------------- fetch responses


@dataclass(slots=True)
class FetchedPartition:
    topic: str
    partition: int
    error_code: int
    high_watermark: int
    record_count: int = 0  # the records an application gets: no control records, none of an aborted transaction
    batch_count: int = 0  # every batch, control batches included
    next_offset: int | None = None  # None: no whole batch came back
    records_bytes: int = 0
    control_batch_count: int = 0  # COMMIT and ABORT markers
    aborted_record_count: int = 0  # records of the aborted transactions the answer lists (read_committed)


class AbortedBatches:
    """Which batches of one partition's record set belong to an aborted transaction, as Kafka's consumer tells:
    the answer lists each aborted transaction as (producer id, first offset); from its first offset on, that
    producer's transactional batches are aborted until its ABORT marker. Feed it every batch in order."""

    def __init__(self, aborted_transactions) -> None:
        self._pending = sorted(aborted_transactions, key=lambda entry: entry[1])
        self._aborting: set[int] = set()

    def skips(self, batch, header: records.BatchHeader) -> bool:
        """Whether an application never sees this batch's records: a control batch, or an aborted one."""
        while self._pending and self._pending[0][1] <= header.last_offset:
            self._aborting.add(self._pending.pop(0)[0])
        if header.attributes & records.CONTROL_BIT:
            if records.control_type(batch, header) == records.ControlType.ABORT:
                self._aborting.discard(header.producer_id)
            return True
        return bool(header.attributes & records.TRANSACTIONAL_BIT) and header.producer_id in self._aborting


@dataclass(slots=True)
class FetchResult:
    throttle_time_ms: int
    error_code: int
    session_id: int
    partitions: list[FetchedPartition] = field(default_factory=list)

    @property
    def record_count(self) -> int:
        return sum(p.record_count for p in self.partitions)


def parse_fetch_response(version: int, body: bytes | memoryview,
                         topic_names: dict[bytes, str] | None = None) -> FetchResult:
    """A Fetch v4-17 response body (after the correlation id), walked by the connector's wire module: per
    partition, counts from the batch headers, without copying record data (control batches and the batches of
    the aborted transactions the answer lists are counted apart, not as records). v13+: `topic_names` maps topic
    id bytes to names."""
    try:
        answer = wire.parse_fetch_response(memoryview(body), 0, version, topic_names)
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise RawProtocolError(f"fetch response: {exc}") from None
    result = FetchResult(answer.throttle_time_ms, answer.error_code, answer.session_id)
    for partition in answer.partitions:
        fetched = FetchedPartition(partition.topic, partition.partition, partition.error_code,
                                   partition.high_watermark, records_bytes=len(partition.records))
        header = None
        aborted = AbortedBatches(partition.aborted_transactions)
        for position, header in records.iter_batches(partition.records):
            if header.magic != records.MAGIC_V2:
                raise RawProtocolError(f"batch at {position} has magic {header.magic}, not 2")
            fetched.batch_count += 1
            if not aborted.skips(partition.records[position:position + header.size], header):
                fetched.record_count += header.record_count
            elif header.attributes & records.CONTROL_BIT:
                fetched.control_batch_count += 1
            else:
                fetched.aborted_record_count += header.record_count
        if header is not None:
            fetched.next_offset = header.last_offset + 1
        result.partitions.append(fetched)
    return result


# --------------------------------------------------------------------------- connection

_I32 = struct.Struct(">i")


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
            _I32.pack_into(out, start + wire.CORRELATION_ID_AT, cid)
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
        # Read-only, as the small path's bytes are: kio's compiled reader refuses a writable buffer for a bytes
        # field (a fetch's records), so a response that came in pieces would not decode.
        return view.toreadonly()

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
