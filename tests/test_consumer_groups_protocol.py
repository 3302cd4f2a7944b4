"""The consumer group protocol (KIP-848) at the protocol level against a real node, with a raw client: joins,
reconciliation with revocation before assignment, Kafka's error codes, static members, sessions, regex
subscriptions, OffsetCommit v9's and OffsetFetch v9's member epochs, a classic and a consumer group side by side."""

from __future__ import annotations

import datetime
import functools
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from kio.static.primitive import i32, i64, i64Timedelta

from scripts.harness import rawkafka as R
from scripts.harness.nodeproc import CLI
from scripts.harness.rawkafka import millis as ms, request_body as body, request_entity as nested
from tests.test_clients import create_topic
from tests.test_groups_protocol import ClosingFactory, subscription
from shmbroker.workers.codecs import protocol as P

CONFIG = ("[groups]\ninitial_rebalance_delay_ms = 50\nmin_session_timeout_ms = 500\n"
          "consumer_session_timeout_ms = 3000\nconsumer_heartbeat_interval_ms = 100\n"
          "consumer_min_session_timeout_ms = 1000\nconsumer_min_heartbeat_interval_ms = 50\n"
          "consumer_unreleased_heartbeat_interval_ms = 20\n")
NONE, UNKNOWN_MEMBER, INVALID_REQUEST, INCONSISTENT_PROTOCOL, GROUP_ID_NOT_FOUND = 0, 25, 42, 23, 69
FENCED_EPOCH, UNRELEASED_INSTANCE, UNSUPPORTED_ASSIGNOR, STALE_EPOCH, UNSUPPORTED_VERSION = 110, 111, 112, 113, 35
INVALID_CONFIG = 40
HB = P.CONSUMER_GROUP_HEARTBEAT


class Member:
    """One consumer-protocol member over its own connection; it remembers its epoch and what it owns."""

    def __init__(self, node, group: str, member_id: str, topics: tuple | None = None, regex: str | None = None,
                 instance: str | None = None, assignor: str | None = None) -> None:
        """Subscribed to `topics` (default: t, unless it has a regex) and to `regex`."""
        self.conn = R.RawConnection("127.0.0.1", node.port)
        self.group, self.member_id, self.regex = group, member_id, regex
        self.topics = topics if topics is not None else () if regex is not None else ("t",)
        self.instance, self.assignor = instance, assignor
        self.epoch, self.owned = 0, {}
        self.ids: dict = {}  # topic id -> name, learned from ConsumerGroupDescribe

    def heartbeat(self, epoch: int | None = None, owned: dict | None = None, full: bool = False):
        epoch = self.epoch if epoch is None else epoch
        joining = epoch == 0 or full
        owned = self.owned if owned is None else owned
        topic_partitions = () if epoch == 0 else tuple(
            nested(HB, 1, "TopicPartitions", topic_id=self.id_of(t), partitions=tuple(map(i32, sorted(ps))))
            for t, ps in sorted(owned.items()) if ps)
        response = self.conn.call(HB, 1, body(
            HB, 1, "ConsumerGroupHeartbeatRequest", group_id=self.group, member_id=self.member_id,
            member_epoch=i32(epoch), instance_id=self.instance, rack_id=None,
            rebalance_timeout=ms(5000 if joining else -1),
            subscribed_topic_names=tuple(self.topics) if joining and (self.regex is None or self.topics) else None,
            subscribed_topic_regex=self.regex if joining else None,
            server_assignor=self.assignor if joining else None, topic_partitions=topic_partitions))
        if int(response.error_code) == NONE and epoch >= 0:
            self.epoch = int(response.member_epoch)
            if response.assignment is not None:
                self.owned = {self.name_of(t.topic_id): set(map(int, t.partitions))
                              for t in response.assignment.topic_partitions}
        return response

    def id_of(self, name: str):
        return next(i for i, n in self.ids.items() if n == name)

    def name_of(self, topic_id):
        if topic_id not in self.ids:
            self.describe()
        return self.ids[topic_id]

    def describe(self, *groups: str):
        response = self.conn.call(P.CONSUMER_GROUP_DESCRIBE, 1, body(
            P.CONSUMER_GROUP_DESCRIBE, 1, "ConsumerGroupDescribeRequest", group_ids=groups or (self.group,),
            include_authorized_operations=False))
        for group in response.groups:
            for member in group.members:
                for a in (member.assignment, member.target_assignment):
                    self.ids.update({t.topic_id: t.topic_name for t in a.topic_partitions})
        return response

    def commit(self, epoch: int, version: int = 9, offset: int = 5, topic: str = "t"):
        response = self.conn.call(P.OFFSET_COMMIT, version, body(
            P.OFFSET_COMMIT, version, "OffsetCommitRequest", group_id=self.group,
            generation_id_or_member_epoch=i32(epoch), member_id=self.member_id, group_instance_id=None,
            retention_time=i64Timedelta.parse(datetime.timedelta(milliseconds=-1)),
            topics=(nested(P.OFFSET_COMMIT, version, "OffsetCommitRequestTopic", name=topic, partitions=(nested(
                P.OFFSET_COMMIT, version, "OffsetCommitRequestPartition", partition_index=i32(0),
                committed_offset=i64(offset), committed_leader_epoch=i32(-1), committed_metadata=""),)),)))
        return int(response.topics[0].partitions[0].error_code)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def node(node_factory):
    node = node_factory(workers=2, config=CONFIG)
    create_topic(node.bootstrap, "t", 6)
    return node


