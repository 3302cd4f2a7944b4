"""Flexible-version (KIP-482) wire primitives shared by the codecs, and the filter that drops unknown tagged fields.

A flexible message ends every structure with a tagged-field section: an unsigned varint count, then per field an
unsigned varint tag, an unsigned varint size and that many bytes. A reader must skip the tags it does not know (a
newer client may send them). kio's native reader refuses an unknown tag instead, and trusts array counts, so a
flexible body is first walked by ``KnownTagsFilter.check`` (counts and lengths bounded by the bytes left) and,
only when that walk met an unknown tag, rewritten by ``KnownTagsFilter.filter`` without them.

Invariants:
- ``KnownTagsFilter(cls).check(body)`` raises ``ProtocolError`` unless every count and length in the body fits
  in the bytes after it; a body that passes cannot make kio allocate more than its own size in elements.
- ``KnownTagsFilter(cls).filter(body)`` returns a body that decodes with ``cls`` exactly as the original would
  with every unknown tagged field (at any depth, known tagged structures included) removed; it raises
  ``ProtocolError`` on a truncated or malformed body and never loops or allocates in proportion to a count it
  has not checked against the bytes left.
- The varint helpers read and write Kafka's unsigned varints (7 bits a byte, low group first, at most 5 bytes
  for the 32-bit values the protocol uses).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)

from shmbroker.workers.codecs.errors import ProtocolError

_MAX_UVARINT_BYTES = 5
_FIXED_SIZES = {
    "int8": 1, "uint8": 1, "bool": 1,
    "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}
_LENGTH_PREFIXED = frozenset({"string", "bytes", "records"})


def read_uvarint(buffer: Any, pos: int, end: int) -> tuple[int, int]:
    """An unsigned varint at ``pos``: (value, position after it)."""
    value = shift = 0
    for at in range(pos, min(end, pos + _MAX_UVARINT_BYTES)):
        byte = buffer[at]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at + 1
        shift += 7
    raise ProtocolError("truncated or overlong unsigned varint")


@functools.lru_cache(maxsize=4096)
def uvarint(value: int) -> bytes:
    """Kafka's unsigned varint encoding of ``value`` (cached: lengths and counts repeat)."""
    if value < 0:
        raise ProtocolError(f"unsigned varint of negative {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def skip_tagged_fields(buffer: Any, pos: int, end: int) -> int:
    """Skip a whole tagged-field section (none of them is used by the caller); the position after it."""
    count, pos = read_uvarint(buffer, pos, end)
    if count > end - pos:
        raise ProtocolError(f"tagged field count {count} exceeds the bytes left")
    for _ in range(count):
        _, pos = read_uvarint(buffer, pos, end)
        size, pos = read_uvarint(buffer, pos, end)
        pos += size
        if pos > end:
            raise ProtocolError("truncated tagged field")
    return pos


# A step walks one field at buffer[pos:]: it appends the field's bytes to `out` (None: only checks them) and
# returns the position after it. Every count and length is checked against the bytes left before it is used.
Step = Callable[[Any, int, int, "bytearray | None", "Walk"], int]


class Walk:
    """What one walk found: whether the body holds a tagged field its schema lacks."""

    __slots__ = ("unknown_tags",)

    def __init__(self) -> None:
        self.unknown_tags = False


def _fixed(size: int) -> Step:
    def step(buffer: Any, pos: int, end: int, out: bytearray | None, walk: Walk) -> int:
        if pos + size > end:
            raise ProtocolError("truncated field")
        if out is not None:
            out += buffer[pos:pos + size]
        return pos + size
    return step


def _compact_bytes(buffer: Any, pos: int, end: int, out: bytearray | None, walk: Walk) -> int:
    start = pos
    length_plus_one, pos = read_uvarint(buffer, pos, end)
    pos += max(length_plus_one - 1, 0)
    if pos > end:
        raise ProtocolError("truncated compact string or bytes")
    if out is not None:
        out += buffer[start:pos]
    return pos


def _compact_array(element: Step) -> Step:
    def step(buffer: Any, pos: int, end: int, out: bytearray | None, walk: Walk) -> int:
        count_plus_one, pos = read_uvarint(buffer, pos, end)
        count = count_plus_one - 1
        if count > end - pos:  # every element takes a byte at least
            raise ProtocolError(f"array count {count} exceeds the bytes left")
        if out is not None:
            out += uvarint(count_plus_one)
        for _ in range(count):
            pos = element(buffer, pos, end, out, walk)
        return pos
    return step


def _nullable_entity(entity: Step) -> Step:
    def step(buffer: Any, pos: int, end: int, out: bytearray | None, walk: Walk) -> int:
        if pos >= end:
            raise ProtocolError("truncated nullable structure")
        marker = buffer[pos]
        if out is not None:
            out.append(marker)
        return pos + 1 if marker == 0xFF else entity(buffer, pos + 1, end, out, walk)
    return step


class KnownTagsFilter:
    """Checks a flexible body of one kio entity class before kio reads it, and rewrites it keeping only the
    tagged fields its schema declares.

    kio's native reader trusts the counts of compact arrays (a few bytes claiming billions of elements make it
    abort the process on the allocation), so every flexible body is walked here first; a walk is the schema's
    fields in order, each count bounded by the bytes left."""

    def __init__(self, cls: type) -> None:
        self.steps: list[Step] = []
        self.tagged: dict[int, Step] = {}
        for field in dataclasses.fields(cls):
            tag = get_field_tag(field)
            step = _field_step(field, nullable=tag is None and is_optional(field))
            if tag is None:
                self.steps.append(step)
            else:
                self.tagged[int(tag)] = step

    def check(self, body: Any) -> bool:
        """Walk the body (ProtocolError if a count or length overruns it); True if it has unknown tags."""
        walk = Walk()
        try:
            self.walk(body, 0, len(body), None, walk)
        except IndexError:
            raise ProtocolError("truncated flexible body") from None
        return walk.unknown_tags

    def filter(self, body: Any) -> bytes:
        """The body without the tagged fields its schema lacks."""
        out = bytearray()
        try:
            pos = self.walk(body, 0, len(body), out, Walk())
        except IndexError:
            raise ProtocolError("truncated flexible body") from None
        out += body[pos:]  # trailing bytes stay: the decoder refuses them
        return bytes(out)

    def walk(self, buffer: Any, pos: int, end: int, out: bytearray | None, walk: Walk) -> int:
        for step in self.steps:
            pos = step(buffer, pos, end, out, walk)
        count, pos = read_uvarint(buffer, pos, end)
        if count > end - pos:
            raise ProtocolError(f"tagged field count {count} exceeds the bytes left")
        kept: list[bytes] = []
        for _ in range(count):
            tag, pos = read_uvarint(buffer, pos, end)
            size, pos = read_uvarint(buffer, pos, end)
            if pos + size > end:
                raise ProtocolError("truncated tagged field")
            step = self.tagged.get(tag)
            if step is None:
                walk.unknown_tags = True
            else:
                value = None if out is None else bytearray()
                if step(buffer, pos, pos + size, value, walk) != pos + size:
                    raise ProtocolError(f"tagged field {tag} has bytes its schema does not read")
                if value is not None:
                    kept.append(uvarint(tag) + uvarint(len(value)) + bytes(value))
            pos += size
        if out is not None:
            out += uvarint(len(kept))
            for field_bytes in kept:
                out += field_bytes
        return pos


@functools.cache
def known_tags_filter(cls: type) -> KnownTagsFilter:
    return KnownTagsFilter(cls)


def _field_step(field: dataclasses.Field, nullable: bool) -> Step:
    kind = classify_field(field)
    if isinstance(kind, EntityField):
        nested = known_tags_filter(kind.type_).walk
        return _nullable_entity(nested) if nullable else nested
    if isinstance(kind, EntityTupleField):
        return _compact_array(known_tags_filter(kind.type_).walk)
    kafka_type = field.metadata["kafka_type"]
    element = _compact_bytes if kafka_type in _LENGTH_PREFIXED else _fixed(_FIXED_SIZES[kafka_type])
    if isinstance(kind, PrimitiveTupleField):
        return _compact_array(element)
    return element
