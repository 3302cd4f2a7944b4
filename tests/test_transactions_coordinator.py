"""The transaction coordinator in one process: real partition logs, its real state log and markers, a fake outbox
and a group commit that fsyncs when the test says so. The node tests (tests/test_transactions.py) drive the same
code through real clients."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode as E

from shmbroker.node.config import NodeConfig, TransactionConfig
from shmbroker.node.storage.log import LogConfig
from shmbroker.node.storage.records import ControlType, build_batch, control_type, parse_header
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.transactions.coordinator import TransactionCoordinator
from shmbroker.node.timer.transactions.markers import MarkerWriter
from shmbroker.node.timer.transactions.metadata import TxnState
from shmbroker.node.timer.transactions.state_log import TransactionStateLog
from shmbroker.shm import messages as M
from tests.record_batches import SharedTable

pytestmark = pytest.mark.usefixtures("nothing_left_in_dev_shm")
WORKER = 0


class TimerKilled(Exception):
    """Stands for a kill -9 of the timer process at the point that raises it."""


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class Outbox:
    """Collects the coordinator's REPLYs, by request id."""

    def __init__(self) -> None:
        self.replies: dict[int, tuple] = {}

    def send(self, worker: int, frame: bytes) -> None:
        reply = M.decode(frame)
        assert reply.request_id not in self.replies, "two replies to one request"
        self.replies[reply.request_id] = reply.answer


class GroupCommit:
    """wait_flushed of the timer: flushes the rows and answers when `run()` is called (or at once if `eager`)."""

    def __init__(self, store: PartitionStore) -> None:
        self.store = store
        self.waiting: list = []
        self.eager = True
        self.fail = False

    def __call__(self, rows, offsets, deadline_ms, done, urgent: bool = False) -> None:
        self.waiting.append((rows, done))
        if self.eager:
            self.run()

    def run_one(self) -> None:
        """Only the first fsync waiting completes."""
        rows, done = self.waiting.pop(0)
        for row in rows:
            self.store.log(row).flush()
        done(True)

    def run(self) -> None:
        while self.waiting:
            rows, done = self.waiting.pop(0)
            if self.fail:
                done(False, True)
                continue
            for row in rows:
                self.store.log(row).flush()
            done(True)


class OnDisk:
    """A coordinator on a data directory; restart() builds a new one on the same files, as a timer restart does."""

    def __init__(self, tmp_path, table, config: TransactionConfig = TransactionConfig()) -> None:
        self.data_dir = str(tmp_path)
        self.table = table
        self.config = config
        self.committed_offsets: list[tuple[str, dict]] = []
        self.request_id = 0
        self.boot_id = "boot-1"  # the machine's (a restart of the machine gives a new one)
        self.start()

    def start(self) -> None:
        self.store = PartitionStore(self.data_dir, self.table, LogConfig(), 16)
        self.store.create_topics([("t", 2, {})])
        self.flushes = GroupCommit(self.store)
        self.outbox = Outbox()
        self.clock = Clock()
        wheel = NodeConfig().timer.wheel
        state_log = TransactionStateLog(self.store, self.flushes, segment_bytes=1 << 20, load_bytes_per_turn=1 << 16,
                                        write_timeout_ms=1000)
        self.coordinator = TransactionCoordinator(
            self.config, self.outbox, state_log, MarkerWriter(self.store, self.flushes, 1000), self.store,
            self.commit_offsets, lambda: False, wheel, self.clock(), 4096, clock=self.clock, boot_id=self.boot_id)
        for _ in range(100):
            self.coordinator.turn()
            if not self.coordinator.loading:
                break

    def restart(self) -> None:
        self.store.close()
        self.start()

    def state_log_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.state_log_segments())

    def state_log_segments(self) -> list:
        return sorted((Path(self.data_dir) / "__transaction_state-0").glob("*.log"))

    def power_cut(self, durable_bytes: int) -> None:
        """The timer dies and the machine loses what was not fsync'd of the state log (its tail past
        `durable_bytes`); the partitions are recovered from their files, as the supervisor does at start."""
        self.store.close()
        (segment,) = self.state_log_segments()
        os.truncate(segment, durable_bytes)
        self.store = PartitionStore(self.data_dir, self.table, LogConfig(), 16)
        self.store.recover_all()
        self.store.close()
        self.start()

    def commit_offsets(self, group, entries, done) -> None:
        self.committed_offsets.append((group, dict(entries)))
        done(True)

    def ask(self, kind: M.Kind, *values):
        """Send a request (its body after the request id and version, then its fields); the answer or None."""
        self.request_id += 1
        message = M.decode(M.encode(kind, self.request_id, 0, *values))
        self.coordinator.handlers[kind](WORKER, message)
        return self.outbox.replies.get(self.request_id)

    def init(self, transactional_id: str, timeout_ms: int = 60_000, producer: tuple[int, int] = (-1, -1)):
        """InitProducerId; `producer`: the producer's own id and epoch when it asks for a bump (KIP-360)."""
        return self.ask(M.Kind.INIT_PRODUCER_ID, timeout_ms, *producer, transactional_id)

    def add(self, transactional_id, producer, partitions=(("t", 0),)):
        topics = {}
        for topic, partition in partitions:
            topics.setdefault(topic, []).append(partition)
        answer = self.ask(M.Kind.ADD_PARTITIONS_TO_TXN, *producer, transactional_id, list(topics.items()))
        if answer is None:
            return None
        return {(topic, p): error for topic, errors in answer.topics for p, error in errors}

    def end(self, transactional_id, producer, commit: bool):
        return self.ask(M.Kind.END_TXN, *producer, commit, transactional_id)

    def produce(self, producer, sequence: int, partition: int = 0) -> None:
        batch = build_batch([(b"k", b"v%d" % sequence)], 1000, producer_id=producer[0], producer_epoch=producer[1],
                            base_sequence=sequence, transactional=True)
        self.store.log(self.store.row("t", partition)).append(batch)

    def partition(self, partition: int = 0):
        return self.store.log(self.store.row("t", partition))

    def markers(self, partition: int = 0) -> list[tuple[int, int, int]]:
        """(producer id, epoch, control type) of each marker in a partition."""
        plog = self.partition(partition)
        found, offset = [], 0
        while offset < plog.state().log_end_offset:  # segment by segment (a restart rolls a new one)
            piece = plog.read(offset, 1 << 20)
            data = b"".join(os.pread(fd, length, position) for fd, position, length in piece.ranges)
            assert data, f"nothing readable at offset {offset}"
            while data:
                header = parse_header(data)
                kind = control_type(data[:header.size], header)
                if kind is not None:
                    found.append((header.producer_id, header.producer_epoch, kind))
                offset = header.last_offset + 1
                data = data[header.size:]
        return found


