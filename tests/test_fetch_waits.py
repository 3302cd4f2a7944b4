"""The timer's array path of one-partition long polls (node.timer.fetch_waits) against its per-operation path.

Two DelayedOperations on one real shared partition table, each answering through its own real completion rings
(two workers): one takes every run of DELAY_FETCH frames on the array path (delay_fetches), the other decodes and
delays them one by one, as the timer did before. Random runs of fetches (some of a row that grew since the read,
read_committed ones, duplicates, a row beyond the table), appends and LSO moves, cancels and clock steps: both must
send the same completions (request id, status) to the same worker at the same clock step, never before a
deadline unless the fetch was satisfied on arrival, each exactly once, and keep the same counters.
"""

from __future__ import annotations

import contextlib
import random

import pytest
from shm_testing import fresh_instance

from shmbroker.node.config import NodeConfig
from shmbroker.node.timer.flusher import Flusher
from shmbroker.node.timer.outbox import Outbox
from shmbroker.node.timer.service import DelayedOperations
from shmbroker.shm import instance as shm_instance
from shmbroker.shm import messages as M
from shmbroker.shm.ring import RingConfig, RingReader, RingWriter
from shmbroker.shm.table import PartitionTable

ROWS = 4
WORKERS = 2
STEPS = 40
SEEDS = 12
START_MS = 1_000


class Side:
    """One DelayedOperations with its outbox on real rings, and what its workers received."""

    with_errors = False  # completions as (request id, status), their error codes 0; True: with the error code

    def __init__(self, instance, tag: str, table: PartitionTable, config: NodeConfig, now_ms: int) -> None:
        self.writers, self.readers = [], []
        for worker in range(WORKERS):
            name = instance.create_ring(instance.name(f"{tag}{worker}"), RingConfig(capacity=1 << 20))
            self.writers.append(RingWriter(name))
            self.readers.append(RingReader(name))
        self.outbox = Outbox(self.writers, chunk=7)  # small chunks: complete_many crosses them
        self.ops = DelayedOperations(config, table, self.outbox, Flusher(config, table, lambda: None), now_ms)

    def received(self) -> list[set]:
        self.outbox.flush()
        got = []
        for reader in self.readers:
            items = set()
            for view in reader.read_batch():
                message = M.decode(view)
                assert message.kind == M.Kind.COMPLETION
                for request_id, status, error in message.items:
                    if self.with_errors:
                        items.add((request_id, status, error))
                    else:
                        assert error == 0
                        items.add((request_id, status))
            reader.release()
            got.append(items)
        return got

    def close(self) -> None:
        for end in self.writers + self.readers:
            end.close()


def fetch_frame(request_id: int, deadline_ms: int, min_bytes: int, row: int, start: int, stable_from: int) -> bytes:
    return M.encode(M.Kind.DELAY_FETCH, request_id, deadline_ms, min_bytes, items=[(row, start, stable_from)])


class Pair:
    """The two sides of a differential run, driven alike: request ids (sometimes a frame delivered twice), cancels,
    clock steps whose completions must be the same on both, each answered once (unless submitted twice)."""

    def __init__(self, batch: Side, single: Side, rng: random.Random) -> None:
        self.batch, self.single, self.rng = batch, single, rng
        self.next_id = [1] * WORKERS
        self.answered: set[tuple[int, int]] = set()
        self.resubmitted: set[tuple[int, int]] = set()  # may be answered twice: once completed, a key is new again

    def request_id(self, worker: int, first: bool) -> int:
        request_id = self.next_id[worker]
        if not first and self.rng.random() < 0.05:  # the previous frame again (a frame delivered twice)
            request_id -= 1
            self.resubmitted.add((worker, request_id))
        self.next_id[worker] = request_id + 1
        return request_id

    def cancel(self, keys) -> None:
        """A cancel of one of `keys`, waiting or already answered."""
        cancel_worker, request_id = self.rng.choice(sorted(keys))
        message = M.decode(M.encode(M.Kind.CANCEL, items=[(request_id,)]))
        self.batch.ops.cancel(cancel_worker, message)
        self.single.ops.cancel(cancel_worker, message)

    def step(self, now: int, seed: int) -> list[tuple[tuple[int, int], int]]:
        """Both clocks to `now`: the same completions on both, none twice; returns ((worker, id), status) of each."""
        self.batch.ops.advance(now)
        self.single.ops.advance(now)
        got, want = self.batch.received(), self.single.received()
        assert got == want, (seed, now)
        completed = []
        for worker_index, items in enumerate(got):
            for item in items:
                key = (worker_index, item[0])
                assert key not in self.answered or key in self.resubmitted, f"{key} answered twice"
                self.answered.add(key)
                completed.append((key, item[1]))
        return completed


