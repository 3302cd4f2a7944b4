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
import re
import time
import uuid
from datetime import timedelta
from typing import Any, Callable

import pytest
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from shmbroker.clients import wire
from scripts.harness import rawkafka as R
from shmbroker.node.storage import records
from scripts.harness.kafka_peer import KafkaPeer
from scripts.harness.nodeproc import NodeProcess

pytestmark = pytest.mark.node

# Fields whose values two brokers may give differently without either being wrong.
IGNORED = frozenset({
    "throttle_time", "throttle_time_ms", "cluster_id", "controller_id", "node_id", "host", "port", "rack",
    "topic_id", "error_message", "session_id", "member_id", "leader_id", "leader", "coordinator_key",
})
DELETE_RECORDS, OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, SYNC_GROUP = 21, 8, 9, 11, 12, 14
ADD_PARTITIONS_TO_TXN, END_TXN, DESCRIBE_CONFIGS = 24, 26, 32
T0 = 1_700_000_000_000  # the records' timestamps: the same on both brokers
NOT_LEADER_OR_FOLLOWER = 6
TIMEOUT_MS = 30_000
# Both brokers set alike where the peer's file sets something the node has too: Kafka's peer is node 1 with no
# initial rebalance delay; and both look for logs to clean this often (Kafka's default is 15 s).
BROKER_ID = 1
CLEANER_BACKOFF_MS = 100
NODE_CONFIG = f"""\
[server]
node_id = {BROKER_ID}
[topics]
num_partitions = 1
[groups]
initial_rebalance_delay_ms = 0
[cleaner]
backoff_ms = {CLEANER_BACKOFF_MS}
"""


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Apache Kafka and the node, each on its own loopback port; requests go to both."""
    kafka = KafkaPeer(partitions=1, settings={"log.cleaner.backoff.ms": str(CLEANER_BACKOFF_MS)})
    node = NodeProcess(tmp_path_factory.mktemp("node"), workers=1, config=NODE_CONFIG)
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


def produce_batch(conn: R.RawConnection, topic: str, batch: bytes, partition: int = 0) -> int:
    """Produce one batch (acks=all); its base offset."""
    body = R.produce_body({topic: {partition: batch}}, acks=-1, version=8)
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    # Kafka's partition may take its leadership a moment after Metadata names the leader: a client retries.
    while (answer := conn.call(R.PRODUCE, 8, body)).responses[0].partition_responses[0].error_code \
            == NOT_LEADER_OR_FOLLOWER and time.monotonic() < deadline:
        time.sleep(0.05)
    assert answer.responses[0].partition_responses[0].error_code == 0, answer
    return int(answer.responses[0].partition_responses[0].base_offset)


def produce_batches(port: int, topic: str, batches: int, per_batch: int, partition: int = 0,
                    start_ms: int = T0) -> None:
    """`batches` batches of `per_batch` keyed records, timestamps start_ms + 1000 x batch."""
    with R.RawConnection("127.0.0.1", port) as conn:
        for b in range(batches):
            produce_batch(conn, topic, R.build_record_batch([b"value-%d-%d" % (b, i) for i in range(per_batch)],
                                                            [b"key-%d" % i for i in range(per_batch)],
                                                            first_timestamp_ms=start_ms + 1000 * b), partition)


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


def fetch(port: int, topic: str, offset: int, isolation_level: int = 0, partition_max_bytes: int = 1 << 20,
          timestamps: bool = True, with_records: bool = False) -> dict:
    """One Fetch of one partition: the answer's partition fields and each batch returned (its first and last
    offsets, record count, and with `timestamps` its largest timestamp); `with_records`: each record too
    (offset -> [key, value, timestamp]) of the uncompressed batches returned."""
    body = R.fetch_body({topic: {0: offset}}, max_wait_ms=0, min_bytes=0, isolation_level=isolation_level,
                        partition_max_bytes=partition_max_bytes, version=FETCH_VERSION)
    with R.RawConnection("127.0.0.1", port) as conn:
        frame = conn.request(R.FETCH, FETCH_VERSION, body)
        answer = wire.parse_fetch_response(memoryview(frame), 0, FETCH_VERSION)
        (got,) = answer.partitions
        found = list(records.iter_batches(got.records))
        batches = [[h.base_offset, h.last_offset, h.record_count, *([h.max_timestamp] if timestamps else [])]
                   for _, h in found]
        kept = {}
        for position, h in found if with_records else ():
            batch = bytes(got.records[position:position + h.batch_length + records.LENGTH_FIELDS_SIZE])
            for (at, key, value), timestamp in zip(records.iter_records(batch, h), records.record_timestamps(batch, h)):
                kept[at] = [text(key), text(value), timestamp]
    return {"error_code": answer.error_code, "partition_error_code": got.error_code,
            "high_watermark": got.high_watermark, "last_stable_offset": got.last_stable_offset,
            "log_start_offset": got.log_start_offset, "aborted": sorted(got.aborted_transactions),
            "batches": batches, **({"records": kept} if with_records else {})}


def text(data: bytes | None) -> str | None:
    return None if data is None else data.decode()


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


# --------------------------------------------------------------------------- compacted logs


# Each batch gets a segment of its own: Kafka rolls when a batch's timestamp is segment.ms past its segment's first
# (the batches are 1 s apart, the records of one at most 400 ms), the node when its segment's first append is
# segment.ms old by its clock (the produces are ROLL_PAUSE_S apart). Both clean what is sealed at once.
ROLL_MS = 100
ROLL_PAUSE_S = 0.25
COMPACTED = {"cleanup.policy": "compact", "segment.ms": str(ROLL_MS), "min.cleanable.dirty.ratio": "0.01",
             "min.compaction.lag.ms": "0"}
COMPACTION_TIMEOUT_S = 30.0
# Batch b at the first timestamp + 1000 x b; each record (key, value (None: a tombstone), timestamp delta).
COMPACTED_BATCHES = (
    (("a", "a0", 0), ("b", "b0", 0), ("c", "c0", 0)),  # 0-2: every key written again: the batch goes
    (("a", "a1", 0), ("e", "e0", 0)),  # 3-4: goes too
    (("c", "c1", 0), ("b", "b1", 200), ("f", "f0", 400), ("d", "d1", 600)),  # 5-8: keeps 6 and 7, not its newest
    (("g", "g0", 0), ("e", None, 0)),  # 9-10: a tombstone, kept delete.retention.ms
    (("a", "a2", 0), ("c", "c2", 0), ("d", "d2", 0), ("h", "h0", 0)),  # 11-14: kept whole
    (("i", "i0", 0), ("a", "a3", 0)),  # 15-16: the active segment, never cleaned (so a2 stays)
)
COMPACTED_FETCHES = {"the log start, two batches gone": 0, "a batch that went": 3, "a removed first record": 5,
                     "a removed last record": 8, "the tombstone": 10, "the active segment": 15,
                     "the high watermark": 17}
# Timestamps after the first batch's (negative: ListOffsets' special ones).
COMPACTED_LOOKUPS = {"latest": -1, "earliest": -2, "max timestamp": -3, "a batch that went": 0,
                     "before a cleaned batch's first kept record": 2100,
                     "after a cleaned batch's newest kept record": 2500, "a batch kept whole": 4000,
                     "after every record": 99_999}
# A tombstone whose records are years old, in a batch whose other record goes.
OLD_TOMBSTONE_BATCHES = ((("t", None, 0), ("u", "u0", 0)), (("u", "u1", 0),), (("w", "w0", 0),))


def produce_keyed(port: int, topic: str, batches: tuple, start_ms: int) -> int:
    """Each batch (its records (key, value, timestamp delta)) at start_ms + 1000 x its number, ROLL_PAUSE_S
    apart; the last one's base offset (where the active segment starts)."""
    with R.RawConnection("127.0.0.1", port) as conn:
        for number, batch in enumerate(batches):
            if number:
                time.sleep(ROLL_PAUSE_S)
            base = produce_batch(conn, topic, records.build_batch(
                [(key.encode(), None if value is None else value.encode()) for key, value, _ in batch],
                start_ms + 1000 * number, timestamp_deltas=[delta for _, _, delta in batch]))
    return base


def records_below(port: int, topic: str, end: int) -> dict[int, list]:
    """Every record below offset `end`, fetched from the log start: offset -> [key, value, timestamp]."""
    found: dict[int, list] = {}
    offset = 0
    while offset < end:
        got = fetch(port, topic, offset, with_records=True)
        if not got["batches"]:
            break
        found.update(got["records"])
        offset = got["batches"][-1][1] + 1
    return {at: record for at, record in found.items() if at < end}


