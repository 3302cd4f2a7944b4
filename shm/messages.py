"""The worker-timer contract: every message that crosses the rings between a network worker and the
timer process, declared here as data, with the one codec both sides use.

A message is one ring frame:

    header   kind u8, layout version u8, item count u16, reserved u32          (8 bytes)
    body     the kind's fixed fields, packed little-endian                      (may be empty)
    then one of:
    items    `count` records of the kind's item fields, packed little-endian    (the hot kinds: long polls,
             acks=all waits, completions, cancels)
    fields   the kind's typed fields, in declared order, as one msgpack array   (the group coordinator's
             requests, quotas: texts as str, bytes as bin, lists of records as arrays)
    document one msgpack value of no declared shape                             (rare control messages:
             topic administration, whose nested configs have no fixed shape)

A kind's fields are declared as (name, type) pairs: a struct code (a number), STR (text), OPT_STR (text or
None), BYTES (bytes as bytes), Array(element) or Array(element, nullable=True) (a list of numbers, texts,
bytes or records; `record(name, fields)` declares a record as a named tuple class). msgpack (C) carries
them: built from Python values it measured 5x faster than a struct-based codec of the same layouts written
here, and as fast as the orjson documents with base64 bytes it replaced.

A kind that a worker waits on declares its answer too (`reply=`: a record, or DOCUMENT): the timer's REPLY
carries the request id, the request's kind and the answer in that layout, so the worker reads it back
without knowing more than the frame.

Each kind is declared once, below, by `declare(kind, body=..., items=... | fields=... | document=True,
reply=...)`. `encode(kind, *values, items=..., document=...)` builds a frame from the body's values (and,
for a kind with fields, the fields' values after them); `encode_message(message)` builds it from the
kind's named tuple; `encode_reply(request_id, kind, answer)` builds a REPLY. `decode(frame)` returns the
kind's named tuple, whose class carries `.kind` (a REPLY: request id, the request's kind, the answer as
its reply record); records nested in fields come as plain tuples in declared order. Adding a message is a
local change: a `Kind` member, one `declare` line, a handler registered for it on the receiving side (the
timer's and the worker's dispatch tables are keyed by kind), and its sender.

Kinds below 64 travel from a worker to the timer, kinds from 64 up from the timer to a worker, so
either side rejects a frame that came the wrong way.

Why struct for the body and items, and not numpy: both sides hold Python values (a handful of items per
frame), and from and to Python values struct measured faster at every size tried, 1 to 512 items (3-6x at
1 item, about 2x at 512).

Invariants:
- A frame is exactly its header, body and items, fields or document: `decode` checks the lengths, the item
  count, the number of fields and that the msgpack part is whole and valid, and raises MessageError (a
  ValueError) on any mismatch, unknown kind or version, never anything else. Encoders raise MessageError for
  values that do not fit their body, items or number of fields. The types inside fields are the sender's to
  get right (`conforms` checks a message against its layout; the tests check every kind with it).
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

import msgpack
import numpy as np

LAYOUT_VERSION = 7  # 7: share groups' kinds (KIP-932); 6: delayed fetch items say where read_committed became stable
MAX_ITEMS = 0xFFFF
HEADER = struct.Struct("<BBHI")
FIRST_TIMER_KIND = 64  # kinds >= this travel timer -> worker


class MessageError(ValueError):
    """A frame that cannot be encoded or decoded as a message of this contract."""


class Kind(IntEnum):
    # worker -> timer
    DELAY_FETCH = 1  # a long-poll fetch: answer when min_bytes are appended past start_bytes (and, for a
    # read_committed one, its row's LSO moved past stable_from), or at the deadline (shm.fetch_condition)
    DELAY_PRODUCE = 2  # an acks=all produce: answer when every row is fsync'd to required_offset, or at the deadline
    CANCEL = 4  # complete these delayed requests without an answer: their client is gone, or the worker answered
    # Topic administration (node.timer.controller), each answered by a REPLY. Those with a deadline (monotonic ms,
    # the request's own timeout) are refused REQUEST_TIMED_OUT, with nothing done, if they start after it.
    CREATE_TOPICS = 5  # document: {"topics": [[name, partitions, {config: value}], ...], "validate_only", "explicit"}
    DELETE_TOPICS = 6  # document: [name or [name, topic id text], ...]
    CREATE_PARTITIONS = 7  # document: {"topics": [[name, new total], ...], "validate_only"}
    ALTER_CONFIGS = 8  # document: {"resources": [[type, name, "replace" | "incremental", changes], ...], "validate_only"}
    DELETE_RECORDS = 9  # document: [[topic, partition, offset], ...]
    FLUSH = 10  # rows whose unflushed records reached their topic's flush.messages: start an fsync round
    # The group coordinator's requests (node.timer.groups): the Kafka request's fields, answered by a REPLY with
    # the response's fields; the worker builds the response of the request's API version from them.
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
    # The consumer group protocol (KIP-848; node.timer.groups.consumer), answered by a REPLY as the group kinds are.
    CONSUMER_GROUP_HEARTBEAT = 36
    CONSUMER_GROUP_DESCRIBE = 37
    # The Streams rebalance protocol (KIP-1071; node.timer.groups.streams), answered by a REPLY as the group kinds are.
    STREAMS_GROUP_HEARTBEAT = 38
    STREAMS_GROUP_DESCRIBE = 39
    # Share groups (KIP-932; node.timer.groups.share), answered by a REPLY as the group kinds are: membership, and
    # the share-partitions' records (acquisitions, acknowledgements) of ShareFetch and ShareAcknowledge.
    SHARE_GROUP_HEARTBEAT = 42
    SHARE_GROUP_DESCRIBE = 43
    SHARE_FETCH = 44
    SHARE_GROUP_OFFSETS = 45  # DescribeShareGroupOffsets: each share-partition's start offset and lag
    ALTER_SHARE_OFFSETS = 46  # AlterShareGroupOffsets (new start offsets) and DeleteShareGroupOffsets (state gone)
    # The transaction coordinator's requests (node.timer.transactions), answered by a REPLY as the group kinds are.
    INIT_PRODUCER_ID = 26  # with a transactional.id (one without is answered by the worker)
    ADD_PARTITIONS_TO_TXN = 27
    ADD_OFFSETS_TO_TXN = 28
    END_TXN = 29
    TXN_OFFSET_COMMIT = 30
    LIST_TRANSACTIONS = 34  # the coordinator's transactions, filtered (ListTransactions)
    DESCRIBE_TRANSACTIONS = 35  # named transactional ids' state (DescribeTransactions)
    # Client quotas (node.timer.quotas)
    QUOTA_USAGE = 32  # what each client id produced and fetched since the worker's last report
    THROTTLE = 33  # hold a throttled client until deadline_ms
    # The log cleaner (node.cleaner), on the rings after the workers': its outcomes and its state
    CLEANED = 40  # a partition's cleaning ended: what it did, or why it failed
    CLEANER_READY = 41  # a cleaner (re)started, or the timer did: whether it is cleaning a partition now
    # timer -> worker
    COMPLETION = 64  # delayed requests that completed: satisfied, expired, or failed with a Kafka error code
    REPLY = 65  # the answer to a request its worker waits on, in the layout the request's kind declares
    TIMER_STARTED = 66  # a timer process (re)started: re-submit every delayed request still waiting
    LAYOUT = 67  # the topic catalog changed: reload it if older than catalog_version
    QUOTA_STATE = 68  # the node-wide rates of the client ids over a quota, and the reports counted in them
    CLEAN = 69  # to a cleaner: clean this partition (its dirtiest-first turn came)


class Status(IntEnum):
    """How a delayed request completed."""

    SATISFIED = 1
    EXPIRED = 2
    FAILED = 3  # it can never be satisfied: the item's error_code (a Kafka error code) says why


# -- records: typed fields ---------------------------------------------------------------------------

STR = "str"  # UTF-8 text (msgpack str)
OPT_STR = "str?"  # UTF-8 text or None
BYTES = "bytes"  # bytes as bytes (msgpack bin)
_NUMBER_CODES = frozenset("bBhHiIqQ?")


@dataclass(frozen=True, eq=False)
class Array:
    """A list field: of numbers (a struct code), STR, OPT_STR, BYTES, or records (a class `record` made)."""

    element: Any
    nullable: bool = False


def _empty(kind: Any) -> Any:
    """A field's value when an answer leaves it out: zero, "", b"", None or an empty list."""
    if isinstance(kind, Array):
        return ()
    return {STR: "", OPT_STR: None, BYTES: b""}.get(kind, 0)


