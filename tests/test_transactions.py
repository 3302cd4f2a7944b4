"""Transactions against a real node with real clients: read_committed and read_uncommitted consumers, fencing by
a second producer of the same transactional.id, send_offsets_to_transaction, the node aborting a transaction
its killed client left open past its timeout, outcomes that survive a kill -9 of the node, consume-transform-
produce exactly once across kills of the client and of the node's timer, worker or supervisor (at any point, and
with an EndTxn in the node: each role, a commit and an abort), the transactional producers of kafka-python and
aiokafka, and KafkaJS' transactions (node, with kafkajs from the npm registry in the frameworks cache,
tests/frameworks/cache.py, installed on first use)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests import waiting
from tests.frameworks.npm import NODE_MISSING, have_node, node_modules

pytestmark = pytest.mark.node
TIMEOUT_S = 30
CONFIG = "[transactions]\ntransaction_max_timeout_ms = 60000\n"
STOPPED_TIMER_WAIT_S = 2  # a client waits this long for answers while the timer is stopped


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=TIMEOUT_S)


def transactional(bootstrap: str, transactional_id: str, **config) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 1,
                         **config})
    producer.init_transactions(TIMEOUT_S)
    return producer


def in_transaction(producer: Producer, topic: str, values: list[bytes], commit: bool = True,
                   partition: int | None = None) -> None:
    producer.begin_transaction()
    for value in values:
        if partition is None:
            producer.produce(topic, value=value)
        else:
            producer.produce(topic, value=value, partition=partition)
    if commit:
        producer.commit_transaction(TIMEOUT_S)
    else:
        producer.flush(TIMEOUT_S)  # written, then aborted (abort_transaction drops what was not sent yet)
        producer.abort_transaction(TIMEOUT_S)


def produce_numbers(bootstrap: str, topic: str, count: int) -> None:
    """`count` records outside any transaction, valued b"0", b"1", ...: every one acknowledged."""
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    for i in range(count):
        plain.produce(topic, value=b"%d" % i)
    assert plain.flush(TIMEOUT_S) == 0


def consume_all(bootstrap: str, topic: str, isolation: str, partitions: int = 1, expect: int | None = None,
                timeout_s: float = TIMEOUT_S, must_end: bool = False) -> list[bytes]:
    """Every value from the start to the end each partition reports (its LSO for read_committed), in order per
    partition; with `expect`, until that many came (or the time is up); with `must_end`, failing when the ends
    are not reached in time."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                         "isolation.level": isolation, "enable.partition.eof": True, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values, at_end = [], set()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    if expect is None and len(at_end) == partitions:
                        break
                    continue
                raise KafkaException(message.error())
            at_end.discard(message.partition())
            values.append(message.value())
            if expect is not None and len(values) >= expect:
                break
        else:
            assert not must_end, f"{topic} not read to its end in {timeout_s} s ({len(values)} values)"
    finally:
        consumer.close()
    return values


def test_read_committed_sees_committed_transactions_and_read_uncommitted_sees_all(node_factory):
    node = node_factory(workers=2, config=CONFIG)
    create(node.bootstrap, "txn", 2)
    producer = transactional(node.bootstrap, "writer")
    in_transaction(producer, "txn", [b"c1-%d" % i for i in range(20)])
    in_transaction(producer, "txn", [b"a1-%d" % i for i in range(20)], commit=False)
    in_transaction(producer, "txn", [b"c2-%d" % i for i in range(20)])
    producer.flush(TIMEOUT_S)
    committed = consume_all(node.bootstrap, "txn", "read_committed", partitions=2)
    assert sorted(committed) == sorted([b"c1-%d" % i for i in range(20)] + [b"c2-%d" % i for i in range(20)])
    everything = consume_all(node.bootstrap, "txn", "read_uncommitted", partitions=2)
    assert len(everything) == 60 and {v[:2] for v in everything} == {b"c1", b"a1", b"c2"}


def test_read_committed_stops_at_an_open_transaction(node_factory):
    node = node_factory(workers=1, config=CONFIG)
    create(node.bootstrap, "open")
    plain = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 1})
    plain.produce("open", value=b"before")
    plain.flush(TIMEOUT_S)
    producer = transactional(node.bootstrap, "slow")
    producer.begin_transaction()
    producer.produce("open", value=b"inside")
    producer.flush(TIMEOUT_S)
    plain.produce("open", value=b"after")
    plain.flush(TIMEOUT_S)
    assert consume_all(node.bootstrap, "open", "read_committed") == [b"before"]
    assert consume_all(node.bootstrap, "open", "read_uncommitted") == [b"before", b"inside", b"after"]
    producer.commit_transaction(TIMEOUT_S)
    assert consume_all(node.bootstrap, "open", "read_committed") == [b"before", b"inside", b"after"]