def wait_compacted(port: int, topic: str, active_base: int) -> None:
    """Until no key is twice below the active segment: the cleaner went over every sealed segment."""
    deadline = time.monotonic() + COMPACTION_TIMEOUT_S
    while time.monotonic() < deadline:
        keys = [key for key, _, _ in records_below(port, topic, active_base).values()]
        if len(keys) == len(set(keys)):
            return
        time.sleep(CLEANER_BACKOFF_MS / 1000)
    raise AssertionError(f"{topic} on port {port} was not compacted in {COMPACTION_TIMEOUT_S} s")


# Kafka 4 keeps a tombstone delete.retention.ms from the cleaning that first sees it (KIP-534: the delete horizon,
# written into its batch); the node drops one once the newest record of its segment is older than
# delete.retention.ms, here at the first cleaning. docs/compatibility.md.
COMPACTION_DIFFERENCES = [
    f".old tombstone.batches: [[0, 1, 1, {T0}], [2, 2, 1, {T0 + 1000}]] != [[2, 2, 1, {T0 + 1000}]]",
    f".old tombstone.records.0: ['t', None, {T0}] != '<absent>'",
]


def test_fetch_and_list_offsets_over_compacted_gaps_answer_as_kafka(servers):
    """Fetches from the offsets a cleaning removed, and ListOffsets by timestamp over them: the batches each
    answer returns (base and last offsets, record count, max timestamp) and every record (offset, key, value,
    timestamp); not the batches' bytes (Kafka writes a tombstone's delete horizon into its batch)."""
    start = int(time.time() * 1000) - 60_000  # recent: both keep the tombstone of COMPACTED_BATCHES

    def sequence(port: int) -> dict:
        create_topic(port, "compacted-gaps", configs=COMPACTED)
        create_topic(port, "old-tombstone", configs=COMPACTED)
        wait_compacted(port, "compacted-gaps", produce_keyed(port, "compacted-gaps", COMPACTED_BATCHES, start))
        wait_compacted(port, "old-tombstone", produce_keyed(port, "old-tombstone", OLD_TOMBSTONE_BATCHES, T0))
        answers = {f"fetch at {name}": fetch(port, "compacted-gaps", offset, with_records=True)
                   for name, offset in COMPACTED_FETCHES.items()}
        answers.update({f"list offsets, {name}": list_offsets(port, "compacted-gaps",
                                                              timestamp if timestamp < 0 else start + timestamp)
                        for name, timestamp in COMPACTED_LOOKUPS.items()})
        answers["old tombstone"] = fetch(port, "old-tombstone", 0, with_records=True)
        return answers

    kafka, node = on_both(servers, sequence)
    found = differences(kafka, node)
    assert found == COMPACTION_DIFFERENCES, "\n".join(found)


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
        return {"validate only": create_topics(port, topics, True), "create": create_topics(port, topics, False),
                "segments under 1 MiB": create_topics(port, {"small-segments": (1, 1, SMALL_SEGMENTS)}, True)}

    kafka, node = on_both(servers, sequence)
    found = differences(kafka, node)
    assert found == CREATE_TOPICS_DIFFERENCES, "\n".join(found)


# Kafka 4 refuses segment.bytes under 1 MiB (INVALID_CONFIG); the node takes Kafka 3's floor, 14 bytes, so a 3.x topic
# config applies unchanged. docs/compatibility.md.
SMALL_SEGMENTS = {"segment.bytes": str((1 << 20) - 1)}
CREATE_TOPICS_DIFFERENCES = [
    ".segments under 1 MiB[0][1]: 40 != 0",
    ".segments under 1 MiB[0][2]: -1 != 1",
    ".segments under 1 MiB[0][3]: -1 != 1",
]


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


GROUP_RESOURCE = 32
GROUP_ALTERATIONS = {  # name -> the changes of one group: (key, operation, value)
    "streams: one standby": [("streams.num.standby.replicas", SET, "1")],
    "streams: the most standbys": [("streams.num.standby.replicas", SET, "2")],
    "streams: too many standbys": [("streams.num.standby.replicas", SET, "3")],
    "streams: negative standbys": [("streams.num.standby.replicas", SET, "-1")],
    "streams: standbys not a number": [("streams.num.standby.replicas", SET, "one")],
    "streams: session within bounds": [("streams.session.timeout.ms", SET, "50000")],
    "streams: session below its min": [("streams.session.timeout.ms", SET, "44999")],
    "streams: session above its max": [("streams.session.timeout.ms", SET, "60001")],
    "streams: interval below its min": [("streams.heartbeat.interval.ms", SET, "4999")],
    "streams: interval above its max": [("streams.heartbeat.interval.ms", SET, "15001")],
    "streams: interval and session": [("streams.heartbeat.interval.ms", SET, "15000"),
                                      ("streams.session.timeout.ms", SET, "45000")],
    "streams: null value": [("streams.num.standby.replicas", SET, None)],
    "streams: delete what is not set": [("streams.num.standby.replicas", DELETE, None)],
    "streams: append to a number": [("streams.num.standby.replicas", APPEND, "1")],
    "streams: no initial rebalance delay": [("streams.initial.rebalance.delay.ms", SET, "0")],
    "share: session within bounds": [("share.session.timeout.ms", SET, "50000")],
    "share: session below its min": [("share.session.timeout.ms", SET, "44999")],
    "share: session above its max": [("share.session.timeout.ms", SET, "60001")],
    "share: interval below its min": [("share.heartbeat.interval.ms", SET, "4999")],
    "share: interval above its max": [("share.heartbeat.interval.ms", SET, "15001")],
    "share: interval and session": [("share.heartbeat.interval.ms", SET, "15000"),
                                    ("share.session.timeout.ms", SET, "45000")],
    "share: delivery count limit": [("share.delivery.count.limit", SET, "2")],
    "share: delivery count limit above its max": [("share.delivery.count.limit", SET, "11")],
    "share: delivery count limit below 2": [("share.delivery.count.limit", SET, "1")],
    "share: record locks": [("share.partition.max.record.locks", SET, "4000")],
    "share: record locks above its max": [("share.partition.max.record.locks", SET, "4001")],
    "share: lock duration above its max": [("share.record.lock.duration.ms", SET, "60001")],
    "share: lock duration below its min": [("share.record.lock.duration.ms", SET, "14999")],
    "share: renew acknowledgements off": [("share.renew.acknowledge.enable", SET, "false")],
}


def alter_group_configs(port: int, group: str, changes: list[tuple[str, int, str | None]]) -> list:
    """One IncrementalAlterConfigs of a GROUP resource, validate only: [error code, error message]."""
    api, version = INCREMENTAL_ALTER_CONFIGS, 1
    configs = tuple(R.request_entity(api, version, "AlterableConfig", name=key, value=value,
                                     config_operation=i8(operation)) for key, operation, value in changes)
    resource = R.request_entity(api, version, "AlterConfigsResource", resource_type=i8(GROUP_RESOURCE),
                                resource_name=group, configs=configs)
    answer = ask(port, api, version, R.request_body(api, version, "IncrementalAlterConfigsRequest",
                                                    resources=(resource,), validate_only=True))
    return [int(answer.responses[0].error_code), answer.responses[0].error_message]


# The node's config parser words these as it does for topic configs (same error codes).
PARSER_WORDING = "the node's config parser's wording, shared with topic configs"
RENEW_ALWAYS_ON = "the node refuses share.renew.acknowledge.enable: RENEW is always on (docs/compatibility.md)"
GROUP_ALTERATION_DIFFERENCES = {
    ".share: delivery count limit below 2[1]: 'Invalid value 1 for configuration share.delivery.count.limit: Value "
    "must be at least 2' != 'Invalid value 1 for configuration share.delivery.count.limit: must be at least 2'":
        PARSER_WORDING,
    ".share: renew acknowledgements off[0]: 0 != 40": RENEW_ALWAYS_ON,
    ".share: renew acknowledgements off[1]: None != 'Unknown group config name: share.renew.acknowledge.enable'":
        RENEW_ALWAYS_ON,
    ".streams: append to a number[1]: \"Can't APPEND to key streams.num.standby.replicas because its type is not "
    "LIST.\" != 'Config value append is not allowed for config key: streams.num.standby.replicas'": PARSER_WORDING,
    ".streams: negative standbys[1]: 'Invalid value -1 for configuration streams.num.standby.replicas: Value must be "
    "at least 0' != 'Invalid value -1 for configuration streams.num.standby.replicas: must be at least 0'":
        PARSER_WORDING,
    ".streams: null value[1]: 'Null value not supported for : streams.num.standby.replicas' != 'Null value not "
    "supported for configuration streams.num.standby.replicas'": PARSER_WORDING,
    ".streams: standbys not a number[1]: 'Invalid value one for configuration streams.num.standby.replicas: Not a "
    "number of type INT' != 'Invalid value one for configuration streams.num.standby.replicas: not a valid int'":
        PARSER_WORDING,
}


