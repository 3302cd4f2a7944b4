"""Kafka request framing, header parsing and message codecs for the network workers.

A worker reads 4-byte big-endian size-prefixed frames; each frame is a request
header followed by the request body. This module turns frames into request
objects and response objects into frames:

- control APIs (ApiVersions, Metadata, ListOffsets, InitProducerId,
  CreateTopics, DeleteTopics, and Fetch requests) are decoded and encoded by
  kio, whose dataclasses are generated from Kafka's own JSON schemas; handlers
  build plain kio response dataclasses (``response_schema(api_key, version)``
  gives the module-like namespace with the nested classes, ``build_entity``
  lets one handler fill every version; kio wants ``ErrorCode`` members for
  error codes and ``datetime.timedelta`` for durations such as throttle_time);
- the hot path, Produce requests and responses and Fetch responses, uses our
  own codecs (``decode_request`` returns a zero-copy ProduceRequestView for
  Produce; ``encode_produce_response`` and ``encode_fetch_response`` build
  those answers; ``encode_response`` with kio dataclasses still works for
  both, for rare paths); why is measured and said in workers/codecs/produce.py
  and workers/codecs/fetch.py.

Invariants:
- Every version kio declares up to SUPPORTED_APIS' maxima is served, flexible ones (KIP-482) included: their
  requests use header v2 (its tagged fields skipped) and their responses header v1 (the correlation id and an
  empty tagged-field section), except ApiVersions, whose response header is always v0 (a client must read it
  before it knows what the node speaks). ``FIRST_FLEXIBLE`` says where each API's flexible versions begin.
- A tagged field the schema does not declare (a newer client's) is skipped, at any depth (KIP-482);
  ``workers.codecs.tagged_fields`` drops it when kio refuses it.
- ``decode_request``, ``parse_request_header`` and ``frame_size`` raise
  ``ProtocolError`` and nothing else on any malformed, truncated, oversized or
  unsupported input; a body must be consumed exactly.
- ``encode_response`` always returns a complete frame: size prefix, the
  version's response header and body, and refuses a response object of the
  wrong API or version.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
from types import ModuleType, SimpleNamespace
from typing import Any, Mapping, NamedTuple

from kio.index import load_payload_module
from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.request_header.v1.header import RequestHeader as KioRequestHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32Timedelta

from shmbroker.workers.codecs.errors import NONE, UNSUPPORTED_VERSION, ErrorCode, ProtocolError
from shmbroker.workers.codecs.fetch import (FetchPartitionResult, FetchResponseFrame, FetchTopicResult, FileRange,
                                            encode_fetch_response)
from shmbroker.workers.codecs.legacy_schemas import legacy_schema
from shmbroker.workers.codecs.tagged_fields import known_tags_filter, skip_tagged_fields
from shmbroker.workers.codecs.produce import (ProducePartitionResult, ProduceRequestView, ProduceTopicResult,
                                              decode_produce_request, encode_produce_response)

# API keys (Kafka's ApiKeys enum) this broker serves.
PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
CREATE_TOPICS = 19
DELETE_TOPICS = 20
DELETE_RECORDS = 21
INIT_PRODUCER_ID = 22
ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
WRITE_TXN_MARKERS = 27
TXN_OFFSET_COMMIT = 28
DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
CREATE_PARTITIONS = 37
DELETE_GROUPS = 42
INCREMENTAL_ALTER_CONFIGS = 44
OFFSET_DELETE = 47
CONSUMER_GROUP_HEARTBEAT = 68
CONSUMER_GROUP_DESCRIBE = 69
STREAMS_GROUP_HEARTBEAT = 88
SHARE_GROUP_HEARTBEAT = 76
SHARE_GROUP_DESCRIBE = 77
SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79
DESCRIBE_SHARE_GROUP_OFFSETS = 90
ALTER_SHARE_GROUP_OFFSETS = 91
DELETE_SHARE_GROUP_OFFSETS = 92
STREAMS_GROUP_DESCRIBE = 89
DESCRIBE_CLUSTER = 60
DESCRIBE_QUORUM = 55
DESCRIBE_CLIENT_QUOTAS = 48
DESCRIBE_PRODUCERS = 61
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66
DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
DESCRIBE_USER_SCRAM_CREDENTIALS = 50
ALTER_USER_SCRAM_CREDENTIALS = 51

# api_key -> (min_version, max_version) advertised in ApiVersions: up to the newest version whose fields and
# rules the node honours. The next version of each needs what the node does not have:
#   Produce 12 and AddPartitionsToTxn 4-5, AddOffsetsToTxn 4, EndTxn 4-5, InitProducerId 5+: KIP-890's
#   transactions v2, and so TxnOffsetCommit 4+; Fetch 18: KIP-1166's high watermark tags; ListOffsets 11:
#   KIP-1023's earliest pending upload; OffsetFetch 10 and OffsetCommit 10: topic ids; JoinGroup 9: KIP-814's
#   SkipAssignment for a static leader that rejoins.
SUPPORTED_APIS: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 11),
    FETCH: (4, 17),
    LIST_OFFSETS: (1, 10),
    METADATA: (0, 13),
    API_VERSIONS: (0, 4),
    CREATE_TOPICS: (0, 7),
    DELETE_TOPICS: (0, 6),
    INIT_PRODUCER_ID: (0, 4),
    # Topic administration (workers/api/admin.py, node/timer/controller.py).
    CREATE_PARTITIONS: (0, 3),
    DELETE_RECORDS: (0, 2),
    DESCRIBE_CONFIGS: (0, 4),
    ALTER_CONFIGS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    # The group coordinator (workers/api/groups.py, node/timer/groups/).
    FIND_COORDINATOR: (0, 6),
    JOIN_GROUP: (0, 8),
    SYNC_GROUP: (0, 5),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 9),  # v7: require_stable (UNSTABLE_OFFSET_COMMIT while a transaction holds the offset); v8: groups; v9: members
    LIST_GROUPS: (0, 5),
    DESCRIBE_GROUPS: (0, 6),
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
    # The consumer group protocol, KIP-848 (workers/api/consumer_groups.py, node/timer/groups/consumer.py).
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    CONSUMER_GROUP_DESCRIBE: (0, 1),
    # The Streams rebalance protocol, KIP-1071 (workers/api/streams_groups.py, node/timer/groups/streams.py).
    # StreamsGroupHeartbeat 1: KIP-1331's TopologyDescriptionRequired (the node keeps no topology descriptions).
    STREAMS_GROUP_HEARTBEAT: (0, 0),
    STREAMS_GROUP_DESCRIBE: (0, 0),
    # Share groups, KIP-932 (workers/api/share_groups.py, node/timer/groups/share.py); v0 was the early access's.
    # ShareFetch and ShareAcknowledge 2: KIP-1222's record-limit acquire mode and renew acknowledgements.
    SHARE_GROUP_HEARTBEAT: (1, 1),
    SHARE_GROUP_DESCRIBE: (1, 1),
    SHARE_FETCH: (1, 2),
    SHARE_ACKNOWLEDGE: (1, 2),
    DESCRIBE_SHARE_GROUP_OFFSETS: (0, 1),  # v1: each share-partition's lag
    ALTER_SHARE_GROUP_OFFSETS: (0, 0),
    DELETE_SHARE_GROUP_OFFSETS: (0, 0),
    # The cluster and the partitions' producers (workers/api/cluster.py).
    DESCRIBE_CLUSTER: (0, 2),
    DESCRIBE_PRODUCERS: (0, 0),
    DESCRIBE_QUORUM: (0, 2),  # the metadata log's quorum as one node is it (kafka-metadata-quorum)
    DESCRIBE_CLIENT_QUOTAS: (0, 1),  # the [quotas] config's client ids (workers/api/client_quotas.py)
    # The transaction coordinator (workers/api/transactions.py, node/timer/transactions/).
    ADD_PARTITIONS_TO_TXN: (0, 3),
    ADD_OFFSETS_TO_TXN: (0, 3),
    END_TXN: (0, 3),
    # A marker written on an operator's request (Admin.abortTransaction: workers/api/txn_markers.py).
    WRITE_TXN_MARKERS: (1, 2),
    TXN_OFFSET_COMMIT: (0, 3),  # v3: KIP-447's member checks, by the group coordinator beside it in the timer
    # SASL on the SASL listeners (workers/api/sasl.py).
    SASL_HANDSHAKE: (0, 1),
    SASL_AUTHENTICATE: (0, 2),
    LIST_TRANSACTIONS: (0, 2),
    DESCRIBE_TRANSACTIONS: (0, 0),
    # ACLs (workers/api/acls.py, node/storage/acls.py).
    DESCRIBE_ACLS: (0, 3),
    CREATE_ACLS: (0, 3),
    DELETE_ACLS: (0, 3),
    # SCRAM users (workers/api/scram_credentials.py, node/storage/users.py).
    DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
}

# Kafka's default socket.request.max.bytes.
DEFAULT_MAX_REQUEST_SIZE = 100 * 1024 * 1024

FRAME_SIZE_PREFIX = 4
_SIZE = struct.Struct(">i")
_SIZE_AND_CORRELATION = struct.Struct(">ii")

RESPONSE_HEADER_V1_TAGS = b"\x00"  # response header v1: the correlation id, then an empty tagged-field section


# api_key -> its first flexible version (header v2 and v1 from there on): Kafka's "flexibleVersions" of each
# served API's JSON schema, as kio declares them (tests/test_protocol.py derives them from kio's classes).
# Kept as data, since finding them needs every older version's module: startup imports none of those.
FIRST_FLEXIBLE: dict[int, int] = {
    PRODUCE: 9, FETCH: 12, LIST_OFFSETS: 6, METADATA: 9, OFFSET_COMMIT: 8, OFFSET_FETCH: 6, FIND_COORDINATOR: 3,
    JOIN_GROUP: 6, HEARTBEAT: 4, LEAVE_GROUP: 4, SYNC_GROUP: 4, DESCRIBE_GROUPS: 5, LIST_GROUPS: 3,
    API_VERSIONS: 3, CREATE_TOPICS: 5, DELETE_TOPICS: 4, DELETE_RECORDS: 2, INIT_PRODUCER_ID: 2,
    ADD_PARTITIONS_TO_TXN: 3, ADD_OFFSETS_TO_TXN: 3, END_TXN: 3, TXN_OFFSET_COMMIT: 3, DESCRIBE_ACLS: 2,
    CREATE_ACLS: 2, DELETE_ACLS: 2, DESCRIBE_CONFIGS: 4, ALTER_CONFIGS: 2, SASL_AUTHENTICATE: 2,
    CREATE_PARTITIONS: 2, DELETE_GROUPS: 2, INCREMENTAL_ALTER_CONFIGS: 1, DESCRIBE_USER_SCRAM_CREDENTIALS: 0,
    ALTER_USER_SCRAM_CREDENTIALS: 0, DESCRIBE_CLUSTER: 0, DESCRIBE_PRODUCERS: 0, DESCRIBE_TRANSACTIONS: 0,
    LIST_TRANSACTIONS: 0, CONSUMER_GROUP_HEARTBEAT: 0, CONSUMER_GROUP_DESCRIBE: 0, DESCRIBE_QUORUM: 0,
    STREAMS_GROUP_HEARTBEAT: 0, STREAMS_GROUP_DESCRIBE: 0, SHARE_GROUP_HEARTBEAT: 0, SHARE_GROUP_DESCRIBE: 0,
    SHARE_FETCH: 0, SHARE_ACKNOWLEDGE: 0, DESCRIBE_SHARE_GROUP_OFFSETS: 0, ALTER_SHARE_GROUP_OFFSETS: 0,
    DELETE_SHARE_GROUP_OFFSETS: 0,
    DESCRIBE_CLIENT_QUOTAS: 1, WRITE_TXN_MARKERS: 1,
}  # SaslHandshake and OffsetDelete have no flexible version


def is_supported(api_key: int, api_version: int) -> bool:
    span = SUPPORTED_APIS.get(api_key)
    return span is not None and span[0] <= api_version <= span[1]


def frame_size(buffer: Any, offset: int = 0, max_request_size: int = DEFAULT_MAX_REQUEST_SIZE) -> int | None:
    """Size of the frame starting at ``offset`` (prefix excluded), or None if fewer than 4 bytes are there.

    Raises ProtocolError on a negative size or one over ``max_request_size``.
    """
    if len(buffer) - offset < FRAME_SIZE_PREFIX:
        return None
    (size,) = _SIZE.unpack_from(buffer, offset)
    if size < 0 or size > max_request_size:
        raise ProtocolError(f"frame size {size} outside [0, {max_request_size}]")
    return size


def split_frames(
    buffer: Any, max_request_size: int = DEFAULT_MAX_REQUEST_SIZE
) -> tuple[list[memoryview], int]:
    """Whole frames (views without the prefix) at the start of ``buffer`` and the bytes they use."""
    view = memoryview(buffer)
    frames = []
    pos = 0
    while True:
        size = frame_size(view, pos, max_request_size)
        if size is None or len(view) - pos - FRAME_SIZE_PREFIX < size:
            return frames, pos
        frames.append(view[pos + FRAME_SIZE_PREFIX : pos + FRAME_SIZE_PREFIX + size])
        pos += FRAME_SIZE_PREFIX + size


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the request body starts in the frame
    flexible: bool = False  # a flexible version (KIP-482): header v2, compact encodings, tagged fields


_read_header_v1 = entity_reader(KioRequestHeaderV1)
_API_KEY_AND_VERSION = struct.Struct(">hh")


def parse_request_header_python(frame: Any) -> RequestHeader:
    """Parse a request header (v1, or v2 for a flexible version) at the start of a frame.

    Works for any api key and version (so an unsupported request can still be answered or logged with its
    correlation id); the body offset is exact for every version in SUPPORTED_APIS and for ApiVersions of any
    version. Header v2 is v1 (client_id stays a legacy string) plus a tagged-field section, skipped whole: the
    node uses none of its tags. `parse_request_header` is the compiled form of this (workers/codecs/_header.c)
    where it was built, with the same results and the same errors (ProtocolError).
    """
    if len(frame) < _API_KEY_AND_VERSION.size:
        raise ProtocolError(f"request header truncated ({len(frame)} bytes)")
    api_key, api_version = _API_KEY_AND_VERSION.unpack_from(frame, 0)
    try:
        header, size = _read_header_v1(frame, 0)
    except Exception as exc:  # kio raises several types on bad input; all mean malformed
        raise ProtocolError(f"request header malformed: {type(exc).__name__}: {exc}") from None
    flexible = api_version >= FIRST_FLEXIBLE.get(api_key, _NEVER)
    if flexible:  # an empty section (one 0 byte) stepped over inline: every request pays this
        size = size + 1 if len(frame) > size and frame[size] == 0 else skip_tagged_fields(frame, size, len(frame))
    return RequestHeader(api_key, api_version, header.correlation_id, header.client_id, size, flexible)


_NEVER = 1 << 15  # past every int16 version: an API the node does not serve is read with header v1
try:
    from shmbroker.workers.codecs import _header
except ImportError:  # built without a C compiler (setup.py): the Python parser
    _header = None
    parse_request_header = parse_request_header_python
else:
    _header.configure(RequestHeader, ProtocolError, FIRST_FLEXIBLE)
    parse_request_header = _header.parse


def _kio_namespace(api_key: int, version: int, entity_type: EntityType) -> ModuleType | SimpleNamespace:
    legacy = legacy_schema(api_key, version)
    if legacy is not None:
        return legacy
    return load_payload_module(api_key, version, entity_type)


def _payload_class(namespace: Any, entity_type: EntityType) -> type:
    if isinstance(namespace, SimpleNamespace):
        return namespace.request if entity_type == EntityType.request else namespace.response
    for value in vars(namespace).values():
        if isinstance(value, type) and getattr(value, "__type__", None) == entity_type:
            return value
    raise LookupError(f"no {entity_type.name} class in {namespace}")


class Codec(NamedTuple):
    """What one served API version needs: kio's request and response namespaces, classes, reader and writer."""

    request_schema: Any
    response_schema: Any
    request_class: type
    reader: Any
    response_class: type
    writer: Any


