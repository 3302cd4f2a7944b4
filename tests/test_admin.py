"""Topic administration against a real node with real clients: CreateTopics (replica assignments, configs,
validate-only, timeouts), topic configs applied and surviving restarts, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs, CreatePartitions, DeleteRecords, ListOffsets by timestamp."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource,
                                   NewPartitions, NewTopic)
from kio.static.primitive import i8, i32, i64

from shmbroker.node.storage.records import parse_header
from scripts.harness import rawkafka as R
from shmbroker.shm import instance as shm_instance
from shmbroker.shm.table import PartitionTable
from tests.test_clients import CLIENT_TIMEOUT_S, consume_all, produce
from tests.test_groups_protocol import body, nested
from shmbroker.workers.codecs import protocol as P

NONE, OFFSET_OUT_OF_RANGE, REQUEST_TIMED_OUT, MESSAGE_TOO_LARGE, INVALID_TIMESTAMP = 0, 1, 7, 10, 32
INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR, INVALID_REPLICA_ASSIGNMENT, INVALID_CONFIG = 37, 38, 39, 40
UNKNOWN_TOPIC, INVALID_REQUEST, TOPIC_ALREADY_EXISTS = 3, 42, 36
TOPIC, BROKER = 2, 4


_ADMINS: dict[str, AdminClient] = {}


@pytest.fixture(autouse=True)
def _forget_admins():
    yield
    _ADMINS.clear()  # a client of a stopped node would go on reconnecting


def admin(node) -> AdminClient:
    """One AdminClient per node, kept alive (a client destroyed before its futures resolve fails them)."""
    if node.bootstrap not in _ADMINS:
        _ADMINS[node.bootstrap] = AdminClient({"bootstrap.servers": node.bootstrap})
    return _ADMINS[node.bootstrap]


def outcome(future):
    """None on success, else the KafkaError code."""
    try:
        future.result(timeout=CLIENT_TIMEOUT_S)
        return None
    except KafkaException as exc:
        return exc.args[0].code()


def describe(node, topic: str) -> dict:
    resource = ConfigResource("topic", topic)
    return admin(node).describe_configs([resource])[resource].result(timeout=CLIENT_TIMEOUT_S)


def catalog(node) -> dict:
    return orjson.loads((node.data_dir / "catalog.json").read_bytes())


def metadata_partitions(node, topic: str) -> int | None:
    with R.RawConnection("127.0.0.1", node.port) as conn:
        meta = conn.call(P.METADATA, 8, R.metadata_body([topic], allow_auto_topic_creation=False))
    (found,) = meta.topics
    return len(found.partitions) if int(found.error_code) == NONE else None


# -- CreateTopics ----------------------------------------------------------------------------------


def test_create_topics_checks_assignments_factors_and_configs(node):
    a = admin(node)
    futures = a.create_topics([
        NewTopic("assigned", 3, replica_assignment=[[0], [0], [0]]),
        NewTopic("other-broker", 2, replica_assignment=[[0], [1]]),
        NewTopic("uneven", 2, replica_assignment=[[0], [0, 0]]),
        NewTopic("three-replicas", 2, 3),
        NewTopic("configured", 2, 1, config={"retention.ms": "3600000", "message.timestamp.type": "LogAppendTime",
                                             "delete.retention.ms": "900", "compression.type": "lz4"}),
        NewTopic("unknown-key", 1, 1, config={"dummy.doesntexist": "x"}),
        NewTopic("bad-value", 1, 1, config={"retention.ms": "soon"}),
        NewTopic("too-small", 1, 1, config={"segment.bytes": "13"}),
        NewTopic("compacted", 1, 1, config={"cleanup.policy": "compact"}),
        NewTopic("isr", 1, 1, config={"min.insync.replicas": "2"}),
        NewTopic("zero", 0, 1),
    ])
    codes = {name: outcome(f) for name, f in futures.items()}
    assert codes == {
        "assigned": None, "other-broker": INVALID_REPLICA_ASSIGNMENT, "uneven": INVALID_REPLICA_ASSIGNMENT,
        "three-replicas": INVALID_REPLICATION_FACTOR, "configured": None, "unknown-key": INVALID_CONFIG,
        "bad-value": INVALID_CONFIG, "too-small": INVALID_CONFIG, "compacted": None, "isr": INVALID_CONFIG,
        "zero": INVALID_PARTITIONS}
    # The messages say what is wrong.
    with pytest.raises(KafkaException, match="dummy.doesntexist"):
        a.create_topics([NewTopic("unknown-key", 1, 1, config={"dummy.doesntexist": "x"})])["unknown-key"].result()
    assert metadata_partitions(node, "assigned") == 3
    assert sorted(catalog(node)["topics"]) == ["__consumer_offsets", "assigned", "compacted", "configured"]
    assert catalog(node)["topics"]["configured"]["configs"] == {
        "retention.ms": "3600000", "message.timestamp.type": "LogAppendTime", "delete.retention.ms": "900",
        "compression.type": "lz4"}
    again = a.create_topics([NewTopic("assigned", 1, 1)])["assigned"]
    assert outcome(again) == TOPIC_ALREADY_EXISTS


def test_replication_factor_above_one_is_taken_with_one_copy_where_the_config_says(node_factory):
    """topics.accept_replication_factor_above_one: Kafka Connect's and MirrorMaker 2's internal topics ask for 3;
    the node takes them with its one copy and logs a line per topic it makes (not for one that exists: Connect asks
    for its topics again at every start; nor for a validate-only request); a factor of 0 stays refused."""
    node = node_factory(config="[topics]\naccept_replication_factor_above_one = true\n")
    a = admin(node)
    futures = a.create_topics([NewTopic("three-replicas", 2, 3), NewTopic("none", 1, 0)])
    assert {name: outcome(f) for name, f in futures.items()} == {
        "three-replicas": None, "none": INVALID_REPLICATION_FACTOR}
    described = a.describe_topics(TopicCollection(["three-replicas"]))["three-replicas"].result(
        timeout=CLIENT_TIMEOUT_S)
    assert [len(p.replicas) for p in described.partitions] == [1, 1]
    again = a.create_topics([NewTopic("three-replicas", 2, 3)])["three-replicas"]
    assert outcome(again) == TOPIC_ALREADY_EXISTS
    checked = a.create_topics([NewTopic("checked", 1, 3)], validate_only=True)["checked"]
    assert outcome(checked) is None
    assert node.log().count("replication factor 3 asked, one copy kept") == 1
    assert "topic three-replicas: replication factor 3 asked, one copy kept" in node.log()


def test_create_topics_validate_only_creates_nothing(node):
    a = admin(node)
    futures = a.create_topics([NewTopic("checked", 4, 1, config={"retention.ms": "1000"}),
                               NewTopic("checked-bad", 4, 1, config={"retention.ms": "-5"})], validate_only=True)
    assert {name: outcome(f) for name, f in futures.items()} == {"checked": None, "checked-bad": INVALID_CONFIG}
    assert metadata_partitions(node, "checked") is None
    assert not (node.data_dir / "checked-0").exists()
    assert "checked" not in catalog(node)["topics"]


def test_create_topics_v0_and_v1_and_duplicates_raw(node):
    """Versions kio no longer ships, encoded and decoded by kafka-python's independent definitions."""
    from kafka.protocol.old.admin import (CreateTopicsRequest_v0, CreateTopicsRequest_v1, CreateTopicsResponse_v0,
                                          CreateTopicsResponse_v1)

    with R.RawConnection("127.0.0.1", node.port) as conn:
        for version, request, response in ((0, CreateTopicsRequest_v0, CreateTopicsResponse_v0),
                                           (1, CreateTopicsRequest_v1, CreateTopicsResponse_v1)):
            topics = [(name, 2, 1, [], []) for name in (f"raw{version}", "twice", "twice")]
            fields = {"create_topic_requests": topics, "timeout": 5000}
            if version:
                fields["validate_only"] = False
            decoded = response.decode(bytes(conn.request(P.CREATE_TOPICS, version, request(**fields).encode())))

            errors = [(t[0], t[1]) for t in getattr(decoded, "topic_errors", None) or decoded.topics]
            assert errors == [(f"raw{version}", NONE), ("twice", INVALID_REQUEST), ("twice", INVALID_REQUEST)]
    assert metadata_partitions(node, "raw0") == metadata_partitions(node, "raw1") == 2


