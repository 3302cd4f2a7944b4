"""Differential tests: the same request sequences to Apache Kafka 4.4.0 (scripts/harness/kafka_peer.py) and to
the node, through the raw client, their answers compared field by field.

Only what must differ between two brokers is left out of the comparison (IGNORED: ids, hosts and ports,
throttle times, free-text error messages, which name the same error in other words). Every other difference
is a failure, or one of the documented ones (docs/compatibility.md, "Differences from Apache Kafka"), which
these tests pin as they are, so a change on either side shows.
"""

from __future__ import annotations

import dataclasses
import enum
import time
import uuid
from typing import Any, Callable

import pytest
from kio.static.primitive import i8, i16, i32, i64

from pyspark_shmbroker import wire
from scripts.harness import rawkafka as R
from shmbroker.node.storage import records
from scripts.harness.kafka_peer import KafkaPeer
from scripts.harness.nodeproc import NodeProcess

pytestmark = pytest.mark.node

# Fields whose values two brokers may give differently without either being wrong.
IGNORED = frozenset({
    "throttle_time", "throttle_time_ms", "cluster_id", "controller_id", "node_id", "host", "port", "rack",
    "topic_id", "error_message", "session_id", "member_id", "leader_id", "coordinator_key",
})
DELETE_RECORDS, OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, SYNC_GROUP = 21, 8, 9, 11, 12, 14
ADD_PARTITIONS_TO_TXN, END_TXN, DESCRIBE_CONFIGS = 24, 26, 32
T0 = 1_700_000_000_000  # the records' timestamps: the same on both brokers
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Apache Kafka and the node, each on its own loopback port; requests go to both."""
    kafka = KafkaPeer(partitions=1)
    node = NodeProcess(tmp_path_factory.mktemp("node"), workers=1, config="[topics]\nnum_partitions = 1\n")
    try:
        kafka.start()
        node.start()
        yield {"kafka": kafka.port, "node": node.port}
    finally:
        kafka.close()
        node.close()


def ask(port: int, api_key: int, version: int, body: bytes) -> Any:
    with R.RawConnection("127.0.0.1", port) as conn:
        return conn.call(api_key, version, body)


def plain(value: Any, ignored: frozenset[str] = IGNORED) -> Any:
    """A kio entity as nested dicts and lists, without the ignored fields."""
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name), ignored) for f in dataclasses.fields(value)
                if f.name not in ignored}
    if isinstance(value, dict):
        return {key: plain(item, ignored) for key, item in value.items() if key not in ignored}
    if isinstance(value, (tuple, list)):
        return [plain(item, ignored) for item in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, uuid.UUID):
        return str(value)
    if hasattr(value, "total_seconds"):  # kio's timedeltas
        return round(value.total_seconds() * 1000)
    return value


def differences(kafka: Any, node: Any, path: str = "") -> list[str]:
    """Where two plain answers differ: 'path: kafka value != node value'."""
    if isinstance(kafka, dict) and isinstance(node, dict):
        found = []
        for key in sorted(set(kafka) | set(node)):
            found += differences(kafka.get(key, "<absent>"), node.get(key, "<absent>"), f"{path}.{key}")
        return found
    if isinstance(kafka, list) and isinstance(node, list) and len(kafka) == len(node):
        return [d for i, (a, b) in enumerate(zip(kafka, node)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if kafka == node else [f"{path or '.'}: {kafka!r} != {node!r}"]


def on_both(servers: dict[str, int], sequence: Callable[[int], Any]) -> tuple[Any, Any]:
    """Run the same request sequence against Kafka and the node: (Kafka's answers, the node's)."""
    return plain(sequence(servers["kafka"])), plain(sequence(servers["node"]))


def create_topic(port: int, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
    """Create a topic and wait until every partition has its leader (Kafka's broker learns it from the
    controller a moment after CreateTopics is answered, and refuses produces until then)."""
    answer = ask(port, R.CREATE_TOPICS, 5, R.create_topics_body({name: partitions}, version=5, configs=configs))
    assert answer.topics[0].error_code == 0, answer
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        metadata = ask(port, R.METADATA, 8, R.metadata_body([name], version=8, allow_auto_topic_creation=False))
        found = [p for t in metadata.topics if t.name == name and t.error_code == 0 for p in t.partitions
                 if p.error_code == 0 and p.leader_id >= 0]
        if len(found) == partitions:
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} has no leader for every partition in {TIMEOUT_MS} ms")


def produce_batches(port: int, topic: str, batches: int, per_batch: int, partition: int = 0) -> None:
    """`batches` batches of `per_batch` keyed records, timestamps T0 + 1000 x batch (+ record index)."""
    with R.RawConnection("127.0.0.1", port) as conn:
        for b in range(batches):
            batch = R.build_record_batch([b"value-%d-%d" % (b, i) for i in range(per_batch)],
                                         [b"key-%d" % i for i in range(per_batch)], first_timestamp_ms=T0 + 1000 * b)
            answer = conn.call(R.PRODUCE, 8, R.produce_body({topic: {partition: batch}}, acks=-1, version=8))
            assert answer.responses[0].partition_responses[0].error_code == 0, answer


def delete_records(port: int, topic: str, offset: int) -> Any:
    body = R.request_body(DELETE_RECORDS, 2, "DeleteRecordsRequest", topics=(
        R.request_entity(DELETE_RECORDS, 2, "DeleteRecordsTopic", name=topic, partitions=(
            R.request_entity(DELETE_RECORDS, 2, "DeleteRecordsPartition", partition_index=i32(0),
                             offset=i64(offset)),)),), timeout=R.millis(TIMEOUT_MS))
    return ask(port, DELETE_RECORDS, 2, body)


# --------------------------------------------------------------------------- ListOffsets and Fetch at the edges


LIST_OFFSETS_VERSION = 7  # -3: the record of the largest timestamp (KIP-734)
LOOKUPS = {"latest": -1, "earliest": -2, "max timestamp": -3, "first batch": T0, "inside the second batch": T0 + 1003,
           "third batch": T0 + 2000, "after every record": T0 + 99_999}


def list_offsets(port: int, topic: str, timestamp: int, partition: int = 0) -> Any:
    body = R.request_body(R.LIST_OFFSETS, LIST_OFFSETS_VERSION, "ListOffsetsRequest", replica_id=i32(-1),
                          isolation_level=0, topics=(
        R.request_entity(R.LIST_OFFSETS, LIST_OFFSETS_VERSION, "ListOffsetsTopic", name=topic, partitions=(
            R.request_entity(R.LIST_OFFSETS, LIST_OFFSETS_VERSION, "ListOffsetsPartition",
                             partition_index=i32(partition), current_leader_epoch=i32(-1),
                             timestamp=i64(timestamp)),)),))
    return ask(port, R.LIST_OFFSETS, LIST_OFFSETS_VERSION, body)


def test_list_offsets_answers_as_kafka_at_every_edge(servers):
    def sequence(port: int) -> dict:
        create_topic(port, "offsets-edges")
        produce_batches(port, "offsets-edges", 3, 5)
        answers = {name: list_offsets(port, "offsets-edges", ts) for name, ts in LOOKUPS.items()}
        answers["no such partition"] = list_offsets(port, "offsets-edges", -1, partition=7)
        answers["no such topic"] = list_offsets(port, "no-such-topic-edges", -1)
        answers["delete records to 7"] = delete_records(port, "offsets-edges", 7)
        answers.update({f"{name} after DeleteRecords": list_offsets(port, "offsets-edges", ts)
                        for name, ts in LOOKUPS.items()})
        return answers

    kafka, node = on_both(servers, sequence)
    found = differences(kafka, node)
    assert not found, "\n".join(found)


FETCH_VERSION = 11


def fetch(port: int, topic: str, offset: int, isolation_level: int = 0, partition_max_bytes: int = 1 << 20) -> dict:
    """One Fetch of one partition: the answer's partition fields and each batch returned (its first and last
    offsets, record count, largest timestamp)."""
    body = R.fetch_body({topic: {0: offset}}, max_wait_ms=0, min_bytes=0, isolation_level=isolation_level,
                        partition_max_bytes=partition_max_bytes, version=FETCH_VERSION)
    with R.RawConnection("127.0.0.1", port) as conn:
        frame = conn.request(R.FETCH, FETCH_VERSION, body)
        answer = wire.parse_fetch_response(memoryview(frame), 0, FETCH_VERSION)
        (got,) = answer.partitions
        batches = [[h.base_offset, h.last_offset, h.record_count, h.max_timestamp]
                   for _, h in records.iter_batches(got.records)]
    return {"error_code": answer.error_code, "partition_error_code": got.error_code,
            "high_watermark": got.high_watermark, "last_stable_offset": got.last_stable_offset,
            "log_start_offset": got.log_start_offset, "aborted": sorted(got.aborted_transactions),
            "batches": batches}


def test_fetch_answers_as_kafka_at_every_edge(servers):
    def sequence(port: int) -> dict:
        create_topic(port, "fetch-edges")
        produce_batches(port, "fetch-edges", 3, 5)
        answers = {f"at {offset}": fetch(port, "fetch-edges", offset) for offset in (0, 5, 7, 14, 15, 16, 99)}
        delete_records(port, "fetch-edges", 7)
        answers.update({f"at {offset} after DeleteRecords": fetch(port, "fetch-edges", offset)
                        for offset in (0, 6, 7, 8, 15)})
        return answers

    kafka, node = on_both(servers, sequence)
    found = differences(kafka, node)
    assert not found, "\n".join(found)


# --------------------------------------------------------------------------- topic administration


CREATE_TOPICS_VERSION = 5
INVALID_TOPICS = {  # name -> (partitions, replication factor, configs)
    "bad name!": (1, 1, {}),
    "a" * 250: (1, 1, {}),
    "..": (1, 1, {}),
    "zero-partitions": (0, 1, {}),
    "three-replicas": (1, 3, {}),
    "zero-replicas": (1, 0, {}),
    "unknown-config": (1, 1, {"no.such.config": "1"}),
    "bad-policy": (1, 1, {"cleanup.policy": "bogus"}),
    "bad-retention": (1, 1, {"retention.ms": "soon"}),
    "bad-ratio": (1, 1, {"min.cleanable.dirty.ratio": "2"}),
    "null-config": (1, 1, {"retention.ms": None}),
}


def create_topics(port: int, topics: dict[str, tuple[int, int, dict]], validate_only: bool) -> list[list]:
    """One CreateTopics of `topics`: each topic's (name, error code, partitions, replication factor)."""
    creatable = tuple(
        R.request_entity(R.CREATE_TOPICS, CREATE_TOPICS_VERSION, "CreatableTopic", name=name,
                         num_partitions=i32(partitions), replication_factor=i16(replicas), assignments=(),
                         configs=tuple(R.request_entity(R.CREATE_TOPICS, CREATE_TOPICS_VERSION, "CreatableTopicConfig",
                                                        name=key, value=value) for key, value in configs.items()))
        for name, (partitions, replicas, configs) in topics.items())
    body = R.request_body(R.CREATE_TOPICS, CREATE_TOPICS_VERSION, "CreateTopicsRequest", topics=creatable,
                          timeout=R.millis(TIMEOUT_MS), validate_only=validate_only)
    answer = ask(port, R.CREATE_TOPICS, CREATE_TOPICS_VERSION, body)
    return sorted([t.name, int(t.error_code), int(t.num_partitions), int(t.replication_factor)]
                  for t in answer.topics)


