"""A named POSIX shared-memory segment, mapped whole, whose first 64 bytes say what it holds: the layout's magic
and version, then the sizes it was created with (int64 words, in the layout's order). The node's shared tables
(shm.table, shm.heartbeat, shm.connections, shm.stats, shm.interest) each declare a `Layout` and map their own
rows after the header.

Invariants:
- `create` is exclusive (posix_ipc.ExistentialError if the name exists), mode 0600; the segment is zero-filled
  and its header is written before the creator hands the name to anyone (the supervisor creates every segment
  before it starts the children).
- `attach` maps the whole segment and accepts it only if magic and version are the layout's, every size the
  layout fixes has its value, and the segment holds the bytes its sizes need; otherwise ValueError, with the
  mapping closed. A missing name raises posix_ipc.ExistentialError.
- `unlink_segment` of a name that does not exist does nothing; mappings stay valid until closed.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from typing import Callable, Mapping

import posix_ipc

HEADER_BYTES = 64
_WORD = struct.Struct("<q")
_MAX_SIZES = HEADER_BYTES // _WORD.size - 2  # after magic and version


@dataclass(frozen=True)
class Layout:
    """What a kind of segment is: its magic and version, the names of its header's sizes, and its bytes for them."""

    what: str  # for errors: "a partition table"
    magic: int
    version: int
    sizes: tuple[str, ...]
    bytes_for: Callable[..., int]  # the segment's bytes, called with the sizes by name
    fixed: Mapping[str, int] = field(default_factory=dict)  # sizes this build's layout requires (a row's bytes)

    def __post_init__(self) -> None:
        if len(self.sizes) > _MAX_SIZES or not set(self.fixed) <= set(self.sizes):
            raise ValueError(f"layout of {self.what}: at most {_MAX_SIZES} sizes, the fixed ones among them")


class Segment:
    """One mapping of a segment: `memory` is the whole mmap (header included), `sizes` its header's sizes by name."""

    def __init__(self, name: str, memory: mmap.mmap, sizes: dict[str, int]) -> None:
        self.name = name
        self.memory = memory
        self.sizes = sizes

    @classmethod
    def create(cls, name: str, layout: Layout, **sizes: int) -> "Segment":
        sizes = {**layout.fixed, **sizes}
        if set(sizes) != set(layout.sizes):
            raise TypeError(f"{layout.what} is created with sizes {layout.sizes}, got {tuple(sizes)}")
        size = layout.bytes_for(**sizes)
        shared = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        try:
            memory = mmap.mmap(shared.fd, size)
        finally:
            shared.close_fd()
        for position, value in enumerate((layout.magic, layout.version, *(sizes[n] for n in layout.sizes))):
            _WORD.pack_into(memory, position * _WORD.size, value)
        return cls(name, memory, sizes)

    @classmethod
    def attach(cls, name: str, layout: Layout, writable: bool = True) -> "Segment":
        shared = posix_ipc.SharedMemory(name, posix_ipc.O_RDWR if writable else 0)
        try:
            if shared.size < HEADER_BYTES:
                raise ValueError(f"{name} is not {layout.what} of this version")
            memory = mmap.mmap(shared.fd, shared.size, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        finally:
            shared.close_fd()
        words = [_WORD.unpack_from(memory, position * _WORD.size)[0] for position in range(2 + len(layout.sizes))]
        sizes = dict(zip(layout.sizes, words[2:]))
        if (words[:2] != [layout.magic, layout.version] or any(sizes[n] != v for n, v in layout.fixed.items())
                or min(sizes.values(), default=0) < 0 or layout.bytes_for(**sizes) > len(memory)):
            memory.close()
            raise ValueError(f"{name} is not {layout.what} of this version")
        return cls(name, memory, sizes)

    def close(self) -> None:
        try:
            self.memory.close()
        except BufferError:
            pass  # a view its user handed out still references the mapping; it goes with the process

    def unlink(self) -> None:
        unlink_segment(self.name)


def unlink_name(unlink: Callable[[str], None], name: str) -> bool:
    """Remove the POSIX IPC object `name` with posix_ipc's `unlink` of its kind (shared memory, semaphore); False if
    it did not exist."""
    try:
        unlink(name)
        return True
    except posix_ipc.ExistentialError:
        return False


def unlink_segment(name: str) -> bool:
    """Remove the segment `name`; False if it did not exist."""
    return unlink_name(posix_ipc.unlink_shared_memory, name)
