"""Apache Kafka as the node's peer (scripts/harness/kafka_peer.py): the harness starts a real single-node KRaft
broker from the jars Maven fetched, records go round through it with kcat and confluent-kafka, and stopping it
leaves no process and no file."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from scripts.harness import kafka_peer
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


# -- quick JVMs: the class archive and the compiled programs ---------------------------------------------------


def test_the_class_archive_maps_for_every_jvm_on_kafkas_classpath():
    """`make kafka` dumped the archive; -Xshare:on makes a JVM fail where it cannot map it (another runtime,
    another classpath), so these runs prove a tool, a broker-side class and a program each map it, and the tool
    answers as without it."""
    archive = kafka_peer.class_archive()
    assert archive.exists(), "make kafka dumps it (kafka_peer.make_class_archive)"
    assert kafka_peer.class_sharing()[0] == f"-XX:SharedArchiveFile={archive}"
    java = [kafka_peer.java(), *kafka_peer.JVM_OPTIONS, *kafka_peer.QUICK_JVM_OPTIONS]
    shared = [*kafka_peer.class_sharing(), "-Xshare:on"]
    for args in (["org.apache.kafka.tools.TopicCommand", "--version"], ["kafka.tools.StorageTool", "random-uuid"]):
        plain = subprocess.run([*java, "-cp", kafka_peer.classpath(), *args], capture_output=True, text=True,
                               timeout=TIMEOUT_S)
        mapped = subprocess.run([*java, *shared, "-cp", kafka_peer.classpath(), *args], capture_output=True,
                                text=True, timeout=TIMEOUT_S)
        assert mapped.returncode == plain.returncode == 0, mapped.stdout + mapped.stderr
        assert len(mapped.stdout.split()) == len(plain.stdout.split()) == 1, (plain.stdout, mapped.stdout)
        if args[1] == "--version":
            assert mapped.stdout == plain.stdout and kafka_peer.KAFKA_VERSION in mapped.stdout
    # A classpath that does not start with Kafka's jars cannot map it: the harness must not hand it such a JVM.
    other = subprocess.run([*java, *shared, "-cp", str(archive.parent), "-version"], capture_output=True,
                           text=True, timeout=TIMEOUT_S)
    assert other.returncode != 0


def test_a_program_is_compiled_once_per_source_and_its_errors_are_javacs(tmp_path):
    source = tmp_path / "Hello.java"
    source.write_text('public class Hello { public static void main(String[] a) {'
                      ' System.out.println("hello " + org.apache.kafka.common.utils.Utils.formatBytes(2048)); } }\n')
    command = kafka_peer.program(source)
    compiled = Path(command[1].rsplit(os.pathsep, 1)[1])
    assert command[0] == "-cp" and command[2] == "Hello" and (compiled / "Hello.class").exists()
    built = (compiled / "Hello.class").stat().st_mtime_ns
    assert kafka_peer.program(source) == command and (compiled / "Hello.class").stat().st_mtime_ns == built
    ran = subprocess.run([kafka_peer.java(), *kafka_peer.class_sharing(), *command], capture_output=True,
                         text=True, timeout=TIMEOUT_S)
    assert ran.stdout == "hello 2 KB\n", ran.stdout + ran.stderr
    source.write_text(source.read_text().replace("hello ", "changed "))
    assert kafka_peer.program(source)[1] != command[1]  # another source, compiled anew
    source.write_text("public class Hello { nonsense }\n")
    with pytest.raises(RuntimeError, match="javac .*Hello.java exited 1"):
        kafka_peer.program(source)
