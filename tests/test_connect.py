"""Kafka Connect's distributed workers and MirrorMaker 2 against a real node (2 workers, `[topics]
accept_replication_factor_above_one = true`, the one setting they need: their internal topics ask for 3 copies),
as real JVMs of Connect 4.3.1 (scripts/harness/connect_worker.py; scripts/harness/connect/pom.xml says why not
4.4.0) on the tools' own defaults otherwise.

- Connect: a distributed worker keeps its configs, offsets and statuses in topics on the node, which it makes
  compacted; FileStreamSource copies the lines appended to a file into a topic and FileStreamSink the topic into
  a file. The worker is stopped with SIGTERM (a graceful stop: the tasks commit their offsets) and restarted: the
  topic and the sink file hold every line once, in order. Then it is killed with SIGKILL (most likely before its
  next offset flush, every offset.flush.interval.ms) and restarted: no line is lost, and the lines repeated are
  exactly those Connect's at-least-once delivery repeats: the source reads the file again from the position stored
  on the node, the sink gets again the records after its group's committed offset. Last, Connect's offsets API
  (KIP-875) on the stopped connectors: their offsets as the node keeps them, the sink's moved back, the source's
  reset; resumed, each starts again from there.
- MirrorMaker 2, "Moving to a Kafka cluster" (docs/migration.md): its mm2.properties, as it stands but for the
  two bootstrap addresses and the replication factors of the topics it makes on the test's one-broker Kafka,
  run by MirrorMaker's driver (what bin/connect-mirror-maker.sh runs) from the node to Kafka 4.4: the topics with
  their records at the same offsets and their configs, and the consumer groups' offsets. A group that read to the
  end resumes on Kafka at exactly its offsets (it reads only what is produced on Kafka after the move); one that
  stopped half way resumes at or before its offsets, never after (MirrorMaker's translation; nothing lost). The
  offset syncs are in a compacted topic on the node, the checkpoints in one on Kafka; `kafka-consumer-groups
  --describe --all-groups` shows the moved offsets. Then back, as the page says: the same file with the flow
  turned copies the topic and the groups' offsets from Kafka to a new node.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from scripts.harness.connect_worker import ConnectWorker, MirrorMakerProcess
from scripts.harness.kafka_peer import KafkaPeer, tool
from scripts.harness.nodeproc import NodeProcess

pytestmark = pytest.mark.node

MIGRATION_PAGE = Path(__file__).resolve().parent.parent / "docs" / "migration.md"
NODE_CONFIG = "[topics]\naccept_replication_factor_above_one = true\n"
WAIT_S = 60.0
COORDINATOR_NOT_YET = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                       KafkaError.COORDINATOR_LOAD_IN_PROGRESS}
POLL_S = 0.2
STRING_CONVERTER = "org.apache.kafka.connect.storage.StringConverter"
WORKER = {
    "group.id": "connect-cluster",
    "config.storage.topic": "connect-configs",
    "offset.storage.topic": "connect-offsets",
    "status.storage.topic": "connect-status",
    "key.converter": STRING_CONVERTER,
    "value.converter": STRING_CONVERTER,
    # Offsets flushed every 10 s: a graceful stop must commit them itself, and a crash comes before a flush.
    "offset.flush.interval.ms": "10000",
    "plugin.discovery": "service_load",  # the file connectors' ServiceLoader manifests; no class path scan
    # A killed worker's membership, and its sink task's consumer's, expire after the node's smallest session
    # (group.min.session.timeout.ms, 6 s) instead of Connect's 10 s and the consumer's 45 s.
    "session.timeout.ms": "6000",
    "heartbeat.interval.ms": "1000",
    "consumer.session.timeout.ms": "6000",
    "consumer.heartbeat.interval.ms": "1000",
}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(tmp_path_factory.mktemp("connect-node"), workers=2, config=NODE_CONFIG) as started:
        yield started
        assert "Traceback" not in started.log(), started.log()


def wait_until(what: str, check, timeout_s: float = WAIT_S):
    """`check()`'s first true answer, polled until `timeout_s`; TimeoutError naming `what` and the last answer."""
    deadline = time.monotonic() + timeout_s
    answer = None
    while time.monotonic() < deadline:
        answer = check()
        if answer:
            return answer
        time.sleep(POLL_S)
    raise TimeoutError(f"{what}: not in {timeout_s}s (last: {answer!r})")


