"""The authorizer on the group and transaction APIs against real nodes: a node with `[authorizer] enabled = true`,
a SASL_PLAINTEXT listener with users (admin a super user, alice, bob) beside the PLAINTEXT one (User:ANONYMOUS),
two workers, and ACLs created through CreateAcls by the super user. Real clients (confluent-kafka, kafka-python)
are allowed and refused as Kafka's broker allows and refuses them; raw requests check the response shapes
(filtered listings, per-topic refusals, KIP-430 operations)."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType)
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.errors import GroupAuthorizationFailedError, TransactionalIdAuthorizationFailedError

from scripts.harness import rawkafka as R
from tests.test_authorizer_topics import SecuredNode as AuthorizedNode
from tests.test_security_sasl import PASSWORD

pytestmark = pytest.mark.node

TIMEOUT_S = 20.0
FIND_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUPS, OFFSET_DELETE = 10, 8, 9, 15, 47
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
NONE, TOPIC_DENIED, GROUP_DENIED, TXN_ID_DENIED = 0, 29, 30, 53
READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS = 3, 8, 6, 10, 11  # AclOperation codes, KIP-430's bits
NOT_REQUESTED = -(2**31)  # KIP-430's authorized operations when not asked for, or of a group not described


class SecuredNode(AuthorizedNode):
    """One node for the module: authorizer on, users admin (super user), alice and bob on a SASL_PLAINTEXT
    listener, the --listen PLAINTEXT listener anonymous; with the group and transaction tests' helpers."""

    def __init__(self, work_dir: Path, workers: int = 2, allow_if_no_acl: bool = False) -> None:
        super().__init__(work_dir, workers, 'super_users = ["User:admin"]\n'
                         f"allow_everyone_if_no_acl_found = {str(allow_if_no_acl).lower()}\n")

    def add_acl(self, principal: str, resource_type: ResourceType, name: str, operation: AclOperation,
              pattern: ResourcePatternType = ResourcePatternType.LITERAL,
              permission: AclPermissionType = AclPermissionType.ALLOW) -> None:
        self.grant(AclBinding(resource_type, name, pattern, principal, "*", operation, permission))

    def allow_alice(self, *grants: tuple[ResourceType, str, AclOperation]) -> None:
        """ALLOW ACLs of alice, each (resource type, literal name, operation)."""
        for resource_type, name, operation in grants:
            self.add_acl("User:alice", resource_type, name, operation)

    def topic(self, name: str, partitions: int = 1) -> None:
        self.create_topic(name, partitions)

    def commit_as_admin(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        partitions = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        self.admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, partitions)])[group].result(
            timeout=TIMEOUT_S)



@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    with SecuredNode(tmp_path_factory.mktemp("authz-groups")) as node:
        yield node


def commit_body(group: str, offsets: dict[tuple[str, int], int]) -> bytes:
    topics: dict[str, list] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(R.request_entity(
            OFFSET_COMMIT, 8, "OffsetCommitRequestPartition", partition_index=partition, committed_offset=offset,
            committed_leader_epoch=-1, committed_metadata=""))
    return R.request_body(OFFSET_COMMIT, 8, "OffsetCommitRequest", group_id=group, generation_id_or_member_epoch=-1,
                          member_id="", group_instance_id=None, topics=tuple(
                              R.request_entity(OFFSET_COMMIT, 8, "OffsetCommitRequestTopic", name=name,
                                               partitions=tuple(parts)) for name, parts in topics.items()))


def offset_fetch(conn: R.RawConnection, group: str, topics: dict[str, list[int]] | None) -> object:
    wanted = None if topics is None else tuple(
        R.request_entity(OFFSET_FETCH, 6, "OffsetFetchRequestTopic", name=name, partition_indexes=tuple(parts))
        for name, parts in topics.items())
    return conn.call(OFFSET_FETCH, 6, R.request_body(OFFSET_FETCH, 6, "OffsetFetchRequest", group_id=group,
                                                     topics=wanted))


def describe_groups(conn: R.RawConnection, *groups: str) -> dict[str, object]:
    response = conn.call(DESCRIBE_GROUPS, 5, R.request_body(DESCRIBE_GROUPS, 5, "DescribeGroupsRequest",
                                                           groups=groups, include_authorized_operations=True))
    return {g.group_id: g for g in response.groups}


