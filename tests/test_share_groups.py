"""Share groups (KIP-932) end to end with confluent-kafka's ShareConsumer (librdkafka's share consumer) against
real nodes: membership and describes, acquisition and acknowledgement (implicit, explicit ACCEPT / RELEASE /
REJECT), records shared between consumers of one partition, locks that run out after a consumer is killed,
the delivery-count limit, and the share state across a node restart and a kill -9 of the timer.

The node's record lock is 1.5 s here ([groups] share_record_lock_duration_ms), so redeliveries come quickly;
share-partitions start at the earliest offset, so a test produces before its consumer subscribes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.static.primitive import i8, i32, i64
from confluent_kafka import AcknowledgeType, KafkaError, KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from scripts.harness import rawkafka as R
from scripts.harness.kafka_peer import classpath, java
from scripts.harness.nodeproc import CLI, NodeProcess, die_with_parent
from scripts.harness.rawkafka import request_body as body
from shmbroker.node.tools.inspect import NodeReader, snapshot_document
from shmbroker.workers.codecs import protocol as P
from tests.test_java_clients import CLIENT_JVM_OPTIONS
from tests.waiting import wait_for

pytestmark = pytest.mark.node

LOCK_MS = 1500
CONFIG = f"""[groups]
share_record_lock_duration_ms = {LOCK_MS}
share_min_record_lock_duration_ms = 1000
share_auto_offset_reset = "earliest"
share_delivery_count_limit = 3
share_min_session_timeout_ms = 1000
share_min_heartbeat_interval_ms = 100
"""
POLL_BUDGET_S = 20.0
JAVA = Path(__file__).resolve().parent / "java"


def restart_or_kill_the_timer(node, how: str) -> None:
    """The node stopped and started again (how == "node restart"), else its timer killed (-9) and the next one up."""
    if how == "node restart":
        node.stop()
        node.start()
        return
    timer = node.pids("timer")[0]
    os.kill(timer, signal.SIGKILL)
    node.wait_for_pids("timer", 1, exclude={timer})


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(tmp_path_factory.mktemp("share-groups"), workers=2, config=CONFIG) as started:
        yield started


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def produce(bootstrap: str, topic: str, values: list[str], partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for value in values:
        producer.produce(topic, value=value.encode(), partition=partition)
    assert producer.flush(15) == 0


def share_consumer(bootstrap: str, group: str, topic: str, explicit: bool = False, **conf) -> ShareConsumer:
    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                              "share.acknowledgement.mode": "explicit" if explicit else "implicit", **conf})
    consumer.subscribe([topic])
    return consumer


def take(consumer: ShareConsumer, count: int, timeout_s: float = POLL_BUDGET_S) -> list:
    """Poll until `count` records came (or the time is up): the messages, in the order they came."""
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        for message in consumer.poll(0.5):
            assert message.error() is None, message.error()
            got.append(message)
    return got


def values(messages: list) -> list[str]:
    return [m.value().decode() for m in messages]


def test_implicit_acknowledgement_delivers_each_record_once(node):
    create_topic(node.bootstrap, "implicit")
    produce(node.bootstrap, "implicit", [f"r{i}" for i in range(10)])
    first = share_consumer(node.bootstrap, "g-implicit", "implicit")
    try:
        got = take(first, 10)
        assert values(got) == [f"r{i}" for i in range(10)]
        assert [m.offset() for m in got] == list(range(10)) and {m.delivery_count() for m in got} == {1}
        first.poll(0.5)  # acknowledges what the last poll returned (implicit mode)
    finally:
        first.close()
    # Acknowledged records never come back: a second consumer of the group gets the next record first.
    second = share_consumer(node.bootstrap, "g-implicit", "implicit")
    try:
        produce(node.bootstrap, "implicit", ["late"])
        got = take(second, 1)
        assert [(m.offset(), m.value(), m.delivery_count()) for m in got] == [(10, b"late", 1)]
    finally:
        second.close()


def test_explicit_accept_release_reject(node):
    create_topic(node.bootstrap, "explicit")
    produce(node.bootstrap, "explicit", [f"e{i}" for i in range(6)])
    consumer = share_consumer(node.bootstrap, "g-explicit", "explicit", explicit=True)
    try:
        got = take(consumer, 6)
        assert [m.offset() for m in got] == list(range(6))
        for message in got:
            kind = (AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT)[message.offset() // 2]
            consumer.acknowledge(message, kind)
        results = consumer.commit_sync(15)
        assert all(error is None for error in results.values()), results
        again = take(consumer, 2)  # the released ones, delivered a second time; the rejected ones never
        assert [(m.offset(), m.delivery_count()) for m in again] == [(2, 2), (3, 2)]
        for message in again:
            consumer.acknowledge(message, AcknowledgeType.ACCEPT)
        consumer.commit_sync(15)
        produce(node.bootstrap, "explicit", ["e6"])
        after = take(consumer, 1)
        assert [(m.offset(), m.value()) for m in after] == [(6, b"e6")]
        consumer.acknowledge(after[0], AcknowledgeType.ACCEPT)
        consumer.commit_sync(15)
    finally:
        consumer.close()


def test_a_record_released_past_the_delivery_count_limit_is_archived(node):
    create_topic(node.bootstrap, "limit")
    produce(node.bootstrap, "limit", ["poison", "fine"])
    consumer = share_consumer(node.bootstrap, "g-limit", "limit", explicit=True)
    try:
        counts = []
        for _ in range(3):  # the limit is 3 deliveries
            got = take(consumer, 1)
            assert got and got[0].offset() == 0, values(got)
            counts.append(got[0].delivery_count())
            for message in got:
                consumer.acknowledge(message, AcknowledgeType.RELEASE if message.offset() == 0
                                     else AcknowledgeType.ACCEPT)
            consumer.commit_sync(15)
        assert counts == [1, 2, 3]
        produce(node.bootstrap, "limit", ["next"])
        rest = []
        deadline = time.monotonic() + POLL_BUDGET_S
        while "next" not in values(rest) and time.monotonic() < deadline:
            got = take(consumer, 1, 2.0)
            for message in got:
                consumer.acknowledge(message, AcknowledgeType.ACCEPT)
            consumer.commit_sync(15)
            rest += got
        assert 0 not in [m.offset() for m in rest] and "next" in values(rest)
    finally:
        consumer.close()


def test_two_consumers_of_one_partition_get_distinct_records(node):
    create_topic(node.bootstrap, "shared")
    produce(node.bootstrap, "shared", [f"s{i}" for i in range(200)])
    a = share_consumer(node.bootstrap, "g-shared", "shared", **{"max.poll.records": 10})
    b = share_consumer(node.bootstrap, "g-shared", "shared", **{"max.poll.records": 10})
    seen: dict[str, list[str]] = {"a": [], "b": []}
    try:
        deadline = time.monotonic() + 2 * POLL_BUDGET_S
        while len(seen["a"]) + len(seen["b"]) < 200 and time.monotonic() < deadline:
            for name, consumer in (("a", a), ("b", b)):
                for message in consumer.poll(0.2):
                    assert message.error() is None, message.error()
                    seen[name].append(message.value().decode())
    finally:
        a.close()
        b.close()
    assert sorted(seen["a"] + seen["b"]) == sorted(f"s{i}" for i in range(200))
    assert not set(seen["a"]) & set(seen["b"]) and seen["a"] and seen["b"], (len(seen["a"]), len(seen["b"]))


HOLDER = """
import sys, time
from confluent_kafka import ShareConsumer
consumer = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                          "share.acknowledgement.mode": "explicit"})
consumer.subscribe([sys.argv[3]])
got = []
deadline = time.monotonic() + 20
while len(got) < 5 and time.monotonic() < deadline:
    got += [m.offset() for m in consumer.poll(0.5) if m.error() is None]
