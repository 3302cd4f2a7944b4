"""Incremental fetch sessions: the cache's rules (workers.api.fetch_sessions) and a node serving them to a raw
client and to kafka-python (which opens sessions when the node offers Fetch v7+); librdkafka and aiokafka
fetch without sessions and keep doing so."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from confluent_kafka import Consumer

from shmbroker.clients import wire
from scripts.harness import rawkafka as R
from tests.test_clients import CLIENT_TIMEOUT_S, create_topic, produce, produce_values, topic_with_values
from tests.test_node_protocol import connect
from tests.test_stats_cli import stats_json
from tests.waiting import wait_for
from shmbroker.workers.api.fetch_sessions import FetchSessionCache, ForgottenTopic
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs.protocol import FETCH

FETCH_VERSION = 12
STATS = "[stats]\npublish_interval_ms = 100\n"


def request(offsets: dict[tuple[str, int], int], session_id: int = 0, epoch: int = -1, forgotten=(),
            max_wait_ms: int = 0):
    """A kio Fetch v12 request of {(topic, partition): offset} in session (session_id, epoch)."""
    base = wire.fetch_request({wire.TopicPartition(t, p): o for (t, p), o in offsets.items()}, max_wait_ms=max_wait_ms,
                              min_bytes=1, max_bytes=1 << 20, partition_max_bytes=1 << 20, version=FETCH_VERSION)
    schema = wire.request_schema(FETCH, FETCH_VERSION)
    by_topic: dict[str, list[int]] = {}
    for topic, partition in forgotten:
        by_topic.setdefault(topic, []).append(wire.i32(partition))
    return dataclasses.replace(base, session_id=wire.i32(session_id), session_epoch=wire.i32(epoch),
                               forgotten_topics_data=tuple(schema.ForgottenTopic(topic=t, partitions=tuple(p))
                                                           for t, p in by_topic.items()))


def context_of(cache: FetchSessionCache, fetch, version: int = FETCH_VERSION):
    """The cache's context for a kio Fetch request of topics named by name (as the handler passes them)."""
    return cache.context(fetch, version, list(fetch.topics),
                         [ForgottenTopic(t.topic, b"", t.partitions) for t in fetch.forgotten_topics_data])


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def opened(cache: FetchSessionCache, offsets: dict) -> int:
    context = context_of(cache, request(offsets, 0, 0))
    context.answer([])
    return context.session_id


# -- the cache's rules ---------------------------------------------------------------------------


def test_a_full_fetch_opens_a_session_that_incremental_fetches_follow_epoch_by_epoch():
    cache = FetchSessionCache(10, 120_000, worker_index=1, workers=2, clock_ms=Clock())
    session_id = opened(cache, {("t", 0): 0, ("t", 1): 5})
    assert session_id != 0 and session_id % 2 == 1  # it names its worker
    context = context_of(cache, request({}, session_id, 1))
    assert context.incremental and [(t.topic, [p.partition for p in t.partitions]) for t in context.topics()] == \
        [("t", [0, 1])]
    assert context_of(cache, request({}, session_id, 1)).error_code == E.INVALID_FETCH_SESSION_EPOCH
    assert context_of(cache, request({}, session_id + 2, 2)).error_code == E.FETCH_SESSION_ID_NOT_FOUND
    # Epoch 2 moves partition 1 and forgets partition 0.
    context = context_of(cache, request({("t", 1): 9}, session_id, 2, forgotten=[("t", 0)]))
    assert [(p.partition, p.fetch_offset) for t in context.topics() for p in t.partitions] == [(1, 9)]
    # Forgetting the last partition closes the session: the fetch is answered without one.
    context = context_of(cache, request({}, session_id, 3, forgotten=[("t", 1)]))
    assert context.session_id == 0 and not context.incremental and len(cache) == 0
    assert cache.incremental_fetches == 2 and cache.session_errors == 2


def test_an_incremental_fetch_must_name_topics_as_its_session_was_opened():
    """Kafka's FETCH_SESSION_TOPIC_ID_ERROR: the Java client drops from Fetch v13 (topics by id) to v12 when a topic
    of its fetch has no id in its metadata. Taken as incremental, the v12 request's partitions were keyed by name
    beside the session's entries keyed by id: each partition read twice, once at its stale offset (a Kafka Streams
    restore consumer got a batch ending before the offset it asked, which the answer watch caught)."""
    for opened_with, then in ((13, 12), (12, 13)):
        cache = FetchSessionCache(10, 120_000, worker_index=0, workers=1, clock_ms=Clock())
        context = context_of(cache, request({("t", 0): 5}, 0, 0), version=opened_with)
        context.answer([])
        session_id = context.session_id
        context = context_of(cache, request({("t", 0): 6}, session_id, 1), version=then)
        assert context.error_code == E.FETCH_SESSION_TOPIC_ID_ERROR and context.topics() == []
        # The session stays as it was (as Kafka's): its next fetch of the right kind goes on at the same epoch.
        context = context_of(cache, request({("t", 0): 6}, session_id, 1), version=opened_with)
        assert context.incremental and [(p.partition, p.fetch_offset) for t in context.topics()
                                        for p in t.partitions] == [(0, 6)]
        assert cache.session_errors == 1