def test_streams_and_share_group_configs_are_checked_as_kafka_checks_them(servers):
    """KIP-1071's and KIP-932's group configs on the GROUP resource: the same error codes (INVALID_CONFIG,
    INVALID_REQUEST) as Kafka 4.4 with its bounds (the node's [groups] streams_* and share_* defaults are Kafka's),
    and the same messages for the bounds; the parser's own messages are worded apart, and a config the node
    refuses is told (GROUP_ALTERATION_DIFFERENCES)."""
    kafka, node = on_both(servers, lambda port: {name: alter_group_configs(port, "diff-groups", changes)
                                                 for name, changes in GROUP_ALTERATIONS.items()})
    found = differences(kafka, node)
    assert found == sorted(GROUP_ALTERATION_DIFFERENCES), "\n".join(found)
    assert all(code == 0 for name, (code, _) in kafka.items() if name in (
        "streams: one standby", "streams: the most standbys", "streams: session within bounds",
        "streams: interval and session", "streams: delete what is not set", "streams: no initial rebalance delay",
        "share: session within bounds", "share: interval and session", "share: delivery count limit",
        "share: record locks"))


def describe_configs(port: int, kind: int, name: str) -> dict[str, list]:
    """Every config of a resource: name -> [value, source, read-only, sensitive, type]."""
    body = R.request_body(DESCRIBE_CONFIGS, 4, "DescribeConfigsRequest", resources=(
        R.request_entity(DESCRIBE_CONFIGS, 4, "DescribeConfigsResource", resource_type=i8(kind), resource_name=name,
                         configuration_keys=None),), include_synonyms=False, include_documentation=False)
    (result,) = ask(port, DESCRIBE_CONFIGS, 4, body).results
    assert result.error_code == 0, result
    return {c.name: [c.value, int(c.config_source), c.read_only, c.is_sensitive, int(c.config_type)]
            for c in result.configs}


# What a topic's DescribeConfigs shows differently, each for a reason docs/compatibility.md gives.
TOPIC_CONFIG_DIFFERENCES = [
    # Not on this node: per-codec compression levels (KIP-390: the node keeps batches as produced), the share
    # groups' dead-letter queue, the bound on a batch's decompressed size, tiered storage's copy lag and switches.
    ".compression.gzip.level: ['-1', 5, False, False, 3] != '<absent>'",
    ".compression.lz4.level: ['9', 5, False, False, 3] != '<absent>'",
    ".compression.zstd.level: ['3', 5, False, False, 3] != '<absent>'",
    ".errors.deadletterqueue.group.enable: ['false', 5, False, False, 1] != '<absent>'",
    ".max.decompressed.message.bytes: ['2147483639', 5, False, False, 3] != '<absent>'",
    # Kafka 4 removed them; the node still takes them, so a 3.x topic config applies unchanged.
    ".message.downconversion.enable: '<absent>' != ['true', 5, False, False, 1]",
    ".message.format.version: '<absent>' != ['3.0-IV1', 5, False, False, 2]",
    ".message.timestamp.difference.max.ms: '<absent>' != ['9223372036854775807', 5, False, False, 5]",
    # Kafka's controller sets a cluster-wide min.insync.replicas when it formats (DYNAMIC_DEFAULT_BROKER_CONFIG).
    ".min.insync.replicas[1]: 3 != 5",
    ".remote.copy.lag.bytes: ['-1', 5, False, False, 5] != '<absent>'",
    ".remote.copy.lag.ms: ['0', 5, False, False, 5] != '<absent>'",
    ".remote.log.copy.disable: ['false', 5, False, False, 1] != '<absent>'",
    ".remote.log.delete.on.disable: ['false', 5, False, False, 1] != '<absent>'",
]


def test_describe_configs_of_a_topic_shows_what_kafka_shows(servers):
    def sequence(port: int) -> dict:
        create_topic(port, "described", configs={"retention.ms": "3600000", "cleanup.policy": "compact"})
        return describe_configs(port, TOPIC_RESOURCE, "described")

    kafka, node = on_both(servers, sequence)
    found = differences(kafka, node)
    assert found == TOPIC_CONFIG_DIFFERENCES, "\n".join(found)


# --------------------------------------------------------------------------- the broker's configs


BROKER_RESOURCE = 4
LISTENER_CONFIGS = ("listeners", "advertised.listeners")


def broker_id(port: int) -> str:
    """The id the broker answers Metadata as: the name of its broker resource (kafka-configs --entity-name)."""
    (broker,) = ask(port, R.METADATA, 8, R.metadata_body([], version=8, allow_auto_topic_creation=False)).brokers
    return str(broker.node_id)


def without_addresses(configs: dict[str, list]) -> dict[str, list]:
    """Ports and directories, which differ between any two brokers, as placeholders."""
    placed = {name: [re.sub(r":\d+", ":<port>", value), *rest] for name, (value, *rest) in configs.items()
              if name in LISTENER_CONFIGS and value}
    if "log.dirs" in configs:
        placed["log.dirs"] = ["<directory>", *configs["log.dirs"][1:]]
    return {**configs, **placed}