print(" ".join(map(str, got)), flush=True)
time.sleep(60)  # holding its records, unacknowledged, until it is killed
"""


def test_records_of_a_killed_consumer_are_redelivered_when_their_locks_expire(node):
    create_topic(node.bootstrap, "held")
    produce(node.bootstrap, "held", [f"h{i}" for i in range(5)])
    held = hold(node.bootstrap, "g-held", "held")
    killed_at = time.monotonic()
    assert held == ["0", "1", "2", "3", "4"], held
    consumer = share_consumer(node.bootstrap, "g-held", "held")
    try:
        got = take(consumer, 5)
        waited = time.monotonic() - killed_at
        assert [(m.offset(), m.delivery_count()) for m in got] == [(i, 2) for i in range(5)]
        assert waited < LOCK_MS / 1000 + 10, waited  # the locks ran out, not the member's session (45 s)
        consumer.poll(0.5)
    finally:
        consumer.close()


def test_share_groups_are_listed_and_described(node):
    """ListGroups (type "share"), ShareGroupDescribe (members, each assigned every partition), DescribeGroups
    (not a classic group) and a classic member refused the share group's id, over the raw protocol."""
    create_topic(node.bootstrap, "listed", 3)
    consumer = share_consumer(node.bootstrap, "g-listed", "listed", **{"client.id": "lister"})
    conn = R.RawConnection("127.0.0.1", node.port)
    try:
        def described() -> Any:
            answer = conn.call(P.SHARE_GROUP_DESCRIBE, 1, body(P.SHARE_GROUP_DESCRIBE, 1, "ShareGroupDescribeRequest",
                                                               group_ids=("g-listed", "nobody"),
                                                               include_authorized_operations=False))
            group = answer.groups[0]
            return answer if group.members and group.members[0].assignment.topic_partitions else None

        answer = wait_for(described, 15, "the share consumer's membership")
        group, missing = answer.groups
        assert (group.group_state, group.assignor_name, int(missing.error_code)) == ("Stable", "simple", 69)
        (member,) = group.members
        assert member.client_id == "lister" and member.subscribed_topic_names == ("listed",)
        assert [(t.topic_name, list(t.partitions)) for t in member.assignment.topic_partitions] == [
            ("listed", [0, 1, 2])]
        listed = conn.call(P.LIST_GROUPS, 5, body(P.LIST_GROUPS, 5, "ListGroupsRequest", states_filter=(),
                                                 types_filter=("share",)))
        rows = {g.group_id: (g.protocol_type, g.group_state, g.group_type) for g in listed.groups}
        assert rows["g-listed"] == ("share", "Stable", "share")  # the module's other groups are share groups too
        assert {row[2] for row in rows.values()} == {"share"}
        classic = conn.call(P.DESCRIBE_GROUPS, 5, body(P.DESCRIBE_GROUPS, 5, "DescribeGroupsRequest",
                                                       groups=("g-listed",), include_authorized_operations=False))
        assert int(classic.groups[0].error_code) == 69  # GROUP_ID_NOT_FOUND: not a classic group
    finally:
        conn.close()
        consumer.close()


