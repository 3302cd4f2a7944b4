"""Frame codec: round trips, batch decoding, and clear errors on bad input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shm import frames
from shm.frames import FrameError, Kind, Status


def test_delay_fetch_round_trip():
    raw = frames.encode_delay_fetch(2**64 - 1, -5, 1024, [1, 2, 3], [0, 2**40, 7])
    assert len(raw) == frames.frame_size(Kind.DELAY_FETCH, 3)
    assert frames.kind_of(raw) is Kind.DELAY_FETCH
    fetch = frames.decode_delay_fetch(raw)
    assert (fetch.request_id, fetch.deadline_ms, fetch.min_bytes) == (2**64 - 1, -5, 1024)
    assert fetch.items["partition"].tolist() == [1, 2, 3]
    assert fetch.items["start_bytes"].tolist() == [0, 2**40, 7]


def test_delay_produce_round_trip():
    raw = frames.encode_delay_produce(7, 123456, [9], [42])
    produce = frames.decode_delay_produce(memoryview(raw))
    assert (produce.request_id, produce.deadline_ms) == (7, 123456)
    assert produce.items["required_offset"].tolist() == [42]


def test_event_batches_decode_with_one_call_and_concatenate():
    appends = frames.encode_events(Kind.APPEND, partition=np.arange(1000), end_offset=np.arange(1000) * 2,
                                   end_bytes=np.arange(1000) * 100)
    kind, items = frames.decode_events(appends)
    assert kind is Kind.APPEND and len(items) == 1000
    assert items["end_bytes"][-1] == 99900
    completions = [frames.encode_events(Kind.COMPLETION, request_id=[i], status=[Status.EXPIRED], error=[-1])
                   for i in range(5)]
    merged = frames.decode_event_frames(completions, Kind.COMPLETION)
    assert merged["request_id"].tolist() == list(range(5))
    assert set(merged["status"].tolist()) == {Status.EXPIRED}
    array = np.zeros(3, dtype=frames.FLUSH_ITEM)
    array["flushed_offset"] = [5, 6, 7]
    assert frames.decode_events(frames.encode_event_array(Kind.FLUSH, array), Kind.FLUSH)[1]["flushed_offset"].tolist() == [5, 6, 7]


def test_control_round_trip():
    raw = frames.encode_control({"op": "shutdown", "grace_ms": 500})
    assert frames.decode_control(raw) == {"op": "shutdown", "grace_ms": 500}


@pytest.mark.parametrize(
    "bad",
    [b"", b"\x01", b"\x63" + bytes(7), bytes([Kind.APPEND, 1, 2, 0, 0, 0, 0, 0]) + bytes(24),  # count says 2
     bytes([Kind.CANCEL, 9, 0, 0, 0, 0, 0, 0]),  # layout version 9
     bytes([Kind.CONTROL, 1, 0, 0, 0, 0, 0, 0]) + b"{nope"],
)
def test_bad_frames_raise_frame_error(bad):
    with pytest.raises(FrameError):
        kind = frames.kind_of(bad)
        if kind is Kind.CONTROL:
            frames.decode_control(bad)
        else:
            frames.decode_events(bad)


def test_bad_encoder_input_raises_frame_error():
    with pytest.raises(FrameError):
        frames.encode_events(Kind.APPEND, partition=[1], end_offset=[1])  # missing field
    with pytest.raises(FrameError):
        frames.encode_events(Kind.CANCEL, request_id=[1, 2, -3])  # negative u64
    with pytest.raises(FrameError):
        frames.encode_delay_fetch(1, 2, 3, [1, 2], [5])  # columns differ
    with pytest.raises(FrameError):
        frames.encode_events(Kind.CANCEL, request_id=np.arange(frames.MAX_ITEMS + 1))
    with pytest.raises(FrameError):
        frames.decode_delay_fetch(frames.encode_events(Kind.CANCEL, request_id=[1]))  # wrong kind


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_but_frame_error(data):
    try:
        kind = frames.kind_of(data)
        if kind is Kind.CONTROL:
            frames.decode_control(data)
        elif kind is Kind.DELAY_FETCH:
            frames.decode_delay_fetch(data)
        elif kind is Kind.DELAY_PRODUCE:
            frames.decode_delay_produce(data)
        else:
            frames.decode_events(data)
    except FrameError:
        pass


u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
u32 = st.integers(0, 2**32 - 1)


@settings(max_examples=200, deadline=None, database=None)
@given(request_id=u64, deadline=i64, min_bytes=st.integers(-(2**31), 2**31 - 1),
       items=st.lists(st.tuples(u32, i64), max_size=20))
def test_struct_rows_write_the_numpy_layout(request_id, deadline, min_bytes, items):
    by_numpy = frames.encode_delay_fetch(request_id, deadline, min_bytes, [i[0] for i in items], [i[1] for i in items])
    by_struct = frames.encode_rows(Kind.DELAY_FETCH, (request_id, deadline, min_bytes), items)
    assert by_struct == by_numpy
    assert frames.decode_rows(by_numpy) == (Kind.DELAY_FETCH, (request_id, deadline, min_bytes), items)


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(max_size=200))
def test_decode_rows_of_random_bytes_raises_only_frame_error(raw):
    try:
        frames.decode_rows(raw)
    except FrameError:
        pass


def test_encode_rows_rejects_bad_values():
    with pytest.raises(FrameError):
        frames.encode_rows(Kind.CANCEL, None, [(-1,)])
    with pytest.raises(FrameError):
        frames.encode_rows(Kind.APPEND, None, [(1, 2)])