def _check_kind(name: str, kind: Any) -> None:
    if isinstance(kind, Array):
        element = kind.element
        if not (element in (STR, OPT_STR, BYTES) or hasattr(element, "fields")
                or (isinstance(element, str) and element in _NUMBER_CODES)):
            raise TypeError(f"{name}: unknown element type {element!r}")
    elif not (kind in (STR, OPT_STR, BYTES) or (isinstance(kind, str) and kind in _NUMBER_CODES)):
        raise TypeError(f"{name}: unknown type {kind!r}")


def record(name: str, fields: Iterable[tuple[str, Any]], empty_defaults: bool = False) -> type:
    """A named tuple class for a record of typed fields (`.fields`: its (name, type) pairs), usable as an
    Array's element and as a kind's fields or answer."""
    fields = tuple(fields)
    for field_name, kind in fields:
        _check_kind(f"{name}.{field_name}", kind)
    defaults = [_empty(kind) for _, kind in fields] if empty_defaults else None
    cls = namedtuple(name, [field_name for field_name, _ in fields], defaults=defaults)
    cls.fields = fields
    return cls


def conforms(values: Any, fields: tuple) -> bool:
    """Whether `values` has the layout of `fields` (each value of its field's type, records recursively). For
    tests and assertions: decoding trusts the sender's layout beyond the number of fields."""
    if not isinstance(values, (tuple, list)) or len(values) != len(fields):
        return False
    return all(_is(value, kind) for value, (_, kind) in zip(values, fields))


def _is(value: Any, kind: Any) -> bool:
    if isinstance(kind, Array):
        if value is None:
            return kind.nullable
        return isinstance(value, (tuple, list)) and all(_is(item, kind.element) for item in value)
    if hasattr(kind, "fields"):
        return conforms(value, kind.fields)
    if kind == STR:
        return isinstance(value, str)
    if kind == OPT_STR:
        return value is None or isinstance(value, str)
    if kind == BYTES:
        return isinstance(value, bytes)
    if kind == "?":
        return isinstance(value, bool)
    code = struct.Struct("<" + kind)
    try:
        code.pack(value)
    except struct.error:
        return False
    return isinstance(value, int)


# -- kinds ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MessageType:
    kind: Kind
    body: struct.Struct
    item: struct.Struct
    document: bool
    fields: type | None  # the record after the body, for kinds declared with fields
    reply: type | None  # the record of its REPLY's answer (or DOCUMENT); None: it gets no REPLY
    tuple_class: type
    head: struct.Struct  # header and body in one struct: one pack or unpack call for both
    body_count: int  # fields in the body
    field_count: int  # typed fields after it (0 for kinds without fields)

    @property
    def to_timer(self) -> bool:
        return self.kind < FIRST_TIMER_KIND


MESSAGES: dict[int, MessageType] = {}
_BY_BYTE: list[MessageType | None] = [None] * 256  # kind byte -> its type, without an enum call per frame
DOCUMENT = "document"  # a reply layout: a msgpack value of no declared shape (the answers of topic administration)


def _class_name(kind: Kind) -> str:
    return kind.name.title().replace("_", "")


