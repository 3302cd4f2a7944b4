"""Heartbeats of the node's children: one row of counters per child in a shared segment, and the check of
which children stopped turning their loops.

Every child process (the timer, each network worker) owns one row, its *slot*, chosen by the supervisor.
The child adds one to its row's `beats` on every turn of its loop; whoever watches (the supervisor, which
replaces a hung child; the systemd watchdog and the stats of the operations work) reads the rows without
locks and compares them with what it read before.

Layout: a 64-byte header (shm.segment: magic, version, slots, row bytes), then one 64-byte row (a cache line)
per slot:

    word 0   beats    loop turns of the child since its start (written by the child only)
    word 1   pid      the child's pid (written by the supervisor at spawn, then by the child when it starts)
    words 2-7         reserved for more per-child counters

Invariants:
- Each word has one writer at a time: the supervisor writes a row only while no child owns it (before
  spawning the child, after reaping the previous one); the child then writes `beats` (and `pid`) alone.
  Words are aligned u64: a load or store is one instruction, so a reader sees an old or a new value,
  never a torn one (x86-64; see shm/ring.py for the memory-ordering assumptions).
- A child's loop turns at least every heartbeat interval while it is healthy: its sleep is capped there
  (a child idle for hours still beats). So `beats` that did not move for a hang timeout well above that
  interval mean the loop is stuck (SIGSTOP, a deadlock, a handler that never returns). `HangWatch` is
  that check; before a child's first beat (it is still booting) it allows the longer start timeout.
  `BeatWatch` is what every such reader keeps: when each slot's beats last moved.
- The segment is named by the caller under the node instance (shm.instance.heartbeat_name), whose
  shutdown unlinks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from shmbroker.shm.segment import HEADER_BYTES, Layout, Segment

ROW_WORDS = 8
ROW_BYTES = ROW_WORDS * 8
LAYOUT = Layout("a heartbeat table", magic=0x5441_4542_5452_4148, version=1,  # "HRTBEAT" little-endian
                sizes=("slots", "row_bytes"), fixed={"row_bytes": ROW_BYTES},
                bytes_for=lambda slots, row_bytes: HEADER_BYTES + slots * row_bytes)
BEATS = 0
PID = 1
TIMER_SLOT = 0  # the timer's row; worker i's is worker_slot(i), then the cleaners' (cleaner_slot)


def worker_slot(index: int) -> int:
    return TIMER_SLOT + 1 + index


def cleaner_slot(workers: int, index: int) -> int:
    return TIMER_SLOT + 1 + workers + index


class HeartbeatTable:
    """A mapping of the heartbeat segment. `create` in the supervisor, `attach` everywhere else."""

    def __init__(self, segment: Segment) -> None:
        self.name = segment.name
        self.slots = segment.sizes["slots"]
        self._segment = segment
        self._words = memoryview(segment.memory)[HEADER_BYTES:HEADER_BYTES + self.slots * ROW_BYTES].cast("Q")

    @classmethod
    def create(cls, name: str, slots: int) -> "HeartbeatTable":
        if slots <= 0:
            raise ValueError("a heartbeat table needs at least one slot")
        return cls(Segment.create(name, LAYOUT, slots=slots))

    @classmethod
    def attach(cls, name: str) -> "HeartbeatTable":
        return cls(Segment.attach(name, LAYOUT))

    def _word(self, slot: int, word: int) -> int:
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} outside heartbeat table of {self.slots}")
        return slot * ROW_WORDS + word

    # -- the owner of a row ----------------------------------------------------------------------

    def heartbeat(self, slot: int, pid: int) -> "Heartbeat":
        """The child's handle on its own row (records its pid)."""
        self._words[self._word(slot, PID)] = pid
        return Heartbeat(self._words, self._word(slot, BEATS))

    # -- the supervisor and other readers --------------------------------------------------------

    def claim(self, slot: int, pid: int = 0) -> None:
        """Supervisor, while no child owns the slot: a new child (or none) starts from zero beats."""
        self._words[self._word(slot, BEATS)] = 0
        self._words[self._word(slot, PID)] = pid

    def beats(self, slot: int) -> int:
        return self._words[self._word(slot, BEATS)]

    def pid(self, slot: int) -> int:
        return self._words[self._word(slot, PID)]

    def rows(self) -> list[tuple[int, int]]:
        """(pid, beats) of every slot."""
        words = self._words
        return [(words[slot * ROW_WORDS + PID], words[slot * ROW_WORDS + BEATS]) for slot in range(self.slots)]

    def close(self) -> None:
        self._words.release()
        self._segment.close()


class Heartbeat:
    """One child's row: `beat()` once per loop turn (one aligned 8-byte store)."""

    __slots__ = ("_words", "_index")

    def __init__(self, words: memoryview, index: int) -> None:
        self._words = words
        self._index = index

    def beat(self) -> None:
        self._words[self._index] += 1

    @property
    def beats(self) -> int:
        return self._words[self._index]


@dataclass(frozen=True)
class Stall:
    slot: int
    pid: int
    beats: int
    silent_ms: int  # since the beats last moved (or since the child was started, if it never beat)
    booting: bool  # True: it never beat (stuck before its loop started)


class BeatWatch:
    """When each slot's beats last moved, as one reader saw them: the one idea of every liveness check here.
    Times are the reader's monotonic seconds (no clock is shared)."""

    def __init__(self, table: HeartbeatTable) -> None:
        self.table = table
        self._seen: dict[int, tuple[int, float]] = {}  # slot -> (beats, when they last moved)

    def look(self, slot: int, now: float) -> tuple[int, float]:
        """(the slot's beats, seconds since they last moved); a slot not looked at before moved just now."""
        beats = self.table.beats(slot)
        seen, since = self._seen.get(slot, (None, now))
        if beats != seen:
            self._seen[slot] = (beats, now)
            return beats, 0.0
        return beats, now - since

    def reset(self, slot: int, now: float) -> None:
        """No beats yet, as of `now` (a child just started on the slot)."""
        self._seen[slot] = (0, now)

    def forget(self, slot: int) -> None:
        self._seen.pop(slot, None)

    def slots(self) -> list[int]:
        return list(self._seen)


class HangWatch:
    """Which watched slots' beats stopped moving: silent for `hang_timeout_ms` after a first beat, or for
    `start_timeout_ms` before one."""

    def __init__(self, table: HeartbeatTable, hang_timeout_ms: int, start_timeout_ms: int) -> None:
        self.table = table
        self.hang_timeout_ms = hang_timeout_ms
        self.start_timeout_ms = start_timeout_ms
        self._watch = BeatWatch(table)

    def started(self, slot: int, now: float) -> None:
        """A child was started on `slot` (after `table.claim`): watch it from now."""
        self._watch.reset(slot, now)

    def forget(self, slot: int) -> None:
        self._watch.forget(slot)

    def stuck(self, now: float) -> list[Stall]:
        stalls = []
        for slot in self._watch.slots():
            beats, silent_s = self._watch.look(slot, now)
            silent_ms = int(silent_s * 1000)
            limit = self.hang_timeout_ms if beats else self.start_timeout_ms
            if silent_ms >= limit:
                stalls.append(Stall(slot, self.table.pid(slot), beats, silent_ms, beats == 0))
        return stalls
