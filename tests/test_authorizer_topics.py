"""The authorizer on the topic, cluster and transactional-id APIs, against real nodes: a SASL_PLAINTEXT listener with
users (admin a super user, alice, bob), ACLs created through the Kafka API by the super user, and real clients
(confluent-kafka, kafka-python) and a raw client for the exact error codes and response shapes Kafka's broker
gives. One node serves most tests (each test uses topics of its own prefix); the no-ACL default has its own."""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import struct
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   NewTopic, ResourcePatternType, ResourceType)
from kio.static.primitive import i8, i32, i64

from scripts.harness import rawkafka as R
from scripts.harness.nodeproc import NodeProcess, free_port
from tests.test_fetch_sessions import request as session_fetch
from tests.test_security_sasl import PASSWORD, add_user
from tests.test_security_tls import listener
from tests.test_stats_cli import stats_json
from tests.waiting import wait_for
from shmbroker.workers.codecs import errors as E

pytestmark = pytest.mark.node

TIMEOUT_S = 15.0
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
PRODUCE, FETCH, LIST_OFFSETS, METADATA, INIT_PRODUCER_ID = 0, 1, 2, 3, 22
CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, CREATE_PARTITIONS = 19, 20, 21, 37
DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
DESCRIBE_CLUSTER, DESCRIBE_PRODUCERS = 60, 61
TOPIC_CONFIG, BROKER_CONFIG = 2, 4  # DescribeConfigs' resource types
TOPIC_DENIED, CLUSTER_DENIED, TXN_DENIED = (int(E.TOPIC_AUTHORIZATION_FAILED), int(E.CLUSTER_AUTHORIZATION_FAILED),
                                            int(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
# KIP-430's bits (1 << AclOperation code)
(MAY_READ, MAY_WRITE, MAY_CREATE, MAY_DELETE, MAY_ALTER, MAY_DESCRIBE, MAY_CLUSTER_ACTION, MAY_DESCRIBE_CONFIGS,
 MAY_ALTER_CONFIGS, MAY_IDEMPOTENT_WRITE) = (1 << code for code in range(3, 13))
ALL_TOPIC_OPERATIONS = (MAY_READ | MAY_WRITE | MAY_CREATE | MAY_DELETE | MAY_ALTER | MAY_DESCRIBE
                        | MAY_DESCRIBE_CONFIGS | MAY_ALTER_CONFIGS)


class SecuredNode:
    """A node with the authorizer on: PLAINTEXT (anonymous) and SASL_PLAINTEXT (PLAIN logins) listeners."""

    def __init__(self, work_dir, workers: int = 2, authorizer: str = 'super_users = ["User:admin"]\n') -> None:
        self.sasl_port = free_port()
        data_dir = work_dir / "data"
        for user in ("admin", "alice", "bob"):
            add_user(data_dir, user, "PLAIN")
        config = (listener("SASL", self.sasl_port, "SASL_PLAINTEXT") + "[stats]\npublish_interval_ms = 100\n"
                  + "[authorizer]\nenabled = true\n" + authorizer)
        self.node = NodeProcess(work_dir, workers=workers, config=config, data_dir=data_dir).start()
        self._admin: AdminClient | None = None

    def __enter__(self) -> "SecuredNode":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        # Clients are gone before the node (no reconnection attempts to a stopped node, no client left for a later
        # test's forked child to destroy): pytest.raises keeps a test's frames, and their clients, in cycles.
        self._admin = None
        gc.collect()
        self.node.stop()
        assert self.node.leftovers() == []
        assert "Traceback" not in self.node.log(), self.node.log()

    def client(self, user: str, **more) -> dict:
        return {"bootstrap.servers": f"127.0.0.1:{self.sasl_port}", "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": PASSWORD, **more}

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.client("admin"))
        return self._admin

    def grant(self, *bindings: AclBinding) -> None:
        self.grant_as(self.admin, *bindings)

    @staticmethod
    def grant_as(admin: AdminClient, *bindings: AclBinding) -> None:
        for future in admin.create_acls(list(bindings)).values():
            future.result(timeout=TIMEOUT_S)

    def anonymous_admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.node.bootstrap})

    def revoke(self, *bindings: AclBinding) -> None:
        filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                                    b.permission_type) for b in bindings]
        for future in self.admin.delete_acls(filters).values():
            future.result(timeout=TIMEOUT_S)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        self.admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(
            timeout=TIMEOUT_S)

    def login(self, user: str) -> R.RawConnection:
        """A raw connection logged in as `user`."""
        conn = R.RawConnection("127.0.0.1", self.sasl_port)
        assert conn.call(SASL_HANDSHAKE, 1, R.request_body(SASL_HANDSHAKE, 1, "SaslHandshakeRequest",
                                                           mechanism="PLAIN")).error_code == 0
        assert conn.call(SASL_AUTHENTICATE, 2, R.request_body(
            SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=f"\0{user}\0{PASSWORD}".encode())
        ).error_code == 0
        return conn

    def anonymous(self) -> R.RawConnection:
        return R.RawConnection("127.0.0.1", self.node.port)

    def produce(self, user: str, topic: str, count: int = 5, **more) -> list:
        """Produce `count` records as `user`: the delivery errors (KafkaError codes), one per record."""
        errors: list[Any] = []
        producer = Producer(self.client(user, **more))
        for i in range(count):
            producer.produce(topic, value=f"{user}-{i}".encode(),
                             on_delivery=lambda err, msg: errors.append(err.code() if err else None))
        assert producer.flush(TIMEOUT_S) == 0
        return errors