def test_create_topics_timed_out_is_not_created_and_in_time_is(node_factory):
    """The request's timeout is the deadline the timer process checks: a creation it cannot start in time is
    answered REQUEST_TIMED_OUT and never happens; one that starts in time happens and is answered NONE."""
    node = node_factory(workers=1, config="[timer]\ndelayed_grace_ms = 200\n")
    (timer,) = node.pids("timer")
    with R.RawConnection("127.0.0.1", node.port) as conn:
        os.kill(timer, signal.SIGSTOP)
        try:
            late = conn.call(P.CREATE_TOPICS, 4, R.create_topics_body({"late": 2}, timeout_ms=300))
        finally:
            os.kill(timer, signal.SIGCONT)
        assert [(t.name, int(t.error_code)) for t in late.topics] == [("late", REQUEST_TIMED_OUT)]
        conn.send(P.CREATE_TOPICS, 4, R.create_topics_body({"in-time": 2}, timeout_ms=10_000))
        os.kill(timer, signal.SIGSTOP)
        time.sleep(0.3)
        os.kill(timer, signal.SIGCONT)
        _, _, _, raw = conn.recv_response()
        in_time = R.decode_response(P.CREATE_TOPICS, 4, raw)
        assert [(t.name, int(t.error_code)) for t in in_time.topics] == [("in-time", NONE)]
        # The late request reached the timer once it ran again: past its deadline, it created nothing.
        conn.call(P.CREATE_TOPICS, 4, R.create_topics_body({"after": 1}))
    assert metadata_partitions(node, "late") is None and metadata_partitions(node, "in-time") == 2
    assert "late" not in catalog(node)["topics"]


def test_many_partitions_in_one_request_and_one_catalog_write(node_factory):
    node = node_factory(workers=2, config="[topics]\nmax_partitions = 2000\n")
    version_before = catalog(node)["version"]
    with R.RawConnection("127.0.0.1", node.port) as conn:
        response = conn.call(P.CREATE_TOPICS, 4, R.create_topics_body({f"many-{i}": 4 for i in range(250)}))
        assert all(int(t.error_code) == NONE for t in response.topics)
        full = conn.call(P.CREATE_TOPICS, 4, R.create_topics_body({"one-too-many": 1000}))
        assert int(full.topics[0].error_code) == INVALID_PARTITIONS
    assert catalog(node)["version"] == version_before + 1
    assert all(metadata_partitions(node, f"many-{i}") == 4 for i in (0, 137, 249))
    produce(node.bootstrap, "many-249", [{"value": b"x", "partition": 3}])
    assert [m.value() for m in consume_all(node.bootstrap, "many-249", 4, 1)] == [b"x"]