def test_a_transactions_records_are_answered_once_appended_without_waiting_for_an_fsync(node_factory):
    """acks=all records of a transaction wait for no fsync (its commit makes them durable): they are answered while
    the timer process, which runs the group commit, is stopped; an idempotent producer's are not."""
    node = node_factory(workers=1, config=CONFIG)
    create(node.bootstrap, "appended")
    producer = transactional(node.bootstrap, "appender")
    plain = Producer({"bootstrap.servers": node.bootstrap, "enable.idempotence": True, "linger.ms": 1})
    plain.produce("appended", value=b"plain-0")
    assert plain.flush(TIMEOUT_S) == 0
    producer.begin_transaction()
    producer.produce("appended", value=b"first")
    assert producer.flush(TIMEOUT_S) == 0  # the partition is in the transaction
    timer = node.pids("timer")[0]
    # For less than the hung-child timeout, and not inside the group-commit round "first" started (its flusher
    # publishes under the partition's lock, which the append of "second" needs).
    node.stop_outside_partition_locks(timer)
    try:
        producer.produce("appended", value=b"second")
        assert producer.flush(STOPPED_TIMER_WAIT_S) == 0
        plain.produce("appended", value=b"plain-1")
        assert plain.flush(STOPPED_TIMER_WAIT_S) == 1  # acks=all outside a transaction waits for its fsync
    finally:
        os.kill(timer, signal.SIGCONT)
    assert plain.flush(TIMEOUT_S) == 0
    producer.commit_transaction(TIMEOUT_S)
    assert consume_all(node.bootstrap, "appended", "read_committed") == [b"plain-0", b"first", b"second", b"plain-1"]