@pytest.fixture
def txn(tmp_path):
    with SharedTable(rows=16) as table:
        made = OnDisk(tmp_path, table)
        yield made
        made.store.close()


def producer_of(answer) -> tuple[int, int]:
    assert answer.error == E.none
    return answer.producer_id, answer.producer_epoch


def test_init_keeps_the_producer_id_and_bumps_the_epoch(txn):
    first = producer_of(txn.init("app"))
    second = producer_of(txn.init("app"))
    assert second == (first[0], first[1] + 1)
    assert producer_of(txn.init("other"))[0] != first[0]
    assert txn.init("app", timeout_ms=10**9).error == E.invalid_transaction_timeout
    assert txn.init("").error == E.invalid_request


def test_a_committed_transaction_writes_its_markers_before_end_txn_is_answered(txn):
    producer = producer_of(txn.init("app"))
    assert txn.add("app", producer, [("t", 0), ("t", 1)]) == {("t", 0): 0, ("t", 1): 0}
    txn.produce(producer, 0, partition=0)
    txn.produce(producer, 0, partition=1)
    assert txn.partition(0).state().last_stable_offset == 0
    assert txn.end("app", producer, commit=True).error == E.none
    for partition in (0, 1):
        assert txn.markers(partition) == [(*producer, ControlType.COMMIT)]
        state = txn.partition(partition).state()
        assert state.last_stable_offset == state.high_watermark == 2
    assert txn.coordinator.transactions["app"].state == TxnState.COMPLETE_COMMIT
    assert txn.end("app", producer, commit=True).error == E.none  # a retried EndTxn
    assert txn.end("app", producer, commit=False).error == E.invalid_txn_state


def test_markers_prepare_catches_up_the_partitions_with_an_open_transaction(txn):
    """The timer's producer state lags the workers' appends; prepare() brings each partition with an open
    transaction up to its end ahead of the EndTxn (whose marker append would scan those batches), not the others."""
    producer = producer_of(txn.init("app"))
    txn.add("app", producer, [("t", 0)])
    worker = PartitionStore(txn.data_dir, txn.table, LogConfig(), 16)  # a worker's own view of the logs
    try:
        for sequence in range(5):
            worker.log(worker.row("t", 0)).append(build_batch(
                [(b"k", b"v%d" % sequence)], 1000, producer_id=producer[0], producer_epoch=producer[1],
                base_sequence=sequence, transactional=True))
        worker.log(worker.row("t", 1)).append(build_batch([(b"k", b"plain")], 1000))
    finally:
        worker.close()
    txn.coordinator.markers.prepare([txn.store.row("t", 0), txn.store.row("t", 1)])
    assert txn.partition(0)._producer_state.end_offset == txn.partition(0).state().log_end_offset == 5
    assert txn.partition(1)._producer_state is None  # no open transaction there: nothing to scan ahead
    assert txn.end("app", producer, commit=True).error == E.none
    assert txn.markers(0) == [(*producer, ControlType.COMMIT)]
    assert txn.partition(0).state().last_stable_offset == 6