def membership_errors(conn: R.RawConnection, group: str) -> list[int]:
    """The errors of a JoinGroup, SyncGroup, Heartbeat and LeaveGroup of `group`."""
    seconds = datetime.timedelta(seconds=10)
    joined = conn.call(JOIN_GROUP, 5, R.request_body(
        JOIN_GROUP, 5, "JoinGroupRequest", group_id=group, session_timeout=seconds, rebalance_timeout=seconds,
        member_id="", group_instance_id=None, protocol_type="consumer", protocols=(R.request_entity(
            JOIN_GROUP, 5, "JoinGroupRequestProtocol", name="range", metadata=b""),)))
    synced = conn.call(SYNC_GROUP, 3, R.request_body(SYNC_GROUP, 3, "SyncGroupRequest", group_id=group,
                                                     generation_id=1, member_id="m", group_instance_id=None,
                                                     assignments=()))
    beat = conn.call(HEARTBEAT, 3, R.request_body(HEARTBEAT, 3, "HeartbeatRequest", group_id=group, generation_id=1,
                                                  member_id="m", group_instance_id=None))
    left = conn.call(LEAVE_GROUP, 3, R.request_body(LEAVE_GROUP, 3, "LeaveGroupRequest", group_id=group, members=(
        R.request_entity(LEAVE_GROUP, 3, "MemberIdentity", member_id="m", group_instance_id=None),)))
    return [joined.error_code, synced.error_code, beat.error_code, left.error_code]


def offset_delete_body(group: str, *topics: str) -> bytes:
    """OffsetDelete of partition 0 of each topic."""
    return R.request_body(OFFSET_DELETE, 0, "OffsetDeleteRequest", group_id=group, topics=tuple(
        R.request_entity(OFFSET_DELETE, 0, "OffsetDeleteRequestTopic", name=topic, partitions=(R.request_entity(
            OFFSET_DELETE, 0, "OffsetDeleteRequestPartition", partition_index=0),)) for topic in topics))


def error_of(exc: KafkaException) -> int:
    return exc.args[0].code()


def poll_error(consumer: Consumer, timeout_s: float = TIMEOUT_S) -> KafkaError | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is not None:
            return msg.error()
    return None


def consume(consumer: Consumer, count: int, timeout_s: float = TIMEOUT_S) -> list:
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None:
            assert msg.error() is None, msg.error()
            got.append(msg)
    return got


def produce(secured: SecuredNode, topic: str, count: int) -> None:
    producer = Producer(secured.client("admin"))
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i, partition=0)
    assert producer.flush(TIMEOUT_S) == 0


# -- consumer groups ---------------------------------------------------------------------------------


def test_a_consumer_group_needs_read_on_the_group_and_commits_need_read_on_the_topic(secured):
    secured.topic("orders")
    secured.topic("ledger")
    produce(secured, "orders", 5)
    for user in ("alice", "bob"):
        secured.add_acl(f"User:{user}", ResourceType.TOPIC, "orders", AclOperation.READ)
    secured.add_acl("User:alice", ResourceType.TOPIC, "ledger", AclOperation.DESCRIBE)
    secured.add_acl("User:alice", ResourceType.GROUP, "alice-group", AclOperation.READ)

    alice = Consumer(secured.client("alice", **{"group.id": "alice-group", "auto.offset.reset": "earliest",
                                                 "enable.auto.commit": False}))
    try:
        alice.subscribe(["orders"])
        assert [m.value() for m in consume(alice, 5)] == [b"v%d" % i for i in range(5)]
        alice.commit(asynchronous=False)
        assert [tp.offset for tp in alice.committed([TopicPartition("orders", 0)], timeout=TIMEOUT_S)] == [5]
        # Describing ledger is not reading it: the commit's partition is refused, the group's other one kept.
        with pytest.raises(KafkaException) as refused:
            alice.commit(offsets=[TopicPartition("ledger", 0, 1), TopicPartition("orders", 0, 4)],
                         asynchronous=False)
        assert error_of(refused.value) == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert [tp.offset for tp in alice.committed([TopicPartition("orders", 0)], timeout=TIMEOUT_S)] == [4]
    finally:
        alice.close()

    bob = Consumer(secured.client("bob", **{"group.id": "bob-group", "auto.offset.reset": "earliest"}))
    try:
        bob.subscribe(["orders"])
        error = poll_error(bob)
        assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error
    finally:
        bob.close()