def test_a_second_producer_of_the_same_transactional_id_fences_the_first(node_factory):
    node = node_factory(workers=2, config=CONFIG)
    create(node.bootstrap, "fence")
    zombie = transactional(node.bootstrap, "shared")
    zombie.begin_transaction()
    zombie.produce("fence", value=b"zombie")
    zombie.flush(TIMEOUT_S)
    successor = transactional(node.bootstrap, "shared")  # aborts the zombie's open transaction first
    in_transaction(successor, "fence", [b"successor"])
    with pytest.raises(KafkaException) as caught:
        zombie.commit_transaction(TIMEOUT_S)
    assert caught.value.args[0].fatal() or caught.value.args[0].code() in (
        KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    assert consume_all(node.bootstrap, "fence", "read_committed") == [b"successor"]


def test_init_producer_id_v3_and_v4_bump_the_epoch_of_the_producer_naming_itself(node_factory):
    """KIP-360 through a worker: a producer naming its own id and epoch (InitProducerId v3+) gets the next epoch,
    the same one again when it retries, and PRODUCER_FENCED (v4) or INVALID_PRODUCER_EPOCH (v3) for a stale
    epoch; one of the two alone is INVALID_REQUEST; an idempotent producer naming itself gets a new producer id."""
    from scripts.harness import rawkafka as R

    node = node_factory(workers=2, config=CONFIG)
    init_producer_id, invalid_request, invalid_epoch, fenced = 22, 42, 47, 90

    def init(version: int, transactional_id: str | None, producer: tuple[int, int] = (-1, -1)) -> tuple:
        body = R.request_body(init_producer_id, version, "InitProducerIdRequest", transactional_id=transactional_id,
                              transaction_timeout=R.millis(60_000), producer_id=producer[0],
                              producer_epoch=producer[1])
        with R.RawConnection("127.0.0.1", node.port) as conn:
            answer = conn.call(init_producer_id, version, body)
        return int(answer.error_code), int(answer.producer_id), int(answer.producer_epoch)

    error, producer_id, epoch = init(4, "kip-360")
    assert error == 0 and epoch == 0
    assert init(4, "kip-360", (producer_id, 0)) == (0, producer_id, 1)
    assert init(3, "kip-360", (producer_id, 0)) == (0, producer_id, 1)  # a retry: the same epoch
    assert init(4, "kip-360", (producer_id, 1)) == (0, producer_id, 2)
    assert init(4, "kip-360", (producer_id, 0))[0] == fenced
    assert init(3, "kip-360", (producer_id, 0))[0] == invalid_epoch  # before KIP-588's PRODUCER_FENCED
    assert init(4, "kip-360", (producer_id, -1))[0] == invalid_request
    error, idempotent_id, idempotent_epoch = init(4, None)
    assert error == 0
    renewed = init(4, None, (idempotent_id, idempotent_epoch))
    assert renewed[0] == 0 and renewed[1] != idempotent_id and renewed[2] == 0


def test_send_offsets_to_transaction_commits_the_offsets_with_the_output(node_factory):
    node = node_factory(workers=2, config=CONFIG)
    create(node.bootstrap, "input")
    create(node.bootstrap, "output")
    produce_numbers(node.bootstrap, "input", 30)
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "transform", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.assign([TopicPartition("input", 0, 0)])
    producer = transactional(node.bootstrap, "transformer")
    try:
        for round_, commit in enumerate((True, False, True)):
            taken = []
            deadline = time.monotonic() + TIMEOUT_S
            while len(taken) < 10 and time.monotonic() < deadline:
                message = consumer.poll(0.2)
                if message is not None and not message.error():
                    taken.append(message)
            assert len(taken) == 10
            producer.begin_transaction()
            for message in taken:
                producer.produce("output", value=b"out-" + message.value())
            producer.send_offsets_to_transaction([TopicPartition("input", 0, taken[-1].offset() + 1)],
                                                 consumer.consumer_group_metadata(), TIMEOUT_S)
            if commit:
                producer.commit_transaction(TIMEOUT_S)
            else:
                producer.abort_transaction(TIMEOUT_S)
                consumer.seek(TopicPartition("input", 0, taken[0].offset()))  # as a restarted transformer would
            committed = consumer.committed([TopicPartition("input", 0)], TIMEOUT_S)[0].offset
            assert committed == (10, 10, 20)[round_]  # the aborted round's offsets were not committed
    finally:
        consumer.close()
    assert consume_all(node.bootstrap, "output", "read_committed") == [b"out-%d" % i for i in range(20)]


def test_offsets_of_a_consumer_no_longer_in_its_group_are_refused(node_factory):
    """KIP-447 (TxnOffsetCommit v3): the offsets a transaction commits name the consumer's member and generation, and
    the group coordinator refuses them once that member has left the group (a zombie transformer), so its input
    offsets cannot overwrite those of the member that took its partitions over; a live member's are taken."""
    node = node_factory(workers=2, config=CONFIG)
    create(node.bootstrap, "kip447-in")
    create(node.bootstrap, "kip447-out")
    settings = {"bootstrap.servers": node.bootstrap, "group.id": "kip447", "enable.auto.commit": False,
                "auto.offset.reset": "earliest", "session.timeout.ms": 6000}
    first = Consumer(settings)
    first.subscribe(["kip447-in"])
    deadline = time.monotonic() + TIMEOUT_S
    while not first.assignment() and time.monotonic() < deadline:
        first.poll(0.2)
    assert first.assignment()
    live = first.consumer_group_metadata()
    producer = transactional(node.bootstrap, "kip447-transformer")
    producer.begin_transaction()
    producer.produce("kip447-out", value=b"by the live member")
    producer.send_offsets_to_transaction([TopicPartition("kip447-in", 0, 5)], live, TIMEOUT_S)
    producer.commit_transaction(TIMEOUT_S)
    first.close()  # leaves the group: `live` is a zombie's metadata from here on
    second = Consumer(settings)
    try:
        second.subscribe(["kip447-in"])
        deadline = time.monotonic() + TIMEOUT_S
        while not second.assignment() and time.monotonic() < deadline:
            second.poll(0.2)
        assert second.assignment()
        assert second.committed([TopicPartition("kip447-in", 0)], TIMEOUT_S)[0].offset == 5
        producer.begin_transaction()
        producer.produce("kip447-out", value=b"by the zombie")
        with pytest.raises(KafkaException) as refused:
            producer.send_offsets_to_transaction([TopicPartition("kip447-in", 0, 9)], live, TIMEOUT_S)
        assert refused.value.args[0].name() in ("UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION"), refused.value
        producer.abort_transaction(TIMEOUT_S)
        assert second.committed([TopicPartition("kip447-in", 0)], TIMEOUT_S)[0].offset == 5
    finally:
        second.close()
    assert consume_all(node.bootstrap, "kip447-out", "read_committed") == [b"by the live member"]


def test_offset_fetch_require_stable_waits_for_the_transaction_holding_the_offset(node_factory):
    """OffsetFetch v7 require_stable (KIP-447): while a transaction holds a group's offset for a partition, the
    fetch answers UNSTABLE_OFFSET_COMMIT there (a read_committed consumer asks again), never the offset the
    transaction is about to replace; without require_stable the committed offset; after the commit the new one."""
    from scripts.harness import rawkafka as R

    node = node_factory(workers=1, config=CONFIG)
    create(node.bootstrap, "stable-in", 2)
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "stable", "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition("stable-in", 0, 3), TopicPartition("stable-in", 1, 4)],
                    asynchronous=False)
    producer = transactional(node.bootstrap, "stable-transformer")
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition("stable-in", 0, 7)], consumer.consumer_group_metadata(),
                                         TIMEOUT_S)

    def fetched(require_stable: bool, topics) -> dict:
        body = R.request_body(9, 7, "OffsetFetchRequest", group_id="stable", require_stable=require_stable,
                              topics=topics)
        with R.RawConnection("127.0.0.1", node.port) as conn:
            answer = conn.call(9, 7, body)
        return {(t.name, p.partition_index): (p.committed_offset, int(p.error_code))
                for t in answer.topics for p in t.partitions}

    named = (R.request_entity(9, 7, "OffsetFetchRequestTopic", name="stable-in", partition_indexes=(0, 1)),)
    unstable = 88
    try:
        assert fetched(True, named) == {("stable-in", 0): (-1, unstable), ("stable-in", 1): (4, 0)}
        assert fetched(True, None) == {("stable-in", 0): (-1, unstable), ("stable-in", 1): (4, 0)}
        assert fetched(False, named) == {("stable-in", 0): (3, 0), ("stable-in", 1): (4, 0)}
        producer.commit_transaction(TIMEOUT_S)
        assert waiting.poll(lambda: fetched(True, named) == {("stable-in", 0): (7, 0), ("stable-in", 1): (4, 0)},
                            TIMEOUT_S), fetched(True, named)
    finally:
        consumer.close()