def test_an_abort_lists_the_transaction_as_aborted(txn):
    producer = producer_of(txn.init("app"))
    txn.add("app", producer)
    txn.produce(producer, 0)
    assert txn.end("app", producer, commit=False).error == E.none
    assert [entry.producer_id for entry in txn.partition().aborted_transactions(0, 2)] == [producer[0]]


def test_a_new_epoch_fences_the_old_producer_and_aborts_its_transaction(txn):
    old = producer_of(txn.init("app"))
    txn.add("app", old)
    txn.produce(old, 0)
    assert txn.init("app").error == E.concurrent_transactions  # the abort of the open transaction runs first
    fenced_epoch = old[1] + 1
    assert txn.markers() == [(old[0], fenced_epoch, ControlType.ABORT)]
    new = producer_of(txn.init("app"))
    assert new[0] == old[0] and new[1] > fenced_epoch
    assert txn.add("app", old) == {("t", 0): E.producer_fenced}
    assert txn.end("app", old, commit=True).error == E.producer_fenced
    assert txn.add("app", (old[0] + 99, new[1])) == {("t", 0): E.invalid_producer_id_mapping}


def test_requests_while_a_state_write_waits_for_its_fsync_wait_for_it_in_order(txn):
    """Not CONCURRENT_TRANSACTIONS (clients retry that only after a backoff): each waits for the record before it.
    An AddPartitionsToTxn that widens an Ongoing transaction is answered once its record is appended."""
    producer = producer_of(txn.init("app"))
    txn.flushes.eager = False
    assert txn.add("app", producer, [("t", 0)]) is None  # begins the transaction: waits for the fsync
    assert txn.ask(M.Kind.ADD_OFFSETS_TO_TXN, *producer, "app", "g") is None  # waits for the first record
    assert txn.add("app", producer, [("t", 1)]) is None  # waits for the AddOffsetsToTxn record
    first, offsets, second = txn.request_id - 2, txn.request_id - 1, txn.request_id
    txn.flushes.run_one()
    assert txn.outbox.replies[first].topics == (("t", ((0, 0),)),)
    assert offsets not in txn.outbox.replies and second not in txn.outbox.replies  # the second record's fsync next
    txn.flushes.run_one()
    assert txn.outbox.replies[offsets].error == E.none
    assert txn.outbox.replies[second].topics == (("t", ((1, 0),)),)  # widens: answered once appended
    assert txn.flushes.waiting  # its record's fsync still to come
    metadata = txn.coordinator.transactions["app"]
    assert metadata.partitions == {("t", 0), ("t", 1)} and metadata.groups == {"g"}
    txn.flushes.eager = True
    assert txn.end("app", producer, commit=True).error == E.none


def test_a_request_held_behind_a_failed_state_write_is_answered(txn):
    producer = producer_of(txn.init("app"))
    txn.flushes.eager = False
    assert txn.add("app", producer, [("t", 0)]) is None
    assert txn.add("app", producer, [("t", 1)]) is None
    txn.flushes.fail = True
    txn.flushes.run()
    assert txn.outbox.replies[txn.request_id - 1].topics == (("t", ((0, E.not_coordinator),)),)
    assert txn.outbox.replies[txn.request_id].topics == (("t", ((1, E.not_coordinator),)),)
    assert txn.coordinator.transactions["app"].state == TxnState.EMPTY


def test_a_failed_state_write_changes_nothing(txn):
    producer = producer_of(txn.init("app"))
    txn.flushes.fail = True
    assert txn.add("app", producer) == {("t", 0): E.not_coordinator}
    assert txn.coordinator.transactions["app"].state == TxnState.EMPTY
    txn.flushes.fail = False
    assert txn.add("app", producer) == {("t", 0): 0}


def test_unknown_partitions_are_refused_and_nothing_is_added(txn):
    producer = producer_of(txn.init("app"))
    assert txn.add("app", producer, [("t", 0), ("nope", 0)]) == {("t", 0): E.operation_not_attempted,
                                                                     ("nope", 0): E.unknown_topic_or_partition}
    assert txn.coordinator.transactions["app"].state == TxnState.EMPTY