# -- configs: described, altered, applied, kept -----------------------------------------------------


def test_describe_configs_sources_defaults_and_synonyms(node_factory):
    node = node_factory(workers=1, config="[log]\nretention_ms = 86400000\n[topics]\nnum_partitions = 3\n")
    a = admin(node)
    assert outcome(a.create_topics([NewTopic("described", 1, 1, config={"segment.bytes": "1048576"})])["described"]) \
        is None
    configs = describe(node, "described")
    assert configs["segment.bytes"].value == "1048576"
    assert configs["segment.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert [(s.name, s.value, s.source) for s in configs["segment.bytes"].synonyms.values()][:2] == [
        ("segment.bytes", "1048576", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        ("log.segment.bytes", "1073741824", ConfigSource.DEFAULT_CONFIG.value)]
    assert (configs["retention.ms"].value, configs["retention.ms"].source) == (
        "86400000", ConfigSource.STATIC_BROKER_CONFIG.value)
    assert (configs["cleanup.policy"].value, configs["cleanup.policy"].is_default) == ("delete", True)
    assert {"compression.type", "max.message.bytes", "message.timestamp.type", "min.insync.replicas",
            "retention.bytes", "segment.ms", "flush.ms"} <= set(configs)
    broker = ConfigResource("broker", "0")
    node_configs = a.describe_configs([broker])[broker].result(timeout=CLIENT_TIMEOUT_S)
    assert node_configs["num.partitions"].value == "3" and node_configs["num.partitions"].is_read_only
    assert node_configs["log.retention.ms"].value == "86400000"
    assert not node_configs["log.retention.ms"].is_read_only
    missing = ConfigResource("topic", "nope")
    assert outcome(a.describe_configs([missing])[missing]) == UNKNOWN_TOPIC


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_describe_configs_every_version_raw(node, version):
    assert outcome(admin(node).create_topics([NewTopic("raw-described", 1, 1,
                                                       config={"retention.ms": "1000"})])["raw-described"]) is None
    keys = ("retention.ms", "segment.bytes")
    with R.RawConnection("127.0.0.1", node.port) as conn:
        if version == 0:  # kio no longer ships v0: kafka-python's definition
            from kafka.protocol.old.admin import DescribeConfigsRequest_v0, DescribeConfigsResponse_v0

            raw = conn.request(P.DESCRIBE_CONFIGS, 0,
                               DescribeConfigsRequest_v0(resources=[(TOPIC, "raw-described", list(keys))]).encode())
            (result,) = DescribeConfigsResponse_v0.decode(bytes(raw)).results
            entries = {c[0]: c for c in result[4]}  # name, value, read_only, is_default, is_sensitive
            assert sorted(entries) == sorted(keys)
            assert (entries["retention.ms"][1], entries["retention.ms"][3], entries["segment.bytes"][3]) == (
                "1000", False, True)
            return
        resource = nested(P.DESCRIBE_CONFIGS, version, "DescribeConfigsResource", resource_type=i8(TOPIC),
                          resource_name="raw-described", configuration_keys=keys)
        response = conn.call(P.DESCRIBE_CONFIGS, version, body(
            P.DESCRIBE_CONFIGS, version, "DescribeConfigsRequest", resources=(resource,), include_synonyms=True,
            include_documentation=True))
    (result,) = response.results
    entries = {c.name: c for c in result.configs}
    assert sorted(entries) == sorted(keys)
    assert entries["retention.ms"].value == "1000"
    assert entries["retention.ms"].config_source == 1 and entries["segment.bytes"].config_source == 5
    assert [s.name for s in entries["retention.ms"].synonyms] == ["retention.ms", "log.retention.ms"]
    if version == 3:
        assert entries["retention.ms"].config_type == 5 and entries["retention.ms"].documentation


def test_alter_configs_replace_incremental_broker_and_errors(node):
    a = admin(node)
    assert outcome(a.create_topics([NewTopic("altered", 1, 1, config={"retention.ms": "5000"})])["altered"]) is None
    # AlterConfigs replaces the whole set: retention.ms goes back to its default.
    futures = a.alter_configs([ConfigResource("topic", "altered", set_config={"segment.ms": "60000"})])
    assert [outcome(f) for f in futures.values()] == [None]
    configs = describe(node, "altered")
    assert configs["segment.ms"].value == "60000" and configs["retention.ms"].is_default
    # IncrementalAlterConfigs: SET, DELETE, APPEND and SUBTRACT of a list.
    ops = [ConfigEntry("retention.ms", "7000", incremental_operation=AlterConfigOpType.SET),
           ConfigEntry("segment.ms", None, incremental_operation=AlterConfigOpType.DELETE)]
    futures = a.incremental_alter_configs([ConfigResource("topic", "altered", incremental_configs=ops)])
    assert [outcome(f) for f in futures.values()] == [None]
    configs = describe(node, "altered")
    assert configs["retention.ms"].value == "7000" and configs["segment.ms"].is_default
    compact = [ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)]
    futures = a.incremental_alter_configs([ConfigResource("topic", "altered", incremental_configs=compact)])
    assert [outcome(f) for f in futures.values()] == [None]
    assert set(describe(node, "altered")["cleanup.policy"].value.split(",")) == {"delete", "compact"}
    subtract = [ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SUBTRACT)]
    futures = a.incremental_alter_configs([ConfigResource("topic", "altered", incremental_configs=subtract)])
    assert [outcome(f) for f in futures.values()] == [None]
    assert describe(node, "altered")["cleanup.policy"].value == "delete"
    # The node-wide default, altered dynamically, reaches the topics without their own value.
    node_wide = [ConfigEntry("log.retention.bytes", "123456789", incremental_operation=AlterConfigOpType.SET)]
    futures = a.incremental_alter_configs([ConfigResource("broker", "0", incremental_configs=node_wide)])
    assert [outcome(f) for f in futures.values()] == [None]
    entry = describe(node, "altered")["retention.bytes"]
    assert (entry.value, entry.source) == ("123456789", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    # Kafka's per-broker Kerberos settings are taken (and described) though the node offers no GSSAPI, as Kafka
    # takes them on a broker whose listeners do not use it; a bad value is still refused.
    kerberos = [ConfigEntry("sasl.kerberos.min.time.before.relogin", "58000",
                            incremental_operation=AlterConfigOpType.SET)]
    futures = a.incremental_alter_configs([ConfigResource("broker", "0", incremental_configs=kerberos)])
    assert [outcome(f) for f in futures.values()] == [None]
    # So are the node-wide names of the topic settings that have no effect on one node, as at the topic level.
    no_effect = [ConfigEntry("log.preallocate", "true", incremental_operation=AlterConfigOpType.SET)]
    futures = a.incremental_alter_configs([ConfigResource("broker", "0", incremental_configs=no_effect)])
    assert [outcome(f) for f in futures.values()] == [None]
    broker = ConfigResource("broker", "0")
    described = a.describe_configs([broker])[broker].result(timeout=CLIENT_TIMEOUT_S)
    relogin = described["sasl.kerberos.min.time.before.relogin"]
    assert (relogin.value, relogin.source) == ("58000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    preallocate = described["log.preallocate"]
    assert (preallocate.value, preallocate.source, preallocate.is_read_only) == (
        "true", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value, False)
    assert described["sasl.kerberos.ticket.renew.window.factor"].is_default
    bad = [ConfigEntry("sasl.kerberos.ticket.renew.jitter", "2", incremental_operation=AlterConfigOpType.SET)]
    futures = a.incremental_alter_configs([ConfigResource("broker", "0", incremental_configs=bad)])
    assert [outcome(f) for f in futures.values()] == [INVALID_CONFIG]
    # Errors per resource, the others still done.
    futures = a.incremental_alter_configs([
        ConfigResource("topic", "missing", incremental_configs=[
            ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)]),
        ConfigResource("broker", "0", incremental_configs=[
            ConfigEntry("background.threads", "9", incremental_operation=AlterConfigOpType.SET)]),
        ConfigResource("topic", "altered", incremental_configs=[
            ConfigEntry("retention.ms", "8000", incremental_operation=AlterConfigOpType.SET)]),
    ])
    assert [outcome(f) for f in futures.values()] == [UNKNOWN_TOPIC, INVALID_CONFIG, None]
    assert describe(node, "altered")["retention.ms"].value == "8000"
    with R.RawConnection("127.0.0.1", node.port) as conn:  # resources librdkafka would not send to this node
        resources = tuple(nested(P.INCREMENTAL_ALTER_CONFIGS, 0, "AlterConfigsResource", resource_type=i8(kind),
                                 resource_name=name, configs=(nested(
                                     P.INCREMENTAL_ALTER_CONFIGS, 0, "AlterableConfig", name=key,
                                     config_operation=i8(0), value="1"),))
                          for kind, name, key in ((BROKER, "7", "log.retention.ms"),
                                                  (16, "subscription", "interval.ms")))  # CLIENT_METRICS
        response = conn.call(P.INCREMENTAL_ALTER_CONFIGS, 0, body(
            P.INCREMENTAL_ALTER_CONFIGS, 0, "IncrementalAlterConfigsRequest", resources=resources, validate_only=False))
    assert [int(r.error_code) for r in response.responses] == [INVALID_REQUEST, INVALID_REQUEST]
    # validate_only changes nothing.
    futures = a.alter_configs([ConfigResource("topic", "altered", set_config={"retention.ms": "1"})],
                              validate_only=True)
    assert [outcome(f) for f in futures.values()] == [None]
    assert describe(node, "altered")["retention.ms"].value == "8000"


def test_configs_survive_restart(node):
    a = admin(node)
    assert outcome(a.create_topics([NewTopic("kept", 2, 1, config={"max.message.bytes": "2000"})])["kept"]) is None
    ops = [ConfigEntry("log.roll.ms", "3600000", incremental_operation=AlterConfigOpType.SET)]
    assert [outcome(f) for f in a.incremental_alter_configs(
        [ConfigResource("broker", "0", incremental_configs=ops)]).values()] == [None]
    node.stop()
    node.start()
    configs = describe(node, "kept")
    assert configs["max.message.bytes"].value == "2000"
    assert configs["segment.ms"].value == "3600000"
    big = R.build_record_batch([b"x" * 3000])
    with R.RawConnection("127.0.0.1", node.port) as conn:
        result = conn.call(P.PRODUCE, 8, R.produce_body({"kept": {0: big}}, acks=1))
    assert result.responses[0].partition_responses[0].error_code == MESSAGE_TOO_LARGE


def test_list_offsets_of_the_largest_timestamp_and_of_tiered_storage(node):
    """confluent-kafka's list_offsets with OffsetSpec.max_timestamp() (ListOffsets v7, KIP-734): the first record
    with the largest timestamp, not the last record; tiered storage's offsets (v8-9) answered as Kafka answers
    without tiered storage; a special timestamp below its version is INVALID_REQUEST."""
    from confluent_kafka.admin import OffsetSpec

    assert outcome(admin(node).create_topics([NewTopic("stamped", 1, 1)])["stamped"]) is None
    with R.RawConnection("127.0.0.1", node.port) as conn:
        for first, count in ((10_000, 3), (90_000, 1), (20_000, 2)):  # offsets 0-2, 3 (the largest), 4-5
            batch = R.build_record_batch([b"v"] * count, first_timestamp_ms=first)
            assert conn.call(P.PRODUCE, 8, R.produce_body({"stamped": {0: batch}}, acks=1)) \
                .responses[0].partition_responses[0].error_code == NONE
    partition = TopicPartition("stamped", 0)
    found = {}
    for name, spec in (("max", OffsetSpec.max_timestamp()), ("earliest", OffsetSpec.earliest()),
                       ("latest", OffsetSpec.latest())):
        result = admin(node).list_offsets({partition: spec})[partition].result(timeout=CLIENT_TIMEOUT_S)
        found[name] = (result.offset, result.timestamp)
    assert found == {"max": (3, 90_000), "earliest": (0, -1), "latest": (6, -1)}
    with R.RawConnection("127.0.0.1", node.port) as conn:
        def listed(timestamp: int, version: int) -> tuple[int, int]:
            answer = conn.call(P.LIST_OFFSETS, version, R.list_offsets_body({"stamped": [0]}, timestamp=timestamp,
                                                                              version=version))
            got = answer.topics[0].partitions[0]
            return int(got.error_code), int(got.offset)

        assert listed(-4, 8) == (NONE, 0)  # earliest local: the whole log is local
        assert listed(-5, 9) == (NONE, -1)  # latest tiered: nothing is tiered
        assert listed(-3, 10) == (NONE, 3)
        assert listed(-3, 6)[0] == listed(-4, 7)[0] == listed(-5, 8)[0] == INVALID_REQUEST


def test_log_append_time_and_timestamp_bounds(node):
    a = admin(node)
    futures = a.create_topics([NewTopic("appended", 1, 1, config={"message.timestamp.type": "LogAppendTime"}),
                               NewTopic("bounded", 1, 1, config={"message.timestamp.after.max.ms": "60000"})])
    assert [outcome(f) for f in futures.values()] == [None, None]
    before = int(time.time() * 1000)
    with R.RawConnection("127.0.0.1", node.port) as conn:
        old = R.build_record_batch([b"a", b"b"], first_timestamp_ms=1_000)
        result = conn.call(P.PRODUCE, 8, R.produce_body({"appended": {0: old}}, acks=1))
        partition = result.responses[0].partition_responses[0]
        append_time = round(partition.log_append_time.timestamp() * 1000)
        assert partition.error_code == NONE and append_time >= before
        future = R.build_record_batch([b"late"], first_timestamp_ms=int(time.time() * 1000) + 3_600_000)
        refused = conn.call(P.PRODUCE, 8, R.produce_body({"bounded": {0: future}}, acks=1))
        assert refused.responses[0].partition_responses[0].error_code == INVALID_TIMESTAMP
    got = consume_all(node.bootstrap, "appended", 1, 2)
    for msg in got:
        kind, timestamp = msg.timestamp()
        assert kind == 2 and timestamp == append_time  # TIMESTAMP_LOG_APPEND_TIME
    # kcat shows the node's timestamps too.
    if shutil.which("kcat"):
        out = subprocess.run(["kcat", "-b", node.bootstrap, "-C", "-t", "appended", "-o", "beginning", "-e",
                              "-f", "%T\\n"], capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S).stdout
        assert out.split() == [str(append_time)] * 2


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd", "uncompressed"])
def test_compression_type_recompresses(node, codec):
    assert outcome(admin(node).create_topics([NewTopic(f"c-{codec}", 1, 1,
                                                       config={"compression.type": codec})])[f"c-{codec}"]) is None
    values = [f"value {i} ".encode() * 20 for i in range(50)]
    produce(node.bootstrap, f"c-{codec}", [{"value": v, "key": b"k%d" % i} for i, v in enumerate(values)],
            **{"compression.type": "gzip" if codec == "uncompressed" else "none", "linger.ms": 50})
    stored = (node.data_dir / f"c-{codec}-0" / "00000000000000000000.log").read_bytes()
    codes, position = set(), 0
    while position < len(stored):
        header = parse_header(stored, position)
        codes.add(header.compression)
        position += header.size
    assert codes == {{"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[codec]}
    assert [m.value() for m in consume_all(node.bootstrap, f"c-{codec}", 1, 50)] == values


def test_retention_and_segment_settings_per_topic(node_factory):
    node = node_factory(workers=1, config="[flush]\nretention_check_interval_ms = 200\n")
    a = admin(node)
    futures = a.create_topics([NewTopic("short", 1, 1, config={"retention.ms": "500", "segment.bytes": "2000"}),
                               NewTopic("long", 1, 1, config={"segment.bytes": "2000"})])
    assert [outcome(f) for f in futures.values()] == [None, None]
    for topic in ("short", "long"):
        # One record per batch: a batch is never split, so the rolls need batches smaller than segment.bytes.
        produce(node.bootstrap, topic, [{"value": b"x" * 500, "partition": 0} for _ in range(20)],
                **{"linger.ms": 0, "batch.num.messages": 1})
    assert len(list((node.data_dir / "long-0").glob("*.log"))) > 3  # rolled at 2000 bytes
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "unused"})
    try:
        while time.monotonic() < deadline:
            low, high = consumer.get_watermark_offsets(TopicPartition("short", 0), timeout=CLIENT_TIMEOUT_S)
            if low > 0:
                break
            time.sleep(0.2)
        assert low > 0 and high == 20
        assert consumer.get_watermark_offsets(TopicPartition("long", 0), timeout=CLIENT_TIMEOUT_S)[0] == 0
    finally:
        consumer.close()


def test_flush_messages_starts_an_fsync(node_factory):
    """With the background bound far away, a topic's flush.messages alone gets its records fsync'd."""
    node = node_factory(workers=1, config="[flush]\nflush_interval_ms = 600000\n")
    futures = admin(node).create_topics([NewTopic("eager", 1, 1, config={"flush.messages": "5"}),
                                         NewTopic("lazy", 1, 1)])
    assert [outcome(f) for f in futures.values()] == [None, None]
    table = PartitionTable.attach(shm_instance.table_name(node.instance))
    try:
        rows = {name: catalog(node)["topics"][name]["rows"][0] for name in ("eager", "lazy")}
        time.sleep(0.5)  # the start-up round is done
        for topic in ("eager", "lazy"):
            produce(node.bootstrap, topic, [{"value": b"v", "partition": 0} for _ in range(10)],
                    **{"acks": 1, "linger.ms": 0, "max.in.flight": 1})
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while time.monotonic() < deadline and table.read(rows["eager"]).flushed_offset < 5:
            time.sleep(0.05)
        assert table.read(rows["eager"]).flushed_offset >= 5
        assert table.read(rows["lazy"]).flushed_offset == 0
    finally:
        table.close()


# -- CreatePartitions -------------------------------------------------------------------------------


def test_create_partitions_checks(node):
    a = admin(node)
    assert outcome(a.create_topics([NewTopic("grown", 2, 1)])["grown"]) is None
    futures = a.create_partitions([NewPartitions("grown", 5)])
    assert [outcome(f) for f in futures.values()] == [None]
    assert metadata_partitions(node, "grown") == 5
    assert [outcome(f) for f in a.create_partitions([NewPartitions("grown", 3)]).values()] == [INVALID_PARTITIONS]
    assert [outcome(f) for f in a.create_partitions([NewPartitions("grown", 5)]).values()] == [INVALID_PARTITIONS]
    assert [outcome(f) for f in a.create_partitions([NewPartitions("nope", 5)]).values()] == [UNKNOWN_TOPIC]
    assert [outcome(f) for f in a.create_partitions(
        [NewPartitions("grown", 7, replica_assignment=[[0], [1]])]).values()] == [INVALID_REPLICA_ASSIGNMENT]
    assert [outcome(f) for f in a.create_partitions([NewPartitions("grown", 9)], validate_only=True).values()] == [None]
    assert [outcome(f) for f in a.create_partitions(
        [NewPartitions("grown", 7, replica_assignment=[[0], [0]])]).values()] == [None]
    assert metadata_partitions(node, "grown") == 7
    node.stop()
    node.start()
    assert metadata_partitions(node, "grown") == 7


def test_create_partitions_under_a_running_producer_and_group_consumer(node_factory):
    node = node_factory(workers=2, config="[groups]\ninitial_rebalance_delay_ms = 0\n")
    assert outcome(admin(node).create_topics([NewTopic("growing", 2, 1)])["growing"]) is None
    refresh = {"topic.metadata.refresh.interval.ms": 500, "metadata.max.age.ms": 1000}
    producer = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 5, **refresh})
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "growers", "auto.offset.reset": "earliest",
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, **refresh})
    consumer.subscribe(["growing"])
    delivered, consumed = {}, {}
    errors = []

    def on_delivery(err, msg):
        if err:
            errors.append(err)
        else:
            delivered[msg.value()] = msg.partition()

    def pump(seconds: float, grown: bool = False) -> None:
        end = time.monotonic() + seconds
        sent = len(delivered)
        while time.monotonic() < end:
            value = f"m{len(delivered) + len(errors) + sent}-{time.monotonic_ns()}".encode()
            producer.produce("growing", value=value, key=value, on_delivery=on_delivery)
            producer.poll(0)
            msg = consumer.poll(0.01)
            if msg is not None and not msg.error():
                consumed[msg.value()] = msg.partition()
            if grown and {p for p in delivered.values() if p >= 2} and {p for p in consumed.values() if p >= 2}:
                return

    try:
        pump(3)
        futures = admin(node).create_partitions([NewPartitions("growing", 6)])
        assert [outcome(f) for f in futures.values()] == [None]
        pump(CLIENT_TIMEOUT_S, grown=True)
        assert {p for p in delivered.values() if p >= 2}, "the producer never used a new partition"
        assert {p for p in consumed.values() if p >= 2}, "the group never consumed a new partition"
        producer.flush(CLIENT_TIMEOUT_S)
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while set(delivered) - set(consumed) and time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is not None and not msg.error():
                consumed[msg.value()] = msg.partition()
        assert errors == [] and set(delivered) <= set(consumed)
    finally:
        consumer.close()


