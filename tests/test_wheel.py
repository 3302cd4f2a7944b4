"""TimingWheel against a reference model (a sorted list of (fire time, handle)), plus its edge cases."""

from __future__ import annotations

import bisect

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shmbroker.node.timer.wheel import EPOCH_MASK, SLOT_BITS, SLOT_MASK, TimingWheel

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

# Offsets from "now" for new deadlines: already due, within the first level, and far into overflow levels.
offsets = st.one_of(
    st.integers(-50, 0),
    st.integers(1, 60),
    st.integers(61, 20_000),
    st.integers(HOUR_MS // 2, 3 * DAY_MS),
)
steps = st.one_of(st.integers(0, 3), st.integers(4, 500), st.integers(501, 2 * HOUR_MS), st.integers(-20, -1))


def fire_ms(deadline: int, tick: int) -> int:
    """The earliest clock at which the wheel may fire this deadline: the next tick boundary at or after it."""
    return -(-deadline // tick) * tick


class WheelMachine(RuleBasedStateMachine):
    """Random interleavings of add, cancel (of live, dead and never-issued handles) and advance."""

    @initialize(
        tick=st.sampled_from([1, 1, 3, 10]),
        size=st.sampled_from([2, 3, 20]),
        start=st.integers(-1_000, 10_000),
        slack=st.sampled_from([0, 3, 64]),
    )
    def setup(self, tick, size, start, slack):
        self.tick = tick
        self.wheel = TimingWheel(tick, size, start, initial_capacity=2, bucket_initial_capacity=1,
                                 compaction_slack=slack)
        self.now = start
        self.model: list[tuple[int, int]] = []  # sorted (fire_ms, handle) of live entries
        self.deadline: dict[int, int] = {}  # live handle -> deadline
        self.dead: list[int] = []  # handles that fired or were cancelled

    def _insert(self, handle: int, deadline: int) -> None:
        assert handle not in self.deadline, "handle reused while live"
        self.deadline[handle] = deadline
        bisect.insort(self.model, (fire_ms(deadline, self.tick), handle))

    def _remove(self, handle: int) -> None:
        deadline = self.deadline.pop(handle)
        self.model.remove((fire_ms(deadline, self.tick), handle))
        self.dead.append(handle)

    @rule(offset=offsets)
    def add(self, offset):
        deadline = self.now + offset
        self._insert(self.wheel.add(deadline), deadline)

    @rule(batch=st.lists(offsets, min_size=0, max_size=12))
    def add_many(self, batch):
        """The timer process's batch path: one call for a ring drain's deadlines, handles in their order."""
        deadlines = [self.now + offset for offset in batch]
        handles = self.wheel.add_many(np.array(deadlines, np.int64)).tolist()
        assert len(handles) == len(deadlines) == len(set(handles))
        for handle, deadline in zip(handles, deadlines):
            self._insert(handle, deadline)

    @precondition(lambda self: self.deadline or self.dead)
    @rule(data=st.data())
    def cancel(self, data):
        handle = data.draw(st.sampled_from(sorted(self.deadline) + self.dead[-20:]))
        expected = handle in self.deadline
        assert self.wheel.cancel(handle) is expected
        if expected:
            self._remove(handle)

    # Handles never issued: negative ones, and slot numbers far beyond any capacity these tests reach.
    @rule(junk=st.integers(-(2**63), -1) | st.integers(2**31, 2**32 - 1) | st.integers(2**40, 2**63 - 1))
    def cancel_unknown(self, junk):
        if junk not in self.deadline:
            assert self.wheel.cancel(junk) is False

    @rule(step=steps)
    def advance(self, step):
        self.now += step
        fired = self.wheel.advance(self.now).tolist()
        clock = max(self.now, self.wheel.current_ms)
        expected = [h for f, h in self.model if f <= clock]
        assert sorted(fired) == sorted(expected), "fired exactly what is due, each once"
        for handle in fired:
            assert self.deadline[handle] <= clock, "never fires before its deadline"
            self._remove(handle)

    @invariant()
    def pending_is_exact(self):
        if hasattr(self, "wheel"):
            assert self.wheel.pending == len(self.model)
            assert sum(self.wheel.entries_per_level()) == self.wheel.pending

    @invariant()
    def memory_is_bounded(self):
        if hasattr(self, "wheel"):
            w = self.wheel
            assert w.slots_in_use <= 2 * w.pending + w.compaction_slack
            assert w.heap_size <= w.levels * w.wheel_size

    @invariant()
    def next_expiration_is_not_late(self):
        if hasattr(self, "wheel"):
            due = self.wheel.next_expiration()
            if self.model:
                assert due is not None and due <= max(self.model[0][0], self.wheel.current_ms)
            else:
                assert due is None


TestWheelMachine = WheelMachine.TestCase
TestWheelMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None, database=None,
                                     suppress_health_check=[HealthCheck.too_slow])


def test_deadlines_days_away_use_overflow_levels_and_fire_within_a_tick():
    wheel = TimingWheel(tick_ms=1, wheel_size=20, start_ms=0)
    deadlines = [7, 19, 20, 399, 400, 8_000, HOUR_MS, 2 * DAY_MS + 17]
    handles = [wheel.add(d) for d in deadlines]
    assert wheel.levels >= 6  # 20 ms, 400 ms, 8 s, 160 s, 3200 s, 64000 s, ... per bucket
    # Level L holds what falls within 20**(L+1) ms: 7 and 19 ms in level 0; 20 and 399 in 1; 400 in 2;
    # 8 s in 3; nothing in 4 (up to 3,200 s); an hour in 5; two days in 6.
    assert wheel.entries_per_level()[:7] == [2, 2, 1, 1, 0, 1, 1]
    now, wakes, fired_at = 0, 0, {}
    while wheel.pending and wakes < 1_000:  # driven by bucket expirations only, never per tick
        now = wheel.next_expiration()
        for handle in wheel.advance(now).tolist():
            fired_at[handle] = now
        wakes += 1
    assert wheel.pending == 0
    assert wakes <= wheel.levels * wheel.wheel_size
    for handle, deadline in zip(handles, deadlines):
        assert deadline <= fired_at[handle] < deadline + 1


def test_coarse_tick_fires_at_the_next_tick_boundary_never_early():
    wheel = TimingWheel(tick_ms=10, wheel_size=4, start_ms=0)
    handle = wheel.add(15)
    assert len(wheel.advance(15)) == 0  # 15 is inside tick [10, 20): firing now would be early
    assert wheel.advance(19).tolist() == []
    assert wheel.advance(20).tolist() == [handle]


def test_clock_never_runs_backwards_and_a_jump_back_does_not_stall():
    wheel = TimingWheel(1, 20, 1_000)
    handle = wheel.add(1_010)
    assert wheel.advance(500).tolist() == []  # a clock going back neither fires nor moves the wheel back
    assert wheel.current_ms == 1_000
    assert wheel.advance(1_009).tolist() == []
    assert wheel.advance(1_010).tolist() == [handle]


def test_already_due_deadlines_fire_at_the_next_advance():
    wheel = TimingWheel(1, 20, 100)
    handles = [wheel.add(d) for d in (-5, 50, 100)]
    assert wheel.next_expiration() == 100
    assert sorted(wheel.advance(100).tolist()) == sorted(handles)


def test_cancelled_slots_are_reclaimed_and_reused_without_growth():
    wheel = TimingWheel(1, 20, 0, initial_capacity=1024, compaction_slack=100)
    handles = [wheel.add(DAY_MS) for _ in range(50_000)]
    capacity = len(wheel._deadline)
    assert all(wheel.cancel(h) for h in handles)
    assert wheel.pending == 0
    assert wheel.slots_in_use <= wheel.compaction_slack
    again = [wheel.add(DAY_MS) for _ in range(50_000)]
    assert len(wheel._deadline) == capacity  # reused the reclaimed slots
    assert not any(wheel.cancel(h) for h in handles), "old handles never alias new entries"
    assert wheel.pending == 50_000
    assert all(wheel.cancel(h) for h in again)


def test_stale_handle_does_not_cancel_the_slot_s_next_entry():
    wheel = TimingWheel(1, 20, 0, compaction_slack=0)
    old = wheel.add(10)
    assert wheel.cancel(old)
    new = wheel.add(10)  # compaction_slack=0: the slot was reclaimed and is reused
    assert new & SLOT_MASK == old & SLOT_MASK and new != old
    assert not wheel.cancel(old)
    assert wheel.advance(10).tolist() == [new]


def test_the_next_handle_of_a_free_slot_is_not_live():
    wheel = TimingWheel(1, 20, 0, compaction_slack=0)
    fired = wheel.add(3)
    cancelled = wheel.add(DAY_MS)
    assert wheel.advance(3).tolist() == [fired]
    wheel.cancel(cancelled)  # compaction_slack=0: reclaimed at once
    guesses = [fired + (1 << SLOT_BITS), cancelled + (1 << SLOT_BITS), wheel.capacity - 1, wheel.capacity]
    assert not any(wheel.cancel(g) for g in guesses)
    assert wheel.pending == 0


def test_handle_epoch_wraps_to_a_positive_handle():
    wheel = TimingWheel(1, 20, 0)
    wheel._epoch = EPOCH_MASK - 1  # as after 2**31 - 2 allocating calls
    top = wheel.add(5)
    assert top == (EPOCH_MASK << SLOT_BITS) | (top & SLOT_MASK) and top > 0
    assert wheel.advance(5).tolist() == [top]
    wrapped = wheel.add(6)
    assert wrapped == wrapped & SLOT_MASK  # epoch 0 again, still a non-negative int64
    assert wheel.advance(6).tolist() == [wrapped]


def test_not_live_values_never_match_a_handle():
    """I6: the negative values live[] holds for ended entries, and -1, never cancel anything."""
    wheel = TimingWheel(1, 20, 0, initial_capacity=4, compaction_slack=1000)
    for handle in [wheel.add(100) for _ in range(3)]:
        assert wheel.cancel(handle)
    live = wheel.add(100)
    stored = wheel._live[: wheel.capacity].tolist()
    assert not any(wheel.cancel(v) for v in stored if v != live)
    assert not any(wheel.cancel(v) for v in (-1, -2, 0, (1 << SLOT_BITS) - 1))
    assert wheel.pending == 1


def test_next_expiration_is_none_when_only_cancelled_entries_remain():
    wheel = TimingWheel(1, 20, 0)
    for handle in [wheel.add(d) for d in range(10, 5_000, 7)]:
        wheel.cancel(handle)
    assert wheel.next_expiration() is None
    assert wheel.heap_size == 0


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda w: w.add("10"), TypeError),
        (lambda w: w.add(1.5), TypeError),
        (lambda w: w.add(True), TypeError),
        (lambda w: w.add(1 << 70), ValueError),
        (lambda w: w.advance(None), TypeError),
        (lambda w: w.cancel("1"), TypeError),
    ],
)
def test_bad_input_gets_a_clear_error_and_leaves_the_wheel_intact(call, error):
    wheel = TimingWheel(1, 20, 0)
    handle = wheel.add(5)
    with pytest.raises(error):
        call(wheel)
    assert wheel.pending == 1
    assert wheel.advance(5).tolist() == [handle]


@pytest.mark.parametrize("kwargs", [{"tick_ms": 0}, {"wheel_size": 1}, {"wheel_size": 1 << 20}, {"tick_ms": "1"}])
def test_bad_configuration_is_rejected(kwargs):
    with pytest.raises((ValueError, TypeError)):
        TimingWheel(**kwargs)


def test_unknown_handles_are_not_live_and_cancel_nothing():
    wheel = TimingWheel(1, 20, 0)
    wheel.add(5)
    assert not any(wheel.cancel(junk) for junk in (-1, 1 << 40, 12345, (1 << 63) - 1, -7))
    assert wheel.pending == 1