def test_end_txn_without_a_transaction_is_an_invalid_state(txn):
    producer = producer_of(txn.init("app"))
    assert txn.end("app", producer, commit=True).error == E.invalid_txn_state
    assert txn.end("nobody", producer, commit=True).error == E.invalid_producer_id_mapping


def test_transactional_offsets_are_committed_only_with_the_transaction(txn):
    producer = producer_of(txn.init("app"))
    assert txn.ask(M.Kind.ADD_OFFSETS_TO_TXN, *producer, "app", "g").error == E.none
    answer = txn.ask(M.Kind.TXN_OFFSET_COMMIT, *producer, -1, "app", "g", [("t", [(0, 42, -1, None)])], "", None)
    assert answer.topics == (("t", ((0, 0),)),)
    assert txn.committed_offsets == []
    assert txn.end("app", producer, commit=True).error == E.none
    assert txn.committed_offsets == [("g", {("t", 0): (42, -1, None)})]

    txn.ask(M.Kind.ADD_OFFSETS_TO_TXN, *producer, "app", "g")
    txn.ask(M.Kind.TXN_OFFSET_COMMIT, *producer, -1, "app", "g", [("t", [(0, 50, -1, None)])], "", None)
    assert txn.end("app", producer, commit=False).error == E.none
    assert len(txn.committed_offsets) == 1  # an aborted transaction's offsets are dropped


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(txn):
    producer = producer_of(txn.init("app", timeout_ms=5000))
    txn.add("app", producer)
    txn.produce(producer, 0)
    txn.clock.now += 4000
    txn.coordinator.advance(txn.clock.now)
    assert txn.coordinator.transactions["app"].state == TxnState.ONGOING
    txn.clock.now += 2000
    txn.coordinator.advance(txn.clock.now)
    assert txn.coordinator.transactions["app"].state == TxnState.COMPLETE_ABORT
    assert txn.coordinator.timed_out == 1
    assert txn.markers() == [(producer[0], producer[1] + 1, ControlType.ABORT)]
    assert txn.partition().state().first_unstable_offset == -1
    assert txn.end("app", producer, commit=True).error == E.producer_fenced


def test_state_survives_a_restart_and_an_interrupted_commit_completes(txn):
    producer = producer_of(txn.init("app"))
    txn.add("app", producer, [("t", 0), ("t", 1)])
    txn.produce(producer, 0, partition=0)
    txn.produce(producer, 0, partition=1)
    other = producer_of(txn.init("open"))
    txn.add("open", other)
    # The decision is durable, then the timer dies before any marker.
    def dies(*args):
        raise TimerKilled

    txn.coordinator.markers.write = dies
    with pytest.raises(TimerKilled):
        txn.end("app", producer, commit=True)
    txn.restart()
    assert txn.coordinator.transactions["app"].state == TxnState.COMPLETE_COMMIT
    for partition in (0, 1):
        assert txn.markers(partition) == [(*producer, ControlType.COMMIT)]
    assert txn.coordinator.transactions["open"].state == TxnState.ONGOING
    assert producer_of(txn.init("app")) == (producer[0], producer[1] + 1)


def test_an_idle_transactional_id_expires_and_starts_afresh(tmp_path):
    with SharedTable(rows=16) as table:
        txn = OnDisk(tmp_path, table, TransactionConfig(transactional_id_expiration_ms=1))
        try:
            producer = producer_of(txn.init("idle"))
            busy = producer_of(txn.init("busy"))
            txn.add("busy", busy)
            time.sleep(0.01)
            assert txn.coordinator.expire_transactional_ids() == 1  # an open transaction keeps its id
            assert "idle" not in txn.coordinator.transactions
            assert txn.add("idle", producer) == {("t", 0): E.invalid_producer_id_mapping}
            txn.restart()  # the tombstone holds
            assert "idle" not in txn.coordinator.transactions and "busy" in txn.coordinator.transactions
            assert producer_of(txn.init("idle"))[0] != producer[0]
        finally:
            txn.store.close()


def test_a_hanging_transaction_is_aborted_and_an_owned_one_is_not(txn):
    from shmbroker.node.timer.transactions.hanging import HangingTransactions

    producer = producer_of(txn.init("app"))
    txn.add("app", producer, [("t", 0)])
    txn.produce(producer, 0, partition=0)
    txn.produce(producer, 0, partition=1)  # never added: no marker of the coordinator will close it
    hanging = HangingTransactions(txn.store, txn.coordinator.owns, grace_ms=1000, clock=txn.clock)
    assert hanging.sweep() == 0  # first seen now
    txn.clock.now += 2000
    assert hanging.sweep() == 1  # t-0 is the coordinator's (Ongoing): only t-1 is aborted
    assert txn.markers(1) == [(*producer, ControlType.ABORT)] and txn.markers(0) == []
    assert txn.partition(1).state().first_unstable_offset == -1
    assert txn.partition(0).state().first_unstable_offset == 0
    assert txn.end("app", producer, commit=True).error == E.none
    assert hanging.sweep() == 0


