"""Log compaction in a running node, with real clients and real signals: compacted topics created and altered
through the Kafka API, a producer and a group consumer running through cleanings, tombstones gone after
delete.retention.ms, kill -9 of the cleaner and of every process while it cleans, a full disk during a cleaning,
and the cleaner's figures in the stats."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import threading
import time
import urllib.request

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from scripts.harness.nodeproc import CLI, free_port
from tests import waiting
from tests.small_fs import MiB, fill, tmpfs

pytestmark = pytest.mark.node
TIMEOUT_S = 60
# Normal scheduling: these tests wait for cleanings in bounded time, which SCHED_IDLE does not promise on a
# machine busy with other work (the idle policy is tested on its own below).
CLEANER = '[cleaner]\nbackoff_ms = 200\nscheduling = "normal"\n'
# Small segments (rolls every few batches) and a log due as soon as anything is dirty.
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01"}


def create(bootstrap: str, topic: str, configs: dict[str, str], partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1, config=configs)]).values():
        future.result(timeout=TIMEOUT_S)


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]], **config) -> dict[bytes, tuple]:
    """Each record acknowledged (idempotent, small batches so segments roll); the latest (partition, offset,
    value) per key."""
    latest: dict[bytes, tuple] = {}
    errors = []

    def delivered(err, msg):
        if err is not None:
            errors.append(err)
        else:
            latest[msg.key()] = (msg.partition(), msg.offset(), msg.value())

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 1,
                         "batch.num.messages": 20, **config})
    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0 and not errors, errors
    return latest


def read_from_start(bootstrap: str, topic: str, partitions: int = 1) -> list[tuple[int, int, bytes, bytes | None]]:
    """Every record of the topic from the log start: (partition, offset, key, value), in order per partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{random.random()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.subscribe([topic])
    out, eof = [], set()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(eof) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                eof.add(msg.partition())
                continue
            out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    assert len(eof) == partitions, "the reader did not reach the end"
    return out


def stats(node) -> dict:
    done = subprocess.run([*CLI, "stats", "--data-dir", str(node.data_dir),
                           "--json"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def cleaning_of(node, topic: str, partition: int = 0) -> dict:
    return next(p["cleaning"] for p in stats(node)["partitions"] if (p["topic"], p["partition"]) == (topic, partition))


def wait_for(predicate, what: str, timeout: float = TIMEOUT_S):
    return waiting.wait_for(predicate, timeout, what)


def updates(rounds: int, keys: int, size: int = 40) -> list[tuple[bytes, bytes]]:
    return [(b"key-%d" % k, (b"value-%d-%d-" % (k, r)).ljust(size, b"x")) for r in range(rounds) for k in range(keys)]


def check_compacted(records: list, latest: dict[bytes, tuple], active_from: int | None = None) -> None:
    """Offsets strictly increase; every key read has its latest value somewhere; no deleted key's value is there
    unless it sits after the cleaned part (the active segment holds recent duplicates)."""
    offsets = [offset for _, offset, _, _ in records]
    assert offsets == sorted(set(offsets))
    last_read = {}
    for _, offset, key, value in records:
        last_read[key] = (offset, value)
    for key, (_, offset, value) in latest.items():
        if value is None:
            assert key not in last_read or last_read[key][1] is None
        else:
            assert last_read[key] == (offset, value)


def test_a_producer_and_a_group_consumer_run_through_cleanings(node_factory):
    node = node_factory(workers=2, config=CLEANER)
    create(node.bootstrap, "changelog", COMPACTED)
    seen: list[tuple[int, bytes]] = []
    failures: list = []
    done = threading.Event()

    def consume() -> None:
        consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "follower",
                             "auto.offset.reset": "earliest"})
        consumer.subscribe(["changelog"])
        try:
            while not done.is_set() or consumer.poll(0) is not None:
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    failures.append(msg.error())
                else:
                    seen.append((msg.offset(), msg.key()))
        finally:
            consumer.close()

    follower = threading.Thread(target=consume)
    follower.start()
    latest = {}
    try:
        for batch in range(6):  # rounds of updates while the cleaner works on what came before
            latest.update(produce(node.bootstrap, "changelog", updates(5, 50)[batch * 30:(batch + 1) * 30 + 200]))
            time.sleep(0.3)
        wait_for(lambda: cleaning_of(node, "changelog")["bytes_reclaimed"] > 0, "a cleaning that reclaims bytes")
    finally:
        done.set()
        follower.join(TIMEOUT_S)
    offsets = [offset for offset, _ in seen]
    assert not failures and offsets == sorted(set(offsets)), "no error, no gap it cannot handle, no duplicate"
    records = read_from_start(node.bootstrap, "changelog")
    check_compacted(records, latest)
    assert len(records) < sum(1 for _ in updates(5, 50)), "the log lost superseded records"
    totals = stats(node)["totals"]
    assert totals["cleanings"] > 0 and totals["cleaner_bytes_reclaimed"] > 0 and totals["cleaner_errors"] == 0


def test_tombstones_go_after_delete_retention_and_alter_configs_compacts_a_live_topic(node_factory):
    node = node_factory(workers=1, config=CLEANER + "[stats]\npublish_interval_ms = 100\n")
    metrics_port = free_port()
    node.stop()
    node.start_args = ["--metrics", f"127.0.0.1:{metrics_port}"]
    node.start()
    create(node.bootstrap, "plain", {"segment.bytes": "4096"})
    latest = produce(node.bootstrap, "plain", updates(4, 30))
    latest.update(produce(node.bootstrap, "plain", [(b"key-%d" % k, None) for k in range(10)]))
    latest.update(produce(node.bootstrap, "plain", updates(1, 30)[10:]))  # roll past the tombstones
    assert len(read_from_start(node.bootstrap, "plain")) == 4 * 30 + 10 + 20  # delete policy: nothing cleaned
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    changes = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
               for k, v in {**COMPACTED, "delete.retention.ms": "0"}.items()]
    for future in admin.incremental_alter_configs([ConfigResource("topic", "plain",
                                                                  incremental_configs=changes)]).values():
        future.result(timeout=TIMEOUT_S)
    described = admin.describe_configs([ConfigResource("topic", "plain")])
    configs = next(iter(described.values())).result(timeout=TIMEOUT_S)
    assert configs["cleanup.policy"].value == "compact" and configs["delete.retention.ms"].value == "0"
    assert configs["min.compaction.lag.ms"].is_default

    def tombstones_gone():
        records = read_from_start(node.bootstrap, "plain")
        return records if not any(value is None for *_, value in records[:-25]) else None

    records = wait_for(tombstones_gone, "the tombstones to go")
    check_compacted(records, latest)
    assert not {b"key-%d" % k for k in range(10)} & {key for _, offset, key, _ in records}
    # Prometheus has the partition's cleaning (Kafka-like names) and the cleaner's counters.
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    assert 'kafka_log_cleaner_dirty_ratio{partition="0",topic="plain"}' in text
    assert re.search(r'kafka_log_cleaner_bytes_reclaimed_total\{partition="0",topic="plain"\} [1-9]', text), text
    assert re.search(r'shmbroker_cleanings_total\{index="0",process="cleaner"\} [1-9]', text), text