def test_the_log_cleaner_compacts_the_transaction_state_log_which_is_still_complete_after_a_restart(node_factory):
    # Small state segments, so that 120 transactions seal several; normal scheduling and a short survey period, so
    # that the cleaning comes in bounded time.
    node = node_factory(workers=1, config=CONFIG + "state_segment_bytes = 4000\n[cleaner]\nbackoff_ms = 200\n"
                                                   'scheduling = "normal"\n')
    create(node.bootstrap, "busy-output")
    busy = transactional(node.bootstrap, "busy")
    for number in range(120):
        in_transaction(busy, "busy-output", [b"%d" % number])
    quiet = transactional(node.bootstrap, "quiet")
    in_transaction(quiet, "busy-output", [b"quiet"])
    log_dir = node.data_dir / "__transaction_state-0"
    # Each transaction wrote three states (ongoing, prepare, complete): the segment names (their base offsets) show
    # 360 records or more were written, of which two ids' latest states are all a compacted log needs.
    assert max(int(p.stem) for p in log_dir.glob("*.log")) >= 300
    waiting.wait_for(lambda: "cleaned __transaction_state-0" in node.log()
                     and sum(p.stat().st_size for p in log_dir.glob("*.log")) < 12_000, TIMEOUT_S,
                     "the cleaner to compact the transaction state log")
    assert node.stop() == 0
    node.start()
    # The compacted log still holds each id's producer and epoch: the producers go on where they were, and a
    # new producer of "busy" fences the old one (a lost state would have refused them or started over).
    in_transaction(busy, "busy-output", [b"after restart"])
    in_transaction(quiet, "busy-output", [b"quiet again"])
    successor = transactional(node.bootstrap, "busy")
    in_transaction(successor, "busy-output", [b"successor"])
    with pytest.raises(KafkaException):
        in_transaction(busy, "busy-output", [b"zombie"])
    values = consume_all(node.bootstrap, "busy-output", "read_committed")
    assert values == [b"%d" % n for n in range(120)] + [b"quiet", b"after restart", b"quiet again", b"successor"]


