"""Frame codec: fixed binary layouts of the messages workers and the timer exchange over rings.

Every frame starts with the 8-byte `FRAME_HEADER` (kind u8, layout version u8, item count
u16, reserved u32), then a fixed body for its kind, then `count` fixed-size items. All
layouts are numpy structured dtypes with natural alignment, so a frame (which the ring
places 8-byte aligned) is decoded with one `np.frombuffer` and no copy.

Kinds, body and item fields (times are monotonic milliseconds, byte positions are logical
byte counts appended to a partition so far, so they only grow):
  DELAY_FETCH    request_id u64, deadline_ms i64, min_bytes i32  | items (partition u32, start_bytes i64)
  DELAY_PRODUCE  request_id u64, deadline_ms i64                 | items (partition u32, required_offset i64)
  THROTTLE       -                                               | items (request_id u64, release_ms i64)
  APPEND         -                                               | items (partition u32, end_offset i64, end_bytes i64)
  FLUSH          -                                               | items (partition u32, flushed_offset i64)
  CANCEL         -                                               | items (request_id u64)
  COMPLETION     -                                               | items (request_id u64, status u8, error i16)
  CONTROL        orjson document (rare messages only), count = 0
Events (THROTTLE..COMPLETION) are item arrays, so a producer batches many events of one kind
into one frame and the consumer decodes the batch with one numpy call.

Two codecs over the same layouts: numpy (`encode_*`, `decode_*`: arrays, one call per batch) and
struct (`encode_rows`, `decode_rows`: Python tuples), whose formats are derived from the dtypes,
padding included, so both write the same bytes. Measured (scripts/bench_frames.py): from and
to Python values struct is faster at every size tried (1-512 items: 3-6x at 1 item, ~2x at 512),
so the node's processes, which hold Python values, use rows; numpy is for items that already
are arrays or are consumed column-wise.

Invariants:
- len(frame) == FRAME_HEADER.itemsize + body.itemsize + count * item.itemsize exactly
  (CONTROL: header + any JSON bytes); decoders check this and raise FrameError
  (a ValueError) on any mismatch, unknown kind or version, never anything else.
- Decoded arrays are read-only views into the frame; copy them if they must outlive it
  (a ring frame is only valid until the reader releases it).
- count < 2**16; encoders raise FrameError for more.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import struct

import numpy as np
import orjson

LAYOUT_VERSION = 1
MAX_ITEMS = 0xFFFF


class FrameError(ValueError):
    """A frame that cannot be encoded or decoded."""


class Kind(IntEnum):
    DELAY_FETCH = 1
    DELAY_PRODUCE = 2
    THROTTLE = 3
    APPEND = 4
    FLUSH = 5
    CANCEL = 6
    COMPLETION = 7
    CONTROL = 8


class Status(IntEnum):
    """Outcome of a delayed operation."""

    SATISFIED = 1
    EXPIRED = 2
    CANCELLED = 3


FRAME_HEADER = np.dtype([("kind", "u1"), ("version", "u1"), ("count", "<u2"), ("reserved", "<u4")], align=True)
_EMPTY = np.dtype([])

DELAY_FETCH_BODY = np.dtype([("request_id", "<u8"), ("deadline_ms", "<i8"), ("min_bytes", "<i4")], align=True)
FETCH_ITEM = np.dtype([("partition", "<u4"), ("start_bytes", "<i8")], align=True)
DELAY_PRODUCE_BODY = np.dtype([("request_id", "<u8"), ("deadline_ms", "<i8")], align=True)
PRODUCE_ITEM = np.dtype([("partition", "<u4"), ("required_offset", "<i8")], align=True)
THROTTLE_ITEM = np.dtype([("request_id", "<u8"), ("release_ms", "<i8")], align=True)
APPEND_ITEM = np.dtype([("partition", "<u4"), ("end_offset", "<i8"), ("end_bytes", "<i8")], align=True)
FLUSH_ITEM = np.dtype([("partition", "<u4"), ("flushed_offset", "<i8")], align=True)
CANCEL_ITEM = np.dtype([("request_id", "<u8")], align=True)
COMPLETION_ITEM = np.dtype([("request_id", "<u8"), ("status", "u1"), ("error", "<i2")], align=True)

# kind -> (body dtype, item dtype)
LAYOUTS: dict[Kind, tuple[np.dtype, np.dtype]] = {
    Kind.DELAY_FETCH: (DELAY_FETCH_BODY, FETCH_ITEM),
    Kind.DELAY_PRODUCE: (DELAY_PRODUCE_BODY, PRODUCE_ITEM),
    Kind.THROTTLE: (_EMPTY, THROTTLE_ITEM),
    Kind.APPEND: (_EMPTY, APPEND_ITEM),
    Kind.FLUSH: (_EMPTY, FLUSH_ITEM),
    Kind.CANCEL: (_EMPTY, CANCEL_ITEM),
    Kind.COMPLETION: (_EMPTY, COMPLETION_ITEM),
}
EVENT_KINDS = (Kind.THROTTLE, Kind.APPEND, Kind.FLUSH, Kind.CANCEL, Kind.COMPLETION)

_HEADER_SIZE = FRAME_HEADER.itemsize
assert _HEADER_SIZE == 8 and all(body.itemsize % 8 == 0 for body, _ in LAYOUTS.values())


class DelayFetch(NamedTuple):
    request_id: int
    deadline_ms: int
    min_bytes: int
    items: np.ndarray  # FETCH_ITEM: partition, start_bytes


class DelayProduce(NamedTuple):
    request_id: int
    deadline_ms: int
    items: np.ndarray  # PRODUCE_ITEM: partition, required_offset


def frame_size(kind: Kind, count: int) -> int:
    """Bytes of a frame of `kind` with `count` items (not CONTROL)."""
    body, item = LAYOUTS[kind]
    return _HEADER_SIZE + body.itemsize + count * item.itemsize


def _header(kind: Kind, count: int) -> np.ndarray:
    if not 0 <= count <= MAX_ITEMS:
        raise FrameError(f"{Kind(kind).name}: {count} items, at most {MAX_ITEMS} per frame")
    out = np.zeros(1, dtype=FRAME_HEADER)
    out[0] = (kind, LAYOUT_VERSION, count, 0)
    return out


def _encode(kind: Kind, body: np.ndarray | None, items: np.ndarray) -> bytes:
    parts = [_header(kind, len(items)).tobytes()]
    if body is not None:
        parts.append(body.tobytes())
    parts.append(items.tobytes())
    return b"".join(parts)


def _items(item: np.dtype, columns: dict[str, object]) -> np.ndarray:
    lengths = {name: len(np.atleast_1d(values)) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise FrameError(f"item columns differ in length: {lengths}")
    count = next(iter(lengths.values()))
    out = np.zeros(count, dtype=item)
    try:
        for name, values in columns.items():
            out[name] = values
    except (ValueError, TypeError, OverflowError) as exc:
        raise FrameError(f"bad item values: {exc}") from exc
    return out


def encode_delay_fetch(request_id: int, deadline_ms: int, min_bytes: int, partitions, start_bytes) -> bytes:
    """A delayed fetch: complete when min_bytes are available past start_bytes, or at deadline."""
    items = _items(FETCH_ITEM, {"partition": partitions, "start_bytes": start_bytes})
    body = _body(DELAY_FETCH_BODY, (request_id, deadline_ms, min_bytes))
    return _encode(Kind.DELAY_FETCH, body, items)


def encode_delay_produce(request_id: int, deadline_ms: int, partitions, required_offsets) -> bytes:
    """A delayed produce (acks=all): complete when every partition's flushed offset >= required."""
    items = _items(PRODUCE_ITEM, {"partition": partitions, "required_offset": required_offsets})
    return _encode(Kind.DELAY_PRODUCE, _body(DELAY_PRODUCE_BODY, (request_id, deadline_ms)), items)


