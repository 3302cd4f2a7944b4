"""The worker-timer contract (shm.messages): every kind round-trips, and bad frames or values raise
MessageError and nothing else."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmbroker.shm import messages as M
from shmbroker.shm.messages import Kind, MessageError

u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
u32 = st.integers(0, 2**32 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)


@settings(max_examples=200, deadline=None, database=None)
@given(request_id=u64, deadline=i64, min_bytes=i32, items=st.lists(st.tuples(u32, i64, i64), max_size=20))
def test_delay_fetch_round_trip(request_id, deadline, min_bytes, items):
    frame = M.encode(Kind.DELAY_FETCH, request_id, deadline, min_bytes, items=items)
    message = M.decode(memoryview(frame))
    assert message.kind is Kind.DELAY_FETCH and isinstance(message, M.DelayFetch)
    assert (message.request_id, message.deadline_ms, message.min_bytes) == (request_id, deadline, min_bytes)
    assert message.items == items and message.document is None
    # The worker's encoder (one struct call for one item) makes the same bytes; the timer's array view reads them.
    assert M.encode_delay_fetch(request_id, deadline, min_bytes, items) == frame
    records = M.delay_fetch_records([memoryview(frame)] * 3)
    if len(items) != 1:
        assert records is None
    else:
        assert len(records) == 3 and records.dtype.itemsize == len(frame) == M.DELAY_FETCH_ONE_BYTES
        assert [records[name][2] for name in ("request_id", "deadline_ms", "min_bytes", "row", "start_bytes",
                                              "stable_from")] == [request_id, deadline, min_bytes, *items[0]]


@pytest.mark.parametrize("kind, body, items, document", [
    (Kind.DELAY_PRODUCE, (7, 123456), [(9, 42), (1, 0)], None),
    (Kind.CANCEL, (), [(2**64 - 1,)], None),
    (Kind.CREATE_TOPICS, (5, 99), [], {"topics": [["t", 4, {}], ["u", 1, {"retention.ms": "1"}]],
                                      "validate_only": False, "explicit": True}),
    (Kind.DELETE_TOPICS, (6,), [], ["t"]),
    (Kind.CREATE_PARTITIONS, (8, -1), [], {"topics": [["t", 6]], "validate_only": True}),
    (Kind.ALTER_CONFIGS, (9,), [], {"resources": [[2, "t", "incremental", [[0, "retention.ms", "5"]]]],
                                    "validate_only": False}),
    (Kind.DELETE_RECORDS, (10, 2**62), [], [["t", 0, 5], ["t", 1, -1]]),
    (Kind.FLUSH, (), [(0,), (4095,), (2**32 - 1,)], None),
    (Kind.COMPLETION, (), [(1, M.Status.SATISFIED, 0), (2, M.Status.EXPIRED, 0), (3, M.Status.FAILED, 56)], None),
    (Kind.TIMER_STARTED, (4321,), [], None),
    (Kind.LAYOUT, (12,), [], None),
    (Kind.CLEANER_READY, (4321, -1), [], None),
])
def test_every_kind_round_trips(kind, body, items, document):
    message = M.decode(M.encode(kind, *body, items=items, document=document))
    assert message.kind is kind
    assert tuple(message)[:len(body)] == body
    assert message.items == items and message.document == document


# Kinds with typed fields: (kind, body and field values in declared order).
TYPED = [
    (Kind.JOIN_GROUP, (7, 5, 10000, 300000, "g", "", None, "consumer",
                       [M.Protocol("range", b"\x00\x01\xff"), M.Protocol("cooperative-sticky", b"")],
                       "rdkafka", "127.0.0.1")),
    (Kind.SYNC_GROUP, (7, 3, 4, "g", "m-1", "static-1", [M.Assignment("m-1", bytes(range(256)))])),
    (Kind.HEARTBEAT, (7, 3, 4, "g", "m-1", None)),
    (Kind.LEAVE_GROUP, (7, 3, "g", [M.LeavingMember("m-1", None), M.LeavingMember("", "static-1")])),
    (Kind.COMMIT_OFFSETS, (7, 7, -1, "g", "", None, [M.TopicCommits("t", [M.CommittedPartition(0, 42, -1, None),
                                                                          M.CommittedPartition(3, 2**40, 7, "é")])])),
    (Kind.FETCH_OFFSETS, (7, 5, False, -1, "g", None, None)),
    (Kind.FETCH_OFFSETS, (7, 9, True, 3, "g", "m-1", [M.TopicPartitions("t", [0, 1, 2**31 - 1])])),
    (Kind.LIST_GROUPS, (7, 2)),
    (Kind.DESCRIBE_GROUPS, (7, 4, ["a", "b", ""])),
    (Kind.DELETE_GROUPS, (7, 1, [])),
    (Kind.DELETE_OFFSETS, (7, 0, "g", [M.TopicPartitions("t", [5])])),
    (Kind.CONSUMER_GROUP_HEARTBEAT, (7, 1, 0, 45000, "g", "m-1", None, None, ["t", "u"], None, "uniform",
                                     [], "rdkafka", "127.0.0.1")),
    (Kind.CONSUMER_GROUP_HEARTBEAT, (7, 1, 5, -1, "g", "m-1", "static-1", "rack-a", None, "^t.*", None,
                                     [M.TopicPartitions("t", [0, 2])], "c", "h")),
    (Kind.CONSUMER_GROUP_DESCRIBE, (7, 1, ["a", "b"])),
    (Kind.STREAMS_GROUP_HEARTBEAT, (7, 0, 0, 300000, 1, -1, 8080, False, True, "app", "m-1", None, None, [M.Subtopology(
        "0", ["in"], [], [M.StreamsTopic("app-store-changelog", 0, 0, [M.KeyValue("cleanup.policy", "compact")])],
        ["app-rep"], [], [M.CopartitionGroup([0], [], [])])], [], [], [], "p-1", "localhost", [], "c", "h")),
    (Kind.STREAMS_GROUP_HEARTBEAT, (7, 0, 4, -1, -1, 2, -1, True, False, "app", "m-1", None, None, None,
                                    [M.TaskIds("0", [0, 1])], None, None, None, None, None, "c", "h")),
    (Kind.STREAMS_GROUP_DESCRIBE, (7, 0, ["app"])),
    (Kind.INIT_PRODUCER_ID, (7, 1, 60000, 4001, 3, "txn-1")),
    (Kind.ADD_PARTITIONS_TO_TXN, (7, 2, 1000, 3, "txn-1", [M.TopicPartitions("t", [0, 1])])),
    (Kind.ADD_OFFSETS_TO_TXN, (7, 2, 1000, 3, "txn-1", "g")),
    (Kind.END_TXN, (7, 2, 1000, 3, True, "txn-1")),
    (Kind.TXN_OFFSET_COMMIT, (7, 2, 1000, 3, 5, "txn-1", "g",
                              [M.TopicCommits("t", [M.CommittedPartition(0, 42, -1, None)])], "member-1", "instance-1")),
    (Kind.LIST_TRANSACTIONS, (7, 1, 60000, ["Ongoing", "Nonsense"], [1000, 2**62])),
    (Kind.DESCRIBE_TRANSACTIONS, (7, 0, ["txn-1", ""])),
    (Kind.QUOTA_USAGE, (7, [M.ClientUsage("reporting-job", 1048576, 0), M.ClientUsage("", 0, 12)])),
    (Kind.THROTTLE, (9, 123, 450, 1, "reporting-job")),
    (Kind.QUOTA_STATE, ([M.ClientRate("reporting-job", 2000000, 0, 10000, 10000)], [M.CountedReport(0, 7)])),
    (Kind.CLEAN, (3, 0, "changelog")),
    (Kind.CLEANED, (3, 0, "changelog", "", True, 0, 1000, 1 << 30, 1 << 20, 1 << 29, 10**7, 10**6, 17, 10**6, 9000)),
]


def plain(value):
    """A value with every list and (named) tuple in it as a plain tuple, for comparing decoded records."""
    return tuple(plain(v) for v in value) if isinstance(value, (list, tuple)) else value


def fields_of(message) -> tuple:
    layout = M.MESSAGES[message.kind].fields
    return tuple(message)[len(message) - len(layout.fields):]


@pytest.mark.parametrize("kind, values", TYPED)
def test_every_typed_kind_round_trips(kind, values):
    frame = M.encode(kind, *values)
    message = M.decode(memoryview(frame))
    assert message.kind is kind and plain(message) == plain(values)
    assert M.conforms(fields_of(message), M.MESSAGES[kind].fields.fields)
    assert M.encode_message(message) == frame


# One answer of every kind a REPLY carries.
ANSWERS = [
    (Kind.JOIN_GROUP, (0, 3, "consumer", "range", "m-1", "m-1", [M.JoinedMember("m-1", None, b"\x00meta")])),
    (Kind.SYNC_GROUP, (0, b"\x00\x01assignment")),
    (Kind.HEARTBEAT, (27,)),
    (Kind.LEAVE_GROUP, (0, [M.LeftMember("m-1", None, 0), M.LeftMember("", "s", 25)])),
    (Kind.COMMIT_OFFSETS, ([M.TopicPartitionErrors("t", [M.PartitionError(0, 0), M.PartitionError(1, 3)])],)),
    (Kind.FETCH_OFFSETS, (0, [M.TopicOffsets("t", [M.PartitionOffset(0, 42, -1, "", 0),
                                                   M.PartitionOffset(1, -1, -1, None, 0)])])),
    (Kind.LIST_GROUPS, (0, [M.ListedGroup("g", "consumer", "Stable", "classic")])),
    (Kind.DESCRIBE_GROUPS, ([M.DescribedGroup(0, "g", "Stable", "consumer", "range",
                                              [M.DescribedMember("m", None, "c", "/127.0.0.1", b"md", b"as")])],)),
    (Kind.DELETE_GROUPS, ([M.GroupError("g", 69)],)),
    (Kind.DELETE_OFFSETS, (0, [M.TopicPartitionErrors("t", [M.PartitionError(0, 86)])])),
    (Kind.CONSUMER_GROUP_HEARTBEAT, (0, None, "m-1", 3, 5000, [M.TopicPartitions("t", [0, 1])])),
    (Kind.CONSUMER_GROUP_HEARTBEAT, (110, "fenced", "m-1", -1, 5000, None)),
    (Kind.CONSUMER_GROUP_DESCRIBE, ([M.DescribedConsumerGroup(0, None, "g", "Stable", 4, 4, "uniform", [
        M.DescribedConsumerMember("m", None, None, 4, "c", "/127.0.0.1", ["t"], None,
                                  [M.TopicPartitions("t", [0])], [M.TopicPartitions("t", [0, 1])])])],)),
    (Kind.STREAMS_GROUP_HEARTBEAT, (0, None, "m-1", 3, 5000, 10000, 60000, [M.StreamsStatus(3, "missing")],
                                    [M.TaskIds("0", [0, 1])], [], [], 1,
                                    [M.EndpointPartitions("localhost", 8080, [M.TopicPartitions("in", [0])], [])])),
    (Kind.STREAMS_GROUP_HEARTBEAT, (25, "unknown", "m-1", 0, 0, 0, 0, None, None, None, None, 0, None)),
    (Kind.STREAMS_GROUP_DESCRIBE, ([M.DescribedStreamsGroup(0, None, "app", "Stable", 4, 4, 0, [M.Subtopology(
        "0", ["in"], [], [], [], [], [])], [M.DescribedStreamsMember(
            "m", 4, None, None, "c", "/127.0.0.1", 0, "p-1", None, -1, [], [M.TaskIds("0", [0])],
            [M.TaskIds("0", [0])], [M.TaskIds("1", [1])], [M.TaskIds("1", [1, 2])])]),
        M.DescribedStreamsGroup(69, "not found", "x", "Dead", -1, -1, -1, None, [])],)),
    (Kind.INIT_PRODUCER_ID, (0, 1000, 4)),
    (Kind.ADD_PARTITIONS_TO_TXN, ([M.TopicPartitionErrors("t", [M.PartitionError(0, 51)])],)),
    (Kind.ADD_OFFSETS_TO_TXN, (90,)),
    (Kind.END_TXN, (48,)),
    (Kind.TXN_OFFSET_COMMIT, ([M.TopicPartitionErrors("t", [M.PartitionError(0, 0)])],)),
    (Kind.LIST_TRANSACTIONS, (0, ["Nonsense"], [M.ListedTransaction("txn-1", 1000, "Ongoing")])),
    (Kind.DESCRIBE_TRANSACTIONS, ([M.DescribedTransaction(0, "txn-1", "Ongoing", 60000, 1795770000000, 1000, 3,
                                                          [M.TopicPartitions("t", [0, 2])]),
                                   M.DescribedTransaction(105, "gone", "", 0, -1, -1, -1, [])],)),
    (Kind.CREATE_TOPICS, {"t": [0, None], "bad name": [17, "illegal topic name"]}),
    (Kind.DELETE_RECORDS, [[0, 5], [3, -1]]),
]


@pytest.mark.parametrize("kind, answer", ANSWERS)
def test_every_reply_round_trips(kind, answer):
    message = M.decode(M.encode_reply(2**63, kind, answer))
    assert message.kind is Kind.REPLY and message.request_id == 2**63 and message.of_kind is kind
    if M.reply_class(kind) == M.DOCUMENT:
        assert message.answer == answer
    else:
        assert isinstance(message.answer, M.reply_class(kind)) and plain(message.answer) == plain(answer)
        assert M.conforms(message.answer, M.reply_class(kind).fields)


def test_an_answer_of_an_error_alone_leaves_the_rest_empty():
    answer = M.reply_class(Kind.DELETE_OFFSETS)(69)
    assert tuple(M.decode(M.encode_reply(1, Kind.DELETE_OFFSETS, answer)).answer) == (69, ())
    join = M.reply_class(Kind.JOIN_GROUP)(16)
    assert join.protocol is None and join.leader == "" and join.members == ()


@settings(max_examples=200, deadline=None, database=None)
@given(group=st.text(max_size=40), member=st.text(max_size=80), instance=st.none() | st.text(max_size=20),
       protocols=st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=300)), max_size=5),
       commits=st.lists(st.tuples(st.text(max_size=30), st.lists(st.tuples(
           st.integers(-(2**31), 2**31 - 1), i64, st.integers(-(2**31), 2**31 - 1), st.none() | st.text(max_size=30)),
           max_size=5)), max_size=5))
def test_typed_fields_round_trip_any_text_and_bytes(group, member, instance, protocols, commits):
    join = (1, 5, 6000, 6000, group, member, instance, "consumer", [M.Protocol(*p) for p in protocols], "c", "h")
    assert plain(M.decode(M.encode(Kind.JOIN_GROUP, *join))) == plain(join)
    commit = (1, 7, 3, group, member, instance,
              [M.TopicCommits(t, [M.CommittedPartition(*p) for p in parts]) for t, parts in commits])
    decoded = M.decode(M.encode(Kind.COMMIT_OFFSETS, *commit))
    assert plain(decoded) == plain(commit) and M.conforms(fields_of(decoded), M.MESSAGES[Kind.COMMIT_OFFSETS].fields.fields)


def test_conforms_tells_a_layout_from_another():
    fields = M.MESSAGES[Kind.SYNC_GROUP].fields.fields
    assert M.conforms(("g", "m", None, [("m", b"a")]), fields)
    assert not M.conforms(("g", "m", None, [("m", "not bytes")]), fields)
    assert not M.conforms(("g", None, None, []), fields)  # a STR given None
    assert not M.conforms(("g", "m", None), fields)
    assert not M.conforms((2**40,), M.reply_class(Kind.HEARTBEAT).fields)  # does not fit an int16


def test_every_declared_kind_is_in_the_tests_above():
    assert set(M.MESSAGES) == set(Kind)
    assert {kind for kind in Kind if kind < M.FIRST_TIMER_KIND} == {
        Kind.DELAY_FETCH, Kind.DELAY_PRODUCE, Kind.CANCEL, Kind.CREATE_TOPICS, Kind.DELETE_TOPICS,
        Kind.CREATE_PARTITIONS, Kind.ALTER_CONFIGS, Kind.DELETE_RECORDS, Kind.FLUSH, *M.GROUP_KINDS, *M.TRANSACTION_KINDS,
        Kind.QUOTA_USAGE, Kind.THROTTLE, Kind.CLEANED, Kind.CLEANER_READY}


@pytest.mark.parametrize("bad", [
    b"", b"\x01", b"\x63" + bytes(7),
    bytes([Kind.FLUSH, M.LAYOUT_VERSION, 2, 0, 0, 0, 0, 0]) + bytes(4),  # count says 2, one item there
    bytes([Kind.CANCEL, 9, 0, 0, 0, 0, 0, 0]),  # layout version 9
    bytes([Kind.DELETE_TOPICS, M.LAYOUT_VERSION, 0, 0, 0, 0, 0, 0]) + bytes(8) + b"{nope",  # bad document
    bytes([Kind.CREATE_TOPICS, M.LAYOUT_VERSION, 0, 0, 0, 0, 0, 0]) + bytes(8) + b"{}",  # deadline cut short
    bytes([Kind.LAYOUT, M.LAYOUT_VERSION, 1, 0, 0, 0, 0, 0]) + bytes(8),  # items on a kind without items
    M.encode(Kind.HEARTBEAT, 1, 3, 4, "g", "m", None)[:-1],  # fields cut short
    M.encode(Kind.HEARTBEAT, 1, 3, 4, "g", "m", None) + b"\x00",  # a byte after the fields
    M.encode(Kind.HEARTBEAT, 1, 3, 4, "\u00e9", "m", None).replace("\u00e9".encode(), b"\xc3\x28"),  # not UTF-8
    M.encode(Kind.HEARTBEAT, 1, 3, 4, "g", "m", None)[:22] + b"\x92\xa1g\xa1m",  # two fields of three
    M.encode(Kind.HEARTBEAT, 1, 3, 4, "g", "m", None)[:22] + b"\xa1g",  # a text, not the array of fields
    M.encode(Kind.DESCRIBE_GROUPS, 1, 4, ["a"])[:18] + b"\x91\xdd\xff\xff\xff\xfe",  # a count no frame holds
    M.encode_reply(1, Kind.HEARTBEAT, (0,))[:16] + bytes([Kind.DELAY_FETCH]) + b"\x91\x00",  # REPLY of a kind without one
    M.encode_reply(1, Kind.HEARTBEAT, (0,))[:17] + b"\x92\x00\x00",  # an answer of two fields for one
])
def test_bad_frames_raise_message_error(bad):
    with pytest.raises(MessageError):
        M.decode(bad)


def test_bad_values_raise_message_error():
    with pytest.raises(MessageError):
        M.encode(Kind.CANCEL, items=[(-1,)])  # negative u64
    with pytest.raises(MessageError):
        M.encode(Kind.FLUSH, items=[(1, 2)])  # one field too many
    with pytest.raises(MessageError):
        M.encode(Kind.DELAY_FETCH, 1, 2, items=[])  # a body field missing
    with pytest.raises(MessageError):
        M.encode_delay_fetch(-1, 2, 3, [(1, 2, 3)])  # negative u64
    with pytest.raises(MessageError):
        M.encode_delay_fetch(1, 2, 3, [(1, 2)])  # an item field missing
    # Not one-partition DELAY_FETCH frames of this layout: no array view (the timer decodes them one by one).
    one = M.encode(Kind.DELAY_FETCH, 1, 2, 3, items=[(1, 2, 3)])
    assert M.delay_fetch_records([]) is None
    assert M.delay_fetch_records([one, one[:1] + bytes([M.LAYOUT_VERSION - 1]) + one[2:]]) is None
    assert M.delay_fetch_records([one, bytes([Kind.DELAY_PRODUCE]) + one[1:]]) is None
    assert M.delay_fetch_records([one, one[:2] + (2).to_bytes(2, "little") + one[4:]]) is None  # count 2, 1 item
    with pytest.raises(MessageError):
        M.encode(Kind.CANCEL, items=[(i,) for i in range(M.MAX_ITEMS + 1)])
    with pytest.raises(MessageError):
        M.encode(Kind.CREATE_TOPICS, 1, 2, document={1, 2})  # not serialisable
    with pytest.raises(MessageError):
        M.encode(Kind.FLUSH, items=[(1,)], document=[1])  # a kind without a document
    with pytest.raises(MessageError):
        M.encode(Kind.HEARTBEAT, 1, 3, 4, "g", "m", None, object())  # a field too many, not packable either
    with pytest.raises(MessageError):
        M.encode(Kind.HEARTBEAT, 1, 3, 4, "g", "m")  # a field missing
    with pytest.raises(MessageError):
        M.encode(Kind.HEARTBEAT, 1, 3, 4, "g", "m", None, items=[(1,)])  # items on a kind with fields
    with pytest.raises(MessageError):
        M.encode_reply(1, Kind.HEARTBEAT, (0, 1))  # a field too many
    with pytest.raises(MessageError):
        M.encode_reply(1, Kind.DELAY_FETCH, (0,))  # not answered by a REPLY


@settings(max_examples=500, deadline=None, database=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_but_message_error(data):
    try:
        M.decode(data)
    except MessageError:
        pass