def declare(kind: Kind, body: Iterable[tuple[str, str]] = (), items: Iterable[tuple[str, str]] = (),
            document: bool = False, fields: Iterable[tuple[str, Any]] | None = None,
            reply: Iterable[tuple[str, Any]] | str | None = None) -> MessageType:
    """Declare a kind: body fields as (name, struct code); then items (name, struct code), or typed fields
    (name, type), or a document; and the layout of the answer a REPLY carries for it."""
    body, items = tuple(body), tuple(items)
    if sum(map(bool, (items, fields is not None, document))) > 1:
        raise TypeError(f"{kind.name}: items, fields or a document, not more than one")
    layout = record(_class_name(kind) + "Fields", fields) if fields is not None else None
    names = [name for name, _ in body] + (list(layout._fields) if layout else ["items", "document"])
    tuple_class = namedtuple(_class_name(kind), names)
    tuple_class.kind = kind
    answer = reply
    if reply is not None and reply != DOCUMENT:
        # An answer names what it has: an error alone leaves the other fields empty.
        answer = record(_class_name(kind) + "Reply", reply, empty_defaults=True)
        answer.kind = kind
    codes = "".join(code for _, code in body)
    message = MessageType(kind, struct.Struct("<" + codes), struct.Struct("<" + "".join(code for _, code in items)),
                          document, layout, answer, tuple_class, struct.Struct("<BBHI" + codes), len(body),
                          len(layout.fields) if layout else 0)
    MESSAGES[kind] = message
    _BY_BYTE[kind] = message
    return message


def reply_class(kind: Kind) -> type:
    """The named tuple of a kind's answer (its fields as the kind's `reply=` declares them)."""
    return MESSAGES[kind].reply


# The body every request a worker waits on for a REPLY starts with (with_request_id rewrites its id).
ASKED = [("request_id", "Q"), ("api_version", "H")]

# Records of the group coordinator's messages and answers.
Protocol = record("Protocol", [("name", STR), ("metadata", BYTES)])
JoinedMember = record("JoinedMember", [("member", STR), ("instance", OPT_STR), ("metadata", BYTES)])
Assignment = record("Assignment", [("member", STR), ("assignment", BYTES)])
LeavingMember = record("LeavingMember", [("member", STR), ("instance", OPT_STR)])
LeftMember = record("LeftMember", [("member", STR), ("instance", OPT_STR), ("error", "h")])
CommittedPartition = record("CommittedPartition", [("partition", "i"), ("offset", "q"), ("leader_epoch", "i"),
                                                   ("metadata", OPT_STR)])
TopicCommits = record("TopicCommits", [("name", STR), ("partitions", Array(CommittedPartition))])
TopicPartitions = record("TopicPartitions", [("name", STR), ("partitions", Array("i"))])
PartitionError = record("PartitionError", [("partition", "i"), ("error", "h")])
TopicPartitionErrors = record("TopicPartitionErrors", [("name", STR), ("partitions", Array(PartitionError))])
PartitionOffset = record("PartitionOffset", [("partition", "i"), ("offset", "q"), ("leader_epoch", "i"),
                                             ("metadata", OPT_STR), ("error", "h")])
TopicOffsets = record("TopicOffsets", [("name", STR), ("partitions", Array(PartitionOffset))])
ListedGroup = record("ListedGroup", [("group", STR), ("protocol_type", STR), ("state", STR), ("group_type", STR)])
DescribedMember = record("DescribedMember", [("member", STR), ("instance", OPT_STR), ("client_id", STR),
                                             ("client_host", STR), ("metadata", BYTES), ("assignment", BYTES)])
DescribedGroup = record("DescribedGroup", [("error", "h"), ("group", STR), ("state", STR), ("protocol_type", STR),
                                           ("protocol", STR), ("members", Array(DescribedMember))])
GroupError = record("GroupError", [("group", STR), ("error", "h")])
DescribedConsumerMember = record("DescribedConsumerMember", [
    ("member", STR), ("instance", OPT_STR), ("rack", OPT_STR), ("member_epoch", "i"), ("client_id", STR),
    ("client_host", STR), ("subscribed_topics", Array(STR)), ("subscribed_regex", OPT_STR),
    ("assignment", Array(TopicPartitions)), ("target", Array(TopicPartitions))])
DescribedConsumerGroup = record("DescribedConsumerGroup", [
    ("error", "h"), ("error_message", OPT_STR), ("group", STR), ("state", STR), ("epoch", "i"),
    ("assignment_epoch", "i"), ("assignor", STR), ("members", Array(DescribedConsumerMember))])
# Records of the Streams rebalance protocol (KIP-1071): a topology's subtopologies, tasks, endpoints.
KeyValue = record("KeyValue", [("key", STR), ("value", STR)])
StreamsTopic = record("StreamsTopic", [("name", STR), ("partitions", "i"), ("replication_factor", "h"),
                                       ("configs", Array(KeyValue))])
CopartitionGroup = record("CopartitionGroup", [("source_topics", Array("h")), ("source_topic_regex", Array("h")),
                                               ("repartition_source_topics", Array("h"))])
Subtopology = record("Subtopology", [
    ("subtopology", STR), ("source_topics", Array(STR)), ("source_topic_regex", Array(STR)),
    ("changelog_topics", Array(StreamsTopic)), ("repartition_sink_topics", Array(STR)),
    ("repartition_source_topics", Array(StreamsTopic)), ("copartition_groups", Array(CopartitionGroup))])
TaskIds = record("TaskIds", [("subtopology", STR), ("partitions", Array("i"))])
StreamsStatus = record("StreamsStatus", [("code", "b"), ("detail", STR)])
EndpointPartitions = record("EndpointPartitions", [("host", STR), ("port", "i"), ("active", Array(TopicPartitions)),
                                                   ("standby", Array(TopicPartitions))])
DescribedStreamsMember = record("DescribedStreamsMember", [
    ("member", STR), ("member_epoch", "i"), ("instance", OPT_STR), ("rack", OPT_STR), ("client_id", STR),
    ("client_host", STR), ("topology_epoch", "i"), ("process_id", STR), ("endpoint_host", OPT_STR),
    ("endpoint_port", "i"), ("client_tags", Array(KeyValue)), ("active", Array(TaskIds)),
    ("target_active", Array(TaskIds)), ("standby", Array(TaskIds)), ("target_standby", Array(TaskIds))])
DescribedStreamsGroup = record("DescribedStreamsGroup", [
    ("error", "h"), ("error_message", OPT_STR), ("group", STR), ("state", STR), ("epoch", "i"),
    ("assignment_epoch", "i"), ("topology_epoch", "i"), ("subtopologies", Array(Subtopology, nullable=True)),
    ("members", Array(DescribedStreamsMember))])
