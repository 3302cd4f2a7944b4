"""Apache Kafka as the node's peer (scripts/harness/kafka_peer.py): the harness starts a real single-node KRaft
broker from the jars Maven fetched, records go round through it with kcat and confluent-kafka, and stopping it
leaves no process and no file."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import psutil
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from scripts.harness.kafka_peer import KafkaPeer

pytestmark = [pytest.mark.node,
              pytest.mark.skipif(shutil.which("kcat") is None, reason="make test installs kcat; run through make")]

TIMEOUT_S = 60


def kcat_round_trip(bootstrap: str, topic: str) -> None:
    lines = "".join(f"record {i}\n" for i in range(5))
    subprocess.run(["kcat", "-b", bootstrap, "-P", "-t", topic], input=lines, text=True, check=True,
                   timeout=TIMEOUT_S)
    got = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
                         capture_output=True, text=True, check=True, timeout=TIMEOUT_S)
    assert got.stdout == lines


def confluent_round_trip(bootstrap: str, topic: str, count: int) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % (i % 7), value=b"value %d" % i)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "peer-test", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            got.append(message.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    return got


@pytest.mark.parametrize("durability", ["page-cache", "fsync"])
def test_the_kafka_peer_serves_kcat_and_confluent_kafka_and_leaves_nothing(durability):
    peer = KafkaPeer(durability)
    try:
        peer.start()
        pid, work = peer.pid, peer.work
        admin = AdminClient({"bootstrap.servers": peer.bootstrap})
        admin.create_topics([NewTopic("records", 3, 1)])["records"].result(TIMEOUT_S)
        # The durability the report names is the broker's: an fsync per append, or the page cache.
        resource = ConfigResource(ConfigResource.Type.TOPIC, "records")
        flush = admin.describe_configs([resource])[resource].result(TIMEOUT_S)["flush.messages"].value
        assert (flush == "1") == (durability == "fsync"), flush
        kcat_round_trip(peer.bootstrap, "from-kcat")
        got = confluent_round_trip(peer.bootstrap, "records", 300)
        assert sorted(got) == sorted(b"value %d" % i for i in range(300))
    finally:
        peer.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not os.path.exists(work)
    assert not os.path.exists(f"/tmp/hsperfdata_{os.getenv('USER', 'root')}/{pid}")  # -XX:-UsePerfData


def test_cluster_ids_never_look_like_an_option():
    """The storage tool's parser takes an argument starting with "-" for an option: a cluster id made of random
    URL-safe base64 starts with one once in 64 starts, and that start failed ("expected one argument")."""
    from scripts.harness.kafka_peer import new_cluster_id

    ids = [new_cluster_id() for _ in range(20_000)]
    assert not any(cluster_id.startswith("-") for cluster_id in ids)
    assert len(set(ids)) == len(ids) and {len(cluster_id) for cluster_id in ids} == {22}