def test_a_kip848_consumer_needs_read_on_its_group_and_describe_on_its_topics(secured):
    secured.topic("k848-topic")
    secured.topic("k848-hidden")
    produce(secured, "k848-topic", 2)
    secured.add_acl("User:alice", ResourceType.TOPIC, "k848-topic", AclOperation.READ)
    secured.add_acl("User:alice", ResourceType.GROUP, "k848-", AclOperation.READ, ResourcePatternType.PREFIXED)
    secured.add_acl("User:alice", ResourceType.GROUP, "seen-848", AclOperation.DESCRIBE)

    def member(group: str, topics: list[str]) -> Consumer:
        consumer = Consumer(secured.client("alice", **{"group.id": group, "group.protocol": "consumer",
                                                        "auto.offset.reset": "earliest"}))
        consumer.subscribe(topics)
        return consumer

    allowed = member("k848-group", ["k848-topic"])
    try:
        assert [m.value() for m in consume(allowed, 2)] == [b"v0", b"v1"]
    finally:
        allowed.close()
    # DESCRIBE on seen-848 finds its coordinator; the heartbeat needs READ (librdkafka makes its refusal fatal).
    refused = member("seen-848", ["k848-topic"])
    try:
        error = poll_error(refused)
        assert error is not None and error.code() == KafkaError._FATAL, error
        assert "ConsumerGroupHeartbeat fatal error: Broker: Group authorization failed" in error.str()
    finally:
        refused.close()

    # The heartbeat's own answers, raw, for the anonymous principal.
    secured.add_acl("User:ANONYMOUS", ResourceType.GROUP, "anon-848", AclOperation.READ)
    secured.add_acl("User:ANONYMOUS", ResourceType.GROUP, "anon-848-seen", AclOperation.DESCRIBE)
    secured.add_acl("User:ANONYMOUS", ResourceType.TOPIC, "k848-topic", AclOperation.DESCRIBE)
    with R.RawConnection("127.0.0.1", secured.node.port) as conn:
        def heartbeat(group: str, topics: tuple[str, ...]) -> int:
            return conn.call(CONSUMER_GROUP_HEARTBEAT, 0, R.request_body(
                CONSUMER_GROUP_HEARTBEAT, 0, "ConsumerGroupHeartbeatRequest", group_id=group, member_id="m-1",
                member_epoch=0, rebalance_timeout=datetime.timedelta(seconds=30), subscribed_topic_names=topics,
                topic_partitions=())).error_code

        assert heartbeat("anon-848-seen", ("k848-topic",)) == GROUP_DENIED
        assert heartbeat("anon-848", ("k848-topic", "k848-hidden")) == TOPIC_DENIED
        assert heartbeat("anon-848", ("k848-topic",)) == NONE

        def described() -> dict[str, tuple[int, int]]:
            response = conn.call(CONSUMER_GROUP_DESCRIBE, 0, R.request_body(
                CONSUMER_GROUP_DESCRIBE, 0, "ConsumerGroupDescribeRequest", group_ids=("anon-848", "k848-group"),
                include_authorized_operations=True))
            return {g.group_id: (g.error_code, g.authorized_operations) for g in response.groups}

        assert described() == {"anon-848": (NONE, (1 << READ) | (1 << DESCRIBE)),
                               "k848-group": (GROUP_DENIED, NOT_REQUESTED)}
        # Its member subscribes to a topic the principal may no longer describe: the group is not shown.
        topic_filter = AclBindingFilter(ResourceType.TOPIC, "k848-topic", ResourcePatternType.LITERAL,
                                        "User:ANONYMOUS", None, AclOperation.ANY, AclPermissionType.ANY)
        for future in secured.admin.delete_acls([topic_filter]).values():
            assert len(future.result(timeout=TIMEOUT_S)) == 1
        assert described()["anon-848"] == (TOPIC_DENIED, NOT_REQUESTED)