def _load_codec(api_key: int, version: int) -> Codec:
    request_ns = _kio_namespace(api_key, version, EntityType.request)
    response_ns = _kio_namespace(api_key, version, EntityType.response)
    request_cls = _payload_class(request_ns, EntityType.request)
    response_cls = _payload_class(response_ns, EntityType.response)
    return Codec(request_ns, response_ns, request_cls, entity_reader(request_cls), response_cls,
                 entity_writer(response_cls))


# (api_key, version) -> Codec, loaded at a version's first use: kio's ~400 schema modules of the served versions
# took most of a worker's start (2 s of 2.6 s on a 2-vCPU VM), and a worker meets few of them. The first request
# of a version pays its import once (milliseconds).
_CODECS: dict[tuple[int, int], Codec] = {}


def codec(api_key: int, version: int) -> Codec:
    """The codec of a served API version; ProtocolError for one the node does not serve."""
    found = _CODECS.get((api_key, version))
    if found is None:
        if not is_supported(api_key, version):
            raise ProtocolError(f"unsupported api {api_key} v{version}")
        found = _CODECS[api_key, version] = _load_codec(api_key, version)
    return found


def request_schema(api_key: int, version: int) -> Any:
    """Namespace (kio module) with the request classes of that API version."""
    return codec(api_key, version).request_schema