PRODUCE_AND_HANG = """
import sys, time
from confluent_kafka import Producer
producer = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": "hangs", "linger.ms": 1,
                     "transaction.timeout.ms": 3000, "message.timeout.ms": 3000})
producer.init_transactions(30)
producer.begin_transaction()
producer.produce("timeout", value=b"never committed")
producer.flush(30)
print("produced", flush=True)
time.sleep(300)
"""


def test_a_killed_clients_transaction_is_aborted_after_its_timeout(node_factory):
    node = node_factory(workers=1, config=CONFIG)
    create(node.bootstrap, "timeout")
    client = subprocess.Popen([sys.executable, "-c", PRODUCE_AND_HANG, node.bootstrap], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert client.stdout.readline().strip() == "produced"
        client.send_signal(signal.SIGKILL)
        client.wait(TIMEOUT_S)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(TIMEOUT_S)
        client.stdout.close()
    other = transactional(node.bootstrap, "after")
    in_transaction(other, "timeout", [b"committed later"])
    started = time.monotonic()
    # Until the node aborts the hung transaction (3 s), read_committed stops before it.
    seen = waiting.wait_for(lambda: consume_all(node.bootstrap, "timeout", "read_committed", timeout_s=5),
                            timeout=TIMEOUT_S, what="the timed-out transaction to be aborted")
    assert seen == [b"committed later"]
    assert time.monotonic() - started < TIMEOUT_S
    assert consume_all(node.bootstrap, "timeout", "read_uncommitted") == [b"never committed", b"committed later"]


def test_outcomes_survive_a_restart(node_factory):
    node = node_factory(workers=1, config=CONFIG)
    create(node.bootstrap, "durable")
    producer = transactional(node.bootstrap, "durable-writer")
    in_transaction(producer, "durable", [b"kept"])
    in_transaction(producer, "durable", [b"dropped"], commit=False)
    producer.begin_transaction()
    producer.produce("durable", value=b"open at the stop")
    producer.flush(TIMEOUT_S)
    node.kill_all()
    node.start()
    assert consume_all(node.bootstrap, "durable", "read_committed", expect=1) == [b"kept"]
    successor = transactional(node.bootstrap, "durable-writer")  # aborts what was open, fences the old one
    in_transaction(successor, "durable", [b"after restart"])
    assert consume_all(node.bootstrap, "durable", "read_committed") == [b"kept", b"after restart"]
    with pytest.raises(KafkaException):
        producer.commit_transaction(10)


TRANSFORMER = """
import sys
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
bootstrap = sys.argv[1]
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "eos-transformer", "linger.ms": 5,
                     "transaction.timeout.ms": 10000, "message.timeout.ms": 10000})
producer.init_transactions(60)  # fences a killed predecessor and aborts what it left open
print("initialized", flush=True)
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "eos", "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
consumer.assign([TopicPartition("eos-in", 0)])  # from the group's committed offset


def rewind():  # an aborted transaction's inputs are read again from the group's committed offset
    committed = consumer.committed([TopicPartition("eos-in", 0)], 60)[0]
    consumer.seek(TopicPartition("eos-in", 0, max(committed.offset, 0)))


while True:
    messages = []
    for message in consumer.consume(50, 0.5):
        if message.error():
            print("consumer error", message.error(), file=sys.stderr, flush=True)
        else:
            messages.append(message)
    if not messages:
        print("idle at", consumer.position([TopicPartition("eos-in", 0)])[0].offset, flush=True)
        continue
    try:
        producer.begin_transaction()
        for message in messages:
            producer.produce("eos-out", key=message.key(), value=b"out-" + message.value())
        producer.send_offsets_to_transaction([TopicPartition("eos-in", 0, messages[-1].offset() + 1)],
                                             consumer.consumer_group_metadata(), 60)
        for attempt in range(3):  # a retriable commit failure (a timeout across a kill) is retried as it is
            try:
                producer.commit_transaction(60)
                break
            except KafkaException as failure:
                if not failure.args[0].retriable() or attempt == 2:
                    raise
    except KafkaException as failure:  # as a real application: abort what may be aborted, retry from the commit
        error = failure.args[0]
        print("transaction failed:", error, file=sys.stderr, flush=True)
        if not error.txn_requires_abort():
            raise
        producer.abort_transaction(60)
        rewind()
        continue
    print("committed", messages[-1].offset() + 1, flush=True)
"""
EOS_INPUTS = 3000


class Transformer:
    """The consume-transform-produce client above, in a process of its own (killed with real signals); a thread
    reads its lines, so no wait on it blocks past its bound."""

    def __init__(self, bootstrap: str, log_path) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", TRANSFORMER, bootstrap], stdout=subprocess.PIPE,
                                         stderr=log, text=True)
        self.progress = 0  # the highest input offset it committed up to
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        idle = 0
        with open(self.log_path, "a") as log:  # its stages beside its errors, for a failure's message
            for line in self.proc.stdout:
                if line.startswith("committed"):
                    self.progress = max(self.progress, int(line.split()[1]))
                if line.startswith("idle"):
                    idle += 1
                    if idle & (idle - 1):  # the 1st, 2nd, 4th, 8th... idle line only
                        continue
                print(f"{time.strftime('%H:%M:%S')} pid {self.proc.pid}: {line.rstrip()} (idle {idle})", file=log,
                      flush=True)

    def committed(self, at_least: int, timeout_s: float = 60) -> int:
        """Its progress once it reached `at_least` (or whatever it reached when the time is up)."""
        return waiting.poll(lambda: self.progress if self.progress >= at_least else 0, timeout_s) or self.progress

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(TIMEOUT_S)
        self.reader.join(TIMEOUT_S)
        self.proc.stdout.close()