# Records of the quota messages.
ClientUsage = record("ClientUsage", [("client", STR), ("produced", "q"), ("fetched", "q")])
ClientRate = record("ClientRate", [("client", STR), ("produce_rate", "q"), ("fetch_rate", "q"),
                                   ("produce_window_ms", "q"), ("fetch_window_ms", "q")])
CountedReport = record("CountedReport", [("worker", "I"), ("report", "Q")])

DelayFetch = declare(Kind.DELAY_FETCH, body=[("request_id", "Q"), ("deadline_ms", "q"), ("min_bytes", "i")],
                     items=[("row", "I"), ("start_bytes", "q"), ("stable_from", "q")]).tuple_class
DelayProduce = declare(Kind.DELAY_PRODUCE, body=[("request_id", "Q"), ("deadline_ms", "q")],
                       items=[("row", "I"), ("required_offset", "q")]).tuple_class
Cancel = declare(Kind.CANCEL, items=[("request_id", "Q")]).tuple_class
CreateTopics = declare(Kind.CREATE_TOPICS, body=[("request_id", "Q"), ("deadline_ms", "q")], document=True,
                       reply=DOCUMENT).tuple_class
DeleteTopics = declare(Kind.DELETE_TOPICS, body=[("request_id", "Q")], document=True, reply=DOCUMENT).tuple_class
CreatePartitions = declare(Kind.CREATE_PARTITIONS, body=[("request_id", "Q"), ("deadline_ms", "q")],
                           document=True, reply=DOCUMENT).tuple_class
AlterConfigs = declare(Kind.ALTER_CONFIGS, body=[("request_id", "Q")], document=True, reply=DOCUMENT).tuple_class
DeleteRecords = declare(Kind.DELETE_RECORDS, body=[("request_id", "Q"), ("deadline_ms", "q")], document=True,
                        reply=DOCUMENT).tuple_class
Flush = declare(Kind.FLUSH, items=[("row", "I")]).tuple_class

JoinGroup = declare(Kind.JOIN_GROUP, body=ASKED + [("session_timeout_ms", "i"), ("rebalance_timeout_ms", "i")],
                    fields=[("group", STR), ("member", STR), ("instance", OPT_STR), ("protocol_type", STR),
                            ("protocols", Array(Protocol)), ("client_id", STR), ("client_host", STR)],
                    reply=[("error", "h"), ("generation", "i"), ("protocol_type", OPT_STR), ("protocol", OPT_STR),
                           ("leader", STR), ("member", STR), ("members", Array(JoinedMember))]).tuple_class
SyncGroup = declare(Kind.SYNC_GROUP, body=ASKED + [("generation", "i")],
                    fields=[("group", STR), ("member", STR), ("instance", OPT_STR),
                            ("assignments", Array(Assignment))],
                    reply=[("error", "h"), ("assignment", BYTES)]).tuple_class
Heartbeat = declare(Kind.HEARTBEAT, body=ASKED + [("generation", "i")],
                    fields=[("group", STR), ("member", STR), ("instance", OPT_STR)],
                    reply=[("error", "h")]).tuple_class
LeaveGroup = declare(Kind.LEAVE_GROUP, body=ASKED, fields=[("group", STR), ("members", Array(LeavingMember))],
                     reply=[("error", "h"), ("members", Array(LeftMember))]).tuple_class
CommitOffsets = declare(Kind.COMMIT_OFFSETS, body=ASKED + [("generation", "i")],
                        fields=[("group", STR), ("member", STR), ("instance", OPT_STR),
                                ("topics", Array(TopicCommits))],
                        reply=[("topics", Array(TopicPartitionErrors))]).tuple_class
# member None and member_epoch -1: no member to check (admin tools, clients before OffsetFetch v9).
FetchOffsets = declare(Kind.FETCH_OFFSETS, body=ASKED + [("require_stable", "?"), ("member_epoch", "i")],
                       fields=[("group", STR), ("member", OPT_STR),
                               ("topics", Array(TopicPartitions, nullable=True))],  # None: all
                       reply=[("error", "h"), ("topics", Array(TopicOffsets))]).tuple_class
ListGroups = declare(Kind.LIST_GROUPS, body=ASKED, fields=[],
                     reply=[("error", "h"), ("groups", Array(ListedGroup))]).tuple_class
DescribeGroups = declare(Kind.DESCRIBE_GROUPS, body=ASKED, fields=[("groups", Array(STR))],
                         reply=[("groups", Array(DescribedGroup))]).tuple_class
DeleteGroups = declare(Kind.DELETE_GROUPS, body=ASKED, fields=[("groups", Array(STR))],
                       reply=[("results", Array(GroupError))]).tuple_class
DeleteOffsets = declare(Kind.DELETE_OFFSETS, body=ASKED, fields=[("group", STR), ("topics", Array(TopicPartitions))],
                        reply=[("error", "h"), ("topics", Array(TopicPartitionErrors))]).tuple_class
# Topics travel by name; the worker maps them to and from the topic ids of the Kafka request.
ConsumerGroupHeartbeat = declare(
    Kind.CONSUMER_GROUP_HEARTBEAT, body=ASKED + [("member_epoch", "i"), ("rebalance_timeout_ms", "i")],
    fields=[("group", STR), ("member", STR), ("instance", OPT_STR), ("rack", OPT_STR),
            ("subscribed_topics", Array(STR, nullable=True)), ("subscribed_regex", OPT_STR), ("assignor", OPT_STR),
            ("owned", Array(TopicPartitions, nullable=True)), ("client_id", STR), ("client_host", STR)],
    reply=[("error", "h"), ("error_message", OPT_STR), ("member", STR), ("member_epoch", "i"),
           ("heartbeat_interval_ms", "i"), ("assignment", Array(TopicPartitions, nullable=True))]).tuple_class
ConsumerGroupDescribe = declare(Kind.CONSUMER_GROUP_DESCRIBE, body=ASKED, fields=[("groups", Array(STR))],
                                reply=[("groups", Array(DescribedConsumerGroup))]).tuple_class
