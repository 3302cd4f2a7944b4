"""Topic ids (KIP-516) against a real node: made with the topic, durable, new after a delete, given to the topics
of a catalog written before ids; Metadata v10-12, CreateTopics v7, DeleteTopics v6 and Fetch v13-17 by id, with
UNKNOWN_TOPIC_ID for an id no topic has; librdkafka's describe_topics and consumer see them."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from scripts.harness import rawkafka as R
from shmbroker.workers.codecs import protocol as P

CLIENT_TIMEOUT_S = 20
UNKNOWN_TOPIC_ID = 100
INVALID_REQUEST = 42


def metadata_by_id(conn: R.RawConnection, topic_ids: list[uuid.UUID | None], names: list[str | None] | None = None):
    names = names or [None] * len(topic_ids)
    body = R.request_body(P.METADATA, 12, "MetadataRequest", allow_auto_topic_creation=False,
                          include_topic_authorized_operations=False, topics=tuple(
                              R.request_entity(P.METADATA, 12, "MetadataRequestTopic", name=name, topic_id=topic_id)
                              for name, topic_id in zip(names, topic_ids)))
    return conn.call(P.METADATA, 12, body)


def delete_topics_v6(conn: R.RawConnection, topics: list[tuple[str | None, uuid.UUID | None]]):
    body = R.request_body(P.DELETE_TOPICS, 6, "DeleteTopicsRequest", timeout=R.millis(10_000), topics=tuple(
        R.request_entity(P.DELETE_TOPICS, 6, "DeleteTopicState", name=name, topic_id=topic_id)
        for name, topic_id in topics))
    return conn.call(P.DELETE_TOPICS, 6, body)


def create_topic_v7(conn: R.RawConnection, name: str, partitions: int = 2) -> uuid.UUID:
    created = conn.call(P.CREATE_TOPICS, 7, R.create_topics_body({name: partitions}, version=7))
    (topic,) = created.topics
    assert (topic.name, topic.error_code, topic.num_partitions) == (name, 0, partitions)
    assert topic.topic_id is not None
    return topic.topic_id


def test_ids_are_made_kept_looked_up_and_never_reused(node_factory) -> None:
    node = node_factory(workers=2)
    with R.RawConnection("127.0.0.1", node.port, timeout_s=CLIENT_TIMEOUT_S) as conn:
        first = create_topic_v7(conn, "ids-a")
        second = create_topic_v7(conn, "ids-b")
        assert first != second
        assert R.topic_ids("127.0.0.1", node.port, ["ids-a", "ids-b"]) == {"ids-a": first, "ids-b": second}
        # Metadata v12 by id: the topic's name and partitions; an unknown id: UNKNOWN_TOPIC_ID, no name.
        stranger = uuid.uuid4()
        answer = metadata_by_id(conn, [second, stranger])
        found = {(t.name, t.topic_id, t.error_code, len(t.partitions)) for t in answer.topics}
        assert found == {("ids-b", second, 0, 2), (None, stranger, UNKNOWN_TOPIC_ID, 0)}
        # Metadata v9 still answers by name, and the list of every topic carries ids from v10.
        every = conn.call(P.METADATA, 10, R.metadata_body(None, version=10))
        assert {t.name: t.topic_id for t in every.topics if not t.is_internal} == {"ids-a": first, "ids-b": second}

    node.stop()
    node.start()
    with R.RawConnection("127.0.0.1", node.port, timeout_s=CLIENT_TIMEOUT_S) as conn:
        assert R.topic_ids("127.0.0.1", node.port, ["ids-a", "ids-b"]) == {"ids-a": first, "ids-b": second}
        # DeleteTopics v6: by id, by name; an unknown id and a topic named both ways are refused.
        stranger = uuid.uuid4()
        answer = delete_topics_v6(conn, [(None, first), (None, stranger), ("ids-b", second)])
        results = [(r.name, r.topic_id, r.error_code) for r in answer.responses]
        assert results == [("ids-a", first, 0), (None, stranger, UNKNOWN_TOPIC_ID), ("ids-b", second, INVALID_REQUEST)]
        assert metadata_by_id(conn, [first]).topics[0].error_code == UNKNOWN_TOPIC_ID
        # Created again under the same name: a new id; the old one stays unknown.
        again = create_topic_v7(conn, "ids-a")
        assert again not in (first, second)
        assert delete_topics_v6(conn, [(None, first)]).responses[0].error_code == UNKNOWN_TOPIC_ID
        answer = delete_topics_v6(conn, [("ids-b", None)])
        assert [(r.name, r.topic_id, r.error_code) for r in answer.responses] == [("ids-b", second, 0)]


def test_a_catalog_without_ids_gets_them_once(node_factory, tmp_path) -> None:
    node = node_factory(workers=1)
    with R.RawConnection("127.0.0.1", node.port, timeout_s=CLIENT_TIMEOUT_S) as conn:
        create_topic_v7(conn, "older-a")
        create_topic_v7(conn, "older-b", partitions=1)
        conn.call(P.PRODUCE, 9, R.produce_body({"older-a": {0: R.make_batch(4, 10)}}, acks=1, version=9))
    node.stop()
    catalog_path = node.data_dir / "catalog.json"
    catalog = json.loads(catalog_path.read_text())
    for topic in catalog["topics"].values():
        del topic["id"]  # as an older node wrote it
    catalog_path.write_text(json.dumps(catalog))

    node.start()
    given = R.topic_ids("127.0.0.1", node.port, ["older-a", "older-b", "__consumer_offsets"])
    assert set(given) >= {"older-a", "older-b"} and len(set(given.values())) == len(given)
    stored = json.loads(catalog_path.read_text())["topics"]
    assert {name: uuid.UUID(stored[name]["id"]) for name in given} == given
    node.stop()
    node.start()
    assert R.topic_ids("127.0.0.1", node.port, list(given)) == given
    with R.RawConnection("127.0.0.1", node.port, timeout_s=CLIENT_TIMEOUT_S) as conn:  # the data is still there
        fetched = R.parse_fetch_response(17, conn.request(P.FETCH, 17, R.fetch_body(
            {"older-a": {0: 0}}, max_wait_ms=0, version=17, topic_ids=given)), {given["older-a"].bytes: "older-a"})
        assert [(p.topic, p.error_code, p.record_count) for p in fetched.partitions] == [("older-a", 0, 4)]


@pytest.mark.parametrize("version", range(13, P.SUPPORTED_APIS[P.FETCH][1] + 1))
def test_fetch_by_topic_id(node_factory, version: int) -> None:
    node = node_factory(workers=1)
    with R.RawConnection("127.0.0.1", node.port, timeout_s=CLIENT_TIMEOUT_S) as conn:
        topic_id = create_topic_v7(conn, "by-id")
        conn.call(P.PRODUCE, 9, R.produce_body({"by-id": {1: R.make_batch(5, 10)}}, acks=1, version=9))
        stranger = uuid.uuid4()
        names = {topic_id.bytes: "by-id", stranger.bytes: "stranger"}
        body = R.fetch_body({"by-id": {1: 0, 7: 0}, "stranger": {0: 0}}, max_wait_ms=0, version=version,
                            topic_ids={"by-id": topic_id, "stranger": stranger})
        answer = R.parse_fetch_response(version, conn.request(P.FETCH, version, body), names)
        assert {(p.topic, p.partition, p.error_code, p.record_count) for p in answer.partitions} == {
            ("by-id", 1, 0, 5), ("by-id", 7, 3, 0), ("stranger", 0, UNKNOWN_TOPIC_ID, 0)}
        # A long poll by id waits for the append, as by name.
        body = R.fetch_body({"by-id": {0: 0}}, max_wait_ms=5_000, version=version, topic_ids={"by-id": topic_id})
        waiting = conn.send(P.FETCH, version, body)
        with R.RawConnection("127.0.0.1", node.port, timeout_s=CLIENT_TIMEOUT_S) as producer:
            producer.call(P.PRODUCE, 9, R.produce_body({"by-id": {0: R.make_batch(2, 10)}}, acks=1, version=9))
        correlation_id, _, _, frame = conn.recv_response()
        assert correlation_id == waiting
        answer = R.parse_fetch_response(version, frame, names)
        assert [(p.topic, p.partition, p.record_count) for p in answer.partitions] == [("by-id", 0, 2)]


def test_librdkafka_sees_the_ids_and_consumes_by_them(node_factory) -> None:
    from confluent_kafka import Consumer, Producer, TopicCollection, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    node = node_factory(workers=2)
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    admin.create_topics([NewTopic("rd-ids", 3, 1)])["rd-ids"].result(timeout=CLIENT_TIMEOUT_S)
    described = admin.describe_topics(TopicCollection(["rd-ids"]))["rd-ids"].result(timeout=CLIENT_TIMEOUT_S)
    expected = R.topic_ids("127.0.0.1", node.port, ["rd-ids"])["rd-ids"]
    got = described.topic_id
    mask = (1 << 64) - 1
    assert (got.get_most_significant_bits() & mask) << 64 | got.get_least_significant_bits() & mask == expected.int
    producer = Producer({"bootstrap.servers": node.bootstrap})
    for i in range(300):
        producer.produce("rd-ids", value=b"v%d" % i, partition=i % 3)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "rd-ids", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 100})
    seen = []
    try:
        consumer.assign([TopicPartition("rd-ids", p, 0) for p in range(3)])
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while len(seen) < 300 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                seen.append(msg.value())
    finally:
        consumer.close()
    assert sorted(seen) == sorted(b"v%d" % i for i in range(300))



def test_catalog_keeps_ids_through_save_load_and_restore(tmp_path) -> None:
    from shmbroker.node.storage.catalog import Catalog, topic_id_text

    catalog = Catalog(str(tmp_path), max_partitions=16)
    first = catalog.add_topic("one", 2)
    second = catalog.add_topic("two", 1)
    assert first.topic_id != second.topic_id and first.topic_id.int and second.topic_id.int
    catalog.save()
    loaded = Catalog.load(str(tmp_path), 16)
    assert {name: t.topic_id for name, t in loaded.topics.items()} == {"one": first.topic_id, "two": second.topic_id}
    assert loaded.topic_by_id(first.topic_id).name == "one"
    removed = loaded.remove_topic("one")
    assert loaded.topic_by_id(first.topic_id) is None
    loaded.restore_topic(removed)  # a deletion whose catalog write failed
    assert loaded.topic_by_id(first.topic_id).name == "one"
    assert not any(topic_id_text(t.topic_id).startswith("-") for t in loaded.topics.values())
    # A catalog written before topic ids: each topic gets one, once.
    raw = json.loads((tmp_path / "catalog.json").read_text())
    for topic in raw["topics"].values():
        del topic["id"]
    (tmp_path / "catalog.json").write_text(json.dumps(raw))
    older = Catalog.load(str(tmp_path), 16)
    assert all(t.topic_id is None for t in older.topics.values())
    assert older.assign_missing_ids() == 2 and older.assign_missing_ids() == 0
    assert len({t.topic_id for t in older.topics.values()}) == 2