def exactly_once_with(node, kill, log_path) -> None:
    """Input through transformers, each killed by `kill(transformer)` part-way, the last one to the end: every
    input is in the output exactly once, in order, and the group's committed offset is the input's end."""
    create(node.bootstrap, "eos-in")
    create(node.bootstrap, "eos-out")
    plain = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i in range(EOS_INPUTS):
        plain.produce("eos-in", key=b"%d" % i, value=b"%d" % i)
    assert plain.flush(TIMEOUT_S) == 0
    progress = 0
    for round_ in range(3):
        transformer = Transformer(node.bootstrap, log_path)
        try:
            if round_ < 2:
                progress = max(progress, transformer.committed(min(EOS_INPUTS, progress + 500)))
                kill(transformer)
            else:  # a killed one may have gone on to the end before its kill: the last may find nothing left
                assert waiting.poll(lambda: max(progress, transformer.progress) >= EOS_INPUTS, 120), \
                    log_path.read_text()[-5000:] + node.log(5000)
            progress = max(progress, transformer.progress)
        finally:
            transformer.kill()
    output = consume_all(node.bootstrap, "eos-out", "read_committed", expect=EOS_INPUTS, timeout_s=60)
    assert output == [b"out-%d" % i for i in range(EOS_INPUTS)]
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "eos"})
    try:
        assert consumer.committed([TopicPartition("eos-in", 0)], TIMEOUT_S)[0].offset == EOS_INPUTS
    finally:
        consumer.close()


def test_consume_transform_produce_stays_exactly_once_across_kills_of_the_client(node_factory, tmp_path):
    node = node_factory(workers=2, config=CONFIG)
    exactly_once_with(node, lambda transformer: transformer.kill(), tmp_path / "transformers.log")


@pytest.mark.parametrize("role", ["timer", "worker", "supervisor"])
def test_consume_transform_produce_stays_exactly_once_across_kills_of_node_processes(node_factory, role, tmp_path):
    node = node_factory(workers=2, config=CONFIG)

    def kill_a_node_process_then_the_client(transformer: Transformer) -> None:
        if role == "supervisor":  # its children die with it; the node starts again on its data
            children = node.children()
            os.kill(node.proc.pid, signal.SIGKILL)
            node.proc.wait(TIMEOUT_S)
            assert psutil.wait_procs(children, timeout=TIMEOUT_S)[1] == []
            node.start()
        else:
            victim = node.pids(role)[0]
            os.kill(victim, signal.SIGKILL)
            node.wait_for_pids(role, 1 if role == "timer" else 2, exclude={victim}, timeout=TIMEOUT_S)
        transformer.committed(transformer.progress + 1, timeout_s=10)  # it may go on, or fail: either is fine
        transformer.kill()

    exactly_once_with(node, kill_a_node_process_then_the_client, tmp_path / "transformers.log")


END_TXN_API_KEY = 26
MID_INPUTS = 100
# Stats published often, so the test sees the EndTxn reach a worker at once; the stopped timer far from the hang
# timeout (the supervisor would replace it).
MID_CONFIG = CONFIG + "[stats]\npublish_interval_ms = 20\n[server]\nchild_hang_timeout_ms = 60000\n"