# topology_epoch -1: no topology (subtopologies None); endpoint_host None: no endpoint, or unchanged; may_create:
# the principal may create the topology's missing internal topics (CREATE on the cluster or on each of them).
StreamsGroupHeartbeat = declare(
    Kind.STREAMS_GROUP_HEARTBEAT, body=ASKED + [("member_epoch", "i"), ("rebalance_timeout_ms", "i"),
                                                ("topology_epoch", "i"), ("endpoint_epoch", "i"),
                                                ("endpoint_port", "i"), ("shutdown", "?"), ("may_create", "?")],
    fields=[("group", STR), ("member", STR), ("instance", OPT_STR), ("rack", OPT_STR),
            ("subtopologies", Array(Subtopology, nullable=True)), ("active", Array(TaskIds, nullable=True)),
            ("standby", Array(TaskIds, nullable=True)), ("warmup", Array(TaskIds, nullable=True)),
            ("process_id", OPT_STR), ("endpoint_host", OPT_STR), ("client_tags", Array(KeyValue, nullable=True)),
            ("client_id", STR), ("client_host", STR)],
    reply=[("error", "h"), ("error_message", OPT_STR), ("member", STR), ("member_epoch", "i"),
           ("heartbeat_interval_ms", "i"), ("acceptable_recovery_lag", "i"), ("task_offset_interval_ms", "i"),
           ("status", Array(StreamsStatus, nullable=True)), ("active", Array(TaskIds, nullable=True)),
           ("standby", Array(TaskIds, nullable=True)), ("warmup", Array(TaskIds, nullable=True)),
           ("endpoint_epoch", "i"), ("endpoints", Array(EndpointPartitions, nullable=True))]).tuple_class
StreamsGroupDescribe = declare(Kind.STREAMS_GROUP_DESCRIBE, body=ASKED, fields=[("groups", Array(STR))],
                               reply=[("groups", Array(DescribedStreamsGroup))]).tuple_class
# Share groups (KIP-932): every member is assigned every partition of its subscribed topics.
ShareGroupHeartbeat = declare(
    Kind.SHARE_GROUP_HEARTBEAT, body=ASKED + [("member_epoch", "i")],
    fields=[("group", STR), ("member", STR), ("rack", OPT_STR), ("subscribed_topics", Array(STR, nullable=True)),
            ("client_id", STR), ("client_host", STR)],
    reply=[("error", "h"), ("error_message", OPT_STR), ("member", STR), ("member_epoch", "i"),
           ("heartbeat_interval_ms", "i"), ("assignment", Array(TopicPartitions, nullable=True))]).tuple_class
DescribedShareMember = record("DescribedShareMember", [
    ("member", STR), ("rack", OPT_STR), ("member_epoch", "i"), ("client_id", STR), ("client_host", STR),
    ("subscribed_topics", Array(STR)), ("assignment", Array(TopicPartitions))])
DescribedShareGroup = record("DescribedShareGroup", [
    ("error", "h"), ("error_message", OPT_STR), ("group", STR), ("state", STR), ("epoch", "i"),
    ("assignment_epoch", "i"), ("assignor", STR), ("members", Array(DescribedShareMember))])
ShareGroupDescribe = declare(Kind.SHARE_GROUP_DESCRIBE, body=ASKED, fields=[("groups", Array(STR))],
                             reply=[("groups", Array(DescribedShareGroup))]).tuple_class
# A ShareFetch (acquire=True) or ShareAcknowledge (acquire=False) of one share session: the acknowledgements of
# each partition (types: one for the whole range, or one per offset), then, for a fetch, up to max_records newly
# acquired. again=True: the same fetch after its long poll waited (no session epoch, no acknowledgements).
AckBatch = record("AckBatch", [("first", "q"), ("last", "q"), ("types", Array("b"))])
SharePartitionAcks = record("SharePartitionAcks", [("topic", STR), ("partition", "i"), ("acks", Array(AckBatch))])
AcquiredRange = record("AcquiredRange", [("first", "q"), ("last", "q"), ("delivery_count", "h")])
ShareFetched = record("ShareFetched", [("topic", STR), ("partition", "i"), ("error", "h"), ("ack_error", "h"),
                                       ("acquired", Array(AcquiredRange))])
ShareWatch = record("ShareWatch", [("row", "I"), ("end_bytes", "q")])  # a partition a fetch found empty, as seen
ShareFetch = declare(
    Kind.SHARE_FETCH, body=ASKED + [("session_epoch", "i"), ("max_records", "i"), ("acquire", "?"), ("again", "?")],
    fields=[("group", STR), ("member", STR), ("partitions", Array(SharePartitionAcks)),
            ("forgotten", Array(TopicPartitions))],
    reply=[("error", "h"), ("error_message", OPT_STR), ("lock_ms", "i"),
           ("partitions", Array(ShareFetched)), ("watch", Array(ShareWatch))]).tuple_class
ShareOffsetsAsked = record("ShareOffsetsAsked", [("group", STR), ("topics", Array(TopicPartitions, nullable=True))])
ShareOffset = record("ShareOffset", [("topic", STR), ("partition", "i"), ("start_offset", "q"), ("lag", "q"),
                                     ("error", "h")])
ShareGroupOffsets = record("ShareGroupOffsets", [("group", STR), ("error", "h"), ("error_message", OPT_STR),
                                                 ("partitions", Array(ShareOffset))])
DescribeShareOffsets = declare(Kind.SHARE_GROUP_OFFSETS, body=ASKED, fields=[("groups", Array(ShareOffsetsAsked))],
                               reply=[("groups", Array(ShareGroupOffsets))]).tuple_class
# delete=False: each partition's state starts anew at start_offset; delete=True: the topics' share-partitions go
# (partition and start_offset unused: -1).
ShareOffsetChange = record("ShareOffsetChange", [("topic", STR), ("partition", "i"), ("start_offset", "q")])
ShareOffsetResult = record("ShareOffsetResult", [("topic", STR), ("partition", "i"), ("error", "h")])
AlterShareOffsets = declare(Kind.ALTER_SHARE_OFFSETS, body=ASKED + [("delete", "?")],
                            fields=[("group", STR), ("changes", Array(ShareOffsetChange))],
                            reply=[("error", "h"), ("error_message", OPT_STR),
                                   ("results", Array(ShareOffsetResult))]).tuple_class