# Kafka's broker configs the node has no setting for, grouped by why: no such setting on a single Python node.
BROKER_CONFIGS_NOT_ON_THE_NODE = {
    "KRaft: its controller quorum, metadata log and broker registration": (
        "broker.heartbeat.interval.ms", "broker.session.timeout.ms", "controlled.shutdown.enable",
        "controller.listener.names", "controller.quorum.append.linger.ms", "controller.quorum.auto.join.enable",
        "controller.quorum.bootstrap.servers", "controller.quorum.election.backoff.max.ms",
        "controller.quorum.election.timeout.ms", "controller.quorum.fetch.max.bytes",
        "controller.quorum.fetch.snapshot.max.bytes", "controller.quorum.fetch.timeout.ms",
        "controller.quorum.request.timeout.ms", "controller.quorum.retry.backoff.ms", "controller.quorum.voters",
        "controller.quota.window.num", "controller.quota.window.size.seconds", "controller.socket.timeout.ms",
        "early.start.listeners", "initial.broker.registration.timeout.ms", "metadata.log.dir",
        "metadata.log.max.record.bytes.between.snapshots", "metadata.log.max.snapshot.interval.ms",
        "metadata.log.segment.bytes", "metadata.log.segment.ms", "metadata.max.idle.interval.ms",
        "metadata.max.retention.bytes", "metadata.max.retention.ms", "process.roles",
        "sasl.mechanism.controller.protocol"),
    "replication, leadership and requests between brokers (one node holds the only replica)": (
        "add.partitions.to.txn.retry.backoff.max.ms", "add.partitions.to.txn.retry.backoff.ms",
        "auto.leader.rebalance.enable", "broker.rack", "delete.records.purgatory.purge.interval.requests",
        "inter.broker.listener.name", "leader.imbalance.check.interval.seconds", "num.replica.fetchers",
        "replica.fetch.backoff.ms", "replica.fetch.max.bytes", "replica.fetch.min.bytes",
        "replica.fetch.response.max.bytes", "replica.fetch.wait.max.ms",
        "replica.high.watermark.checkpoint.interval.ms", "replica.lag.time.max.ms", "replica.selector.class",
        "replica.socket.receive.buffer.bytes", "replica.socket.timeout.ms", "replication.quota.window.num",
        "replication.quota.window.size.seconds", "request.timeout.ms", "sasl.mechanism.inter.broker.protocol",
        "security.inter.broker.protocol", "socket.connection.setup.timeout.max.ms",
        "socket.connection.setup.timeout.ms", "transaction.partition.verification.enable",
        "transaction.state.log.min.isr", "transaction.state.log.replication.factor"),
    "more than one log directory (the node has one data directory, shown as log.dirs)": (
        "alter.log.dirs.replication.quota.window.num", "alter.log.dirs.replication.quota.window.size.seconds",
        "cordoned.log.dirs", "log.dir", "log.dir.failure.timeout.ms", "num.replica.alter.log.dirs.threads"),
    "tiered storage (KIP-405)": (
        "follower.fetch.last.tiered.offset.enable", "log.remote.copy.lag.bytes", "log.remote.copy.lag.ms",
        "remote.fetch.max.wait.ms", "remote.list.offsets.request.timeout.ms",
        "remote.log.index.file.cache.total.size.bytes", "remote.log.manager.copier.thread.pool.size",
        "remote.log.manager.copy.max.bytes.per.second", "remote.log.manager.copy.quota.window.num",
        "remote.log.manager.copy.quota.window.size.seconds", "remote.log.manager.expiration.thread.pool.size",
        "remote.log.manager.fetch.max.bytes.per.second", "remote.log.manager.fetch.quota.window.num",
        "remote.log.manager.fetch.quota.window.size.seconds", "remote.log.manager.follower.thread.pool.size",
        "remote.log.manager.task.interval.ms", "remote.log.manager.thread.pool.size",
        "remote.log.metadata.custom.metadata.max.bytes", "remote.log.metadata.manager.class.name",
        "remote.log.metadata.manager.class.path", "remote.log.metadata.manager.impl.prefix",
        "remote.log.metadata.manager.listener.name", "remote.log.reader.max.pending.tasks",
        "remote.log.reader.threads", "remote.log.storage.manager.class.name",
        "remote.log.storage.manager.class.path", "remote.log.storage.manager.impl.prefix",
        "remote.log.storage.system.enable"),
    "share groups (KIP-932) and their dead-letter queue": (
        "errors.deadletterqueue.auto.create.topics.enable", "errors.deadletterqueue.topic.name.prefix",
        "group.share.assignment.interval.ms", "group.share.assignors", "group.share.delivery.count.limit",
        "group.share.heartbeat.interval.ms", "group.share.max.assignment.interval.ms",
        "group.share.max.delivery.count.limit", "group.share.max.heartbeat.interval.ms",
        "group.share.max.partition.max.record.locks", "group.share.max.record.lock.duration.ms",
        "group.share.max.session.timeout.ms", "group.share.max.share.sessions", "group.share.max.size",
        "group.share.min.assignment.interval.ms", "group.share.min.delivery.count.limit",
        "group.share.min.heartbeat.interval.ms", "group.share.min.partition.max.record.locks",
        "group.share.min.record.lock.duration.ms", "group.share.min.session.timeout.ms",
        "group.share.partition.max.record.locks", "group.share.record.lock.duration.ms",
        "group.share.session.timeout.ms", "share.coordinator.append.linger.ms",
        "share.coordinator.cached.buffer.max.bytes", "share.coordinator.load.buffer.size",
        "share.coordinator.snapshot.update.records.per.snapshot", "share.coordinator.state.topic.compression.codec",
        "share.coordinator.state.topic.min.isr", "share.coordinator.state.topic.num.partitions",
        "share.coordinator.state.topic.replication.factor", "share.coordinator.state.topic.segment.bytes",
        "share.coordinator.threads", "share.coordinator.write.timeout.ms",
        "share.fetch.purgatory.purge.interval.requests"),
    "streams groups (KIP-1071): its assignor runs in each heartbeat, sticky only; no rack tags or plug-ins": (
        "group.streams.assignment.interval.ms", "group.streams.assignors", "group.streams.max.assignment.interval.ms",
        "group.streams.min.assignment.interval.ms", "group.streams.rack.aware.assignment.tags",
        "group.streams.topology.description.plugin.class"),
    "APIs it does not have: delegation tokens, DescribeTopicPartitions, client telemetry, 2PC (KIP-939)": (
        "delegation.token.expiry.check.interval.ms", "delegation.token.expiry.time.ms",
        "delegation.token.max.lifetime.ms", "delegation.token.secret.key", "max.request.partition.size.limit",
        "telemetry.max.bytes", "transaction.two.phase.commit.enable"),
    "Java plug-ins, metrics reporters and config providers (its ACL authorizer is built in: [authorizer])": (
        "alter.config.policy.class.name", "authorizer.class.name", "client.quota.callback.class",
        "config.providers", "create.topic.policy.class.name", "kafka.metrics.polling.interval.secs",
        "kafka.metrics.reporters", "metric.reporters", "metrics.num.samples", "metrics.recording.level",
        "metrics.sample.window.ms", "principal.builder.class", "security.providers"),
    "JAAS logins, OAuth and callback classes (its SASL is SCRAM and PLAIN against its users store)": (
        "connection.failed.authentication.delay.ms", "sasl.client.callback.handler.class", "sasl.jaas.config",
        "sasl.login.callback.handler.class", "sasl.login.class", "sasl.login.connect.timeout.ms",
        "sasl.login.read.timeout.ms", "sasl.login.refresh.buffer.seconds", "sasl.login.refresh.min.period.seconds",
        "sasl.login.refresh.window.factor", "sasl.login.refresh.window.jitter", "sasl.login.retry.backoff.max.ms",
        "sasl.login.retry.backoff.ms", "sasl.oauthbearer.allow.unverified.audience",
        "sasl.oauthbearer.allow.unverified.issuer", "sasl.oauthbearer.assertion.algorithm",
        "sasl.oauthbearer.assertion.claim.aud", "sasl.oauthbearer.assertion.claim.exp.seconds",
        "sasl.oauthbearer.assertion.claim.iss", "sasl.oauthbearer.assertion.claim.jti.include",
        "sasl.oauthbearer.assertion.claim.nbf.seconds", "sasl.oauthbearer.assertion.claim.sub",
        "sasl.oauthbearer.assertion.file", "sasl.oauthbearer.assertion.private.key.file",
        "sasl.oauthbearer.assertion.private.key.passphrase", "sasl.oauthbearer.assertion.template.file",
        "sasl.oauthbearer.client.credentials.client.id", "sasl.oauthbearer.client.credentials.client.secret",
        "sasl.oauthbearer.clock.skew.seconds", "sasl.oauthbearer.expected.audience",
        "sasl.oauthbearer.expected.issuer", "sasl.oauthbearer.jwks.endpoint.refresh.ms",
        "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms", "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms",
        "sasl.oauthbearer.jwks.endpoint.url", "sasl.oauthbearer.jwt.retriever.class",
        "sasl.oauthbearer.jwt.validator.class", "sasl.oauthbearer.scope", "sasl.oauthbearer.scope.claim.name",
        "sasl.oauthbearer.sub.claim.name", "sasl.oauthbearer.token.endpoint.url",
        "sasl.server.callback.handler.class"),
    "TLS through Java keystores and JSSE (its [tls] takes PEM files, a CA file and a minimum version)": (
        "ssl.allow.dn.changes", "ssl.allow.san.changes", "ssl.cipher.suites", "ssl.client.auth",
        "ssl.enabled.protocols", "ssl.endpoint.identification.algorithm", "ssl.engine.factory.class",
        "ssl.key.password", "ssl.keymanager.algorithm", "ssl.keystore.certificate.chain", "ssl.keystore.key",
        "ssl.keystore.location", "ssl.keystore.password", "ssl.keystore.type", "ssl.principal.mapping.rules",
        "ssl.protocol", "ssl.provider", "ssl.secure.random.implementation", "ssl.trustmanager.algorithm",
        "ssl.truststore.certificates", "ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.type"),
    "KIP-848 assignment timing and protocol switches (it assigns in a heartbeat's answer)": (
        "group.consumer.assignment.interval.ms", "group.consumer.max.assignment.interval.ms",
        "group.consumer.migration.policy", "group.consumer.min.assignment.interval.ms",
        "group.coordinator.rebalance.protocols"),
    "thread pools, queues, load buffers and checkpoint timers of Kafka's JVM broker": (
        "background.threads", "group.coordinator.append.linger.ms", "group.coordinator.background.threads",
        "group.coordinator.cached.buffer.max.bytes", "group.coordinator.threads",
        "log.cleaner.io.buffer.load.factor", "log.flush.offset.checkpoint.interval.ms",
        "log.flush.scheduler.interval.ms", "log.flush.start.offset.checkpoint.interval.ms", "num.io.threads",
        "num.recovery.threads.per.data.dir", "offsets.load.buffer.size", "queued.max.requests",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms", "transaction.state.log.load.buffer.size"),
    "the hours, minutes and seconds forms (its retention, roll and quota windows are in ms)": (
        "log.retention.hours", "log.retention.minutes", "log.roll.hours", "log.roll.jitter.hours",
        "quota.window.size.seconds"),
    "partitions and codecs of the internal topics (its offsets and transaction logs are one log each)": (
        "offsets.topic.compression.codec", "transaction.state.log.num.partitions"),
    "limits it does not have (a fetch's bytes, connection rate, compression levels); topics are always deletable": (
        "compression.gzip.level", "compression.lz4.level", "compression.zstd.level", "delete.topic.enable",
        "fetch.max.bytes", "max.connection.creation.rate", "max.connections.per.ip.overrides",
        "max.decompressed.message.bytes"),
}
# Kafka 4 removed them; the node still takes them, so a 3.x broker config applies unchanged.
BROKER_CONFIGS_ONLY_ON_THE_NODE = {"log.message.downconversion.enable", "log.message.format.version",
                                   "log.message.timestamp.difference.max.ms"}
# What both show differently ([0] value, [1] source, [2] read-only): difference -> reason. docs/compatibility.md.
READ_AT_START = "the node reads it from its TOML file at start; Kafka alters it at run time"
CONTROLLER_LISTENER = "Kafka's KRaft controller has a listener of its own"
NODE_DEFAULT = "the node's own default"
BROKER_CONFIG_DIFFERENCES: dict[str, str] = {
    ".listener.security.protocol.map[0]: 'PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT' != 'PLAINTEXT:PLAINTEXT'":
        CONTROLLER_LISTENER,
    ".listener.security.protocol.map[2]: False != True": READ_AT_START,
    ".listeners[0]: 'PLAINTEXT://127.0.0.1:<port>,CONTROLLER://127.0.0.1:<port>' != 'PLAINTEXT://127.0.0.1:<port>'":
        CONTROLLER_LISTENER,
    ".listeners[2]: False != True": READ_AT_START,
    ".log.cleaner.backoff.ms[2]: False != True": READ_AT_START,
    ".log.cleaner.dedupe.buffer.size[2]: False != True": READ_AT_START,
    ".log.cleaner.io.buffer.size[0]: '524288' != '4194304'": NODE_DEFAULT + ": its cleaner decodes 4 MiB at a time",
    ".log.cleaner.io.buffer.size[2]: False != True": READ_AT_START,
    ".log.cleaner.io.max.bytes.per.second[0]: '1.7976931348623157E308' != '67108864'":
        NODE_DEFAULT + ": its cleaner leaves appends and fetches their cores (-1: no limit)",
    ".log.cleaner.io.max.bytes.per.second[2]: False != True": READ_AT_START,
    ".log.cleaner.threads[2]: False != True": READ_AT_START,
    ".log.flush.interval.ms[0]: None != '9223372036854775807'": "null on Kafka (its flusher's interval applies)",
    ".log.retention.ms[0]: None != '604800000'": "null on Kafka, which takes log.retention.hours; the node has ms",
    ".log.roll.jitter.ms[0]: None != '0'": "null on Kafka, which takes log.roll.jitter.hours; the node has ms",
    ".log.roll.ms[0]: None != '604800000'": "null on Kafka, which takes log.roll.hours; the node has ms",
    ".max.connections[2]: False != True": READ_AT_START,
    ".max.connections.per.ip[2]: False != True": READ_AT_START,
    ".min.insync.replicas[1]: 3 != 5": "Kafka's controller sets it cluster-wide when it formats",
    ".num.network.threads[0]: '3' != '1'": "the node's network threads are its worker processes, 1 here",
    ".num.network.threads[1]: 5 != 4": "the node's file sets [server] workers",
    ".num.network.threads[2]: False != True": READ_AT_START,
    ".num.partitions[1]: 4 != 5": "the node shows a setting its file gives the default value as DEFAULT_CONFIG",
    ".offsets.topic.num.partitions[0]: '50' != '1'": "the node's offsets log is one partition",
    ".offsets.topic.replication.factor[1]: 4 != 5": "the peer's file sets 1 (Kafka's default is 3); the node's is 1",
    ".producer.id.expiration.ms[2]: False != True": READ_AT_START,
    ".queued.max.request.bytes[0]: '-1' != '268435456'": NODE_DEFAULT + ": it bounds the memory of queued requests",
    ".sasl.enabled.mechanisms[0]: 'GSSAPI' != 'SCRAM-SHA-256,SCRAM-SHA-512,PLAIN'": "the node has no GSSAPI (Kerberos)",
    ".sasl.enabled.mechanisms[2]: False != True": READ_AT_START,
    ".socket.listen.backlog.size[0]: '50' != '1024'": NODE_DEFAULT,
    ".socket.receive.buffer.bytes[0]: '102400' != '1048576'": NODE_DEFAULT,
    ".socket.send.buffer.bytes[0]: '102400' != '1048576'": NODE_DEFAULT,
}


def test_describe_configs_of_the_broker_shows_what_kafka_shows(servers):
    """Every broker config Kafka shows: the node shows it with the same value, source, read-only and sensitive
    flags and type, or it is pinned here (absent, or a difference with its reason)."""
    kafka, node = on_both(servers, lambda port: without_addresses(describe_configs(port, BROKER_RESOURCE,
                                                                                   broker_id(port))))
    pinned = {key for keys in BROKER_CONFIGS_NOT_ON_THE_NODE.values() for key in keys}
    assert {"new on Kafka": sorted(set(kafka) - set(node) - pinned), "no longer missing": sorted(pinned & set(node)),
            "only on the node": sorted(set(node) - set(kafka))} == {
        "new on Kafka": [], "no longer missing": [], "only on the node": sorted(BROKER_CONFIGS_ONLY_ON_THE_NODE)}
    both = set(kafka) & set(node)
    found = differences({key: kafka[key] for key in both}, {key: node[key] for key in both})
    assert found == list(BROKER_CONFIG_DIFFERENCES), "\n".join(found)


# --------------------------------------------------------------------------- consumer groups


CONSUMER_GROUP_HEARTBEAT = 68


FIND_COORDINATOR = 10


def find_coordinator(port: int, key: str, key_type: int = 0) -> None:
    """Ask for the coordinator of a group (0) or a transactional id (1) until the broker answers with it: Kafka
    makes its internal topic on the first ask and answers COORDINATOR_NOT_AVAILABLE (then NOT_COORDINATOR for
    the requests themselves) until its partition is loaded."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        answer = ask(port, FIND_COORDINATOR, 4, R.request_body(FIND_COORDINATOR, 4, "FindCoordinatorRequest",
                                                                key_type=i8(key_type), coordinator_keys=(key,)))
        # A group's coordinator also serves it once its OffsetFetch answers (its partition loaded).
        if answer.coordinators[0].error_code == 0 and (key_type != 0 or not offset_fetch(port, key, "-").error_code):
            return
        time.sleep(0.1)
    raise AssertionError(f"no coordinator for {key!r} in {TIMEOUT_MS} ms")


def join(port: int, group: str, member: str, instance: str | None = None) -> Any:
    protocol = R.request_entity(JOIN_GROUP, 7, "JoinGroupRequestProtocol", name="range", metadata=b"")
    return ask(port, JOIN_GROUP, 7, R.request_body(
        JOIN_GROUP, 7, "JoinGroupRequest", group_id=group, session_timeout=i32Timedelta.parse(timedelta(seconds=10)),
        rebalance_timeout=i32Timedelta.parse(timedelta(seconds=10)), member_id=member, group_instance_id=instance,
        protocol_type="consumer", protocols=(protocol,)))


def sync(port: int, group: str, generation: int, member: str, instance: str | None = None) -> Any:
    return ask(port, SYNC_GROUP, 5, R.request_body(
        SYNC_GROUP, 5, "SyncGroupRequest", group_id=group, generation_id=i32(generation), member_id=member,
        group_instance_id=instance, protocol_type="consumer", protocol_name="range", assignments=(
            R.request_entity(SYNC_GROUP, 5, "SyncGroupRequestAssignment", member_id=member, assignment=b""),)))


def heartbeat(port: int, group: str, generation: int, member: str, instance: str | None = None) -> Any:
    return ask(port, HEARTBEAT, 4, R.request_body(HEARTBEAT, 4, "HeartbeatRequest", group_id=group,
                                                   generation_id=i32(generation), member_id=member,
                                                   group_instance_id=instance))


def commit(port: int, group: str, generation: int, member: str, topic: str, partition: int, offset: int) -> Any:
    return ask(port, OFFSET_COMMIT, 8, R.request_body(
        OFFSET_COMMIT, 8, "OffsetCommitRequest", group_id=group, generation_id_or_member_epoch=i32(generation),
        member_id=member, group_instance_id=None, topics=(
            R.request_entity(OFFSET_COMMIT, 8, "OffsetCommitRequestTopic", name=topic, partitions=(
                R.request_entity(OFFSET_COMMIT, 8, "OffsetCommitRequestPartition", partition_index=i32(partition),
                                 committed_offset=i64(offset), committed_leader_epoch=i32(-1),
                                 committed_metadata="m"),)),)))


def offset_fetch(port: int, group: str, topic: str) -> Any:
    return ask(port, OFFSET_FETCH, 7, R.request_body(
        OFFSET_FETCH, 7, "OffsetFetchRequest", group_id=group, require_stable=True, topics=(
            R.request_entity(OFFSET_FETCH, 7, "OffsetFetchRequestTopic", name=topic,
                             partition_indexes=(i32(0), i32(5))),)))


def test_classic_group_errors_are_kafkas(servers):
    def sequence(port: int) -> dict:
        create_topic(port, "group-offsets")
        for group in ("no-such-group", "no-such-group-2", "no-such-group-3", "simple", "classic", "static"):
            find_coordinator(port, group)
        answers = {
            "heartbeat, no such group": heartbeat(port, "no-such-group", 1, "m"),
            "commit, no such group, a generation": commit(port, "no-such-group-2", 5, "ghost", "group-offsets", 0, 1),
            "commit, simple": commit(port, "simple", -1, "", "group-offsets", 0, 10),
            "commit, no such partition": commit(port, "simple", -1, "", "group-offsets", 5, 10),
            "commit, no such topic": commit(port, "simple", -1, "", "no-such-topic-g", 0, 10),
            "fetch, simple": offset_fetch(port, "simple", "group-offsets"),
            "fetch, no such group": offset_fetch(port, "no-such-group-3", "group-offsets"),
        }
        first = join(port, "classic", "")
        answers["join without a member id"] = first
        member = first.member_id
        joined = join(port, "classic", member)
        answers["join"] = joined
        generation = joined.generation_id
        answers["sync, another generation"] = sync(port, "classic", generation + 1, member)
        answers["sync, unknown member"] = sync(port, "classic", generation, "stranger")
        answers["sync"] = sync(port, "classic", generation, member)
        answers["heartbeat"] = heartbeat(port, "classic", generation, member)
        answers["heartbeat, old generation"] = heartbeat(port, "classic", generation - 1, member)
        answers["heartbeat, unknown member"] = heartbeat(port, "classic", generation, "stranger")
        answers["commit, member"] = commit(port, "classic", generation, member, "group-offsets", 0, 3)
        answers["commit, old generation"] = commit(port, "classic", generation - 1, member, "group-offsets", 0, 4)
        answers["commit, unknown member"] = commit(port, "classic", generation, "stranger", "group-offsets", 0, 4)
        answers["commit, simple into a live group"] = commit(port, "classic", -1, "", "group-offsets", 0, 4)
        # Static membership: a second join with the same instance id fences the first member id.
        static = join(port, "static", "", instance="instance-1")
        answers["static join"] = static
        static_sync = sync(port, "static", static.generation_id, static.member_id, "instance-1")
        answers["static sync"] = static_sync
        again = join(port, "static", "", instance="instance-1")
        answers["static join again"] = again
        answers["fenced heartbeat"] = heartbeat(port, "static", static.generation_id, static.member_id, "instance-1")
        return answers

    kafka, node = on_both(servers, sequence)
    found = differences(kafka, node)
    assert not found, "\n".join(found)


def consumer_heartbeat(port: int, group: str, member: str, epoch: int, topics: tuple[str, ...] | None) -> Any:
    return ask(port, CONSUMER_GROUP_HEARTBEAT, 0, R.request_body(
        CONSUMER_GROUP_HEARTBEAT, 0, "ConsumerGroupHeartbeatRequest", group_id=group, member_id=member,
        member_epoch=i32(epoch), instance_id=None, rack_id=None,
        rebalance_timeout=i32Timedelta.parse(timedelta(seconds=10)), subscribed_topic_names=topics,
        server_assignor=None, topic_partitions=() if epoch == 0 else None))


def test_consumer_group_heartbeat_answers_are_kafkas(servers):
    def sequence(port: int) -> dict:
        create_topic(port, "kip848", partitions=2)
        find_coordinator(port, "kip848-group")
        member = str(uuid.uuid4())
        answers = {
            "unknown member, epoch 5": consumer_heartbeat(port, "kip848-group", member, 5, None),
            "join": consumer_heartbeat(port, "kip848-group", member, 0, ("kip848",)),
        }
        epoch = answers["join"].member_epoch
        answers["a newer epoch"] = consumer_heartbeat(port, "kip848-group", member, epoch + 1, None)
        answers["leave"] = consumer_heartbeat(port, "kip848-group", member, -1, None)
        answers["after leaving"] = consumer_heartbeat(port, "kip848-group", member, epoch, None)
        return answers

    kafka, node = on_both(servers, sequence)
    # Kafka 4.4 runs the assignor apart from the heartbeat: its first answer carries the assignment or not, by
    # timing, at a member epoch that counts its group epoch's bumps. The node assigns in that first answer, at
    # epoch 1. Both are within the protocol (a member takes what an answer brings); compared: the codes.
    for answers in (kafka, node):
        answers["join"] = answers["join"]["error_code"]
    found = differences(plain(kafka, IGNORED | {"heartbeat_interval"}), plain(node, IGNORED | {"heartbeat_interval"}))
    # A heartbeat of a member of a group the coordinator does not know: Kafka GROUP_ID_NOT_FOUND (69), which its
    # clients take as fatal; the node UNKNOWN_MEMBER_ID (25), so members rejoin after a node restart (the node
    # keeps no KIP-848 membership across one; Kafka keeps it in __consumer_offsets). docs/compatibility.md.
    assert found == [".unknown member, epoch 5.error_code: 69 != 25"], "\n".join(found)


# --------------------------------------------------------------------------- streams groups (KIP-1071)


STREAMS_GROUP_HEARTBEAT, STREAMS_GROUP_DESCRIBE = 88, 89


def streams_heartbeat(port: int, group: str, member: str, epoch: int, topology: Any = None,
                      instance: str | None = None) -> Any:
    return ask(port, STREAMS_GROUP_HEARTBEAT, 0, R.request_body(
        STREAMS_GROUP_HEARTBEAT, 0, "StreamsGroupHeartbeatRequest", group_id=group, member_id=member,
        member_epoch=i32(epoch), endpoint_information_epoch=i32(0), instance_id=instance, rack_id=None,
        rebalance_timeout=i32Timedelta.parse(timedelta(seconds=10 if epoch == 0 else -0.001)), topology=topology,
        active_tasks=() if epoch == 0 else None, standby_tasks=() if epoch == 0 else None,
        warmup_tasks=() if epoch == 0 else None, process_id="p" if epoch == 0 else None, user_endpoint=None,
        client_tags=() if epoch == 0 else None, task_offsets=None, task_end_offsets=None, shutdown_application=False))


def one_subtopology(source: str, changelog: str, changelog_partitions: int = 0, regex: tuple = ()) -> Any:
    """A topology of one subtopology reading `source` into a store with a changelog."""
    def entity(class_name: str, /, **fields: Any) -> Any:
        return R.request_entity(STREAMS_GROUP_HEARTBEAT, 0, class_name, **fields)
    return entity("Topology", epoch=i32(0), subtopologies=(entity(
        "Subtopology", subtopology_id="0", source_topics=(source,), source_topic_regex=regex,
        state_changelog_topics=(entity("TopicInfo", name=changelog, partitions=i32(changelog_partitions),
                                       replication_factor=i16(0), topic_configs=()),),
        repartition_sink_topics=(), repartition_source_topics=(), copartition_groups=()),))


def test_streams_group_heartbeat_errors_are_kafkas(servers):
    def sequence(port: int) -> dict:
        create_topic(port, "kip1071", partitions=2)
        group = "kip1071-group"
        find_coordinator(port, group)
        topology = one_subtopology("kip1071", "kip1071-group-store-changelog")
        member = str(uuid.uuid4())
        answers = {
            "unknown group, epoch 5": streams_heartbeat(port, group + "-unknown", member, 5),
            "changelog with partitions": streams_heartbeat(port, group, member, 0, one_subtopology(
                "kip1071", "c", changelog_partitions=3)),
            "source regex": streams_heartbeat(port, group, member, 0, one_subtopology("kip1071", "c", regex=("k.*",))),
            "join without topology": streams_heartbeat(port, group, member, 0),
            "join": streams_heartbeat(port, group, member, 0, topology),
        }
        epoch = answers["join"].member_epoch
        answers["unknown member, epoch 5"] = streams_heartbeat(port, group, "stranger", 5)
        answers["a newer epoch"] = streams_heartbeat(port, group, member, epoch + 1)
        answers["another topology"] = streams_heartbeat(port, group, "other", 0, one_subtopology("kip1071", "x"))
        answers["topology outside a join"] = streams_heartbeat(port, group, member, epoch, topology)
        answers["static join"] = streams_heartbeat(port, group, "static-1", 0, topology, instance="instance-1")
        answers["static leave"] = streams_heartbeat(port, group, "static-1", -2, instance="instance-1")
        answers["the instance back"] = streams_heartbeat(port, group, "static-2", 0, topology, instance="instance-1")
        answers["the instance taken"] = streams_heartbeat(port, group, "static-3", 0, topology, instance="instance-1")
        answers["leave"] = streams_heartbeat(port, group, member, -1)
        answers["after leaving"] = streams_heartbeat(port, group, member, epoch)
        answers["describe, unknown"] = ask(port, STREAMS_GROUP_DESCRIBE, 0, R.request_body(
            STREAMS_GROUP_DESCRIBE, 0, "StreamsGroupDescribeRequest", group_ids=(group + "-unknown",),
            include_authorized_operations=False))
        return answers

    kafka, node = on_both(servers, sequence)
    # Compared: the error codes and the member epochs of leaving. Kafka 4.4 delays a new group's assignment
    # (ASSIGNMENT_DELAYED) and creates internal topics apart; the node assigns at once: epochs, tasks and statuses
    # differ within the protocol (docs/compatibility.md).
    codes = {name: answer["error_code"] if name != "describe, unknown" else answer
             for name, answer in kafka.items()}, {name: answer["error_code"] if name != "describe, unknown"
                                                  else answer for name, answer in node.items()}
    for answers, source in zip(codes, (kafka, node)):
        for name in ("static leave", "leave"):
            answers[name] = (source[name]["error_code"], source[name]["member_epoch"])
    found = differences(*codes)
    # A heartbeat of a group the coordinator does not know: Kafka GROUP_ID_NOT_FOUND (69), the node
    # UNKNOWN_MEMBER_ID (25), so that members rejoin (docs/compatibility.md).
    assert found == [".unknown group, epoch 5: 69 != 25"], "\n".join(found)


# --------------------------------------------------------------------------- transactions


def init_producer_id(port: int, transactional_id: str | None, producer_id: int = -1, epoch: int = -1) -> Any:
    return ask(port, R.INIT_PRODUCER_ID, 4, R.request_body(
        R.INIT_PRODUCER_ID, 4, "InitProducerIdRequest", transactional_id=transactional_id,
        transaction_timeout=R.millis(60_000), producer_id=i64(producer_id), producer_epoch=i16(epoch)))


def add_partitions(port: int, transactional_id: str, producer_id: int, epoch: int, topic: str) -> Any:
    return ask(port, ADD_PARTITIONS_TO_TXN, 3, R.request_body(
        ADD_PARTITIONS_TO_TXN, 3, "AddPartitionsToTxnRequest", v3_and_below_transactional_id=transactional_id,
        v3_and_below_producer_id=i64(producer_id), v3_and_below_producer_epoch=i16(epoch), v3_and_below_topics=(
            R.request_entity(ADD_PARTITIONS_TO_TXN, 3, "AddPartitionsToTxnTopic", name=topic,
                             partitions=(i32(0),)),)))


def end_txn(port: int, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> Any:
    return ask(port, END_TXN, 3, R.request_body(END_TXN, 3, "EndTxnRequest", transactional_id=transactional_id,
                                                 producer_id=i64(producer_id), producer_epoch=i16(epoch),
                                                 committed=commit))


COORDINATOR_LOADING = (14, 15, 16)  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR


CONCURRENT_TRANSACTIONS = 51


def error_of(answer: Any) -> int:
    """An answer's error code (AddPartitionsToTxn v3 and older: its first partition's)."""
    if hasattr(answer, "error_code"):
        return int(answer.error_code)
    return int(answer.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)


def while_loading(call: Callable[[], Any], also: tuple[int, ...] = ()) -> Any:
    """A coordinator's answer once its partition is loaded: Kafka loads __transaction_state's partitions a
    moment after it makes the topic, and a client retries these codes (the node answers at once)."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while error_of(answer := call()) in (*COORDINATOR_LOADING, *also) and time.monotonic() < deadline:
        time.sleep(0.1)
    return answer