# -- DeleteRecords ----------------------------------------------------------------------------------


def test_delete_records_inside_a_segment_survives_restart(node):
    a = admin(node)
    assert outcome(a.create_topics([NewTopic("trimmed", 2, 1)])["trimmed"]) is None
    produce(node.bootstrap, "trimmed", [{"value": b"%d" % i, "partition": i % 2} for i in range(40)])
    results = {}
    # librdkafka refuses a request naming a partition twice: the beyond-the-end case goes in its own request.
    for request in ([TopicPartition("trimmed", 0, 7), TopicPartition("trimmed", 1, -1)],
                    [TopicPartition("trimmed", 0, 99)], [TopicPartition("missing", 0, 1)]):
        for tp, future in a.delete_records(request).items():
            try:
                results[(tp.topic, tp.partition, tp.offset)] = future.result(timeout=CLIENT_TIMEOUT_S).low_watermark
            except KafkaException as exc:
                results[(tp.topic, tp.partition, tp.offset)] = exc.args[0].code()
    assert results == {("trimmed", 0, 7): 7, ("trimmed", 1, -1): 20, ("trimmed", 0, 99): OFFSET_OUT_OF_RANGE,
                       ("missing", 0, 1): KafkaError._NOENT}  # librdkafka finds no leader in the metadata
    with R.RawConnection("127.0.0.1", node.port) as conn:
        # The node's own answer for a topic it does not have (librdkafka answered locally above).
        missing = conn.call(P.DELETE_RECORDS, 1, body(P.DELETE_RECORDS, 1, "DeleteRecordsRequest", timeout=R.millis(5000),
                                                      topics=(nested(P.DELETE_RECORDS, 1, "DeleteRecordsTopic",
                                                                     name="missing", partitions=(nested(
                                                                         P.DELETE_RECORDS, 1, "DeleteRecordsPartition",
                                                                         partition_index=i32(0), offset=i64(1)),
                                                                     )),)))
        assert [p.error_code for p in missing.topics[0].partitions] == [UNKNOWN_TOPIC]
        fetched = R.parse_fetch_response(11, conn.request(P.FETCH, 11, R.fetch_body({"trimmed": {0: 3}})))
        assert [p.error_code for p in fetched.partitions] == [OFFSET_OUT_OF_RANGE]
        earliest = conn.call(P.LIST_OFFSETS, 5, R.list_offsets_body({"trimmed": [0, 1]}, timestamp=-2))
        assert [p.offset for p in earliest.topics[0].partitions] == [7, 20]
    node.stop()
    node.start()
    got = consume_all(node.bootstrap, "trimmed", 1, 13, **{"auto.offset.reset": "earliest"})
    assert [m.offset() for m in got if m.offset() >= 7] == list(range(7, 20))
    with R.RawConnection("127.0.0.1", node.port) as conn:
        earliest = conn.call(P.LIST_OFFSETS, 5, R.list_offsets_body({"trimmed": [0]}, timestamp=-2))
    assert earliest.topics[0].partitions[0].offset == 7