def response_schema(api_key: int, version: int) -> Any:
    """Namespace (kio module) with the response classes of that API version, for handlers to build answers."""
    return codec(api_key, version).response_schema


def response_class(api_key: int, version: int) -> type:
    """The top-level kio response dataclass for that API version."""
    return codec(api_key, version).response_class


def decode_request(api_key: int, version: int, body: Any) -> Any:
    """Decode a request body: a ProduceRequestView for Produce, a kio request dataclass otherwise."""
    if api_key == PRODUCE:
        return decode_produce_request(version, body)
    found = codec(api_key, version)
    received = body
    if version >= FIRST_FLEXIBLE.get(api_key, _NEVER):
        # kio's reader aborts the process on a huge compact-array count and refuses unknown tags (KIP-482 says
        # skip them): the walk bounds every count first, and a body with unknown tags is read without them.
        tags = known_tags_filter(found.request_class)
        if tags.check(body):
            body = tags.filter(body)
    try:
        request, size = found.reader(body, 0)
    except Exception as exc:  # kio raises DecodeError, ValueError, ... on bad input; all mean malformed
        raise ProtocolError(f"api {api_key} v{version}: malformed request: {type(exc).__name__}: {exc}") from None
    if size != len(body):
        if api_key == METADATA and received[:_RDKAFKA_TOPIC_COUNT_SLOT] == _RDKAFKA_UNWRITTEN_COUNT:
            return decode_request(api_key, version, received[_RDKAFKA_TOPIC_COUNT_SLOT - 1:])
        if api_key == ALTER_USER_SCRAM_CREDENTIALS and bytes(body[size:]) == _EMPTY_TAGS:
            return request  # librdkafka (2.x) ends this request with its empty tag section written twice
        raise ProtocolError(f"api {api_key} v{version}: {len(body) - size} trailing bytes")
    return request


