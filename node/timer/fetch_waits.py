"""Delayed fetches of one partition each, kept as arrays: the timer's batch path for a drain's run of long polls.

A consumer's long poll usually watches one partition. Under load the timer reads about a hundred such DELAY_FETCH
frames per loop turn (docs/benchmarks.md, issue 57); as Python objects in the fetch purgatory each cost a
DelayedFetch, a FetchCondition, a watcher list entry, a wheel add() and a callback chain at expiry, about 19 us in
all. Here a run of them is one structured array (shm.messages.delay_fetch_records), and:
- arrival: the rows' end_bytes are read for the whole run at once (PartitionTable.read_rows); a fetch whose row
  grew since the worker's read (or whose min_bytes is already met) is not waited for here but handed back to the
  caller, which runs the purgatory's per-operation path (it answers at once, and knows read_committed);
- the rest go into this class's own timing wheel in one add_many() call; their payload (worker, request id, row,
  start_bytes, min_bytes, stable_from) lives in arrays indexed by the wheel slot of their handle;
- expiry: the wheel's fired handles index those arrays; the condition is read again for all of them at once
  (an append can land between a worker's last look and the deadline: such a fetch is answered SATISFIED, as
  the purgatory's on_complete does), read_committed ones whose row grew through the one-row FetchCondition; then
  one complete_many() per worker (node.timer.outbox: its COMPLETION frames);
- cancel (the worker answered by itself, or the client left): O(1), by the (worker, request id) key.
No watcher lists: the fetch purgatory's were never walked (appends are the workers' to notice:
workers.timer_client.delayed), so nothing is lost by keeping none.

Invariants (after every public call):
- `keys` maps every waiting fetch's (worker, request id) to its live wheel handle, and only those: the wheel's
  pending == len(keys); a key is never both here and in the service's per-operation map (the caller checks).
- Every fetch added here completes exactly once: expired or satisfied at its deadline (one completion to its
  worker), or cancelled (none).
- Never early: a fetch is answered at its deadline's tick or later (the wheel's I1), unless the caller ran it on
  the per-operation path at arrival because it may already be satisfied.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from shmbroker.node.config import WheelConfig
from shmbroker.node.timer.outbox import Outbox
from shmbroker.node.timer.wheel import SLOT_MASK, TimingWheel, doubled
from shmbroker.shm import messages as M
from shmbroker.shm.fetch_condition import FetchCondition
from shmbroker.shm.table import END_BYTES, PartitionTable

_PAYLOAD = (("worker", np.int64), ("request_id", np.uint64), ("row", np.int64), ("start_bytes", np.int64),
            ("min_bytes", np.int64), ("stable_from", np.int64))


class FetchWaits:
    """Single-partition delayed fetches as arrays under one timing wheel; see the module docstring."""

    def __init__(self, table: PartitionTable, outbox: Outbox, wheel: WheelConfig, now_ms: int) -> None:
        self.table = table
        self.outbox = outbox
        self.timer = TimingWheel(wheel.tick_ms, wheel.wheel_size, now_ms, initial_capacity=wheel.initial_capacity,
                                 bucket_initial_capacity=wheel.bucket_initial_capacity,
                                 compaction_slack=wheel.compaction_slack)
        self.keys: dict[tuple[int, int], int] = {}  # (worker, request id) -> wheel handle
        self._payload = {name: np.zeros(self.timer.capacity, dtype) for name, dtype in _PAYLOAD}
        # The purgatory's counters: completed before the deadline (here: cancelled), and reached it (answered
        # EXPIRED, or SATISFIED when an append came since the worker's last look).
        self.completed = 0
        self.expired = 0

    @property
    def pending(self) -> int:
        return self.timer.pending

    def next_expiration(self) -> int | None:
        return self.timer.next_expiration()

    def _end_bytes(self, rows: np.ndarray) -> np.ndarray:
        return self.table.read_field_rows(rows, END_BYTES)

    def add(self, worker: int, records: np.ndarray) -> np.ndarray:
        """Wait for the fetches of `records` (DELAY_FETCH_ONE records of one worker, keys new to the caller and
        distinct, rows within the table) that may not be satisfied yet; returns the positions of the others
        (their row grew since the read, or min_bytes <= 0), for the per-operation path."""
        rows = records["row"].astype(np.int64)
        starts = records["start_bytes"]
        min_bytes = records["min_bytes"].astype(np.int64)
        maybe = (self._end_bytes(rows) > starts) | (min_bytes <= 0)
        wait = ~maybe
        if not wait.all():
            records, rows, starts, min_bytes = records[wait], rows[wait], starts[wait], min_bytes[wait]
        if len(records):
            handles = self.timer.add_many(records["deadline_ms"])
            slots = handles & SLOT_MASK
            self._fit(self.timer.capacity)
            payload = self._payload
            payload["worker"][slots] = worker
            payload["request_id"][slots] = records["request_id"]
            payload["row"][slots] = rows
            payload["start_bytes"][slots] = starts
            payload["min_bytes"][slots] = min_bytes
            payload["stable_from"][slots] = records["stable_from"]
            self.keys.update(zip(zip([worker] * len(records), records["request_id"].tolist()), handles.tolist()))
        return np.flatnonzero(maybe)

    def _fit(self, capacity: int) -> None:
        """Payload arrays as long as the wheel's slot arrays (they grow by doubling together)."""
        if len(self._payload["worker"]) >= capacity:
            return
        for name, dtype in _PAYLOAD:
            old = self._payload[name]
            grown = np.zeros(doubled(len(old), capacity), dtype)
            grown[:len(old)] = old
            self._payload[name] = grown

    def cancel(self, worker: int, request_id: int) -> bool:
        """Drop a waiting fetch without an answer; False if none waits under that key."""
        handle = self.keys.pop((worker, request_id), None)
        if handle is None or not self.timer.cancel(handle):
            return False
        self.completed += 1
        return True

    def advance(self, now_ms: int) -> int:
        """Answer every fetch whose deadline is due, per worker in one batch; returns how many."""
        handles = self.timer.advance(now_ms)
        count = len(handles)
        if not count:
            return 0
        slots = handles & SLOT_MASK
        payload = self._payload
        workers = payload["worker"][slots]
        request_ids = payload["request_id"][slots]
        rows = payload["row"][slots]
        starts = payload["start_bytes"][slots]
        ends = self._end_bytes(rows)
        grown = ends > starts
        satisfied = np.maximum(ends - starts, 0) >= payload["min_bytes"][slots]
        committed = grown & (payload["stable_from"][slots] >= 0)
        for position in np.flatnonzero(committed).tolist():  # read_committed: the LSO decides (rare)
            slot = slots[position]
            satisfied[position] = FetchCondition([(int(rows[position]), int(starts[position]),
                                                   int(payload["stable_from"][slot]))],
                                                 int(payload["min_bytes"][slot])).satisfied(self.table)
        statuses = np.where(satisfied, M.Status.SATISFIED, M.Status.EXPIRED)
        worker_list, id_list = workers.tolist(), request_ids.tolist()
        deque(map(self.keys.__delitem__, zip(worker_list, id_list)), maxlen=0)  # del each key, in C
        if (workers == workers[0]).all():
            self.outbox.complete_many(worker_list[0], id_list, statuses.tolist())
        else:
            for worker in np.unique(workers).tolist():
                mine = workers == worker
                self.outbox.complete_many(worker, request_ids[mine].tolist(), statuses[mine].tolist())
        self.expired += count
        return count

    def describe(self) -> dict[str, Any]:
        return {"pending": self.pending, "completed": self.completed, "expired": self.expired}
