"""The admin APIs that exist only in flexible versions, against a real node, through real clients:
DescribeCluster (confluent-kafka, kafka-python), ListGroups v4-5's state and type filters (confluent-kafka's
list_consumer_groups, kafka-python's list_groups), DescribeProducers, ListTransactions and DescribeTransactions
(kafka-python's admin: confluent-kafka 2.16 has no call for them)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupType, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaPythonPartition
from kafka.errors import TransactionalIdNotFoundError

from tests import waiting

TIMEOUT_S = 20
CONFIG = "[groups]\ninitial_rebalance_delay_ms = 0\n"


@pytest.fixture
def node(node_factory):
    return node_factory(workers=2, config=CONFIG)


def create(bootstrap: str, *topics: str, partitions: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
        future.result(timeout=TIMEOUT_S)


def kafka_python_admin(bootstrap: str) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_S * 1000)


def test_describe_cluster(node) -> None:
    client = AdminClient({"bootstrap.servers": node.bootstrap})
    described = client.describe_cluster(include_authorized_operations=True).result(timeout=TIMEOUT_S)
    assert [(n.id, n.host, n.port) for n in described.nodes] == [(0, "127.0.0.1", node.port)]
    assert described.controller.id == 0 and described.cluster_id
    assert described.authorized_operations  # asked for: the node allows every operation
    admin = kafka_python_admin(node.bootstrap)
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    assert cluster["cluster_id"] == described.cluster_id
    assert [(b["broker_id"], b["host"], b["port"]) for b in cluster["brokers"]] == [(0, "127.0.0.1", node.port)]


def test_list_groups_by_state_and_type(node) -> None:
    create(node.bootstrap, "listed")
    stable = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "stable-group", "session.timeout.ms": 6000})
    try:
        stable.subscribe(["listed"])
        waiting.wait_for(lambda: stable.poll(0.2) is None and stable.assignment(), TIMEOUT_S, "an assignment")
        empty = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "empty-group", "enable.auto.commit": False})
        empty.subscribe(["listed"])
        waiting.wait_for(lambda: empty.poll(0.2) is None and empty.assignment(), TIMEOUT_S, "an assignment")
        empty.close()  # leaves: the group is Empty
        admin = AdminClient({"bootstrap.servers": node.bootstrap})

        def listed(**filters) -> set[tuple[str, str]]:
            result = admin.list_consumer_groups(request_timeout=TIMEOUT_S, **filters).result(timeout=TIMEOUT_S)
            assert not result.errors
            return {(g.group_id, g.state.name) for g in result.valid}

        assert listed() >= {("stable-group", "STABLE"), ("empty-group", "EMPTY")}
        assert listed(states={ConsumerGroupState.STABLE}) == {("stable-group", "STABLE")}
        assert listed(states={ConsumerGroupState.EMPTY}) == {("empty-group", "EMPTY")}
        assert listed(states={ConsumerGroupState.DEAD}) == set()
        assert listed(types={ConsumerGroupType.CLASSIC}) >= {("stable-group", "STABLE"), ("empty-group", "EMPTY")}
        assert listed(types={ConsumerGroupType.CONSUMER}) == set()
        kp = kafka_python_admin(node.bootstrap)
        try:
            groups = kp.list_groups(states_filter=["stable"])  # case-insensitive, as Kafka compares
        finally:
            kp.close()
        assert [(g["group_id"], g["group_state"], g["group_type"]) for g in groups] == [
            ("stable-group", "Stable", "classic")]
    finally:
        stable.close()


def test_describe_producers(node) -> None:
    create(node.bootstrap, "produced")
    idempotent = Producer({"bootstrap.servers": node.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for i in range(5):
        idempotent.produce("produced", value=b"%d" % i, partition=0)
    assert idempotent.flush(TIMEOUT_S) == 0
    transactional = Producer({"bootstrap.servers": node.bootstrap, "transactional.id": "describe-producers"})
    transactional.init_transactions(TIMEOUT_S)
    transactional.begin_transaction()
    transactional.produce("produced", value=b"open", partition=0)
    assert transactional.flush(TIMEOUT_S) == 0
    admin = kafka_python_admin(node.bootstrap)
    try:
        states = admin.describe_producers([KafkaPythonPartition("produced", 0), KafkaPythonPartition("produced", 1)])
    finally:
        admin.close()
        transactional.abort_transaction(TIMEOUT_S)
    by_partition = {tp.partition: state for tp, state in states.items()}
    assert by_partition[1].active_producers == []
    producers = {p.producer_id: p for p in by_partition[0].active_producers}
    assert len(producers) == 2
    open_ones = [p for p in producers.values() if p.current_transaction_start_offset != -1]
    assert [(p.last_sequence, p.current_transaction_start_offset) for p in open_ones] == [(0, 5)]
    (plain,) = [p for p in producers.values() if p.current_transaction_start_offset == -1]
    assert plain.last_sequence == 4 and plain.last_timestamp > 0


INVALID_REGULAR_EXPRESSION = 128


def patterned(node, pattern: str) -> tuple[int, set[str]]:
    """ListTransactions v2 with a transactional id pattern (KIP-1152): (error code, listed ids)."""
    from scripts.harness import rawkafka as R

    body = R.request_body(66, 2, "ListTransactionsRequest", state_filters=(), producer_id_filters=(),
                          duration_filter=-1, transactional_id_pattern=pattern)
    with R.RawConnection("127.0.0.1", node.port) as conn:
        answer = conn.call(66, 2, body)
    return int(answer.error_code), {t.transactional_id for t in answer.transaction_states}


def test_list_and_describe_transactions(node) -> None:
    create(node.bootstrap, "txn-a", "txn-b")
    ongoing = Producer({"bootstrap.servers": node.bootstrap, "transactional.id": "ongoing-one"})
    ongoing.init_transactions(TIMEOUT_S)
    ongoing.begin_transaction()
    ongoing.produce("txn-a", value=b"x", partition=1)
    ongoing.produce("txn-b", value=b"y", partition=0)
    assert ongoing.flush(TIMEOUT_S) == 0
    finished = Producer({"bootstrap.servers": node.bootstrap, "transactional.id": "finished-one"})
    finished.init_transactions(TIMEOUT_S)
    finished.begin_transaction()
    finished.produce("txn-a", value=b"z", partition=0)
    finished.commit_transaction(TIMEOUT_S)
    admin = kafka_python_admin(node.bootstrap)
    try:
        def listed(**filters) -> dict[str, tuple[int, str]]:
            (listings,) = admin.list_transactions(**filters).values()
            return {t.transactional_id: (t.producer_id, str(getattr(t.state, "value", t.state))) for t in listings}

        # The commit is answered once decided; its markers complete it a moment later.
        waiting.wait_for(lambda: listed()["finished-one"][1] == "CompleteCommit", TIMEOUT_S, "the completed commit")
        everything = listed()
        assert set(everything) == {"ongoing-one", "finished-one"}
        ongoing_pid = everything["ongoing-one"][0]
        assert everything["ongoing-one"][1] == "Ongoing" and everything["finished-one"][1] == "CompleteCommit"
        assert set(listed(state_filters=["Ongoing"])) == {"ongoing-one"}
        assert set(listed(producer_id_filters=[ongoing_pid])) == {"ongoing-one"}
        # Open for less than an hour: filtered out; one with no open transaction has no start (-1) and, as in
        # Kafka, passes every duration.
        assert set(listed(duration_filter_ms=3_600_000)) == {"finished-one"}
        time.sleep(0.3)
        assert set(listed(duration_filter_ms=200)) == {"ongoing-one", "finished-one"}
        assert patterned(node, "ongoing-.*") == (0, {"ongoing-one"})  # v2: the ids the regex matches whole
        assert patterned(node, "one") == (0, set()) and patterned(node, "") == (0, set(everything))
        assert patterned(node, "(unclosed")[0] == INVALID_REGULAR_EXPRESSION

        described = admin.describe_transactions(["ongoing-one"])["ongoing-one"]
        assert str(getattr(described.state, "value", described.state)) == "Ongoing"
        assert described.producer_id == ongoing_pid
        assert sorted((tp.topic, tp.partition) for tp in described.topic_partitions) == [("txn-a", 1), ("txn-b", 0)]
        assert described.transaction_timeout_ms == 60000
        assert 0 < time.time() * 1000 - described.transaction_start_time_ms < TIMEOUT_S * 1000
        done = admin.describe_transactions(["finished-one"])["finished-one"]
        assert str(getattr(done.state, "value", done.state)) == "CompleteCommit"
        assert list(done.topic_partitions) == []
        with pytest.raises(TransactionalIdNotFoundError):
            admin.describe_transactions(["never-seen"])
    finally:
        admin.close()
        ongoing.abort_transaction(TIMEOUT_S)
