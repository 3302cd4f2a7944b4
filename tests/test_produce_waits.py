"""The timer's array path of acks=all produces (node.timer.produce_waits) against its per-operation path.

Two DelayedOperations on one real shared partition table, each answering through its own real completion rings
(two workers): one takes every run of DELAY_PRODUCE frames on the array path (delay_produces), the other decodes
and delays them one by one. Random runs of produces (of one to three partitions, some already durable, duplicates,
a row beyond the table), flush rounds that move rows' flushed offsets and report them, rounds that fail on rows
(a storage fault), cancels and clock steps: both must send the same completions (request id, status, error code)
to the same worker at the same clock step, never SATISFIED before every row is flushed far enough, each exactly
once, and keep the same counters.
"""

from __future__ import annotations

import contextlib

import pytest
from test_fetch_waits import Side as FetchSide
from test_fetch_waits import START_MS, same_counters, two_sides

from shmbroker.shm import messages as M

ROWS = 4
WORKERS = 2
STEPS = 60
SEEDS = 12


class Side(FetchSide):
    with_errors = True


def one_by_one(side: Side, worker: int, frames: list[bytes]) -> None:
    """The per-operation path, as the timer loop runs it: a frame on a row beyond the table is dropped (logged)."""
    for frame in frames:
        with contextlib.suppress(IndexError):
            side.ops.delay_produce(worker, M.decode(frame))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_the_array_path_answers_as_the_per_operation_path_does(seed):
    with two_sides("pw", Side, seed) as (table, pair):
        batch, single, rng, now = pair.batch, pair.single, pair.rng, START_MS
        appended = [0] * ROWS  # offsets the produces wait for are below this; flushed_offset moves toward it
        rounds = 0
        waits: dict[tuple[int, int], tuple[int, list[tuple[int, int]]]] = {}  # key -> deadline, items
        array_path_runs = 0
        for _ in range(STEPS):
            worker = rng.randrange(WORKERS)
            frames = []
            for _ in range(rng.choice([0, 1, 3, 8, 20])):
                rows = rng.sample(range(ROWS + (1 if rng.random() < 0.01 else 0)), rng.choice([1, 1, 2, 3]))
                items = []
                for row in rows:
                    if row < ROWS and rng.random() < 0.8:
                        appended[row] += rng.choice([1, 5])
                    items.append((row, appended[row] if row < ROWS else 1))
                request_id = pair.request_id(worker, not frames)
                deadline = now + rng.choice([-5, 0, 1, 3, 10, 50, 400])
                frames.append(M.encode(M.Kind.DELAY_PRODUCE, request_id, deadline, items=items))
                waits.setdefault((worker, request_id), (deadline, items))
            if frames:
                views = [memoryview(frame) for frame in frames]
                if batch.ops.delay_produces(worker, views):
                    array_path_runs += 1
                else:
                    one_by_one(batch, worker, frames)
                one_by_one(single, worker, frames)
            event = rng.random()
            if event < 0.4:  # a flush round: some rows fsync'd, some or all of the way
                rounds += 1
                rows = rng.sample(range(ROWS), rng.randint(1, ROWS))
                for row in rows:
                    flushed = table.read(row).flushed_offset
                    table.update(row, flushed_offset=rng.randint(flushed, appended[row]))
                for side in (batch, single):
                    side.ops.flusher.rounds_started = rounds
                    side.ops.flushed(rows)
            elif event < 0.5:  # a round that fails on a row
                rounds += 1
                rows = [rng.randrange(ROWS)]
                for side in (batch, single):
                    side.ops.flusher.rounds_started = rounds
                    side.ops.flush_failed(rounds, rows)
            elif event < 0.6 and waits:  # a cancel, of a waiting produce or one already answered
                pair.cancel(waits)
            now += rng.choice([0, 1, 2, 10, 100])
            for key, status in pair.step(now, seed):
                deadline, items = waits[key]
                if status == M.Status.EXPIRED:
                    assert now >= deadline, f"{key} expired before its deadline"
                if status == M.Status.SATISFIED:
                    assert all(table.read(row).flushed_offset >= offset for row, offset in items), key
        same_counters(batch.ops.produces, batch.ops.produce_waits, single.ops.produces)
        assert array_path_runs > 0  # the test exercised the array path


def test_a_run_decodes_as_its_frames_do():
    frames = [M.encode(M.Kind.DELAY_PRODUCE, 7, 1000, items=[(3, 55)]),
              M.encode(M.Kind.DELAY_PRODUCE, 8, 2000, items=[(1, 5), (2, 9)]),
              M.encode(M.Kind.DELAY_PRODUCE, 9, 3000, items=[(0, 1)])]
    request_ids, deadlines, rows, required = M.delay_produce_records([memoryview(f) for f in frames])
    for position, frame in enumerate(frames):
        message = M.decode(frame)
        assert request_ids[position] == message.request_id and deadlines[position] == message.deadline_ms
        width = len(message.items)
        assert list(zip(rows[position, :width].tolist(), required[position, :width].tolist())) == message.items
        assert (rows[position, width:] == -1).all()
    assert M.delay_produce_records([memoryview(frames[0][:-1])]) is None  # a torn frame: one by one, decode() says
    assert M.delay_produce_records([memoryview(M.encode(M.Kind.DELAY_PRODUCE, 1, 1, items=[]))]) is None


def test_a_frame_takes_the_array_path_of_its_kind_and_an_empty_one_none():
    from shmbroker.node.timer.process import _batch_path

    produce = M.encode(M.Kind.DELAY_PRODUCE, 1, 1000, items=[(0, 5), (1, 6)])
    one_fetch = M.encode_delay_fetch(2, 1000, 1, [(0, 0, -1)])
    two_fetches = M.encode(M.Kind.DELAY_FETCH, 3, 1000, 1, items=[(0, 0, -1), (1, 0, -1)])
    cancel = M.encode(M.Kind.CANCEL, items=[(1,)])
    assert [_batch_path(memoryview(f)) for f in (produce, one_fetch, two_fetches, cancel, b"")] == [
        M.Kind.DELAY_PRODUCE, M.Kind.DELAY_FETCH, None, None, None]  # b"": a bad frame, dropped with a log line
