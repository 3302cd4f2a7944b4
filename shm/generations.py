"""Change counters every process of a node maps: one int64 word per kind of node-wide state a worker caches
(the ACLs), raised by whoever changes that state, so the others see the change without a ring round trip.

Invariants:
- A counter only grows. Its writers are serialised by the lock of the state it counts (the ACL file's fcntl lock):
  a read, +1 and one aligned 8-byte store, which readers see whole (x86-64), old or new, never torn.
- A reader compares the counter with the value it loaded its copy at: equal means its copy is current as of the
  counter's store, which the writer makes after the new state is durable. A restarted node starts from 0 and every
  process loads the state at start, so a counter's absolute value means nothing.
- The words follow the 64-byte header (shm.segment: magic, version, counters).
"""

from __future__ import annotations

import numpy as np

from shmbroker.shm.segment import HEADER_BYTES, Layout, Segment, unlink_segment

ACLS = 0  # the authorizer's ACLs (node.storage.acls)
COUNTERS = 8  # room for more kinds without a new layout
WORD_BYTES = 8
LAYOUT = Layout("a change-counters segment", magic=0x534E_4547_4E41_4843, version=1,  # "CHANGENS" little-endian
                sizes=("counters",), bytes_for=lambda counters: HEADER_BYTES + counters * WORD_BYTES,
                fixed={"counters": COUNTERS})


class ChangeCounters:
    def __init__(self, segment: Segment) -> None:
        self.name = segment.name
        self._segment = segment
        self.words = np.frombuffer(segment.memory, dtype=np.int64, count=COUNTERS, offset=HEADER_BYTES)
        # The same words as a memoryview: a read per request costs a third of numpy's item access (measured).
        self.view = memoryview(segment.memory)[HEADER_BYTES:HEADER_BYTES + COUNTERS * WORD_BYTES].cast("q")

    @classmethod
    def create(cls, name: str) -> "ChangeCounters":
        return cls(Segment.create(name, LAYOUT, counters=COUNTERS))

    @classmethod
    def attach(cls, name: str) -> "ChangeCounters":
        return cls(Segment.attach(name, LAYOUT))

    def value(self, counter: int) -> int:
        return self.view[counter]

    def bump(self, counter: int) -> int:
        """Raise the counter by one (the caller holds the lock of the state it counts); its new value."""
        value = int(self.words[counter]) + 1
        self.words[counter] = value
        return value

    def close(self) -> None:
        self.words = None
        self.view.release()
        self._segment.close()

    @staticmethod
    def unlink_name(name: str) -> None:
        unlink_segment(name)