_EMPTY_TAGS = b"\x00"

# librdkafka (2.x) asks Metadata v9+ for all topics with the 4 bytes it reserved for the topic count left zero: a
# null compact array (one byte 0) and three more. Kafka reads on and ignores what is left over; here the slot is
# read as the null array it means (the request's flags after it keep their values).
_RDKAFKA_TOPIC_COUNT_SLOT = 4
_RDKAFKA_UNWRITTEN_COUNT = bytes(_RDKAFKA_TOPIC_COUNT_SLOT)


def encode_response(api_key: int, version: int, correlation_id: int, response: Any) -> bytes:
    """A whole response frame: size prefix, header v0 and the kio-encoded body."""
    found = codec(api_key, version)
    response_cls, writer = found.response_class, found.writer
    if type(response) is not response_cls:
        raise ProtocolError(
            f"api {api_key} v{version}: expected {response_cls.__qualname__}, got {type(response).__qualname__}"
        )
    return _frame(correlation_id, writer, response, response_cls.__header_schema__.__version__ >= 1)


def _frame(correlation_id: int, writer: Any, response: Any, header_v1: bool = False) -> bytes:
    buffer = io.BytesIO()
    buffer.write(bytes(_SIZE_AND_CORRELATION.size))
    if header_v1:
        buffer.write(RESPONSE_HEADER_V1_TAGS)
    try:
        writer(buffer, response)
    except Exception as exc:  # kio raises EncodeError, OutOfBoundValue, TypeError on bad values
        raise ProtocolError(f"cannot encode {type(response).__qualname__}: {type(exc).__name__}: {exc}") from None
    frame = buffer.getbuffer()
    _SIZE_AND_CORRELATION.pack_into(frame, 0, len(frame) - FRAME_SIZE_PREFIX, correlation_id)
    del frame  # release the export so getvalue() may run
    return buffer.getvalue()


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def build_entity(cls: type, **values: Any) -> Any:
    """Construct kio dataclass ``cls`` from ``values``, ignoring those its version lacks.

    Lets one handler answer every version: pass the newest field set and each
    version keeps the fields it has (its defaults fill the rest). Error codes
    must be ``ErrorCode`` members and durations ``datetime.timedelta``, as kio expects.
    """
    names = _field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def api_versions_response(
    version: int, error_code: ErrorCode = NONE, apis: Mapping[int, tuple[int, int]] | None = None
) -> Any:
    """The ApiVersions response (of ``version``) advertising ``apis`` (default SUPPORTED_APIS).

    Note for whoever sets ``apis``: librdkafka enables LZ4 only when the broker
    advertises FindCoordinator (api key 10) v0 (its rdkafka_feature.c maps LZ4 to
    "0.8.2", the release that added group coordinators); without it a producer
    configured with compression.type=lz4 silently sends uncompressed batches.
    """
    schema = response_schema(API_VERSIONS, version)
    api_keys = tuple(
        schema.ApiVersion(api_key=i16(key), min_version=i16(low), max_version=i16(high))
        for key, (low, high) in sorted((SUPPORTED_APIS if apis is None else apis).items())
    )
    fields = {"error_code": error_code, "api_keys": api_keys}
    if version >= 1:
        fields["throttle_time"] = i32Timedelta.parse(datetime.timedelta(0))
    return schema.ApiVersionsResponse(**fields)