def test_a_streams_group_needs_read_on_the_group_describe_on_its_topics_and_create_for_internal_ones(secured):
    from tests.test_streams_groups_protocol import (DESCRIBE as STREAMS_DESCRIBE, MISSING_INTERNAL_TOPICS,
                                                    StreamsMember, word_count)

    secured.topic("ks-in", 2)
    secured.add_acl("User:ANONYMOUS", ResourceType.GROUP, "anon-streams", AclOperation.READ)
    secured.add_acl("User:ANONYMOUS", ResourceType.GROUP, "anon-streams-seen", AclOperation.DESCRIBE)
    secured.add_acl("User:ANONYMOUS", ResourceType.TOPIC, "ks-in", AclOperation.DESCRIBE)
    port = secured.node.port

    def join(group: str, member: str = "m-1") -> object:
        streams_member = StreamsMember(port, group, member, topology=word_count("anon-streams", source="ks-in"))
        try:
            return streams_member.heartbeat()
        finally:
            streams_member.close()

    assert join("anon-streams-seen").error_code == GROUP_DENIED
    assert join("anon-streams").error_code == TOPIC_DENIED  # nothing on its internal topics
    secured.add_acl("User:ANONYMOUS", ResourceType.TOPIC, "anon-streams-", AclOperation.DESCRIBE,
                    ResourcePatternType.PREFIXED)
    refused = join("anon-streams")  # may see them, not create them: they stay missing, no tasks
    assert refused.error_code == NONE and refused.active_tasks == ()
    missing, = [s for s in refused.status if s.status_code == MISSING_INTERNAL_TOPICS]
    assert "Unauthorized to CREATE" in missing.status_detail
    secured.add_acl("User:ANONYMOUS", ResourceType.TOPIC, "anon-streams-", AclOperation.CREATE,
                    ResourcePatternType.PREFIXED)
    created = join("anon-streams", "m-2")  # created now (its tasks come after the initial rebalance delay)
    assert created.error_code == NONE and MISSING_INTERNAL_TOPICS not in [s.status_code for s in created.status]
    with R.RawConnection("127.0.0.1", port) as conn:
        described = conn.call(STREAMS_DESCRIBE, 0, R.request_body(
            STREAMS_DESCRIBE, 0, "StreamsGroupDescribeRequest", group_ids=("anon-streams", "no-acl-streams"),
            include_authorized_operations=True))
    assert {g.group_id: (g.error_code, len(g.members)) for g in described.groups} == {
        "anon-streams": (NONE, 2), "no-acl-streams": (GROUP_DENIED, 0)}


def test_group_configs_need_describe_configs_and_alter_configs_on_the_group(secured):
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient(secured.client("alice"))

    def alter(group: str) -> int:
        entry = ConfigEntry("consumer.heartbeat.interval.ms", "6000", incremental_operation=AlterConfigOpType.SET)
        resource = ConfigResource("group", group, incremental_configs=[entry])
        try:
            admin.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT_S)
            return NONE
        except KafkaException as exc:
            return error_of(exc)

    def describe(group: str) -> int:
        resource = ConfigResource("group", group)
        try:
            admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
            return NONE
        except KafkaException as exc:
            return error_of(exc)

    assert (describe("cfg-group"), alter("cfg-group")) == (GROUP_DENIED, GROUP_DENIED)
    secured.add_acl("User:alice", ResourceType.GROUP, "cfg-", AclOperation.DESCRIBE_CONFIGS,
                    ResourcePatternType.PREFIXED)
    assert (describe("cfg-group"), alter("cfg-group")) == (NONE, GROUP_DENIED)
    secured.add_acl("User:alice", ResourceType.GROUP, "cfg-group", AclOperation.ALTER_CONFIGS)
    assert (describe("cfg-group"), alter("cfg-group")) == (NONE, NONE)
    assert (describe("other"), alter("other")) == (GROUP_DENIED, GROUP_DENIED)