def acl(resource_type: ResourceType, name: str, principal: str, operation: AclOperation,
        permission: AclPermissionType = AclPermissionType.ALLOW,
        pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, "*", operation, permission)


def topic_acl(name: str, principal: str, operation: AclOperation, **more) -> AclBinding:
    return acl(ResourceType.TOPIC, name, principal, operation, **more)


CLUSTER = "kafka-cluster"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    with SecuredNode(tmp_path_factory.mktemp("authz")) as node:
        yield node


# -- raw requests ------------------------------------------------------------------------------------------------

def metadata(conn: R.RawConnection, topics: list[str] | None, version: int = 12, create: bool = False,
             operations: bool = False) -> Any:
    body = R.request_body(METADATA, version, "MetadataRequest", topics=None if topics is None else tuple(
        R.request_entity(METADATA, version, "MetadataRequestTopic", name=t, topic_id=None) for t in topics),
        allow_auto_topic_creation=create, include_topic_authorized_operations=operations,
        include_cluster_authorized_operations=operations)
    return conn.call(METADATA, version, body)


def metadata_errors(conn: R.RawConnection, topics: list[str] | None, **more) -> dict[str, int]:
    return {t.name: int(t.error_code) for t in metadata(conn, topics, **more).topics}


def produce_errors(conn: R.RawConnection, topic: str, transactional_id: str | None = None) -> list[int]:
    body = R.produce_body({topic: {0: R.make_batch(1, 10)}}, version=8)
    if transactional_id is not None:  # the v3-8 body starts with the (here null) transactional id
        name = transactional_id.encode()
        body = struct.pack(">h", len(name)) + name + body[2:]
    answer = conn.call(PRODUCE, 8, body)
    return [int(p.error_code) for t in answer.responses for p in t.partition_responses]


def fetch_errors(conn: R.RawConnection, topic: str, version: int = 11, topic_ids=None) -> list[int]:
    body = R.fetch_body({topic: {0: 0}}, max_wait_ms=0, version=version, topic_ids=topic_ids)
    names = {topic_ids[topic].bytes: topic} if topic_ids else None
    return [p.error_code for p in R.parse_fetch_response(version, conn.request(FETCH, version, body), names).partitions]


def follower_fetch_errors(conn: R.RawConnection, topic: str) -> list[int]:
    follower = dataclasses.replace(session_fetch({(topic, 0): 0}), replica_id=i32(1))
    return [p.error_code for p in R.parse_fetch_response(12, conn.request(FETCH, 12, R.encode_body(follower))).partitions]