def _body(dtype: np.dtype, values: tuple) -> np.ndarray:
    # np.zeros, then assign: padding bytes are zero, not whatever memory held (same bytes as struct).
    out = np.zeros(1, dtype=dtype)
    try:
        out[0] = values
    except (ValueError, TypeError, OverflowError) as exc:
        raise FrameError(f"bad field values {values}: {exc}") from exc
    return out


def encode_events(kind: Kind, **columns) -> bytes:
    """A batch of events of one kind, e.g. encode_events(Kind.APPEND, partition=[..],
    end_offset=[..], end_bytes=[..]). Every field of the item dtype must be given."""
    kind = Kind(kind)
    if kind not in EVENT_KINDS:
        raise FrameError(f"{kind.name} is not an event kind")
    item = LAYOUTS[kind][1]
    if set(columns) != set(item.names):
        raise FrameError(f"{kind.name} needs fields {item.names}, got {tuple(columns)}")
    return _encode(kind, None, _items(item, columns))


def encode_event_array(kind: Kind, items: np.ndarray) -> bytes:
    """A batch of events from an array already of the item dtype (no per-field copying)."""
    kind = Kind(kind)
    if kind not in EVENT_KINDS or items.dtype != LAYOUTS[kind][1]:
        raise FrameError(f"{kind!r} items must have dtype {LAYOUTS.get(kind, (None, None))[1]}")
    return _encode(kind, None, items)


