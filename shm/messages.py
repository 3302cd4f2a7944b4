"""The worker-timer contract: every message that crosses the rings between a network worker and the
timer process, declared here as data, with the one codec both sides use.

A message is one ring frame:

    header   kind u8, layout version u8, item count u16, reserved u32          (8 bytes)
    body     the kind's fixed fields, packed little-endian                      (may be empty)
    items    `count` records of the kind's item fields, packed little-endian    (may be none)
    document the rest of the frame: an orjson document, for kinds that carry one (rare messages with
             strings and nested values: topic names, per-topic outcomes)

Each kind is declared once, below, by `declare(kind, direction, body=..., items=..., document=...)`: field
names and struct codes. `encode(kind, body..., items=..., document=...)` builds a frame; `decode(frame)`
returns the kind's named tuple (body fields, then `items` as a list of tuples, then `document`), whose
class carries `.kind`. Adding a message is a local change: a `Kind` member, one `declare` line, a
handler registered for it on the receiving side (the timer's and the worker's dispatch tables are
keyed by kind), and its sender.

Kinds below 64 travel from a worker to the timer, kinds from 64 up from the timer to a worker, so
either side rejects a frame that came the wrong way.

Why struct and not numpy: both sides hold Python values (a handful of items per frame), and from and
to Python values struct measured faster at every size tried, 1 to 512 items (3-6x at 1 item, about
2x at 512; measured with the numpy codec this module replaced).

Invariants:
- len(frame) == 8 + body size + count * item size for kinds without a document; a document kind's
  frame is at least that long and the rest is its document. `decode` checks this and raises
  MessageError (a ValueError) on any mismatch, unknown kind or version, undecodable document; never
  anything else. Encoders raise MessageError for values that do not fit their fields.
- count < 2**16 (MAX_ITEMS); senders with more items split them over several frames.
- Times are monotonic milliseconds; byte positions are logical byte counts appended to a partition
  so far (they only grow); a row is a partition's row in the shared partition table.
"""

from __future__ import annotations

import struct
from collections import namedtuple
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Iterable

import orjson

LAYOUT_VERSION = 4  # 3 was used by two different layouts (admin kinds; completion error codes)
MAX_ITEMS = 0xFFFF
HEADER = struct.Struct("<BBHI")
FIRST_TIMER_KIND = 64  # kinds >= this travel timer -> worker


class MessageError(ValueError):
    """A frame that cannot be encoded or decoded as a message of this contract."""


class Kind(IntEnum):
    # worker -> timer
    DELAY_FETCH = 1  # a long-poll fetch: answer when min_bytes are appended past start_bytes, or at the deadline
    DELAY_PRODUCE = 2  # an acks=all produce: answer when every row is fsync'd to required_offset, or at the deadline
    # 3 was APPEND (an append to a watched row): workers answer what their appends satisfy (workers.timer_client.delayed)
    CANCEL = 4  # complete these delayed requests without an answer: their client is gone, or the worker answered
    # Topic administration (node.timer.controller), each answered by a REPLY. Those with a deadline (monotonic ms,
    # the request's own timeout) are refused REQUEST_TIMED_OUT, with nothing done, if they start after it.
    CREATE_TOPICS = 5  # document: {"topics": [[name, partitions, {config: value}], ...], "validate_only", "explicit"}
    DELETE_TOPICS = 6  # document: [name, ...]
    CREATE_PARTITIONS = 7  # document: {"topics": [[name, new total], ...], "validate_only"}
    ALTER_CONFIGS = 8  # document: {"resources": [[type, name, "replace" | "incremental", changes], ...], "validate_only"}
    DELETE_RECORDS = 9  # document: [[topic, partition, offset], ...]
    FLUSH = 10  # rows whose unflushed records reached their topic's flush.messages: start an fsync round
    # The group coordinator's requests (node.timer.groups): body (request id, the Kafka API version), and the
    # request as a document (bytes fields base64); answered by a REPLY with the response as a document.
    JOIN_GROUP = 16
    SYNC_GROUP = 17
    HEARTBEAT = 18
    LEAVE_GROUP = 19
    COMMIT_OFFSETS = 20
    FETCH_OFFSETS = 21
    LIST_GROUPS = 22
    DESCRIBE_GROUPS = 23
    DELETE_GROUPS = 24
    DELETE_OFFSETS = 25
    # Client quotas (node.timer.quotas)
    QUOTA_USAGE = 32  # report number; document: {client id: [produce bytes, fetch bytes]} since the last report
    THROTTLE = 33  # hold a throttled client until deadline_ms; document: the client id (for its counters)
    # timer -> worker
    COMPLETION = 64  # delayed requests that completed: satisfied, expired, or failed with a Kafka error code
    REPLY = 65  # the answer to a request that carries a document (topics, groups); document: the outcome
    TIMER_STARTED = 66  # a timer process (re)started: re-submit every delayed request still waiting
    LAYOUT = 67  # the topic catalog changed: reload it if older than catalog_version
    # document: {"rates": {client id: [produce bytes/s, fetch bytes/s, produce window ms, fetch window ms]},
    # "counted": {worker: the last report number counted in these rates}}, node-wide
    QUOTA_STATE = 68


