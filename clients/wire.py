"""The clients' Kafka wire module: blocking connections to the node, every request encoded and every
response decoded by kio (Kafka's own JSON schemas as data: one codec, no hand-written layouts). The Spark
connector (pyspark_shmbroker) speaks through it; the request builders, the frame header and the Fetch walk
take any version the node serves (default: the one the connector speaks), so the benchmarks' raw client
(scripts/harness/rawkafka.py) encodes and decodes through them too. It imports nothing of the node nor of
the connector, so neither pyspark nor pyarrow is on its path: kio (a dependency of the node itself) is all
it needs.

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

import dataclasses
import datetime
import functools
import io
import socket
import struct
from typing import Any, Iterable, Mapping, NamedTuple, Sequence
import uuid

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
CORRELATION_ID_AT = 8  # in a request frame, after its size, api key and version
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
def response_class(api_key: int, version: int) -> type:
    module = load_payload_module(api_key, version, EntityType.response)
    return next(v for v in vars(module).values() if getattr(v, "__type__", None) == EntityType.response)


@functools.cache
def request_schema(api_key: int, version: int | None = None) -> Any:
    """kio's module of the request classes of `api_key` at `version` (default: the one the connector uses)."""
    return load_payload_module(api_key, API_VERSIONS_USED.get(api_key, 0) if version is None else version,
                               EntityType.request)


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def entity(cls: type, **fields: Any) -> Any:
    """The kio entity `cls` of `fields`, leaving out those its version lacks (its defaults fill the rest):
    one builder serves every version."""
    names = _field_names(cls)
    return cls(**{name: value for name, value in fields.items() if name in names})


