"""The worker's transaction handlers without a node: each request version decoded from kio's encoding, turned into
its ring message, and the coordinator's answer turned into a response kio decodes (the node tests drive them with
real clients)."""

from __future__ import annotations

import datetime
import io
import socket
from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode as E
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i16, i32, i64, i32Timedelta

from shmbroker.node.config import NodeConfig
from shmbroker.shm import messages as M
from shmbroker.workers.api.groups import GroupHandlers
from shmbroker.workers.api.transactions import TransactionHandlers
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Connection


class Asked:
    """DelayedRequests.ask, kept for the test to answer."""

    def __init__(self) -> None:
        self.frame = None
        self.answer = None

    def ask(self, req, frame, timeout_ms, answer):
        self.frame, self.answer = frame, answer
        return "deferred"


def call(handler, api_key: int, version: int, request):
    body = io.BytesIO()
    entity_writer(type(request))(body, request)
    decoded = P.decode_request(api_key, version, body.getvalue())
    ours, theirs = socket.socketpair()  # the connection a request came on (handlers may ask its listener)
    try:
        conn = Connection(ours, "test", NodeConfig().server.request_max_bytes, NodeConfig().server.recv_bytes)
        req = SimpleNamespace(header=P.RequestHeader(api_key, version, 7, "test", 0), conn=conn)
        return req, decoded, handler(req, decoded)
    finally:
        ours.close()
        theirs.close()


def response_of(api_key: int, version: int, outcome):
    (frame,) = outcome.pieces
    response_class = P.response_class(api_key, version)
    decoded, _ = entity_reader(response_class)(memoryview(frame), 8)
    return decoded


def request_class(api_key: int, version: int, name: str):
    return getattr(P.request_schema(api_key, version), name)


@pytest.fixture
def handlers():
    asked = Asked()
    return TransactionHandlers(NodeConfig(), asked), asked


@pytest.mark.parametrize("version", [0, 1, 2])
def test_add_partitions_to_txn_round_trips_and_fencing_is_an_old_epoch_error_before_v2(handlers, version):
    txn, asked = handlers
    schema = P.request_schema(P.ADD_PARTITIONS_TO_TXN, version)
    request = schema.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id="app", v3_and_below_producer_id=i64(1000),
        v3_and_below_producer_epoch=i16(3),
        v3_and_below_topics=(schema.AddPartitionsToTxnTopic(name="t", partitions=(i32(0), i32(1))),))
    _, _, outcome = call(txn.add_partitions_to_txn, P.ADD_PARTITIONS_TO_TXN, version, request)
    message = M.decode(asked.frame)
    assert (message.producer_id, message.producer_epoch, message.transactional_id) == (1000, 3, "app")
    assert [tuple(t[:1]) + (list(t[1]),) for t in message.topics] == [("t", [0, 1])]
    answer = M.reply_class(M.Kind.ADD_PARTITIONS_TO_TXN)([("t", [(0, int(E.producer_fenced)), (1, 0)])])
    response = response_of(P.ADD_PARTITIONS_TO_TXN, version, asked.answer(M.Reply(1, message.kind, answer)))
    (topic,) = response.results_by_topic_v3_and_below
    fenced = E.invalid_producer_epoch if version < 2 else E.producer_fenced
    assert [(r.partition_index, r.partition_error_code) for r in topic.results_by_partition] == [(0, fenced),
                                                                                                   (1, E.none)]