def end_txn_requests(node) -> dict[int, int]:
    """EndTxn requests each of the node's workers (by pid) has read (their stats rows)."""
    from shmbroker.node.tools.inspect import NodeReader

    reader = NodeReader.open(str(node.data_dir))
    try:
        return {row.pid: int(row.array("requests")[END_TXN_API_KEY]) for row in reader.rows() if row.role == "worker"}
    finally:
        reader.close()


class MidEndTxn:
    """A consume-transform-produce transaction (its output to two partitions, its input offsets sent with it) whose
    EndTxn is in the node when one of the node's processes is killed: the timer stopped (SIGSTOP), the EndTxn
    sent from a thread and read by a worker (its stats show it), so it waits in the stopped timer's ring; then
    the victim is killed (SIGKILL) and the timer, if it still lives, continued (SIGCONT). A supervisor takes its
    children with it (they die with it): the node is started again on its data."""

    def __init__(self, node, transactional_id: str) -> None:
        self.node = node
        self.transactional_id = transactional_id
        self.consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "mid", "enable.auto.commit": False})
        self.producer = self.new_producer()

    def new_producer(self) -> Producer:
        # Reconnects soon after a node restart (librdkafka backs off up to 10 s by default).
        return transactional(self.node.bootstrap, self.transactional_id, **{"reconnect.backoff.max.ms": 500})

    def transform(self, producer: Producer, start: int, end: int) -> None:
        """Begin a transaction with the outputs of inputs [start, end) and the input's offset `end`, written."""
        producer.begin_transaction()
        for i in range(start, end):
            producer.produce("mid-out", value=b"out-%d" % i, partition=i % 2)
        producer.send_offsets_to_transaction([TopicPartition("mid-in", 0, end)],
                                             self.consumer.consumer_group_metadata(), TIMEOUT_S)
        assert producer.flush(TIMEOUT_S) == 0

    def end_with_a_kill(self, role: str, commit: bool) -> BaseException | None:
        """End the open transaction with a kill of `role` while its EndTxn is in the node; the client's answer:
        None if it succeeded, else its exception."""
        node, outcome = self.node, {}

        def end() -> None:
            try:
                (self.producer.commit_transaction if commit else self.producer.abort_transaction)(TIMEOUT_S)
                outcome["error"] = None
            except KafkaException as exc:
                outcome["error"] = exc

        timer = node.pids("timer")[0]
        before = end_txn_requests(node)
        children = node.children()
        os.kill(timer, signal.SIGSTOP)
        ender = threading.Thread(target=end, daemon=True)
        try:
            ender.start()
            # The worker that read the EndTxn (it went on to the stopped timer's ring).
            reader = waiting.wait_for(lambda: next((pid for pid, count in end_txn_requests(node).items()
                                                    if count > before.get(pid, 0)), None),
                                      timeout=TIMEOUT_S, poll_s=0.01, what="the EndTxn read by a worker")
            if role == "supervisor":
                os.kill(node.proc.pid, signal.SIGKILL)
                node.proc.wait(TIMEOUT_S)
                assert psutil.wait_procs(children, timeout=TIMEOUT_S)[1] == []  # every child died with it
                node.start()
            else:
                victim = timer if role == "timer" else reader
                os.kill(victim, signal.SIGKILL)
                node.wait_for_pids(role, 1, exclude={victim}, timeout=TIMEOUT_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(timer, signal.SIGCONT)
        ender.join(TIMEOUT_S + 10)
        assert not ender.is_alive()
        return outcome["error"]

    def outcome(self) -> tuple[list[bytes], int]:
        """What read_committed readers see of the output (sorted) and the group's committed input offset."""
        output = consume_all(self.node.bootstrap, "mid-out", "read_committed", partitions=2)
        return sorted(output), self.consumer.committed([TopicPartition("mid-in", 0)], TIMEOUT_S)[0].offset

    def close(self) -> None:
        self.consumer.close()


def outputs(start: int, end: int) -> list[bytes]:
    return sorted(b"out-%d" % i for i in range(start, end))


@pytest.mark.parametrize("role", ["timer", "worker", "supervisor"])
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_a_kill_of_a_node_process_in_the_middle_of_an_end_txn(node_factory, role, commit):
    node = node_factory(workers=1, config=MID_CONFIG)
    create(node.bootstrap, "mid-in")
    create(node.bootstrap, "mid-out", 2)
    mid = MidEndTxn(node, "mid-transformer")
    try:
        mid.transform(mid.producer, 0, 40)
        mid.producer.commit_transaction(TIMEOUT_S)
        mid.transform(mid.producer, 40, 70)
        error = mid.end_with_a_kill(role, commit)
        if error is not None and error.args[0].txn_requires_abort() and not error.args[0].fatal():
            mid.producer.abort_transaction(TIMEOUT_S)  # as its application would (a fenced one ends: its successor
            # below aborts what it left open)
        # All or nothing, its offsets with its output; a commit the client was told of is there, an abort is.
        committed = (outputs(0, 70), 70)
        aborted = (outputs(0, 40), 40)
        seen = mid.outcome() if error is None else waiting.poll(
            lambda: (lambda o: o if o in (committed, aborted) else None)(mid.outcome()), TIMEOUT_S, 0.5)
        if error is None:
            assert seen == (committed if commit else aborted), (error, node.log(3000))
        else:
            assert seen in ((committed, aborted) if commit else (aborted,)), (error, seen, node.log(3000))
        node.kill_all()
        node.start()
        assert mid.outcome() == seen
        # A new producer of the same transactional.id goes on from the committed offset to the input's end.
        successor = mid.new_producer()
        mid.transform(successor, seen[1], MID_INPUTS)
        successor.commit_transaction(TIMEOUT_S)
        assert mid.outcome() == (outputs(0, MID_INPUTS), MID_INPUTS)
    finally:
        mid.close()


def test_kafka_python_and_aiokafka_transactional_producers(node_factory):
    node = node_factory(workers=1, config=CONFIG)
    create(node.bootstrap, "pure")
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=node.bootstrap, transactional_id="kafka-python-writer")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("pure", b"kafka-python committed")
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("pure", b"kafka-python aborted")
        producer.flush()
        producer.abort_transaction()
    finally:
        producer.close(timeout=TIMEOUT_S)

    import asyncio

    from aiokafka import AIOKafkaProducer

    async def aiokafka_transactions() -> None:
        writer = AIOKafkaProducer(bootstrap_servers=node.bootstrap, transactional_id="aiokafka-writer")
        await writer.start()
        try:
            async with writer.transaction():
                await writer.send_and_wait("pure", b"aiokafka committed")
            await writer.begin_transaction()
            await writer.send_and_wait("pure", b"aiokafka aborted")
            await writer.abort_transaction()
        finally:
            await writer.stop()

    asyncio.run(asyncio.wait_for(aiokafka_transactions(), TIMEOUT_S))
    assert consume_all(node.bootstrap, "pure", "read_committed") == [b"kafka-python committed",
                                                                      b"aiokafka committed"]
    assert len(consume_all(node.bootstrap, "pure", "read_uncommitted")) == 4