def test_transaction_errors_are_kafkas(servers):
    def sequence(port: int) -> dict:
        create_topic(port, "txn-errors")
        find_coordinator(port, "tx-a", key_type=1)
        find_coordinator(port, "tx-unknown", key_type=1)
        first = while_loading(lambda: init_producer_id(port, "tx-a"))
        answers = {"init": first,
                   "end, unknown id": while_loading(lambda: end_txn(port, "tx-unknown", 5000, 0, True))}
        pid, epoch = int(first.producer_id), int(first.producer_epoch)
        answers["end, nothing begun"] = end_txn(port, "tx-a", pid, epoch, True)
        answers["add, another producer id"] = add_partitions(port, "tx-a", pid + 1, epoch, "txn-errors")
        answers["add, a newer epoch"] = add_partitions(port, "tx-a", pid, epoch + 1, "txn-errors")
        answers["add"] = add_partitions(port, "tx-a", pid, epoch, "txn-errors")
        answers["add, no such topic"] = add_partitions(port, "tx-a", pid, epoch, "no-such-topic-txn")
        answers["end, another producer id"] = end_txn(port, "tx-a", pid + 1, epoch, True)
        answers["abort"] = end_txn(port, "tx-a", pid, epoch, False)
        # Kafka writes an abort's markers after it answers, and answers CONCURRENT_TRANSACTIONS meanwhile (a client
        # retries it); the node answers once they are written.
        answers["commit after the abort"] = while_loading(lambda: end_txn(port, "tx-a", pid, epoch, True),
                                                          also=(CONCURRENT_TRANSACTIONS,))
        second = while_loading(lambda: init_producer_id(port, "tx-a"), also=(CONCURRENT_TRANSACTIONS,))  # fences
        answers["init again"] = second
        answers["add, fenced epoch"] = add_partitions(port, "tx-a", pid, epoch, "txn-errors")
        answers["end, fenced epoch"] = end_txn(port, "tx-a", pid, epoch, True)
        return answers

    kafka, node = on_both(servers, sequence)
    found = differences(plain(kafka, IGNORED | {"producer_id"}), plain(node, IGNORED | {"producer_id"}))
    assert not found, "\n".join(found)