def test_kafka_python_group_member_is_refused_without_read_on_its_group(secured):
    secured.topic("kp-topic")
    produce(secured, "kp-topic", 3)
    secured.add_acl("User:bob", ResourceType.TOPIC, "kp-topic", AclOperation.READ)
    secured.add_acl("User:bob", ResourceType.GROUP, "kp-allowed", AclOperation.READ)
    common = dict(bootstrap_servers=f"127.0.0.1:{secured.sasl_port}", security_protocol="SASL_PLAINTEXT",
                  sasl_mechanism="PLAIN", sasl_plain_username="bob", sasl_plain_password=PASSWORD,
                  auto_offset_reset="earliest", consumer_timeout_ms=int(TIMEOUT_S * 1000))
    allowed = KafkaConsumer("kp-topic", group_id="kp-allowed", **common)
    try:
        got = []
        for record in allowed:
            got.append(record.value)
            if len(got) == 3:
                break
        assert got == [b"v0", b"v1", b"v2"]
        allowed.commit()
    finally:
        allowed.close()
    refused = KafkaConsumer("kp-topic", group_id="kp-refused", **common)
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            refused.poll(timeout_ms=int(TIMEOUT_S * 1000))
    finally:
        refused.close()


def test_group_listing_describing_and_deleting_follow_prefixed_deny_and_wildcard_acls(secured):
    secured.topic("team-topic")
    for group in ("team-a", "team-secret", "other-x"):
        secured.commit_as_admin(group, {("team-topic", 0): 1})
    secured.add_acl("User:*", ResourceType.GROUP, "team-", AclOperation.DESCRIBE, ResourcePatternType.PREFIXED)
    secured.add_acl("User:alice", ResourceType.GROUP, "team-secret", AclOperation.DESCRIBE,
                  permission=AclPermissionType.DENY)
    secured.add_acl("User:alice", ResourceType.GROUP, "team-a", AclOperation.DELETE)

    admins = {user: AdminClient(secured.client(user)) for user in ("alice", "bob")} | {"admin": secured.admin}

    def listed(user: str) -> set[str]:
        result = admins[user].list_consumer_groups().result(timeout=TIMEOUT_S)
        assert result.errors == []
        return {g.group_id for g in result.valid}

    assert {"team-a", "team-secret", "other-x"} <= listed("admin")  # a super user: DESCRIBE on the cluster
    assert {"team-a", "team-secret", "other-x"} & listed("alice") == {"team-a"}  # DENY wins over the prefix
    assert {"team-a", "team-secret", "other-x"} & listed("bob") == {"team-a", "team-secret"}  # User:*

    alice = admins["alice"]
    described = alice.describe_consumer_groups(["team-a", "team-secret"], include_authorized_operations=True)
    assert set(described["team-a"].result(timeout=TIMEOUT_S).authorized_operations) == {
        AclOperation.DESCRIBE, AclOperation.DELETE}
    with pytest.raises(KafkaException) as refused:
        described["team-secret"].result(timeout=TIMEOUT_S)
    assert error_of(refused.value) == KafkaError.GROUP_AUTHORIZATION_FAILED
    admin_view = secured.admin.describe_consumer_groups(["other-x"], include_authorized_operations=True)
    assert set(admin_view["other-x"].result(timeout=TIMEOUT_S).authorized_operations) == {
        AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE, AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS}

    deleted = admins["bob"].delete_consumer_groups(["team-a"])
    with pytest.raises(KafkaException) as refused:
        deleted["team-a"].result(timeout=TIMEOUT_S)
    assert error_of(refused.value) == KafkaError.GROUP_AUTHORIZATION_FAILED
    alice.delete_consumer_groups(["team-a"])["team-a"].result(timeout=TIMEOUT_S)
    assert "team-a" not in listed("admin")


# -- the anonymous principal, raw requests -----------------------------------------------------------------