GROUP_KINDS = (Kind.JOIN_GROUP, Kind.SYNC_GROUP, Kind.HEARTBEAT, Kind.LEAVE_GROUP, Kind.COMMIT_OFFSETS,
               Kind.FETCH_OFFSETS, Kind.LIST_GROUPS, Kind.DESCRIBE_GROUPS, Kind.DELETE_GROUPS, Kind.DELETE_OFFSETS,
               Kind.CONSUMER_GROUP_HEARTBEAT, Kind.CONSUMER_GROUP_DESCRIBE, Kind.STREAMS_GROUP_HEARTBEAT,
               Kind.STREAMS_GROUP_DESCRIBE, Kind.SHARE_GROUP_HEARTBEAT, Kind.SHARE_GROUP_DESCRIBE, Kind.SHARE_FETCH,
               Kind.SHARE_GROUP_OFFSETS, Kind.ALTER_SHARE_OFFSETS)

# The transaction coordinator's: every request names its transactional.id and the producer id and epoch it holds.
TXN_ASKED = ASKED + [("producer_id", "q"), ("producer_epoch", "h")]
# expected_producer_id/_epoch: the producer's own, when it asks for an epoch bump (KIP-360); -1 otherwise.
InitProducerId = declare(Kind.INIT_PRODUCER_ID, body=ASKED + [("transaction_timeout_ms", "i"),
                                                              ("expected_producer_id", "q"),
                                                              ("expected_producer_epoch", "h")],
                         fields=[("transactional_id", STR)],
                         reply=[("error", "h"), ("producer_id", "q"), ("producer_epoch", "h")]).tuple_class
AddPartitionsToTxn = declare(Kind.ADD_PARTITIONS_TO_TXN, body=TXN_ASKED,
                             fields=[("transactional_id", STR), ("topics", Array(TopicPartitions))],
                             reply=[("topics", Array(TopicPartitionErrors))]).tuple_class
AddOffsetsToTxn = declare(Kind.ADD_OFFSETS_TO_TXN, body=TXN_ASKED, fields=[("transactional_id", STR), ("group", STR)],
                          reply=[("error", "h")]).tuple_class
EndTxn = declare(Kind.END_TXN, body=TXN_ASKED + [("committed", "?")], fields=[("transactional_id", STR)],
                 reply=[("error", "h")]).tuple_class
TxnOffsetCommit = declare(Kind.TXN_OFFSET_COMMIT, body=TXN_ASKED + [("generation", "i")],
                          fields=[("transactional_id", STR), ("group", STR), ("topics", Array(TopicCommits)),
                                  ("member", STR), ("instance", OPT_STR)],
                          reply=[("topics", Array(TopicPartitionErrors))]).tuple_class
ListedTransaction = record("ListedTransaction", [("transactional_id", STR), ("producer_id", "q"), ("state", STR)])
DescribedTransaction = record("DescribedTransaction", [
    ("error", "h"), ("transactional_id", STR), ("state", STR), ("timeout_ms", "i"), ("start_ms", "q"),
    ("producer_id", "q"), ("producer_epoch", "h"), ("topics", Array(TopicPartitions))])
ListTransactions = declare(Kind.LIST_TRANSACTIONS, body=ASKED + [("duration_filter_ms", "q")],
                           fields=[("states", Array(STR)), ("producer_ids", Array("q"))],
                           reply=[("error", "h"), ("unknown_states", Array(STR)),
                                  ("transactions", Array(ListedTransaction))]).tuple_class
DescribeTransactions = declare(Kind.DESCRIBE_TRANSACTIONS, body=ASKED, fields=[("transactional_ids", Array(STR))],
                               reply=[("transactions", Array(DescribedTransaction))]).tuple_class
TRANSACTION_KINDS = (Kind.INIT_PRODUCER_ID, Kind.ADD_PARTITIONS_TO_TXN, Kind.ADD_OFFSETS_TO_TXN, Kind.END_TXN,
                     Kind.TXN_OFFSET_COMMIT, Kind.LIST_TRANSACTIONS, Kind.DESCRIBE_TRANSACTIONS)

QuotaUsage = declare(Kind.QUOTA_USAGE, body=[("report", "Q")], fields=[("clients", Array(ClientUsage))]).tuple_class
Throttle = declare(Kind.THROTTLE, body=[("request_id", "Q"), ("deadline_ms", "q"), ("throttle_ms", "I"),
                                        ("quota_kind", "B")], fields=[("client", STR)]).tuple_class
Clean = declare(Kind.CLEAN, body=[("row", "I"), ("partition", "i")], fields=[("topic", STR)]).tuple_class
Cleaned = declare(Kind.CLEANED, body=[("row", "I"), ("partition", "i")],
                  fields=[("topic", STR), ("error", STR), ("swapped", "?"), ("first_dirty", "q"), ("cleaned_to", "q"),
                          ("bytes_read", "q"), ("bytes_written", "q"), ("bytes_reclaimed", "q"), ("records_read", "q"),
                          ("records_kept", "q"), ("tombstones_dropped", "q"), ("keys", "q"), ("duration_ms", "q")]
                  ).tuple_class
CleanerReady = declare(Kind.CLEANER_READY, body=[("pid", "I"), ("cleaning_row", "i")]).tuple_class  # row -1: idle
Completion = declare(Kind.COMPLETION, items=[("request_id", "Q"), ("status", "B"), ("error_code", "h")]).tuple_class
# A REPLY's frame: its body, then the answer in its request kind's reply layout (see encode_reply, decode).
declare(Kind.REPLY, body=[("request_id", "Q"), ("of_kind", "B")], fields=[])
TimerStarted = declare(Kind.TIMER_STARTED, body=[("pid", "I")]).tuple_class
Layout = declare(Kind.LAYOUT, body=[("catalog_version", "Q")]).tuple_class
QuotaState = declare(Kind.QUOTA_STATE, fields=[("rates", Array(ClientRate)),
                                                ("counted", Array(CountedReport))]).tuple_class