# --------------------------------------------------------------------------- ApiVersions


def api_versions(port: int) -> dict[int, list[int]]:
    answer = ask(port, R.API_VERSIONS, 3, R.api_versions_body(3))
    return {int(k.api_key): [int(k.min_version), int(k.max_version)] for k in answer.api_keys}


# API key -> [Kafka's version range, the node's]: every API whose ranges differ. The reasons, in
# docs/compatibility.md: the node's newest versions are those of the kio schemas it decodes with (Kafka 4.4's newer
# ones: topic ids in Produce and commits, KIP-890's transactions v2, KIP-939); it still takes versions Kafka 4 removed
# (KIP-896: CreateTopics 0-1, DeleteTopics 0, the ACL APIs and DescribeConfigs 0); it has none of the replication,
# KRaft, delegation token, client quota and tiered storage APIs, the share coordinator's APIs (KIP-932), and
# streams groups' v1 APIs (KIP-1071).
API_VERSION_DIFFERENCES = {
    0: [[0, 13], [3, 11]],  # produce
    1: [[4, 18], [4, 17]],  # fetch
    2: [[1, 11], [1, 10]],  # list_offsets
    8: [[2, 10], [2, 9]],  # offset_commit
    9: [[1, 10], [1, 9]],  # offset_fetch
    11: [[0, 9], [0, 8]],  # join_group
    18: [[0, 5], [0, 4]],  # api_versions
    19: [[2, 7], [0, 7]],  # create_topics
    20: [[1, 6], [0, 6]],  # delete_topics
    22: [[0, 5], [0, 4]],  # init_producer_id
    23: [[2, 4], None],  # offset_for_leader_epoch
    24: [[0, 5], [0, 3]],  # add_partitions_to_txn
    25: [[0, 4], [0, 3]],  # add_offsets_to_txn
    26: [[0, 5], [0, 3]],  # end_txn
    28: [[0, 6], [0, 3]],  # txn_offset_commit
    29: [[1, 3], [0, 3]],  # describe_acls
    30: [[1, 3], [0, 3]],  # create_acls
    31: [[1, 3], [0, 3]],  # delete_acls
    32: [[1, 4], [0, 4]],  # describe_configs
    34: [[1, 2], None],  # alter_replica_log_dirs
    35: [[1, 5], None],  # describe_log_dirs
    38: [[1, 3], None],  # create_delegation_token
    39: [[1, 2], None],  # renew_delegation_token
    40: [[1, 2], None],  # expire_delegation_token
    41: [[1, 3], None],  # describe_delegation_token
    42: [[0, 3], [0, 2]],  # delete_groups
    43: [[0, 2], None],  # elect_leaders
    45: [[0, 1], None],  # alter_partition_reassignments
    46: [[0, 0], None],  # list_partition_reassignments
    49: [[0, 1], None],  # alter_client_quotas
    57: [[0, 2], None],  # update_features
    64: [[0, 0], None],  # unregister_broker
    74: [[0, 1], None],  # list_config_resources
    75: [[0, 0], None],  # describe_topic_partitions
    80: [[0, 1], None],  # add_raft_voter
    81: [[0, 0], None],  # remove_raft_voter
    83: [[0, 0], None],  # initialize_share_group_state
    84: [[0, 0], None],  # read_share_group_state
    85: [[0, 1], None],  # write_share_group_state
    86: [[0, 0], None],  # delete_share_group_state
    87: [[0, 1], None],  # read_share_group_state_summary
    88: [[0, 1], [0, 0]],  # streams_group_heartbeat (1: KIP-1331's topology descriptions)
    89: [[0, 1], [0, 0]],  # streams_group_describe
    93: [[0, 0], None],  # newer than kio's schemas
    94: [[0, 0], None],  # newer than kio's schemas
}