def test_delete_records_under_a_running_consumer(node):
    assert outcome(admin(node).create_topics([NewTopic("purged", 1, 1)])["purged"]) is None
    produce(node.bootstrap, "purged", [{"value": b"old-%d" % i, "partition": 0} for i in range(100)])
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "purge", "auto.offset.reset": "earliest",
                         "fetch.max.bytes": 1024, "message.max.bytes": 1000,
                         "max.partition.fetch.bytes": 512, "enable.auto.commit": False})
    consumer.assign([TopicPartition("purged", 0, 0)])
    try:
        first = consumer.poll(CLIENT_TIMEOUT_S)
        assert first is not None and first.offset() == 0
        futures = admin(node).delete_records([TopicPartition("purged", 0, 90)])
        assert [f.result(timeout=CLIENT_TIMEOUT_S).low_watermark for f in futures.values()] == [90]
        produce(node.bootstrap, "purged", [{"value": b"new-%d" % i, "partition": 0} for i in range(10)])
        seen = []
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while time.monotonic() < deadline and (not seen or seen[-1] < 109):
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                seen.append(msg.offset())
        # The consumer ran into the new log start (OFFSET_OUT_OF_RANGE, reset to earliest) and went on from it.
        assert seen[-1] == 109 and 90 in seen and all(o < 90 or o >= 90 for o in seen)
        assert seen[seen.index(90):] == list(range(90, 110))
    finally:
        consumer.close()