@pytest.fixture
def members(node):
    with ClosingFactory(functools.partial(Member, node), node) as make:
        yield make


def all_owned(*members) -> list:
    return [(t, p) for m in members for t, ps in m.owned.items() for p in ps]


def test_members_share_partitions_with_revocation_before_assignment(members):
    a = members("g", "a")
    assert int(a.heartbeat().error_code) == NONE and a.epoch == 1
    a.describe()
    assert sorted(all_owned(a)) == [("t", p) for p in range(6)]
    b = members("g", "b")
    first = b.heartbeat()
    assert int(first.error_code) == NONE and b.epoch == 2 and b.owned == {}  # a still owns them all
    a.heartbeat()  # asked to revoke three, at its old epoch
    assert a.epoch == 1 and len(all_owned(a)) == 3
    b.heartbeat()
    assert b.owned == {}  # not before a said it gave them up
    a.heartbeat()  # owns three now: the new epoch
    assert a.epoch == 2
    b.heartbeat()
    assert len(all_owned(b)) == 3 and not set(all_owned(a)) & set(all_owned(b))
    described = a.describe().groups[0]
    assert described.group_state == "Stable" and int(described.group_epoch) == 2
    assert {m.member_id: int(m.member_epoch) for m in described.members} == {"a": 2, "b": 2}
    assert described.assignor_name == "uniform"


def interval_ms(response) -> int:
    return round(response.heartbeat_interval.total_seconds() * 1000)


def test_a_member_waiting_for_partitions_still_held_is_told_to_heartbeat_sooner(members):
    a = members("g", "a")
    assert interval_ms(a.heartbeat()) == 100
    a.describe()
    b = members("g", "b")
    assert interval_ms(b.heartbeat()) == 20  # its partitions are a's until a gives them up
    assert interval_ms(a.heartbeat()) == 100  # a revokes at the interval it was told
    assert interval_ms(a.heartbeat()) == 100  # and acknowledges: the partitions are free
    released = b.heartbeat()
    assert len(all_owned(b)) == 3 and interval_ms(released) == 100  # back to the group's interval


def offset_fetch_v9(member: Member, group: str, member_id: str | None, epoch: int) -> tuple[int, list[int]]:
    """(the group's error, the committed offsets of t-0) by OffsetFetch v9 naming `member_id` at `epoch`."""
    fetched = member.conn.call(P.OFFSET_FETCH, 9, body(P.OFFSET_FETCH, 9, "OffsetFetchRequest", groups=(nested(
        P.OFFSET_FETCH, 9, "OffsetFetchRequestGroup", group_id=group, member_id=member_id, member_epoch=i32(epoch),
        topics=(nested(P.OFFSET_FETCH, 9, "OffsetFetchRequestTopics", name="t", partition_indexes=(i32(0),)),)),),
        require_stable=False))
    (answer,) = fetched.groups
    return int(answer.error_code), [int(p.committed_offset) for t in answer.topics for p in t.partitions]