def list_offsets_errors(conn: R.RawConnection, topic: str) -> list[int]:
    answer = conn.call(LIST_OFFSETS, 5, R.list_offsets_body({topic: [0]}))
    return [int(p.error_code) for t in answer.topics for p in t.partitions]


def describe_producers_errors(conn: R.RawConnection, topic: str) -> list[int]:
    body = R.request_body(DESCRIBE_PRODUCERS, 0, "DescribeProducersRequest", topics=(
        R.request_entity(DESCRIBE_PRODUCERS, 0, "TopicRequest", name=topic, partition_indexes=(i32(0),)),))
    return [int(p.error_code) for t in conn.call(DESCRIBE_PRODUCERS, 0, body).topics for p in t.partitions]


def create_topic_error(conn: R.RawConnection, topic: str) -> Any:
    answer = conn.call(CREATE_TOPICS, 7, R.request_body(CREATE_TOPICS, 7, "CreateTopicsRequest", topics=(
        R.request_entity(CREATE_TOPICS, 7, "CreatableTopic", name=topic, num_partitions=i32(1),
                         replication_factor=-1, assignments=(), configs=()),), timeout=R.millis(10_000),
        validate_only=False))
    return answer.topics[0]


def delete_topic_errors(conn: R.RawConnection, names=(), ids=()) -> list[tuple[str | None, int]]:
    states = tuple(R.request_entity(DELETE_TOPICS, 6, "DeleteTopicState", name=n, topic_id=None) for n in names) + \
        tuple(R.request_entity(DELETE_TOPICS, 6, "DeleteTopicState", name=None, topic_id=i) for i in ids)
    answer = conn.call(DELETE_TOPICS, 6, R.request_body(DELETE_TOPICS, 6, "DeleteTopicsRequest", topics=states,
                                                        timeout=R.millis(10_000)))
    return [(r.name, int(r.error_code)) for r in answer.responses]


def create_partitions_error(conn: R.RawConnection, topic: str, count: int) -> int:
    answer = conn.call(CREATE_PARTITIONS, 3, R.request_body(CREATE_PARTITIONS, 3, "CreatePartitionsRequest", topics=(
        R.request_entity(CREATE_PARTITIONS, 3, "CreatePartitionsTopic", name=topic, count=i32(count),
                         assignments=None),), timeout=R.millis(10_000), validate_only=False))
    return int(answer.results[0].error_code)


def delete_records_errors(conn: R.RawConnection, topic: str) -> list[int]:
    answer = conn.call(DELETE_RECORDS, 2, R.request_body(DELETE_RECORDS, 2, "DeleteRecordsRequest", topics=(
        R.request_entity(DELETE_RECORDS, 2, "DeleteRecordsTopic", name=topic, partitions=(
            R.request_entity(DELETE_RECORDS, 2, "DeleteRecordsPartition", partition_index=i32(0), offset=i64(0)),)),),
        timeout=R.millis(10_000)))
    return [int(p.error_code) for t in answer.topics for p in t.partitions]


def describe_configs_errors(conn: R.RawConnection, *resources: tuple[int, str]) -> list[tuple[int, int]]:
    asked = tuple(R.request_entity(DESCRIBE_CONFIGS, 4, "DescribeConfigsResource", resource_type=i8(kind),
                                   resource_name=name, configuration_keys=None) for kind, name in resources)
    answer = conn.call(DESCRIBE_CONFIGS, 4, R.request_body(DESCRIBE_CONFIGS, 4, "DescribeConfigsRequest",
                                                           resources=asked, include_synonyms=False,
                                                           include_documentation=False))
    return [(int(r.error_code), len(r.configs)) for r in answer.results]