FRAMEWORKS = Path(__file__).resolve().parent / "frameworks"
KAFKAJS = "kafkajs@^2.2.4"
@pytest.mark.skipif(not have_node(), reason=NODE_MISSING)
def test_kafkajs_transactions_commit_abort_and_send_offsets(node_factory):
    modules = node_modules("kafkajs", KAFKAJS)
    node = node_factory(workers=2, config=CONFIG)
    create(node.bootstrap, "kafkajs")
    create(node.bootstrap, "kafkajs-in")
    produce_numbers(node.bootstrap, "kafkajs-in", 10)
    done = subprocess.run(["node", str(FRAMEWORKS / "kafkajs_transactions.js"), node.bootstrap, "kafkajs",
                           "kafkajs-in", "kafkajs-group"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NODE_PATH": str(modules), "KAFKAJS_NO_PARTITIONER_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-5000:] + node.log(5000)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    committed = ["committed-%d" % i for i in range(5)] + ["again-%d" % i for i in range(3)] + ["end"]
    everything = committed[:5] + ["aborted-%d" % i for i in range(5)] + committed[5:]
    assert seen["committed"] == committed
    assert seen["uncommitted"] == everything  # the control records (markers) handed to no one
    assert seen["offsets"] == [4, 6]  # the aborted transaction's offset 8 never committed
    # confluent-kafka agrees on what KafkaJS committed.
    assert consume_all(node.bootstrap, "kafkajs", "read_committed") == [v.encode() for v in committed]
    assert consume_all(node.bootstrap, "kafkajs", "read_uncommitted") == [v.encode() for v in everything]
