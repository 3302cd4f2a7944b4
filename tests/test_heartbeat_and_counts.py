"""Shared per-child heartbeats and per-worker connection counts: written by their owners in other
processes, read without locks, and the checks built on them (hang detection, node-wide limits, log marks)."""

from __future__ import annotations

import multiprocessing

from shm import instance as shm_instance
from shm.connections import ConnectionCounts
from shm.heartbeat import HangWatch, HeartbeatTable
from tests.shm_testing import fresh_instance

FORK = multiprocessing.get_context("fork")


def _beat(name: str, slot: int, times: int) -> None:
    table = HeartbeatTable.attach(name)
    heartbeat = table.heartbeat(slot, 4242)
    for _ in range(times):
        heartbeat.beat()
    table.close()


def test_a_child_beats_in_its_own_row_and_the_watch_sees_who_stopped():
    with fresh_instance("hb") as instance:
        name = shm_instance.heartbeat_name(instance.instance_id)
        table = HeartbeatTable.create(name, 3)
        try:
            watch = HangWatch(table, hang_timeout_ms=1000, start_timeout_ms=5000)
            for slot in range(3):
                table.claim(slot)
                watch.started(slot, now=100.0)
            child = FORK.Process(target=_beat, args=(name, 1, 500))
            child.start()
            child.join(30)
            assert child.exitcode == 0
            assert table.rows() == [(0, 0), (4242, 500), (0, 0)]
            assert watch.stuck(now=100.5) == []  # slot 1 moved; slots 0 and 2 are still booting
            assert watch.stuck(now=101.4) == []
            stalls = watch.stuck(now=101.6)  # slot 1 silent for 1.1 s after its first beats
            assert [(s.slot, s.pid, s.beats, s.booting) for s in stalls] == [(1, 4242, 500, False)]
            stalls = watch.stuck(now=105.1)  # slots 0 and 2 never beat within the start timeout
            assert sorted((s.slot, s.booting) for s in stalls) == [(0, True), (1, False), (2, True)]
            watch.forget(1)
            table.claim(1)  # the supervisor restarted it
            watch.started(1, now=105.2)
            assert table.beats(1) == 0 and 1 not in [s.slot for s in watch.stuck(now=105.3)]
        finally:
            table.close()


def _count(name: str, worker: int, buckets: list[int]) -> None:
    counts = ConnectionCounts.attach(name)
    row = counts.row(worker)
    for bucket in buckets:
        row.opened(bucket)
    counts.close()


def test_connection_counts_are_per_worker_rows_summed_across_the_node():
    with fresh_instance("cc") as instance:
        name = shm_instance.connections_name(instance.instance_id)
        counts = ConnectionCounts.create(name, workers=2, buckets=64)
        try:
            a, b = counts.bucket_of("127.0.0.1"), counts.bucket_of("127.0.0.2")
            assert counts.bucket_of("127.0.0.1") == a  # the same in every process (crc32, not hash())
            for worker, buckets in ((0, [a, a, b]), (1, [a, b, b, b])):
                child = FORK.Process(target=_count, args=(name, worker, buckets))
                child.start()
                child.join(30)
                assert child.exitcode == 0
            assert counts.total() == 7
            if a != b:
                assert (counts.in_bucket(a), counts.in_bucket(b)) == (3, 4)
            counts.row(1).closed(b)
            assert counts.total() == 6
            counts.reset(1)  # worker 1 died: its connections are gone
            assert counts.total() == 3 and counts.row(0).count == 3
        finally:
            counts.close()