def test_share_group_offsets_are_described(node):
    """DescribeShareGroupOffsets after the tests above: a group's start offsets and lags, -1 for a partition it
    never fetched, GROUP_ID_NOT_FOUND for an id that is not a share group."""
    conn = R.RawConnection("127.0.0.1", node.port)
    try:
        def ask(group: str, topics: Any = None) -> Any:
            answer = conn.call(P.DESCRIBE_SHARE_GROUP_OFFSETS, 1, body(
                P.DESCRIBE_SHARE_GROUP_OFFSETS, 1, "DescribeShareGroupOffsetsRequest", groups=(R.request_entity(
                    P.DESCRIBE_SHARE_GROUP_OFFSETS, 1, "DescribeShareGroupOffsetsRequestGroup", group_id=group,
                    topics=topics),)))
            (group_answer,) = answer.groups
            return group_answer

        explicit = ask("g-explicit")
        assert int(explicit.error_code) == 0
        assert [(t.topic_name, [(int(p.partition_index), int(p.start_offset), int(p.lag), int(p.error_code))
                                for p in t.partitions]) for t in explicit.topics] == [("explicit", [(0, 7, 0, 0)])]
        produce(node.bootstrap, "explicit", ["waiting", "too"])
        assert [int(p.lag) for p in ask("g-explicit").topics[0].partitions] == [2]
        listed = ask("g-listed", (R.request_entity(P.DESCRIBE_SHARE_GROUP_OFFSETS, 1,
                                                   "DescribeShareGroupOffsetsRequestTopic", topic_name="listed",
                                                   partitions=(i32(0),)),))
        assert [(int(p.start_offset), int(p.lag)) for p in listed.topics[0].partitions] == [(-1, -1)]
        assert int(ask("no-such-group").error_code) == 69
    finally:
        conn.close()


