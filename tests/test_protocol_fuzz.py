"""Fuzz the request-side decoders: whatever bytes arrive, only ProtocolError comes out.

Random bytes, valid frames cut short or with bytes flipped, huge length fields and wrong
versions go through the same calls a worker makes (frame_size / split_frames,
parse_request_header, decode_request). Bounded in examples so the file runs in seconds.
"""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scripts.harness import rawkafka
from shmbroker.workers.codecs import protocol
from shmbroker.workers.codecs.errors import ProtocolError

FUZZ = settings(max_examples=1000, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
ALL_VERSIONS = [(k, v) for k, (lo, hi) in protocol.SUPPORTED_APIS.items() for v in range(lo, hi + 1)]
WRONG_VERSIONS = [(0, 2), (0, 12), (1, 3), (1, 13), (3, 10), (18, 5), (2, 0), (19, 7), (7, 0), (-5, 0)]


def valid_bodies() -> list[tuple[int, int, bytes]]:
    batch = rawkafka.make_batch(3, 20)
    out = []
    for v in range(3, 12):
        out.append((0, v, rawkafka.produce_body({"t": {0: batch, 1: b""}, "u": {2: batch}}, version=v)))
    for v in range(4, 13):
        out.append((1, v, rawkafka.fetch_body({"t": {0: 1, 1: 2}}, version=v)))
    for v in range(0, 10):
        out.append((3, v, rawkafka.metadata_body(["a", "b"], version=v)))
    for v in range(0, 4):
        out.append((18, v, rawkafka.api_versions_body(v)))
    for v in range(2, 7):
        out.append((19, v, rawkafka.create_topics_body({"x": 2}, version=v)))
    for v in range(1, 7):
        out.append((2, v, rawkafka.list_offsets_body({"x": [0]}, version=v)))
    return out


VALID = valid_bodies()
NONEMPTY = [v for v in VALID if v[2]]  # ApiVersions v0-2 bodies are empty


def decode_frame(frame: bytes | memoryview) -> object:
    """What a worker does with one frame; returns the request, or raises ProtocolError."""
    header = protocol.parse_request_header(frame)
    body = memoryview(frame)[header.body_offset :]
    return protocol.decode_request(header.api_key, header.api_version, body)


def only_protocol_errors(fn, *args) -> None:
    try:
        fn(*args)
    except ProtocolError:
        pass


@FUZZ
@given(st.binary(max_size=300))
def test_random_frames(data: bytes) -> None:
    only_protocol_errors(decode_frame, data)
    only_protocol_errors(protocol.split_frames, data)


@FUZZ
@given(st.sampled_from(ALL_VERSIONS + WRONG_VERSIONS), st.binary(max_size=200))
def test_random_bodies_for_every_api_version(key_version, body: bytes) -> None:
    api_key, version = key_version
    only_protocol_errors(protocol.decode_request, api_key, version, memoryview(body))


@FUZZ
@given(st.sampled_from(NONEMPTY), st.data())
def test_truncated_valid_bodies(valid, data) -> None:
    api_key, version, body = valid
    cut = data.draw(st.integers(0, len(body) - 1))
    try:
        protocol.decode_request(api_key, version, memoryview(body[:cut]))
    except ProtocolError:
        return
    raise AssertionError(f"api {api_key} v{version}: a body cut at {cut}/{len(body)} decoded")


@FUZZ
@given(st.sampled_from(NONEMPTY), st.data())
def test_mutated_valid_bodies(valid, data) -> None:
    api_key, version, body = valid
    mutated = bytearray(body)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(mutated) - 1))
        mutated[pos] = data.draw(st.integers(0, 255))
    only_protocol_errors(protocol.decode_request, api_key, version, memoryview(mutated))


@FUZZ
@given(st.sampled_from(NONEMPTY), st.data(), st.sampled_from([0x7FFFFFFF, 0x7FFF, -2, -(2**31), 0x10000000]))
def test_huge_or_negative_length_fields(valid, data, value: int) -> None:
    """Overwrite an int16 or int32 at a random place with a huge/negative length."""
    api_key, version, body = valid
    mutated = bytearray(body)
    width = data.draw(st.sampled_from([2, 4]))
    if len(mutated) < width:
        return
    pos = data.draw(st.integers(0, len(mutated) - width))
    if width == 2:
        struct.pack_into(">h", mutated, pos, max(-(2**15), min(2**15 - 1, value)))
    else:
        struct.pack_into(">i", mutated, pos, value)
    only_protocol_errors(protocol.decode_request, api_key, version, memoryview(mutated))


@FUZZ
@given(st.integers(-(2**31), 2**31 - 1), st.binary(max_size=12))
def test_length_prefixes(size: int, rest: bytes) -> None:
    data = struct.pack(">i", size) + rest
    valid_size = 0 <= size <= protocol.DEFAULT_MAX_REQUEST_SIZE
    try:
        assert protocol.frame_size(data) == size
    except ProtocolError:
        assert not valid_size
    try:
        frames, used = protocol.split_frames(data)
    except ProtocolError:
        return  # this frame's size or a later one's is out of bounds
    assert valid_size
    if size <= len(rest):
        assert bytes(frames[0]) == rest[:size]
    else:
        assert (frames, used) == ([], 0)


@FUZZ
@given(st.sampled_from(WRONG_VERSIONS + [(18, 3), (18, 7)]), st.integers(-(2**31), 2**31 - 1), st.binary(max_size=40))
def test_whole_frames_with_wrong_versions(key_version, correlation_id: int, body: bytes) -> None:
    api_key, version = key_version
    frame = rawkafka.encode_request(api_key, version, correlation_id, body)[4:]
    try:
        header = protocol.parse_request_header(frame)
    except ProtocolError:
        return
    # The header alone always yields the correlation id, so the worker can answer or log it.
    assert header.correlation_id == correlation_id
    only_protocol_errors(protocol.decode_request, header.api_key, header.api_version, memoryview(frame)[header.body_offset :])