def test_anonymous_offsets_coordinators_and_acls_taking_effect_on_open_connections_of_every_worker(secured):
    secured.topic("anon-seen")
    secured.topic("anon-hidden")
    secured.commit_as_admin("anon-g", {("anon-seen", 0): 3, ("anon-hidden", 0): 7})
    # Several connections (each new one is dealt to the least loaded worker: both workers hold some), each of
    # which has decided, and cached its decisions, before the ACLs change.
    conns = [R.RawConnection("127.0.0.1", secured.node.port) for _ in range(8)]
    try:
        for conn in conns:
            assert describe_groups(conn, "anon-g")["anon-g"].error_code == GROUP_DENIED
            assert offset_fetch(conn, "anon-g", None).error_code == GROUP_DENIED
        secured.add_acl("User:ANONYMOUS", ResourceType.GROUP, "anon-g", AclOperation.DESCRIBE)
        secured.add_acl("User:ANONYMOUS", ResourceType.TOPIC, "anon-seen", AclOperation.DESCRIBE)
        for conn in conns:
            group = describe_groups(conn, "anon-g")["anon-g"]
            assert group.error_code == NONE and group.authorized_operations == 1 << DESCRIBE
        conn = conns[0]
        every = offset_fetch(conn, "anon-g", None)  # all topics: the one it may not describe is left out
        assert every.error_code == NONE
        assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions]) for t in every.topics] == [
            ("anon-seen", [(0, 3)])]
        named = offset_fetch(conn, "anon-g", {"anon-seen": [0], "anon-hidden": [0]})
        assert {t.name: [(p.committed_offset, p.error_code) for p in t.partitions] for t in named.topics} == {
            "anon-seen": [(3, NONE)], "anon-hidden": [(-1, TOPIC_DENIED)]}
        hidden_only = offset_fetch(conn, "anon-g", {"anon-hidden": [0]})  # nothing asked: never "every topic"
        assert [(t.name, [p.error_code for p in t.partitions]) for t in hidden_only.topics] == [
            ("anon-hidden", [TOPIC_DENIED])]
        # v8, several groups: each decided on its own (a refused one answered here, between those asked).
        batched = conn.call(OFFSET_FETCH, 8, R.request_body(OFFSET_FETCH, 8, "OffsetFetchRequest", groups=tuple(
            R.request_entity(OFFSET_FETCH, 8, "OffsetFetchRequestGroup", group_id=group, topics=None)
            for group in ("other-g", "anon-g", "other-g", "anon-g"))))
        assert [(g.group_id, g.error_code, [(t.name, [p.committed_offset for p in t.partitions]) for t in g.topics])
                for g in batched.groups] == [("other-g", GROUP_DENIED, []), ("anon-g", NONE, [("anon-seen", [3])])] * 2
        # DESCRIBE on the group is not READ: no membership, no commits; and not DELETE: no offset deletion.
        assert membership_errors(conn, "anon-g") == [GROUP_DENIED] * 4
        committed = conn.call(OFFSET_COMMIT, 8, commit_body("anon-g", {("anon-seen", 0): 9}))
        assert [p.error_code for t in committed.topics for p in t.partitions] == [GROUP_DENIED]
        deleted = conn.call(OFFSET_DELETE, 0, offset_delete_body("anon-g", "anon-seen"))
        assert deleted.error_code == GROUP_DENIED and deleted.topics == ()
        # DELETE on a group deletes the offsets of the topics it may READ only.
        secured.commit_as_admin("anon-del", {("anon-seen", 0): 3, ("anon-hidden", 0): 7})
        secured.add_acl("User:ANONYMOUS", ResourceType.GROUP, "anon-del", AclOperation.DELETE)
        secured.add_acl("User:ANONYMOUS", ResourceType.TOPIC, "anon-seen", AclOperation.READ)
        deleted = conn.call(OFFSET_DELETE, 0, offset_delete_body("anon-del", "anon-seen", "anon-hidden"))
        assert deleted.error_code == NONE
        assert {t.name: [p.error_code for p in t.partitions] for t in deleted.topics} == {
            "anon-seen": [NONE], "anon-hidden": [TOPIC_DENIED]}
        left = secured.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("anon-del", [
            TopicPartition("anon-seen", 0), TopicPartition("anon-hidden", 0)])])["anon-del"].result(timeout=TIMEOUT_S)
        assert {tp.topic: tp.offset for tp in left.topic_partitions} == {"anon-seen": -1001, "anon-hidden": 7}
        found = conn.call(FIND_COORDINATOR, 4, R.request_body(FIND_COORDINATOR, 4, "FindCoordinatorRequest",
                                                              key_type=0, coordinator_keys=("anon-g", "other-g")))
        assert {c.key: (c.error_code, c.node_id >= 0) for c in found.coordinators} == {
            "anon-g": (NONE, True), "other-g": (GROUP_DENIED, False)}
        secured.add_acl("User:ANONYMOUS", ResourceType.TRANSACTIONAL_ID, "anon-tx", AclOperation.DESCRIBE)
        found = conn.call(FIND_COORDINATOR, 4, R.request_body(FIND_COORDINATOR, 4, "FindCoordinatorRequest",
                                                              key_type=1, coordinator_keys=("anon-tx", "other-tx")))
        assert {c.key: (c.error_code, c.node_id >= 0) for c in found.coordinators} == {
            "anon-tx": (NONE, True), "other-tx": (TXN_ID_DENIED, False)}
        for key_type, key, error in ((0, "other-g", GROUP_DENIED), (1, "other-tx", TXN_ID_DENIED)):
            old = conn.call(FIND_COORDINATOR, 3, R.request_body(FIND_COORDINATOR, 3, "FindCoordinatorRequest",
                                                                key_type=key_type, key=key))
            assert (old.error_code, old.node_id, old.host, old.port) == (error, -1, "", -1)
    finally:
        for conn in conns:
            conn.close()