def encode_control(document) -> bytes:
    """A rare control message carrying any orjson-serialisable document."""
    try:
        payload = orjson.dumps(document)
    except TypeError as exc:
        raise FrameError(f"control document not serialisable: {exc}") from exc
    return _header(Kind.CONTROL, 0).tobytes() + payload


def kind_of(frame) -> Kind:
    """The kind of a frame (bytes or memoryview); FrameError if unknown or truncated."""
    if len(frame) < _HEADER_SIZE:
        raise FrameError(f"frame of {len(frame)} bytes is shorter than its header")
    try:
        return Kind(frame[0])
    except ValueError:
        raise FrameError(f"unknown frame kind {frame[0]}") from None


def _decode(frame, expected: Kind | None = None) -> tuple[Kind, np.ndarray | None, np.ndarray]:
    kind = kind_of(frame)
    if expected is not None and kind != expected:
        raise FrameError(f"expected a {expected.name} frame, got {kind.name}")
    if kind == Kind.CONTROL:
        raise FrameError("CONTROL frames are decoded with decode_control")
    header = np.frombuffer(frame, dtype=FRAME_HEADER, count=1)[0]
    if header["version"] != LAYOUT_VERSION:
        raise FrameError(f"{kind.name} frame of layout version {header['version']}, expected {LAYOUT_VERSION}")
    count = int(header["count"])
    body_dtype, item_dtype = LAYOUTS[kind]
    expected_size = _HEADER_SIZE + body_dtype.itemsize + count * item_dtype.itemsize
    if len(frame) != expected_size:
        raise FrameError(f"{kind.name} frame with {count} items must be {expected_size} bytes, is {len(frame)}")
    body = np.frombuffer(frame, dtype=body_dtype, count=1, offset=_HEADER_SIZE)[0] if body_dtype.itemsize else None
    items = np.frombuffer(frame, dtype=item_dtype, count=count, offset=_HEADER_SIZE + body_dtype.itemsize)
    return kind, body, items


def decode_delay_fetch(frame) -> DelayFetch:
    _, body, items = _decode(frame, Kind.DELAY_FETCH)
    return DelayFetch(int(body["request_id"]), int(body["deadline_ms"]), int(body["min_bytes"]), items)


def decode_delay_produce(frame) -> DelayProduce:
    _, body, items = _decode(frame, Kind.DELAY_PRODUCE)
    return DelayProduce(int(body["request_id"]), int(body["deadline_ms"]), items)