# A REPLY decodes to (request_id, of_kind, answer): the answer in its request kind's reply layout.
Reply = namedtuple("Reply", ["request_id", "of_kind", "answer"])
Reply.kind = Kind.REPLY


def _one_item_dtype(message: MessageType) -> np.dtype:
    """The numpy layout of a frame of `message`'s kind with exactly one item: header, body and item fields at their
    packed offsets, named as declared (the header's as kind, layout_version, count, reserved)."""
    names, formats, offsets, at = _packed(_head_codes(message) + list(zip(DelayFetchItem._fields,
                                                                          message.item.format[1:])))
    assert at == message.head.size + message.item.size
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": at})


def _head_codes(message: MessageType) -> list[tuple[str, str]]:
    """(name, struct code) of a frame's header and body fields, in order (the header's as kind, layout_version,
    count, reserved)."""
    return [("kind", "B"), ("layout_version", "B"), ("count", "H"), ("reserved", "I"),
            *zip(message.tuple_class._fields[:message.body_count], message.body.format[1:])]


def _packed(codes: list[tuple[str, str]]) -> tuple[list[str], list[np.dtype], list[int], int]:
    """Names, numpy formats and offsets of fields packed one after the other (struct's "<"), and their size."""
    names, formats, offsets, at = [], [], [], 0
    for name, code in codes:
        names.append(name)
        formats.append(np.dtype("<" + code))
        offsets.append(at)
        at += struct.calcsize("<" + code)
    return names, formats, offsets, at


DelayFetchItem = namedtuple("DelayFetchItem", ["row", "start_bytes", "stable_from"])
# A DELAY_FETCH of one partition (a consumer's usual long poll) as one fixed-size record: the timer decodes a
# drain's run of them as one structured array (delay_fetch_records), not a named tuple per frame.
DELAY_FETCH_ONE = _one_item_dtype(MESSAGES[Kind.DELAY_FETCH])
DELAY_FETCH_ONE_BYTES = DELAY_FETCH_ONE.itemsize


_DELAY_FETCH_ONE_STRUCT = struct.Struct(MESSAGES[Kind.DELAY_FETCH].head.format
                                        + MESSAGES[Kind.DELAY_FETCH].item.format[1:])  # header, body, one item


def encode_delay_fetch(request_id: int, deadline_ms: int, min_bytes: int, items: list[tuple[int, int, int]]) -> bytes:
    """encode(Kind.DELAY_FETCH, ...), the same bytes, in one struct call for one item (a worker's usual long
    poll: its hand-off costs a fifth of the generic path's)."""
    if len(items) != 1:
        return encode(Kind.DELAY_FETCH, request_id, deadline_ms, min_bytes, items=items)
    try:
        return _DELAY_FETCH_ONE_STRUCT.pack(Kind.DELAY_FETCH, LAYOUT_VERSION, 1, 0, request_id, deadline_ms, min_bytes,
                                            *items[0])
    except (struct.error, TypeError) as exc:
        raise MessageError(f"DELAY_FETCH: bad values: {exc}") from None


def delay_fetch_records(frames: list) -> np.ndarray | None:
    """The frames as one structured array of DELAY_FETCH_ONE (a copy: valid after the ring's release), or None
    unless every frame is a well-formed DELAY_FETCH of exactly one item in this layout version (the caller then
    decodes them one by one, and decode() names what is wrong)."""
    if not frames or set(map(len, frames)) != {DELAY_FETCH_ONE_BYTES}:
        return None
    records = np.frombuffer(b"".join(frames), DELAY_FETCH_ONE)
    if ((records["kind"] != Kind.DELAY_FETCH) | (records["layout_version"] != LAYOUT_VERSION)
            | (records["count"] != 1)).any():
        return None
    return records


def _items_dtype(message: MessageType, count: int) -> np.dtype:
    """The numpy layout of a frame of `message`'s kind with `count` items: header and body fields at their packed
    offsets, then `items`, a subarray of `count` item records."""
    names, formats, offsets, at = _packed(_head_codes(message))
    item_names, item_formats, item_offsets, _ = _packed(list(zip(_ITEM_NAMES[message.kind], message.item.format[1:])))
    item = np.dtype({"names": item_names, "formats": item_formats, "offsets": item_offsets,
                     "itemsize": message.item.size})
    names.append("items")
    formats.append((item, (count,)))
    offsets.append(at)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": at + count * message.item.size})


_ITEM_NAMES = {Kind.DELAY_PRODUCE: ("row", "required_offset")}
_DELAY_PRODUCE = MESSAGES[Kind.DELAY_PRODUCE]
_DELAY_PRODUCE_DTYPES: dict[int, np.dtype] = {}  # frame length -> its layout (a handful of lengths in practice)