def alter_configs_errors(conn: R.RawConnection, *resources: tuple[int, str], incremental: bool = False) -> list[int]:
    api, version, request = ((INCREMENTAL_ALTER_CONFIGS, 1, "IncrementalAlterConfigsRequest") if incremental
                             else (ALTER_CONFIGS, 2, "AlterConfigsRequest"))
    more = {"config_operation": i8(0)} if incremental else {}
    config = {TOPIC_CONFIG: "retention.ms", BROKER_CONFIG: "log.retention.ms"}
    answer = conn.call(api, version, R.request_body(api, version, request, resources=tuple(
        R.request_entity(api, version, "AlterConfigsResource", resource_type=i8(kind), resource_name=name, configs=(
            R.request_entity(api, version, "AlterableConfig", name=config[kind], value="86400000", **more),))
        for kind, name in resources), validate_only=True))
    return [int(r.error_code) for r in answer.responses]


def init_producer_id_error(conn: R.RawConnection) -> int:
    return int(conn.call(INIT_PRODUCER_ID, 2, R.request_body(INIT_PRODUCER_ID, 2, "InitProducerIdRequest",
                                                             transactional_id=None,
                                                             transaction_timeout=R.millis(60_000))).error_code)


def cluster_operations(conn: R.RawConnection) -> int:
    answer = conn.call(DESCRIBE_CLUSTER, 1, R.request_body(DESCRIBE_CLUSTER, 1, "DescribeClusterRequest",
                                                           include_cluster_authorized_operations=True,
                                                           endpoint_type=i8(1)))
    assert answer.error_code == 0
    return int(answer.cluster_authorized_operations)


# -- tests --------------------------------------------------------------------------------------------------------

def test_without_acls_only_the_super_user_may_do_anything(secured):
    secured.create_topic("closed.t")
    assert secured.produce("admin", "closed.t") == [None] * 5
    with secured.login("bob") as bob, secured.anonymous() as anonymous:
        for conn in (bob, anonymous):
            assert metadata_errors(conn, ["closed.t"]) == {"closed.t": TOPIC_DENIED}
            assert "closed.t" not in metadata_errors(conn, None)  # a listing leaves it out, unsaid
            assert produce_errors(conn, "closed.t") == [TOPIC_DENIED]
            assert fetch_errors(conn, "closed.t") == [TOPIC_DENIED]
            assert list_offsets_errors(conn, "closed.t") == [TOPIC_DENIED]
        # Refused before the topic's existence is looked at: a missing topic answers the same.
        assert metadata_errors(bob, ["closed.missing"], create=True) == {"closed.missing": TOPIC_DENIED}
        assert produce_errors(bob, "closed.missing") == [TOPIC_DENIED]
        assert describe_producers_errors(bob, "closed.t") == [TOPIC_DENIED]
        created = create_topic_error(bob, "closed.bob")
        assert (int(created.error_code), created.topic_id) == (TOPIC_DENIED, None)
        assert delete_topic_errors(bob, names=["closed.t"]) == [("closed.t", TOPIC_DENIED)]
        assert create_partitions_error(bob, "closed.t", 2) == TOPIC_DENIED
        assert delete_records_errors(bob, "closed.t") == [TOPIC_DENIED]
        assert describe_configs_errors(bob, (TOPIC_CONFIG, "closed.t"), (BROKER_CONFIG, "")) == [
            (TOPIC_DENIED, 0), (CLUSTER_DENIED, 0)]
        for incremental in (False, True):
            assert alter_configs_errors(bob, (TOPIC_CONFIG, "closed.t"), (BROKER_CONFIG, ""),
                                        incremental=incremental) == [TOPIC_DENIED, CLUSTER_DENIED]
        assert init_producer_id_error(bob) == CLUSTER_DENIED
        assert cluster_operations(bob) == 0
        assert produce_errors(bob, "closed.t", transactional_id="bob-txn") == [TXN_DENIED]
        answer = metadata(bob, None, version=10, operations=True)
        assert answer.cluster_authorized_operations == 0 and answer.topics == ()
    # Nothing was created, deleted or grown behind the refusals.
    with secured.login("admin") as admin:
        assert metadata_errors(admin, ["closed.missing", "closed.bob"]) == {
            "closed.missing": int(E.UNKNOWN_TOPIC_OR_PARTITION), "closed.bob": int(E.UNKNOWN_TOPIC_OR_PARTITION)}
        assert len(metadata(admin, ["closed.t"]).topics[0].partitions) == 1
        assert init_producer_id_error(admin) == 0
        operations = metadata(admin, ["closed.t"], version=10, operations=True)
        assert operations.topics[0].topic_authorized_operations == ALL_TOPIC_OPERATIONS
        assert operations.cluster_authorized_operations == cluster_operations(admin) == (
            MAY_CREATE | MAY_ALTER | MAY_DESCRIBE | MAY_CLUSTER_ACTION | MAY_DESCRIBE_CONFIGS | MAY_ALTER_CONFIGS
            | MAY_IDEMPOTENT_WRITE)


