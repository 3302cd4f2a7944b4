"""Hierarchical timing wheel on numpy arrays, driven by a heap of buckets (Kafka's TimingWheel, KAFKA-1430).

Time is integer milliseconds from a monotonic clock chosen by the owner (time.monotonic_ns() // 1_000_000);
the wheel never reads a clock itself, so a wall-clock jump can neither fire nor stall timers (KAFKA-4051).
``advance(now)`` with a ``now`` older than the wheel's clock is a no-op for the clock (it never runs backwards).

Shape (u = tick_ms, n = wheel_size, p_L = n**L ticks per bucket at level L):
  * A deadline d (ms) maps to its fire tick t = max(ceil(d / u), current tick). Level 0 buckets hold one tick
    each; level L buckets hold p_L ticks. An entry lives at the lowest level L whose window still covers it:
    t // p_L < current_tick // p_L + n. Levels above 0 exist only once an entry needs them (on demand).
  * A bucket's expiration is (t // p_L) * p_L ticks. When a bucket of level L >= 1 expires its live entries
    are re-placed in finer levels (or fire if already due); only level 0 fires.
  * The clock is a heapq of (bucket expiration tick, bucket id), one entry per bucket holding references, so
    at most levels * n entries. The owner sleeps until ``next_expiration()``; nothing is polled per tick.
  * Entry storage is two numpy arrays indexed by slot: the deadline, and ``live`` (the entry's handle while it
    is live, a negative value otherwise). A slot is reused through a free list (a numpy stack); arrays grow by
    doubling. Each bucket holds a numpy array of slot references (its member list) that grows by doubling.
  * A handle is (epoch << 32) | slot, where the epoch counts add() calls modulo 2**31.
    A handle is live iff live[slot] == handle, so a handle of a fired or cancelled entry never aliases a later
    entry of its slot until 2**31 allocating calls later. One comparison tells liveness, and ending an entry
    is one store: no generation to bump, no per-entry bucket id to keep.

Invariants (hold after every public call):
  I1  Never early: an entry fires at the first advance(now) with now >= ceil(d / u) * u, which is >= d.
  I2  Never more than one tick late: after advance(now) every entry with ceil(d / u) * u <= now has fired,
      so for integer deadlines an unfired entry has d > now - u (with u = 1 ms: d > now exactly).
  I3  ``pending`` is exact: live entries only; cancelled and fired entries never count.
  I4  Every allocated slot is referenced exactly once by a bucket's member array. Cancel is lazy: it makes
      live[slot] negative (O(1)) and leaves the reference; the slot is reclaimed when its bucket is drained or
      by compaction. Compaction runs when cancelled-unreclaimed > pending + compaction_slack, hence
      slots_in_use = pending + cancelled_unreclaimed <= 2 * pending + compaction_slack.
  I5  Every bucket with references has exactly one heap entry; a bucket is only re-armed with a new
      expiration after it was drained (windows of distinct buckets at one level never share a slot).
  I6  Unknown handles never match: cancel() accepts a handle only if its slot has been handed out and live[slot]
      equals it; live[] is negative except at live entries, and handles are never negative.

Costs: add is O(1) amortised per level it passes through (an entry moves down at most once per level);
cancel is O(1) amortised: compaction costs O(pending + cancelled + buckets) and is paid for by the
> pending + compaction_slack cancels since the previous one. advance costs a handful of numpy calls plus a
Python step per distinct bucket it drains, never a Python step per entry: a bucket's entries fire or cascade
as one array. (The purgatory adds and cancels one entry at a time: batch add/cancel calls measured faster only
from 4-8 entries per batch; add_many() serves the runs of long polls that node.timer.fetch_waits takes.)
"""

from __future__ import annotations

import heapq

import numpy as np

from shmbroker.node.config import WheelConfig