@pytest.mark.parametrize("version", [0, 1, 2])
def test_end_txn_add_offsets_and_txn_offset_commit_round_trip(handlers, version):
    txn, asked = handlers
    end = request_class(P.END_TXN, version, "EndTxnRequest")(
        transactional_id="app", producer_id=i64(1000), producer_epoch=i16(3), committed=True)
    _, _, outcome = call(txn.end_txn, P.END_TXN, version, end)
    message = M.decode(asked.frame)
    assert (message.committed, message.transactional_id) == (True, "app")
    response = response_of(P.END_TXN, version, asked.answer(M.Reply(1, message.kind, M.reply_class(message.kind)(0))))
    assert response.error_code == E.none
    assert response_of(P.END_TXN, version, asked.answer(None)).error_code == E.coordinator_not_available

    offsets = request_class(P.ADD_OFFSETS_TO_TXN, version, "AddOffsetsToTxnRequest")(
        transactional_id="app", producer_id=i64(1000), producer_epoch=i16(3), group_id="g")
    call(txn.add_offsets_to_txn, P.ADD_OFFSETS_TO_TXN, version, offsets)
    assert M.decode(asked.frame).group == "g"

    schema = P.request_schema(P.TXN_OFFSET_COMMIT, version)
    partition = dict(partition_index=i32(0), committed_offset=i64(42), committed_metadata="m")
    if version >= 2:
        partition["committed_leader_epoch"] = i32(5)
    commit = schema.TxnOffsetCommitRequest(
        transactional_id="app", group_id="g", producer_id=i64(1000), producer_epoch=i16(3),
        topics=(schema.TxnOffsetCommitRequestTopic(name="t", partitions=(
            schema.TxnOffsetCommitRequestPartition(**partition),)),))
    call(txn.txn_offset_commit, P.TXN_OFFSET_COMMIT, version, commit)
    message = M.decode(asked.frame)
    assert [tuple(p) for p in message.topics[0][1]] == [(0, 42, 5 if version >= 2 else -1, "m")]
    assert (message.generation, message.member, message.instance) == (-1, "", None)  # v0-2 name no member
    answer = M.reply_class(message.kind)([("t", [(0, int(E.producer_fenced))])])
    response = response_of(P.TXN_OFFSET_COMMIT, version, asked.answer(M.Reply(1, message.kind, answer)))
    assert response.topics[0].partitions[0].error_code == E.invalid_producer_epoch  # PRODUCER_FENCED from v3


def test_txn_offset_commit_v3_passes_the_consumers_member_to_the_coordinator(handlers):
    txn, asked = handlers
    schema = P.request_schema(P.TXN_OFFSET_COMMIT, 3)
    commit = schema.TxnOffsetCommitRequest(
        transactional_id="app", group_id="g", producer_id=i64(1000), producer_epoch=i16(3), generation_id=i32(7),
        member_id="member-1", group_instance_id="instance-1", topics=(schema.TxnOffsetCommitRequestTopic(
            name="t", partitions=(schema.TxnOffsetCommitRequestPartition(
                partition_index=i32(0), committed_offset=i64(42), committed_leader_epoch=i32(5),
                committed_metadata="m"),)),))
    call(txn.txn_offset_commit, P.TXN_OFFSET_COMMIT, 3, commit)
    message = M.decode(asked.frame)
    assert (message.group, message.generation, message.member, message.instance) == ("g", 7, "member-1", "instance-1")


@pytest.mark.parametrize("version", [0, 1])
def test_init_producer_id_with_a_transactional_id_asks_the_coordinator(handlers, version):
    txn, asked = handlers
    request = request_class(P.INIT_PRODUCER_ID, version, "InitProducerIdRequest")(
        transactional_id="app", transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)))
    _, _, outcome = call(txn.init_producer_id, P.INIT_PRODUCER_ID, version, request)
    message = M.decode(asked.frame)
    assert (message.transactional_id, message.transaction_timeout_ms) == ("app", 60_000)
    answer = M.reply_class(message.kind)(0, 1000, 4)
    response = response_of(P.INIT_PRODUCER_ID, version, asked.answer(M.Reply(1, message.kind, answer)))
    assert (response.error_code, response.producer_id, response.producer_epoch) == (E.none, 1000, 4)


@pytest.mark.parametrize("version", [1, 2])
def test_find_coordinator_names_the_node_for_a_transactional_id(version):
    groups = GroupHandlers(NodeConfig(), Asked())
    request = request_class(P.FIND_COORDINATOR, version, "FindCoordinatorRequest")(key="app", key_type=i8(1))
    _, _, outcome = call(groups.find_coordinator, P.FIND_COORDINATOR, version, request)
    response = response_of(P.FIND_COORDINATOR, version, outcome)
    assert response.error_code == E.none and response.node_id == NodeConfig().server.node_id
