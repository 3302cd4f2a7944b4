"""Every record of many v2 record batches at once, as numpy arrays over one byte arena: where each record
starts and ends and where its fields lie (offset and timestamp deltas, key, value, headers). The node's log
cleaner reads keys and offsets through it, and the Spark connector turns the same arrays into Arrow columns.

A batch's record area (decompressed when the batch is) is a run of records, each a varint length and then
varint fields: attributes, timestamp delta, offset delta, key length and key, value length and value, header
count and headers (each a key length and key, a value length and value).

Algorithm (`record_fields`):
1. Find where each record starts. Records are back to back, each length says where the next one begins, so
   this is sequential; two ways: `Runs` guesses runs of same-size records (what producers of same-size values
   send; the offset delta's varint grows a byte at records 64 and 8192) and checks every guess of a round at
   once; areas whose runs stay short go to a Python loop that reads the length varints (`scan_starts`).
2. Decode every field of every record at once: a varint decoder over an array of positions (one numpy pass per
   varint byte, `varints`), then the next field's positions from the previous one's; every position must stay
   inside its record, and with headers decoded the last must land exactly on its record's end, so a malformed
   record cannot reach outside its record.

Invariants: malformed records raise CorruptRecords (a ValueError) and nothing else; the arena must have at
least MAX_VARINT zero bytes after its last area (ARENA_PADDING), so a varint read at a record's last byte
stays inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kio.serial.readers import read_signed_varint

# Zero bytes after the arena, so a varint read at a record's last byte never leaves the buffer.
ARENA_PADDING = bytes(16)
MAX_VARINT = 5
MAX_VARLONG = 10
# The smallest record: length, attributes, timestamp delta, offset delta, key length, value length and
# header count, one byte each.
MIN_RECORD_BYTES = 7


class CorruptRecords(ValueError):
    """Record bytes that are not valid v2 records."""


@dataclass
class RecordFields:
    """Per record (in record order): where it starts and ends in the arena, and its fields. Key and value
    lengths are -1 for null. `header_fields` (owner record, key start, key length, value start, value length,
    in record then header order) only when headers were decoded and some record has any."""

    starts: np.ndarray
    ends: np.ndarray
    batch_of: np.ndarray  # the index of each record's area
    timestamp_deltas: np.ndarray
    offset_deltas: np.ndarray
    key_starts: np.ndarray
    key_lengths: np.ndarray
    value_starts: np.ndarray
    value_lengths: np.ndarray
    header_counts: np.ndarray
    header_fields: tuple[np.ndarray, ...] | None


def unaligned(arena: np.ndarray, dtype: str) -> np.ndarray:
    """`dtype` integers (little-endian) starting at every byte of the arena: a strided view, no copy."""
    size = np.dtype(dtype).itemsize
    return np.ndarray(shape=(len(arena) - size + 1,), dtype=dtype, buffer=arena, strides=(1,))


def varints(arena: np.ndarray, positions: np.ndarray, max_width: int,
             strict: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints starting at each position: (values, widths in bytes), as integer arrays (int32 when
    every varint has one or two bytes, int64 otherwise). Both bytes of the one- and two-byte varints
    (nearly all of them) come from one 16-bit gather; later bytes are gathered only for the varints still
    going. One longer than `max_width` raises CorruptRecords, or with strict=False (guessed positions)
    gets width 0."""
    pair = unaligned(arena, "<u2")[positions].astype(np.int32)  # first byte | second byte << 8
    more = (pair >> 7) & 1
    going = np.nonzero((pair & 0x8080) == 0x8080)[0]
    raw = (pair & 0x7F) | ((pair >> 1) & 0x3F80) * more
    width = more + 1
    if len(going):
        raw = raw.astype(np.int64)
        width = width.astype(np.int64)
        shift = 14
        while len(going):
            if shift >= 7 * max_width:
                if strict:
                    raise CorruptRecords(f"a varint longer than {max_width} bytes")
                width[going] = 0
                break
            byte = arena[positions[going] + width[going]]
            raw[going] |= (byte & 0x7F).astype(np.int64) << shift
            width[going] += 1
            going = going[byte >= 0x80]
            shift += 7
        unsigned = raw.view(np.uint64) >> np.uint64(1)
        return unsigned.view(np.int64) ^ -(raw & 1), width
    return (raw >> 1) ^ -(raw & 1), width


def scan_starts(data: bytes, start: int, end: int, count: int) -> list[int]:
    """Record starts of one batch area by reading each record's length (the sequential fallback)."""
    starts = []
    pos = start
    for _ in range(count):
        if pos >= end:
            raise CorruptRecords("a batch holds fewer records than its header says")
        starts.append(pos)
        first = data[pos]
        if first < 0x80:  # one-byte length: records under 64 bytes
            raw, pos = first, pos + 1
        elif data[pos + 1] < 0x80:  # two bytes: up to 8 KiB
            raw, pos = (first & 0x7F) | (data[pos + 1] << 7), pos + 2
        else:
            length, width = read_signed_varint(data, pos)
            raw, pos = length << 1, pos + width
        length = (raw >> 1) ^ -(raw & 1)
        if length < 0:
            raise CorruptRecords(f"record length {length}")
        pos += length
    if pos != end:
        raise CorruptRecords(f"records end {end - pos} bytes away from their batch's end")
    return starts