def test_literal_and_prefixed_acls_grant_each_api_its_operation(secured):
    alice = "User:alice"
    secured.grant(topic_acl("alice.", alice, AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED),
                  topic_acl("alice.", alice, AclOperation.READ, pattern=ResourcePatternType.PREFIXED),
                  topic_acl("alice.", alice, AclOperation.CREATE, pattern=ResourcePatternType.PREFIXED),
                  topic_acl("alice.t", alice, AclOperation.ALTER),
                  topic_acl("alice.t", alice, AclOperation.ALTER_CONFIGS),
                  topic_acl("alice.gone", alice, AclOperation.DELETE),
                  # the consumer below looks its group's coordinator up (FindCoordinator: DESCRIBE on the group)
                  AclBinding(ResourceType.GROUP, "unused", ResourcePatternType.LITERAL, alice, "*", AclOperation.READ,
                             AclPermissionType.ALLOW))
    # confluent-kafka, idempotent: InitProducerId on WRITE to some topic (KIP-679), auto-creation on CREATE.
    assert secured.produce("alice", "alice.t", 20, **{"enable.idempotence": True}) == [None] * 20
    consumer = Consumer(secured.client("alice", **{"group.id": "unused", "enable.auto.commit": False}))
    try:
        consumer.assign([TopicPartition("alice.t", 0, 0)])
        got, deadline = [], time.monotonic() + TIMEOUT_S
        while len(got) < 20 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg.value())
        assert got == [f"alice-{i}".encode() for i in range(20)]
    finally:
        consumer.close()
    assert secured.produce("bob", "alice.t") == [KafkaError.TOPIC_AUTHORIZATION_FAILED] * 5
    secured.create_topic("alice.gone")
    secured.create_topic("other.t")
    with secured.login("alice") as conn:
        assert list_offsets_errors(conn, "alice.t") == [0]  # DESCRIBE, implied by READ and WRITE
        assert describe_producers_errors(conn, "alice.t") == [0]
        listed = metadata_errors(conn, None)
        assert "alice.t" in listed and "alice.gone" in listed and "other.t" not in listed and "closed.t" not in listed
        topic = metadata(conn, ["alice.t"], version=10, operations=True).topics[0]
        assert topic.topic_authorized_operations == (MAY_READ | MAY_WRITE | MAY_CREATE | MAY_DESCRIBE | MAY_ALTER
                                                     | MAY_DESCRIBE_CONFIGS | MAY_ALTER_CONFIGS)
        assert create_partitions_error(conn, "alice.t", 2) == 0  # ALTER
        assert create_partitions_error(conn, "alice.gone", 2) == TOPIC_DENIED
        assert delete_records_errors(conn, "alice.t") == [TOPIC_DENIED]  # DELETE only on alice.gone
        assert delete_records_errors(conn, "alice.gone") == [0]
        # ALTER_CONFIGS implies DESCRIBE_CONFIGS; the broker's need the cluster
        assert describe_configs_errors(conn, (TOPIC_CONFIG, "alice.t"))[0][0] == 0
        assert describe_configs_errors(conn, (TOPIC_CONFIG, "alice.gone"), (BROKER_CONFIG, "")) == [
            (TOPIC_DENIED, 0), (CLUSTER_DENIED, 0)]
        assert alter_configs_errors(conn, (TOPIC_CONFIG, "alice.t"), (TOPIC_CONFIG, "alice.gone"),
                                    incremental=True) == [0, TOPIC_DENIED]
        # CreateTopics v5+: created on CREATE, its configs withheld without DESCRIBE_CONFIGS on it.
        created = create_topic_error(conn, "alice.made")
        assert (int(created.error_code), created.topic_config_error_code, created.configs,
                created.num_partitions) == (0, TOPIC_DENIED, (), 1)
        assert int(create_topic_error(conn, "other.made").error_code) == TOPIC_DENIED
        assert delete_topic_errors(conn, names=["alice.gone", "alice.t"]) == [("alice.gone", 0),
                                                                              ("alice.t", TOPIC_DENIED)]
    with secured.login("admin") as admin:
        assert len(metadata(admin, ["alice.t"]).topics[0].partitions) == 2
        other_id = metadata(admin, ["other.t"]).topics[0].topic_id
    with secured.login("alice") as conn:
        # By topic id: the id is answered, the name withheld.
        assert delete_topic_errors(conn, ids=[other_id]) == [(None, TOPIC_DENIED)]
        answer = conn.call(METADATA, 12, R.request_body(METADATA, 12, "MetadataRequest", topics=(
            R.request_entity(METADATA, 12, "MetadataRequestTopic", name=None, topic_id=other_id),),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        assert [(t.name, t.topic_id, int(t.error_code)) for t in answer.topics] == [(None, other_id, TOPIC_DENIED)]
        # Fetch by topic id (v13+) is checked as by name.
        assert fetch_errors(conn, "alice.t", version=16, topic_ids={"alice.t": metadata(conn, ["alice.t"]).topics[
            0].topic_id}) == [0]
        assert fetch_errors(conn, "other.t", version=16, topic_ids={"other.t": other_id}) == [TOPIC_DENIED]
        # A follower's fetch (replica id >= 0) needs CLUSTER_ACTION on the cluster, whatever its READs.
        assert follower_fetch_errors(conn, "alice.t") == [TOPIC_DENIED]
    with secured.login("admin") as admin:
        assert follower_fetch_errors(admin, "alice.t") == [0]


def test_deny_wins_over_allow_and_the_wildcard_principal_grants_everyone(secured):
    secured.grant(topic_acl("shared.", "User:*", AclOperation.ALL, pattern=ResourcePatternType.PREFIXED),
                  topic_acl("shared.t", "User:bob", AclOperation.WRITE, permission=AclPermissionType.DENY))
    secured.create_topic("shared.t")
    assert secured.produce("alice", "shared.t") == [None] * 5
    assert secured.produce("bob", "shared.t") == [KafkaError.TOPIC_AUTHORIZATION_FAILED] * 5
    with secured.login("bob") as bob:
        assert produce_errors(bob, "shared.u") == [0]  # auto-created: CREATE through ALL, DENY only on shared.t
        assert fetch_errors(bob, "shared.t") == [0]  # READ still allowed
        topic = metadata(bob, ["shared.t"], version=10, operations=True).topics[0]
        assert topic.topic_authorized_operations == ALL_TOPIC_OPERATIONS & ~MAY_WRITE
    with secured.anonymous() as anonymous:  # User:* is every principal, ANONYMOUS too
        assert fetch_errors(anonymous, "shared.t") == [0]


def test_transactional_producers_need_write_on_their_transactional_id(secured):
    secured.grant(topic_acl("txn.", "User:bob", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED))
    secured.create_topic("txn.t")
    with secured.login("bob") as bob:
        assert produce_errors(bob, "txn.t", transactional_id="bob-txn") == [TXN_DENIED]
        assert produce_errors(bob, "txn.t") == [0]
        secured.grant(acl(ResourceType.TRANSACTIONAL_ID, "bob-txn", "User:bob", AclOperation.WRITE))
        assert produce_errors(bob, "txn.t", transactional_id="bob-txn") == [0]
        assert produce_errors(bob, "closed.t", transactional_id="bob-txn") == [TOPIC_DENIED]
        # WRITE implies DESCRIBE, not CREATE: a missing topic is refused its auto-creation, and Produce (which
        # Kafka never lets create) finds no topic.
        assert metadata_errors(bob, ["txn.missing"], create=True) == {"txn.missing": TOPIC_DENIED}
        assert produce_errors(bob, "txn.missing") == [int(E.UNKNOWN_TOPIC_OR_PARTITION)]


def test_a_refused_produce_with_acks_0_closes_the_connection(secured):
    """Kafka closes the connection of an acks=0 Produce that failed (the client has no other way to learn of
    it); the node does the same, with one log line naming the refusal."""
    secured.create_topic("quiet.t")
    bob = secured.login("bob")
    try:
        bob.send(PRODUCE, 8, R.produce_body({"quiet.t": {0: R.build_record_batch([b"x"])}}, acks=0),
                 expect_response=False)
        bob.sock.settimeout(TIMEOUT_S)
        assert bob.sock.recv(1) == b""
    finally:
        bob.close()
    assert "Produce with acks=0 failed (quiet.t-0: TOPIC_AUTHORIZATION_FAILED)" in secured.node.log()
    secured.grant(topic_acl("quiet.t", "User:bob", AclOperation.WRITE))
    with secured.login("bob") as bob:
        bob.send(PRODUCE, 8, R.produce_body({"quiet.t": {0: R.build_record_batch([b"x"])}}, acks=0),
                 expect_response=False)
        assert list_offsets_errors(bob, "quiet.t") == [0]  # still open (WRITE implies DESCRIBE)
    with secured.login("admin") as admin:
        assert admin.call(LIST_OFFSETS, 5, R.list_offsets_body({"quiet.t": [0]})).topics[0].partitions[0].offset == 1


def test_an_acl_change_holds_at_once_for_every_connection_on_every_worker(secured):
    secured.create_topic("late.t")
    binding = topic_acl("late.t", "User:bob", AclOperation.DESCRIBE)
    connections = [secured.login("bob") for _ in range(4)]  # new connections go to the emptier worker: both serve
    try:
        for conn in connections:  # each caches the refusal
            assert metadata_errors(conn, ["late.t"]) == {"late.t": TOPIC_DENIED}
        wait_for(lambda: all(worker.get("connections", 0) >= 1 for worker in stats_json(secured.node)["processes"]
                             if worker["role"] == "worker"), 5, "connections on both workers")
        secured.grant(binding)
        for conn in connections:
            assert metadata_errors(conn, ["late.t"]) == {"late.t": 0}
            assert list_offsets_errors(conn, "late.t") == [0]
            assert fetch_errors(conn, "late.t") == [TOPIC_DENIED]  # DESCRIBE does not imply READ
        secured.revoke(binding)
        for conn in connections:
            assert metadata_errors(conn, ["late.t"]) == {"late.t": TOPIC_DENIED}
    finally:
        for conn in connections:
            conn.close()


def test_a_kafka_python_consumer_in_a_fetch_session_loses_a_revoked_topic(secured):
    from kafka import KafkaConsumer
    from kafka.errors import TopicAuthorizationFailedError
    read = topic_acl("session.t", "User:alice", AclOperation.READ)
    secured.grant(read)
    secured.create_topic("session.t")
    assert secured.produce("admin", "session.t", 10) == [None] * 10
    consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{secured.sasl_port}", security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="PLAIN", sasl_plain_username="alice", sasl_plain_password=PASSWORD,
                             auto_offset_reset="earliest", enable_auto_commit=False, group_id=None,
                             consumer_timeout_ms=int(TIMEOUT_S * 1000))
    try:
        from kafka import TopicPartition as KafkaTopicPartition
        consumer.assign([KafkaTopicPartition("session.t", 0)])
        consumer.seek(KafkaTopicPartition("session.t", 0), 0)
        got = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < 10 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(r.value for r in records)
        assert got == [f"admin-{i}".encode() for i in range(10)]
        secured.revoke(read)
        with pytest.raises(TopicAuthorizationFailedError):
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=500)
    finally:
        consumer.close()