def test_an_exhausted_epoch_gets_a_new_producer_id(txn):
    producer = producer_of(txn.init("app"))
    txn.coordinator.transactions["app"].producer_epoch = 32766  # as after 32,766 inits
    renewed = producer_of(txn.init("app"))
    assert renewed[0] != producer[0] and renewed[1] == 0


def test_a_producer_naming_itself_bumps_its_epoch_and_a_retry_of_the_bump_gets_the_same_epoch(txn):
    first = producer_of(txn.init("app"))
    bumped = producer_of(txn.init("app", producer=first))
    assert bumped == (first[0], first[1] + 1)
    assert producer_of(txn.init("app", producer=first)) == bumped  # its answer was lost: the same epoch again
    txn.restart()  # the epoch before the bump is kept in the state log
    assert producer_of(txn.init("app", producer=first)) == bumped
    again = producer_of(txn.init("app", producer=bumped))
    assert again == (first[0], first[1] + 2)
    assert txn.init("app", producer=first).error == E.producer_fenced  # neither the current nor the last epoch
    assert txn.init("app", producer=(first[0] + 1000, again[1])).error == E.producer_fenced  # another producer id
    fenced_by_new_instance = producer_of(txn.init("app"))  # a new instance: a fencing bump forgets the last epoch
    assert txn.init("app", producer=again).error == E.producer_fenced
    assert producer_of(txn.init("app", producer=fenced_by_new_instance))[1] == fenced_by_new_instance[1] + 1


def test_a_producer_naming_itself_with_an_exhausted_epoch_gets_a_new_producer_id_and_so_does_its_retry(txn):
    producer_of(txn.init("app"))
    txn.coordinator.transactions["app"].producer_epoch = 32766  # as after 32,766 bumps
    old = (txn.coordinator.transactions["app"].producer_id, 32766)
    renewed = producer_of(txn.init("app", producer=old))
    assert renewed[0] != old[0] and renewed[1] == 0
    assert producer_of(txn.init("app", producer=old)) == renewed  # a retry under the old id
    assert txn.init("app", producer=(old[0], 5)).error == E.producer_fenced


def test_offsets_outside_a_transaction_are_an_invalid_state(txn):
    producer = producer_of(txn.init("app"))
    answer = txn.ask(M.Kind.TXN_OFFSET_COMMIT, *producer, -1, "app", "g", [("t", [(0, 1, -1, None)])], "", None)
    assert answer.topics == (("t", ((0, int(E.invalid_txn_state)),)),)
    assert txn.ask(M.Kind.ADD_OFFSETS_TO_TXN, *producer, "app", "").error == E.invalid_group_id


def test_end_txn_is_answered_once_its_markers_are_visible_and_the_next_transaction_waits_for_them(txn):
    producer = producer_of(txn.init("app"))
    txn.add("app", producer)
    txn.produce(producer, 0)
    txn.flushes.eager = False
    assert txn.end("app", producer, commit=True) is None  # the records' fsync, then the decision's
    end_request = txn.request_id
    txn.flushes.run_one()  # the records are durable: the decision is written
    assert end_request not in txn.outbox.replies
    txn.flushes.run_one()  # the decision is durable: the markers are appended, EndTxn answered
    assert txn.outbox.replies[end_request].error == E.none
    assert txn.markers() == [(*producer, ControlType.COMMIT)]
    assert txn.partition().state().last_stable_offset == txn.partition().state().high_watermark
    assert txn.add("app", producer) is None  # the next transaction waits for the markers' fsync, not refused
    txn.flushes.run()
    assert txn.outbox.replies[txn.request_id].topics == (("t", ((0, 0),)),)
    assert txn.coordinator.transactions["app"].state == TxnState.ONGOING


def test_an_unreadable_state_record_is_skipped_and_the_rest_loads(txn):
    producer = producer_of(txn.init("app"))
    plog = txn.store.log(txn.coordinator.state_log.row)
    plog.append(build_batch([(b'["broken"]', b"{not json"), (b"not a key", b"{}")], 1000))
    txn.restart()
    assert txn.coordinator.transactions["app"].producer_id == producer[0]
    assert "broken" not in txn.coordinator.transactions


