"""The worker-timer contract (shm.messages): every kind round-trips, and bad frames or values raise
MessageError and nothing else."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shm import messages as M
from shm.messages import Kind, MessageError

u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
u32 = st.integers(0, 2**32 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)


@settings(max_examples=200, deadline=None, database=None)
@given(request_id=u64, deadline=i64, min_bytes=i32, items=st.lists(st.tuples(u32, i64), max_size=20))
def test_delay_fetch_round_trip(request_id, deadline, min_bytes, items):
    frame = M.encode(Kind.DELAY_FETCH, request_id, deadline, min_bytes, items=items)
    message = M.decode(memoryview(frame))
    assert message.kind is Kind.DELAY_FETCH and isinstance(message, M.DelayFetch)
    assert (message.request_id, message.deadline_ms, message.min_bytes) == (request_id, deadline, min_bytes)
    assert message.items == items and message.document is None


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
    (Kind.REPLY, (5,), [], {"t": [0, None], "bad name": [17, "illegal topic name"]}),
    (Kind.TIMER_STARTED, (4321,), [], None),
    (Kind.HEARTBEAT, (7, 3), [], {"group": "g", "member": "m-1", "generation": 4, "instance": None}),
    (Kind.QUOTA_USAGE, (7,), [], {"reporting-job": [1048576, 0]}),
    (Kind.THROTTLE, (9, 123, 450, 1), [], "reporting-job"),
    (Kind.QUOTA_STATE, (), [], {"rates": {"reporting-job": [2000000, 0, 10000, 10000]}, "counted": {"0": 7}}),
    (Kind.LAYOUT, (12,), [], None),
])
def test_every_kind_round_trips(kind, body, items, document):
    message = M.decode(M.encode(kind, *body, items=items, document=document))
    assert message.kind is kind
    assert tuple(message)[:len(body)] == body
    assert message.items == items and message.document == document


def test_every_declared_kind_is_in_the_test_above():
    assert set(M.MESSAGES) == set(Kind)
    assert {kind for kind in Kind if kind < M.FIRST_TIMER_KIND} == {
        Kind.DELAY_FETCH, Kind.DELAY_PRODUCE, Kind.CANCEL, Kind.CREATE_TOPICS, Kind.DELETE_TOPICS,
        Kind.CREATE_PARTITIONS, Kind.ALTER_CONFIGS, Kind.DELETE_RECORDS, Kind.FLUSH, *M.GROUP_KINDS,
        Kind.QUOTA_USAGE, Kind.THROTTLE}


@pytest.mark.parametrize("bad", [
    b"", b"\x01", b"\x63" + bytes(7),
    bytes([Kind.FLUSH, M.LAYOUT_VERSION, 2, 0, 0, 0, 0, 0]) + bytes(4),  # count says 2, one item there
    bytes([Kind.CANCEL, 9, 0, 0, 0, 0, 0, 0]),  # layout version 9
    bytes([Kind.DELETE_TOPICS, M.LAYOUT_VERSION, 0, 0, 0, 0, 0, 0]) + bytes(8) + b"{nope",  # bad document
    bytes([Kind.CREATE_TOPICS, M.LAYOUT_VERSION, 0, 0, 0, 0, 0, 0]) + bytes(8) + b"{}",  # deadline cut short
    bytes([Kind.LAYOUT, M.LAYOUT_VERSION, 1, 0, 0, 0, 0, 0]) + bytes(8),  # items on a kind without items
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
        M.encode(Kind.CANCEL, items=[(i,) for i in range(M.MAX_ITEMS + 1)])
    with pytest.raises(MessageError):
        M.encode(Kind.CREATE_TOPICS, 1, 2, document={1, 2})  # not serialisable
    with pytest.raises(MessageError):
        M.encode(Kind.FLUSH, items=[(1,)], document=[1])  # a kind without a document


@settings(max_examples=500, deadline=None, database=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_but_message_error(data):
    try:
        M.decode(data)
    except MessageError:
        pass
