"""acks=all produces kept as arrays: the timer's batch path for the produces that wait for the group commit.

An acks=all produce waits until each partition it wrote is fsync'd up to the offset its batch ended at. As a
Python object in the produce purgatory each cost a DelayedProduce, watcher list entries, a wheel add() and a
callback chain when a flush round lands: about 30 us of the timer loop's 45 us per produce (issue 57, profiled
with cProfile on the thread's CPU clock). Here a drain's run of DELAY_PRODUCE frames is arrays
(shm.messages.delay_produce_records: each frame's request id and deadline, its items' rows and required offsets as
a row of a 2-D array, row -1 past its own items), and:
- arrival: the flushed offsets of every item are read at once (PartitionTable.read_field_rows); produces already
  durable are answered at once, the rest go into the wheel in one add_many() call, and the caller asks the
  flusher for a round (one request for the run);
- a flush round's report: every waiting produce is checked again in one pass (a handful of numpy calls over the
  waiting ones, however many rows the round synced); the done ones leave the wheel in one cancel_many() and are
  answered in one COMPLETION batch per worker;
- a deadline: the wheel's fired handles are checked once more (a round may have landed since the last report),
  then answered SATISFIED, FAILED or EXPIRED;
- cancel (the client left): O(1) by key.
Completion has the per-operation path's meaning (node.timer.delayed.DelayedProduce): an item is done when its row
is fsync'd to its offset, or when a flush round that started after the produce arrived failed on its row; a
produce is done when all its items are; it is answered FAILED (KAFKA_STORAGE_ERROR) if an item is done by
failure alone, else SATISFIED.

Invariants (after every public call), beside node.timer.array_waits':
- `waiting[slot]` is True exactly for the slots of `keys`' handles, and only waiting slots are checked;
- every produce added here completes exactly once (SATISFIED, FAILED or EXPIRED) or is cancelled (no answer);
- never answered SATISFIED before each of its rows' flushed offset (the shared table's, which the flusher sets
  after the fsync) reached its required offset.
"""

from __future__ import annotations

import numpy as np

from shmbroker.node.timer.array_waits import ArrayWaits
from shmbroker.node.timer.wheel import SLOT_MASK
from shmbroker.node.storage.records import ErrorCode
from shmbroker.shm import messages as M
from shmbroker.shm.table import FLUSHED_OFFSET

NO_ROW = -1  # an item column past a produce's own items


class ProduceWaits(ArrayWaits):
    """acks=all produces as arrays under one timing wheel; see the module docstring."""

    PAYLOAD = ArrayWaits.PAYLOAD + (("after_round", np.int64, 0, 0), ("row", np.int64, NO_ROW, 1),
                                    ("required_offset", np.int64, 0, 1), ("waiting", np.bool_, False, 0),
                                    ("handle", np.int64, -1, 0))

    def add(self, worker: int, request_ids: np.ndarray, deadlines: np.ndarray, rows: np.ndarray,
            required: np.ndarray, after_round: int, failed_rows: dict[int, int]) -> int:
        """Wait for these produces of one worker (keys new to the caller and distinct, rows within the table or
        NO_ROW); answer at once those already done. Returns how many wait (then a flush round is wanted)."""
        after = np.full(len(request_ids), after_round, np.int64)
        done, failed = self._outcome(rows, required, after, failed_rows)
        if done.any():
            workers = np.full(int(np.count_nonzero(done)), worker, np.int64)
            self._answer(workers, request_ids[done], failed[done], expired=None)
            self.completed += len(workers)
            wait = ~done
            request_ids, deadlines, rows, required, after = (
                request_ids[wait], deadlines[wait], rows[wait], required[wait], after[wait])
        if not len(request_ids):
            return 0
        handles = self._keep(worker, request_ids, deadlines)
        slots = handles & SLOT_MASK
        payload = self._payload
        self._widen("row", rows.shape[1])
        self._widen("required_offset", rows.shape[1])
        width = rows.shape[1]
        payload["row"][slots] = NO_ROW
        payload["row"][slots, :width] = rows
        payload["required_offset"][slots, :width] = required
        payload["after_round"][slots] = after
        payload["waiting"][slots] = True
        payload["handle"][slots] = handles
        return len(slots)

    def check(self, failed_rows: dict[int, int]) -> int:
        """After a flush report: answer every waiting produce that is now done; returns how many."""
        payload = self._payload
        slots = np.flatnonzero(payload["waiting"])
        if not len(slots):
            return 0
        done, failed = self._outcome(payload["row"][slots], payload["required_offset"][slots],
                                     payload["after_round"][slots], failed_rows)
        if not done.any():
            return 0
        slots, failed = slots[done], failed[done]
        self.timer.cancel_many(payload["handle"][slots])
        payload["waiting"][slots] = False
        workers, request_ids = payload["worker"][slots], payload["request_id"][slots]
        self._forget(workers, request_ids)
        self._answer(workers, request_ids, failed, expired=None)
        self.completed += len(slots)
        return len(slots)

    def advance(self, now_ms: int, failed_rows: dict[int, int]) -> int:
        """Answer every produce whose deadline is due; returns how many."""
        handles = self.timer.advance(now_ms)
        if not len(handles):
            return 0
        slots = handles & SLOT_MASK
        payload = self._payload
        done, failed = self._outcome(payload["row"][slots], payload["required_offset"][slots],
                                     payload["after_round"][slots], failed_rows)
        payload["waiting"][slots] = False
        workers, request_ids = payload["worker"][slots], payload["request_id"][slots]
        self._forget(workers, request_ids)
        self._answer(workers, request_ids, failed, expired=~done)
        self.expired += len(slots)
        return len(slots)

    def _cancelled(self, slot: int) -> None:
        self._payload["waiting"][slot] = False

    def _outcome(self, rows: np.ndarray, required: np.ndarray, after_round: np.ndarray,
                 failed_rows: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Per produce: done (every item fsync'd far enough or failed), and failed (an item done by failure)."""
        present = rows != NO_ROW
        safe_rows = np.where(present, rows, 0)
        reached = self.table.read_field_rows(safe_rows.ravel(), FLUSHED_OFFSET).reshape(rows.shape) >= required
        item_done = reached | ~present
        if failed_rows:  # a storage fault (rare): the rounds that failed on each row, against when each arrived
            failed_round = np.full(rows.shape, -1, np.int64)
            for row, flush_round in failed_rows.items():
                failed_round[safe_rows == row] = flush_round
            item_failed = present & ~reached & (failed_round > after_round[:, None])
            return (item_done | item_failed).all(axis=1), item_failed.any(axis=1)
        return item_done.all(axis=1), np.zeros(len(rows), bool)

    def _answer(self, workers: np.ndarray, request_ids: np.ndarray, failed: np.ndarray,
                expired: np.ndarray | None) -> None:
        statuses = np.full(len(workers), M.Status.SATISFIED, np.int64)
        if expired is not None:
            statuses[expired] = M.Status.EXPIRED
        if failed.any():
            for worker, request_id in zip(workers[failed].tolist(), request_ids[failed].tolist()):
                self.outbox.complete(worker, request_id, M.Status.FAILED, ErrorCode.KAFKA_STORAGE_ERROR)
            keep = ~failed
            workers, request_ids, statuses = workers[keep], request_ids[keep], statuses[keep]
        self._complete(workers, request_ids, statuses)
