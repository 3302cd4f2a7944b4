"""Shared per-child heartbeats and per-worker connection counts: written by their owners in other
processes, read without locks, and the checks built on them (hang detection, node-wide limits, log marks)."""

from __future__ import annotations

import logging
import multiprocessing

import pytest

from shmbroker.node.logging_setup import RateLimitedLog
from shmbroker.shm import instance as shm_instance
from shmbroker.shm.connections import ConnectionCounts
from shmbroker.shm.heartbeat import HangWatch, HeartbeatTable
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


def test_rate_limited_log_one_line_per_cause_per_interval_shared_by_processes(caplog):
    with fresh_instance("lm") as instance:
        counts = ConnectionCounts.create(shm_instance.connections_name(instance.instance_id), 2, 4)
        try:
            clock = [1000.0]
            logger = logging.getLogger("shmbroker.test_limits")
            causes = ("a", "b")
            one = RateLimitedLog(logger, 60.0, clock=lambda: clock[0], marks=counts.log_marks(causes))
            two = RateLimitedLog(logger, 60.0, clock=lambda: clock[0], marks=counts.log_marks(causes))
            caplog.set_level(logging.WARNING, logger="shmbroker.test_limits")
            assert one.warning("a", "refused %d", 1)
            assert not two.warning("a", "refused %d", 2)  # another process, same cause, same minute
            assert two.warning("b", "other cause")
            clock[0] += 61
            assert two.warning("a", "refused %d", 3)
            messages = [r.getMessage() for r in caplog.records]
            assert messages == ["refused 1", "other cause", "refused 3 (and 1 more like it since the last such line)"]
        finally:
            counts.close()


CLAIM_ROUNDS = 3000


def _claim_rounds(name: str, barrier, wins) -> None:
    counts = ConnectionCounts.attach(name)
    marks = counts.log_marks(("a",))
    try:
        for round_index in range(CLAIM_ROUNDS):
            barrier.wait(30)  # both processes claim the round's mark at the same moment
            if marks.claim("a", 100.0 * (round_index + 1), 50.0):
                with wins.get_lock():
                    wins.value += 1
    finally:
        marks.close()
        counts.close()


def test_two_processes_claiming_a_log_mark_at_once_log_one_line_between_them():
    """Each round both processes claim the same cause at the same moment, an interval after the last round:
    exactly one of them gets it (without the lock both could read the mark unset and both log)."""
    with fresh_instance("lc") as instance:
        name = shm_instance.connections_name(instance.instance_id)
        counts = ConnectionCounts.create(name, 2, 4)
        try:
            barrier, wins = FORK.Barrier(2), FORK.Value("i", 0)
            children = [FORK.Process(target=_claim_rounds, args=(name, barrier, wins)) for _ in range(2)]
            for child in children:
                child.start()
            for child in children:
                child.join(60)
            assert [child.exitcode for child in children] == [0, 0]
            assert wins.value == CLAIM_ROUNDS
        finally:
            counts.close()


def test_config_rejects_a_hang_timeout_below_two_heartbeats():
    from shmbroker.node.config import ConfigError, from_mapping

    with pytest.raises(ConfigError):
        from_mapping({"server": {"child_hang_timeout_ms": 1000, "heartbeat_interval_ms": 1000}})
    config = from_mapping({"server": {"child_hang_timeout_ms": 0, "workers": 4,
                                      "queued_max_request_bytes": 1000}})
    assert config.server.worker_request_bytes() == 250
    assert from_mapping({"server": {"queued_max_request_bytes": -1}}).server.worker_request_bytes() == -1
