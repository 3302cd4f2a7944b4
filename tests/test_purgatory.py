"""Purgatory against a reference model: random watches, key events, force-completes and clock advances."""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shmbroker.node.config import WheelConfig
from shmbroker.node.timer.purgatory import DelayedOperation, Purgatory

HOUR_MS = 3_600_000
KEYS = list(range(6))
offsets = st.one_of(st.integers(-5, 0), st.integers(1, 40), st.integers(41, 5_000), st.integers(HOUR_MS, 30 * HOUR_MS))
steps = st.one_of(st.integers(0, 3), st.integers(4, 300), st.integers(301, 40 * HOUR_MS), st.integers(-10, -1))


def fire_ms(deadline: int, tick: int) -> int:
    return -(-deadline // tick) * tick


class Op(DelayedOperation):
    """A test operation: satisfied once a key event marked it ready; records every callback."""

    def __init__(self, machine, deadline: int):
        self.machine = machine
        self.deadline = deadline
        self.ready = False
        self.completions = 0
        self.expirations = 0
        self.completed_at = None

    def try_complete(self) -> bool:
        if self.ready:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.completions += 1
        self.completed_at = self.machine.clock

    def on_expiration(self) -> None:
        self.expirations += 1
        assert self.completions == 1, "Kafka order: on_complete, then on_expiration"


class PurgatoryMachine(RuleBasedStateMachine):
    @initialize(
        tick=st.sampled_from([1, 1, 5]),
        size=st.sampled_from([2, 20]),
        purge_interval=st.sampled_from([0, 1, 3, 50]),
        start=st.integers(0, 10_000),
    )
    def setup(self, tick, size, purge_interval, start):
        self.tick = tick
        self.purgatory = Purgatory("test", purge_interval, WheelConfig(tick_ms=tick, wheel_size=size), start)
        self.now = start
        self.clock = start
        self.objects: list[Op] = []  # every object operation ever handed in
        self.pending_objects: dict[int, Op] = {}  # id(op) -> op while waiting
        self.keys_of: dict[int, tuple] = {}
        self.completed = 0
        self.expired = 0

    # ------------------------------------------------------------ object operations
    @rule(offset=offsets, keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
          ready=st.booleans())
    def watch_object(self, offset, keys, ready):
        op = Op(self, self.now + offset)
        op.ready = ready
        self.objects.append(op)
        done = self.purgatory.try_complete_else_watch(op, keys, op.deadline)
        assert done is ready
        if ready:
            assert op.completions == 1 and op.is_completed
            self.completed += 1
        else:
            self.pending_objects[id(op)] = op
            self.keys_of[id(op)] = tuple(keys)

    @rule(key=st.sampled_from(KEYS), data=st.data())
    def key_event(self, key, data):
        watching = [op for op in self.pending_objects.values() if key in self.keys_of[id(op)]]
        for op in watching:
            if data.draw(st.booleans()):
                op.ready = True
        expected = [op for op in watching if op.ready]
        assert self.purgatory.check_and_complete(key) == len(expected)
        for op in expected:
            assert op.completions == 1
            del self.pending_objects[id(op)]
        self.completed += len(expected)

    @precondition(lambda self: self.objects)
    @rule(data=st.data())
    def force_complete_object(self, data):
        op = data.draw(st.sampled_from(self.objects))
        expected = id(op) in self.pending_objects
        assert self.purgatory.force_complete(op) is expected
        assert op.completions == 1
        if expected:
            del self.pending_objects[id(op)]
            self.completed += 1

    # ------------------------------------------------------------ clock
    @rule(step=steps)
    def advance(self, step):
        self.now += step
        self.clock = max(self.now, self.purgatory.timer.current_ms)  # the wheel's clock never runs backwards
        due_objects = [op for op in self.pending_objects.values() if fire_ms(op.deadline, self.tick) <= self.clock]
        expired = self.purgatory.advance(self.now)
        assert expired == len(due_objects)
        for op in due_objects:
            assert op.expirations == 1 and op.completions == 1
            assert op.deadline <= self.clock, "never expires before its deadline"
            del self.pending_objects[id(op)]
        self.expired += expired

    # ------------------------------------------------------------ invariants
    @invariant()
    def counters_are_exact(self):
        if not hasattr(self, "purgatory"):
            return
        p = self.purgatory
        assert p.pending == len(self.pending_objects)
        assert p.completed == self.completed
        assert p.expired == self.expired
        for op in self.objects:
            assert op.completions <= 1 and op.expirations <= op.completions
            assert op.is_completed == (id(op) not in self.pending_objects)

    @invariant()
    def completed_operations_in_watcher_lists_stay_bounded(self):
        if not hasattr(self, "purgatory"):
            return
        p = self.purgatory
        stale = {id(op) for ops in p._watchers.values() for op in ops if op.is_completed}
        assert len(stale) <= p.purge_interval
        assert p.watched - p.pending <= p.purge_interval


TestPurgatoryMachine = PurgatoryMachine.TestCase
TestPurgatoryMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None, database=None,
                                         suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------- the purge rule, step by step
class Never(DelayedOperation):
    def try_complete(self) -> bool:
        return False


def test_purge_runs_when_completed_since_last_purge_exceeds_the_interval():
    purgatory = Purgatory("p", purge_interval=3)
    ops = [Never() for _ in range(10)]
    for op in ops:
        assert not purgatory.try_complete_else_watch(op, ["a", "b"], 1_000)
    assert purgatory.watched == 10 and purgatory.pending == 10
    for op in ops[:3]:
        purgatory.force_complete(op)
    assert purgatory.purges == 0
    assert purgatory.watcher_count("a") == 10, "a completion does not scan watcher lists"
    purgatory.force_complete(ops[3])  # watched - pending = 4 > 3
    assert purgatory.purges == 1
    assert purgatory.watched == purgatory.pending == 6  # the estimate was reset to the timer's count
    assert purgatory.watcher_count("a") == purgatory.watcher_count("b") == 6


# ---------------------------------------------------------------------------- Kafka semantics
class Countdown(DelayedOperation):
    def __init__(self, needed: int):
        self.needed = needed
        self.events = []

    def try_complete(self) -> bool:
        self.needed -= 1
        return self.force_complete() if self.needed <= 0 else False

    def on_complete(self):
        self.events.append("complete")

    def on_expiration(self):
        self.events.append("expire")


def test_complete_at_once_is_not_watched_or_timed():
    purgatory = Purgatory("p")
    op = Countdown(1)
    assert purgatory.try_complete_else_watch(op, [("topic", 0)], 100)
    assert op.events == ["complete"] and purgatory.pending == 0 and purgatory.watched == 0
    assert purgatory.watcher_count(("topic", 0)) == 0
    assert not purgatory.force_complete(op)


def test_key_events_complete_an_operation_once_and_it_leaves_the_timer():
    purgatory = Purgatory("p", start_ms=0)
    op = Countdown(3)
    assert not purgatory.try_complete_else_watch(op, [("t", 0), ("t", 1)], 100)
    assert purgatory.check_and_complete(("t", 0)) == 0
    assert purgatory.check_and_complete(("t", 1)) == 1
    assert purgatory.pending == 0 and op.events == ["complete"]
    assert purgatory.check_and_complete(("t", 0)) == 0
    assert purgatory.advance(1_000) == 0 and op.events == ["complete"]
    assert purgatory.next_expiration() is None


def test_expiry_calls_on_complete_then_on_expiration():
    purgatory = Purgatory("p", start_ms=0)
    op = Countdown(99)
    purgatory.try_complete_else_watch(op, ["k"], 30)
    assert purgatory.next_expiration() is not None and purgatory.next_expiration() <= 30
    assert purgatory.advance(29) == 0
    assert purgatory.advance(30) == 1
    assert op.events == ["complete", "expire"] and op.is_completed
    assert purgatory.expired == 1 and purgatory.completed == 0
    assert not op.force_complete()


def test_try_complete_may_watch_the_same_key_again():
    purgatory = Purgatory("p")
    spawned = []

    class Spawner(DelayedOperation):
        def try_complete(self):
            if not spawned and self.is_ready:
                child = Countdown(99)
                spawned.append(child)
                purgatory.try_complete_else_watch(child, ["k"], 500)
                return self.force_complete()
            return False

    parent = Spawner()
    parent.is_ready = False
    purgatory.try_complete_else_watch(parent, ["k"], 500)
    parent.is_ready = True
    assert purgatory.check_and_complete("k") == 1
    assert purgatory.watcher_count("k") == 1 and purgatory.pending == 1  # the child, still watched


def test_callbacks_that_raise_are_logged_and_do_not_break_the_purgatory(caplog):
    class Broken(DelayedOperation):
        def try_complete(self):
            raise RuntimeError("boom in try_complete")

        def on_complete(self):
            raise RuntimeError("boom in on_complete")

    purgatory = Purgatory("p", start_ms=0)
    good = Countdown(99)
    with caplog.at_level(logging.ERROR, logger="shmbroker.node.timer.purgatory"):
        assert not purgatory.try_complete_else_watch(Broken(), ["k"], 10)
        purgatory.try_complete_else_watch(good, ["k"], 10)
        assert purgatory.check_and_complete("k") == 0
        assert purgatory.advance(10) == 2
    assert good.events == ["complete", "expire"]
    assert purgatory.callback_errors == 3  # two try_complete calls and one on_complete
    assert "boom" in caplog.text


def test_a_true_try_complete_that_forgot_force_complete_still_completes_once():
    class Sloppy(DelayedOperation):
        calls = 0

        def try_complete(self):
            return True

        def on_complete(self):
            Sloppy.calls += 1

    purgatory = Purgatory("p")
    op = Sloppy()
    assert purgatory.try_complete_else_watch(op, ["k"], 10)
    assert op.is_completed and Sloppy.calls == 1 and purgatory.completed == 1


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda p: p.try_complete_else_watch(Never(), [], 10), ValueError),
        (lambda p: p.try_complete_else_watch(Never(), [["unhashable"]], 10), TypeError),
        (lambda p: p.try_complete_else_watch(object(), ["k"], 10), TypeError),
        (lambda p: p.try_complete_else_watch(Never(), ["k"], "soon"), TypeError),
    ],
)
def test_bad_input_gets_a_clear_error_and_changes_nothing(call, error):
    purgatory = Purgatory("p", start_ms=0)
    op = Never()
    purgatory.try_complete_else_watch(op, ["k"], 10)
    with pytest.raises(error):
        call(purgatory)
    assert purgatory.pending == 1 and purgatory.watched == 1 and purgatory.watcher_count("k") == 1
    assert purgatory.advance(10) == 1


def test_an_operation_cannot_be_handed_in_twice():
    purgatory = Purgatory("p")
    op = Never()
    purgatory.try_complete_else_watch(op, ["k"], 10)
    with pytest.raises(ValueError):
        purgatory.try_complete_else_watch(op, ["k"], 10)
    with pytest.raises(ValueError):
        Purgatory("other").try_complete_else_watch(op, ["k"], 10)
    with pytest.raises(ValueError):
        Purgatory("other").force_complete(op)  # would cancel an unrelated timer entry there
    assert purgatory.pending == 1 and purgatory.force_complete(op)