def test_kafkas_error_codes(members, node):
    a = members("g", "a")
    a.heartbeat()
    assert int(a.heartbeat(epoch=7).error_code) == FENCED_EPOCH
    assert int(members("g", "ghost").heartbeat(epoch=3).error_code) == UNKNOWN_MEMBER
    assert int(members("g", "").heartbeat().error_code) == INVALID_REQUEST
    assert int(members("g", "x", assignor="sticky").heartbeat().error_code) == UNSUPPORTED_ASSIGNOR
    assert int(members("g2", "x", regex="(").heartbeat().error_code) == 128  # INVALID_REGULAR_EXPRESSION
    # OffsetCommit v9: the member's current epoch only; v8 is not for consumer-protocol members.
    assert a.commit(a.epoch, offset=17) == NONE
    assert a.commit(a.epoch + 1, offset=18) == STALE_EPOCH
    fetched = a.conn.call(P.OFFSET_FETCH, 6, body(P.OFFSET_FETCH, 6, "OffsetFetchRequest", group_id="g", topics=(
        nested(P.OFFSET_FETCH, 6, "OffsetFetchRequestTopic", name="t", partition_indexes=(i32(0),)),),
        require_stable=False))
    assert int(fetched.topics[0].partitions[0].committed_offset) == 17
    # OffsetFetch v9: a named member must be the group's, at its epoch; no member (admin tools) is not checked.
    assert offset_fetch_v9(a, "g", a.member_id, a.epoch) == (NONE, [17])
    assert offset_fetch_v9(a, "g", None, -1) == (NONE, [17])
    assert offset_fetch_v9(a, "g", a.member_id, a.epoch + 1) == (STALE_EPOCH, [])
    assert offset_fetch_v9(a, "g", "ghost", 1) == (UNKNOWN_MEMBER, [])
    assert offset_fetch_v9(a, "nobody", "ghost", 1) == (NONE, [-1])  # no such consumer group: nothing to check
    assert a.commit(a.epoch, version=8) == UNSUPPORTED_VERSION
    assert members("g", "ghost2").commit(1) == UNKNOWN_MEMBER
    # A classic member cannot join a consumer group with members, nor the other way round.
    classic = R.RawConnection("127.0.0.1", node.port)
    try:
        joined = classic.call(P.JOIN_GROUP, 5, body(
            P.JOIN_GROUP, 5, "JoinGroupRequest", group_id="g", session_timeout=ms(5000), rebalance_timeout=ms(5000),
            member_id="", group_instance_id="c", protocol_type="consumer",
            protocols=(nested(P.JOIN_GROUP, 5, "JoinGroupRequestProtocol", name="range", metadata=subscription("t")),)))
        assert int(joined.error_code) == INCONSISTENT_PROTOCOL
        classic.call(P.JOIN_GROUP, 5, body(
            P.JOIN_GROUP, 5, "JoinGroupRequest", group_id="classic", session_timeout=ms(5000),
            rebalance_timeout=ms(5000), member_id="", group_instance_id="c", protocol_type="consumer",
            protocols=(nested(P.JOIN_GROUP, 5, "JoinGroupRequestProtocol", name="range", metadata=subscription("t")),)))
    finally:
        classic.close()
    assert int(members("classic", "y").heartbeat().error_code) == GROUP_ID_NOT_FOUND
    assert int(a.describe("classic").groups[0].error_code) == GROUP_ID_NOT_FOUND
    # Leaving: epoch -1 answers -1; the member is gone.
    left = a.heartbeat(epoch=-1)
    assert int(left.error_code) == NONE and int(left.member_epoch) == -1
    assert int(a.heartbeat(epoch=a.epoch).error_code) == UNKNOWN_MEMBER


