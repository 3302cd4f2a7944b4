"""An AddPartitionsToTxn that widens an open transaction is answered before its state record is fsync'd; these tests
kill the node right after such an answer, once the producer's acks=all records in that partition were acknowledged,
and check what readers and the producer see after the restart: the partition's last stable offset moves on (the
transaction is resumed and ended, or aborted) well within the transaction timeout, and every committed
transaction's records are all there. The whole node's kill is followed by a power cut of the state log (its tail
past what was fsync'd before the answer is cut off, as a machine crash loses the page cache), which only the
coordinator's reconciliation at start repairs: the transaction, committed by its producer after the restart, has
its records in both partitions."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from tests import waiting
from tests.test_transactions import CONFIG, TIMEOUT_S, consume_all, create, in_transaction, transactional

pytestmark = pytest.mark.node
TRANSACTION_TIMEOUT_MS = 20_000
# The hanging-transaction sweep would abort an orphan only after transaction_max_timeout_ms (60 s) and its interval.
SETTLED_S = 10  # well within the transaction timeout


def stable_and_high(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    """The partition's last stable offset (ListOffsets read_committed) and its high watermark."""
    ends = []
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends", "isolation.level": isolation})
        try:
            ends.append(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=TIMEOUT_S,
                                                       cached=False)[1])
        finally:
            consumer.close()
    return ends[0], ends[1]


def timer_stats(node) -> dict[str, int]:
    from shmbroker.node.tools.inspect import NodeReader

    reader = NodeReader.open(str(node.data_dir))
    try:
        (row,) = [row for row in reader.rows() if row.role == "timer"]
        return {name: row.get(name) for name in ("urgent_fsyncs", "transaction_partitions_reconciled")}
    finally:
        reader.close()


def state_log_bytes(node) -> tuple[Path, int]:
    (segment,) = sorted((Path(node.data_dir) / "__transaction_state-0").glob("*.log"))
    return segment, segment.stat().st_size


def open_in_a_new_partition(node, producer) -> tuple[Path, int]:
    """A committed transaction in partition 0, then one begun there (its first AddPartitionsToTxn is fsync'd before
    it is answered) and widened to partition 1: that AddPartitionsToTxn answered and the records acknowledged
    (acks=all: appended; its commit makes them durable). Returns the state log's segment and its size before the
    widening (all durable)."""
    in_transaction(producer, "lost", [b"committed-%d" % i for i in range(3)], partition=0)
    producer.begin_transaction()
    producer.produce("lost", value=b"open-0", partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    segment, durable = state_log_bytes(node)
    for i in range(1, 4):
        producer.produce("lost", value=b"open-%d" % i, partition=1)
    assert producer.flush(TIMEOUT_S) == 0
    stable, high = stable_and_high(node.bootstrap, "lost", 1)
    assert stable < high  # open
    return segment, durable


def settles(node) -> None:
    """Partition 1's LSO reaches its high watermark within SETTLED_S of the restart."""
    ends = waiting.poll(lambda: (lambda ends: ends if ends[0] == ends[1] else None)(
        stable_and_high(node.bootstrap, "lost", 1)), SETTLED_S, 0.2)
    assert ends, (stable_and_high(node.bootstrap, "lost", 1), node.log(100000)[-3000:])


def test_a_power_cut_losing_an_add_partitions_record_leaves_the_partition_in_its_transaction(node_factory):
    node = node_factory(workers=1, config=CONFIG)
    create(node.bootstrap, "lost", 2)
    producer = transactional(node.bootstrap, "loser", **{"transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                                                          "reconnect.backoff.max.ms": 500})
    segment, durable = open_in_a_new_partition(node, producer)
    assert state_log_bytes(node)[1] > durable
    # The commit's decision was synced at once (counted); the widening AddPartitionsToTxn record was not waited for.
    waiting.wait_for(lambda: timer_stats(node)["urgent_fsyncs"] > 0, timeout=TIMEOUT_S, what="urgent fsyncs counted")
    node.kill_all()
    os.truncate(segment, durable)  # what was not fsync'd before the answers is lost with the page cache
    node.start()
    producer.commit_transaction(TIMEOUT_S)  # the producer goes on: its transaction has both partitions
    settles(node)
    committed = [b"committed-%d" % i for i in range(3)] + [b"open-%d" % i for i in range(4)]
    assert sorted(consume_all(node.bootstrap, "lost", "read_committed", partitions=2)) == sorted(committed)
    waiting.wait_for(lambda: timer_stats(node)["transaction_partitions_reconciled"] == 1, timeout=TIMEOUT_S,
                     what="the reconciled partition counted")


@pytest.mark.parametrize("victim", ["timer", "node"])
def test_a_kill_right_after_add_partitions_leaves_no_partition_blocked(node_factory, victim):
    node = node_factory(workers=1, config=CONFIG)
    create(node.bootstrap, "lost", 2)
    producer = transactional(node.bootstrap, "resumer", **{"transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                                                            "reconnect.backoff.max.ms": 500})
    open_in_a_new_partition(node, producer)
    started = time.monotonic()
    if victim == "timer":
        timer = node.pids("timer")[0]
        os.kill(timer, signal.SIGKILL)
        node.wait_for_pids("timer", 1, exclude={timer}, timeout=TIMEOUT_S)
    else:
        node.kill_all()
        node.start()
    committed = [b"committed-%d" % i for i in range(3)]
    try:
        producer.commit_transaction(TIMEOUT_S)
    except KafkaException as exc:  # not committed: then it must never show
        if exc.args[0].txn_requires_abort() and not exc.args[0].fatal():
            producer.abort_transaction(TIMEOUT_S)
    else:
        committed += [b"open-%d" % i for i in range(4)]
    settles(node)
    assert time.monotonic() - started < TRANSACTION_TIMEOUT_MS / 1000
    assert sorted(consume_all(node.bootstrap, "lost", "read_committed", partitions=2)) == sorted(committed)
