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
The wheel, the payload arrays and the keys are node.timer.array_waits' (shared with acks=all produces).
No watcher lists: the fetch purgatory's were never walked (appends are the workers' to notice:
workers.timer_client.delayed), so nothing is lost by keeping none.

Invariants (after every public call), beside node.timer.array_waits':
- a key is never both here and in the service's per-operation map (the caller checks).
- Every fetch added here completes exactly once: expired or satisfied at its deadline (one completion to its
  worker), or cancelled (none).
- Never early: a fetch is answered at its deadline's tick or later (the wheel's I1), unless the caller ran it on
  the per-operation path at arrival because it may already be satisfied.
"""

from __future__ import annotations

import numpy as np

from shmbroker.node.timer.array_waits import ArrayWaits
from shmbroker.node.timer.wheel import SLOT_MASK
from shmbroker.shm import messages as M
from shmbroker.shm.fetch_condition import FetchCondition
from shmbroker.shm.table import END_BYTES


class FetchWaits(ArrayWaits):
    """Single-partition delayed fetches as arrays under one timing wheel; see the module docstring."""

    PAYLOAD = ArrayWaits.PAYLOAD + (("row", np.int64, 0, 0), ("start_bytes", np.int64, 0, 0),
                                    ("min_bytes", np.int64, 0, 0), ("stable_from", np.int64, 0, 0))

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
            slots = self._keep(worker, records["request_id"], records["deadline_ms"]) & SLOT_MASK
            payload = self._payload
            payload["row"][slots] = rows
            payload["start_bytes"][slots] = starts
            payload["min_bytes"][slots] = min_bytes
            payload["stable_from"][slots] = records["stable_from"]
        return np.flatnonzero(maybe)

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
        self._forget(workers, request_ids)
        self._complete(workers, request_ids, statuses)
        self.expired += count
        return count
