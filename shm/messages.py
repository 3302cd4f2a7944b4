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

LAYOUT_VERSION = 3
MAX_ITEMS = 0xFFFF
HEADER = struct.Struct("<BBHI")
FIRST_TIMER_KIND = 64  # kinds >= this travel timer -> worker


class MessageError(ValueError):
    """A frame that cannot be encoded or decoded as a message of this contract."""


class Kind(IntEnum):
    # worker -> timer
    DELAY_FETCH = 1  # a long-poll fetch: answer when min_bytes are appended past start_bytes, or at the deadline
    DELAY_PRODUCE = 2  # an acks=all produce: answer when every row is fsync'd to required_offset, or at the deadline
    APPEND = 3  # rows appended to that delayed fetches watch (the table says how much; this says "look again")
    CANCEL = 4  # the client of these delayed requests is gone: complete them without an answer
    CREATE_TOPICS = 5  # document: [[name, partitions], ...]
    DELETE_TOPICS = 6  # document: [name, ...]
    # timer -> worker
    COMPLETION = 64  # delayed requests that completed: satisfied, expired, or failed with a Kafka error code
    TOPICS_OUTCOME = 65  # the answer to CREATE_TOPICS / DELETE_TOPICS; document: {name: [error code, message]}
    TIMER_STARTED = 66  # a timer process (re)started: re-submit every delayed request still waiting
    LAYOUT = 67  # the topic catalog changed: reload it if older than catalog_version


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

    @property
    def to_timer(self) -> bool:
        return self.kind < FIRST_TIMER_KIND


MESSAGES: dict[int, MessageType] = {}


def declare(kind: Kind, body: Iterable[tuple[str, str]] = (), items: Iterable[tuple[str, str]] = (),
            document: bool = False) -> MessageType:
    """Declare a kind: body and item fields as (name, struct code), and whether a document follows."""
    body, items = tuple(body), tuple(items)
    names = [name for name, _ in body] + ["items", "document"]
    tuple_class = namedtuple(kind.name.title().replace("_", ""), names)
    tuple_class.kind = kind
    message = MessageType(kind, struct.Struct("<" + "".join(code for _, code in body)),
                          struct.Struct("<" + "".join(code for _, code in items)), document, tuple_class)
    MESSAGES[kind] = message
    return message


DelayFetch = declare(Kind.DELAY_FETCH, body=[("request_id", "Q"), ("deadline_ms", "q"), ("min_bytes", "i")],
                     items=[("row", "I"), ("start_bytes", "q")]).tuple_class
DelayProduce = declare(Kind.DELAY_PRODUCE, body=[("request_id", "Q"), ("deadline_ms", "q")],
                       items=[("row", "I"), ("required_offset", "q")]).tuple_class
Append = declare(Kind.APPEND, items=[("row", "I")]).tuple_class
Cancel = declare(Kind.CANCEL, items=[("request_id", "Q")]).tuple_class
CreateTopics = declare(Kind.CREATE_TOPICS, body=[("request_id", "Q")], document=True).tuple_class
DeleteTopics = declare(Kind.DELETE_TOPICS, body=[("request_id", "Q")], document=True).tuple_class
Completion = declare(Kind.COMPLETION, items=[("request_id", "Q"), ("status", "B"), ("error_code", "h")]).tuple_class
TopicsOutcome = declare(Kind.TOPICS_OUTCOME, body=[("request_id", "Q")], document=True).tuple_class
TimerStarted = declare(Kind.TIMER_STARTED, body=[("pid", "I")]).tuple_class
Layout = declare(Kind.LAYOUT, body=[("catalog_version", "Q")]).tuple_class


def encode(kind: Kind, *body: Any, items: Iterable[tuple] = (), document: Any = None) -> bytes:
    """A frame of `kind` from its body values (in declared order), item tuples and document."""
    message = MESSAGES[kind]
    items = items if isinstance(items, (list, tuple)) else list(items)
    count = len(items)
    if count > MAX_ITEMS:
        raise MessageError(f"{kind.name}: {count} items, at most {MAX_ITEMS} per frame")
    if count and not message.item.size:
        raise MessageError(f"{kind.name} has no items")
    try:
        parts = [HEADER.pack(kind, LAYOUT_VERSION, count, 0)]
        if message.body.size:
            parts.append(message.body.pack(*body))
        elif body:
            raise MessageError(f"{kind.name} has no body fields")
        pack = message.item.pack
        parts.extend(pack(*item) for item in items)
    except (struct.error, TypeError) as exc:
        raise MessageError(f"{kind.name}: bad values: {exc}") from None
    if message.document:
        try:
            parts.append(orjson.dumps(document))
        except TypeError as exc:
            raise MessageError(f"{kind.name}: document not serialisable: {exc}") from None
    elif document is not None:
        raise MessageError(f"{kind.name} carries no document")
    return b"".join(parts)


def kind_of(frame) -> Kind:
    """The kind of a frame (bytes or memoryview); MessageError if unknown or truncated."""
    if len(frame) < HEADER.size:
        raise MessageError(f"frame of {len(frame)} bytes is shorter than its header")
    try:
        return Kind(frame[0])
    except ValueError:
        raise MessageError(f"unknown message kind {frame[0]}") from None


def decode(frame) -> Any:
    """The message in `frame`: its kind's named tuple (class attribute `.kind`)."""
    kind = kind_of(frame)
    _, version, count, _ = HEADER.unpack_from(frame, 0)
    if version != LAYOUT_VERSION:
        raise MessageError(f"{kind.name} frame of layout version {version}, expected {LAYOUT_VERSION}")
    message = MESSAGES[kind]
    items_start = HEADER.size + message.body.size
    end = items_start + count * message.item.size
    if len(frame) < end or (len(frame) != end and not message.document) or (count and not message.item.size):
        raise MessageError(f"{kind.name} frame with {count} items has {len(frame)} bytes")
    body = message.body.unpack_from(frame, HEADER.size) if message.body.size else ()
    items = list(message.item.iter_unpack(frame[items_start:end])) if count else []
    document = None
    if message.document:
        try:
            document = orjson.loads(bytes(frame[end:]))
        except orjson.JSONDecodeError as exc:
            raise MessageError(f"{kind.name}: bad document: {exc}") from None
    return message.tuple_class(*body, items, document)
