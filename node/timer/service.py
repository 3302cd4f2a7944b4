"""The delayed-operation service of the timer process: long-poll fetches and acks=all produces in their
purgatories, completed by flushes and deadlines, answered through the outbox.

Invariants:
- Exactly one live operation per (worker, request id), in `operations`, in `fetch_waits` (the array path of
  one-partition long polls, node.timer.fetch_waits) or in `produce_waits` (of acks=all produces,
  node.timer.produce_waits), never two of them: duplicates (a re-submission after a timer restart, a frame
  delivered twice after a consumer crash) are ignored.
- Every operation completes once, satisfied or expired, and yields exactly one completion to its
  worker; a cancelled operation (its connection closed) yields none.
- A delayed fetch is completed here at its deadline, or at once if its condition already holds when it
  arrives; the appends that satisfy it are the workers' to notice (workers.timer_client.delayed: the worker answers
  and sends CANCEL). Conditions are read from the shared partition table (node.timer.delayed); flushes
  only say which rows to look at again.
- A flush round that fails on a row (a storage fault) completes the produces waiting on it that began
  before the round did, FAILED with KAFKA_STORAGE_ERROR; a later successful flush of the row clears it.
"""

from __future__ import annotations

from typing import Any

from shmbroker.node.config import NodeConfig
from shmbroker.node.timer.delayed import DelayedFetch, DelayedFlush, DelayedProduce, DelayedTimeout, TimerOperation
from shmbroker.node.timer.fetch_waits import FetchWaits
from shmbroker.node.timer.flusher import Flusher
from shmbroker.node.timer.outbox import Outbox
from shmbroker.node.timer.produce_waits import ProduceWaits
from shmbroker.node.timer.purgatory import Purgatory
from shmbroker.node.storage.records import ErrorCode
from shmbroker.shm import messages as M
from shmbroker.shm.fetch_condition import FetchCondition
from shmbroker.shm.table import PartitionTable