def completing(txn, transactional_id: str = "app"):
    """A producer whose committed transaction's EndTxn is answered, its markers' fsync not yet done."""
    producer = producer_of(txn.init(transactional_id))
    txn.add(transactional_id, producer)
    txn.produce(producer, 0)
    txn.flushes.eager = False
    assert txn.end(transactional_id, producer, commit=True) is None
    txn.flushes.run_one()  # the records
    txn.flushes.run_one()  # the decision: EndTxn answered, the markers appended and waiting for their fsync
    assert txn.outbox.replies[txn.request_id].error == E.none
    assert transactional_id in txn.coordinator.completing
    return producer


@pytest.fixture
def bounded(tmp_path):
    with SharedTable(rows=16) as table:
        made = OnDisk(tmp_path, table, TransactionConfig(held_requests_per_id=2, held_request_max_ms=500))
        yield made
        made.store.close()


def test_held_requests_beyond_the_per_id_bound_get_concurrent_transactions(bounded):
    producer = completing(bounded)
    assert bounded.add("app", producer) is None  # held
    first = bounded.request_id
    assert bounded.ask(M.Kind.ADD_OFFSETS_TO_TXN, *producer, "app", "g") is None  # held
    second = bounded.request_id
    assert bounded.add("app", producer, [("t", 1)]) == {("t", 1): E.concurrent_transactions}  # a third: refused
    bounded.flushes.run()  # the completion is durable: the held requests run, in order
    assert bounded.outbox.replies[first].topics == (("t", ((0, 0),)),)
    assert bounded.outbox.replies[second].error == E.none
    metadata = bounded.coordinator.transactions["app"]
    assert metadata.state == TxnState.ONGOING and metadata.partitions == {("t", 0)} and metadata.groups == {"g"}
    assert (bounded.coordinator.held.held, bounded.coordinator.held.refused) == (2, 1)


def test_a_request_held_past_its_hold_time_gets_concurrent_transactions(bounded):
    producer = completing(bounded)
    assert bounded.add("app", producer) is None
    early = bounded.request_id
    bounded.clock.now += 300
    assert bounded.end("app", producer, commit=True) is None  # a retried EndTxn, held 300 ms after the first
    late = bounded.request_id
    bounded.clock.now += 250  # the first has waited 550 ms, past its 500
    bounded.coordinator.advance(bounded.clock.now)
    assert bounded.outbox.replies[early].topics == (("t", ((0, int(E.concurrent_transactions)),)),)
    assert late not in bounded.outbox.replies  # still within its hold time
    bounded.flushes.run()  # the completion is durable: the one still held runs (and is answered once)
    assert bounded.outbox.replies[late].error == E.none  # the retried EndTxn of the committed transaction
    assert bounded.coordinator.transactions["app"].state == TxnState.COMPLETE_COMMIT
    bounded.clock.now += 1000
    bounded.coordinator.advance(bounded.clock.now)  # nothing is answered twice (the Outbox asserts it)
    assert bounded.coordinator.held.next_expiration() is None and len(bounded.coordinator.held) == 0
    bounded.flushes.eager = True
    assert bounded.add("app", producer) == {("t", 0): 0}  # nothing completing: answered at once


def test_without_holding_every_request_of_a_completing_id_gets_concurrent_transactions(tmp_path):
    with SharedTable(rows=16) as table:
        txn = OnDisk(tmp_path, table, TransactionConfig(held_requests_per_id=0))
        try:
            producer = completing(txn)
            concurrent = int(E.concurrent_transactions)
            assert txn.add("app", producer) == {("t", 0): concurrent}
            assert txn.ask(M.Kind.ADD_OFFSETS_TO_TXN, *producer, "app", "g").error == concurrent
            assert txn.end("app", producer, commit=True).error == concurrent
            answer = txn.ask(M.Kind.TXN_OFFSET_COMMIT, *producer, -1, "app", "g", [("t", [(0, 42, -1, None)])], "",
                             None)
            assert answer.topics == (("t", ((0, concurrent),)),)
            assert tuple(txn.init("app")) == (concurrent, -1, -1)
            txn.flushes.run()
            txn.flushes.eager = True
            assert txn.add("app", producer) == {("t", 0): 0}
        finally:
            txn.store.close()


def test_the_held_request_bounds_are_validated():
    with pytest.raises(ValueError):
        TransactionConfig(held_requests_per_id=-1)
    with pytest.raises(ValueError):
        TransactionConfig(held_request_max_ms=0)