# -- transactions ----------------------------------------------------------------------------------------------


def transactional(secured: SecuredNode, user: str, transactional_id: str) -> Producer:
    return Producer(secured.client(user, **{"transactional.id": transactional_id}))


def test_a_transactional_producer_needs_write_on_its_transactional_id(secured):
    secured.topic("tx-topic")
    for user in ("alice", "bob"):
        secured.add_acl(f"User:{user}", ResourceType.TOPIC, "tx-topic", AclOperation.WRITE)
    secured.add_acl("User:alice", ResourceType.TRANSACTIONAL_ID, "alice-", AclOperation.WRITE,
                  ResourcePatternType.PREFIXED)
    secured.add_acl("User:bob", ResourceType.TRANSACTIONAL_ID, "bob-tx", AclOperation.DESCRIBE)

    alice = transactional(secured, "alice", "alice-tx")
    alice.init_transactions(TIMEOUT_S)
    alice.begin_transaction()
    alice.produce("tx-topic", value=b"committed", partition=0)
    alice.commit_transaction(TIMEOUT_S)

    # bob may find bob-tx's coordinator (DESCRIBE) but not use the id (WRITE): InitProducerId refuses it.
    for transactional_id in ("bob-tx", "alice-tx"):
        bob = transactional(secured, "bob", transactional_id)
        with pytest.raises(KafkaException) as refused:
            bob.init_transactions(TIMEOUT_S)
        assert error_of(refused.value) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, transactional_id

    # Transactions are listed and described only where the principal may DESCRIBE their ids (kafka-python's
    # admin client on the plaintext listener: User:ANONYMOUS), and name only the topics it may DESCRIBE.
    secured.add_acl("User:ANONYMOUS", ResourceType.TRANSACTIONAL_ID, "alice-tx", AclOperation.DESCRIBE)
    alice.begin_transaction()
    alice.produce("tx-topic", value=b"open", partition=0)
    assert alice.flush(TIMEOUT_S) == 0
    anonymous = KafkaAdminClient(bootstrap_servers=secured.node.bootstrap, request_timeout_ms=int(TIMEOUT_S * 1000))
    try:
        (listings,) = anonymous.list_transactions().values()
        assert [t.transactional_id for t in listings] == ["alice-tx"]
        described = anonymous.describe_transactions(["alice-tx"])["alice-tx"]
        assert list(described.topic_partitions) == []
        secured.add_acl("User:ANONYMOUS", ResourceType.TOPIC, "tx-topic", AclOperation.DESCRIBE)
        described = anonymous.describe_transactions(["alice-tx"])["alice-tx"]
        assert [(tp.topic, tp.partition) for tp in described.topic_partitions] == [("tx-topic", 0)]
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            anonymous.describe_transactions(["bob-tx"])
    finally:
        anonymous.close()
        alice.abort_transaction(TIMEOUT_S)


def test_send_offsets_to_transaction_needs_read_on_the_group(secured):
    secured.topic("txo-topic")
    secured.allow_alice((ResourceType.TOPIC, "txo-topic", AclOperation.WRITE),
                        (ResourceType.TOPIC, "txo-topic", AclOperation.READ),
                        (ResourceType.TRANSACTIONAL_ID, "alice-txo", AclOperation.WRITE))
    producer = transactional(secured, "alice", "alice-txo")
    producer.init_transactions(TIMEOUT_S)
    consumer = Consumer(secured.client("alice", **{"group.id": "txo-group"}))
    offsets = [TopicPartition("txo-topic", 0, 1)]
    try:
        producer.begin_transaction()
        producer.produce("txo-topic", value=b"one", partition=0)
        with pytest.raises(KafkaException) as refused:
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), TIMEOUT_S)
        assert error_of(refused.value) == KafkaError.GROUP_AUTHORIZATION_FAILED
        producer.abort_transaction(TIMEOUT_S)

        # The ACL is created on the admin's connection; the producer's open connection uses it at once.
        secured.add_acl("User:alice", ResourceType.GROUP, "txo-group", AclOperation.READ)
        producer.begin_transaction()
        producer.produce("txo-topic", value=b"two", partition=0)
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), TIMEOUT_S)
        producer.commit_transaction(TIMEOUT_S)
        committed = consumer.committed([TopicPartition("txo-topic", 0)], timeout=TIMEOUT_S)
        assert [tp.offset for tp in committed] == [1]
    finally:
        consumer.close()