def test_static_member_leaves_for_a_while_and_comes_back_with_its_partitions(members):
    s = members("g", "s-1", instance="i-1")
    s.heartbeat()
    s.describe()
    assert int(members("g", "s-2", instance="i-1").heartbeat().error_code) == UNRELEASED_INSTANCE
    mine = all_owned(s)
    epoch, group_epoch = s.epoch, int(s.describe().groups[0].group_epoch)
    assert int(s.heartbeat(epoch=-2).error_code) == NONE
    back = members("g", "s-3", instance="i-1")
    back.ids = s.ids
    assert int(back.heartbeat().error_code) == NONE
    assert sorted(all_owned(back)) == sorted(mine)
    # As Kafka: the return changes nothing the assignment depends on, so the group epoch stays and the member is
    # back at its epoch (the node bumped the group epoch, and every member reconciled to it).
    assert (back.epoch, int(s.describe().groups[0].group_epoch)) == (epoch, group_epoch)
    assert [m.member_id for m in s.describe().groups[0].members] == ["s-3"]


def test_a_silent_member_is_fenced_after_the_session_timeout(members):
    a, b = members("g", "a"), members("g", "b")
    a.heartbeat()
    b.ids = a.describe() and a.ids
    b.heartbeat()
    deadline = time.monotonic() + 10
    while len(all_owned(b)) < 3 and time.monotonic() < deadline:  # settle: a revokes, b gets three
        a.heartbeat()
        b.heartbeat()
        time.sleep(0.05)
    assert len(all_owned(b)) == 3
    started = time.monotonic()
    while len(all_owned(a)) < 6 and time.monotonic() < started + 15:  # b goes silent
        a.heartbeat()
        time.sleep(0.1)
    assert len(all_owned(a)) == 6 and 2.7 < time.monotonic() - started < 8
    assert int(b.heartbeat().error_code) == UNKNOWN_MEMBER


def test_a_regex_subscription_picks_up_a_topic_created_later(members, node):
    r = members("rg", "r", regex="rx-.*")
    assert int(r.heartbeat().error_code) == NONE and r.owned == {}
    create_topic(node.bootstrap, "rx-1", 2)
    create_topic(node.bootstrap, "other", 2)
    deadline = time.monotonic() + 10
    while not r.owned and time.monotonic() < deadline:
        r.heartbeat()
        time.sleep(0.1)
    assert r.owned == {"rx-1": {0, 1}}
    assert r.describe().groups[0].members[0].subscribed_topic_regex == "rx-.*"


def test_a_regex_new_to_the_group_is_resolved_after_the_heartbeat_that_brings_it(members, node):
    """As Kafka: the literal topics come at once, the regex's at the next heartbeat, which the member is told to
    send after the shorter waiting interval; a regex subscribed again after nobody used it is resolved anew."""
    create_topic(node.bootstrap, "rx-a", 2)
    m = members("rg3", "m", topics=("t",), regex="rx-.*")
    first = m.heartbeat()
    assert int(first.error_code) == NONE and m.owned == {"t": set(range(6))} and interval_ms(first) == 20
    time.sleep(0.3)  # the timer resolves the regex at its next turn
    second = m.heartbeat()
    assert m.owned == {"t": set(range(6)), "rx-a": {0, 1}} and interval_ms(second) == 100
    assert int(m.heartbeat(epoch=-1).error_code) == NONE  # leaves: nobody uses the regex
    again = members("rg3", "n", topics=("t",), regex="rx-.*")
    assert interval_ms(again.heartbeat()) == 20 and again.owned == {"t": set(range(6))}


def test_describe_groups_v6_says_a_consumer_group_is_not_a_classic_group(members):
    a = members("cg", "a")
    a.heartbeat()
    response = a.conn.call(P.DESCRIBE_GROUPS, 6, body(P.DESCRIBE_GROUPS, 6, "DescribeGroupsRequest", groups=("cg",),
                                                      include_authorized_operations=False))
    (group,) = response.groups
    assert (int(group.error_code), group.error_message) == (GROUP_ID_NOT_FOUND, "Group cg is not a classic group.")


def test_range_assignor_is_chosen_by_the_members(members):
    a = members("rg2", "a", assignor="range")
    a.heartbeat()
    assert a.describe().groups[0].assignor_name == "range"


def test_groups_describe_shows_a_consumer_group_with_assignments_and_targets(members, node):
    a = members("g", "a")
    a.heartbeat()
    stop = threading.Event()

    def keep_alive() -> None:  # the session here is 3 s; the tools take longer than that on a busy machine
        while not stop.wait(0.3):
            a.heartbeat()

    beating = threading.Thread(target=keep_alive)
    beating.start()
    try:
        check_groups_describe(node)
    finally:
        stop.set()
        beating.join(10)


