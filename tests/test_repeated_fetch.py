"""Repeated fetches (workers.api.repeated_fetch): the same Fetch again on a connection reuses its decoded form,
and a sessionless long poll whose first read found nothing waits without reading while its partitions are
unchanged; with raw requests (byte-exact answers) and with real idle consumers (librdkafka, aiokafka)."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer

from shmbroker.node import config as node_config
from scripts.harness import rawkafka as R
from tests.test_clients import CLIENT_TIMEOUT_S, create_topic, produce_values, topic_with_values
from tests.test_node_protocol import FETCH, NONE, PRODUCE, connect
from tests.test_stats_cli import stats_json
from tests.waiting import wait_for
from shmbroker.workers.api.repeated_fetch import RepeatedFetch, RepeatedFetches

STATS = "[stats]\npublish_interval_ms = 100\n"
IDLE_S = 1.5  # a consumer's idle spell: long polls of 100 ms max wait, one after another
IDLE_REPEATS_AT_LEAST = 5  # of the ~15 long polls of an idle spell, well short of all (timing on 2 shared cores)


def test_the_fetches_a_connection_keeps_are_settings_of_0_or_more(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text("[server]\nrepeated_fetches_per_connection = 0\nrepeated_fetch_max_bytes = 0\n")
    server = node_config.load(str(path)).server
    assert (server.repeated_fetches_per_connection, server.repeated_fetch_max_bytes) == (0, 0)
    for setting in ("repeated_fetches_per_connection", "repeated_fetch_max_bytes"):
        path.write_text(f"[server]\n{setting} = -1\n")
        with pytest.raises(node_config.ConfigError, match="repeated_fetch_max_bytes must be 0 or more"):
            node_config.load(str(path))


def test_a_connection_keeps_a_fetch_once_it_comes_again_and_a_few_of_them():
    fetches = RepeatedFetches(limit=2)
    assert not fetches.came_again(11, b"aaaa")
    assert not fetches.came_again(12, b"aaaa")  # the same bytes in another version are another request
    assert fetches.came_again(11, b"aaaa") and fetches.came_again(12, b"aaaa")
    assert not fetches.came_again(11, b"bbbb")  # one more seen: (11, aaaa) is no longer among the last two
    assert not fetches.came_again(11, b"aaaa")
    first, second, third = (RepeatedFetch(11, body, object()) for body in (b"aaaa", b"bbbb", b"cccc"))
    assert fetches.keep(first) is first and fetches.keep(second) is second
    assert fetches.get(11, b"aaaa") is first and fetches.get(11, b"bbbb") is second
    assert fetches.get(12, b"aaaa") is None
    fetches.keep(third)  # a third: the oldest kept goes
    assert fetches.get(11, b"aaaa") is None and fetches.get(11, b"cccc") is third
    again = RepeatedFetch(11, b"bbbb", object())
    fetches.keep(again)
    assert fetches.get(11, b"bbbb") is again and fetches.get(11, b"cccc") is third


@pytest.mark.parametrize("version, per_connection, max_bytes", [(11, 8, 4096), (13, 8, 4096), (11, 0, 4096),
                                                                 (11, 8, 16)])
def test_a_repeated_idle_long_poll_reuses_its_first_read_until_a_partition_moves(node_factory, version,
                                                                                 per_connection, max_bytes):
    """A sessionless Fetch sent again on a connection is kept: from its third sending on it is not decoded again,
    and while its partitions are as its empty first read left them it waits without reading and expires with
    that read's answer, byte for byte (its own correlation id: the client checks it). A partition that moved
    (an append short of min_bytes, during the wait or before the request) is read again: the answer carries
    the record and the new high watermark. With server.repeated_fetches_per_connection = 0, or a body over
    server.repeated_fetch_max_bytes, nothing is kept and every answer is the same."""
    node = node_factory(workers=1, config=STATS + f"[server]\nrepeated_fetches_per_connection = {per_connection}\n"
                                                  f"repeated_fetch_max_bytes = {max_bytes}\n")
    create_topic(node.bootstrap, "repeating", 2)
    time.sleep(0.3)  # the worker learns of the topic

    def counters() -> tuple[int, int, int]:
        totals = stats_json(node)["totals"]
        return (totals.get("fetches_repeated", 0), totals.get("fetches_repeated_idle", 0),
                totals.get("fetches_answered_from_first_read", 0))

    with connect(node) as consumer, connect(node) as producer:
        topic_ids = R.topic_ids("127.0.0.1", node.port, ["repeating"]) if version >= 13 else None
        names = {topic_id.bytes: name for name, topic_id in topic_ids.items()} if topic_ids else None
        body = R.fetch_body({"repeating": {0: 0, 1: 0}}, max_wait_ms=200, min_bytes=10_000_000, version=version,
                            topic_ids=topic_ids)
        kept = 1 if per_connection and len(body) <= max_bytes else 0
        answers = []
        for _ in range(3):
            started = time.monotonic()
            answers.append(bytes(consumer.request(FETCH, version, body)))
            assert time.monotonic() - started >= 0.19
        assert answers[1] == answers[0] and answers[2] == answers[0]
        idle = R.parse_fetch_response(version, answers[0], names)
        assert [(p.partition, p.error_code, p.high_watermark, p.record_count) for p in idle.partitions] == \
            [(0, NONE, 0, 0), (1, NONE, 0, 0)]
        wait_for(lambda: counters() == (kept, kept, 3), what="the third waiting on the first read")

        consumer.send(FETCH, version, body)
        time.sleep(0.1)
        record = R.produce_body({"repeating": {1: R.build_record_batch([b"short of min_bytes"])}}, acks=1)
        assert producer.call(PRODUCE, 8, record).responses[0].partition_responses[0].error_code == NONE
        moved = R.parse_fetch_response(version, consumer.recv_response()[3], names)
        assert [(p.partition, p.error_code, p.high_watermark, p.record_count) for p in moved.partitions] == \
            [(0, NONE, 0, 0), (1, NONE, 1, 1)]
        wait_for(lambda: counters() == (2 * kept, 2 * kept, 3),
                 what="the fourth waited on the first read, then read again")

        again = R.parse_fetch_response(version, consumer.request(FETCH, version, body), names)
        assert [(p.partition, p.high_watermark, p.record_count) for p in again.partitions] == [(0, 0, 0), (1, 1, 1)]
        time.sleep(0.3)  # a publish interval and then some
        assert counters() == (3 * kept, 2 * kept, 3)


def _repeat_counters(node) -> tuple[int, int]:
    totals = stats_json(node)["totals"]
    return totals.get("fetches_repeated_idle", 0), totals.get("fetches_answered_from_first_read", 0)


def _more_idle_repeats(node, before: tuple[int, int]) -> bool:
    after = _repeat_counters(node)
    return all(now - then >= IDLE_REPEATS_AT_LEAST for now, then in zip(after, before))


@pytest.mark.parametrize("workers", [1, 2])
def test_an_idle_librdkafka_consumer_repeats_its_long_polls_and_gets_every_later_record(node_factory, workers):
    node = node_factory(workers=workers, config=STATS)
    sent = topic_with_values(node.bootstrap, "idle-rd", 2, "rd-", 40, produced=20)
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "idle-rd", "auto.offset.reset": "earliest",
                         "fetch.wait.max.ms": 100})
    got: list[bytes] = []

    def poll_for(seconds: float, want: int) -> None:
        deadline = time.monotonic() + seconds
        while len(got) < want and time.monotonic() < deadline:
            message = consumer.poll(0.1)
            if message is not None and not message.error():
                got.append(message.value())

    try:
        consumer.subscribe(["idle-rd"])
        poll_for(CLIENT_TIMEOUT_S, 20)
        assert sorted(got) == sorted(sent[:20])
        before = _repeat_counters(node)
        poll_for(IDLE_S, len(sent))
        assert len(got) == 20
        wait_for(lambda: _more_idle_repeats(node, before), what="the idle consumer's repeated long polls")
        produce_values(node.bootstrap, "idle-rd", sent[20:])
        poll_for(CLIENT_TIMEOUT_S, len(sent))
        assert sorted(got) == sorted(sent)
    finally:
        consumer.close()


def test_an_idle_aiokafka_consumer_repeats_its_long_polls_and_gets_every_later_record(node_factory):
    node = node_factory(workers=1, config=STATS)
    sent = topic_with_values(node.bootstrap, "idle-aio", 2, "aio-", 40, produced=20)

    async def consume() -> tuple[list[bytes], list[bytes], bool]:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer("idle-aio", bootstrap_servers=node.bootstrap, group_id="idle-aio",
                                    auto_offset_reset="earliest", fetch_max_wait_ms=100)
        await consumer.start()
        try:
            async def poll_for(seconds: float, want: int, out: list[bytes]) -> None:
                deadline = time.monotonic() + seconds
                while len(out) < want and time.monotonic() < deadline:
                    for records in (await consumer.getmany(timeout_ms=100)).values():
                        out.extend(r.value for r in records)

            first: list[bytes] = []
            await poll_for(CLIENT_TIMEOUT_S, 20, first)
            before = _repeat_counters(node)
            idle: list[bytes] = []
            await poll_for(IDLE_S, 1, idle)
            deadline = time.monotonic() + CLIENT_TIMEOUT_S
            while not (repeated := _more_idle_repeats(node, before)) and time.monotonic() < deadline:
                await poll_for(0.2, 1, idle)
            produce_values(node.bootstrap, "idle-aio", sent[20:])
            later: list[bytes] = []
            await poll_for(CLIENT_TIMEOUT_S, 20, later)
            return first + idle, later, repeated
        finally:
            await consumer.stop()

    before_idle, later, repeated = asyncio.run(consume())
    assert sorted(before_idle) == sorted(sent[:20])
    assert repeated, "the idle consumer's long polls were not repeats of their first read"
    assert sorted(later) == sorted(sent[20:])