def test_create_topics_refuses_what_kafka_refuses_with_its_error_codes(servers):
    def sequence(port: int) -> dict:
        create_topic(port, "already-there")
        topics = {**INVALID_TOPICS, "already-there": (1, 1, {}), "fine": (2, 1, {"retention.ms": "1000"})}
        return {"validate only": create_topics(port, topics, True), "create": create_topics(port, topics, False)}

    kafka, node = on_both(servers, sequence)
    found = differences(kafka, node)
    assert not found, "\n".join(found)


ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 33, 44
TOPIC_RESOURCE = 2
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
ALTERATIONS = {  # name -> the changes of one resource: (key, operation, value)
    "null value": [("retention.ms", SET, None)],
    "unknown key": [("no.such.config", SET, "1")],
    "bad value": [("retention.ms", SET, "soon")],
    "delete what is not set": [("segment.ms", DELETE, None)],
    "append to a list": [("cleanup.policy", APPEND, "compact")],
    "append to a number": [("retention.ms", APPEND, "5")],
    "subtract from a list": [("cleanup.policy", SUBTRACT, "compact")],
    "the same key twice": [("retention.ms", SET, "1000"), ("retention.ms", SET, "2000")],
    "fine": [("retention.ms", SET, "86400000")],
}


def alter_configs(port: int, topic: str, changes: list[tuple[str, int, str | None]], incremental: bool) -> int:
    """One AlterConfigs (the SET values) or IncrementalAlterConfigs of `topic`, validate only: its error code."""
    api, version = (INCREMENTAL_ALTER_CONFIGS, 1) if incremental else (ALTER_CONFIGS, 2)
    configs = tuple(R.request_entity(api, version, "AlterableConfig", name=key, value=value,
                                     config_operation=i8(operation))
                    for key, operation, value in changes if incremental or operation == SET)
    resource = R.request_entity(api, version, "AlterConfigsResource", resource_type=i8(TOPIC_RESOURCE),
                                resource_name=topic, configs=configs)
    request = "IncrementalAlterConfigsRequest" if incremental else "AlterConfigsRequest"
    answer = ask(port, api, version, R.request_body(api, version, request, resources=(resource,), validate_only=True))
    return int(answer.responses[0].error_code)


def test_alter_configs_refuses_what_kafka_refuses_with_its_error_codes(servers):
    def sequence(port: int) -> dict:
        create_topic(port, "altered")
        return {f"{name}, {'incremental' if incremental else 'replace'}": alter_configs(port, topic, changes,
                                                                                      incremental)
                for name, changes in ALTERATIONS.items() for incremental in (False, True)
                for topic in ("altered",)} | {"no such topic": alter_configs(port, "no-such-topic", [], True)}

    kafka, node = on_both(servers, sequence)
    found = differences(kafka, node)
    assert not found, "\n".join(found)