def test_a_lost_add_partitions_record_of_an_ongoing_transaction_is_given_back_at_start(txn):
    """AddPartitionsToTxn answered, the producer's records acknowledged in that partition, the record lost: the
    partition joins the recovered Ongoing transaction, and its commit marks it."""
    producer = producer_of(txn.init("app"))
    txn.add("app", producer, [("t", 0)])
    txn.produce(producer, 0, partition=0)
    durable = txn.state_log_bytes()
    txn.flushes.eager = False
    assert txn.add("app", producer, [("t", 1)]) == {("t", 1): E.none}  # answered before its fsync
    txn.produce(producer, 0, partition=1)
    txn.partition(1).flush()  # acks=all: the records are durable
    assert txn.state_log_bytes() > durable
    txn.power_cut(durable)
    metadata = txn.coordinator.transactions["app"]
    assert metadata.state == TxnState.ONGOING and metadata.partitions == {("t", 0), ("t", 1)}
    assert txn.end("app", producer, commit=True).error == E.none
    for partition in (0, 1):
        assert txn.markers(partition) == [(*producer, ControlType.COMMIT)]
        state = txn.partition(partition).state()
        assert state.last_stable_offset == state.high_watermark == 2


def test_a_partition_written_without_add_partitions_is_aborted_at_start_and_its_producer_fenced(txn):
    """A client that wrote to a partition it never added, in the epoch the coordinator has, its id between
    transactions: the transaction was never the coordinator's, so it is aborted at start (not only by the hanging
    sweep, much later), and the producer is fenced (it could otherwise commit a transaction that lacks the
    partition)."""
    producer = producer_of(txn.init("app"))
    txn.add("app", producer, [("t", 0)])
    txn.produce(producer, 0, partition=0)
    assert txn.end("app", producer, commit=True).error == E.none
    txn.produce(producer, 0, partition=1)  # never added
    txn.restart()
    assert txn.markers(1) == [(producer[0], producer[1] + 1, ControlType.ABORT)]
    state = txn.partition(1).state()
    assert state.last_stable_offset == state.high_watermark == 2
    assert txn.coordinator.transactions["app"].state == TxnState.COMPLETE_ABORT
    assert txn.add("app", producer, [("t", 0)]) == {("t", 0): E.producer_fenced}
    assert txn.end("app", producer, commit=True).error == E.producer_fenced
    assert txn.coordinator.reconciled == 1
    txn.restart()  # nothing left to reconcile
    assert txn.coordinator.reconciled == 0 and txn.markers(1) == [(producer[0], producer[1] + 1, ControlType.ABORT)]


def test_the_add_partitions_that_begins_a_transaction_is_durable_with_the_previous_completion(txn):
    """A commit's Complete* record is never waited for; had it been lost with the next transaction's records, a
    restart would complete the commit again and its COMMIT markers would close the next transaction's records in
    a partition both wrote to. So the AddPartitionsToTxn that begins a transaction waits for its fsync (and that
    of every record before it), and only the later ones, lost, are given back at start."""
    producer = producer_of(txn.init("app"))
    txn.add("app", producer, [("t", 0)])
    txn.produce(producer, 0, partition=0)
    txn.flushes.eager = False
    assert txn.end("app", producer, commit=True) is None
    txn.flushes.run()  # the decision, then the markers: answered, its CompleteCommit record appended
    assert txn.outbox.replies[txn.request_id].error == E.none
    assert txn.add("app", producer, [("t", 1)]) is None  # begins the next one: waits for the fsync
    txn.flushes.run_one()
    assert txn.outbox.replies[txn.request_id].topics == (("t", ((1, 0),)),)
    txn.flushes.run()
    durable = txn.state_log_bytes()
    txn.produce(producer, 1, partition=1)
    assert txn.add("app", producer, [("t", 0)]) == {("t", 0): E.none}  # widens: answered once appended
    txn.produce(producer, 1, partition=0)  # the partition the commit marked too
    for partition in (0, 1):
        txn.partition(partition).flush()
    assert txn.state_log_bytes() > durable
    txn.power_cut(durable)  # loses the widening record only
    metadata = txn.coordinator.transactions["app"]
    assert metadata.state == TxnState.ONGOING and metadata.partitions == {("t", 0), ("t", 1)}
    assert txn.markers(0) == [(*producer, ControlType.COMMIT)]  # not completed again
    assert txn.end("app", producer, commit=True).error == E.none
    assert txn.markers(0) == [(*producer, ControlType.COMMIT)] * 2 and txn.markers(1) == [(*producer, ControlType.COMMIT)]
    for partition in (0, 1):
        state = txn.partition(partition).state()
        assert state.last_stable_offset == state.high_watermark