# -- ListOffsets by timestamp -----------------------------------------------------------------------


def test_offsets_for_times_with_librdkafka_and_kafka_python(node):
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    assert outcome(admin(node).create_topics([NewTopic("timed", 1, 1)])["timed"]) is None
    produce(node.bootstrap, "timed", [{"value": b"%d" % i, "partition": 0, "timestamp": 1_000_000 + 1000 * i}
                                      for i in range(20)], **{"linger.ms": 0})
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "unused"})
    try:
        found = consumer.offsets_for_times([TopicPartition("timed", 0, 1_005_500)], timeout=CLIENT_TIMEOUT_S)
        assert [tp.offset for tp in found] == [6]  # inside a batch: the record's own offset
        first = consumer.offsets_for_times([TopicPartition("timed", 0, 1)], timeout=CLIENT_TIMEOUT_S)
        assert [tp.offset for tp in first] == [0]
        late = consumer.offsets_for_times([TopicPartition("timed", 0, 9_999_999_999)], timeout=CLIENT_TIMEOUT_S)
        assert late[0].offset == -1  # nothing that recent: the end
    finally:
        consumer.close()
    futures = admin(node).delete_records([TopicPartition("timed", 0, 10)])
    assert [f.result(timeout=CLIENT_TIMEOUT_S).low_watermark for f in futures.values()] == [10]
    kconsumer = KafkaConsumer(bootstrap_servers=node.bootstrap)
    try:
        answer = kconsumer.offsets_for_times({KTP("timed", 0): 1_013_000})
        assert answer[KTP("timed", 0)].offset == 13 and answer[KTP("timed", 0)].timestamp == 1_013_000
        below = kconsumer.offsets_for_times({KTP("timed", 0): 1_000_000})
        assert below[KTP("timed", 0)].offset == 10  # never below the log start
    finally:
        kconsumer.close()


