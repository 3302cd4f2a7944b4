"""Kafka's DelayedOperationPurgatory, single-threaded, on top of the numpy TimingWheel.

An operation waits on one or more watch keys until it is satisfied or its deadline passes; every operation
completes exactly once, either way, and leaves the timer at once (O(1) cancel). The timer process owns the
purgatory, so there are no locks. Kafka's API: ``try_complete_else_watch(op, keys, deadline)``,
``check_and_complete(key)`` (re-runs ``try_complete`` of the operations watching a hashable key),
``force_complete(op)``, and ``advance(now)`` to expire what is due.

Purge (the proposal's estimate, KAFKA-664 / KAFKA-19763): ``watched`` is incremented once per watched
operation and reset to ``pending`` (exact, from the timer) just before each purge; a purge runs when
``watched - pending > purge_interval``. Single-threaded, ``watched - pending`` is exactly the number of
operations completed since the last purge. Completions never scan watcher lists: a purge filters only the keys
whose operations completed since the last one, and ``check_and_complete`` drops completed operations from the
key it walks, as Kafka does.

Why one Python object per operation (measured in the live node, scripts/bench_delayed.py and e2e_latency.py,
2 workers, 3 alternating runs): a vectorised path over batches of operations (numpy watcher logs, one
watch/complete call per ring drain) completed a 10,000-waiter fan-out in 0.70x the time, but most drains carry
1-4 fetches, where its fixed numpy costs made a lone long-polling consumer's end-to-end latency 1.6x (p50)
and 1.9x (p99) worse, and it did not lower the timer's CPU. So the node keeps this path for few operations; a
drain's run of at least [timer] fetch_batch_min one-partition long polls (a loaded node's usual drain: ~120 frames
per turn at 20,000/s) goes to node.timer.fetch_waits instead, arrays without watcher lists (issue 57: 16.4 -> 7.0
us of timer CPU per expiring long poll, 14.7 -> 5.0 per one an append completes), and a run of at least [timer]
produce_batch_min acks=all produces to node.timer.produce_waits.

Invariants (after every public call): each operation completes exactly once (completed + expired counts each
once); pending == timer.pending (exact); every call that completes or watches ends with the purge check, so
completed operations still in watcher lists <= purge_interval.
Callbacks that raise are logged and counted (``callback_errors``); they never break the purgatory.
"""

from __future__ import annotations

import logging

from shmbroker.node.config import PurgatoryConfig, WheelConfig
from shmbroker.node.timer.wheel import TimingWheel, _check_int

log = logging.getLogger(__name__)

NO_HANDLE = -1


class DelayedOperation:
    """Base class of an operation, as Kafka's DelayedOperation.

    Subclasses implement ``try_complete`` (check the condition; when satisfied call ``self.force_complete()``
    and return its result), ``on_complete`` (called exactly once, satisfied or expired) and ``on_expiration``
    (called after ``on_complete`` when the deadline passed first, as in Kafka)."""

    _purgatory: Purgatory | None = None
    _handle: int = NO_HANDLE
    _completed: bool = False
    _keys: tuple = ()

    def try_complete(self) -> bool:
        raise NotImplementedError

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        pass

    @property
    def is_completed(self) -> bool:
        return self._completed

    def force_complete(self) -> bool:
        """Complete now unless already completed; True only for the call that completed it."""
        if self._purgatory is not None:
            return self._purgatory.force_complete(self)
        if self._completed:
            return False
        self._completed = True
        self.on_complete()
        return True


