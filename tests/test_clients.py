"""Standard Kafka clients against a real node: confluent-kafka (librdkafka), kafka-python, kcat."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

CLIENT_TIMEOUT_S = 30.0


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    futures[name].result(timeout=CLIENT_TIMEOUT_S)


def produce(bootstrap: str, topic: str, records: list[dict], **config) -> list:
    """Produce with confluent-kafka; returns the delivery reports (message objects)."""
    delivered, errors = [], []

    def on_delivery(err, msg):
        (errors if err else delivered).append(err or msg)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    for record in records:
        producer.produce(topic, on_delivery=on_delivery, **record)
        producer.poll(0)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    assert errors == []
    return delivered


def produce_values(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """Keyless records of `values`, each acknowledged."""
    produce(bootstrap, topic, [{"value": value} for value in values])


def topic_with_values(bootstrap: str, topic: str, partitions: int, prefix: str, count: int,
                      produced: int) -> list[bytes]:
    """A new topic and `count` values "<prefix>0", "<prefix>1", ...; the first `produced` of them produced now
    (the rest are the caller's to produce later)."""
    create_topic(bootstrap, topic, partitions)
    values = [f"{prefix}{i}".encode() for i in range(count)]
    produce_values(bootstrap, topic, values[:produced])
    return values


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int, *, at_least: bool = False,
                **config) -> list:
    """Every record from offset 0: exactly `expected` of them, or with `at_least` all there are
    once `expected` arrived and nothing more came for a second (unacknowledged records may be there)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-assign-only",
                         "enable.auto.commit": False, **config})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    quiet_since = time.monotonic()
    deadline = quiet_since + CLIENT_TIMEOUT_S
    while time.monotonic() < deadline and (len(got) < expected or at_least and time.monotonic() - quiet_since < 1):
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            raise KafkaException(msg.error())
        got.append(msg)
        quiet_since = time.monotonic()
    # Nothing more than expected arrives.
    extra = None if at_least else consumer.poll(0.5)
    consumer.close()
    assert extra is None or extra.error() is not None
    return got


def records_for(count: int, prefix: str) -> list[dict]:
    return [{"key": f"k{i}".encode(), "value": f"{prefix}-{i}".encode() * (1 + i % 7),
             "headers": [("h", f"{i}".encode()), ("x", b"")], "timestamp": 1_700_000_000_000 + i,
             "partition": i % 3} for i in range(count)]


def check_roundtrip(sent: list[dict], got: list) -> None:
    by_partition: dict[int, list] = {}
    for msg in got:
        by_partition.setdefault(msg.partition(), []).append(msg)
    for partition, msgs in by_partition.items():
        offsets = [m.offset() for m in msgs]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    expected = {r["key"]: r for r in sent}
    assert len(got) == len(sent)
    for msg in got:
        record = expected.pop(msg.key())
        assert msg.value() == record["value"]
        assert msg.partition() == record["partition"]
        assert msg.timestamp()[1] == record["timestamp"]
        assert [(k, v or b"") for k, v in msg.headers()] == record["headers"]
    assert expected == {}
    # Per partition, records arrive in the order they were produced.
    for partition, msgs in by_partition.items():
        keys = [int(m.key()[1:]) for m in msgs]
        assert keys == sorted(keys)


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_confluent_acks(node, acks):
    create_topic(node.bootstrap, "acks", 3)
    sent = records_for(300, f"acks{acks}")
    delivered = produce(node.bootstrap, "acks", sent, acks=acks)
    assert len(delivered) == len(sent)
    if acks != "0":
        assert all(m.offset() >= 0 for m in delivered)
    check_roundtrip(sent, consume_all(node.bootstrap, "acks", 3, len(sent)))


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_idempotent_compression(node, codec):
    create_topic(node.bootstrap, "codec", 3)
    sent = records_for(500, codec)
    produce(node.bootstrap, "codec", sent, acks="all", **{"enable.idempotence": True, "compression.type": codec})
    check_roundtrip(sent, consume_all(node.bootstrap, "codec", 3, len(sent)))


def test_confluent_seek(node):
    create_topic(node.bootstrap, "seek", 1)
    produce(node.bootstrap, "seek", [{"value": f"v{i}".encode(), "partition": 0} for i in range(100)])
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([TopicPartition("seek", 0, 0)])
    first = consumer.poll(CLIENT_TIMEOUT_S)
    assert first is not None and first.offset() == 0
    consumer.seek(TopicPartition("seek", 0, 42))
    msg = consumer.poll(CLIENT_TIMEOUT_S)
    while msg is not None and msg.offset() < 42:  # records fetched before the seek may still be queued
        msg = consumer.poll(CLIENT_TIMEOUT_S)
    assert msg is not None and msg.offset() == 42 and msg.value() == b"v42"
    low, high = consumer.get_watermark_offsets(TopicPartition("seek", 0), timeout=CLIENT_TIMEOUT_S)
    assert (low, high) == (0, 100)
    consumer.close()


def test_auto_create_on_produce(node):
    produce(node.bootstrap, "auto-created", [{"value": b"hello"}])
    got = consume_all(node.bootstrap, "auto-created", 1, 1)
    assert [m.value() for m in got] == [b"hello"]


def test_kafka_python_roundtrip(node):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition as KTopicPartition

    create_topic(node.bootstrap, "kp", 2)
    producer = KafkaProducer(bootstrap_servers=node.bootstrap, acks="all", linger_ms=5)
    futures = [producer.send("kp", key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2,
                             headers=[("n", str(i).encode())], timestamp_ms=1_600_000_000_000 + i)
               for i in range(200)]
    producer.flush(timeout=CLIENT_TIMEOUT_S)
    metas = [f.get(timeout=CLIENT_TIMEOUT_S) for f in futures]
    producer.close(timeout=CLIENT_TIMEOUT_S)
    assert sorted(m.offset for m in metas if m.partition == 0) == list(range(100))

    consumer = KafkaConsumer(bootstrap_servers=node.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=3000)
    consumer.assign([KTopicPartition("kp", 0), KTopicPartition("kp", 1)])
    got = []
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while len(got) < 200 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            got.extend(records)
    consumer.close()
    assert len(got) == 200
    for rec in got:
        i = int(rec.key[1:])
        assert rec.value == f"v{i}".encode() and rec.partition == i % 2
        assert rec.timestamp == 1_600_000_000_000 + i and rec.headers == [("n", str(i).encode())]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="make test installs kcat; run through make")
def test_kcat(node):
    listing = subprocess.run(["kcat", "-b", node.bootstrap, "-L"], capture_output=True, text=True,
                             timeout=CLIENT_TIMEOUT_S)
    assert listing.returncode == 0, listing.stderr
    assert "1 brokers" in listing.stdout
    lines = "".join(f"line-{i}\n" for i in range(50))
    put = subprocess.run(["kcat", "-b", node.bootstrap, "-P", "-t", "kcat-topic"], input=lines,
                         capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    assert put.returncode == 0, put.stderr
    get = subprocess.run(["kcat", "-b", node.bootstrap, "-C", "-t", "kcat-topic", "-o", "beginning", "-e"],
                         capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    assert get.returncode == 0, get.stderr
    assert get.stdout == lines
    listing = subprocess.run(["kcat", "-b", node.bootstrap, "-L", "-t", "kcat-topic"], capture_output=True,
                             text=True, timeout=CLIENT_TIMEOUT_S)
    assert 'topic "kcat-topic" with 1 partitions' in listing.stdout