def check_groups_describe(node) -> None:
    from shmbroker.node.tools.admin import Admin

    admin = Admin(node.bootstrap, 10.0, 5.0)
    assert {"group": "g", "state": "STABLE", "simple": False} in admin.groups()
    described = admin.describe_group("g")
    assert described["type"] == "consumer" and described["state"] == "STABLE"
    assert described["group_epoch"] == described["assignment_epoch"] == 1
    (member,) = described["members"]
    assert member["member_id"] == "a" and member["partitions"] == member["target"] == [f"t-{p}" for p in range(6)]
    assert member["member_epoch"] == 1
    shown = subprocess.run([*CLI, "groups", "describe", "g", "--bootstrap",
                            node.bootstrap], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "type consumer" in shown.stdout and "group epoch 1" in shown.stdout, shown.stdout


KILLABLE_CONSUMER = """
import sys
from confluent_kafka import Consumer, KafkaException
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "group.protocol": "consumer",
              "client.id": "killed", "auto.offset.reset": "earliest", "enable.auto.commit": False})
c.subscribe(["t"])
while True:
    m = c.poll(0.2)
    if m is not None and not m.error():
        print(m.key().decode(), flush=True)  # before the commit: a record is reported once read
        try:
            c.commit(m, asynchronous=False)
        except KafkaException:  # STALE_MEMBER_EPOCH while its epoch moves: the next owner reads it again
            pass
    print("assigned", len(c.assignment()), flush=True)
"""


class Killable:
    """A consumer-protocol member in a process of its own, to be killed with SIGKILL."""

    def __init__(self, bootstrap: str, group: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", KILLABLE_CONSUMER, bootstrap, group],
                                        stdout=subprocess.PIPE, text=True)
        self.keys: set[bytes] = set()
        self.assigned = 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith("assigned "):
                self.assigned = int(line.split()[1])
            else:
                self.keys.add(line.strip().encode())

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.reader.join(10)
        self.process.stdout.close()


def test_confluent_kafka_consumer_protocol_members_leave_join_die_and_resume(node):
    """Three confluent-kafka members (group.protocol=consumer) share six partitions while a classic group reads
    the same topic; one leaves and one joins (the others keep their partitions and keep consuming), one is killed
    (its partitions move after the session timeout); every record is delivered and the committed offsets resume."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

    producer = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 5})
    uncommitted: set = set()  # consumers whose last commit was refused

    def commit(c) -> None:
        """The positions of what `c` read, as an application commits them: a commit refused STALE_MEMBER_EPOCH
        (the member's epoch moved meanwhile; librdkafka does not retry manual commits) is made again next turn."""
        try:
            c.commit(asynchronous=False)
            uncommitted.discard(c)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError._NO_OFFSET:
                uncommitted.discard(c)
                return
            assert exc.args[0].code() == KafkaError.STALE_MEMBER_EPOCH, exc
            uncommitted.add(c)
    sent: set[bytes] = set()

    def produce(count: int) -> None:
        for _ in range(count):
            key = f"k{len(sent)}".encode()
            sent.add(key)
            producer.produce("t", key=key, value=key, partition=len(sent) % 6)
        assert producer.flush(30) == 0

    def consumer(name: str, group: str = "kip848", **extra) -> Consumer:
        config = {"bootstrap.servers": node.bootstrap, "group.id": group, "client.id": name,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, **extra}
        if "group.protocol" not in config:
            config["group.protocol"] = "consumer"
        c = Consumer(config)
        c.subscribe(["t"])
        return c

    seen: set[bytes] = set()
    classic_seen: set[bytes] = set()
    classic = consumer("classic", group="classic-group", **{"group.protocol": "classic"})
    live = {"a": consumer("a"), "b": consumer("b")}
    killed = Killable(node.bootstrap, "kip848")
    b_partitions: list[set] = []

    def poll_until(done, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while not done() and time.monotonic() < deadline:
            for c in live.values():
                read = [m for m in c.consume(500, 0.05) if not m.error()]
                seen.update(m.key() for m in read)
                if read or c in uncommitted:
                    commit(c)
            classic_seen.update(m.key() for m in classic.consume(500, 0.01) if not m.error())
            b_partitions.append({tp.partition for tp in live["b"].assignment()})
        assert done(), (assignments(), killed.assigned, len(seen | killed.keys), len(sent), len(classic_seen),
                        len(uncommitted))

    def assignments() -> dict:
        return {name: {tp.partition for tp in c.assignment()} for name, c in live.items()}

    try:
        produce(300)
        poll_until(lambda: all(len(p) == 2 for p in assignments().values()) and killed.assigned == 2)
        before = assignments()["b"]
        produce(300)
        live.pop("a").close()  # leaves (epoch -1): b keeps its two partitions and gains one
        poll_until(lambda: len(assignments()["b"]) == 3 and killed.assigned == 3)
        assert before <= assignments()["b"]
        live["d"] = consumer("d")  # joins: b gives one up, keeps the rest
        poll_until(lambda: all(len(p) == 2 for p in assignments().values()) and killed.assigned == 2)
        assert len(assignments()["b"] & before) >= 1
        assert all(p for p in b_partitions[len(b_partitions) // 2:])  # b was never left without partitions
        produce(300)
        killed.kill()  # no leave: its partitions move once its session (3 s here) ends
        poll_until(lambda: sum(len(p) for p in assignments().values()) == 6)
        produce(300)
        poll_until(lambda: seen | killed.keys >= sent and classic_seen >= sent and not uncommitted)
    finally:
        for c in live.values():
            c.close()
        classic.close()
        if killed.process.poll() is None:
            killed.kill()
    # Resuming from the committed offsets: a new member reads only what came after.
    before_resume = set(sent)
    produce(12)
    resumed = consumer("resumed")
    got: set[bytes] = set()
    deadline = time.monotonic() + 60
    try:
        while len(got) < 12 and time.monotonic() < deadline:
            m = resumed.poll(0.2)
            if m is not None and not m.error():
                got.add(m.key())
    finally:
        resumed.close()
    assert got == sent - before_resume


def test_confluent_kafka_consumers_share_partitions_with_the_consumer_protocol(node):
    """librdkafka's KIP-848 consumer resolves assigned topic ids through Metadata v12 (topic ids, KIP-516)."""
    from confluent_kafka import Consumer, Producer

    producer = Producer({"bootstrap.servers": node.bootstrap})
    sent = {f"k{i}".encode() for i in range(600)}
    for key in sent:
        producer.produce("t", key=key, value=key)
    assert producer.flush(30) == 0

    def consumer(name: str) -> Consumer:
        c = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "kip848", "group.protocol": "consumer",
                      "client.id": name, "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.subscribe(["t"])
        return c

    consumers = [consumer(f"c{i}") for i in range(3)]
    seen: dict[bytes, str] = {}
    deadline = time.monotonic() + 60
    while len(seen) < len(sent) and time.monotonic() < deadline:
        for c in consumers:
            message = c.poll(0.2)
            if message is not None and not message.error():
                seen[message.key()] = c
                c.commit(message, asynchronous=False)
    assert set(seen) == sent
    assert len({id(c) for c in seen.values()}) == 3  # all three got partitions
    for c in consumers:
        assert len(c.assignment()) == 2
        c.close()


def test_confluent_kafka_regex_subscription_picks_up_a_topic_created_later(node):
    from confluent_kafka import Consumer, Producer

    c = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "regex-group", "group.protocol": "consumer",
                  "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 500})
    c.subscribe(["^later-.*"])
    try:
        c.poll(1.0)
        create_topic(node.bootstrap, "later-1", 2)
        create_topic(node.bootstrap, "unrelated", 2)
        producer = Producer({"bootstrap.servers": node.bootstrap})
        for i in range(10):
            producer.produce("later-1", value=str(i).encode(), partition=i % 2)
            producer.produce("unrelated", value=b"no", partition=0)
        assert producer.flush(30) == 0
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 10 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append((m.topic(), m.value()))
        assert sorted(got) == sorted(("later-1", str(i).encode()) for i in range(10))
        assert {tp.topic for tp in c.assignment()} == {"later-1"}
    finally:
        c.close()


def test_after_the_timer_is_killed_members_rejoin_and_committed_offsets_stay(members, node):
    """Membership lives in the timer process: kill -9 of it loses the group (members are answered
    UNKNOWN_MEMBER_ID and rejoin at epoch 0) but no committed offset."""
    a = members("g", "a")
    a.heartbeat()
    assert a.commit(a.epoch, offset=42) == NONE
    timer = node.pids("timer")[0]
    os.kill(timer, signal.SIGKILL)
    node.wait_for_pids("timer", 1, exclude={timer})
    answers = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the new timer answers once its offsets are loaded
        answers.append(int(a.heartbeat().error_code))
        if answers[-1] == UNKNOWN_MEMBER:
            break
        time.sleep(0.1)
    assert answers[-1] == UNKNOWN_MEMBER, answers
    assert int(a.heartbeat(epoch=0).error_code) == NONE and a.epoch == 1 and len(all_owned(a)) == 6
    fetched = a.conn.call(P.OFFSET_FETCH, 6, body(P.OFFSET_FETCH, 6, "OffsetFetchRequest", group_id="g", topics=(
        nested(P.OFFSET_FETCH, 6, "OffsetFetchRequestTopic", name="t", partition_indexes=(i32(0),)),),
        require_stable=False))
    assert int(fetched.topics[0].partitions[0].committed_offset) == 42


class GroupConfigs:
    """A group's configs (the GROUP config resource) through confluent-kafka's admin client."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.renew()

    def renew(self) -> None:
        """A new client (after the node restarted: the old one would first wait out its reconnect backoff)."""
        from confluent_kafka.admin import AdminClient

        self.client = AdminClient({"bootstrap.servers": self.bootstrap})

    def alter(self, group: str, op: object = None, **values: str) -> int | None:
        """IncrementalAlterConfigs of `values` (their names with "_" for "."), SET unless `op`: None, or the
        error code."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

        entries = [ConfigEntry(name.replace("_", "."), value, incremental_operation=op or AlterConfigOpType.SET)
                   for name, value in values.items()]
        resource = ConfigResource("group", group, incremental_configs=entries)
        try:
            self.client.incremental_alter_configs([resource])[resource].result(timeout=30)
            return None
        except KafkaException as exc:
            return exc.args[0].code()

    def described(self, group: str) -> dict:
        """DescribeConfigs: name -> ConfigEntry."""
        from confluent_kafka.admin import ConfigResource

        resource = ConfigResource("group", group)
        return self.client.describe_configs([resource])[resource].result(timeout=30)


def test_group_configs_set_each_groups_interval_and_session_and_survive_a_restart(members, node):
    """The GROUP config resource (Kafka's consumer.session.timeout.ms and consumer.heartbeat.interval.ms), through
    confluent-kafka's admin client: described with their sources, checked against the node's bounds, used by the
    coordinator at the group's next heartbeat, kept across a restart."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigResource, ConfigSource

    configs_of = GroupConfigs(node.bootstrap)
    alter, described = configs_of.alter, configs_of.described

    # Overrides: both may be set before the group exists; the session stays above the interval, within bounds.
    assert alter("slow", consumer_heartbeat_interval_ms="250", consumer_session_timeout_ms="1200") is None
    assert alter("slow", consumer_session_timeout_ms="999") == INVALID_CONFIG  # below min 1000
    assert alter("slow", consumer_session_timeout_ms="60001") == INVALID_CONFIG  # above Kafka's max 60000
    assert alter("slow", consumer_heartbeat_interval_ms="1200") == INVALID_CONFIG  # not below the session
    assert alter("slow", consumer_heartbeat_interval_ms="20") == INVALID_CONFIG  # below min 50
    assert alter("slow", share_assignment_interval_ms="1000") == INVALID_CONFIG  # not a group config on the node
    assert alter("slow", op=AlterConfigOpType.APPEND, consumer_heartbeat_interval_ms="300") == INVALID_CONFIG
    configs = described("slow")
    interval = configs["consumer.heartbeat.interval.ms"]
    assert (interval.value, interval.source) == ("250", 8)  # GROUP_CONFIG
    assert [(s.name, s.value, s.source) for s in interval.synonyms.values()] == [
        ("consumer.heartbeat.interval.ms", "250", 8),
        ("group.consumer.heartbeat.interval.ms", "100", ConfigSource.STATIC_BROKER_CONFIG.value)]
    other = described("other")["consumer.session.timeout.ms"]
    assert (other.value, other.source) == ("3000", ConfigSource.STATIC_BROKER_CONFIG.value)

    slow, other = members("slow", "s"), members("other", "o")
    assert interval_ms(slow.heartbeat()) == 250 and interval_ms(other.heartbeat()) == 100
    assert alter("slow", consumer_heartbeat_interval_ms="400") is None
    assert interval_ms(slow.heartbeat()) == 400  # the next heartbeat takes the change
    # Sessions: slow's member is fenced after 1.2 s without a heartbeat, other's (3 s) is not.
    time.sleep(2.0)
    assert int(slow.heartbeat().error_code) == UNKNOWN_MEMBER
    assert int(other.heartbeat().error_code) == NONE

    # A DELETE goes back to the node's value; the rest stays, across a restart.
    assert alter("slow", op=AlterConfigOpType.DELETE, consumer_heartbeat_interval_ms="") is None
    node.stop()
    node.start()
    configs_of.renew()
    configs = described("slow")
    assert configs["consumer.heartbeat.interval.ms"].value == "100"
    assert (configs["consumer.session.timeout.ms"].value, configs["consumer.session.timeout.ms"].source) == ("1200", 8)
    assert interval_ms(members("slow", "s2").heartbeat()) == 100

    # The node's own group.consumer.* settings are on the broker resource, read-only, from its TOML or defaults.
    broker = ConfigResource("broker", "0")
    shown = configs_of.client.describe_configs([broker])[broker].result(timeout=30)
    assert {name: (entry.value, entry.is_read_only, entry.source) for name, entry in shown.items()
            if name.startswith("group.consumer.")} == {
        "group.consumer.session.timeout.ms": ("3000", True, ConfigSource.STATIC_BROKER_CONFIG.value),
        "group.consumer.min.session.timeout.ms": ("1000", True, ConfigSource.STATIC_BROKER_CONFIG.value),
        "group.consumer.max.session.timeout.ms": ("60000", True, ConfigSource.DEFAULT_CONFIG.value),
        "group.consumer.heartbeat.interval.ms": ("100", True, ConfigSource.STATIC_BROKER_CONFIG.value),
        "group.consumer.min.heartbeat.interval.ms": ("50", True, ConfigSource.STATIC_BROKER_CONFIG.value),
        "group.consumer.max.heartbeat.interval.ms": ("15000", True, ConfigSource.DEFAULT_CONFIG.value),
        "group.consumer.max.size": ("2147483647", True, ConfigSource.DEFAULT_CONFIG.value),
        "group.consumer.assignors": ("uniform,range", True, ConfigSource.DEFAULT_CONFIG.value),
    }


@pytest.mark.node  # it would start one, were the check gone
@pytest.mark.parametrize("groups, complaint", [
    ({"consumer_session_timeout_ms": 6000}, "consumer_min_session_timeout_ms <= consumer_session_timeout_ms"),
    ({"consumer_session_timeout_ms": 61_000}, "<= consumer_max_session_timeout_ms"),
    ({"consumer_heartbeat_interval_ms": 100}, "consumer_min_heartbeat_interval_ms <= consumer_heartbeat_interval_ms"),
    ({"consumer_min_heartbeat_interval_ms": 1000, "consumer_heartbeat_interval_ms": 1000,
      "consumer_min_session_timeout_ms": 1000, "consumer_session_timeout_ms": 1000},
     "consumer_session_timeout_ms must be greater than consumer_heartbeat_interval_ms"),
])
def test_a_node_whose_group_consumer_settings_leave_their_bounds_refuses_to_start(tmp_path, groups, complaint):
    """As Kafka's broker refuses group.consumer.* values outside their min/max (or a session not above the
    interval): `shmbroker serve` exits before it starts anything, naming the settings."""
    config = tmp_path / "node.toml"
    config.write_text("[groups]\n" + "".join(f"{key} = {value}\n" for key, value in groups.items()))
    done = subprocess.run([*CLI, "serve", "--config", str(config), "--listen",
                           "127.0.0.1:0", "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert complaint in done.stderr + done.stdout
    assert not (tmp_path / "data").exists()