class DelayedOperations:
    def __init__(self, config: NodeConfig, table: PartitionTable, outbox: Outbox, flusher: Flusher,
                 now_ms: int) -> None:
        self.table = table
        self.outbox = outbox
        self.flusher = flusher
        timer = config.timer
        self.fetches = Purgatory.configured("fetch", timer.purgatory, timer.wheel, now_ms)
        self.produces = Purgatory.configured("produce", timer.purgatory, timer.wheel, now_ms)
        self.throttles = Purgatory.configured("throttle", timer.purgatory, timer.wheel, now_ms)
        self.fetch_waits = FetchWaits(table, outbox, timer.wheel, now_ms)  # one-partition fetches, as arrays
        self.produce_waits = ProduceWaits(table, outbox, timer.wheel, now_ms)  # acks=all produces, as arrays
        self.operations: dict[tuple[int, int], TimerOperation] = {}
        self.cancelled: set[tuple[int, int]] = set()
        self.failed_rows: dict[int, int] = {}  # row -> last flush round that failed on it

    # -- messages from workers --------------------------------------------------------------------

    def delay_fetch(self, worker: int, message: Any) -> None:
        op = DelayedFetch(worker, message.request_id, FetchCondition(message.items, message.min_bytes), self.table,
                          self._completed)
        self._watch(self.fetches, op, message.deadline_ms)

    def delay_fetches(self, worker: int, frames: list) -> bool:
        """A run of DELAY_FETCH frames of one worker, on the array path (node.timer.fetch_waits); False, with
        nothing done, unless every frame is a one-partition DELAY_FETCH on a row of the table with a key new to
        the timer and to the run (then the caller decodes them one by one)."""
        records = M.delay_fetch_records(frames)
        if records is None or not self._new_keys(worker, records["request_id"]) \
                or int(records["row"].max()) >= self.table.rows:
            return False
        for position in self.fetch_waits.add(worker, records).tolist():
            record = records[position]
            self.delay_fetch(worker, M.DelayFetch(int(record["request_id"]), int(record["deadline_ms"]),
                                                  int(record["min_bytes"]),
                                                  [(int(record["row"]), int(record["start_bytes"]),
                                                    int(record["stable_from"]))], None))
        return True

    def delay_produces(self, worker: int, frames: list) -> bool:
        """A run of DELAY_PRODUCE frames of one worker, on the array path (node.timer.produce_waits); False, with
        nothing done, unless every frame is a well-formed DELAY_PRODUCE on rows of the table with a key new to the
        timer and to the run (then the caller decodes them one by one)."""
        decoded = M.delay_produce_records(frames)
        if decoded is None:
            return False
        request_ids, deadlines, rows, required = decoded
        if not self._new_keys(worker, request_ids) or int(rows.max()) >= self.table.rows:
            return False
        if self.produce_waits.add(worker, request_ids, deadlines, rows, required, self.flusher.rounds_started,
                                  self.failed_rows):
            self.flusher.request()
        return True

    def _new_keys(self, worker: int, request_ids) -> bool:
        """The (worker, request id) keys are distinct and none waits here yet."""
        keys = list(zip([worker] * len(request_ids), request_ids.tolist()))
        return (len(set(keys)) == len(keys) and self.operations.keys().isdisjoint(keys)
                and self.fetch_waits.keys.keys().isdisjoint(keys) and self.produce_waits.keys.keys().isdisjoint(keys))

    def delay_produce(self, worker: int, message: Any) -> None:
        op = DelayedProduce(worker, message.request_id, [row for row, _ in message.items],
                            [offset for _, offset in message.items], self.table, self._completed,
                            self.failed_rows, self.flusher.rounds_started)
        self._want_flush(op)
        self._watch(self.produces, op, message.deadline_ms)

    def delay_throttle(self, worker: int, message: Any) -> None:
        """THROTTLE: answer (expired) at the deadline; the worker then unmutes or sends what it held back."""
        self._watch(self.throttles, DelayedTimeout(worker, message.request_id, self.table, self._completed),
                    message.deadline_ms)

    def cancel(self, worker: int, message: Any) -> None:
        for (request_id,) in message.items:
            op = self.operations.get((worker, request_id))
            if op is not None:
                self.cancelled.add(op.key)
                op.force_complete()
            elif not self.fetch_waits.cancel(worker, request_id):
                self.produce_waits.cancel(worker, request_id)

    def wait_flushed(self, rows: list[int], required_offsets: list[int], deadline_ms: int, done,
                     urgent: bool = False) -> None:
        """The timer process's own wait (not a worker's): done(True) once every row is fsync'd to its offset,
        done(False) at the deadline. Flushed by the group commit, as acks=all produces are, or, `urgent`, at once
        beside it (node.timer.flusher: a few small rows on a client's path)."""
        op = DelayedFlush(rows, required_offsets, self.table, done, self.failed_rows, self.flusher.rounds_started)
        if urgent and not op.satisfied():
            self.flusher.sync_now(rows)
        else:
            self._want_flush(op)
        self.produces.try_complete_else_watch(op, op.watch_keys(), deadline_ms)

    # -- events of the timer process --------------------------------------------------------------

    def flushed(self, rows: list[int]) -> None:
        """A flush report's synced rows: their faults are over; what waits on them is checked once the whole
        report is applied (a produce on two of its rows is judged on both)."""
        for row in rows:
            self.failed_rows.pop(row, None)
        self._check_produces(rows)

    def flush_failed(self, flush_round: int, rows: list[int]) -> None:
        for row in rows:
            self.failed_rows[row] = flush_round
        self._check_produces(rows)

    def _check_produces(self, rows: list[int]) -> None:
        for row in rows:
            self.produces.check_and_complete(row)
        if rows:
            self.produce_waits.check(self.failed_rows)

    def advance(self, now_ms: int) -> None:
        for purgatory in (self.fetches, self.produces, self.throttles):
            purgatory.advance(now_ms)
        self.fetch_waits.advance(now_ms)
        self.produce_waits.advance(now_ms, self.failed_rows)

    def next_expiration(self) -> int | None:
        deadlines = [d for p in (self.fetches, self.produces, self.throttles, self.fetch_waits, self.produce_waits)
                     if (d := p.next_expiration()) is not None]
        return min(deadlines) if deadlines else None

    # -- internals --------------------------------------------------------------------------------

    def _watch(self, purgatory: Purgatory, op: TimerOperation, deadline_ms: int) -> None:
        if op.key in self.operations or op.key in self.fetch_waits.keys or op.key in self.produce_waits.keys:
            # a re-submission, or a frame twice
            return
        self.operations[op.key] = op
        purgatory.try_complete_else_watch(op, op.watch_keys(), deadline_ms)

    def _completed(self, op: TimerOperation, expired: bool) -> None:
        self.operations.pop(op.key, None)
        if op.key in self.cancelled:
            self.cancelled.discard(op.key)
            return
        if isinstance(op, DelayedProduce) and op.failed():
            self.outbox.complete(op.worker, op.request_id, M.Status.FAILED, ErrorCode.KAFKA_STORAGE_ERROR)
        else:
            self.outbox.complete(op.worker, op.request_id, M.Status.EXPIRED if expired else M.Status.SATISFIED)

    def _want_flush(self, op: DelayedProduce) -> None:
        """Something waits on its rows' fsync: the group commit starts a round at once if none is in flight
        (else the next one, right after it, carries this too). Nothing is asked if they are fsync'd already."""
        if not op.satisfied():
            self.flusher.request()