def test_final_epoch_closes_and_versions_before_7_have_no_sessions():
    cache = FetchSessionCache(10, 120_000, 0, 1, Clock())
    session_id = opened(cache, {("t", 0): 0})
    context = context_of(cache, request({("t", 0): 0}, session_id, -1))
    assert context.session_id == 0 and len(cache) == 0
    assert context_of(cache, request({("t", 0): 0}, 0, 0), 6).answer([]) == [] and len(cache) == 0


def test_an_incremental_answer_carries_only_what_changed():
    from shmbroker.workers.codecs.fetch import FetchPartitionResult, FetchTopicResult

    cache = FetchSessionCache(10, 120_000, 0, 1, Clock())
    full = context_of(cache, request({("t", 0): 0, ("t", 1): 0}, 0, 0))
    full.answer([FetchTopicResult("t", [FetchPartitionResult(0, high_watermark=3, log_start_offset=0),
                                        FetchPartitionResult(1, high_watermark=7, log_start_offset=0)])])

    def answered(partitions) -> list[int]:
        context = context_of(cache, request({}, full.session_id, answered.epoch))
        answered.epoch += 1
        return [p.partition_index for t in context.answer([FetchTopicResult("t", partitions)]) for p in t.partitions]

    answered.epoch = 1
    assert answered([FetchPartitionResult(0, high_watermark=3, log_start_offset=0),
                     FetchPartitionResult(1, high_watermark=7, log_start_offset=0)]) == []
    assert answered([FetchPartitionResult(0, high_watermark=3, log_start_offset=0),
                     FetchPartitionResult(1, high_watermark=8, log_start_offset=0)]) == [1]
    assert answered([FetchPartitionResult(0, error_code=E.UNKNOWN_TOPIC_OR_PARTITION),
                     FetchPartitionResult(1, high_watermark=8, log_start_offset=0)]) == [0]
    # Once recovered, the partition is answered again (its state was forgotten with the error).
    assert answered([FetchPartitionResult(0, high_watermark=3, log_start_offset=0),
                     FetchPartitionResult(1, high_watermark=8, log_start_offset=0)]) == [0]


def test_a_full_cache_evicts_stale_sessions_then_smaller_settled_ones():
    clock = Clock()
    cache = FetchSessionCache(1, 1000, 0, 1, clock)
    first = opened(cache, {("t", 0): 0, ("t", 1): 0})
    assert opened(cache, {("t", 2): 0}) == 0  # no room: the fresh session stays
    clock.now += 1001  # the first is stale now
    second = opened(cache, {("t", 2): 0})
    assert second != 0 and cache.evicted == 1 and context_of(
        cache, request({}, first, 1)).error_code == E.FETCH_SESSION_ID_NOT_FOUND
    clock.now += 500
    context_of(cache, request({}, second, 1))  # used: not stale, but opened over 1000 ms ago
    clock.now += 600
    assert opened(cache, {("u", 0): 0}) == 0  # as large, not larger: the settled one stays
    assert opened(cache, {("u", 0): 0, ("u", 1): 0}) != 0 and cache.evicted == 2  # larger beats a settled smaller
    clock.now += 2000
    assert opened(cache, {("v", 0): 0}) != 0 and cache.evicted == 3  # the other went stale


def test_no_slots_means_no_sessions():
    cache = FetchSessionCache(0, 1000, 0, 1, Clock())
    assert opened(cache, {("t", 0): 0}) == 0 and len(cache) == 0


# -- a node serving them -------------------------------------------------------------------------


def fetch(conn, body) -> R.FetchResult:
    return R.parse_fetch_response(FETCH_VERSION, conn.request(FETCH, FETCH_VERSION, R.encode_body(body)))


@pytest.mark.parametrize("workers", [1, 2])
def test_an_idle_session_long_polls_with_empty_answers_and_wakes_on_an_append(node_factory, workers):
    node = node_factory(workers=workers)
    create_topic(node.bootstrap, "sessions", 3)
    produce(node.bootstrap, "sessions", [{"value": v, "partition": 1} for v in (b"a", b"b")])
    offsets = {("sessions", p): 0 for p in range(3)}
    with connect(node) as conn:
        full = fetch(conn, request(offsets, 0, 0))
        assert full.session_id != 0 and sorted(p.partition for p in full.partitions) == [0, 1, 2]
        assert [p.record_count for p in full.partitions if p.partition == 1] == [2]
        # The client moved partition 1 to 2; nothing changed since: an empty answer once max_wait is up.
        idle = fetch(conn, request({("sessions", 1): 2}, full.session_id, 1, max_wait_ms=200))
        assert (idle.error_code, idle.session_id, idle.partitions) == (0, full.session_id, [])
        conn.send(FETCH, FETCH_VERSION, R.encode_body(request({}, full.session_id, 2, max_wait_ms=30_000)))
        produce(node.bootstrap, "sessions", [{"value": b"c", "partition": 2}])
        woken = R.parse_fetch_response(FETCH_VERSION, conn.recv_response()[3])
        assert [(p.partition, p.record_count) for p in woken.partitions] == [(2, 1)]
        stale = fetch(conn, request({}, full.session_id, 2))
        assert (stale.error_code, stale.partitions) == (E.INVALID_FETCH_SESSION_EPOCH, [])
        unknown = fetch(conn, request({}, full.session_id + workers * 1000, 1))
        assert unknown.error_code == E.FETCH_SESSION_ID_NOT_FOUND


