"""Purgatory against a reference model: random watches, key events, force-completes and clock advances."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from node.timer.purgatory import TOMBSTONE, DelayedOperation, Purgatory

HOUR_MS = 3_600_000
KEYS = list(range(6))
offsets = st.one_of(st.integers(-5, 0), st.integers(1, 40), st.integers(41, 5_000), st.integers(HOUR_MS, 30 * HOUR_MS))
steps = st.one_of(st.integers(0, 3), st.integers(4, 300), st.integers(301, 40 * HOUR_MS), st.integers(-10, -1))
MAX_BATCH = 30


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
        self.purgatory = Purgatory("test", purge_interval, tick, size, start, log_initial_capacity=1,
                                   log_compaction_slack=4)
        self.now = start
        self.clock = start
        self.objects: list[Op] = []  # every object operation ever handed in
        self.pending_objects: dict[int, Op] = {}  # id(op) -> op while waiting
        self.keys_of: dict[int, tuple] = {}
        self.batch: dict[int, tuple[int, tuple]] = {}  # pending batch id -> (deadline, keys)
        self.batch_done: list[int] = []
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

    # ------------------------------------------------------------ batch operations
    @rule(batch=st.lists(offsets, max_size=MAX_BATCH), width=st.integers(1, 3), data=st.data())
    def watch_batch(self, batch, width, data):
        keys = np.array(data.draw(st.lists(st.lists(st.sampled_from(KEYS), min_size=width, max_size=width),
                                           min_size=len(batch), max_size=len(batch))), np.int64).reshape(-1, width)
        deadlines = np.array([self.now + o for o in batch], np.int64)
        ids = self.purgatory.watch_many(keys, deadlines)
        assert len(ids) == len(batch)
        for op_id, deadline, row in zip(ids.tolist(), deadlines.tolist(), keys.tolist()):
            assert op_id not in self.batch
            self.batch[op_id] = (deadline, tuple(row))

    @precondition(lambda self: self.batch or self.batch_done)
    @rule(data=st.data())
    def force_complete_batch(self, data):
        pool = sorted(self.batch) + self.batch_done[-10:]
        chosen = data.draw(st.lists(st.sampled_from(pool), max_size=MAX_BATCH))
        expected = set(chosen) & set(self.batch)
        assert self.purgatory.force_complete_many(np.array(chosen + chosen[:2], np.int64)) == len(expected)
        for op_id in expected:
            del self.batch[op_id]
            self.batch_done.append(op_id)
        self.completed += len(expected)

    @precondition(lambda self: self.batch)
    @rule(data=st.data())
    def watched_ids(self, data):
        key = data.draw(st.sampled_from(KEYS))
        expected = {op_id for op_id, (_, keys) in self.batch.items() if key in keys}
        assert set(self.purgatory.watched_ids(key).tolist()) == expected

    # ------------------------------------------------------------ clock
    @rule(step=steps)
    def advance(self, step):
        self.now += step
        self.clock = max(self.now, self.purgatory.timer.current_ms)  # the wheel's clock never runs backwards
        due_objects = [op for op in self.pending_objects.values() if fire_ms(op.deadline, self.tick) <= self.clock]
        due_batch = {i for i, (d, _) in self.batch.items() if fire_ms(d, self.tick) <= self.clock}
        expired = self.purgatory.advance_many(self.now).tolist()
        object_handles = {op._handle for op in due_objects}
        assert set(expired) == due_batch | object_handles and len(expired) == len(set(expired))
        for op in due_objects:
            assert op.expirations == 1 and op.completions == 1
            assert op.deadline <= self.clock, "never expires before its deadline"
            del self.pending_objects[id(op)]
        for op_id in due_batch:
            assert self.batch[op_id][0] <= self.clock
            del self.batch[op_id]
            self.batch_done.append(op_id)
        self.expired += len(expired)

    # ------------------------------------------------------------ invariants
    @invariant()
    def counters_are_exact(self):
        if not hasattr(self, "purgatory"):
            return
        p = self.purgatory
        assert p.pending == len(self.pending_objects) + len(self.batch)
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
        stale_objects = {id(op) for ops in p._object_watchers.values() for op in ops if op.is_completed}
        entries = p._log_ops[: p._log_fill]
        entries = entries[entries != TOMBSTONE]
        stale_batch = set(entries[~p.timer.is_live(entries)].tolist())
        assert len(stale_objects) + len(stale_batch) <= p.purge_interval
        assert p.watched - p.pending <= p.purge_interval
        live_entries = int(p.timer.is_live(entries).sum())
        assert p.watcher_log_size <= 2 * (live_entries + 3 * len(stale_batch)) + p.log_compaction_slack + 3 * MAX_BATCH


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


def test_batch_purge_tombstones_only_completed_operations_and_compacts():
    purgatory = Purgatory("p", purge_interval=10, log_initial_capacity=4, log_compaction_slack=0)
    keys = np.tile(np.array([[1, 2, 3]]), (1_000, 1))
    ids = purgatory.watch_many(keys, np.full(1_000, 50_000, np.int64))
    assert purgatory.watcher_log_size == 3_000
    purgatory.force_complete_many(ids[:600])
    assert purgatory.purges == 1
    assert purgatory.watcher_log_size == 1_200  # 600 tombstones > 400 live ops: compacted
    assert set(purgatory.watched_ids(2).tolist()) == set(ids[600:].tolist())
    more = purgatory.watch_many(keys[:5], np.full(5, 10, np.int64))
    assert set(purgatory.watched_ids(3).tolist()) == set(ids[600:].tolist()) | set(more.tolist())
    assert purgatory.advance(10) == 5


def test_steady_load_reuses_purged_ranges_so_the_log_does_not_grow():
    purgatory = Purgatory("p", purge_interval=50, log_compaction_slack=1 << 30)  # never compacts
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 10, (20_000, 3))
    outstanding = purgatory.watch_many(keys, np.full(20_000, HOUR_MS, np.int64))
    keys_of = dict(zip(outstanding.tolist(), map(tuple, keys.tolist())))
    size = purgatory.watcher_log_size
    for _ in range(100):
        purgatory.force_complete_many(outstanding[:200])
        for op_id in outstanding[:200].tolist():
            del keys_of[op_id]
        keys = rng.integers(0, 10, (200, 3))
        fresh = purgatory.watch_many(keys, np.full(200, HOUR_MS, np.int64))
        keys_of.update(zip(fresh.tolist(), map(tuple, keys.tolist())))
        outstanding = np.concatenate([outstanding[200:], fresh])
    assert purgatory.watcher_log_size <= size + 3 * (50 + 200)
    assert purgatory.pending == 20_000
    for key in range(10):
        expected = {op_id for op_id, row in keys_of.items() if key in row}
        assert set(purgatory.watched_ids(key).tolist()) == expected


def test_watcher_log_stays_bounded_over_many_cycles():
    purgatory = Purgatory("p", purge_interval=100)
    rng = np.random.default_rng(7)
    outstanding = np.empty(0, np.int64)
    now = 0
    for _ in range(300):
        ids = purgatory.watch_many(rng.integers(0, 100, (500, 3)), now + rng.integers(1, 200, 500))
        outstanding = np.concatenate([outstanding, ids])
        finish = rng.random(len(outstanding)) < 0.5
        purgatory.force_complete_many(outstanding[finish])
        outstanding = outstanding[~finish]
        now += 5
        purgatory.advance(now)
        outstanding = outstanding[purgatory.timer.is_live(outstanding)]
        assert purgatory.pending == len(outstanding)
        assert purgatory.watcher_log_size <= 2 * 3 * (purgatory.pending + 100 + 500) + purgatory.log_compaction_slack
    assert purgatory.completed + purgatory.expired + purgatory.pending == 300 * 500


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
    with caplog.at_level(logging.ERROR, logger="node.timer.purgatory"):
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
        (lambda p: p.watch_many(np.zeros((3, 2), np.int64), np.zeros(2, np.int64)), ValueError),
        (lambda p: p.watch_many(np.zeros((2, 2)), np.zeros(2, np.int64)), TypeError),
        (lambda p: p.watch_many(np.zeros((2, 0), np.int64), np.zeros(2, np.int64)), ValueError),
        (lambda p: p.force_complete_many(["x"]), TypeError),
        (lambda p: p.watched_ids("k"), TypeError),
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


def test_unknown_ids_complete_nothing():
    purgatory = Purgatory("p")
    ids = purgatory.watch_many(np.array([[1], [2]]), np.array([100, 100]))
    assert purgatory.force_complete_many(np.array([-1, 1 << 50, 99999], np.int64)) == 0
    assert purgatory.force_complete_many(ids) == 2
    assert purgatory.force_complete_many(ids) == 0
    assert purgatory.completed == 2