def delay_produce_records(frames: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """DELAY_PRODUCE frames as arrays, in frame order: their request ids (uint64) and deadlines (int64), and their
    items' rows and required offsets as (frames, most items) int64 arrays, row -1 past a frame's own items. None
    unless every frame is a well-formed DELAY_PRODUCE of at least one item in this layout version (the caller
    then decodes them one by one, and decode() names what is wrong). Copies: valid after the ring's release."""
    if not frames:
        return None
    head, item = _DELAY_PRODUCE.head.size, _DELAY_PRODUCE.item.size
    by_length: dict[int, list[int]] = {}
    for position, frame in enumerate(frames):
        by_length.setdefault(len(frame), []).append(position)
    widest = max(by_length)
    if (widest - head) % item:
        return None
    count = len(frames)
    request_ids = np.empty(count, np.uint64)
    deadlines = np.empty(count, np.int64)
    rows = np.full((count, (widest - head) // item), -1, np.int64)
    required = np.zeros_like(rows)
    for length, positions in by_length.items():
        items, rest = divmod(length - head, item)
        if rest or items < 1:
            return None
        dtype = _DELAY_PRODUCE_DTYPES.get(length)
        if dtype is None:
            dtype = _DELAY_PRODUCE_DTYPES[length] = _items_dtype(_DELAY_PRODUCE, items)
        records = np.frombuffer(b"".join([frames[p] for p in positions]), dtype)
        if ((records["kind"] != Kind.DELAY_PRODUCE) | (records["layout_version"] != LAYOUT_VERSION)
                | (records["count"] != items)).any():
            return None
        at = positions if len(positions) < count else slice(None)
        request_ids[at] = records["request_id"]
        deadlines[at] = records["deadline_ms"]
        rows[at, :items] = records["items"]["row"]
        required[at, :items] = records["items"]["required_offset"]
    return request_ids, deadlines, rows, required


def encode(kind: Kind, *values: Any, items: Iterable[tuple] = (), document: Any = None) -> bytes:
    """A frame of `kind` from its body values in declared order (then, for a kind with fields, the fields'
    values in declared order), item tuples and document."""
    message = MESSAGES[kind]
    if message.fields is not None:
        if items or document is not None:
            raise MessageError(f"{kind.name} carries typed fields, not items or a document")
        if len(values) != message.body_count + message.field_count:
            raise MessageError(f"{kind.name}: {len(values)} values for {message.body_count} body fields and "
                               f"{message.field_count} fields")
        return _frame(message, values[:message.body_count], values[message.body_count:])
    if items:
        if not message.item.size:
            raise MessageError(f"{kind.name} has no items")
        items = items if isinstance(items, (list, tuple)) else list(items)
        if len(items) > MAX_ITEMS:
            raise MessageError(f"{kind.name}: {len(items)} items, at most {MAX_ITEMS} per frame")
    try:
        head = message.head.pack(kind, LAYOUT_VERSION, len(items), 0, *values)
        if items:
            pack = message.item.pack
            head += b"".join([pack(*item) for item in items])
    except (struct.error, TypeError) as exc:
        raise MessageError(f"{kind.name}: bad values: {exc}") from None
    if message.document:
        return _frame(message, values, document)
    if document is not None:
        raise MessageError(f"{kind.name} carries no document")
    return head


def _frame(message: MessageType, body: tuple, tail: Any) -> bytes:
    """Header and body, then `tail` packed by msgpack (a kind's fields, or a document)."""
    try:
        return message.head.pack(message.kind, LAYOUT_VERSION, 0, 0, *body) + msgpack.packb(tail)
    except (struct.error, TypeError, ValueError, OverflowError) as exc:
        raise MessageError(f"{message.kind.name}: bad values: {exc}") from None


def encode_message(message: tuple) -> bytes:
    """The frame of a message given as its kind's named tuple."""
    kind = message.kind
    if MESSAGES[kind].fields is not None:
        return encode(kind, *message)
    *body, items, document = message
    return encode(kind, *body, items=items, document=document)


def encode_reply(request_id: int, kind: Kind, answer: Any) -> bytes:
    """The REPLY to a request of `kind`: `answer` is its reply record (or its values in order), or a document
    for kinds whose reply is DOCUMENT."""
    layout = MESSAGES[kind].reply
    if layout is None:
        raise MessageError(f"{kind.name} is not answered by a REPLY")
    if layout != DOCUMENT and len(answer) != len(layout.fields):
        raise MessageError(f"REPLY to {kind.name}: {len(answer)} values for {len(layout.fields)} fields")
    return _frame(MESSAGES[Kind.REPLY], (request_id, kind), answer)


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
    """The message in `frame`: its kind's named tuple (class attribute `.kind`). The records inside a kind's
    fields come as plain tuples in their declared order."""
    size = len(frame)
    message = _BY_BYTE[frame[0]] if size else None
    if message is None or size < message.head.size:
        kind_of(frame)  # raises the precise error
        raise MessageError(f"{message.kind.name} frame of {size} bytes is shorter than its header and body")
    head = message.head.unpack_from(frame, 0)
    if head[1] != LAYOUT_VERSION:
        raise MessageError(f"{message.kind.name} frame of layout version {head[1]}, expected {LAYOUT_VERSION}")
    count = head[2]
    start = message.head.size
    if message.fields is not None:
        if count:
            raise MessageError(f"{message.kind.name} frame with {count} items")
        if message.kind == Kind.REPLY:
            return _decode_reply(head[4], head[5], frame, start)
        fields = _unpack(message, frame, start)
        if type(fields) is not tuple or len(fields) != message.field_count:
            raise MessageError(f"{message.kind.name}: its fields are not its layout's {message.field_count}")
        return message.tuple_class(*head[4:], *fields)
    end = start + count * message.item.size
    if size < end or (size != end and not message.document) or (count and not message.item.size):
        raise MessageError(f"{message.kind.name} frame with {count} items has {size} bytes")
    items = list(message.item.iter_unpack(frame[start:end])) if count else []
    document = _unpack(message, frame, end, as_document=True) if message.document else None
    return message.tuple_class(*head[4:], items, document)


def _decode_reply(request_id: int, of_kind: int, frame, start: int) -> tuple:
    asked = _BY_BYTE[of_kind]
    if asked is None or asked.reply is None:
        raise MessageError(f"REPLY to kind {of_kind}, which is not answered by a REPLY")
    answer = _unpack(MESSAGES[Kind.REPLY], frame, start, as_document=asked.reply == DOCUMENT)
    if asked.reply != DOCUMENT:
        if not isinstance(answer, tuple) or len(answer) != len(asked.reply.fields):
            raise MessageError(f"REPLY to {asked.kind.name}: not its layout's {len(asked.reply.fields)} fields")
        answer = asked.reply(*answer)
    return Reply(request_id, asked.kind, answer)


def _unpack(message: MessageType, frame, start: int, as_document: bool = False) -> Any:
    """The msgpack part of a frame: a document's arrays as lists, as JSON gave them; fields' as tuples."""
    try:
        return msgpack.unpackb(frame[start:], use_list=as_document)  # texts as str, bytes as bytes (msgpack >= 1)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # ExtraData, FormatError, bad UTF-8, ...
        raise MessageError(f"{message.kind.name}: bad fields: {exc}") from None