def test_keyless_records_on_a_compacted_topic_are_refused_invalid_record(node_factory):
    """As Kafka (librdkafka's test 0011): a batch holding keyless records is refused INVALID_RECORD, each of those
    named in the response's record errors, so librdkafka fails them INVALID_RECORD and the rest of the batch
    _INVALID_DIFFERENT_RECORD; batches of one record fail alone."""
    node = node_factory(workers=1, config=CLEANER)
    create(node.bootstrap, "keys-only", COMPACTED)
    for batch_size, expected in ((1 << 20, {"INVALID_RECORD": 10, "_INVALID_DIFFERENT_RECORD": 90}),
                                 (1, {"INVALID_RECORD": 10, None: 90})):
        outcomes: dict = {}
        producer = Producer({"bootstrap.servers": node.bootstrap, "retries": 0, "linger.ms": 50,
                             "batch.size": batch_size})
        for i in range(100):
            key = None if i % 10 == 0 else b"k%d" % i
            producer.produce("keys-only", key=key, value=b"v%d" % i, partition=0, on_delivery=lambda err, msg: (
                outcomes.__setitem__(err.name() if err else None, outcomes.get(err.name() if err else None, 0) + 1)))
        assert producer.flush(TIMEOUT_S) == 0
        assert outcomes == expected