def same_counters(purgatory, array_path, alone) -> None:
    """The batch side's purgatory and array path together count what the one-by-one side's purgatory does."""
    for counter in ("expired", "completed", "pending"):
        assert getattr(purgatory, counter) + getattr(array_path, counter) == getattr(alone, counter), counter
    assert len(array_path.keys) == array_path.pending


@contextlib.contextmanager
def two_sides(tag: str, side: type[Side], seed: int):
    """A fresh table and the Pair of a batch side and a one-by-one side on it, their clocks at START_MS and their
    random choices seeded: (table, pair)."""
    config = NodeConfig()
    with fresh_instance(tag) as instance:
        table = PartitionTable.create(shm_instance.table_name(instance.instance_id), ROWS)
        batch, single = side(instance, "a", table, config, START_MS), side(instance, "s", table, config, START_MS)
        try:
            yield table, Pair(batch, single, random.Random(seed))
        finally:
            batch.close()
            single.close()
            table.close()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_the_array_path_answers_as_the_per_operation_path_does(seed):
    with two_sides("fw", Side, seed) as (table, pair):
        batch, single, rng, now = pair.batch, pair.single, pair.rng, START_MS
        deadlines: dict[tuple[int, int], int] = {}
        array_path_runs = 0
        for _ in range(STEPS):
            worker = rng.randrange(WORKERS)
            frames = []
            for _ in range(rng.choice([0, 1, 3, 8, 20])):
                row = rng.randrange(ROWS + (1 if rng.random() < 0.01 else 0))  # rarely: beyond the table
                end = table.read(row).end_bytes if row < ROWS else 0
                request_id = pair.request_id(worker, not frames)
                deadline = now + rng.choice([-5, 0, 1, 3, 10, 50, 400])
                stable_from = rng.choice([-1, -1, -1, table.read(row).last_stable_offset if row < ROWS else 0])
                frames.append(fetch_frame(request_id, deadline, rng.choice([0, 1, 1, 100]), row,
                                          end - rng.choice([0, 0, 0, 5]), stable_from))
                key = (worker, request_id)
                deadlines[key] = min(deadline, deadlines.get(key, deadline))  # the earliest of its submissions
            if frames:
                views = [memoryview(frame) for frame in frames]
                if batch.ops.delay_fetches(worker, views):
                    array_path_runs += 1
                else:
                    for frame in frames:
                        batch.ops.delay_fetch(worker, M.decode(frame))
                for frame in frames:
                    single.ops.delay_fetch(worker, M.decode(frame))
            event = rng.random()
            if event < 0.3:  # an append, sometimes to an open transaction only
                row = rng.randrange(ROWS)
                state = table.read(row)
                grows = rng.choice([1, 50, 200])
                in_txn = rng.random() < 0.3
                table.update(row, end_bytes=state.end_bytes + grows, log_end_offset=state.log_end_offset + 1,
                             high_watermark=state.high_watermark + 1,
                             first_unstable_offset=state.high_watermark if in_txn else -1)
            elif event < 0.45 and deadlines:  # a cancel, of a waiting fetch or one already answered
                pair.cancel(deadlines)
            now += rng.choice([0, 1, 2, 10, 100])
            for key, status in pair.step(now, seed):
                if status == M.Status.EXPIRED:
                    assert now >= deadlines[key], f"{key} expired before its deadline"
        same_counters(batch.ops.fetches, batch.ops.fetch_waits, single.ops.fetches)
        assert array_path_runs > 0  # the test exercised the array path