def test_the_cli_lists_and_describes_share_groups(node):
    """`shmbroker groups list` shows the share groups beside the others; `groups describe` a share group's
    members and each share-partition's start offset and lag."""
    def cli(*args: str) -> Any:
        done = subprocess.run([*CLI, "groups", *args, "--bootstrap", node.bootstrap, "--json"], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    listed = {g["group"]: g for g in cli("list")}
    assert listed["g-explicit"]["state"] == "EMPTY" and listed["g-explicit"]["type"] == "share"
    described = cli("describe", "g-explicit")
    assert (described["type"], described["state"], described["members"]) == ("share", "EMPTY", [])
    assert [(p["topic"], p["partition"], p["start_offset"], p["high_watermark"], p["lag"])
            for p in described["partitions"]] == [("explicit", 0, 7, 9, 2)]  # two produced by the offsets test
    table = subprocess.run([*CLI, "groups", "describe", "g-explicit", "--bootstrap", node.bootstrap],
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "start offset" in table.stdout and "type share" in table.stdout, table


def test_the_cli_counts_each_share_partitions_records_in_flight(node):
    """`shmbroker groups describe` of a share group: per share-partition, the records in flight (acquired, or
    waiting for redelivery) from the node's latest state record, while a killed ShareConsumer's five records are
    held or wait for redelivery (two more produced are not in flight: never delivered), and none once a consumer
    acknowledged them all."""
    def described() -> dict:
        done = subprocess.run([*CLI, "groups", "describe", "g-flight", "--bootstrap", node.bootstrap, "--json"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return {(p["topic"], p["partition"]): (p["start_offset"], p["lag"], p["in_flight"])
                for p in json.loads(done.stdout)["partitions"]}

    create_topic(node.bootstrap, "flight")
    produce(node.bootstrap, "flight", [f"f{i}" for i in range(5)])
    assert hold(node.bootstrap, "g-flight", "flight") == [str(i) for i in range(5)]
    produce(node.bootstrap, "flight", ["f5", "f6"])
    assert described() == {("flight", 0): (0, 7, 5)}
    consumer = share_consumer(node.bootstrap, "g-flight", "flight")
    try:
        assert sorted(values(take(consumer, 7))) == [f"f{i}" for i in range(7)]
        consumer.poll(0.5)  # acknowledges them (implicit mode)
    finally:
        consumer.close()
    assert described() == {("flight", 0): (7, 0, 0)}
    table = subprocess.run([*CLI, "groups", "describe", "g-flight", "--bootstrap", node.bootstrap],
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "in flight" in table.stdout, table


class RawShareMember:
    """One share group member over the raw protocol: heartbeats, ShareFetch and ShareAcknowledge of its own."""

    def __init__(self, node, group: str, member: str) -> None:
        self.conn = R.RawConnection("127.0.0.1", node.port)
        self.group, self.member, self.epoch = group, member, 0

    def heartbeat(self, epoch: int | None = None, topics: Any = None) -> Any:
        answer = self.conn.call(P.SHARE_GROUP_HEARTBEAT, 1, body(
            P.SHARE_GROUP_HEARTBEAT, 1, "ShareGroupHeartbeatRequest", group_id=self.group, member_id=self.member,
            member_epoch=i32(self.epoch if epoch is None else epoch), rack_id=None, subscribed_topic_names=topics))
        if int(answer.error_code) == 0:
            self.epoch = int(answer.member_epoch)
        return answer

    def fetch_body(self, epoch: int, topic_id: Any, acks: tuple = (), max_wait_ms: int = 0,
                   max_records: int = 10) -> bytes:
        def n(name: str, **fields: Any) -> Any:
            return R.request_entity(P.SHARE_FETCH, 2, name, **fields)
        return body(P.SHARE_FETCH, 2, "ShareFetchRequest", group_id=self.group, member_id=self.member,
                    share_session_epoch=i32(epoch), max_wait=R.millis(max_wait_ms), min_bytes=i32(1),
                    max_bytes=i32(1 << 20), max_records=i32(max_records), batch_size=i32(max_records),
                    topics=(n("FetchTopic", topic_id=topic_id, partitions=(n(
                        "FetchPartition", partition_index=i32(0), acknowledgement_batches=tuple(
                            n("AcknowledgementBatch", first_offset=i64(first), last_offset=i64(last),
                              acknowledge_types=tuple(i8(t) for t in types)) for first, last, types in acks)),)),),
                    forgotten_topics_data=())

    def fetch(self, *args: Any, **kwargs: Any) -> Any:
        return self.conn.call(P.SHARE_FETCH, 2, self.fetch_body(*args, **kwargs))


def partition_of(answer: Any) -> Any:
    ((partition,),) = [t.partitions for t in answer.responses]
    return partition


def test_bad_requests_get_the_protocols_errors_and_a_share_fetch_long_polls(node):
    """Raw requests: each mistake answered with Kafka's error code, the node unharmed; a ShareFetch that finds
    nothing waits for an append (the purgatory) and answers with it."""
    create_topic(node.bootstrap, "raw")
    topic_id = R.topic_ids("127.0.0.1", node.port, ["raw"])["raw"]
    member = RawShareMember(node, "g-raw", "m-raw")
    try:
        assert int(member.heartbeat(topics=None).error_code) == 42  # INVALID_REQUEST: joining without topics
        assert int(member.heartbeat(epoch=3, topics=("raw",)).error_code) == 25  # UNKNOWN_MEMBER_ID
        joined = member.heartbeat(topics=("raw",))
        assert int(joined.error_code) == 0 and member.epoch >= 1
        assert [list(t.partitions) for t in joined.assignment.topic_partitions] == [[0]]
        assert int(member.heartbeat(epoch=member.epoch + 5).error_code) == 110  # FENCED_MEMBER_EPOCH
        other = RawShareMember(node, "g-implicit-classic", "m")
        try:  # a classic group's id is not a share group's
            conn = other.conn
            conn.call(P.JOIN_GROUP, 5, body(P.JOIN_GROUP, 5, "JoinGroupRequest", group_id="g-implicit-classic",
                                           session_timeout=R.millis(10_000), rebalance_timeout=R.millis(10_000),
                                           member_id="", group_instance_id=None, protocol_type="consumer",
                                           protocols=()))
            assert int(other.heartbeat(topics=("raw",)).error_code) == 69  # GROUP_ID_NOT_FOUND
        finally:
            other.conn.close()
        conn = member.conn
        assert int(conn.call(P.SHARE_ACKNOWLEDGE, 2, body(
            P.SHARE_ACKNOWLEDGE, 2, "ShareAcknowledgeRequest", group_id="g-raw", member_id="m-raw",
            share_session_epoch=i32(1), topics=())).error_code) == 122  # SHARE_SESSION_NOT_FOUND
        assert int(member.fetch(3, topic_id).error_code) == 122
        empty = member.fetch(0, topic_id)  # opens the session: nothing there, max_wait 0 answers at once
        assert int(empty.error_code) == 0 and not empty.responses
        assert int(member.fetch(5, topic_id).error_code) == 123  # INVALID_SHARE_SESSION_EPOCH (1 expected)
        acked = member.fetch(1, topic_id, acks=((0, 10**15, (1,)),))  # nothing of it acquired: refused at once
        assert int(partition_of(acked).acknowledge_error_code) == 121  # INVALID_RECORD_STATE
        unknown = member.fetch(2, uuid.UUID(int=99))
        assert int(partition_of(unknown).error_code) == 100  # UNKNOWN_TOPIC_ID

        began = time.monotonic()
        conn.send(P.SHARE_FETCH, 2, member.fetch_body(3, topic_id, max_wait_ms=10_000))
        produce(node.bootstrap, "raw", ["woke"])
        _, _, _, answer_body = conn.recv_response()
        waited = time.monotonic() - began
        woke = partition_of(R.decode_response(P.SHARE_FETCH, 2, answer_body))
        assert [(int(a.first_offset), int(a.last_offset), int(a.delivery_count)) for a in woke.acquired_records] \
            == [(0, 0, 1)] and b"woke" in bytes(woke.records)
        assert waited < 5, waited  # woken by the append, not by its 10 s wait
        done = member.fetch(4, topic_id, acks=((0, 0, (1,)),))
        assert int(partition_of(done).acknowledge_error_code) == 0
        assert int(member.heartbeat(epoch=-1).error_code) == 0
    finally:
        member.conn.close()


def test_share_group_offsets_are_altered_and_deleted(node):
    """AlterShareGroupOffsets moves an empty group's share-partition (its records in flight forgotten): the records
    from there come again; DeleteShareGroupOffsets forgets it (share.auto.offset.reset decides again: earliest
    here); a group with members is refused NON_EMPTY_GROUP, an offset past the high watermark OFFSET_OUT_OF_RANGE."""
    create_topic(node.bootstrap, "reset")
    produce(node.bootstrap, "reset", ["r0", "r1", "r2"])
    conn = R.RawConnection("127.0.0.1", node.port)

    def alter(start: int) -> Any:
        def n(name: str, **fields: Any) -> Any:
            return R.request_entity(P.ALTER_SHARE_GROUP_OFFSETS, 0, name, **fields)
        return conn.call(P.ALTER_SHARE_GROUP_OFFSETS, 0, body(
            P.ALTER_SHARE_GROUP_OFFSETS, 0, "AlterShareGroupOffsetsRequest", group_id="g-reset", topics=(n(
                "AlterShareGroupOffsetsRequestTopic", topic_name="reset", partitions=(n(
                    "AlterShareGroupOffsetsRequestPartition", partition_index=i32(0), start_offset=i64(start)),)),)))

    def read_all(count: int) -> list:
        consumer = share_consumer(node.bootstrap, "g-reset", "reset")
        try:
            got = take(consumer, count)
            consumer.poll(0.5)  # acknowledged
            return [(m.offset(), m.delivery_count()) for m in got]
        finally:
            consumer.close()

    try:
        assert read_all(3) == [(0, 1), (1, 1), (2, 1)]
        refused = alter(99)
        assert [int(p.error_code) for t in refused.responses for p in t.partitions] == [1]  # OFFSET_OUT_OF_RANGE
        moved = alter(1)
        assert int(moved.error_code) == 0 and [int(p.error_code) for t in moved.responses for p in t.partitions] == [0]
        assert read_all(2) == [(1, 1), (2, 1)]
        deleted = conn.call(P.DELETE_SHARE_GROUP_OFFSETS, 0, body(
            P.DELETE_SHARE_GROUP_OFFSETS, 0, "DeleteShareGroupOffsetsRequest", group_id="g-reset", topics=(
                R.request_entity(P.DELETE_SHARE_GROUP_OFFSETS, 0, "DeleteShareGroupOffsetsRequestTopic",
                                 topic_name="reset"),)))
        assert int(deleted.error_code) == 0 and [int(t.error_code) for t in deleted.responses] == [0]
        assert read_all(3) == [(0, 1), (1, 1), (2, 1)]
        active = share_consumer(node.bootstrap, "g-reset", "reset")
        try:
            wait_for(lambda: int(alter(0).error_code) == 68, 15, "NON_EMPTY_GROUP while a member is in")
        finally:
            active.close()
    finally:
        conn.close()


def test_a_topic_made_again_under_its_name_starts_a_new_share_partition(node):
    """The share-partition remembers its topic's id: a topic deleted and created again is read from its start,
    not from where the old one's share-partition stood."""
    create_topic(node.bootstrap, "remade")
    produce(node.bootstrap, "remade", ["old0", "old1", "old2"])
    consumer = share_consumer(node.bootstrap, "g-remade", "remade")
    try:
        assert values(take(consumer, 3)) == ["old0", "old1", "old2"]
        consumer.poll(0.5)  # acknowledged: the share-partition's start is 3
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    admin.delete_topics(["remade"])["remade"].result(15)
    wait_for(lambda: "remade" not in admin.list_topics(timeout=10).topics, 15, "the topic gone")
    create_topic(node.bootstrap, "remade")
    produce(node.bootstrap, "remade", ["new0", "new1"])
    consumer = share_consumer(node.bootstrap, "g-remade", "remade")
    try:
        got = take(consumer, 2)
        assert [(m.offset(), m.value()) for m in got] == [(0, b"new0"), (1, b"new1")]
        consumer.poll(0.5)
    finally:
        consumer.close()


def test_kafkas_java_share_consumer_and_admin(node):
    """Kafka 4.4's KafkaShareConsumer (explicit ACCEPT, RELEASE, REJECT; commitSync) and Admin
    (incrementalAlterConfigs of a GROUP, describeShareGroups, listShareGroupOffsets), one JVM run
    (tests/java/ShareClients.java)."""
    done = subprocess.run([java(), *CLIENT_JVM_OPTIONS, "-cp", classpath(), str(JAVA / "ShareClients.java"),
                           node.bootstrap, "java"], capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    assert done.returncode == 0, f"ShareClients.java exited {done.returncode}:\n{done.stdout}{done.stderr}"
    got = {line["step"]: line for line in map(json.loads, (line for line in done.stdout.splitlines()
                                                              if line.startswith('{"step"')))}
    assert got["first"]["records"] == [[i, f"v{i}", 1] for i in range(10)]
    assert got["first"]["commit_errors"] == 0 and got["first"]["lock_ms"] == LOCK_MS
    assert got["redelivered"]["records"] == [[i, f"v{i}", 2] for i in (5, 6, 7)]
    assert got["described"] == {"step": "described", "state": "Stable", "members": [["java-share", ["java-q-0"]]]}
    assert (got["offsets"]["start"], got["offsets"]["lag"]) == (10, 0)


def alter_group(bootstrap: str, group: str, **values: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("group", group, incremental_configs=[
        ConfigEntry(name.replace("_", "."), value, incremental_operation=AlterConfigOpType.SET)
        for name, value in values.items()])
    admin.incremental_alter_configs([resource])[resource].result(timeout=15)


def test_group_configs_set_a_share_groups_start_isolation_and_lock(node):
    """share.auto.offset.reset, share.isolation.level and share.record.lock.duration.ms per group (GROUP config
    resource) over the node's defaults (earliest, read_uncommitted, 1.5 s here)."""
    create_topic(node.bootstrap, "configured")
    alter_group(node.bootstrap, "g-latest", share_auto_offset_reset="latest")
    alter_group(node.bootstrap, "g-committed", share_isolation_level="read_committed",
                share_auto_offset_reset="earliest", share_record_lock_duration_ms="20000")
    with pytest.raises(KafkaException) as refused:
        alter_group(node.bootstrap, "g-latest", share_record_lock_duration_ms="500")  # below the node's minimum
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
    with pytest.raises(KafkaException):
        alter_group(node.bootstrap, "g-latest", share_auto_offset_reset="by_duration:PT1H")
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    resource = ConfigResource("group", "g-committed")
    described = admin.describe_configs([resource])[resource].result(timeout=15)
    assert {name: (described[name].value, described[name].source) for name in (
        "share.isolation.level", "share.record.lock.duration.ms", "share.auto.offset.reset")} == {
        "share.isolation.level": ("read_committed", 8), "share.record.lock.duration.ms": ("20000", 8),
        "share.auto.offset.reset": ("earliest", 8)}

    producer = Producer({"bootstrap.servers": node.bootstrap, "transactional.id": "share-tx"})
    producer.init_transactions(15)
    for commit, value in ((False, "aborted"), (True, "committed")):
        producer.begin_transaction()
        producer.produce("configured", value=value.encode(), partition=0)
        producer.flush(15)
        (producer.commit_transaction if commit else producer.abort_transaction)(15)
    latest = share_consumer(node.bootstrap, "g-latest", "configured")
    committed = share_consumer(node.bootstrap, "g-committed", "configured")
    plain = share_consumer(node.bootstrap, "g-uncommitted", "configured")
    try:
        got = take(committed, 1)
        assert values(got) == ["committed"] and got[0].offset() == 2  # 0 aborted, 1 its marker
        assert sorted(values(take(plain, 2))) == ["aborted", "committed"]  # read_uncommitted: both
        latest.poll(1.0)  # joins: its share-partition starts at the end
        produce(node.bootstrap, "configured", ["after"])
        assert values(take(latest, 1)) == ["after"]
        assert values(take(committed, 1)) == ["after"]
    finally:
        for consumer in (latest, committed, plain):
            consumer.close()


def test_group_configs_set_a_share_groups_session_heartbeat_and_limits(node):
    """share.session.timeout.ms, share.heartbeat.interval.ms, share.delivery.count.limit and
    share.partition.max.record.locks per group (GROUP config resource) within the node's group.share.min/max.*
    bounds (Kafka 4.4's checks: each within its range, the session above the interval), read at each heartbeat
    and acquisition; Kafka's other share group configs refused."""
    create_topic(node.bootstrap, "beat")
    produce(node.bootstrap, "beat", ["b0", "b1"])
    topic_id = R.topic_ids("127.0.0.1", node.port, ["beat"])["beat"]
    alter_group(node.bootstrap, "g-beat", share_heartbeat_interval_ms="700", share_session_timeout_ms="1500",
                share_delivery_count_limit="2", share_partition_max_record_locks="100")
    for refused in ({"share_session_timeout_ms": "60001"}, {"share_heartbeat_interval_ms": "1500"},
                    {"share_heartbeat_interval_ms": "50"}, {"share_delivery_count_limit": "11"},
                    {"share_delivery_count_limit": "1"}, {"share_partition_max_record_locks": "4001"},
                    {"share_renew_acknowledge_enable": "false"}, {"share_assignment_interval_ms": "1000"},
                    {"errors_deadletterqueue_topic_name": "dlq"}):
        with pytest.raises(KafkaException) as error:
            alter_group(node.bootstrap, "g-beat", **refused)
        assert error.value.args[0].code() == KafkaError.INVALID_CONFIG, refused
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    resource = ConfigResource("group", "g-beat")
    described = admin.describe_configs([resource])[resource].result(timeout=15)
    assert {name: (described[name].value, described[name].source) for name in (
        "share.heartbeat.interval.ms", "share.session.timeout.ms", "share.delivery.count.limit",
        "share.partition.max.record.locks")} == {
        "share.heartbeat.interval.ms": ("700", 8), "share.session.timeout.ms": ("1500", 8),
        "share.delivery.count.limit": ("2", 8), "share.partition.max.record.locks": ("100", 8)}
    assert [(y.name, y.value) for y in described["share.delivery.count.limit"].synonyms.values()] == [
        ("share.delivery.count.limit", "2"), ("group.share.delivery.count.limit", "3")]

    member = RawShareMember(node, "g-beat", "m-beat")
    try:
        joined = member.heartbeat(topics=("beat",))
        assert int(joined.error_code) == 0 and joined.heartbeat_interval.total_seconds() == 0.7
        alter_group(node.bootstrap, "g-beat", share_heartbeat_interval_ms="900")
        assert member.heartbeat().heartbeat_interval.total_seconds() == 0.9  # the next heartbeat takes it
        deliveries = []
        for epoch in range(3):  # acquire, release; again; then nothing: archived at the group's limit of 2
            answer = member.fetch(epoch, topic_id, acks=((0, 1, (2,)),) if epoch else (), max_records=2)
            deliveries.append([(int(a.first_offset), int(a.last_offset), int(a.delivery_count))
                               for t in answer.responses for p in t.partitions for a in p.acquired_records])
        assert deliveries == [[(0, 1, 1)], [(0, 1, 2)], []]
        # Its session is the group's 1.5 s: silent, the member is removed.
        began = time.monotonic()
        conn = member.conn

        def members_left() -> Any:
            answer = conn.call(P.SHARE_GROUP_DESCRIBE, 1, body(
                P.SHARE_GROUP_DESCRIBE, 1, "ShareGroupDescribeRequest", group_ids=("g-beat",),
                include_authorized_operations=False))
            return answer.groups[0].group_state == "Empty"

        wait_for(members_left, 15, "the silent member's session to end")
        assert time.monotonic() - began < 10  # 1.5 s, not the node's 45 s
    finally:
        member.conn.close()


SHARE_APIS = ("ShareGroupHeartbeat", "ShareGroupDescribe", "ShareFetch", "ShareAcknowledge")
SHARE_TOTALS = ("share_records_acquired", "share_redeliveries", "share_records_archived", "share_lock_expiries",
                "share_acknowledged_accept", "share_acknowledged_release", "share_acknowledged_reject")


def fresh_stats(started: Any) -> dict:
    """The node's stats document once the timer and every worker published after this call began (so it counts
    every request answered before)."""
    mark = node_stats(started)["node"]["read_at_ms"]

    def published() -> dict | None:
        document = node_stats(started)
        fresh = all(p["published_ms"] > mark for p in document["processes"] if p["role"] in ("timer", "worker"))
        return document if fresh else None

    return wait_for(published, 15, "the stats segment's next publication", poll_s=0.05)


def share_counts(started: Any) -> dict[str, int]:
    """The share APIs' request counts, every API's request errors summed, and the timer's share counters (fresh)."""
    document = fresh_stats(started)
    apis, totals = document["apis"], document["totals"]
    counts = {api: apis.get(api, {}).get("requests", 0) for api in SHARE_APIS}
    counts["request_errors"] = sum(api.get("request_errors", 0) for api in apis.values())
    return counts | {name: totals[name] for name in SHARE_TOTALS}


def test_stats_count_the_share_apis_and_records(node):
    """The share APIs counted each under its own key (keys 76-79 were past the stats segment's 72 API keys, and
    landed in other APIs' counters), and the timer's share counters, by what one raw member does here: six
    records acquired, one accepted, one released, one rejected (archived) by a ShareAcknowledge, three whose lock
    (the group's 1 s) runs out, the four available ones acquired again (redelivered) and accepted."""
    create_topic(node.bootstrap, "stats")
    produce(node.bootstrap, "stats", [f"c{i}" for i in range(6)])
    alter_group(node.bootstrap, "g-stats", share_record_lock_duration_ms="1000")
    topic_id = R.topic_ids("127.0.0.1", node.port, ["stats"])["stats"]
    before = share_counts(node)
    member = RawShareMember(node, "g-stats", "m-stats")
    conn = member.conn
    try:
        assert int(member.heartbeat(topics=("stats",)).error_code) == 0
        described = conn.call(P.SHARE_GROUP_DESCRIBE, 1, body(
            P.SHARE_GROUP_DESCRIBE, 1, "ShareGroupDescribeRequest", group_ids=("g-stats",),
            include_authorized_operations=False))
        assert [m.member_id for m in described.groups[0].members] == ["m-stats"]
        first = partition_of(member.fetch(0, topic_id, max_records=6))
        assert [(int(a.first_offset), int(a.last_offset)) for a in first.acquired_records] == [(0, 5)]

        def n(name: str, **fields: Any) -> Any:
            return R.request_entity(P.SHARE_ACKNOWLEDGE, 2, name, **fields)
        acked = conn.call(P.SHARE_ACKNOWLEDGE, 2, body(
            P.SHARE_ACKNOWLEDGE, 2, "ShareAcknowledgeRequest", group_id="g-stats", member_id="m-stats",
            share_session_epoch=i32(1), topics=(n("AcknowledgeTopic", topic_id=topic_id, partitions=(n(
                "AcknowledgePartition", partition_index=i32(0), acknowledgement_batches=(n(
                    "AcknowledgementBatch", first_offset=i64(0), last_offset=i64(2),
                    acknowledge_types=(i8(1), i8(2), i8(3))),)),)),)))
        assert int(acked.error_code) == 0 and int(partition_of(acked).error_code) == 0
        wait_for(lambda: node_stats(node)["totals"]["share_lock_expiries"] >= before["share_lock_expiries"] + 3, 15,
                 "the locks of offsets 3-5 to run out")
        again = partition_of(member.fetch(2, topic_id, max_records=6))
        assert [(int(a.first_offset), int(a.last_offset), int(a.delivery_count)) for a in again.acquired_records] \
            == [(1, 1, 2), (3, 5, 2)]
        done = member.fetch(3, topic_id, acks=((1, 1, (1,)), (3, 5, (1,))), max_records=0)
        assert int(partition_of(done).acknowledge_error_code) == 0
        assert int(member.heartbeat(epoch=-1).error_code) == 0
    finally:
        conn.close()
    after = share_counts(node)
    assert {name: after[name] - before[name] for name in after} == {
        "ShareGroupHeartbeat": 2, "ShareGroupDescribe": 1, "ShareFetch": 3, "ShareAcknowledge": 1, "request_errors": 0,
        "share_records_acquired": 10, "share_redeliveries": 4, "share_records_archived": 1, "share_lock_expiries": 3,
        "share_acknowledged_accept": 5, "share_acknowledged_release": 1, "share_acknowledged_reject": 1}


def hold(bootstrap: str, group: str, topic: str) -> list[str]:
    """Run HOLDER in a child process until it holds 5 records, then kill it (SIGKILL): the offsets it held."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, bootstrap, group, topic], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, preexec_fn=die_with_parent)
    try:
        return holder.stdout.readline().split()
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdout.close()


@pytest.mark.parametrize("how", ["node restart", "timer kill -9"])
def test_share_state_survives(node_factory, how):
    """Acknowledged records never come back; acquired-but-unacknowledged ones come back with their delivery
    count, whether the whole node restarts or only its timer process dies (kill -9). The lock is long here
    (60 s): the held records come back at once because their locks died with the timer, not because they ran
    out."""
    started = node_factory(workers=1, config=CONFIG.replace(f"= {LOCK_MS}", "= 60000"))
    topic, group = "durable", "g-durable"
    create_topic(started.bootstrap, topic)
    produce(started.bootstrap, topic, [f"d{i}" for i in range(10)])
    consumer = share_consumer(started.bootstrap, group, topic, explicit=True, **{"max.poll.records": 5})
    try:
        got = take(consumer, 5)
        assert [m.offset() for m in got] == list(range(5))
        for message in got:
            consumer.acknowledge(message, AcknowledgeType.ACCEPT)
        assert all(error is None for error in consumer.commit_sync(15).values())
    finally:
        consumer.close()
    assert hold(started.bootstrap, group, topic) == [str(i) for i in range(5, 10)]
    restart_or_kill_the_timer(started, how)
    began = time.monotonic()
    consumer = share_consumer(started.bootstrap, group, topic, explicit=True)
    try:
        got = take(consumer, 5)
        assert [(m.offset(), m.delivery_count()) for m in got] == [(i, 2) for i in range(5, 10)]
        assert time.monotonic() - began < 30
        for message in got:
            consumer.acknowledge(message, AcknowledgeType.ACCEPT)
        consumer.commit_sync(15)
    finally:
        consumer.close()


def node_stats(started: Any) -> dict:
    """The node's stats document, as `shmbroker stats --json` prints it: per-API counts and the processes'
    totals (read here, in this process, from the node's shared memory)."""
    reader = NodeReader.open(str(started.data_dir))
    try:
        return snapshot_document(reader)
    finally:
        reader.close()


def heartbeats(document: dict) -> int:
    return document["apis"].get("ShareGroupHeartbeat", {}).get("requests", 0)


def described_member(started: Any, group: str) -> tuple[str, int]:
    """The (member id, member epoch) of the group's only member, by ShareGroupDescribe."""
    conn = R.RawConnection("127.0.0.1", started.port)
    try:
        answer = conn.call(P.SHARE_GROUP_DESCRIBE, 1, body(P.SHARE_GROUP_DESCRIBE, 1, "ShareGroupDescribeRequest",
                                                           group_ids=(group,), include_authorized_operations=False))
    finally:
        conn.close()
    (described,) = answer.groups
    assert int(described.error_code) == 0 and len(described.members) == 1, described
    return described.members[0].member_id, int(described.members[0].member_epoch)


@pytest.mark.parametrize("how", ["node restart", "timer kill -9"])
def test_a_consumer_goes_on_across_a_restart_as_the_same_member(node_factory, how):
    """A live ShareConsumer while the node restarts, or its timer process is killed (-9) and restarted: its
    membership is kept (the offsets log), so it heartbeats on with its member id and epoch, never fenced nor
    rejoining (no join in the new timer, the same id and epoch in ShareGroupDescribe after two heartbeats); it
    opens a new share session and gets every record produced after the restart once; none it acknowledged before
    comes again. A member that joined and left first puts the group epoch above what a group made again by the
    consumer's join would be at."""
    started = node_factory(workers=2, config=CONFIG + "share_heartbeat_interval_ms = 300\n")
    create_topic(started.bootstrap, "live", 2)
    passer = RawShareMember(started, "g-live", "passer")
    try:
        assert int(passer.heartbeat(topics=("live",)).error_code) == 0
        assert int(passer.heartbeat(epoch=-1).error_code) == 0
    finally:
        passer.conn.close()
    consumer = share_consumer(started.bootstrap, "g-live", "live", explicit=True)
    try:
        produce(started.bootstrap, "live", [f"a{i}" for i in range(5)], partition=0)
        produce(started.bootstrap, "live", [f"a{i}" for i in range(5, 10)], partition=1)
        before = take(consumer, 10)
        for message in before:
            consumer.acknowledge(message, AcknowledgeType.ACCEPT)
        assert all(error is None for error in consumer.commit_sync(15).values())
        assert sorted(values(before)) == sorted(f"a{i}" for i in range(10))
        member = described_member(started, "g-live")
        assert member[1] > 2, member  # a group made again by the consumer's join would be at 2
        restart_or_kill_the_timer(started, how)
        produce(started.bootstrap, "live", [f"b{i}" for i in range(5)], partition=0)
        produce(started.bootstrap, "live", [f"b{i}" for i in range(5, 10)], partition=1)
        after = []
        deadline = time.monotonic() + 2 * POLL_BUDGET_S
        while len(after) < 10 and time.monotonic() < deadline:
            got = take(consumer, 1, 1.0)
            for message in got:
                consumer.acknowledge(message, AcknowledgeType.ACCEPT)
            if got:
                consumer.commit_sync(15)
            after += got
        assert sorted(values(after)) == sorted(f"b{i}" for i in range(10)), values(after)
        seen = heartbeats(fresh_stats(started))
        wait_for(lambda: heartbeats(node_stats(started)) >= seen + 2, 15, "two more heartbeats of the consumer")
        assert described_member(started, "g-live") == member
        assert node_stats(started)["totals"]["share_member_joins"] == 0
        consumer.poll(0.5)
        assert not consumer.poll(0.5)  # nothing more: no record came twice
    finally:
        consumer.close()
