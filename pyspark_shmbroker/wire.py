"""The connector's Kafka wire client: blocking connections to the node, every request encoded and every
response decoded by kio (Kafka's own JSON schemas as data: one codec, no hand-written layouts).

Except Fetch responses, the read hot path: ``receive_fetch`` walks them with layouts declared as data
(``FETCH_RESPONSE_LAYOUT``) and hands out the record sets as views into the connection's receive buffer,
which is reused from one answer to the next and has slack after each frame (``FRAME_SLACK``), so the
decoder can use the fetched bytes in place. Why not kio there: kio copies every record set into a new
``bytes`` (and a fresh 4 MiB buffer per answer page-faults in): a py-spy profile of Spark read tasks put
that at ~10% of their time, and reading in place cut the Python worker's CPU per record from ~290 to
~160 ns outside Spark (1M records of 100 B, 4 MiB fetches); the records themselves are decoded in
``pyspark_shmbroker.records``.

Every request goes to the node named by ``kafka.bootstrap.servers`` (the first of the list that answers):
shmbroker is one node that leads every partition.

Invariants:
- A ``Connection`` serves one thread. Responses come back in request order and each one's correlation id
  is checked against its request's; a mismatch, a short read or a socket error raises ``NodeUnavailable``
  and closes the connection, which is never used again.
- Every blocking call is bounded by the connection's timeout.
- What ``receive_fetch`` returns views the receive buffer: it is valid until the next receive.
- The API versions used are fixed (``API_VERSIONS``) and checked once per connection against the node's
  ApiVersions answer, so a node that lacks one fails with a message naming the API.
"""

from __future__ import annotations

import datetime
import functools
import io
import socket
import struct
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from pyspark_shmbroker import dependencies  # noqa: F401  (first: without them, an error saying what to do)
from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

# Kafka API keys and the one version of each the connector speaks.
PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, INIT_PRODUCER_ID = 0, 1, 2, 3, 18, 22
API_VERSIONS_USED = {PRODUCE: 8, FETCH: 11, LIST_OFFSETS: 5, METADATA: 8, INIT_PRODUCER_ID: 1}
API_NAMES = {PRODUCE: "Produce", FETCH: "Fetch", LIST_OFFSETS: "ListOffsets", METADATA: "Metadata",
             API_VERSIONS: "ApiVersions", INIT_PRODUCER_ID: "InitProducerId"}
# ListOffsets' special timestamps.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
ISOLATION_LEVELS = {"read_uncommitted": 0, "read_committed": 1}

_SIZE = struct.Struct(">i")
_HEADER_V1 = struct.Struct(">ihhih")  # size, api key, api version, correlation id, client id length
_MAX_RESPONSE_BYTES = 1 << 30
FRAME_SLACK = 64  # spare bytes after every received frame: a varint read at a record's last byte stays inside


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class NodeUnavailable(ConnectionError):
    """The node could not be reached, or the connection broke or answered out of turn."""


class BrokerError(RuntimeError):
    """The node answered with a Kafka error code."""

    def __init__(self, code: int, what: str, message: str | None = None) -> None:
        self.code = ErrorCode(code)
        detail = f": {message}" if message else ""
        super().__init__(f"{what}: {self.code.name.upper()} (Kafka error {int(code)}){detail}")

    @property
    def retriable(self) -> bool:
        return bool(self.code.retriable)


def parse_servers(text: str) -> list[tuple[str, int]]:
    """'host:port,host:port' (kafka.bootstrap.servers) as a list of (host, port); ValueError if malformed."""
    servers = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{item!r} is not HOST:PORT")
        servers.append((host, int(port)))
    if not servers:
        raise ValueError("no HOST:PORT given")
    return servers


@functools.cache
def _response_class(api_key: int, version: int) -> type:
    module = load_payload_module(api_key, version, EntityType.response)
    return next(v for v in vars(module).values() if getattr(v, "__type__", None) == EntityType.response)


@functools.cache
def request_schema(api_key: int) -> Any:
    """kio's module of the request classes of `api_key` at the version the connector uses."""
    return load_payload_module(api_key, API_VERSIONS_USED.get(api_key, 0), EntityType.request)


