"""WriteTxnMarkers (workers/api/txn_markers.py) on a live node, raw: each partition's error as Kafka answers it,
the marker closing the producer's transaction there (the last stable offset moves, an ABORT is listed to
read_committed readers), the cluster permission, and a transaction its coordinator still has open aborted under
it (its own marker then changes nothing; the producer goes on). Then the handler alone, on a partition store with
the timer's wait in the test's hands: the answer waits for the marker's fsync."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from scripts.harness import rawkafka as R
from shmbroker.node.config import NodeConfig
from shmbroker.node.storage import records
from shmbroker.node.storage.log import LogConfig
from shmbroker.node.storage.store import PartitionStore
from shmbroker.shm import messages as M
from shmbroker.workers.api.txn_markers import TxnMarkerHandlers
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.timer_client.delayed import Completed
from tests.record_batches import SharedTable
from tests.test_transactions import CONFIG, TIMEOUT_S, create, in_transaction, transactional
from tests.test_transactions_handlers import call


WRITE_TXN_MARKERS, LIST_OFFSETS, DESCRIBE_PRODUCERS = 27, 2, 61
NONE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_EPOCH, CLUSTER_AUTHORIZATION_FAILED = 0, 3, 47, 31
VERSION = 2


def markers_body(*markers: tuple[int, int, bool, dict[str, list[int]]], version: int = VERSION) -> bytes:
    """(producer id, epoch, commit, {topic: partitions}) each."""
    e = lambda name, /, **fields: R.request_entity(WRITE_TXN_MARKERS, version, name, **fields)  # noqa: E731
    return R.request_body(WRITE_TXN_MARKERS, version, "WriteTxnMarkersRequest", markers=tuple(
        e("WritableTxnMarker", producer_id=pid, producer_epoch=epoch, transaction_result=commit, coordinator_epoch=0,
          transaction_version=0, topics=tuple(e("WritableTxnMarkerTopic", name=topic, partition_indexes=tuple(parts))
                                              for topic, parts in topics.items()))
        for pid, epoch, commit, topics in markers))


def write_markers(conn: R.RawConnection, *markers) -> list[tuple[int, list[tuple[str, int, int]]]]:
    """[(producer id, [(topic, partition, error code)])] of the answer."""
    answer = conn.call(WRITE_TXN_MARKERS, VERSION, markers_body(*markers))
    return [(m.producer_id, [(t.name, p.partition_index, int(p.error_code)) for t in m.topics for p in t.partitions])
            for m in answer.markers]


def last_stable_offset(conn: R.RawConnection, topic: str, partition: int) -> int:
    e = lambda name, /, **fields: R.request_entity(LIST_OFFSETS, 5, name, **fields)  # noqa: E731
    answer = conn.call(LIST_OFFSETS, 5, R.request_body(
        LIST_OFFSETS, 5, "ListOffsetsRequest", replica_id=-1, isolation_level=1, topics=(e(
            "ListOffsetsTopic", name=topic, partitions=(e("ListOffsetsPartition", partition_index=partition,
                                                          current_leader_epoch=-1, timestamp=-1),)),)))
    (got,) = answer.topics[0].partitions
    assert got.error_code == 0, got
    return got.offset


def open_batch(producer_id: int, epoch: int, count: int = 2) -> bytes:
    return records.build_batch([(None, b"open %d" % i) for i in range(count)], int(time.time() * 1000),
                               producer_id=producer_id, producer_epoch=epoch, base_sequence=0, transactional=True)


def produce(conn: R.RawConnection, topic: str, partition: int, batch: bytes) -> None:
    answer = conn.call(0, 8, R.produce_body({topic: {partition: batch}}, acks=-1))
    assert answer.responses[0].partition_responses[0].error_code == 0, answer


@pytest.mark.node
def test_markers_answer_kafkas_errors_and_close_the_transaction(node_factory):
    node = node_factory(workers=1, config=CONFIG)
    create(node.bootstrap, "wtm", 2)
    with R.RawConnection("127.0.0.1", node.port, timeout_s=TIMEOUT_S) as conn:
        produce(conn, "wtm", 0, open_batch(5000, 2))
        assert last_stable_offset(conn, "wtm", 0) == 0
        # An older epoch than the partition's, an unknown topic, a partition the topic lacks: nothing written.
        assert write_markers(conn, (5000, 1, False, {"wtm": [0], "absent": [0]}), (5001, 0, True, {"wtm": [7]})) == [
            (5000, [("wtm", 0, INVALID_PRODUCER_EPOCH), ("absent", 0, UNKNOWN_TOPIC_OR_PARTITION)]),
            (5001, [("wtm", 7, UNKNOWN_TOPIC_OR_PARTITION)])]
        assert last_stable_offset(conn, "wtm", 0) == 0
        # The ABORT, of the producer's own epoch (and one on a partition it never wrote to: written, closes nothing).
        assert write_markers(conn, (5000, 2, False, {"wtm": [0, 1]})) == [(5000, [("wtm", 0, NONE), ("wtm", 1, NONE)])]
        assert last_stable_offset(conn, "wtm", 0) == 3  # the two records, the marker
        assert last_stable_offset(conn, "wtm", 1) == 1
        body = conn.request(R.FETCH, 11, R.fetch_body({"wtm": {0: 0}}, max_wait_ms=0, isolation_level=1, version=11))
        (fetched,) = R.parse_fetch_response(11, body).partitions
        assert (fetched.record_count, fetched.aborted_record_count, fetched.control_batch_count) == (0, 2, 1), fetched
        # Markers of a producer with no open transaction change nothing, and are answered NONE as Kafka does.
        assert write_markers(conn, (5000, 2, True, {"wtm": [0]})) == [(5000, [("wtm", 0, NONE)])]
        assert last_stable_offset(conn, "wtm", 0) == 4


@pytest.mark.node
def test_markers_need_a_cluster_permission(node_factory):
    node = node_factory(workers=1, config=CONFIG + "[authorizer]\nenabled = true\n")
    with R.RawConnection("127.0.0.1", node.port, timeout_s=TIMEOUT_S) as conn:
        assert write_markers(conn, (5000, 0, False, {"t": [0, 1]}), (5001, 0, True, {"u": [0]})) == [
            (5000, [("t", 0, CLUSTER_AUTHORIZATION_FAILED), ("t", 1, CLUSTER_AUTHORIZATION_FAILED)]),
            (5001, [("u", 0, CLUSTER_AUTHORIZATION_FAILED)])]


@pytest.mark.node
def test_an_open_transaction_of_the_coordinator_aborted_under_it(node_factory):
    """Kafka leaves this to the operator: the partition's transaction is aborted; the coordinator, which still has
    it open, commits it later with a marker that finds nothing open there; the producer's next transaction is
    read as usual."""
    node = node_factory(workers=1, config=CONFIG)
    create(node.bootstrap, "wtm-open", 1)
    producer = transactional(node.bootstrap, "wtm-open-writer")
    producer.begin_transaction()
    for i in range(3):
        producer.produce("wtm-open", value=b"under %d" % i, partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    with R.RawConnection("127.0.0.1", node.port, timeout_s=TIMEOUT_S) as conn:
        described = conn.call(DESCRIBE_PRODUCERS, 0, R.request_body(
            DESCRIBE_PRODUCERS, 0, "DescribeProducersRequest", topics=(R.request_entity(
                DESCRIBE_PRODUCERS, 0, "TopicRequest", name="wtm-open", partition_indexes=(0,)),)))
        (state,) = described.topics[0].partitions[0].active_producers
        assert state.current_txn_start_offset == 0
        assert write_markers(conn, (state.producer_id, state.producer_epoch, False, {"wtm-open": [0]})) == [
            (state.producer_id, [("wtm-open", 0, NONE)])]
        assert last_stable_offset(conn, "wtm-open", 0) == 4
        producer.commit_transaction(TIMEOUT_S)  # the coordinator's COMMIT marker: nothing open to commit
        in_transaction(producer, "wtm-open", [b"after"], partition=0)
        assert last_stable_offset(conn, "wtm-open", 0) == 7  # 3 records, 2 markers, 1 record, 1 marker
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "wtm-open-reader",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("wtm-open", 0, 0)])
        got = []
        deadline = time.monotonic() + TIMEOUT_S
        while not got and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                got.append((message.offset(), message.value()))
    finally:
        consumer.close()
    assert got == [(5, b"after")]


# --------------------------------------------------------------------------- the handler alone: the fsync wait


class Delayed:
    """DelayedRequests' side the handler uses: the fsync wait kept for the test to finish."""

    def __init__(self) -> None:
        self.waits = None
        self.finish = None
        self.appended_rows: list[int] = []

    def appended(self, row: int) -> None:
        self.appended_rows.append(row)

    def wants_flush(self, row: int) -> None:
        pass

    def delay_produce(self, req, waits, timeout_ms, finish):
        self.waits, self.finish = waits, finish
        return "deferred"


