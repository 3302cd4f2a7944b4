"""The compiled request-header parser (workers/codecs/_header.c) against the Python one it replaces: the same
RequestHeader for every frame, and a ProtocolError for the same frames, on hand-made edge cases and on random
frames (well-formed headers, flexible ones with tagged fields, and arbitrary bytes)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.codecs.errors import ProtocolError
from shmbroker.workers.codecs.tagged_fields import uvarint

pytestmark = pytest.mark.skipif(P._header is None, reason="workers.codecs._header was not built")


def outcome(parse, frame):
    try:
        return parse(frame)
    except ProtocolError:
        return ProtocolError


def same(frame: bytes) -> None:
    compiled = outcome(P._header.parse, memoryview(frame))
    assert compiled == outcome(P.parse_request_header_python, memoryview(frame))
    if compiled is not ProtocolError:
        assert type(compiled) is P.RequestHeader
        assert outcome(P._header.parse, frame) == compiled  # bytes as well as views


def header(api_key: int, version: int, correlation_id: int, client_id: bytes | None, tags: bytes = b"") -> bytes:
    length = -1 if client_id is None else len(client_id)
    return struct.pack(">hhih", api_key, version, correlation_id, length) + (client_id or b"") + tags


def test_the_compiled_parser_is_the_one_in_use() -> None:
    assert P.parse_request_header is P._header.parse


@pytest.mark.parametrize("frame", [
    b"", b"\x00", b"\x00\x01\x00", b"\x00\x01\x00\x0c", b"\x00\x01\x00\x0c\x00\x00\x00\x01\xff",
    header(1, 12, 7, b"rdkafka", b"\x00"),  # flexible, empty tagged section
    header(1, 12, 7, None, b"\x00" + b"body"),
    header(1, 11, 7, b"c"),  # header v1: no tagged section
    header(1, 12, 7, b"c"),  # flexible without its section: truncated varint
    header(1, 12, 7, b"c", b"\x02\x00\x01x\x01\x02ab"),  # two tagged fields
    header(1, 12, 7, b"c", b"\x01\x00\x05ab"),  # a tagged field past the frame
    header(1, 12, 7, b"c", b"\x07\x00"),  # more fields than bytes
    header(1, 12, 7, b"c", b"\x80\x80\x80\x80\x80\x01"),  # an overlong varint
    header(18, 3, 7, b"c", b"\x00"), header(18, 4, 7, b"c", b"\x00"),  # ApiVersions v3+: header v2
    header(9999 - 10000, 0, 7, b"c"), header(32767, 32767, -1, b""),  # unknown keys: header v1
    header(0, 9, 7, b"\xff\xfe", b"\x00"),  # client id not UTF-8
    header(0, 9, 7, b"\xed\xa0\x80", b"\x00"),  # a UTF-8-encoded surrogate
    header(0, 9, 7, "\u00e9t\u00e9".encode(), b"\x00"),
    struct.pack(">hhih", 0, 9, 7, -2) + b"\x00",  # a negative length other than -1
    struct.pack(">hhih", 0, 9, 7, 5) + b"abc",  # a client id past the frame
])
def test_hand_made_headers_parse_alike(frame: bytes) -> None:
    same(frame)


tagged_field = st.tuples(st.integers(0, 2**31 - 1), st.binary(max_size=8)).map(
    lambda field: uvarint(field[0]) + uvarint(len(field[1])) + field[1])


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(P.FIRST_FLEXIBLE) + [-1, 200]), st.integers(-(2**15), 2**15 - 1),
       st.integers(-(2**31), 2**31 - 1), st.none() | st.text(max_size=12).map(str.encode),
       st.lists(tagged_field, max_size=3), st.binary(max_size=6), st.integers(0, 40))
def test_random_headers_parse_alike(api_key, version, correlation_id, client_id, fields, rest, cut) -> None:
    frame = header(api_key, version, correlation_id, client_id, uvarint(len(fields)) + b"".join(fields) + rest)
    same(frame)
    same(frame[:cut])  # and truncated anywhere


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40))
def test_arbitrary_bytes_parse_alike(frame: bytes) -> None:
    same(frame)