def test_api_versions_side_by_side(servers):
    """Each API's version range on both; every difference is in API_VERSION_DIFFERENCES, and
    docs/compatibility.md gives its reason."""
    kafka, node = on_both(servers, api_versions)
    found = {key: [kafka.get(key), node.get(key)] for key in sorted(set(kafka) | set(node))
             if kafka.get(key) != node.get(key)}
    assert found == API_VERSION_DIFFERENCES


# --------------------------------------------------------------------------- more edges


CREATE_PARTITIONS = 37


def create_partitions(port: int, changes: dict[str, tuple[int, list | None]], validate_only: bool) -> list[list]:
    """One CreatePartitions: each topic's (name, error code)."""
    topics = tuple(R.request_entity(CREATE_PARTITIONS, 3, "CreatePartitionsTopic", name=name, count=i32(count),
                                    assignments=None if assignments is None else tuple(
                                        R.request_entity(CREATE_PARTITIONS, 3, "CreatePartitionsAssignment",
                                                         broker_ids=tuple(i32(b) for b in brokers))
                                        for brokers in assignments))
                   for name, (count, assignments) in changes.items())
    answer = ask(port, CREATE_PARTITIONS, 3, R.request_body(CREATE_PARTITIONS, 3, "CreatePartitionsRequest",
                                                             topics=topics, timeout=R.millis(TIMEOUT_MS),
                                                             validate_only=validate_only))
    return sorted([r.name, int(r.error_code)] for r in answer.results)