@pytest.fixture
def handler(tmp_path, nothing_left_in_dev_shm):

    with SharedTable(rows=4) as table:
        store = PartitionStore(str(tmp_path), table, LogConfig(), 4)
        store.create_topics([("t", 1, {})])
        delayed = Delayed()
        yield TxnMarkerHandlers(store, NodeConfig(), delayed), store, delayed
        store.close()


def handler_call(handler, *markers):

    request = R.request_entity(WRITE_TXN_MARKERS, VERSION, "WriteTxnMarkersRequest", markers=tuple(
        R.request_entity(WRITE_TXN_MARKERS, VERSION, "WritableTxnMarker", producer_id=pid, producer_epoch=epoch,
                         transaction_result=commit, coordinator_epoch=0, transaction_version=0, topics=tuple(
                             R.request_entity(WRITE_TXN_MARKERS, VERSION, "WritableTxnMarkerTopic", name=topic,
                                              partition_indexes=tuple(parts)) for topic, parts in topics.items()))
        for pid, epoch, commit, topics in markers))
    _, _, outcome = call(handler.write_txn_markers, P.WRITE_TXN_MARKERS, VERSION, request)

    def errors(done):
        (frame,) = done.pieces
        answer = R.decode_response(P.WRITE_TXN_MARKERS, VERSION, memoryview(frame)[8:])  # after size, correlation id
        return [(t.name, p.partition_index, int(p.error_code)) for m in answer.markers for t in m.topics
                for p in t.partitions]
    return outcome, errors