def _millis(ms: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


class Connection:
    """One TCP connection to the node: send kio requests, receive kio responses in order."""

    def __init__(self, servers: Sequence[tuple[str, int]], timeout_s: float, client_id: str = "pyspark-shmbroker"):
        errors = []
        self.sock: socket.socket | None = None
        for host, port in servers:
            try:
                self.sock = socket.create_connection((host, port), timeout=timeout_s)
                self.address = f"{host}:{port}"
                break
            except OSError as exc:
                errors.append(f"{host}:{port}: {exc}")
        if self.sock is None:
            raise NodeUnavailable("cannot connect to kafka.bootstrap.servers " + "; ".join(errors))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client_id = client_id.encode()
        self._next_id = 0
        self._inflight: list[tuple[int, type]] = []  # (correlation id, response class), in order
        self._buffer = bytearray(64 * 1024)  # reused for every response; grows to the largest one
        try:
            self._check_versions()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def send(self, request: Any) -> None:
        """Send one kio request entity; its response is read by a later receive()."""
        if self.sock is None:
            raise NodeUnavailable("connection already closed")
        api_key, version = int(request.__api_key__), int(request.__version__)
        body = io.BytesIO()
        entity_writer(type(request))(body, request)
        payload = body.getvalue()
        cid = self._next_id
        self._next_id = (cid + 1) & 0x7FFFFFFF
        head = _HEADER_V1.pack(_HEADER_V1.size - 4 + len(self.client_id) + len(payload), api_key, version, cid,
                               len(self.client_id))
        try:
            self._send_pieces([head + self.client_id, payload])
        except OSError as exc:
            self.close()
            raise NodeUnavailable(f"{self.address}: send failed: {exc}") from exc
        self._inflight.append((cid, _response_class(api_key, version)))

    def _next_frame(self) -> tuple[memoryview, type]:
        """The next response frame (read-only view of the receive buffer) and its expected kio class."""
        if not self._inflight:
            raise NodeUnavailable("no request in flight")
        frame = self._read_frame()
        cid, response_class = self._inflight.pop(0)
        (got,) = _SIZE.unpack_from(frame, 0)
        if got != cid:
            self.close()
            raise NodeUnavailable(f"{self.address}: correlation id {got}, expected {cid}")
        return frame, response_class

    def receive(self) -> Any:
        """The next response (of the oldest request in flight), decoded by kio."""
        frame, response_class = self._next_frame()
        try:
            value, size = entity_reader(response_class)(frame, 4)
        except Exception as exc:
            self.close()
            raise NodeUnavailable(f"{self.address}: undecodable {response_class.__name__}: {exc}") from exc
        if size != len(frame) - 4:
            self.close()
            raise NodeUnavailable(f"{self.address}: {len(frame) - 4 - size} trailing bytes in {response_class.__name__}")
        return value

    def call(self, request: Any) -> Any:
        self.send(request)
        return self.receive()

    def _send_pieces(self, pieces: list) -> None:
        """sendall of the pieces in order without joining them first (a produce request's batches are large)."""
        views = [memoryview(p).cast("B") for p in pieces]
        while views:
            sent = self.sock.sendmsg(views)  # type: ignore[union-attr]
            while views and sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            if views and sent:
                views[0] = views[0][sent:]

    def _recv_exact(self, view: memoryview) -> None:
        have = 0
        while have < len(view):
            try:
                n = self.sock.recv_into(view[have:])  # type: ignore[union-attr]
            except OSError as exc:
                self.close()
                raise NodeUnavailable(f"{self.address}: receive failed: {exc}") from exc
            if n == 0:
                self.close()
                raise NodeUnavailable(f"{self.address}: the node closed the connection")
            have += n

    def _read_frame(self) -> memoryview:
        if self.sock is None:
            raise NodeUnavailable("connection already closed")
        head = bytearray(4)
        self._recv_exact(memoryview(head))
        (size,) = _SIZE.unpack(head)
        if not 4 <= size <= _MAX_RESPONSE_BYTES:
            self.close()
            raise NodeUnavailable(f"{self.address}: response size {size}")
        if len(self._buffer) < size + FRAME_SLACK:
            self._buffer = bytearray(size + FRAME_SLACK + size // 4)
        frame = memoryview(self._buffer)[:size]
        self._recv_exact(frame)
        return frame.toreadonly()  # kio's native readers take read-only buffers

    def receive_fetch(self) -> FetchAnswer:
        """The next response, which must answer a Fetch: parsed with FETCH_RESPONSE_LAYOUT, record sets as
        views of the receive buffer (valid until the next receive)."""
        frame, response_class = self._next_frame()
        if int(response_class.__api_key__) != FETCH:
            raise NodeUnavailable(f"receive_fetch() while a {response_class.__name__} was expected")
        try:
            return parse_fetch_response(frame, 4)
        except (struct.error, ValueError, UnicodeDecodeError) as exc:
            self.close()
            raise NodeUnavailable(f"{self.address}: malformed Fetch response: {exc}") from exc

    def _check_versions(self) -> None:
        schema = load_payload_module(API_VERSIONS, 0, EntityType.request)
        answer = self.call(schema.ApiVersionsRequest())
        if answer.error_code != ErrorCode.none:
            raise BrokerError(answer.error_code, f"ApiVersions at {self.address}")
        spans = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in answer.api_keys}
        for api_key, version in API_VERSIONS_USED.items():
            low, high = spans.get(api_key, (None, None))
            if low is None or not low <= version <= high:
                offered = "none" if low is None else f"{low}-{high}"
                raise NodeUnavailable(f"{self.address} does not serve {API_NAMES[api_key]} v{version} "
                                      f"(it offers {offered}); shmbroker nodes do")


# --------------------------------------------------------------------------- fetch answers

# Fetch v11 response (non-flexible), in wire order: (field, struct code); arrays are an int32 count
# followed by their items, strings an int16 length, the record set an int32 length (-1: null).
FETCH_RESPONSE_LAYOUT = {
    "response": (("throttle_time_ms", "i"), ("error_code", "h"), ("session_id", "i")),
    "topic": (("name", "string"), ("partitions", "array:partition")),
    "partition": (("partition_index", "i"), ("error_code", "h"), ("high_watermark", "q"),
                  ("last_stable_offset", "q"), ("log_start_offset", "q")),
    "aborted_transaction": (("producer_id", "q"), ("first_offset", "q")),
    "partition_tail": (("preferred_read_replica", "i"),),
}
_FETCH_STRUCTS = {name: struct.Struct(">" + "".join(code for _, code in fields))
                  for name, fields in FETCH_RESPONSE_LAYOUT.items() if name != "topic"}


class FetchedPartition(NamedTuple):
    topic: str
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records: memoryview  # the record set (empty when null); a view of the receive buffer
    records_at: int  # where it starts in that buffer
    buffer: Any  # the receive buffer, with FRAME_SLACK spare bytes after the frame
    aborted_transactions: int  # how many the answer lists (read_committed only; never from shmbroker)


class FetchAnswer(NamedTuple):
    error_code: int
    partitions: list[FetchedPartition]

    def partition(self, tp: TopicPartition) -> FetchedPartition | None:
        return next((p for p in self.partitions if p.topic == tp.topic and p.partition == tp.partition), None)


def parse_fetch_response(frame: memoryview, position: int) -> FetchAnswer:
    """Walk a Fetch v11 response body per FETCH_RESPONSE_LAYOUT; raises ValueError if it does not fit."""
    end = len(frame)

    def take(layout: str) -> tuple:
        nonlocal position
        shape = _FETCH_STRUCTS[layout]
        if position + shape.size > end:
            raise ValueError(f"truncated at {layout}")
        values = shape.unpack_from(frame, position)
        position += shape.size
        return values

    def count() -> int:
        nonlocal position
        if position + 4 > end:
            raise ValueError("truncated array")
        (n,) = _SIZE.unpack_from(frame, position)
        position += 4
        return n

    _throttle, error_code, _session = take("response")
    partitions = []
    for _ in range(max(count(), 0)):
        (name_length,) = struct.unpack_from(">h", frame, position)
        topic = str(frame[position + 2 : position + 2 + name_length], "utf-8")
        position += 2 + name_length
        for _ in range(max(count(), 0)):
            index, code, high_watermark, last_stable, log_start = take("partition")
            aborted = max(count(), 0)
            for _ in range(aborted):
                take("aborted_transaction")
            take("partition_tail")
            size = count()
            if position + max(size, 0) > end:
                raise ValueError("truncated record set")
            records = frame[position : position + max(size, 0)]
            partitions.append(FetchedPartition(topic, index, code, high_watermark, last_stable, log_start, records,
                                               position, frame.obj, aborted))
            position += max(size, 0)
    if position != end:
        raise ValueError(f"{end - position} trailing bytes")
    return FetchAnswer(error_code, partitions)


# --------------------------------------------------------------------------- requests


def metadata_request(topics: Iterable[str] | None, allow_auto_topic_creation: bool = False) -> Any:
    """Metadata for `topics`, or for every topic when None."""
    schema = request_schema(METADATA)
    return schema.MetadataRequest(
        topics=None if topics is None else tuple(schema.MetadataRequestTopic(name=t) for t in topics),
        allow_auto_topic_creation=allow_auto_topic_creation,
        include_cluster_authorized_operations=False, include_topic_authorized_operations=False)


def list_offsets_request(timestamps: Mapping[TopicPartition, int], isolation_level: int = 0) -> Any:
    schema = request_schema(LIST_OFFSETS)
    by_topic: dict[str, list[Any]] = {}
    for tp, timestamp in timestamps.items():
        by_topic.setdefault(tp.topic, []).append(
            schema.ListOffsetsPartition(partition_index=i32(tp.partition), timestamp=i64(timestamp)))
    return schema.ListOffsetsRequest(
        replica_id=i32(-1), isolation_level=i8(isolation_level),
        topics=tuple(schema.ListOffsetsTopic(name=t, partitions=tuple(p)) for t, p in by_topic.items()))


def fetch_request(offsets: Mapping[TopicPartition, int], *, max_wait_ms: int, min_bytes: int, max_bytes: int,
                  partition_max_bytes: int, isolation_level: int = 0) -> Any:
    schema = request_schema(FETCH)
    by_topic: dict[str, list[Any]] = {}
    for tp, offset in offsets.items():
        by_topic.setdefault(tp.topic, []).append(schema.FetchPartition(
            partition=i32(tp.partition), fetch_offset=i64(offset), partition_max_bytes=i32(partition_max_bytes)))
    return schema.FetchRequest(
        max_wait=_millis(max_wait_ms), min_bytes=i32(min_bytes), max_bytes=i32(max_bytes),
        isolation_level=i8(isolation_level),
        topics=tuple(schema.FetchTopic(topic=t, partitions=tuple(p)) for t, p in by_topic.items()),
        forgotten_topics_data=())


def init_producer_id_request(transaction_timeout_ms: int = 60_000) -> Any:
    schema = request_schema(INIT_PRODUCER_ID)
    return schema.InitProducerIdRequest(transactional_id=None, transaction_timeout=_millis(transaction_timeout_ms))


def produce_request(batches: Mapping[TopicPartition, bytes], acks: int, timeout_ms: int) -> Any:
    """One record batch per partition (bytes, already encoded)."""
    schema = request_schema(PRODUCE)
    by_topic: dict[str, list[Any]] = {}
    for tp, batch in batches.items():
        by_topic.setdefault(tp.topic, []).append(schema.PartitionProduceData(index=i32(tp.partition), records=batch))
    return schema.ProduceRequest(
        transactional_id=None, acks=i16(acks), timeout=_millis(timeout_ms),
        topic_data=tuple(schema.TopicProduceData(name=t, partition_data=tuple(p)) for t, p in by_topic.items()))


# --------------------------------------------------------------------------- answers


def topic_partitions(conn: Connection, topics: Iterable[str] | None,
                     allow_auto_topic_creation: bool = False) -> dict[str, int]:
    """{topic: partition count} of `topics` (every topic, internal ones excluded, when None).
    A topic that does not exist is left out; any other error on a topic raises BrokerError."""
    answer = conn.call(metadata_request(topics, allow_auto_topic_creation))
    found = {}
    for topic in answer.topics:
        if topic.error_code == ErrorCode.unknown_topic_or_partition:
            continue
        if topic.error_code != ErrorCode.none:
            raise BrokerError(topic.error_code, f"Metadata for topic {topic.name!r}")
        if topic.is_internal:
            continue
        found[topic.name] = len(topic.partitions)
    return found


class ListedOffset(NamedTuple):
    offset: int  # -1: no record at or after the timestamp
    timestamp: int


def list_offsets(conn: Connection, timestamps: Mapping[TopicPartition, int],
                 isolation_level: int = 0) -> dict[TopicPartition, ListedOffset]:
    """ListOffsets for each partition: EARLIEST_TIMESTAMP, LATEST_TIMESTAMP or a timestamp in ms
    (the first offset whose record timestamp is >= it, -1 when there is none)."""
    if not timestamps:
        return {}
    answer = conn.call(list_offsets_request(timestamps, isolation_level))
    found = {}
    for topic in answer.topics:
        for part in topic.partitions:
            tp = TopicPartition(topic.name, int(part.partition_index))
            if part.error_code != ErrorCode.none:
                raise BrokerError(part.error_code, f"ListOffsets of {tp}")
            found[tp] = ListedOffset(int(part.offset), int(part.timestamp))
    missing = set(timestamps) - set(found)
    if missing:
        raise NodeUnavailable(f"ListOffsets answer lacks {sorted(map(str, missing))}")
    return found