# --------------------------------------------------------------------------- reading a cluster


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    client = admin(bootstrap)  # alive until the answer: a destroyed client fails its futures
    (future,) = client.describe_configs([ConfigResource("topic", topic)]).values()
    return {name: entry.value for name, entry in future.result(timeout=10).items()}


def partitions(bootstrap: str, topic: str) -> int:
    metadata = admin(bootstrap).list_topics(topic, timeout=10).topics[topic]
    assert metadata.error is None, metadata.error
    return len(metadata.partitions)


def read_topic(bootstrap: str, topic: str) -> dict[int, list[tuple[int, str, str]]]:
    """Every record of `topic` up to its end when called: per partition, (offset, key, value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-reader", "enable.auto.commit": False})
    try:
        records: dict[int, list[tuple[int, str, str]]] = {}
        ends = {}
        for partition in range(partitions(bootstrap, topic)):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            records[partition] = []
            if high > low:
                ends[partition] = high
        consumer.assign([TopicPartition(topic, partition, 0) for partition in ends])
        deadline = time.monotonic() + WAIT_S
        while any(not records[p] or records[p][-1][0] < end - 1 for p, end in ends.items()):
            assert time.monotonic() < deadline, f"{topic}: read {records} of {ends}"
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            key = message.key().decode() if message.key() is not None else None
            records[message.partition()].append((message.offset(), key, message.value().decode()))
        return {p: [r for r in rs if r[0] < ends.get(p, 0)] for p, rs in records.items()}
    finally:
        consumer.close()


def records_in(bootstrap: str, topic: str) -> int:
    """The offsets `topic`'s partitions span (its records, but those a compaction removed)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-reader"})
    try:
        spans = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                 for p in range(partitions(bootstrap, topic))]
        return sum(high - low for low, high in spans)
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, topic: str, count: int) -> list[int]:
    """The group's committed offset of each partition (-1001: none); [] while its coordinator is not there yet
    (Kafka makes __consumer_offsets at the first group request)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return [tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in range(count)], timeout=10)]
    except KafkaException as error:
        if error.args[0].code() not in COORDINATOR_NOT_YET:
            raise
        return []
    finally:
        consumer.close()


def consume_as_group(bootstrap: str, group: str, topic: str, count: int) -> list[tuple[int, int, str]]:
    """`count` records read by a member of `group` from its committed offsets, (partition, offset, value), then
    committed; fails when it gets fewer in WAIT_S."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    got: list[tuple[int, int, str]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + WAIT_S
        while len(got) < count:
            assert time.monotonic() < deadline, f"{group} read {len(got)} of {count}: {got}"
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                got.append((message.partition(), message.offset(), message.value().decode()))
        consumer.commit(asynchronous=False)
        return got
    finally:
        consumer.close()


# --------------------------------------------------------------------------- Kafka Connect


class FileLines:
    """The lines of a file Connect reads (appended here) or writes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.touch()

    def append(self, lines: list[str]) -> None:
        with open(self.path, "a") as out:
            out.write("".join(f"{line}\n" for line in lines))

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines() if self.path.exists() else []


def source_position(bootstrap: str, source: Path) -> int:
    """The newest position of the file source in Connect's offset topic on the node (-1: none stored)."""
    position = -1
    for records in read_topic(bootstrap, WORKER["offset.storage.topic"]).values():
        for _, key, value in records:
            if key and str(source) in key and value:
                position = json.loads(value)["position"]
    return position