class Status(IntEnum):
    """How a delayed request completed."""

    SATISFIED = 1
    EXPIRED = 2
    FAILED = 3  # it can never be satisfied: the item's error_code (a Kafka error code) says why


@dataclass(frozen=True)
class MessageType:
    kind: Kind
    body: struct.Struct
    item: struct.Struct
    document: bool
    tuple_class: type
    head: struct.Struct  # header and body in one struct: one pack or unpack call for both

    @property
    def to_timer(self) -> bool:
        return self.kind < FIRST_TIMER_KIND


MESSAGES: dict[int, MessageType] = {}
_BY_BYTE: list[MessageType | None] = [None] * 256  # kind byte -> its type, without an enum call per frame


def declare(kind: Kind, body: Iterable[tuple[str, str]] = (), items: Iterable[tuple[str, str]] = (),
            document: bool = False) -> MessageType:
    """Declare a kind: body and item fields as (name, struct code), and whether a document follows."""
    body, items = tuple(body), tuple(items)
    names = [name for name, _ in body] + ["items", "document"]
    tuple_class = namedtuple(kind.name.title().replace("_", ""), names)
    tuple_class.kind = kind
    codes = "".join(code for _, code in body)
    message = MessageType(kind, struct.Struct("<" + codes), struct.Struct("<" + "".join(code for _, code in items)),
                          document, tuple_class, struct.Struct("<BBHI" + codes))
    MESSAGES[kind] = message
    _BY_BYTE[kind] = message
    return message


DelayFetch = declare(Kind.DELAY_FETCH, body=[("request_id", "Q"), ("deadline_ms", "q"), ("min_bytes", "i")],
                     items=[("row", "I"), ("start_bytes", "q")]).tuple_class
DelayProduce = declare(Kind.DELAY_PRODUCE, body=[("request_id", "Q"), ("deadline_ms", "q")],
                       items=[("row", "I"), ("required_offset", "q")]).tuple_class
Cancel = declare(Kind.CANCEL, items=[("request_id", "Q")]).tuple_class
CreateTopics = declare(Kind.CREATE_TOPICS, body=[("request_id", "Q"), ("deadline_ms", "q")], document=True).tuple_class
DeleteTopics = declare(Kind.DELETE_TOPICS, body=[("request_id", "Q")], document=True).tuple_class
CreatePartitions = declare(Kind.CREATE_PARTITIONS, body=[("request_id", "Q"), ("deadline_ms", "q")],
                           document=True).tuple_class
AlterConfigs = declare(Kind.ALTER_CONFIGS, body=[("request_id", "Q")], document=True).tuple_class
DeleteRecords = declare(Kind.DELETE_RECORDS, body=[("request_id", "Q"), ("deadline_ms", "q")],
                        document=True).tuple_class
Flush = declare(Kind.FLUSH, items=[("row", "I")]).tuple_class
Completion = declare(Kind.COMPLETION, items=[("request_id", "Q"), ("status", "B"), ("error_code", "h")]).tuple_class
GROUP_KINDS = (Kind.JOIN_GROUP, Kind.SYNC_GROUP, Kind.HEARTBEAT, Kind.LEAVE_GROUP, Kind.COMMIT_OFFSETS,
               Kind.FETCH_OFFSETS, Kind.LIST_GROUPS, Kind.DESCRIBE_GROUPS, Kind.DELETE_GROUPS, Kind.DELETE_OFFSETS)