def test_kill_9_of_the_cleaner_and_of_every_process_while_it_cleans_loses_nothing(node_factory):
    # A slow cleaner (1 MB/s): the kills land in the middle of cleanings.
    node = node_factory(workers=1, config=CLEANER + "io_max_bytes_per_second = 1048576\n")
    create(node.bootstrap, "changelog", {**COMPACTED, "segment.bytes": "65536"})
    latest = produce(node.bootstrap, "changelog", updates(20, 500, size=100))
    rng = random.Random(36)
    for round_ in range(6):
        wait_for(lambda: node.pids("cleaner"), "a cleaner")
        time.sleep(rng.uniform(0.2, 1.5))
        if round_ % 2 == 0:
            for pid in node.pids("cleaner"):
                os.kill(pid, signal.SIGKILL)
        else:
            node.kill_all()
            node.start()
        latest.update(produce(node.bootstrap, "changelog", updates(1, 500, size=100)))
    records = read_from_start(node.bootstrap, "changelog")
    check_compacted(records, latest)
    wait_for(lambda: stats(node)["totals"].get("cleanings", 0) > 0, "a new cleaner to finish a cleaning")
    check_compacted(read_from_start(node.bootstrap, "changelog"), latest)
    assert not list(node.data_dir.glob("changelog-0/cleaning"))


def test_a_full_disk_during_a_cleaning_leaves_the_old_segments_and_logs_one_line(node_factory, tmp_path):
    with tmpfs(tmp_path / "small", 24 * MiB) as small:
        node = node_factory(workers=1, config=CLEANER, data_dir=small / "data")
        cleaner, = wait_for(lambda: node.pids("cleaner"), "a cleaner")
        # The cleaner is held (SIGSTOP, well within child_hang_timeout_ms) until the disk is full, so the
        # cleanings the updates make due all meet the full disk, however fast it would have been.
        os.kill(cleaner, signal.SIGSTOP)
        try:
            create(node.bootstrap, "changelog", {**COMPACTED, "segment.bytes": "262144"})
            latest = produce(node.bootstrap, "changelog", updates(30, 400, size=200))
            filler = fill(small)
        finally:
            os.kill(cleaner, signal.SIGCONT)
        try:
            wait_for(lambda: cleaning_of(node, "changelog")["errors"] > 1, "cleanings to fail on the full disk")
            assert node.log().count("cleaning changelog-0 failed") == 1  # one line, however many tries
            check_compacted(read_from_start(node.bootstrap, "changelog"), latest)
            assert not list(node.data_dir.glob("changelog-0/cleaning"))
        finally:
            filler.unlink()
        wait_for(lambda: cleaning_of(node, "changelog")["bytes_reclaimed"] > 0, "a cleaning once there is room")
        check_compacted(read_from_start(node.bootstrap, "changelog"), latest)


@pytest.mark.parametrize("scheduling, policy", [("normal", os.SCHED_OTHER), ("idle", os.SCHED_IDLE)])
def test_the_cleaner_runs_below_the_workers_and_the_timer(node_factory, scheduling, policy):
    node = node_factory(workers=1, config=f'[cleaner]\nscheduling = "{scheduling}"\nnice = 12\n')
    cleaner, = wait_for(lambda: node.pids("cleaner"), "a cleaner")
    assert psutil.Process(cleaner).nice() == 12 and os.sched_getscheduler(cleaner) == policy
    for pid in node.pids("worker") + node.pids("timer"):
        assert psutil.Process(pid).nice() == 0 and os.sched_getscheduler(pid) == os.SCHED_OTHER