def kafka_python_consume(bootstrap: str, topic: str, expect: int, group: str, then=None) -> list[bytes]:
    """Values kafka-python reads from `topic` until it has `expect`; `then()` runs once half are in (the
    consumer long-polls in its session meanwhile)."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                             fetch_max_wait_ms=100)
    try:
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(values) < expect and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                values.extend(r.value for r in records)
            if then is not None and len(values) >= expect // 2:
                time.sleep(0.5)  # idle long polls
                then()
                then = None
        return values
    finally:
        consumer.close()


def test_kafka_python_consumes_through_a_session(node_factory):
    node = node_factory(workers=2, config=STATS)
    sent = topic_with_values(node.bootstrap, "kp-sessions", 4, "v", 200, produced=100)
    got = kafka_python_consume(node.bootstrap, "kp-sessions", len(sent), "kp",
                               then=lambda: produce_values(node.bootstrap, "kp-sessions", sent[100:]))
    assert sorted(got) == sorted(sent)
    totals = wait_for(lambda: (lambda t: t if t["fetches_incremental"] > 0 else None)(stats_json(node)["totals"]),
                      what="incremental fetches in the stats")
    assert totals["fetch_sessions_opened"] >= 1 and totals["fetch_session_errors"] == 0


def test_sessions_evicted_under_a_small_cache_fall_back_to_full_fetches_unseen(node_factory):
    """One slot, settled after 100 ms: a kafka-python consumer of three partitions evicts the session of one
    reading two; that one gets FETCH_SESSION_ID_NOT_FOUND, falls back to full fetches and still reads every
    record."""
    config = STATS + ("[server]\nmax_incremental_fetch_session_cache_slots = 1\n"
                      "min_incremental_fetch_session_eviction_ms = 100\n")
    node = node_factory(workers=1, config=config)
    sizes = {"small-a": 2, "small-b": 3}
    records = {topic: [{"value": b"%s-%d" % (topic.encode(), i)} for i in range(300)] for topic in sizes}
    for topic, partitions in sizes.items():
        create_topic(node.bootstrap, topic, partitions)
        produce(node.bootstrap, topic, records[topic][:150])

    def totals() -> dict:
        return stats_json(node)["totals"]

    def after_the_eviction() -> None:
        wait_for(lambda: totals()["fetch_sessions_evicted"] >= 1, timeout=60, what="the first session's eviction")
        produce(node.bootstrap, "small-a", records["small-a"][150:])

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(kafka_python_consume, node.bootstrap, "small-a", 300, "g-a", after_the_eviction)
        wait_for(lambda: totals()["fetch_sessions_opened"] >= 1, timeout=60, what="the first session")
        second = pool.submit(kafka_python_consume, node.bootstrap, "small-b", 300, "g-b",
                             lambda: produce(node.bootstrap, "small-b", records["small-b"][150:]))
        values = {"small-a": first.result(timeout=120), "small-b": second.result(timeout=120)}
    assert {t: sorted(v) for t, v in values.items()} == {t: sorted(r["value"] for r in records[t]) for t in records}
    done = wait_for(lambda: (lambda t: t if t["fetch_session_errors"] >= 1 else None)(totals()),
                    what="the evicted session's error in the stats")
    assert done["fetch_sessions_opened"] >= 2 and done["fetch_sessions_evicted"] >= 1


def test_librdkafka_and_aiokafka_fetch_without_sessions(node_factory):
    node = node_factory(workers=1, config=STATS)
    sent = topic_with_values(node.bootstrap, "sessionless", 2, "s", 100, produced=100)
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "rd", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe(["sessionless"])
        got = []
        deadline = 200
        while len(got) < len(sent) and deadline:
            deadline -= 1
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                got.append(message.value())
        assert sorted(got) == sorted(sent)
    finally:
        consumer.close()

    async def aio() -> list[bytes]:
        from aiokafka import AIOKafkaConsumer

        aio_consumer = AIOKafkaConsumer("sessionless", bootstrap_servers=node.bootstrap, group_id="aio",
                                        auto_offset_reset="earliest")
        await aio_consumer.start()
        try:
            out = []
            async with asyncio.timeout(CLIENT_TIMEOUT_S):
                while len(out) < len(sent):
                    for records in (await aio_consumer.getmany(timeout_ms=500)).values():
                        out.extend(r.value for r in records)
            return out
        finally:
            await aio_consumer.stop()

    assert sorted(asyncio.run(aio())) == sorted(sent)
    totals = stats_json(node)["totals"]
    assert totals["fetch_sessions_opened"] == 0 and totals["fetch_session_errors"] == 0