def test_a_raw_fetch_session_follows_acl_changes(secured):
    read = topic_acl("sess.t", "User:alice", AclOperation.READ)
    secured.grant(read)
    secured.create_topic("sess.t")
    with secured.login("alice") as conn:
        opened = R.parse_fetch_response(12, conn.request(FETCH, 12, R.encode_body(session_fetch({("sess.t", 0): 0},
                                                                                                0, 0))))
        assert opened.session_id != 0 and [p.error_code for p in opened.partitions] == [0]
        secured.revoke(read)
        following = R.parse_fetch_response(12, conn.request(FETCH, 12, R.encode_body(
            session_fetch({}, opened.session_id, 1))))
        assert following.error_code == 0 and [(p.topic, p.error_code) for p in following.partitions] == [
            ("sess.t", TOPIC_DENIED)]


def test_with_allow_everyone_if_no_acl_found_only_resources_with_acls_are_closed(tmp_path):
    node = SecuredNode(tmp_path, workers=1, authorizer="allow_everyone_if_no_acl_found = true\n")
    try:
        with node.anonymous() as anonymous:
            assert produce_errors(anonymous, "open.t") == [0]  # no ACL: created and written by anyone
            # No ACL on the cluster either: anyone may create ACLs.
            node.grant_as(node.anonymous_admin(), topic_acl("guarded.", "User:alice", AclOperation.READ,
                                                            pattern=ResourcePatternType.PREFIXED))
            assert produce_errors(anonymous, "guarded.t") == [TOPIC_DENIED]
            assert produce_errors(anonymous, "open.u") == [0]
            assert init_producer_id_error(anonymous) == 0
            assert metadata_errors(anonymous, ["guarded.t"], create=True) == {"guarded.t": TOPIC_DENIED}
        with node.login("alice") as alice:  # CREATE on the cluster, which has no ACL: created
            assert metadata_errors(alice, ["guarded.t"], create=True) == {"guarded.t": 0}
            assert fetch_errors(alice, "guarded.t") == [0]
            assert produce_errors(alice, "guarded.t") == [TOPIC_DENIED]  # READ only
            all_cluster_operations = cluster_operations(alice)
            assert all_cluster_operations & MAY_IDEMPOTENT_WRITE and all_cluster_operations & MAY_DESCRIBE
            node.grant_as(node.anonymous_admin(), acl(ResourceType.BROKER, CLUSTER, "User:alice",
                                                      AclOperation.IDEMPOTENT_WRITE))
            assert cluster_operations(alice) == 0  # the cluster has an ACL now, and none lets alice DESCRIBE it
            assert init_producer_id_error(alice) == 0
        with node.anonymous() as anonymous:
            assert init_producer_id_error(anonymous) == CLUSTER_DENIED
    finally:
        node.stop()


