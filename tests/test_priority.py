"""Priority topics: the capacity-burst split of the design document (seed 002) as unit tests with its exact
numbers, the node's priority-aware Fetch at the protocol level and through a plain librdkafka consumer, and
the client-side PriorityProducer / CapacityBurstPriorityConsumer against a live node."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from shmbroker.clients.priority import (CapacityBurst, CapacityBurstPriorityConsumer, PriorityProducer,
                                        exponential_shares, level_of, level_topic)
from scripts.harness import rawkafka as R
from tests.test_clients import create_topic
from shmbroker.workers.api import priority as node_priority

PRODUCE, FETCH = 0, 1
LEVELS = 3
RECORD_BYTES = 100
RECORDS_PER_BATCH = 5
GROUPS = "[groups]\ninitial_rebalance_delay_ms = 50\nmin_session_timeout_ms = 500\n"
SPLIT_OFF = "[priority]\nfetch_split = false\n"


# -- the split and the burst rule (the design's numbers) ---------------------------------------------------

def test_exponential_shares_are_the_designs():
    assert exponential_shares(3, 50) == {2: 29, 1: 14, 0: 7}
    assert exponential_shares(3, 10) == {2: 7, 1: 2, 0: 1}
    assert exponential_shares(3, 7) == {2: 4, 1: 2, 0: 1}
    assert exponential_shares(1, 5) == {0: 5}
    with pytest.raises(ValueError):
        exponential_shares(3, 6)


def burst_after(windows: dict[int, list[int]]) -> dict[int, int]:
    burst = CapacityBurst(LEVELS, 50)
    for poll in range(6):
        burst.record({level: counts[poll] for level, counts in windows.items()})
    return burst.capacities()


@pytest.mark.parametrize("windows, capacities", [
    # Case 1: everyone maxed out, no one gives: the shares stay.
    ({2: [29] * 6, 1: [14] * 6, 0: [7] * 6}, {2: 29, 1: 14, 0: 7}),
    # Case 2: level 1 fell short in 3 polls (under the threshold of 4) but reached 14 within the window.
    ({2: [29] * 6, 1: [14, 14, 14, 11, 10, 9], 0: [7] * 6}, {2: 29, 1: 14, 0: 7}),
    # Case 3: level 1 never needed more than 10: level 2 takes 14 - 10 = 4.
    ({2: [29] * 6, 1: [10, 10, 7, 10, 9, 0], 0: [7] * 6}, {2: 33, 1: 14, 0: 7}),
    # Case 4: levels 2 and 1 are short, level 0 maxed out: 7 + (29 - 25) + (14 - 10) = 15.
    ({2: [20, 25, 25, 20, 15, 10], 1: [10, 10, 7, 10, 9, 0], 0: [7] * 6}, {2: 29, 1: 14, 0: 15}),
])
def test_capacity_burst_worked_cases(windows, capacities):
    assert burst_after(windows) == capacities


def test_level_topic_names():
    assert level_topic("orders", 2) == "orders.p2"
    assert level_of("orders.p2") == ("orders", 2)
    assert level_of("my.topic.p10") == ("my.topic", 10)
    assert level_of("orders") is None and level_of("orders.px") is None


def test_node_grant_splits_lends_and_never_exceeds_what_a_level_has():
    assert node_priority.grant(70, {0: 100, 1: 100, 2: 100}) == {0: 10, 1: 20, 2: 40}
    assert node_priority.grant(70, {0: 100, 1: 0, 2: 0}) == {0: 70, 1: 0, 2: 0}  # a lone backlog: everything
    # Level 2 has only 5: its unused 35 go to the higher of the levels with more (level 1), then level 0.
    assert node_priority.grant(70, {0: 100, 1: 100, 2: 5}) == {0: 10, 1: 55, 2: 5}
    assert node_priority.grant(70, {0: 3, 2: 100}) == {0: 3, 2: 67}  # levels 0 and 2 only: weights 1 and 4


# -- the node's priority-aware Fetch ----------------------------------------------------------------------

def make_backlog(node, family: str, batches_per_level: dict[int, int]) -> None:
    """Level topics of one partition each, holding that many batches of 5 x 100-byte records, produced raw
    (one batch per request, pipelined)."""
    for level in range(LEVELS):
        create_topic(node.bootstrap, level_topic(family, level), partitions=1)
    batch = R.make_batch(RECORDS_PER_BATCH, RECORD_BYTES)
    with R.RawConnection("127.0.0.1", node.port) as conn:
        for level, batches in batches_per_level.items():
            frame = R.encode_request(PRODUCE, 8, 0, R.produce_body({level_topic(family, level): {0: batch}}))
            for start in range(0, batches, 200):
                conn.send_frames([(PRODUCE, 8, frame)] * min(200, batches - start))
                for _ in range(min(200, batches - start)):
                    conn.recv_response()


def fetch_levels(conn, family: str, offsets: dict[int, int], max_bytes: int, order=(0, 1, 2)) -> dict:
    """One Fetch v11 over the levels in `order`: {level: FetchedPartition}."""
    body = R.fetch_body({level_topic(family, level): {0: offsets[level]} for level in order},
                        max_wait_ms=0, max_bytes=max_bytes, partition_max_bytes=1 << 20)
    result = R.parse_fetch_response(11, conn.request(FETCH, 11, body))
    return {level_of(part.topic)[1]: part for part in result.partitions}


@pytest.mark.parametrize("workers", [1, 2])
def test_one_fetch_splits_its_budget_across_levels_exponentially(node_factory, workers):
    node = node_factory(workers=workers)
    make_backlog(node, "jobs", {0: 600, 1: 600, 2: 600})  # about 370 kB per level
    budget = 140_000
    with R.RawConnection("127.0.0.1", node.port) as conn:
        offsets = {0: 0, 1: 0, 2: 0}
        for _ in range(4):  # level 2 takes 80 kB a fetch: four fetches keep every level in backlog
            parts = fetch_levels(conn, "jobs", offsets, budget)
            total = sum(part.records_bytes for part in parts.values())
            assert total <= budget
            for level, part in parts.items():
                expected = budget * (1 << level) / 7
                assert abs(part.records_bytes - expected) <= 0.1 * expected, (level, part.records_bytes)
                offsets[level] = part.next_offset
        # Asked highest level first, the same split: it is the node's, not the request order's.
        parts = fetch_levels(conn, "jobs", offsets, budget, order=(2, 1, 0))
        assert abs(parts[0].records_bytes - budget / 7) <= 0.1 * budget / 7


def test_level_0_gets_data_in_every_fetch_while_it_has_a_backlog(node_factory):
    node = node_factory(workers=1)
    make_backlog(node, "jobs", {0: 60, 1: 600, 2: 600})
    with R.RawConnection("127.0.0.1", node.port) as conn:
        offsets = {0: 0, 1: 0, 2: 0}
        small_budget = 2_000  # about 3 batches: less than one batch for level 0 by share
        for _ in range(100):  # 60 fetches drain level 0
            if offsets[0] >= 60 * RECORDS_PER_BATCH:
                break
            parts = fetch_levels(conn, "jobs", offsets, small_budget)
            assert all(part.batch_count >= 1 for part in parts.values())  # KIP-74 for every level
            for level, part in parts.items():
                offsets[level] = part.next_offset
        # Level 0 drained; the others still take the budget between them.
        parts = fetch_levels(conn, "jobs", offsets, 70_000)
        assert parts[0].records_bytes == 0
        assert parts[2].records_bytes + parts[1].records_bytes >= 60_000
        assert parts[2].records_bytes > parts[1].records_bytes


def test_a_lone_backlog_gets_the_whole_budget(node_factory):
    node = node_factory(workers=1)
    make_backlog(node, "jobs", {0: 600})
    with R.RawConnection("127.0.0.1", node.port) as conn:
        parts = fetch_levels(conn, "jobs", {0: 0, 1: 0, 2: 0}, 100_000)
    assert 100_000 - 700 <= parts[0].records_bytes <= 100_000  # all but less than one batch
    assert parts[1].records_bytes == parts[2].records_bytes == 0


def test_without_the_split_levels_are_ordinary_topics_read_in_request_order(node_factory):
    node = node_factory(workers=1, config=SPLIT_OFF)
    make_backlog(node, "jobs", {0: 600, 1: 600, 2: 600})
    with R.RawConnection("127.0.0.1", node.port) as conn:
        parts = fetch_levels(conn, "jobs", {0: 0, 1: 0, 2: 0}, 100_000)
    assert parts[0].records_bytes >= 99_000  # the first partition asked takes the budget, as in Kafka
    assert parts[1].records_bytes == parts[2].records_bytes == 0


def levels_of_first_records(node, family: str, count: int) -> dict[int, int]:
    """A plain confluent-kafka consumer assigned every level: how many of its first `count` records came from
    each level."""
    consumer = Consumer({
        "bootstrap.servers": node.bootstrap, "group.id": "plain", "enable.auto.commit": False,
        "fetch.max.bytes": 140_000, "message.max.bytes": 100_000, "max.partition.fetch.bytes": 1 << 20,
    })
    consumer.assign([TopicPartition(level_topic(family, level), 0, 0) for level in range(LEVELS)])
    counts = {level: 0 for level in range(LEVELS)}
    deadline = time.monotonic() + 30
    try:
        while sum(counts.values()) < count and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=count - sum(counts.values()), timeout=1):
                assert message.error() is None, message.error()
                counts[level_of(message.topic())[1]] += 1
    finally:
        consumer.close()
    assert sum(counts.values()) == count
    return counts


def test_a_plain_consumer_drains_high_priority_first_without_starving_low(node_factory):
    node = node_factory(workers=1)
    make_backlog(node, "jobs", {0: 1000, 1: 1000, 2: 1000})  # 5000 records a level
    first = 3500  # about three fetches of 140 kB: every level still has a backlog
    counts = levels_of_first_records(node, "jobs", first)
    for level, count in counts.items():
        expected = first * (1 << level) / 7
        assert abs(count - expected) <= 0.1 * expected, counts


# -- the client side --------------------------------------------------------------------------------------

def test_priority_producer_and_capacity_burst_consumer(node_factory):
    node = node_factory(workers=2, config=GROUPS)
    backlog = {2: 900, 1: 900, 0: 70}
    for level in range(LEVELS):
        create_topic(node.bootstrap, level_topic("tasks", level), partitions=2)
    config = {"bootstrap.servers": node.bootstrap, "group.id": "workers", "auto.offset.reset": "earliest",
              "session.timeout.ms": 6000, "enable.auto.commit": False, "fetch.wait.max.ms": 100}
    seen: set[bytes] = set()
    polls: list[dict[int, int]] = []
    with CapacityBurstPriorityConsumer(config, levels=LEVELS, max_poll_records=50) as consumer:
        consumer.subscribe(["tasks"])
        # The backlog goes in once every level's consumer holds its partitions (joining members rebalance
        # the group, and a level without its partitions yet would lend its share to the others).
        deadline = time.monotonic() + 30
        while len(consumer.assignment()) < 2 * LEVELS and time.monotonic() < deadline:
            assert consumer.poll(timeout=0.1) == []
        assert len(consumer.assignment()) == 2 * LEVELS
        producer = PriorityProducer({"bootstrap.servers": node.bootstrap, "linger.ms": 5}, levels=LEVELS)
        for level, count in backlog.items():
            for i in range(count):
                producer.produce("tasks", value=f"{level}:{i}".encode(), priority=level)
        assert producer.flush(30) == 0
        with pytest.raises(ValueError):
            producer.produce("tasks", b"x", priority=LEVELS)
        # Every level's consumer fetches its backlog in the background meanwhile (a fetch waiting on an empty
        # log is answered by the append): the polls below see all levels from the first one.
        time.sleep(1.0)
        deadline = time.monotonic() + 60
        while len(seen) < sum(backlog.values()) and time.monotonic() < deadline:
            capacities = consumer.burst.capacities()
            records = consumer.poll(timeout=1.0)
            counts = {level: 0 for level in range(LEVELS)}
            for record in records:
                assert record.error() is None, record.error()
                level = level_of(record.topic())[1]
                assert record.value().startswith(f"{level}:".encode())
                assert record.value() not in seen
                seen.add(record.value())
                counts[level] += 1
            assert all(counts[level] <= capacities[level] for level in counts)
            if records:
                polls.append(counts)
        consumer.commit()
    assert len(seen) == sum(backlog.values())
    assert {2: 29, 1: 14, 0: 7} in polls  # the plain split while every level has a backlog
    # Once level 0 ran dry for a whole window, level 2 bursts into its 7: 29 + 7.
    assert any(poll[2] == 36 for poll in polls), polls
    # The commit is the group's: a new member of the group finds nothing left.
    with CapacityBurstPriorityConsumer(config, levels=LEVELS, max_poll_records=50) as again:
        again.subscribe(["tasks"])
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert again.poll(timeout=0.5) == []


@pytest.mark.parametrize("body, message", [
    ("[priority]\nmax_levels = 1\n", "priority.max_levels: must be in 2..30 (2^levels weights), got 1"),
    ('[priority]\nfetch_split = "yes"\n', "priority.fetch_split must be bool, got 'yes'"),
])
def test_an_invalid_priority_config_is_refused_with_file_key_and_reason(tmp_path, body, message):
    from tests.test_quotas import test_an_invalid_quota_config_is_refused_with_file_key_and_reason as refused

    refused(tmp_path, body, message)