def offset_delta_extra(index: np.ndarray) -> np.ndarray:
    """Bytes that the offset-delta varints of records 0..index-1 of a batch take beyond one byte each,
    when record j's offset delta is j (as producers write them): zigzag(j) needs a second byte from
    j = 64, a third from 8192, and so on."""
    largest = int(index.max()) if len(index) else 0
    return sum((np.maximum(0, index - first) for first in (64, 8192, 1 << 20, 1 << 27) if first < largest),
               np.zeros_like(index))


class Runs:
    """Record starts of many batch areas at once, by runs of predictable records (see the module's algorithm).

    Records of a batch mostly have one size, give or take the offset delta's varint (record j's delta is
    j, so it grows a byte at j = 64 and 8192). Each round, every unfinished area guesses where its next
    records start, assuming each has the size of the one at its current position adjusted for its
    offset delta's width; it decodes the length at every guessed start at once and keeps the guesses up
    to its first mismatch. A guess is a true start exactly when every record before it had its guessed
    size, so nothing past the first mismatch is trusted. An area whose runs stay short (sizes that vary
    from record to record) is left to the scalar loop.
    """

    MIN_RUN = 8  # a shorter run hands the rest of its area to _scan_starts
    MAX_ROUNDS = 8

    def __init__(self, arena: np.ndarray, area_starts: Sequence[int], area_ends: Sequence[int],
                 counts: Sequence[int]) -> None:
        self.arena = arena
        self.position = np.array(area_starts, dtype=np.int64)
        self.end = np.array(area_ends, dtype=np.int64)
        self.remaining = np.array(counts, dtype=np.int64)
        self.done = np.zeros(len(counts), dtype=np.int64)  # records of the area found so far
        self.scalar = np.zeros(len(counts), dtype=bool)
        self.found: list[np.ndarray] = []

    def run(self) -> None:
        limit = len(self.arena) - MAX_VARINT
        for _ in range(self.MAX_ROUNDS):
            active = np.nonzero((self.remaining > 0) & ~self.scalar)[0]
            if not len(active):
                return
            position = self.position[active]
            lengths, widths = varints(self.arena, position, MAX_VARINT)
            sizes = lengths + widths
            first_index = self.done[active]
            base_extra = offset_delta_extra(first_index)
            first_width = 1 + offset_delta_extra(first_index + 1) - base_extra
            guesses = self.remaining[active]
            first_guess = np.cumsum(guesses) - guesses
            owner = np.repeat(np.arange(len(active)), guesses)
            step = np.arange(int(guesses.sum()), dtype=np.int64) - first_guess[owner]
            index = first_index[owner] + step
            extra = offset_delta_extra(index)
            expected = sizes[owner] + (1 + offset_delta_extra(index + 1) - extra) - first_width[owner]
            stride = sizes - first_width + 1
            at = position[owner] + step * stride[owner] + extra - base_extra[owner]
            # Corrupt bytes can make a guessed size zero or negative: guesses then run backwards, out of the area.
            got_length, got_width = varints(self.arena, np.clip(at, 0, limit), MAX_VARINT, strict=False)
            bad = ((at + expected > self.end[active][owner]) | (got_length + got_width != expected)
                   | (got_length < 0) | (got_width == 0) | ((step > 0) & (stride[owner] <= 0)))
            runs = guesses.copy()
            bad_owners, first_bad = np.unique(owner[bad], return_index=True)
            runs[bad_owners] = step[bad][first_bad]
            self.found.append(at[step < runs[owner]])
            after = first_index + runs
            self.position[active] = (position + runs * (sizes - first_width + 1)
                                     + offset_delta_extra(after) - base_extra)
            self.done[active] = after
            self.remaining[active] -= runs
            self.scalar[active] |= (runs < self.MIN_RUN) & (self.remaining[active] > 0)
        self.scalar |= self.remaining > 0


def record_starts(arena: np.ndarray, data: bytes | memoryview, area_starts: Sequence[int], area_ends: Sequence[int],
                  counts: Sequence[int]) -> np.ndarray:
    """Where every record of the areas starts in the arena, in record order."""
    runs = Runs(arena, area_starts, area_ends, counts)
    runs.run()
    pieces = list(runs.found)
    for area in np.nonzero(runs.scalar)[0]:
        pieces.append(np.array(scan_starts(data, int(runs.position[area]), area_ends[area],
                                           int(runs.remaining[area])), dtype=np.int64))
    if not pieces:
        return np.zeros(0, dtype=np.int64)
    # Pieces come round by round; arena positions are in record order, so sorting restores it.
    return np.sort(np.concatenate(pieces), kind="stable") if len(pieces) > 1 else pieces[0]