def test_distributed_file_source_and_sink_resume_after_sigterm_and_sigkill(node, tmp_path):
    bootstrap = node.bootstrap
    source, sink = FileLines(tmp_path / "in.txt"), FileLines(tmp_path / "out.txt")
    worker = ConnectWorker({"bootstrap.servers": bootstrap, **WORKER}, tmp_path / "worker")
    with worker:
        worker.start()
        # The worker made its three topics on the node, compacted, with its default partition counts.
        for key, count in (("config", 1), ("offset", 25), ("status", 5)):
            topic = WORKER[f"{key}.storage.topic"]
            assert topic_configs(bootstrap, topic)["cleanup.policy"] == "compact", topic
            assert partitions(bootstrap, topic) == count, topic
        worker.rest("PUT", "/connectors/lines-in/config", {
            "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector", "tasks.max": "1",
            "file": str(source.path), "topic": "lines"})
        worker.rest("PUT", "/connectors/lines-out/config", {
            "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector", "tasks.max": "1",
            "file": str(sink.path), "topics": "lines"})
        in_topic: list[str] = []  # what the topic and the sink file must hold
        in_sink: list[str] = []

        def round_trip(batch: str, count: int) -> None:
            for connector in ("lines-in", "lines-out"):
                worker.wait_running(connector)
            new = [f"{batch}-{i}" for i in range(count)]
            source.append(new)
            in_topic.extend(new)
            in_sink.extend(new)
            wait_until(f"{batch} in the sink file", lambda: sink.lines()[-1:] == in_sink[-1:])
            assert sink.lines() == in_sink
            assert topic_values(bootstrap) == in_topic

        round_trip("first", 20)
        # A graceful stop: the tasks commit their offsets as they stop; nothing is read twice.
        assert worker.stop(signal.SIGTERM) in (0, 143)  # Connect's shutdown hook: a clean stop
        source.append(["while-stopped"])
        in_topic.append("while-stopped")
        in_sink.append("while-stopped")
        worker.start()
        round_trip("after-sigterm", 20)

        # A crash, most likely before the next offset flush: the source reads again from the position stored on the
        # node, the sink gets again the records after its group's committed offset (Connect's at least once).
        round_trip("before-sigkill", 20)
        worker.stop(signal.SIGKILL)
        position = source_position(bootstrap, source.path)
        sink_committed = committed(bootstrap, "connect-lines-out", "lines", 1)[0]
        assert 0 < position <= source.path.stat().st_size and 0 < sink_committed <= len(in_topic)
        source.append(["while-killed"])
        read_again = source.path.read_bytes()[position:].decode().splitlines()
        in_topic.extend(read_again)
        written_again = in_topic[sink_committed:]
        in_sink.extend(written_again)
        worker.start()
        round_trip("after-sigkill", 20)
        assert worker.starts == 3
        print(f"after SIGKILL: {len(read_again) - 1} lines read again, {len(written_again)} records written again")

        # Connect's offsets API (KIP-875) on offsets kept by the node: the stopped connectors' offsets read, the
        # sink's moved back (its group's offsets altered), the source's reset (a tombstone in the offset topic).
        for connector in ("lines-in", "lines-out"):
            worker.rest("PUT", f"/connectors/{connector}/stop")
        for connector in ("lines-in", "lines-out"):
            wait_until(f"{connector} stopped", lambda: worker.rest("GET", f"/connectors/{connector}/status")[
                "connector"]["state"] == "STOPPED")
        size = source.path.stat().st_size
        assert worker.rest("GET", "/connectors/lines-in/offsets") == {
            "offsets": [{"partition": {"filename": str(source.path)}, "offset": {"position": size}}]}
        sink_partition = {"kafka_topic": "lines", "kafka_partition": 0}
        assert worker.rest("GET", "/connectors/lines-out/offsets") == {
            "offsets": [{"partition": sink_partition, "offset": {"kafka_offset": len(in_topic)}}]}
        back_to = len(in_topic) - 5
        worker.rest("PATCH", "/connectors/lines-out/offsets",
                    {"offsets": [{"partition": sink_partition, "offset": {"kafka_offset": back_to}}]})
        assert worker.rest("GET", "/connectors/lines-out/offsets") == {
            "offsets": [{"partition": sink_partition, "offset": {"kafka_offset": back_to}}]}
        worker.rest("DELETE", "/connectors/lines-in/offsets")
        assert worker.rest("GET", "/connectors/lines-in/offsets") == {"offsets": []}
        in_topic.extend(source.lines())  # the whole file again
        in_sink.extend(in_topic[back_to:])
        for connector in ("lines-in", "lines-out"):
            worker.rest("PUT", f"/connectors/{connector}/resume")
        wait_until("the sink after its offsets moved", lambda: len(sink.lines()) >= len(in_sink))
        assert sink.lines() == in_sink
        assert topic_values(bootstrap) == in_topic


def topic_values(bootstrap: str) -> list[str]:
    return [value for _, _, value in read_topic(bootstrap, "lines")[0]]


# --------------------------------------------------------------------------- MirrorMaker 2: moving to Kafka


def readme_mm2_properties() -> str:
    """The mm2.properties of "Moving to a Kafka cluster" (docs/migration.md, where the README links): the page's
    first properties block."""
    (block, *_) = re.findall(r"```properties\n(.*?)```", MIGRATION_PAGE.read_text(), re.S)
    return block