SLOT_BITS = 32
SLOT_MASK = (1 << SLOT_BITS) - 1
EPOCH_MASK = (1 << (63 - SLOT_BITS)) - 1  # the epoch wraps to 0 instead of turning a handle negative
MAX_CAPACITY = 1 << 31  # slots fit the handle's slot bits with room to spare
NOT_LIVE = -1  # live[] of a free, fired or cancelled slot
# Bucket spans (ticks) stay below this, so every product and quotient fits int64.
SPAN_LIMIT = 1 << 62
MAX_WHEEL_SIZE = 1 << 16  # buckets per level; bounds the per-bucket bookkeeping

# Direct ufunc reductions: the ndarray.min/max/all methods add a Python-level wrapper call each, which
# matters when batches are a few hundred entries (measured ~1 us per call).
_min = np.minimum.reduce
_max = np.maximum.reduce
try:  # np.count_nonzero is a Python wrapper around this C function (~0.2 us per call, several per step)
    from numpy._core.multiarray import count_nonzero as _count
except ImportError:  # a numpy that moved it
    _count = np.count_nonzero
_EMPTY = np.empty(0, np.int64)
_EMPTY.flags.writeable = False  # shared "nothing" result
NOT_ARMED = None  # expirations can be any int, including negative ones


def doubled(capacity: int, needed: int) -> int:
    """capacity doubled as often as needed: a big batch leaves headroom instead of a full array."""
    capacity = max(capacity, 1)
    while capacity < needed:
        capacity *= 2
    return capacity


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