def test_kafka_python_admin(node):
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewPartitions as KNewPartitions
    from kafka.admin import NewTopic as KNewTopic

    client = KafkaAdminClient(bootstrap_servers=node.bootstrap)
    try:
        client.create_topics([KNewTopic("kp", 2, 1, topic_configs={"retention.ms": "120000"})])
        described = client.describe_configs([KConfigResource(ConfigResourceType.TOPIC, "kp")])
        # kafka-python 3 gives {type: {name: {key: entry}}}, by default only the keys set on the topic.
        entry = described["topic"]["kp"]["retention.ms"]
        assert (entry["value"], entry["config_source"]) == ("120000", "DYNAMIC_TOPIC_CONFIG")
        everything = client.describe_configs([KConfigResource(ConfigResourceType.TOPIC, "kp")], config_filter="all")
        assert everything["topic"]["kp"]["segment.bytes"]["config_source"] == "DEFAULT_CONFIG"
        client.alter_configs([KConfigResource(ConfigResourceType.TOPIC, "kp", configs={"retention.ms": "240000"})])
        assert describe(node, "kp")["retention.ms"].value == "240000"
        client.create_partitions({"kp": KNewPartitions(4)})
        assert metadata_partitions(node, "kp") == 4
        produce(node.bootstrap, "kp", [{"value": b"v", "partition": 3} for _ in range(5)])
        from kafka import TopicPartition as KTP
        client.delete_records({KTP("kp", 3): 3})
        with R.RawConnection("127.0.0.1", node.port) as conn:
            earliest = conn.call(P.LIST_OFFSETS, 5, R.list_offsets_body({"kp": [3]}, timestamp=-2))
        assert earliest.topics[0].partitions[0].offset == 3
        client.delete_topics(["kp"])
    finally:
        client.close()
    assert metadata_partitions(node, "kp") is None