def with_settings(properties: str, settings: dict[str, str]) -> str:
    """`properties` with each key of `settings` set: its line replaced where it has one, added otherwise."""
    for key, value in settings.items():
        line = re.compile(rf"^{re.escape(key)}\s*=.*$", re.M)
        properties, found = line.subn(f"{key} = {value}", properties)
        if not found:
            properties += f"{key} = {value}\n"
    return properties


# The topics MirrorMaker makes on Kafka ask for Kafka's defaults (2 and 3 copies); the test's Kafka is one broker.
ONE_BROKER_KAFKA = {
    "replication.factor": "1",
    "checkpoints.topic.replication.factor": "1",
    "heartbeats.topic.replication.factor": "1",
    "kafka.config.storage.replication.factor": "1",
    "kafka.offset.storage.replication.factor": "1",
    "kafka.status.storage.replication.factor": "1",
}
ORDERS_CONFIGS = {"retention.ms": "604800000", "max.message.bytes": "500000"}
BEFORE = 100  # records a partition on the node before MirrorMaker starts
WHILE = 30  # and while it runs
AUDIT_FIRST = 10  # where the group that stops half way was before MirrorMaker started
AUDIT_AT = BEFORE + 10  # and where it stops


@pytest.fixture(scope="module")
def kafka():
    with KafkaPeer() as peer:
        yield peer


