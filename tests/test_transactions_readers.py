"""The node's own readers on topics with committed and aborted transactions (written by confluent-kafka's
transactional producer): none hands a control record (COMMIT or ABORT marker) to its caller or counts it as a
record, and under read_committed none hands over the records of an aborted transaction. The raw client's fetch
parsing (what scripts/consumer_perf.py and the other raw benchmarks count), the raw end-to-end consumer of
scripts/e2e_latency.py, and the priority consumer of clients/priority.py. (The `shmbroker` tools read no records:
they show offsets, lag and the coordinator's state.)"""

from __future__ import annotations

import time

import pytest

from shmbroker.clients.priority import CapacityBurstPriorityConsumer, level_topic
from shmbroker.clients import wire
from scripts import e2e_latency
from scripts.harness import rawkafka
from tests.test_quotas import TINY
from tests.test_transactions import CONFIG, TIMEOUT_S, create, transactional

pytestmark = pytest.mark.node
FETCH_VERSION = 11
READ_COMMITTED, READ_UNCOMMITTED = 1, 0


def write_transactions(producer, topic: str, partitions: int) -> tuple[list[bytes], list[bytes]]:
    """Committed and aborted transactions, interleaved, in every partition: (committed values, aborted values)."""
    committed, aborted = [], []
    for round_ in range(3):
        for outcome, values in ((True, committed), (False, aborted)):
            batch = [b"%s-%d-%d" % (b"committed" if outcome else b"aborted", round_, i) for i in range(4 * partitions)]
            producer.begin_transaction()
            for i, value in enumerate(batch):
                producer.produce(topic, value=value, partition=i % partitions)
            if outcome:
                producer.commit_transaction(TIMEOUT_S)
            else:
                assert producer.flush(TIMEOUT_S) == 0
                producer.abort_transaction(TIMEOUT_S)
            values.extend(batch)
    return committed, aborted


@pytest.fixture
def mixed(node_factory):
    """A node and a 2-partition topic `mixed` of committed and aborted transactions."""
    node = node_factory(workers=1, config=CONFIG)
    create(node.bootstrap, "mixed", 2)
    committed, aborted = write_transactions(transactional(node.bootstrap, "mixed-writer"), "mixed", 2)
    return node, committed, aborted


def fetch_all(node, topic: str, partition: int, isolation: int) -> list[tuple[rawkafka.FetchedPartition, memoryview]]:
    """Raw fetches of one partition from offset 0 until an answer brings nothing more (the LSO under read_committed,
    every transaction being ended here): each answer's counts and its body."""
    answers, offset = [], 0
    with rawkafka.RawConnection("127.0.0.1", node.port, timeout_s=TIMEOUT_S) as conn:
        for _ in range(100):
            body = conn.request(rawkafka.FETCH, FETCH_VERSION, rawkafka.fetch_body(
                {topic: {partition: offset}}, max_wait_ms=0, isolation_level=isolation, version=FETCH_VERSION))
            (got,) = rawkafka.parse_fetch_response(FETCH_VERSION, body).partitions
            assert got.error_code == 0
            if got.next_offset is None:
                return answers
            answers.append((got, bytes(body)))
            offset = got.next_offset
    raise AssertionError("more than 100 fetches")


@pytest.mark.parametrize("isolation", [READ_COMMITTED, READ_UNCOMMITTED], ids=["read_committed", "read_uncommitted"])
def test_raw_fetch_counts_count_neither_markers_nor_aborted_records(mixed, isolation):
    node, committed, aborted = mixed
    counts = {"records": 0, "control": 0, "aborted": 0}
    for partition in range(2):
        for got, _ in fetch_all(node, "mixed", partition, isolation):
            counts["records"] += got.record_count
            counts["control"] += got.control_batch_count
            counts["aborted"] += got.aborted_record_count
    assert counts["control"] == 6 * 2  # a marker per transaction per partition
    if isolation == READ_COMMITTED:
        assert (counts["records"], counts["aborted"]) == (len(committed), len(aborted))
    else:
        assert (counts["records"], counts["aborted"]) == (len(committed) + len(aborted), 0)