def test_sighup_turns_the_authorizer_off_and_on_and_changes_its_super_users(tmp_path):
    """`[authorizer]` is reloaded on SIGHUP: open connections follow at their next request."""
    node = SecuredNode(tmp_path, workers=2)
    try:
        node.create_topic("hup.t")
        bob, alice = node.login("bob"), node.login("alice")
        try:
            assert produce_errors(bob, "hup.t") == [TOPIC_DENIED]

            def reload(config: str) -> None:
                node.node.config_path.write_text(config)
                os.kill(node.node.proc.pid, signal.SIGHUP)

            enabled = node.node.config_path.read_text()
            reload(enabled.replace("enabled = true", "enabled = false"))
            wait_for(lambda: produce_errors(bob, "hup.t") == [0] or None, TIMEOUT_S, "the authorizer off")
            reload(enabled.replace('super_users = ["User:admin"]', 'super_users = ["User:admin", "User:bob"]'))
            wait_for(lambda: produce_errors(alice, "hup.t") == [TOPIC_DENIED] or None, TIMEOUT_S,
                     "the authorizer on again")
            assert produce_errors(bob, "hup.t") == [0]  # a super user now
            assert "take effect at the next restart" not in node.node.log()
        finally:
            bob.close()
            alice.close()
    finally:
        node.stop()