class TimingWheel:
    """A hierarchical timing wheel; see the module docstring for its invariants and costs."""

    def __init__(
        self,
        tick_ms: int = WheelConfig.tick_ms,
        wheel_size: int = WheelConfig.wheel_size,
        start_ms: int = 0,
        *,
        initial_capacity: int = WheelConfig.initial_capacity,
        bucket_initial_capacity: int = WheelConfig.bucket_initial_capacity,
        compaction_slack: int = WheelConfig.compaction_slack,
    ) -> None:
        self.tick_ms = _check_int("tick_ms", tick_ms, 1)
        self.wheel_size = _check_int("wheel_size", wheel_size, 2)
        if self.wheel_size > MAX_WHEEL_SIZE:
            raise ValueError(f"wheel_size must be <= {MAX_WHEEL_SIZE}, got {self.wheel_size}")
        capacity = _check_int("initial_capacity", initial_capacity, 1)
        if capacity > MAX_CAPACITY:
            raise ValueError(f"initial_capacity must be < {MAX_CAPACITY}, got {initial_capacity}")
        self._bucket_initial_capacity = _check_int("bucket_initial_capacity", bucket_initial_capacity, 1)
        self.compaction_slack = _check_int("compaction_slack", compaction_slack, 0)

        # Ticks per bucket at each level. Times are limited to +-limit_ms so that the top level's span is at
        # least twice the whole tick range: every tick then fits the top level's window (on-demand levels never
        # run out), and all tick arithmetic fits int64 (n=20, u=1: about 25 million years).
        spans = [1]
        while spans[-1] * self.wheel_size <= SPAN_LIMIT:
            spans.append(spans[-1] * self.wheel_size)
        self._spans = spans
        self._max_levels = len(spans)
        self.limit_ms = (spans[-1] // 2) * self.tick_ms
        start_ms = self.check_time("start_ms", start_ms)
        bucket_count = self._max_levels * self.wheel_size

        self._tick = start_ms // self.tick_ms  # the wheel's clock, in ticks (floor)
        self._deadline = np.zeros(capacity, np.int64)
        self._live = np.full(capacity, NOT_LIVE, np.int64)
        self._epoch = 0  # of the last allocating call; handles carry it above the slot bits
        self._free = np.empty(capacity, np.int64)  # stack of reusable slots
        self._free_top = 0
        self._high = 0  # slots [0, high) have been handed out at least once

        self._sort_dtype = np.int16 if self.wheel_size <= np.iinfo(np.int16).max else np.int32
        self._bucket_sort_dtype = np.int16 if bucket_count <= np.iinfo(np.int16).max else np.int64
        self._members: list[np.ndarray | None] = [None] * bucket_count
        self._fill = [0] * bucket_count
        self._armed = [NOT_ARMED] * bucket_count  # expiration tick of the bucket's heap entry
        self._heap: list[tuple[int, int]] = []
        self._levels_used = 1

        self._pending = 0
        self._cancelled_unreclaimed = 0
        self.compactions = 0

    @classmethod
    def configured(cls, wheel: WheelConfig, start_ms: int) -> TimingWheel:
        """A wheel of the node's settings (NodeConfig.timer.wheel) starting at `start_ms`."""
        return cls(wheel.tick_ms, wheel.wheel_size, start_ms, initial_capacity=wheel.initial_capacity,
                   bucket_initial_capacity=wheel.bucket_initial_capacity, compaction_slack=wheel.compaction_slack)

    def check_time(self, name: str, value) -> int:
        """value as an int within +-limit_ms, or a clear TypeError / ValueError naming it."""
        if type(value) is int and -self.limit_ms <= value <= self.limit_ms:
            return value  # the hot path
        value = _check_int(name, value, -self.limit_ms)
        if value > self.limit_ms:
            raise ValueError(f"{name} must be <= {self.limit_ms}, got {value}")
        return value

    # ----------------------------------------------------------------- introspection
    @property
    def pending(self) -> int:
        """Exact number of live entries (added, neither fired nor cancelled)."""
        return self._pending

    @property
    def slots_in_use(self) -> int:
        """Allocated entry slots: pending plus cancelled ones not yet reclaimed (I4)."""
        return self._high - self._free_top

    @property
    def levels(self) -> int:
        """Number of wheel levels created so far (1 + overflow levels)."""
        return self._levels_used

    def entries_per_level(self) -> list[int]:
        """Live entries held at each level so far (index 0 the finest), for the stats: O(buckets holding
        references), so called once per stats interval, never per operation. Sums to `pending` (I3, I4)."""
        counts = [0] * self._levels_used
        live = self._live
        for bucket, fill in enumerate(self._fill):
            if fill:
                counts[bucket // self.wheel_size] += int(np.count_nonzero(live[self._members[bucket][:fill]] >= 0))
        return counts

    @property
    def current_ms(self) -> int:
        """The wheel's clock: the start of the current tick, in ms."""
        return self._tick * self.tick_ms

    @property
    def capacity(self) -> int:
        """Entry slots allocated (grows by doubling); slot numbers in handles are below this."""
        return len(self._deadline)

    @property
    def heap_size(self) -> int:
        return len(self._heap)

    # ----------------------------------------------------------------- slots
    def _grow(self, needed: int) -> None:
        """Room for slots [0, needed)."""
        capacity = len(self._deadline)
        if needed <= capacity:
            return
        new_capacity = doubled(capacity, needed)
        if new_capacity > MAX_CAPACITY:
            raise MemoryError(f"a timing wheel holds fewer than {MAX_CAPACITY} entries")
        deadline = np.zeros(new_capacity, np.int64)
        deadline[:capacity] = self._deadline
        live = np.full(new_capacity, NOT_LIVE, np.int64)
        live[:capacity] = self._live
        free = np.empty(new_capacity, np.int64)
        free[: self._free_top] = self._free[: self._free_top]
        self._deadline, self._live, self._free = deadline, live, free

    def _free_slots(self, slots: np.ndarray) -> None:
        """Push slots whose live[] is already negative back onto the free stack."""
        top = self._free_top
        self._free[top : top + len(slots)] = slots
        self._free_top = top + len(slots)

    def _next_epoch(self) -> int:
        """The handle bits above the slot for this allocating call."""
        self._epoch = epoch = (self._epoch + 1) & EPOCH_MASK
        return epoch << SLOT_BITS

    # ----------------------------------------------------------------- placement
    def _level_of(self, tick: int) -> int:
        n, current = self.wheel_size, self._tick
        if tick < current + n:
            return 0
        for level in range(1, self._max_levels):
            span = self._spans[level]
            if tick // span < current // span + n:
                return level
        raise AssertionError("tick beyond the last level")  # limit_ms prevents this

    def _append(self, bucket: int, slots: np.ndarray, expiration: int) -> None:
        fill = self._fill[bucket]
        if self._armed[bucket] != expiration:
            if fill:
                raise AssertionError(f"bucket {bucket} re-armed while holding {fill} references")
            self._armed[bucket] = expiration
            heapq.heappush(self._heap, (expiration, bucket))
        members = self._members[bucket]
        end = fill + len(slots)
        if members is None or end > len(members):
            size = self._bucket_initial_capacity if members is None else len(members)
            grown = np.empty(doubled(size, end), np.int64)
            if fill:
                grown[:fill] = members[:fill]
            members = self._members[bucket] = grown
        members[fill:end] = slots
        self._fill[bucket] = end

    def _place(self, slots: np.ndarray, ticks: np.ndarray, low_tick: int, high_tick: int) -> None:
        """Put live slots into their buckets; ticks are their fire ticks (>= current tick), low/high their range."""
        n, current = self.wheel_size, self._tick
        if high_tick < current + n:
            low = high = 0
        else:
            low = self._level_of(low_tick)
            high = self._level_of(high_tick)  # the level is monotone in the tick
            if high >= self._levels_used:
                self._levels_used = high + 1
        if low == high:  # the usual case: one level
            span = self._spans[low]
            first_vid = low_tick // span
            if first_vid == high_tick // span:  # ... and one bucket: no per-entry arithmetic at all
                self._append(low * n + first_vid % n, slots, first_vid * span)
                return
            # One level: a bucket's position in the level's window is its vid minus the window's first vid, so
            # one count per position gives every bucket's run in the sorted order (no per-run numpy calls).
            window_start = current // span
            positions = (ticks // span if span > 1 else ticks) - window_start
            # Positions are < n <= 2**16: sorting them narrow lets numpy use its O(n) radix sort (3x at 1k).
            order = np.argsort(positions.astype(self._sort_dtype), kind="stable")
            counts = np.bincount(positions, minlength=n).tolist()
            sorted_slots = slots[order]
            begin = 0
            base = low * n
            for position, count in enumerate(counts):
                if count:
                    vid = window_start + position
                    end = begin + count
                    self._append(base + vid % n, sorted_slots[begin:end], vid * span)
                    begin = end
            return
        levels = np.full(len(ticks), high, np.int64)
        for level in range(high - 1, low - 1, -1):
            span = self._spans[level]
            fits = ticks // span < current // span + n
            levels[fits] = level
        spans = np.asarray(self._spans, np.int64)[levels]
        bucket_vids = ticks // spans
        buckets = bucket_vids % n + levels * n
        order = np.argsort(buckets.astype(self._bucket_sort_dtype), kind="stable")
        sorted_buckets = buckets[order]
        starts = np.flatnonzero(sorted_buckets[1:] != sorted_buckets[:-1]) + 1
        bounds = [0, *starts.tolist(), len(order)]
        sorted_slots = slots[order]
        sorted_vids = bucket_vids[order]
        for begin, end in zip(bounds[:-1], bounds[1:]):
            bucket = int(sorted_buckets[begin])
            expiration = int(sorted_vids[begin]) * self._spans[bucket // n]
            self._append(bucket, sorted_slots[begin:end], expiration)

    # ----------------------------------------------------------------- add
    def add(self, deadline_ms: int) -> int:
        """Add one timer; returns its handle. A deadline already due fires at the next advance()."""
        deadline_ms = self.check_time("deadline_ms", deadline_ms)
        if self._free_top:
            self._free_top -= 1
            slot = int(self._free[self._free_top])
        else:
            self._grow(self._high + 1)
            slot = self._high
            self._high += 1
        handle = self._next_epoch() | slot
        self._deadline[slot] = deadline_ms
        self._live[slot] = handle
        tick = max(-(-deadline_ms // self.tick_ms), self._tick)
        level = self._level_of(tick)
        if level >= self._levels_used:
            self._levels_used = level + 1
        span = self._spans[level]
        vid = tick // span
        self._append_one(level * self.wheel_size + vid % self.wheel_size, slot, vid * span)
        self._pending += 1
        return handle

    def add_many(self, deadlines_ms: np.ndarray) -> np.ndarray:
        """Add one timer per deadline (int64 ms, each within +-limit_ms) in one call; returns their handles, in
        the deadlines' order. The entries are placed as a cascade places them (_place: one numpy pass over the
        batch), so a batch costs a handful of numpy calls plus a Python step per bucket it reaches; one epoch
        for the whole call (the slots differ, so the handles do). The same invariants as add()."""
        deadlines = np.asarray(deadlines_ms, dtype=np.int64)
        count = len(deadlines)
        if not count:
            return _EMPTY
        if int(_min(deadlines)) < -self.limit_ms or int(_max(deadlines)) > self.limit_ms:
            raise ValueError(f"deadline_ms must be within +-{self.limit_ms}")
        reused = min(self._free_top, count)
        fresh = count - reused
        self._grow(self._high + fresh)
        slots = np.empty(count, np.int64)
        if reused:
            top = self._free_top
            slots[:reused] = self._free[top - reused : top][::-1]
            self._free_top = top - reused
        if fresh:
            slots[reused:] = np.arange(self._high, self._high + fresh, dtype=np.int64)
            self._high += fresh
        handles = slots | self._next_epoch()
        self._deadline[slots] = deadlines
        self._live[slots] = handles
        ticks = deadlines if self.tick_ms == 1 else -((-deadlines) // self.tick_ms)
        ticks = np.maximum(ticks, self._tick)
        self._place(slots, ticks, int(_min(ticks)), int(_max(ticks)))
        self._pending += count
        return handles

    def _append_one(self, bucket: int, slot: int, expiration: int) -> None:
        fill = self._fill[bucket]
        members = self._members[bucket]
        if self._armed[bucket] != expiration or members is None or fill == len(members):
            self._append(bucket, np.array((slot,), np.int64), expiration)
            return
        members[fill] = slot
        self._fill[bucket] = fill + 1

    # ----------------------------------------------------------------- cancel
    def cancel(self, handle: int) -> bool:
        """Cancel one timer; False if it already fired, was cancelled, or the handle is unknown."""
        if isinstance(handle, bool) or not isinstance(handle, (int, np.integer)):
            raise TypeError(f"handle must be an int, got {type(handle).__name__}")
        handle = int(handle)
        slot = handle & SLOT_MASK
        if handle < 0 or slot >= self._high or int(self._live[slot]) != handle:
            return False
        self._live[slot] = NOT_LIVE
        self._pending -= 1
        self._cancelled_unreclaimed += 1
        if self._cancelled_unreclaimed > self._pending + self.compaction_slack:
            self._compact()
        return True

    def cancel_many(self, handles: np.ndarray) -> int:
        """cancel() of each handle (int64, distinct) in one call; returns how many were live."""
        handles = np.asarray(handles, dtype=np.int64)
        if not len(handles):
            return 0
        slots = handles & SLOT_MASK
        known = (handles >= 0) & (slots < self._high)
        live = np.zeros(len(handles), bool)
        live[known] = self._live[slots[known]] == handles[known]
        slots = slots[live]
        count = len(slots)
        if count:
            self._live[slots] = NOT_LIVE
            self._pending -= count
            self._cancelled_unreclaimed += count
            if self._cancelled_unreclaimed > self._pending + self.compaction_slack:
                self._compact()
        return count

    def _compact(self) -> None:
        """Reclaim every cancelled slot by filtering each bucket's members (O(slots in use + buckets))."""
        live = self._live
        for _, bucket in self._heap:  # every bucket holding references is armed (I5)
            fill = self._fill[bucket]
            if not fill:
                continue
            members = self._members[bucket]
            refs = members[:fill]
            keep = live[refs] >= 0
            kept_count = _count(keep)
            if kept_count == fill:
                continue
            self._free_slots(refs[~keep])
            members[:kept_count] = refs[keep]
            self._fill[bucket] = kept_count
        self._cancelled_unreclaimed = 0
        self.compactions += 1

    # ----------------------------------------------------------------- clock
    def _take(self, bucket: int) -> np.ndarray | None:
        """Disarm a popped bucket; its references (a view, valid until the bucket is appended to again)."""
        fill = self._fill[bucket]
        self._fill[bucket] = 0
        self._armed[bucket] = NOT_ARMED
        if not fill:
            return None
        members = self._members[bucket]
        if len(members) > 4 * max(fill, self._bucket_initial_capacity):
            self._members[bucket] = None  # give back memory of a burst (the view keeps it until used)
        return members[:fill]

    def _fire(self, refs: np.ndarray, fired: list) -> None:
        """End every entry of refs: their live[] values (handles, or negatives for cancelled ones) go to
        fired, and the slots to the free list."""
        fired.append(self._live[refs])
        self._live[refs] = NOT_LIVE
        self._free_slots(refs)

    def _cascade(self, refs: np.ndarray, fired: list) -> None:
        """Re-place the live entries of an expired overflow bucket in finer levels; fire those already due."""
        values = self._live[refs]
        keep = values >= 0
        live_count = _count(keep)
        if live_count != len(refs):
            self._free_slots(refs[~keep])
            self._cancelled_unreclaimed -= len(refs) - live_count
            if not live_count:
                return
            refs = refs[keep]
        deadlines = self._deadline[refs]
        ticks = deadlines if self.tick_ms == 1 else -((-deadlines) // self.tick_ms)
        low_tick, high_tick = int(_min(ticks)), int(_max(ticks))
        current = self._tick
        if high_tick <= current:
            self._fire(refs, fired)
        elif low_tick > current:
            self._place(refs, ticks, low_tick, high_tick)  # never into the bucket refs is a view of
        else:
            due = ticks <= current
            self._fire(refs[due], fired)
            later = ~due
            ticks = ticks[later]
            self._place(refs[later], ticks, int(_min(ticks)), high_tick)

    def next_expiration(self) -> int | None:
        """Expiration (ms) of the earliest armed bucket, or None when no bucket is armed.

        The bucket may have been emptied by cancels (cancel is lazy); waking for it then fires nothing and
        drains it, as in Kafka, whose cancelled entries also leave their bucket in the delay queue. With
        nothing pending the wheel drains its armed buckets here, so an idle owner does not wake."""
        heap = self._heap
        if not heap:
            return None
        if self._pending == 0:
            while heap:
                refs = self._take(heapq.heappop(heap)[1])
                if refs is not None:
                    self._free_slots(refs)  # all cancelled: live[] is already negative
            self._cancelled_unreclaimed = 0
            return None
        return heap[0][0] * self.tick_ms

    def advance(self, now_ms: int) -> np.ndarray:
        """Move the clock to now_ms (monotonic ms); returns the handles of the entries that fired."""
        if type(now_ms) is not int or not -self.limit_ms <= now_ms <= self.limit_ms:
            now_ms = self.check_time("now_ms", now_ms)
        now_tick = max(now_ms // self.tick_ms, self._tick)  # the clock never runs backwards
        heap = self._heap
        if not heap or heap[0][0] > now_tick:  # the common idle case: nothing due
            if now_tick > self._tick:
                self._tick = now_tick
            return _EMPTY
        n = self.wheel_size
        fired: list[np.ndarray] = []  # live[] values of the ended entries: handles, or < 0 if cancelled
        while heap and heap[0][0] <= now_tick:
            expiration, bucket = heapq.heappop(heap)
            if expiration > self._tick:
                self._tick = expiration  # run the clock bucket by bucket, as Kafka does
            refs = self._take(bucket)
            if refs is None:
                continue
            if bucket < n:  # level 0: every member's fire tick is this bucket's tick (or was already due)
                self._fire(refs, fired)
            else:
                self._cascade(refs, fired)
        if now_tick > self._tick:
            self._tick = now_tick
        if not fired:
            return _EMPTY
        values = fired[0] if len(fired) == 1 else np.concatenate(fired)
        was_live = values >= 0
        handles = values[was_live]
        fired_count = len(handles)
        self._pending -= fired_count
        self._cancelled_unreclaimed -= len(values) - fired_count
        if self._cancelled_unreclaimed > self._pending + self.compaction_slack:
            self._compact()
        return handles
