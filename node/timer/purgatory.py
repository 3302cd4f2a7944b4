"""Kafka's DelayedOperationPurgatory, single-threaded, on top of the numpy TimingWheel.

An operation waits on one or more watch keys until it is satisfied or its deadline passes; every operation
completes exactly once, either way, and leaves the timer at once (O(1) cancel). The timer process owns the
purgatory, so there are no locks. Two ways in, sharing one timer and one purge rule:

  * Object operations (``DelayedOperation`` subclasses, Kafka's API): ``try_complete_else_watch``,
    ``check_and_complete(key)`` (re-runs ``try_complete`` of the operations watching a hashable key),
    ``force_complete(op)``. One Python object per operation; fine for rates of tens of thousands per second.
  * Batch operations (the hot path, no Python object per operation): ``watch_many(key_ids, deadlines)``
    returns operation ids (int64), ``force_complete_many(ids)``, and ``advance_many(now)`` returns the ids
    that expired. Their keys are integer key ids chosen by the owner (e.g. a partition index); the owner
    evaluates their conditions on its own arrays (``watched_ids(key_id)`` lists the live ones of a key).

Operation ids are the timer handles, so "completed" is simply "no longer live in the timer".

Purge (the proposal's estimate, KAFKA-664 / KAFKA-19763): ``watched`` is incremented once per watched
operation and reset to ``pending`` (exact, from the timer) just before each purge; a purge runs when
``watched - pending > purge_interval``. Single-threaded, ``watched - pending`` is exactly the number of
operations completed since the last purge. Completions never scan watcher lists. The purge itself costs O(entries of the
operations completed since the last purge), not O(all watcher entries):
  * batch watcher lists are one log of (key id, op id) entries; each op's entries are a contiguous range and
    the range's start is kept per timer slot. A purge overwrites the entries of completed ops with a tombstone
    (vectorised) and puts their ranges on a free stack per width, which later operations of that width reuse
    before the log grows; so under a steady load the log neither grows nor needs compacting, whatever the
    number outstanding. When tombstones > live entries + log_compaction_slack (after the load dropped) the log
    is compacted in one O(log size) pass, so it holds <= 2 x live entries + slack after every purge;
  * object watcher lists are Python lists per key; a purge filters only the keys whose operations completed.
``check_and_complete`` also drops completed operations from the key it walks, as Kafka does.

Invariants (after every public call): each operation completes exactly once (completed + expired counts each
once); pending == timer.pending (exact); every call that completes or watches ends with the purge check, so
completed operations still in watcher lists <= purge_interval.
Callbacks that raise are logged and counted (``callback_errors``); they never break the purgatory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from node.timer.wheel import SLOT_MASK, TimingWheel, WheelConfig, _as_int64_array, _check_int, doubled

log = logging.getLogger(__name__)

TOMBSTONE = -1  # a batch watcher entry whose operation was purged
NO_HANDLE = -1


@dataclass(frozen=True)
class PurgatoryConfig:
    """Tunables of a Purgatory."""

    purge_interval: int = 1000  # Kafka's default for produce and fetch purgatories
    log_initial_capacity: int = 4096  # batch watcher log entries allocated up front; doubles when full
    log_compaction_slack: int = 4096  # tombstones tolerated beyond the live entry count


class DelayedOperation:
    """Base class of an object operation, as Kafka's DelayedOperation.

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