def produce(bootstrap: str, first: int, count: int, prefix: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(3):
        for i in range(first, first + count):
            producer.produce("orders", key=f"k{p}-{i}", value=f"{prefix}-{p}-{i}", partition=p)
    assert producer.flush(30) == 0


def commit(bootstrap: str, group: str, offset: int) -> None:
    """Commit `offset` on each partition of orders for `group`, as a consumer that read that far does."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition("orders", p, offset) for p in range(3)], asynchronous=False)
    finally:
        consumer.close()


def test_moving_to_kafka_with_the_readme_mm2_properties(node, kafka, tmp_path):
    # On the node: a topic of three partitions with configs of its own, and a group ("billing") that read it.
    client = admin(node.bootstrap)
    (future,) = client.create_topics([NewTopic("orders", 3, 1, config=ORDERS_CONFIGS)]).values()
    future.result(timeout=10)
    produce(node.bootstrap, 0, BEFORE, "order")
    consume_as_group(node.bootstrap, "billing", "orders", 3 * BEFORE)
    commit(node.bootstrap, "audit", AUDIT_FIRST)  # before MirrorMaker's first offset sync: not translated

    properties = tmp_path / "mm2.properties"
    properties.write_text(with_settings(readme_mm2_properties(), {
        "shmbroker.bootstrap.servers": node.bootstrap, "kafka.bootstrap.servers": kafka.bootstrap,
        **ONE_BROKER_KAFKA}))
    with MirrorMakerProcess(properties, tmp_path / "mm2").start() as mirror:
        wait_until("billing's offsets on Kafka", lambda: committed(kafka.bootstrap, "billing", "orders", 3) ==
                   [BEFORE] * 3)
        # The clients still run on the node while MirrorMaker copies: more records, billing reads them all, and
        # "audit" stops half way.
        produce(node.bootstrap, BEFORE, WHILE, "order")
        consume_as_group(node.bootstrap, "billing", "orders", 3 * WHILE)
        commit(node.bootstrap, "audit", AUDIT_AT)
        on_node = read_topic(node.bootstrap, "orders")
        # The records, at the same offsets, and the topic's configs.
        wait_until("orders copied", lambda: read_topic(kafka.bootstrap, "orders") == on_node)
        configs = topic_configs(kafka.bootstrap, "orders")
        assert {key: configs[key] for key in ORDERS_CONFIGS} == ORDERS_CONFIGS
        # The groups' offsets: billing's exactly, audit's at or before the node's (MirrorMaker's translation).
        end = BEFORE + WHILE
        wait_until("billing's offsets on Kafka", lambda: committed(kafka.bootstrap, "billing", "orders", 3) ==
                   [end] * 3)
        wait_until("audit's offsets on Kafka", lambda: all_set(committed(kafka.bootstrap, "audit", "orders", 3)))
        assert mirror.stop(signal.SIGTERM) in (0, 143), mirror.log()
    # How the offsets moved: MirrorMaker's offset syncs in a compacted topic on the node (the source), its
    # checkpoints (the groups' translated offsets) in one on Kafka.
    for bootstrap, topic in ((node.bootstrap, "mm2-offset-syncs.kafka.internal"),
                             (kafka.bootstrap, "shmbroker.checkpoints.internal")):
        assert topic_configs(bootstrap, topic)["cleanup.policy"] == "compact", topic
        assert records_in(bootstrap, topic) > 0, topic
    # Read once MirrorMaker stopped: a later checkpoint may still move audit's offsets forward (a better sync).
    audit_on_kafka = committed(kafka.bootstrap, "audit", "orders", 3)
    assert all(0 <= offset <= AUDIT_AT for offset in audit_on_kafka), audit_on_kafka
    # The page's check: bin/kafka-consumer-groups.sh --describe --all-groups.
    described = tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", "--bootstrap-server",
                     kafka.bootstrap, "--describe", "--all-groups").stdout
    rows = {(row[0], int(row[2])): int(row[3]) for row in (line.split() for line in described.splitlines())
            if len(row) > 4 and row[1] == "orders"}
    assert rows == {**{("billing", p): end for p in range(3)},
                    **{("audit", p): audit_on_kafka[p] for p in range(3)}}, described

    # The clients move: billing reads only what is produced on Kafka after the move; audit goes on from its
    # translated offsets and misses nothing.
    produce(kafka.bootstrap, end, 1, "on-kafka")
    billing = consume_as_group(kafka.bootstrap, "billing", "orders", 3)
    assert sorted(billing) == [(p, end, f"on-kafka-{p}-{end}") for p in range(3)]
    read = consume_as_group(kafka.bootstrap, "audit", "orders", sum(end + 1 - offset for offset in audit_on_kafka))
    for p in range(3):
        expected = [value for offset, _, value in on_node[p] if offset >= audit_on_kafka[p]] + [f"on-kafka-{p}-{end}"]
        assert [value for partition, _, value in read if partition == p] == expected

    # And back, as the page says: the same file with the flow turned, from Kafka to a new node. Both groups read
    # to the end on Kafka; they move back exactly.
    (tmp_path / "node-back").mkdir()
    with NodeProcess(tmp_path / "node-back", workers=2, config=NODE_CONFIG) as back:
        properties.write_text(with_settings(turned(readme_mm2_properties()), {
            "shmbroker.bootstrap.servers": back.bootstrap, "kafka.bootstrap.servers": kafka.bootstrap,
            "offset-syncs.topic.replication.factor": "1"}))  # on the test's one-broker Kafka, now the source
        on_kafka = read_topic(kafka.bootstrap, "orders")
        with MirrorMakerProcess(properties, tmp_path / "mm2-back").start() as mirror:
            wait_until("orders copied back", lambda: partitions_or_none(back.bootstrap, "orders") == 3
                       and read_topic(back.bootstrap, "orders") == on_kafka)
            configs = topic_configs(back.bootstrap, "orders")
            assert {key: configs[key] for key in ORDERS_CONFIGS} == ORDERS_CONFIGS
            for group in ("billing", "audit"):
                wait_until(f"{group}'s offsets on the node", lambda: committed(back.bootstrap, group, "orders", 3)
                           == [end + 1] * 3)
            assert mirror.stop(signal.SIGTERM) in (0, 143), mirror.log()
        produce(back.bootstrap, end + 1, 1, "back")
        for group in ("billing", "audit"):
            assert sorted(consume_as_group(back.bootstrap, group, "orders", 3)) == [
                (p, end + 1, f"back-{p}-{end + 1}") for p in range(3)]
        assert "Traceback" not in back.log(), back.log()


def turned(properties: str) -> str:
    """The page's way back: the flow from Kafka to the node, and the Kafka side's worker settings given to the
    node's side (MirrorMaker's worker runs on the target's side)."""
    properties = properties.replace("shmbroker->kafka.", "kafka->shmbroker.")
    for key in ("offset.flush.interval.ms", "plugin.discovery"):
        properties = properties.replace(f"\nkafka.{key}", f"\nshmbroker.{key}")
    return properties


def partitions_or_none(bootstrap: str, topic: str) -> int | None:
    metadata = admin(bootstrap).list_topics(timeout=10).topics.get(topic)
    return None if metadata is None or metadata.error is not None else len(metadata.partitions)


def all_set(offsets: list[int]) -> list[int] | None:
    return offsets if all(offset >= 0 for offset in offsets) else None