@pytest.mark.parametrize("how", ["flushed", "expired", "failed"])
def test_a_marker_is_answered_once_fsynced(handler, how):
    """The answer waits for the marker's fsync (the timer's DELAY_PRODUCE wait): NONE once the partition is
    flushed past the marker, REQUEST_TIMED_OUT if the wait expired first, the timer's error if the fsync failed."""
    handlers, store, delayed = handler
    row = store.row("t", 0)
    store.log(row).append(open_batch(9000, 0))
    outcome, errors = handler_call(handlers, (9000, 0, False, {"t": [0]}))
    assert outcome == "deferred" and delayed.waits == [(row, 3)] and delayed.appended_rows == [row]
    assert store.table.read(row).first_unstable_offset == -1  # closed in the partition at once: the LSO moved
    if how == "flushed":
        store.log(row).flush()
        assert errors(delayed.finish(Completed(M.Status.SATISFIED))) == [("t", 0, NONE)]
    elif how == "expired":
        assert errors(delayed.finish(Completed(M.Status.EXPIRED))) == [("t", 0, 7)]  # REQUEST_TIMED_OUT
    else:
        assert errors(delayed.finish(Completed(M.Status.FAILED, 56))) == [("t", 0, 56)]  # KAFKA_STORAGE_ERROR