def _ranges(starts: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """All positions start..start+width-1 of each (start, width), concatenated, without a Python loop."""
    if len(widths) == 0:
        return np.empty(0, np.int64)
    width = int(widths[0])
    if int(widths.min()) == width == int(widths.max()):
        return (starts[:, None] + np.arange(width, dtype=np.int64)).ravel()
    keep = widths > 0
    starts, widths = starts[keep], widths[keep]
    total = int(widths.sum())
    ends = np.cumsum(widths)
    # position i of the output belongs to range r; its value is starts[r] + (i - (ends[r] - widths[r]))
    offsets = np.repeat(starts - (ends - widths), widths)
    return offsets + np.arange(total, dtype=np.int64)


class Purgatory:
    """Delayed operations waiting on keys or a deadline; see the module docstring."""

    def __init__(
        self,
        name: str,
        purge_interval: int = PurgatoryConfig.purge_interval,
        tick_ms: int = WheelConfig.tick_ms,
        wheel_size: int = WheelConfig.wheel_size,
        start_ms: int = 0,
        *,
        log_initial_capacity: int = PurgatoryConfig.log_initial_capacity,
        log_compaction_slack: int = PurgatoryConfig.log_compaction_slack,
        wheel_initial_capacity: int = WheelConfig.initial_capacity,
        bucket_initial_capacity: int = WheelConfig.bucket_initial_capacity,
        compaction_slack: int = WheelConfig.compaction_slack,
    ) -> None:
        self.name = str(name)
        self.purge_interval = _check_int("purge_interval", purge_interval, 0)
        self.log_compaction_slack = _check_int("log_compaction_slack", log_compaction_slack, 0)
        self._timer = TimingWheel(tick_ms, wheel_size, start_ms, initial_capacity=wheel_initial_capacity,
                                  bucket_initial_capacity=bucket_initial_capacity, compaction_slack=compaction_slack)
        capacity = _check_int("log_initial_capacity", log_initial_capacity, 1)
        self._log_keys = np.empty(capacity, np.int64)
        self._log_ops = np.empty(capacity, np.int64)
        self._log_fill = 0
        self._log_tombstones = 0
        # Purged ranges, by width, as stacks of start positions: new operations of that width reuse them, so
        # the log does not grow (nor need compacting) while the number of watched operations is steady.
        self._free_ranges: dict[int, np.ndarray] = {}
        self._free_range_count: dict[int, int] = {}
        self._op_log_start = np.zeros(0, np.int64)  # per timer slot: first log position of its op
        self._op_log_width = np.zeros(0, np.int64)  # per timer slot: number of keys (0 = object op)
        self._completed_backlog: list[tuple[np.ndarray, np.ndarray]] = []  # (starts, widths) since last purge
        self._objects: dict[int, DelayedOperation] = {}
        self._object_watchers: dict[object, list[DelayedOperation]] = {}
        self._dirty_keys: set = set()
        self._watched = 0
        self.purges = 0
        self.completed = 0
        self.expired = 0
        self.callback_errors = 0

    @classmethod
    def configured(cls, name: str, config: PurgatoryConfig, wheel: WheelConfig, start_ms: int) -> "Purgatory":
        """A purgatory with the node's settings (NodeConfig.timer)."""
        return cls(name, config.purge_interval, wheel.tick_ms, wheel.wheel_size, start_ms,
                   log_initial_capacity=config.log_initial_capacity, log_compaction_slack=config.log_compaction_slack,
                   wheel_initial_capacity=wheel.initial_capacity, bucket_initial_capacity=wheel.bucket_initial_capacity,
                   compaction_slack=wheel.compaction_slack)

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

    @property
    def watcher_log_size(self) -> int:
        """Batch watcher entries held (live, completed-unpurged and tombstones)."""
        return self._log_fill

    def next_expiration(self) -> int | None:
        """The earliest bucket expiration (ms) holding a pending operation, for the owner's sleep timeout."""
        return self._timer.next_expiration()

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

    # ----------------------------------------------------------------- object operations
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
        self._ensure_slot_capacity()
        op._handle = handle
        self._op_log_width[handle & SLOT_MASK] = 0
        self._objects[handle] = op
        watchers = self._object_watchers
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
        """Complete an object operation now (satisfied); True only for the call that completed it."""
        if op._purgatory is not self and op._purgatory is not None:
            raise ValueError(f"operation belongs to purgatory {op._purgatory.name!r}, not {self.name!r}")
        if op._completed:
            return False
        op._completed = True
        if op._handle != NO_HANDLE:
            self._timer.cancel(op._handle)
            self._objects.pop(op._handle, None)
            self._dirty_keys.update(op._keys)
        self.completed += 1
        self._call(op, op.on_complete)
        self._maybe_purge()
        return True

    def check_and_complete(self, key) -> int:
        """Re-run try_complete of the object operations watching key; returns how many completed."""
        ops = self._object_watchers.pop(key, None)
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
        added_meanwhile = self._object_watchers.pop(key, None)  # a callback may have watched this key again
        if added_meanwhile:
            survivors.extend(added_meanwhile)
        if survivors:
            self._object_watchers[key] = survivors
        self._maybe_purge()
        return completed

    def watcher_count(self, key) -> int:
        """Object operations currently listed under key (pending or completed-not-yet-purged)."""
        return len(self._object_watchers.get(key, ()))

    # ----------------------------------------------------------------- batch operations
    def _ensure_slot_capacity(self) -> None:
        needed = self._timer.capacity
        have = len(self._op_log_start)
        if have < needed:
            for name in ("_op_log_start", "_op_log_width"):
                grown = np.zeros(needed, np.int64)
                grown[:have] = getattr(self, name)
                setattr(self, name, grown)

    def watch_many(self, key_ids, deadlines_ms) -> np.ndarray:
        """Watch a batch: row i of key_ids (shape (k, w), or (k,) for one key each) holds the integer key ids of
        operation i, deadlines_ms[i] its deadline. Returns the k operation ids (int64)."""
        keys = np.asarray(key_ids)
        if keys.ndim == 1:
            keys = keys[:, None]
        deadlines = _as_int64_array("deadlines_ms", deadlines_ms)
        if keys.ndim != 2 or keys.shape[0] != len(deadlines) or keys.shape[1] < 1:
            raise ValueError(f"key_ids must have shape ({len(deadlines)}, w>=1), got {keys.shape}")
        if keys.size and keys.dtype.kind not in "iu":
            raise TypeError(f"key_ids must hold integers, got dtype {keys.dtype}")
        count, width = keys.shape
        if count == 0:
            return np.empty(0, np.int64)
        ids = self._timer.add_many(deadlines)
        self._ensure_slot_capacity()
        slots = ids & SLOT_MASK
        free = self._free_range_count.get(width, 0)
        reused = min(count, free)
        if reused:  # purged ranges of this width first
            starts = self._free_ranges[width][free - reused : free].copy()
            self._free_range_count[width] = free - reused
            self._log_tombstones -= reused * width
            positions = (starts[:, None] + np.arange(width, dtype=np.int64)).ravel() if width > 1 else starts
            self._log_keys[positions] = keys[:reused].ravel()
            self._log_ops[positions] = np.repeat(ids[:reused], width) if width > 1 else ids[:reused]
        if reused < count:  # the rest at the end of the log
            start = self._log_fill
            end = start + (count - reused) * width
            if end > len(self._log_ops):
                self._grow_log(end)
            self._log_keys[start:end] = keys[reused:].ravel()
            self._log_ops[start:end] = np.repeat(ids[reused:], width) if width > 1 else ids[reused:]
            self._log_fill = end
            appended = np.arange(start, end, width, dtype=np.int64)
            starts = appended if not reused else np.concatenate((starts, appended))
        self._op_log_start[slots] = starts
        self._op_log_width[slots] = width
        self._watched += count
        self._maybe_purge()
        return ids

    def _grow_log(self, needed: int) -> None:
        capacity = doubled(len(self._log_ops), needed)
        for name in ("_log_keys", "_log_ops"):
            grown = np.empty(capacity, np.int64)
            grown[: self._log_fill] = getattr(self, name)[: self._log_fill]
            setattr(self, name, grown)

    def _finish_batch(self, ids: np.ndarray) -> None:
        """Bookkeeping for ops that just left the timer: remember their log entries for the next purge."""
        slots = ids & SLOT_MASK
        self._completed_backlog.append((self._op_log_start[slots], self._op_log_width[slots]))

    def _complete_objects(self, ids: np.ndarray, expired: bool) -> None:
        objects = self._objects
        for handle in ids.tolist():
            op = objects.pop(handle, None)
            if op is None or op._completed:
                continue
            op._completed = True
            self._dirty_keys.update(op._keys)
            self._call(op, op.on_complete)
            if expired:
                self._call(op, op.on_expiration)

    def force_complete_many(self, ids) -> int:
        """Complete a batch of operations (satisfied) by id; returns how many this call completed."""
        ids = _as_int64_array("ids", ids)
        if len(ids) == 0:
            return 0
        done = ids[self._timer.cancel_many(ids)]
        if len(done) == 0:
            return 0
        self._finish_batch(done)
        if self._objects:
            self._complete_objects(done, expired=False)
        self.completed += len(done)
        self._maybe_purge()
        return len(done)

    def advance_many(self, now_ms: int) -> np.ndarray:
        """Advance the clock to now_ms (monotonic ms); expires what is due; returns the expired ids."""
        expired = self._timer.advance(now_ms)
        if len(expired):
            self._finish_batch(expired)
            if self._objects:
                self._complete_objects(expired, expired=True)
            self.expired += len(expired)
        self._maybe_purge()
        return expired

    def advance(self, now_ms: int) -> int:
        """Advance the clock to now_ms (monotonic ms); returns the number of operations that expired."""
        return len(self.advance_many(now_ms))

    def watched_ids(self, key_id: int) -> np.ndarray:
        """Pending batch operations watching key_id (a scan of the watcher log: O(log size), vectorised)."""
        key_id = _check_int("key_id", key_id, -(1 << 63))
        fill = self._log_fill
        ops = self._log_ops[:fill][self._log_keys[:fill] == key_id]
        ops = ops[ops != TOMBSTONE]
        return ops[self._timer.is_live(ops)]

    # ----------------------------------------------------------------- purge
    def _maybe_purge(self) -> None:
        if self._watched - self._timer.pending > self.purge_interval:
            self.purge()

    def purge(self) -> None:
        """Drop completed operations from every watcher list (normally triggered by the estimate)."""
        self._watched = self._timer.pending  # the proposal: reset the estimate before purging
        self.purges += 1
        if self._completed_backlog:
            backlog = self._completed_backlog
            starts = backlog[0][0] if len(backlog) == 1 else np.concatenate([b[0] for b in backlog])
            widths = backlog[0][1] if len(backlog) == 1 else np.concatenate([b[1] for b in backlog])
            backlog.clear()
            positions = _ranges(starts, widths)
            if len(positions):
                self._log_ops[positions] = TOMBSTONE
                self._log_tombstones += len(positions)
                self._free_purged_ranges(starts, widths)
        if self._log_tombstones > (self._log_fill - self._log_tombstones) + self.log_compaction_slack:
            self._compact_log()
        watchers = self._object_watchers
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

    def _free_purged_ranges(self, starts: np.ndarray, widths: np.ndarray) -> None:
        """Push the start of every purged range onto the free stack of its width."""
        first = int(widths[0])
        if int(widths.min()) == first == int(widths.max()):
            groups = [(first, starts)]
        else:
            groups = [(int(w), starts[widths == w]) for w in np.unique(widths) if w > 0]
        for width, group in groups:
            if width == 0:
                continue
            count = self._free_range_count.get(width, 0)
            stack = self._free_ranges.get(width)
            if stack is None or count + len(group) > len(stack):
                grown = np.empty(doubled(64 if stack is None else len(stack), count + len(group)), np.int64)
                if count:
                    grown[:count] = stack[:count]
                stack = self._free_ranges[width] = grown
            stack[count : count + len(group)] = group
            self._free_range_count[width] = count + len(group)

    def _compact_log(self) -> None:
        """Squeeze tombstones out of the batch watcher log, keeping order (each op's entries stay contiguous)."""
        fill = self._log_fill
        ops = self._log_ops[:fill]
        keep = ops != TOMBSTONE
        old_positions = np.flatnonzero(keep)
        kept_ops = ops[keep]
        count = len(kept_ops)
        self._log_keys[:count] = self._log_keys[:fill][keep]
        self._log_ops[:count] = kept_ops
        slots = kept_ops & SLOT_MASK
        first = old_positions == self._op_log_start[slots]
        self._op_log_start[slots[first]] = np.flatnonzero(first)
        self._log_fill = count
        self._log_tombstones = 0
        self._free_range_count.clear()  # the purged ranges are gone
