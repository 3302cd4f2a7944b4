"""The timer process's delayed operations: DelayedFetch and DelayedProduce (Kafka's, on one node).

Invariants:
- An operation is keyed by (worker, request id); the timer keeps at most one live operation per
  key, so a request re-submitted after a timer restart (or delivered twice by a ring) is ignored.
- Conditions are read from the shared partition table, never from a message: the table is the
  truth, flush events only say when to look again (appends are the workers' to check:
  workers.timer_client.delayed). Rows are few per request, so each is read with the table's struct path (numpy's
  fixed cost would dominate), one field at a time.
  * DelayedFetch: the worker's own condition (shm.fetch_condition): bytes appended to the watched
    partitions since the worker read them (end_bytes - start_bytes, summed) reach min_bytes.
  * DelayedProduce: every partition's flushed (fsync'd) offset reaches the offset after the batch, or
    a flush of that partition that started after the produce began to wait failed (a storage fault):
    then it completes FAILED, and no later flush can make it succeed.
- Completion (satisfied or expired) sends exactly one completion frame to the owning worker;
  the worker builds the response itself from the table and the logs.
"""

from __future__ import annotations

from typing import Callable

from shmbroker.node.timer.purgatory import DelayedOperation
from shmbroker.shm.fetch_condition import FetchCondition
from shmbroker.shm.table import FLUSHED_OFFSET, PartitionTable

# (operation, expired) -> None; called once per operation
CompletionSink = Callable[["TimerOperation", bool], None]


class TimerOperation(DelayedOperation):
    __slots__ = ("worker", "request_id", "rows", "table", "sink", "_seen_satisfied")

    def __init__(self, worker: int, request_id: int, rows: list[int], table: PartitionTable,
                 sink: CompletionSink) -> None:
        self.worker = worker
        self.request_id = request_id
        self.rows = rows
        self.table = table
        self.sink = sink
        self._seen_satisfied = False  # try_complete saw the condition hold: on_complete need not look again

    @property
    def key(self) -> tuple[int, int]:
        return (self.worker, self.request_id)

    def watch_keys(self) -> list[int]:
        return list(dict.fromkeys(self.rows))

    def on_complete(self) -> None:
        # on_expiration runs after on_complete (Kafka's order): the condition itself tells expiry.
        self.sink(self, not (self._seen_satisfied or self.satisfied()))

    def satisfied(self) -> bool:
        raise NotImplementedError

    def try_complete(self) -> bool:
        if self.satisfied():
            self._seen_satisfied = True
            return self.force_complete()
        return False


class DelayedFetch(TimerOperation):
    __slots__ = ("condition",)

    def __init__(self, worker: int, request_id: int, condition: FetchCondition, table: PartitionTable,
                 sink: CompletionSink) -> None:
        super().__init__(worker, request_id, [row for row, *_ in condition.watch], table, sink)
        self.condition = condition

    def satisfied(self) -> bool:
        return self.condition.satisfied(self.table)


class DelayedProduce(TimerOperation):
    __slots__ = ("required_offsets", "failed_rows", "after_round")

    def __init__(self, worker: int, request_id: int, rows: list[int], required_offsets: list[int],
                 table: PartitionTable, sink: CompletionSink, failed_rows: dict[int, int] | None = None,
                 after_round: int = 0) -> None:
        super().__init__(worker, request_id, rows, table, sink)
        self.required_offsets = required_offsets
        # Row -> the last flush round that failed on it (kept by the service); only rounds that started
        # after `after_round` (when this produce began to wait) count against it.
        self.failed_rows = failed_rows if failed_rows is not None else {}
        self.after_round = after_round

    def _row_failed(self, row: int) -> bool:
        return self.failed_rows.get(row, -1) > self.after_round

    def satisfied(self) -> bool:
        """Done: each row flushed far enough, or failed (see failed())."""
        read = self.table.read_field
        return all(read(row, FLUSHED_OFFSET) >= required or self._row_failed(row)
                   for row, required in zip(self.rows, self.required_offsets))

    def failed(self) -> bool:
        read = self.table.read
        return any(self._row_failed(row) and read(row).flushed_offset < required
                   for row, required in zip(self.rows, self.required_offsets))


class DelayedTimeout(TimerOperation):
    """A wait that only time ends (a throttled client's): it completes, expired, at its deadline, unless
    cancelled first."""

    __slots__ = ()

    def __init__(self, worker: int, request_id: int, table: PartitionTable, sink: CompletionSink) -> None:
        super().__init__(worker, request_id, [], table, sink)

    def watch_keys(self) -> list:
        return [("timeout", self.worker, self.request_id)]

    def satisfied(self) -> bool:
        return False


class DelayedFlush(DelayedProduce):
    """A wait of the timer process itself (not of a worker's request) until rows are fsync'd to the given
    offsets: the durable offset commits of the group coordinator. `done(flushed, fault)` is called once:
    flushed False at the deadline or when a flush round failed on a row (a commit whose fsync failed is not
    durable), fault True in that second case."""

    __slots__ = ("done",)

    def __init__(self, rows: list[int], required_offsets: list[int], table: PartitionTable,
                 done: Callable[[bool, bool], None], failed_rows: dict[int, int] | None = None,
                 after_round: int = 0) -> None:
        super().__init__(-1, 0, rows, required_offsets, table,
                         lambda op, expired: done(not expired and not op.failed(), op.failed()), failed_rows,
                         after_round)