def decode_events(frame, kind: Kind | None = None) -> tuple[Kind, np.ndarray]:
    """(kind, item array) of an event frame; one numpy call, no copy."""
    kind_found, _, items = _decode(frame, kind)
    if kind_found not in EVENT_KINDS:
        raise FrameError(f"{kind_found.name} is not an event frame")
    return kind_found, items


def decode_control(frame):
    """The document of a CONTROL frame."""
    if kind_of(frame) != Kind.CONTROL:
        raise FrameError(f"expected a CONTROL frame, got {kind_of(frame).name}")
    try:
        return orjson.loads(bytes(frame[_HEADER_SIZE:]))
    except orjson.JSONDecodeError as exc:
        raise FrameError(f"bad CONTROL payload: {exc}") from exc


def decode_event_frames(frames, kind: Kind) -> np.ndarray:
    """Concatenate the items of many event frames of one kind into one array (one copy)."""
    arrays = [decode_events(frame, kind)[1] for frame in frames]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=LAYOUTS[Kind(kind)][1])


# -- struct codec (small frames) ------------------------------------------------------------

_STRUCT_CODES = {"u1": "B", "i1": "b", "u2": "H", "i2": "h", "u4": "I", "i4": "i", "u8": "Q", "i8": "q"}


def _struct_of(dtype: np.dtype) -> struct.Struct:
    """The exact byte layout of an aligned structured dtype (padding as pad bytes)."""
    fmt, pos = "<", 0
    for name in dtype.names or ():
        sub, offset = dtype.fields[name][:2]
        fmt += "x" * (offset - pos) + _STRUCT_CODES[sub.str[1:]]
        pos = offset + sub.itemsize
    return struct.Struct(fmt + "x" * (dtype.itemsize - pos))


_HEADER_STRUCT = _struct_of(FRAME_HEADER)
_STRUCTS: dict[Kind, tuple[struct.Struct, struct.Struct]] = {
    kind: (_struct_of(body), _struct_of(item)) for kind, (body, item) in LAYOUTS.items()
}


def encode_rows(kind: Kind, body: tuple | None, rows) -> bytes:
    """A frame from Python values: `body` (None for event kinds) and item tuples in dtype field order."""
    body_struct, item_struct = _STRUCTS[kind]
    count = len(rows)
    if not 0 <= count <= MAX_ITEMS:
        raise FrameError(f"{Kind(kind).name}: {count} items, at most {MAX_ITEMS} per frame")
    try:
        parts = [_HEADER_STRUCT.pack(kind, LAYOUT_VERSION, count, 0)]
        if body_struct.size:
            parts.append(body_struct.pack(*body))
        pack = item_struct.pack
        parts.extend(pack(*row) for row in rows)
    except (struct.error, TypeError) as exc:
        raise FrameError(f"{Kind(kind).name}: bad values: {exc}") from exc
    return b"".join(parts)


def decode_rows(frame, kind: Kind | None = None) -> tuple[Kind, tuple | None, list[tuple]]:
    """(kind, body tuple or None, item tuples) of a non-CONTROL frame; same checks as _decode."""
    found = kind_of(frame)
    if kind is not None and found != kind:
        raise FrameError(f"expected a {Kind(kind).name} frame, got {found.name}")
    if found == Kind.CONTROL:
        raise FrameError("CONTROL frames are decoded with decode_control")
    _, version, count, _ = _HEADER_STRUCT.unpack_from(frame, 0)
    if version != LAYOUT_VERSION:
        raise FrameError(f"{found.name} frame of layout version {version}, expected {LAYOUT_VERSION}")
    body_struct, item_struct = _STRUCTS[found]
    start = _HEADER_SIZE + body_struct.size
    if len(frame) != start + count * item_struct.size:
        raise FrameError(f"{found.name} frame with {count} items must be {start + count * item_struct.size} bytes")
    body = body_struct.unpack_from(frame, _HEADER_SIZE) if body_struct.size else None
    return found, body, list(item_struct.iter_unpack(frame[start:])) if count else []