def test_create_partitions_refuses_what_kafka_refuses(servers):
    def sequence(port: int) -> dict:
        for name in ("grow", "shrink", "same", "two-replicas"):
            create_topic(port, name, partitions=2)
        changes = {"grow": (3, None), "shrink": (1, None), "same": (2, None), "no-such-topic-p": (3, None),
                   "two-replicas": (3, [[1, 2]])}
        return {"validate only": create_partitions(port, changes, True),
                "create": create_partitions(port, changes, False)}

    kafka, node = on_both(servers, sequence)
    found = differences(kafka, node)
    assert not found, "\n".join(found)


def transactional_produce(port: int, transactional_id: str, producer_id: int, epoch: int, sequence: int,
                          topic: str, values: list[bytes]) -> int:
    batch = records.build_batch([(None, value) for value in values], int(time.time() * 1000), producer_id=producer_id,
                                producer_epoch=epoch, base_sequence=sequence, transactional=True)
    body = R.request_body(R.PRODUCE, 8, "ProduceRequest", transactional_id=transactional_id, acks=i16(-1),
                          timeout=R.millis(TIMEOUT_MS), topic_data=(
        R.request_entity(R.PRODUCE, 8, "TopicProduceData", name=topic, partition_data=(
            R.request_entity(R.PRODUCE, 8, "PartitionProduceData", index=i32(0), records=batch),)),))
    return int(ask(port, R.PRODUCE, 8, body).responses[0].partition_responses[0].error_code)


def test_read_committed_fetches_and_offsets_skip_aborted_transactions_as_kafka(servers):
    def sequence(port: int) -> dict:
        create_topic(port, "committed-reads")
        # Timestamps of now: Kafka rolls a segment when a batch is segment.ms newer than the segment's first, and
        # answers a Fetch from one segment; the markers, which brokers write with their clock, would roll one.
        produce_batches(port, "committed-reads", 1, 3, start_ms=int(time.time() * 1000))  # offsets 0-2
        find_coordinator(port, "reader-tx", key_type=1)
        init = while_loading(lambda: init_producer_id(port, "reader-tx"))
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
        answers: dict[str, Any] = {}
        sequence_number = 0
        for outcome, count in (("abort", 4), ("commit", 2), ("open", 3)):
            answers[f"add ({outcome})"] = while_loading(
                lambda: add_partitions(port, "reader-tx", pid, epoch, "committed-reads"),
                also=(CONCURRENT_TRANSACTIONS,))
            answers[f"produce ({outcome})"] = transactional_produce(
                port, "reader-tx", pid, epoch, sequence_number, "committed-reads",
                [b"%s-%d" % (outcome.encode(), i) for i in range(count)])
            sequence_number += count
            if outcome != "open":
                answers[outcome] = end_txn(port, "reader-tx", pid, epoch, outcome == "commit")
        for isolation in (0, 1):
            for offset in (0, 3, 8):
                got = fetch(port, "committed-reads", offset, isolation_level=isolation, timestamps=False)
                got["aborted"] = [[producer == pid, first] for producer, first in got["aborted"]]
                answers[f"fetch at {offset}, isolation {isolation}"] = got
            answers[f"latest, isolation {isolation}"] = ask(port, R.LIST_OFFSETS, LIST_OFFSETS_VERSION, R.request_body(
                R.LIST_OFFSETS, LIST_OFFSETS_VERSION, "ListOffsetsRequest", replica_id=i32(-1),
                isolation_level=isolation, topics=(R.request_entity(
                    R.LIST_OFFSETS, LIST_OFFSETS_VERSION, "ListOffsetsTopic", name="committed-reads", partitions=(
                        R.request_entity(R.LIST_OFFSETS, LIST_OFFSETS_VERSION, "ListOffsetsPartition",
                                         partition_index=i32(0), current_leader_epoch=i32(-1),
                                         timestamp=i64(-1)),)),)))
        # DeleteRecords may go past the open transaction's first records (up to the high watermark): Kafka 4.4
        # still answers the transaction's first offset as the last stable offset, below the log start.
        answers["delete into the open one"] = delete_records(port, "committed-reads", 12)
        got = fetch(port, "committed-reads", 12, isolation_level=1, timestamps=False)
        got["aborted"] = [[producer == pid, first] for producer, first in got["aborted"]]
        answers["fetch at 12 after it, isolation 1"] = got
        answers["latest after it, isolation 1"] = ask(port, R.LIST_OFFSETS, LIST_OFFSETS_VERSION, R.request_body(
            R.LIST_OFFSETS, LIST_OFFSETS_VERSION, "ListOffsetsRequest", replica_id=i32(-1), isolation_level=1,
            topics=(R.request_entity(
                R.LIST_OFFSETS, LIST_OFFSETS_VERSION, "ListOffsetsTopic", name="committed-reads", partitions=(
                    R.request_entity(R.LIST_OFFSETS, LIST_OFFSETS_VERSION, "ListOffsetsPartition",
                                     partition_index=i32(0), current_leader_epoch=i32(-1), timestamp=i64(-1)),)),)))
        answers["abort the open one"] = end_txn(port, "reader-tx", pid, epoch, False)
        return answers

    kafka, node = on_both(servers, sequence)
    found = differences(kafka, node)
    assert not found, "\n".join(found)


def test_a_rebalance_in_progress_is_answered_as_kafka(servers):
    def sequence(port: int) -> dict:
        create_topic(port, "rebalance-offsets")
        find_coordinator(port, "rebalancing")
        first = join(port, "rebalancing", "")
        member_a = first.member_id
        joined = join(port, "rebalancing", member_a)
        generation = joined.generation_id
        answers = {"sync a": sync(port, "rebalancing", generation, member_a)}
        protocol = R.request_entity(JOIN_GROUP, 7, "JoinGroupRequestProtocol", name="range", metadata=b"")
        with R.RawConnection("127.0.0.1", port) as second:
            def join_b(member: str) -> int:
                return second.send(JOIN_GROUP, 7, R.request_body(
                    JOIN_GROUP, 7, "JoinGroupRequest", group_id="rebalancing",
                    session_timeout=i32Timedelta.parse(timedelta(seconds=10)),
                    rebalance_timeout=i32Timedelta.parse(timedelta(seconds=10)), member_id=member,
                    group_instance_id=None, protocol_type="consumer", protocols=(protocol,)))

            join_b("")
            _, _, _, body = second.recv_response()
            member_b = R.decode_response(JOIN_GROUP, 7, body).member_id
            join_b(member_b)  # held until member a rejoins: the group is rebalancing meanwhile
            time.sleep(0.5)
            answers["heartbeat a, rebalancing"] = heartbeat(port, "rebalancing", generation, member_a)
            answers["commit a, rebalancing"] = commit(port, "rebalancing", generation, member_a, "rebalance-offsets",
                                                      0, 1)
            answers["sync a, rebalancing"] = sync(port, "rebalancing", generation, member_a)
            answers["rejoin a"] = join(port, "rebalancing", member_a)
            _, _, _, body = second.recv_response()
            answers["join b"] = R.decode_response(JOIN_GROUP, 7, body)
        return answers

    kafka, node = on_both(servers, sequence)
    for answers in (kafka, node):  # the leader gets every member, each broker in its own order
        for name in ("rejoin a", "join b"):
            answers[name]["members"] = len(answers[name]["members"])
    found = differences(kafka, node)
    assert not found, "\n".join(found)