@pytest.mark.parametrize("isolation", [READ_COMMITTED, READ_UNCOMMITTED], ids=["read_committed", "read_uncommitted"])
def test_the_raw_end_to_end_consumer_hands_over_no_marker_and_no_aborted_record(mixed, isolation):
    node, committed, aborted = mixed
    seen = []
    for partition in range(2):
        offset = 0
        for _, body in fetch_all(node, "mixed", partition, isolation):
            (fetched,) = wire.parse_fetch_response(memoryview(body), 0, FETCH_VERSION).partitions
            values, offset = e2e_latency.fetched_values(fetched, offset)
            seen.extend(bytes(value) for value in values)
    expected = committed if isolation == READ_COMMITTED else committed + aborted
    assert sorted(seen) == sorted(expected)


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_the_priority_consumer_hands_over_no_marker_and_no_aborted_record(node_factory, isolation):
    node = node_factory(workers=1, config=CONFIG)
    for level in range(2):
        create(node.bootstrap, level_topic("jobs", level))
    producer = transactional(node.bootstrap, "jobs-writer")
    expected = []
    for round_ in range(3):
        for commit in (True, False):
            values = [b"%d-%d-%s-%d" % (round_, level, b"c" if commit else b"a", i) for level in range(2) for i in range(5)]
            producer.begin_transaction()
            for value in values:
                producer.produce(level_topic("jobs", int(value.split(b"-")[1])), value=value)
            if commit:
                producer.commit_transaction(TIMEOUT_S)
            else:
                assert producer.flush(TIMEOUT_S) == 0
                producer.abort_transaction(TIMEOUT_S)
            if commit or isolation == "read_uncommitted":
                expected.extend(values)
    config = {"bootstrap.servers": node.bootstrap, "group.id": f"jobs-{isolation}", "isolation.level": isolation,
              "auto.offset.reset": "earliest", "enable.auto.commit": False}
    seen = []
    with CapacityBurstPriorityConsumer(config, levels=2, max_poll_records=7) as consumer:
        consumer.subscribe(["jobs"])
        deadline = time.monotonic() + TIMEOUT_S
        quiet_until = None
        while time.monotonic() < deadline and (quiet_until is None or time.monotonic() < quiet_until):
            for message in consumer.poll(0.5):
                assert message.error() is None, message.error()
                seen.append(message.value())
            if len(seen) >= len(expected) and quiet_until is None:
                quiet_until = time.monotonic() + 2  # anything more (a marker handed over) would come by then
    assert sorted(seen) == sorted(expected)


def test_a_throttled_read_committed_fetch_answers_the_last_stable_offset(node_factory):
    """A throttled fetch carries no records, but its offsets are the partition's: under an open transaction the
    last stable offset is below the high watermark (an answer with LSO = HW, then one with the true LSO, would move
    a read_committed consumer's end back)."""
    node = node_factory(workers=1, config=CONFIG + TINY)
    create(node.bootstrap, "throttled", 1)
    with rawkafka.RawConnection("127.0.0.1", node.port, client_id="loader") as conn:
        conn.call(rawkafka.PRODUCE, 8, rawkafka.produce_body({"throttled": {0: rawkafka.make_batch(50, 1000)}}))
    producer = transactional(node.bootstrap, "throttled-writer")
    producer.begin_transaction()
    producer.produce("throttled", value=b"open")
    assert producer.flush(TIMEOUT_S) == 0  # offset 50, in a transaction left open: LSO 50, HW 51
    fetch = rawkafka.fetch_body({"throttled": {0: 0}}, max_wait_ms=0, isolation_level=READ_COMMITTED,
                                version=FETCH_VERSION)
    answers = []
    with rawkafka.RawConnection("127.0.0.1", node.port, client_id="tiny", timeout_s=TIMEOUT_S) as conn:
        for _ in range(2):  # the first is within quota when asked (and charged five times the quota)
            body = conn.request(rawkafka.FETCH, FETCH_VERSION, fetch)
            answer = wire.parse_fetch_response(memoryview(body), 0, FETCH_VERSION, None)
            (partition,) = answer.partitions
            answers.append((answer.throttle_time_ms > 0, len(partition.records) > 0, partition.high_watermark,
                            partition.last_stable_offset))
    producer.abort_transaction(TIMEOUT_S)
    assert answers == [(False, True, 51, 50), (True, False, 51, 50)], answers