for _kind in GROUP_KINDS:
    declare(_kind, body=[("request_id", "Q"), ("api_version", "H")], document=True)
QuotaUsage = declare(Kind.QUOTA_USAGE, body=[("report", "Q")], document=True).tuple_class
Throttle = declare(Kind.THROTTLE, body=[("request_id", "Q"), ("deadline_ms", "q"), ("throttle_ms", "I"),
                                        ("quota_kind", "B")], document=True).tuple_class
QuotaState = declare(Kind.QUOTA_STATE, document=True).tuple_class
Reply = declare(Kind.REPLY, body=[("request_id", "Q")], document=True).tuple_class
TimerStarted = declare(Kind.TIMER_STARTED, body=[("pid", "I")]).tuple_class
Layout = declare(Kind.LAYOUT, body=[("catalog_version", "Q")]).tuple_class


def encode(kind: Kind, *body: Any, items: Iterable[tuple] = (), document: Any = None) -> bytes:
    """A frame of `kind` from its body values (in declared order), item tuples and document."""
    message = MESSAGES[kind]
    if items:
        if not message.item.size:
            raise MessageError(f"{kind.name} has no items")
        items = items if isinstance(items, (list, tuple)) else list(items)
        if len(items) > MAX_ITEMS:
            raise MessageError(f"{kind.name}: {len(items)} items, at most {MAX_ITEMS} per frame")
    try:
        head = message.head.pack(kind, LAYOUT_VERSION, len(items), 0, *body)
        if items:
            pack = message.item.pack
            head += b"".join([pack(*item) for item in items])
    except (struct.error, TypeError) as exc:
        raise MessageError(f"{kind.name}: bad values: {exc}") from None
    if message.document:
        try:
            return head + orjson.dumps(document)
        except TypeError as exc:
            raise MessageError(f"{kind.name}: document not serialisable: {exc}") from None
    if document is not None:
        raise MessageError(f"{kind.name} carries no document")
    return head


def with_request_id(frame: bytes, request_id: int) -> bytes:
    """The frame with another request id, for kinds whose body starts with one (every kind a worker waits on
    for a REPLY), so a request encoded once (to check its size) is sent under the id it gets later."""
    out = bytearray(frame)
    REQUEST_ID.pack_into(out, HEADER.size, request_id)
    return bytes(out)


REQUEST_ID = struct.Struct("<Q")


def kind_of(frame) -> Kind:
    """The kind of a frame (bytes or memoryview); MessageError if unknown or truncated."""
    if len(frame) < HEADER.size:
        raise MessageError(f"frame of {len(frame)} bytes is shorter than its header")
    message = _BY_BYTE[frame[0]]
    if message is None:
        raise MessageError(f"unknown message kind {frame[0]}")
    return message.kind


def decode(frame) -> Any:
    """The message in `frame`: its kind's named tuple (class attribute `.kind`)."""
    size = len(frame)
    message = _BY_BYTE[frame[0]] if size else None
    if message is None or size < message.head.size:
        kind_of(frame)  # raises the precise error
        raise MessageError(f"{message.kind.name} frame of {size} bytes is shorter than its header and body")
    head = message.head.unpack_from(frame, 0)
    if head[1] != LAYOUT_VERSION:
        raise MessageError(f"{message.kind.name} frame of layout version {head[1]}, expected {LAYOUT_VERSION}")
    count = head[2]
    items_start = message.head.size
    end = items_start + count * message.item.size
    if size < end or (size != end and not message.document) or (count and not message.item.size):
        raise MessageError(f"{message.kind.name} frame with {count} items has {size} bytes")
    items = list(message.item.iter_unpack(frame[items_start:end])) if count else []
    document = None
    if message.document:
        try:
            document = orjson.loads(frame[end:])
        except orjson.JSONDecodeError as exc:
            raise MessageError(f"{message.kind.name}: bad document: {exc}") from None
    return message.tuple_class(*head[4:], items, document)