def test_acks_all_does_not_wait_for_the_background_interval(node_factory):
    """With flush_interval_ms far beyond the request timeout, acks=all and offset commits are still answered:
    the group commit starts an fsync for them at once."""
    node = node_factory(workers=1, config="[flush]\nflush_interval_ms = 600000\n")
    assert outcome(admin(node).create_topics([NewTopic("prompt", 1, 1)])["prompt"]) is None
    produce(node.bootstrap, "prompt", [{"value": b"v%d" % i} for i in range(20)],
            **{"acks": "all", "request.timeout.ms": 5000, "message.timeout.ms": 5000, "linger.ms": 0})
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "prompt-group"})
    try:
        committed = consumer.commit(offsets=[TopicPartition("prompt", 0, 7)], asynchronous=False)
        assert [tp.error for tp in committed] == [None]
    finally:
        consumer.close()


def test_authorized_operations_are_every_supported_one_without_an_authorizer(node):
    """KIP-430 as Kafka answers it with no authorizer configured (this node): every operation each resource
    type supports, when asked; nothing when not asked."""
    from confluent_kafka.admin import AclOperation

    a = admin(node)
    assert outcome(a.create_topics([NewTopic("allowed", 2, 1)])["allowed"]) is None
    topic = a.describe_topics(TopicCollection(["allowed"]), include_authorized_operations=True)["allowed"].result(
        timeout=CLIENT_TIMEOUT_S)
    assert set(topic.authorized_operations) == {
        AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE, AclOperation.ALTER,
        AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
    cluster = a.describe_cluster(include_authorized_operations=True).result(timeout=CLIENT_TIMEOUT_S)
    assert set(cluster.authorized_operations) == {
        AclOperation.CREATE, AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE}
    not_asked = a.describe_topics(TopicCollection(["allowed"]))["allowed"].result(timeout=CLIENT_TIMEOUT_S)
    assert not_asked.authorized_operations is None
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "allowed-group"})
    try:
        consumer.commit(offsets=[TopicPartition("allowed", 0, 1)], asynchronous=False)
    finally:
        consumer.close()
    group = a.describe_consumer_groups(["allowed-group"], include_authorized_operations=True)["allowed-group"].result(
        timeout=CLIENT_TIMEOUT_S)
    assert set(group.authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE,
                                                AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