class Purgatory:
    """Delayed operations waiting on keys or a deadline; see the module docstring."""

    def __init__(self, name: str, purge_interval: int = PurgatoryConfig.purge_interval,
                 wheel: WheelConfig = WheelConfig(), start_ms: int = 0) -> None:
        self.name = str(name)
        self.purge_interval = _check_int("purge_interval", purge_interval, 0)
        self._timer = TimingWheel.configured(wheel, start_ms)
        self._operations: dict[int, DelayedOperation] = {}  # timer handle -> pending operation
        self._watchers: dict[object, list[DelayedOperation]] = {}
        self._dirty_keys: set = set()  # keys whose lists hold operations completed since the last purge
        self._watched = 0
        self.purges = 0
        self.completed = 0
        self.expired = 0
        self.callback_errors = 0

    @classmethod
    def configured(cls, name: str, config: PurgatoryConfig, wheel: WheelConfig, start_ms: int) -> "Purgatory":
        """A purgatory with the node's settings (NodeConfig.timer)."""
        return cls(name, config.purge_interval, wheel, start_ms)

    # ----------------------------------------------------------------- counters
    @property
    def pending(self) -> int:
        """Exact number of operations waiting (in the timer)."""
        return self._timer.pending

    @property
    def watched(self) -> int:
        """The purge estimate: operations in watcher lists, pending or completed-not-yet-purged."""
        return self._watched

    @property
    def timer(self) -> TimingWheel:
        return self._timer

    def next_expiration(self) -> int | None:
        """The earliest bucket expiration (ms) holding a pending operation, for the owner's sleep timeout."""
        return self._timer.next_expiration()

    def watcher_count(self, key) -> int:
        """Operations currently listed under key (pending or completed-not-yet-purged)."""
        return len(self._watchers.get(key, ()))

    # ----------------------------------------------------------------- callbacks
    def _call(self, op: DelayedOperation, callback) -> None:
        try:
            callback()
        except Exception:
            self.callback_errors += 1
            log.exception("purgatory %s: %s.%s raised", self.name, type(op).__name__, callback.__name__)

    def _try_complete(self, op: DelayedOperation) -> bool:
        try:
            satisfied = bool(op.try_complete())
        except Exception:
            self.callback_errors += 1
            log.exception("purgatory %s: %s.try_complete raised", self.name, type(op).__name__)
            return False
        if satisfied and not op._completed:  # it reported success without completing itself
            return self.force_complete(op)
        return satisfied

    # ----------------------------------------------------------------- operations
    def try_complete_else_watch(self, op: DelayedOperation, keys, deadline_ms: int) -> bool:
        """Kafka's tryCompleteElseWatch: complete now if possible, else watch every key until completion or
        deadline_ms (monotonic ms). Returns True if the operation completed in this call."""
        if not isinstance(op, DelayedOperation):
            raise TypeError(f"op must be a DelayedOperation, got {type(op).__name__}")
        keys = tuple(keys)
        if not keys:
            raise ValueError("an operation must watch at least one key")
        for key in keys:
            hash(key)  # an unhashable key fails here, before anything changed
        deadline_ms = self._timer.check_time("deadline_ms", deadline_ms)
        if op._purgatory is not None or op._completed:
            raise ValueError("operation was already handed to a purgatory or completed")
        op._purgatory = self
        op._keys = keys
        if self._try_complete(op):
            return True
        if op._completed:  # completed by someone other than this try_complete's claim
            return False
        handle = self._timer.add(deadline_ms)
        op._handle = handle
        self._operations[handle] = op
        watchers = self._watchers
        for key in keys:
            lst = watchers.get(key)
            if lst is None:
                watchers[key] = [op]
            else:
                lst.append(op)
        self._watched += 1
        self._maybe_purge()
        return False

    def force_complete(self, op: DelayedOperation) -> bool:
        """Complete an operation now (satisfied); True only for the call that completed it."""
        if op._purgatory is not self and op._purgatory is not None:
            raise ValueError(f"operation belongs to purgatory {op._purgatory.name!r}, not {self.name!r}")
        if op._completed:
            return False
        op._completed = True
        if op._handle != NO_HANDLE:
            self._timer.cancel(op._handle)
            self._operations.pop(op._handle, None)
            self._dirty_keys.update(op._keys)
        self.completed += 1
        self._call(op, op.on_complete)
        self._maybe_purge()
        return True

    def check_and_complete(self, key) -> int:
        """Re-run try_complete of the operations watching key; returns how many completed."""
        ops = self._watchers.pop(key, None)
        if not ops:
            return 0
        completed = 0
        survivors = []
        for op in ops:
            if op._completed:
                continue
            if self._try_complete(op):
                completed += 1
            elif not op._completed:
                survivors.append(op)
        added_meanwhile = self._watchers.pop(key, None)  # a callback may have watched this key again
        if added_meanwhile:
            survivors.extend(added_meanwhile)
        if survivors:
            self._watchers[key] = survivors
        self._maybe_purge()
        return completed

    def advance(self, now_ms: int) -> int:
        """Advance the clock to now_ms (monotonic ms); expires what is due; returns how many expired."""
        expired = self._timer.advance(now_ms)
        operations = self._operations
        for handle in expired.tolist():
            op = operations.pop(handle, None)
            if op is None or op._completed:
                continue
            op._completed = True
            self._dirty_keys.update(op._keys)
            self._call(op, op.on_complete)
            self._call(op, op.on_expiration)
        self.expired += len(expired)
        self._maybe_purge()
        return len(expired)

    # ----------------------------------------------------------------- purge
    def _maybe_purge(self) -> None:
        if self._watched - self._timer.pending > self.purge_interval:
            self.purge()

    def purge(self) -> None:
        """Drop completed operations from every watcher list (normally triggered by the estimate)."""
        self._watched = self._timer.pending  # the proposal: reset the estimate before purging
        self.purges += 1
        watchers = self._watchers
        for key in self._dirty_keys:
            lst = watchers.get(key)
            if lst is None:
                continue
            kept = [op for op in lst if not op._completed]
            if kept:
                watchers[key] = kept
            else:
                del watchers[key]
        self._dirty_keys.clear()