def millis(ms: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


def encode_body(request: Any) -> bytes:
    """A kio request entity as bytes, without the frame header."""
    body = io.BytesIO()
    entity_writer(type(request))(body, request)
    return body.getvalue()


@functools.cache
def is_flexible_request(api_key: int, version: int) -> bool:
    """Whether the version is flexible (KIP-482): request header v2 (tagged fields), compact encodings. A version
    newer than kio knows is as flexible as the newest it knows (how a client asks a broker for ApiVersions)."""
    for known in range(version, max(version - _NEWER_VERSIONS_GUESSED, -1), -1):
        try:
            module = load_payload_module(api_key, known, EntityType.request)
        except Exception:  # kio knows no such API or version (UnknownEntity, KeyError)
            continue
        return any(getattr(v, "__flexible__", False) for v in vars(module).values()
                   if getattr(v, "__type__", None) == EntityType.request)
    return False


_NEWER_VERSIONS_GUESSED = 64


@functools.cache
def response_header_tags(api_key: int, version: int) -> bool:
    """Whether the response header is v1: after the correlation id, a tagged-field section (flexible versions but
    ApiVersions')."""
    return response_class(api_key, version).__header_schema__.__version__ >= 1


def skip_tags(frame: Any, position: int) -> int:
    """The position after a tagged-field section at `position` (its fields are not used here)."""
    count, position = _uvarint(frame, position)
    for _ in range(count):
        _, position = _uvarint(frame, position)
        size, position = _uvarint(frame, position)
        position += size
    if position > len(frame):
        raise ValueError("truncated tagged fields")
    return position


def _uvarint(frame: Any, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(frame) or shift > 28:
            raise ValueError("truncated or overlong varint")
        byte = frame[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


def request_head(api_key: int, version: int, correlation_id: int, client_id: bytes | None, body_size: int) -> bytes:
    """A request frame up to its body: size, header v1 (v2 with an empty tag section when flexible)."""
    tags = b"\x00" if is_flexible_request(api_key, version) else b""
    cid = client_id or b""
    head = _HEADER_V1.pack(_HEADER_V1.size - 4 + len(cid) + len(tags) + body_size, api_key, version, correlation_id,
                           -1 if client_id is None else len(cid))
    return head + cid + tags


def decode_response(api_key: int, version: int, frame: Any, position: int = 0) -> Any:
    """The kio response of `api_key` at `version` that frame[position:] holds (after the correlation id, so
    header v1's tagged fields first when the version has them); ValueError if bytes are left after it."""
    cls = response_class(api_key, version)
    if response_header_tags(api_key, version):
        position = skip_tags(frame, position)
    value, size = entity_reader(cls)(frame, position)
    if size != len(frame) - position:
        raise ValueError(f"{len(frame) - position - size} trailing bytes in {cls.__name__}")
    return value


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
        payload = encode_body(request)
        cid = self._next_id
        self._next_id = (cid + 1) & 0x7FFFFFFF
        try:
            self._send_pieces([request_head(api_key, version, cid, self.client_id, len(payload)), payload])
        except OSError as exc:
            self.close()
            raise NodeUnavailable(f"{self.address}: send failed: {exc}") from exc
        self._inflight.append((cid, response_class(api_key, version)))

    def _next_frame(self) -> tuple[memoryview, type]:
        """The next response frame (read-only view of the receive buffer) and its expected kio class."""
        if not self._inflight:
            raise NodeUnavailable("no request in flight")
        frame = self._read_frame()
        cid, expected = self._inflight.pop(0)
        (got,) = _SIZE.unpack_from(frame, 0)
        if got != cid:
            self.close()
            raise NodeUnavailable(f"{self.address}: correlation id {got}, expected {cid}")
        return frame, expected

    def receive(self) -> Any:
        """The next response (of the oldest request in flight), decoded by kio."""
        frame, expected = self._next_frame()
        try:
            return decode_response(int(expected.__api_key__), int(expected.__version__), frame, 4)
        except Exception as exc:
            self.close()
            raise NodeUnavailable(f"{self.address}: undecodable {expected.__name__}: {exc}") from exc

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
        frame, expected = self._next_frame()
        if int(expected.__api_key__) != FETCH:
            raise NodeUnavailable(f"receive_fetch() while a {expected.__name__} was expected")
        try:
            return parse_fetch_response(frame, 4, int(expected.__version__))
        except (struct.error, ValueError, UnicodeDecodeError) as exc:
            self.close()
            raise NodeUnavailable(f"{self.address}: malformed Fetch response: {exc}") from exc

    def _check_versions(self) -> None:
        answer = self.call(request_schema(API_VERSIONS, 0).ApiVersionsRequest())
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

# Fetch response (v4-17), in wire order: (field, struct code, first version that has it); arrays are an int32
# count followed by their items, strings an int16 length, the record set an int32 length (-1: null). v12 is the
# flexible form: compact arrays, strings and records (an unsigned varint of the count or length + 1, 0: null) and
# a tagged-field section after each structure (skipped: none of its tags matter on one node). v13+ name each topic
# by its 16-byte topic id (KIP-516) instead of its name.
FETCH_RESPONSE_LAYOUT = {
    "response": (("throttle_time_ms", "i", 1), ("error_code", "h", 7), ("session_id", "i", 7)),
    "topic": (("name", "string", 0), ("partitions", "array:partition", 0)),
    "partition": (("partition_index", "i", 0), ("error_code", "h", 0), ("high_watermark", "q", 0),
                  ("last_stable_offset", "q", 4), ("log_start_offset", "q", 5)),
    "aborted_transaction": (("producer_id", "q", 4), ("first_offset", "q", 4)),
    "partition_tail": (("preferred_read_replica", "i", 11),),
}
FETCH_VERSIONS = range(4, 18)
FETCH_FIRST_FLEXIBLE = 12
FETCH_FIRST_TOPIC_ID = 13
_TOPIC_ID_SIZE = 16
_ABSENT = {"error_code": 0, "session_id": 0, "log_start_offset": -1}  # a field an older version lacks


@functools.cache
def _fetch_structs(version: int) -> dict[str, tuple[struct.Struct, tuple[str, ...]]]:
    """Per layout of FETCH_RESPONSE_LAYOUT: the struct of its fields at `version` and their names."""
    shapes = {}
    for name, fields in FETCH_RESPONSE_LAYOUT.items():
        if name == "topic":  # a string and an array: walked by hand
            continue
        present = [(field, code) for field, code, since in fields if since <= version]
        shapes[name] = (struct.Struct(">" + "".join(code for _, code in present)), tuple(f for f, _ in present))
    return shapes


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
    # (producer id, first offset) of each aborted transaction the answer lists (read_committed only)
    aborted_transactions: tuple[tuple[int, int], ...]


class FetchAnswer(NamedTuple):
    error_code: int
    partitions: list[FetchedPartition]
    throttle_time_ms: int = 0
    session_id: int = 0

    def partition(self, tp: TopicPartition) -> FetchedPartition | None:
        return next((p for p in self.partitions if p.topic == tp.topic and p.partition == tp.partition), None)


def parse_fetch_response(frame: memoryview, position: int, version: int = API_VERSIONS_USED[FETCH],
                         topic_names: Mapping[bytes, str] | None = None) -> FetchAnswer:
    """Walk a Fetch response body of `version` per FETCH_RESPONSE_LAYOUT; raises ValueError if it does not fit.
    v13+: `topic_names` maps the 16 bytes of each topic id the request used to its name (an id not in it is
    named by its UUID text)."""
    if version not in FETCH_VERSIONS:
        raise ValueError(f"Fetch v{version} is not walked here")
    end = len(frame)
    shapes = _fetch_structs(version)

    def take(layout: str) -> dict[str, int]:
        nonlocal position
        shape, names = shapes[layout]
        if position + shape.size > end:
            raise ValueError(f"truncated at {layout}")
        values = shape.unpack_from(frame, position)
        position += shape.size
        return dict(zip(names, values))

    def count() -> int:
        nonlocal position
        if position + 4 > end:
            raise ValueError("truncated array")
        (n,) = _SIZE.unpack_from(frame, position)
        position += 4
        return n

    flexible = version >= FETCH_FIRST_FLEXIBLE
    by_topic_id = version >= FETCH_FIRST_TOPIC_ID

    def length() -> int:  # of an array, a string or the records; -1: null
        nonlocal position
        if not flexible:
            return count()
        value, position = _uvarint(frame, position)
        return value - 1

    def tags() -> None:
        nonlocal position
        if flexible:
            position = skip_tags(frame, position)

    tags()  # response header v1's
    response = {**_ABSENT, **take("response")}
    partitions = []
    for _ in range(max(length(), 0)):
        if by_topic_id:
            if position + _TOPIC_ID_SIZE > end:
                raise ValueError("truncated topic id")
            topic_id = bytes(frame[position : position + _TOPIC_ID_SIZE])
            position += _TOPIC_ID_SIZE
            topic = (topic_names or {}).get(topic_id) or str(uuid.UUID(bytes=topic_id))
        else:
            if flexible:
                name_length = length()
            else:
                if position + 2 > end:
                    raise ValueError("truncated topic name")
                (name_length,) = struct.unpack_from(">h", frame, position)
                position += 2
            topic = str(frame[position : position + name_length], "utf-8")
            position += name_length
        for _ in range(max(length(), 0)):
            partition = {**_ABSENT, **take("partition")}
            aborted = []
            for _ in range(max(length(), 0)):
                entry = take("aborted_transaction")
                aborted.append((entry["producer_id"], entry["first_offset"]))
                tags()
            take("partition_tail")
            size = length()
            if position + max(size, 0) > end:
                raise ValueError("truncated record set")
            records = frame[position : position + max(size, 0)]
            partitions.append(FetchedPartition(topic, partition["partition_index"], partition["error_code"],
                                               partition["high_watermark"], partition["last_stable_offset"],
                                               partition["log_start_offset"], records, position, frame.obj,
                                               tuple(aborted)))
            position += max(size, 0)
            tags()
        tags()
    tags()
    if position != end:
        raise ValueError(f"{end - position} trailing bytes")
    return FetchAnswer(response["error_code"], partitions, response.get("throttle_time_ms", 0), response["session_id"])


# --------------------------------------------------------------------------- requests


def metadata_request(topics: Iterable[str] | None, allow_auto_topic_creation: bool = False,
                     version: int | None = None) -> Any:
    """Metadata for `topics`, or for every topic when None."""
    schema = request_schema(METADATA, version)
    return entity(schema.MetadataRequest,
                  topics=None if topics is None else tuple(entity(schema.MetadataRequestTopic, name=t, topic_id=None)
                                                           for t in topics),
                  allow_auto_topic_creation=allow_auto_topic_creation,
                  include_cluster_authorized_operations=False, include_topic_authorized_operations=False)


def list_offsets_request(timestamps: Mapping[TopicPartition, int], isolation_level: int = 0,
                         version: int | None = None, timeout_ms: int = 30_000) -> Any:
    schema = request_schema(LIST_OFFSETS, version)
    by_topic: dict[str, list[Any]] = {}
    for tp, timestamp in timestamps.items():
        by_topic.setdefault(tp.topic, []).append(
            schema.ListOffsetsPartition(partition_index=i32(tp.partition), timestamp=i64(timestamp)))
    return entity(schema.ListOffsetsRequest, replica_id=i32(-1), isolation_level=i8(isolation_level),
                  timeout=millis(timeout_ms),  # v10+
                  topics=tuple(schema.ListOffsetsTopic(name=t, partitions=tuple(p)) for t, p in by_topic.items()))


def fetch_request(offsets: Mapping[TopicPartition, int], *, max_wait_ms: int, min_bytes: int, max_bytes: int,
                  partition_max_bytes: int, isolation_level: int = 0, version: int | None = None,
                  topic_ids: Mapping[str, uuid.UUID] | None = None) -> Any:
    """A Fetch of session 0 (sessionless), no rack; v13+ name topics by their ids (`topic_ids`, from Metadata
    v10+; a topic not in it is sent with the zero id, which the node answers UNKNOWN_TOPIC_ID)."""
    schema = request_schema(FETCH, version)
    by_topic: dict[str, list[Any]] = {}
    for tp, offset in offsets.items():
        by_topic.setdefault(tp.topic, []).append(schema.FetchPartition(
            partition=i32(tp.partition), fetch_offset=i64(offset), partition_max_bytes=i32(partition_max_bytes)))
    return entity(schema.FetchRequest, max_wait=millis(max_wait_ms), min_bytes=i32(min_bytes),
                  max_bytes=i32(max_bytes), isolation_level=i8(isolation_level),
                  topics=tuple(entity(schema.FetchTopic, topic=t, topic_id=(topic_ids or {}).get(t), partitions=tuple(p))
                               for t, p in by_topic.items()),
                  forgotten_topics_data=())


def init_producer_id_request(transaction_timeout_ms: int = 60_000) -> Any:
    schema = request_schema(INIT_PRODUCER_ID)
    return schema.InitProducerIdRequest(transactional_id=None, transaction_timeout=millis(transaction_timeout_ms))


def produce_request(batches: Mapping[TopicPartition, bytes], acks: int, timeout_ms: int) -> Any:
    """One record batch per partition (bytes, already encoded)."""
    schema = request_schema(PRODUCE)
    by_topic: dict[str, list[Any]] = {}
    for tp, batch in batches.items():
        by_topic.setdefault(tp.topic, []).append(schema.PartitionProduceData(index=i32(tp.partition), records=batch))
    return schema.ProduceRequest(
        transactional_id=None, acks=i16(acks), timeout=millis(timeout_ms),
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