def test_a_commit_is_decided_only_once_its_records_are_durable(txn):
    producer = producer_of(txn.init("app"))
    assert txn.add("app", producer, (("t", 0), ("t", 1))) == {("t", 0): E.none, ("t", 1): E.none}
    txn.produce(producer, 0, partition=0)
    txn.produce(producer, 0, partition=1)
    txn.flushes.eager = False
    state_log_before = txn.state_log_bytes()
    assert txn.end("app", producer, commit=True) is None
    # The first fsync asked for is that of the transaction's partitions, up to their log ends; no decision yet.
    rows, _ = txn.flushes.waiting[0]
    assert sorted(rows) == sorted(txn.store.row("t", p) for p in (0, 1))
    assert txn.state_log_bytes() == state_log_before
    assert txn.coordinator.transactions["app"].state == TxnState.ONGOING
    assert txn.add("app", producer, (("t", 0),)) is None  # the id's next request waits meanwhile
    txn.flushes.run_one()
    assert txn.state_log_bytes() > state_log_before  # now the PrepareCommit
    txn.flushes.run()
    assert txn.outbox.replies[txn.request_id - 1].error == E.none
    assert txn.markers(0) == txn.markers(1) == [(*producer, ControlType.COMMIT)]


def test_an_abort_does_not_wait_for_its_records(txn):
    producer = producer_of(txn.init("app"))
    txn.add("app", producer)
    txn.produce(producer, 0)
    txn.flushes.eager = False
    state_log_before = txn.state_log_bytes()
    assert txn.end("app", producer, commit=False) is None
    assert txn.state_log_bytes() > state_log_before  # the PrepareAbort is written at once
    rows, _ = txn.flushes.waiting[0]
    assert rows == [txn.coordinator.state_log.row]


def test_a_commit_whose_records_cannot_be_made_durable_stays_open_and_may_be_retried(txn):
    producer = producer_of(txn.init("app"))
    txn.add("app", producer)
    txn.produce(producer, 0)
    txn.flushes.fail = True
    assert txn.end("app", producer, commit=True).error == E.not_coordinator  # a storage fault: clients retry
    assert txn.coordinator.transactions["app"].state == TxnState.ONGOING
    assert not txn.coordinator.transactions["app"].pending
    txn.flushes.fail = False
    assert txn.end("app", producer, commit=True).error == E.none
    assert txn.markers() == [(*producer, ControlType.COMMIT)]


def test_a_transaction_begun_before_the_machine_restarted_is_aborted_at_load_its_producer_fenced(txn):
    producer = producer_of(txn.init("app"))
    txn.add("app", producer)
    txn.produce(producer, 0)
    txn.boot_id = "boot-2"  # the machine restarted: records answered from its page cache may be gone
    txn.restart()
    assert txn.coordinator.transactions["app"].state == TxnState.COMPLETE_ABORT
    assert txn.markers() == [(producer[0], producer[1] + 1, ControlType.ABORT)]
    assert txn.partition().state().first_unstable_offset == -1
    assert txn.end("app", producer, commit=True).error == E.producer_fenced
    assert producer_of(txn.init("app"))[1] == producer[1] + 2  # the application starts again


def test_a_transaction_of_a_version_before_boot_ids_gets_this_boots_at_load_and_a_machine_restart_aborts_it(txn):
    txn.boot_id = ""  # the coordinator of an older version kept no boot id
    txn.restart()
    producer = producer_of(txn.init("app"))
    txn.add("app", producer)
    txn.produce(producer, 0)
    assert txn.coordinator.transactions["app"].boot_id == ""
    txn.boot_id = "boot-1"
    txn.restart()  # the upgrade: a restart of the node on the same boot
    assert txn.coordinator.transactions["app"].state == TxnState.ONGOING
    assert txn.coordinator.transactions["app"].boot_id == "boot-1"
    txn.produce(producer, 1)  # answered once appended now
    txn.boot_id = "boot-2"
    txn.restart()  # the machine restarted
    assert txn.coordinator.transactions["app"].state == TxnState.COMPLETE_ABORT
    assert txn.markers() == [(producer[0], producer[1] + 1, ControlType.ABORT)]
    assert txn.end("app", producer, commit=True).error == E.producer_fenced


def test_a_transaction_goes_on_across_a_restart_of_the_node_on_the_same_boot(txn):
    producer = producer_of(txn.init("app"))
    txn.add("app", producer)
    txn.produce(producer, 0)
    txn.restart()  # a process restart: the page cache kept every record
    assert txn.coordinator.transactions["app"].state == TxnState.ONGOING
    assert txn.coordinator.transactions["app"].boot_id == "boot-1"
    assert txn.end("app", producer, commit=True).error == E.none
    assert txn.markers() == [(*producer, ControlType.COMMIT)]