def record_fields(arena: np.ndarray, data: bytes | memoryview, area_starts: Sequence[int],
                  area_ends: Sequence[int], counts: Sequence[int], headers: bool = True) -> RecordFields:
    """Every record of the areas [area_starts[i], area_ends[i]) of the arena, counts[i] records each. With
    `headers` False the headers are left undecoded (and a record's fields are not checked to end exactly at
    its end)."""
    starts = record_starts(arena, data, area_starts, area_ends, counts)
    counts = np.asarray(counts, dtype=np.int64)
    area_ends = np.asarray(area_ends, dtype=np.int64)
    lengths, widths = varints(arena, starts, MAX_VARINT)
    if (lengths < 0).any():
        raise CorruptRecords("a negative record length")
    record_ends = starts + widths + lengths
    # Each record ends where the next one starts, and an area's last one at its area's end.
    following = np.empty_like(starts)
    following[:-1] = starts[1:]
    following[np.cumsum(counts) - 1] = area_ends
    if not np.array_equal(record_ends, following):
        raise CorruptRecords("record lengths do not tile their batch")
    # Field by field; after each, every position must still be inside its record, so the next varint
    # read stays inside the arena (its padding covers a varint starting at a record's last byte).
    position = starts + widths + 1  # past the record attributes
    timestamp_deltas, width = varints(arena, inside(position, record_ends), MAX_VARLONG)
    position = position + width
    offset_deltas, width = varints(arena, inside(position, record_ends), MAX_VARINT)
    position = position + width
    key_lengths, width = varints(arena, inside(position, record_ends), MAX_VARINT)
    key_starts = position + width
    position = key_starts + np.maximum(key_lengths, 0)
    value_lengths, width = varints(arena, inside(position, record_ends), MAX_VARINT)
    value_starts = position + width
    position = value_starts + np.maximum(value_lengths, 0)
    header_counts, width = varints(arena, inside(position, record_ends), MAX_VARINT)
    position = inside(position + width, record_ends, allow_end=True)
    if (key_lengths < -1).any() or (value_lengths < -1).any() or (header_counts < 0).any():
        raise CorruptRecords("a negative key, value or header count")
    header_fields = None
    if headers:
        if header_counts.any():
            position, header_fields = decode_headers(arena, position, header_counts, record_ends)
        if not np.array_equal(position, record_ends):
            raise CorruptRecords("record fields do not end at their record's end")
    return RecordFields(starts, record_ends, np.repeat(np.arange(len(counts)), counts), timestamp_deltas,
                        offset_deltas, key_starts, key_lengths, value_starts, value_lengths, header_counts,
                        header_fields)


def inside(position: np.ndarray, record_ends: np.ndarray, allow_end: bool = False) -> np.ndarray:
    """`position`, after checking each is before its record's end (or at it, with allow_end)."""
    if (position > record_ends).any() or not allow_end and (position == record_ends).any():
        raise CorruptRecords("record fields run past their record")
    return position


def decode_headers(arena: np.ndarray, position: np.ndarray, header_counts: np.ndarray,
                    record_ends: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Every header of every record, in record order then header order: (owner record, key start,
    key length, value start, value length) arrays; and each record's position after its headers."""
    position = position.copy()
    owners, key_starts, key_lengths, value_starts, value_lengths, order = [], [], [], [], [], []
    for index in range(int(header_counts.max())):
        has = np.nonzero(header_counts > index)[0]
        at = position[has]
        if (at >= record_ends[has]).any():
            raise CorruptRecords("headers run past their record")
        key_length, width = varints(arena, at, MAX_VARINT)
        if (key_length < 0).any():
            raise CorruptRecords("a header without a key")
        key_start = at + width
        at = key_start + key_length
        if (at >= record_ends[has]).any():
            raise CorruptRecords("headers run past their record")
        value_length, width = varints(arena, at, MAX_VARINT)
        if (value_length < -1).any():
            raise CorruptRecords("a negative header value length")
        value_start = at + width
        at = value_start + np.maximum(value_length, 0)
        if (at > record_ends[has]).any():
            raise CorruptRecords("headers run past their record")
        position[has] = at
        owners.append(has)
        key_starts.append(key_start)
        key_lengths.append(key_length)
        value_starts.append(value_start)
        value_lengths.append(value_length)
        order.append(np.full(len(has), index))
    owner = np.concatenate(owners)
    sort = np.lexsort((np.concatenate(order), owner))
    fields = (owner[sort], np.concatenate(key_starts)[sort], np.concatenate(key_lengths)[sort],
              np.concatenate(value_starts)[sort], np.concatenate(value_lengths)[sort])
    return position, fields


def select_headers(fields: tuple[np.ndarray, ...], keep: np.ndarray) -> tuple[np.ndarray, ...]:
    mask = keep[fields[0]]
    return tuple(f[mask] for f in fields)