def test_a_transaction_needs_write_on_its_topics_read_on_committed_ones_and_write_on_its_id_to_end(secured):
    secured.topic("txp-writable")
    secured.topic("txp-readonly")
    secured.allow_alice((ResourceType.TOPIC, "txp-writable", AclOperation.WRITE),
                        (ResourceType.TOPIC, "txp-readonly", AclOperation.DESCRIBE),
                        (ResourceType.GROUP, "txp-group", AclOperation.READ),
                        (ResourceType.TRANSACTIONAL_ID, "txp-id", AclOperation.WRITE))
    producer = transactional(secured, "alice", "txp-id")
    producer.init_transactions(TIMEOUT_S)
    consumer = Consumer(secured.client("alice", **{"group.id": "txp-group"}))
    try:
        producer.begin_transaction()  # AddPartitionsToTxn: WRITE on the topic
        producer.produce("txp-writable", value=b"first", partition=0)
        assert producer.flush(TIMEOUT_S) == 0  # the transaction is open: its abort is a real one
        producer.produce("txp-readonly", value=b"no", partition=0)
        with pytest.raises(KafkaException) as refused:
            producer.commit_transaction(TIMEOUT_S)
        assert error_of(refused.value) == KafkaError.TOPIC_AUTHORIZATION_FAILED
        producer.abort_transaction(TIMEOUT_S)

        producer.begin_transaction()  # TxnOffsetCommit: READ on the topic
        producer.produce("txp-writable", value=b"yes", partition=0)
        with pytest.raises(KafkaException) as refused:
            producer.send_offsets_to_transaction([TopicPartition("txp-readonly", 0, 1)],
                                                 consumer.consumer_group_metadata(), TIMEOUT_S)
        assert error_of(refused.value) == KafkaError.TOPIC_AUTHORIZATION_FAILED
        producer.abort_transaction(TIMEOUT_S)

        producer.begin_transaction()  # EndTxn: WRITE on the id, taken away mid-transaction
        producer.produce("txp-writable", value=b"late", partition=0)
        assert producer.flush(TIMEOUT_S) == 0
        id_filter = AclBindingFilter(ResourceType.TRANSACTIONAL_ID, "txp-id", ResourcePatternType.LITERAL,
                                     None, None, AclOperation.ANY, AclPermissionType.ANY)
        for future in secured.admin.delete_acls([id_filter]).values():
            assert len(future.result(timeout=TIMEOUT_S)) == 1
        with pytest.raises(KafkaException) as refused:
            producer.commit_transaction(TIMEOUT_S)
        assert error_of(refused.value) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    finally:
        consumer.close()


# -- allow_everyone_if_no_acl_found --------------------------------------------------------------------------


def test_resources_without_acls_are_open_when_allow_everyone_if_no_acl_found(tmp_path):
    secured = SecuredNode(tmp_path, workers=1, allow_if_no_acl=True)
    try:
        # A group without ACLs is open to all; one ACL on "guarded" closes it to all but bob.
        secured.add_acl("User:bob", ResourceType.GROUP, "guarded", AclOperation.READ)
        with R.RawConnection("127.0.0.1", secured.node.port) as conn:
            groups = describe_groups(conn, "open", "guarded")
            assert (groups["open"].error_code, groups["guarded"].error_code) == (NONE, GROUP_DENIED)
            assert groups["open"].authorized_operations == ((1 << READ) | (1 << DESCRIBE) | (1 << DELETE)
                                                            | (1 << DESCRIBE_CONFIGS) | (1 << ALTER_CONFIGS))
    finally:
        secured.stop()