_WRITE_API_VERSIONS_V0 = entity_writer(ApiVersionsResponseV0)


def encode_api_versions_unsupported(correlation_id: int) -> bytes:
    """Kafka's answer to an ApiVersions request of a version it does not know:
    error UNSUPPORTED_VERSION (35) in a v0 body that still lists what is supported,
    so the client can retry with a version from that list."""
    response = ApiVersionsResponseV0(
        error_code=UNSUPPORTED_VERSION,
        api_keys=tuple(
            ApiVersionV0(api_key=i16(key), min_version=i16(low), max_version=i16(high))
            for key, (low, high) in sorted(SUPPORTED_APIS.items())
        ),
    )
    return _frame(correlation_id, _WRITE_API_VERSIONS_V0, response)


__all__ = [
    "PRODUCE",
    "FETCH",
    "LIST_OFFSETS",
    "METADATA",
    "API_VERSIONS",
    "CREATE_TOPICS",
    "DELETE_TOPICS",
    "DELETE_RECORDS",
    "INIT_PRODUCER_ID",
    "ADD_PARTITIONS_TO_TXN",
    "ADD_OFFSETS_TO_TXN",
    "END_TXN",
    "WRITE_TXN_MARKERS",
    "TXN_OFFSET_COMMIT",
    "DESCRIBE_CONFIGS",
    "ALTER_CONFIGS",
    "CREATE_PARTITIONS",
    "INCREMENTAL_ALTER_CONFIGS",
    "FIND_COORDINATOR",
    "JOIN_GROUP",
    "SYNC_GROUP",
    "HEARTBEAT",
    "LEAVE_GROUP",
    "OFFSET_COMMIT",
    "OFFSET_FETCH",
    "LIST_GROUPS",
    "DESCRIBE_GROUPS",
    "DELETE_GROUPS",
    "OFFSET_DELETE",
    "CONSUMER_GROUP_HEARTBEAT",
    "CONSUMER_GROUP_DESCRIBE",
    "STREAMS_GROUP_HEARTBEAT",
    "STREAMS_GROUP_DESCRIBE",
    "DESCRIBE_CLUSTER",
    "DESCRIBE_QUORUM",
    "DESCRIBE_CLIENT_QUOTAS",
    "DESCRIBE_PRODUCERS",
    "DESCRIBE_TRANSACTIONS",
    "LIST_TRANSACTIONS",
    "DESCRIBE_ACLS",
    "CREATE_ACLS",
    "DELETE_ACLS",
    "DESCRIBE_USER_SCRAM_CREDENTIALS",
    "ALTER_USER_SCRAM_CREDENTIALS",
    "SUPPORTED_APIS",
    "DEFAULT_MAX_REQUEST_SIZE",
    "FRAME_SIZE_PREFIX",
    "ProtocolError",
    "RequestHeader",
    "ProduceRequestView",
    "FetchPartitionResult",
    "FetchTopicResult",
    "FetchResponseFrame",
    "FileRange",
    "is_supported",
    "frame_size",
    "split_frames",
    "parse_request_header",
    "decode_request",
    "encode_response",
    "encode_fetch_response",
    "encode_produce_response",
    "ProducePartitionResult",
    "ProduceTopicResult",
    "request_schema",
    "response_schema",
    "response_class",
    "api_versions_response",
    "build_entity",
    "encode_api_versions_unsupported",
]
