"""Transactions in storage: transactional and control batches, open transactions and the last stable offset,
the aborted-transaction index, read_committed reads, and all of it across recovery."""

from __future__ import annotations

import os

import orjson
import pytest
from kafka.record.default_records import DefaultRecordBatch

from shmbroker.node.storage.log import LogConfig, PartitionLog
from shmbroker.node.storage.formats import NewerFormat
from shmbroker.node.storage.producer_state import (PRODUCER_SNAPSHOT_FORMAT, ProducerStateTable, load_latest_snapshot,
                                                   snapshot_name)
from shmbroker.node.storage.records import (ControlType, ErrorCode, StorageError, build_batch, build_control_batch,
                                            control_type, parse_header, validate_client_batch)
from shmbroker.node.storage.txn_index import ENTRY, AbortedTransaction, TransactionIndex, collect_aborted
from tests.record_batches import SharedTable

SMALL = LogConfig(segment_bytes=4_000, index_interval_bytes=500, index_max_bytes=4096)

pytestmark = pytest.mark.usefixtures("nothing_left_in_dev_shm")


def txn_batch(producer_id: int, sequence: int, count: int = 2, epoch: int = 0, tag: bytes = b"v") -> bytes:
    records = [(b"k%d" % i, tag + b"%d" % (sequence + i)) for i in range(count)]
    return build_batch(records, 1000, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                       transactional=True)


def plain_batch(count: int = 2) -> bytes:
    return build_batch([(b"k", b"plain")] * count, 1000)


class OpenLog:
    """A fresh partition log in a temp dir, as recovery opens it; reopen() recovers it again."""

    def __init__(self, tmp_path, config: LogConfig = SMALL):
        self.directory = str(tmp_path / "t-0")
        self.config = config
        self._table = SharedTable()
        self.table = self._table.__enter__()
        self.log = PartitionLog.recover(self.directory, self.table, 0, config)

    def reopen(self) -> PartitionLog:
        self.log.close()
        self.log = PartitionLog.recover(self.directory, self.table, 0, self.config)
        return self.log

    def close(self) -> None:
        self.log.close()
        self._table.__exit__(None, None, None)


@pytest.fixture
def plog(tmp_path):
    opened = OpenLog(tmp_path)
    yield opened
    opened.close()


def fetched_batches(log: PartitionLog, offset: int, committed: bool) -> list:
    piece = log.read(offset, 1 << 20, committed=committed)
    data = b"".join(os.pread(fd, length, position) for fd, position, length in piece.ranges)
    headers = []
    while data:
        header = parse_header(data)
        headers.append(header)
        data = data[header.size:]
    return headers


# Records --------------------------------------------------------------------------------------------


def test_a_control_batch_is_kafkas_marker_as_kafka_python_reads_it():
    batch = build_control_batch(9, 3, ControlType.ABORT, 5, 1234)
    header = parse_header(batch)
    assert len(batch) == 78  # Kafka's EndTransactionMarker batch
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9, 3, -1)
    assert control_type(batch) == ControlType.ABORT
    parsed = DefaultRecordBatch(batch)
    assert parsed.is_control_batch and parsed.is_transactional and parsed.validate_crc()
    (record,) = list(parsed)
    assert (record.key, record.value) == (b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x05")


def test_clients_may_send_transactional_batches_with_a_producer_id_but_never_control_batches():
    assert validate_client_batch(txn_batch(4, 0), 1 << 20).producer_id == 4
    without_producer = build_batch([(b"k", b"v")], 1000, transactional=True)
    for batch in (without_producer, build_control_batch(4, 0, ControlType.COMMIT, 0, 1000)):
        with pytest.raises(StorageError) as caught:
            validate_client_batch(batch, 1 << 20)
        assert caught.value.error_code == ErrorCode.INVALID_RECORD


# Producer state ------------------------------------------------------------------------------------


def test_producer_state_tracks_open_transactions_and_survives_a_snapshot():
    state = ProducerStateTable()
    state.apply(1, 0, 0, 1, 10, 11, 100, transactional=True)
    state.apply(2, 0, 0, 0, 12, 12, 100, transactional=True)
    state.apply(1, 0, 2, 3, 13, 14, 100, transactional=True)
    assert state.first_unstable_offset() == 10
    again = ProducerStateTable.from_bytes(state.to_bytes())
    assert again.open_transactions() == {1: 10, 2: 12}
    assert state.apply_marker(1, 0, False, 15, 100) == (1, 10, 15, False)
    assert state.first_unstable_offset() == 12
    assert state.apply_marker(1, 0, False, 16, 100) is None  # nothing open: a partition never written to
    state.expire(now_ms=10**9, expiration_ms=1)
    assert 2 in state.producers and 1 not in state.producers  # an open transaction keeps its producer
    assert state.check(1, 0, 4, 4) is None


def test_a_marker_keeps_sequences_within_an_epoch_and_an_older_epochs_marker_is_refused():
    state = ProducerStateTable()
    state.apply(1, 2, 0, 1, 0, 1, 100, transactional=True)
    state.apply_marker(1, 2, False, 2, 100)
    assert state.check(1, 2, 2, 3) is None  # the next transaction continues the sequence
    with pytest.raises(StorageError) as caught:
        state.check(1, 2, 5, 6)
    assert caught.value.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    with pytest.raises(StorageError) as caught:
        state.check_marker(1, 1)
    assert caught.value.error_code == ErrorCode.INVALID_PRODUCER_EPOCH


def test_a_snapshot_from_before_transactions_still_loads():
    old = b'{"end_offset":5,"producers":[[7,1,100,[[0,4,0,4,100]]]]}'
    state = ProducerStateTable.from_bytes(old)
    assert state.producers[7].open_transaction_from == -1 and state.first_unstable_offset() == -1


def test_a_snapshot_names_its_format_and_one_of_a_newer_format_is_refused_not_skipped(tmp_path):
    state = ProducerStateTable.from_bytes(b'{"end_offset":5,"producers":[[7,1,100,[[0,4,0,4,100]]]]}')
    assert orjson.loads(state.to_bytes())["format"] == PRODUCER_SNAPSHOT_FORMAT
    assert ProducerStateTable.from_bytes(state.to_bytes()).producers[7].epoch == 1
    newer = orjson.loads(state.to_bytes()) | {"format": PRODUCER_SNAPSHOT_FORMAT + 1}
    with pytest.raises(NewerFormat):
        ProducerStateTable.from_bytes(orjson.dumps(newer))
    (tmp_path / snapshot_name(5)).write_bytes(orjson.dumps(newer))
    # Skipped, it would be rebuilt from the log and overwritten in this node's older format.
    with pytest.raises(NewerFormat, match=f"{snapshot_name(5)} is format {PRODUCER_SNAPSHOT_FORMAT + 1}"):
        load_latest_snapshot(str(tmp_path), 10)


# The aborted-transaction index --------------------------------------------------------------------


def test_the_index_drops_stale_entries_and_torn_tails(tmp_path):
    index = TransactionIndex(str(tmp_path / "0.txnindex"), create=True)
    try:
        index.append(AbortedTransaction(1, 0, 5, 6))
        index.append(AbortedTransaction(2, 3, 9, 10))
        with open(index.path, "ab") as torn:
            torn.write(b"\x00" * (ENTRY.size // 2))
        assert index.entries() == (AbortedTransaction(1, 0, 5, 6), AbortedTransaction(2, 3, 9, 10))
        index.append(AbortedTransaction(3, 7, 9, 10))  # a killed writer's entry at 9 is replaced
        assert [entry.producer_id for entry in index.entries()] == [1, 3]
        assert os.path.getsize(index.path) == 2 * ENTRY.size
        assert collect_aborted([(index, False)], 6, 20, log_end=20) == [AbortedTransaction(3, 7, 9, 10)]
        assert collect_aborted([(index, False)], 0, 20, log_end=9) == [AbortedTransaction(1, 0, 5, 6)]
        index.truncate_from(0)
        assert index.entries() == ()
    finally:
        index.close()


# The log ------------------------------------------------------------------------------------------


def test_open_transactions_hold_the_lso_and_markers_release_it(plog):
    log = plog.log
    log.append(txn_batch(1, 0))  # 0-1
    log.append(plain_batch())  # 2-3
    log.append(txn_batch(2, 0))  # 4-5
    assert (log.state().last_stable_offset, log.state().high_watermark) == (0, 6)
    assert log.append_marker(1, 0, ControlType.COMMIT, 0).base_offset == 6
    assert log.state().last_stable_offset == 4
    log.append_marker(2, 0, ControlType.ABORT, 0)  # 7
    state = log.state()
    assert state.last_stable_offset == state.high_watermark == 8
    assert log.aborted_transactions(0, 8) == [AbortedTransaction(2, 4, 7, 8)]
    assert log.aborted_transactions(8, 8) == []


def test_read_committed_stops_before_the_first_open_transaction(plog):
    log = plog.log
    log.append(plain_batch())  # 0-1
    log.append(txn_batch(1, 0))  # 2-3
    log.append(plain_batch())  # 4-5
    committed = fetched_batches(log, 0, committed=True)
    assert [header.base_offset for header in committed] == [0]
    assert [header.base_offset for header in fetched_batches(log, 0, committed=False)] == [0, 2, 4]
    assert fetched_batches(log, 4, committed=True) == []
    assert log.read(0, 1 << 20, committed=True).last_stable_offset == 2
    log.append_marker(1, 0, ControlType.COMMIT, 0)
    assert [header.base_offset for header in fetched_batches(log, 0, committed=True)] == [0, 2, 4, 6]


def test_a_marker_of_an_older_epoch_is_refused(plog):
    log = plog.log
    log.append(txn_batch(1, 0, epoch=3))
    with pytest.raises(StorageError) as caught:
        log.append_marker(1, 2, ControlType.ABORT, 0)
    assert caught.value.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    log.append_marker(1, 4, ControlType.ABORT, 0)  # the coordinator's bumped epoch aborts it
    assert log.state().first_unstable_offset == -1


def test_another_process_view_of_the_partition_catches_up_on_transactions(plog):
    log = plog.log
    other = PartitionLog(plog.directory, plog.table, 0, SMALL)
    try:
        log.append(txn_batch(1, 0))  # 0-1
        other.append(txn_batch(2, 0))  # 2-3: other catches up on producer 1's open transaction
        assert other.state().first_unstable_offset == 0
        log.append_marker(1, 0, ControlType.ABORT, 0)  # 4
        assert log.state().first_unstable_offset == 2
        other.append_marker(2, 0, ControlType.COMMIT, 0)  # 5
        assert other.state().first_unstable_offset == -1
        assert other.aborted_transactions(0, 6) == [AbortedTransaction(1, 0, 4, 2)]
    finally:
        other.close()


def test_recovery_keeps_open_transactions_and_rebuilds_lost_indexes(plog):
    log = plog.log
    for round_ in range(40):  # many segments; each round: producer 1 aborts, producer 2 stays open
        log.append(txn_batch(1, 2 * round_, tag=b"x" * 50))
        log.append_marker(1, 0, ControlType.ABORT, 0)
    log.append(txn_batch(2, 0))
    log.write_producer_snapshot()
    expected = log.aborted_transactions(0, log.state().high_watermark)
    assert len(expected) == 40 and len(log.segments) >= 3
    first_unstable = log.state().first_unstable_offset
    assert first_unstable >= 0

    log = plog.reopen()
    assert log.state().first_unstable_offset == first_unstable
    assert log.aborted_transactions(0, log.state().high_watermark) == expected

    os.unlink(log.segments[1].txn_index_path)
    with open(log.segments[-1].txn_index_path, "ab") as torn:
        torn.write(b"\x01\x02\x03")
    log = plog.reopen()
    assert log.state().first_unstable_offset == first_unstable
    assert log.aborted_transactions(0, log.state().high_watermark) == expected
    log.append_marker(2, 0, ControlType.COMMIT, 0)
    assert log.state().last_stable_offset == log.state().high_watermark


def test_a_cleaning_keeps_the_markers_and_carries_the_aborted_transactions(tmp_path):
    from shmbroker.node.storage import cleaner as C

    compacted = LogConfig(cleanup_policy="compact", segment_bytes=1_500, index_interval_bytes=500,
                          index_max_bytes=4096, min_cleanable_dirty_ratio=0.0)
    opened = OpenLog(tmp_path, compacted)
    try:
        log = opened.log
        for round_ in range(30):  # the same keys again and again: most records are superseded
            log.append(txn_batch(1, 2 * round_, tag=b"x" * 40))
            log.append_marker(1, 0, ControlType.ABORT if round_ % 3 == 0 else ControlType.COMMIT, 0)
        log.roll()
        expected = log.aborted_transactions(0, log.state().high_watermark)
        assert len(expected) == 10
        result = C.Cleaner(C.CleanerConfig(io_max_bytes_per_second=-1, io_buffer_bytes=4096)).clean(log)
        assert result.swapped and result.segments_replaced > 1
        assert log.aborted_transactions(0, log.state().high_watermark) == expected
        headers, offset = [], 0
        while offset < log.state().high_watermark:
            headers += fetched_batches(log, offset, committed=False)
            offset = headers[-1].last_offset + 1
        assert len([header for header in headers if header.attributes & 0x20]) == 30  # every marker stays
        log = opened.reopen()  # recovery keeps them too
        assert log.aborted_transactions(0, log.state().high_watermark) == expected
    finally:
        opened.close()


def values_of(log: PartitionLog) -> list[bytes]:
    """Every record value of the log, through the fetch path (read_uncommitted)."""
    values, offset = [], log.state().log_start_offset
    while offset < log.state().high_watermark:
        piece = log.read(offset, 1 << 20)
        data = b"".join(os.pread(fd, length, position) for fd, position, length in piece.ranges)
        for batch in record_batches(data):
            values.extend(record.value for record in batch if not batch.is_control_batch)
            offset = batch.base_offset + batch.last_offset_delta + 1
    return values


def record_batches(data: bytes):
    while data:
        header = parse_header(data)
        yield DefaultRecordBatch(data[:header.size])
        data = data[header.size:]


def test_an_aborted_update_never_supersedes_a_committed_one_and_open_transactions_stay(tmp_path):
    from shmbroker.node.storage import cleaner as C

    compacted = LogConfig(cleanup_policy="compact", segment_bytes=100_000, index_interval_bytes=500,
                          index_max_bytes=4096, min_cleanable_dirty_ratio=0.0)
    opened = OpenLog(tmp_path, compacted)
    clean = C.Cleaner(C.CleanerConfig(io_max_bytes_per_second=-1, io_buffer_bytes=4096)).clean
    try:
        log = opened.log

        def write(producer_id: int, sequence: int, value: bytes, control: int | None) -> None:
            log.append(build_batch([(b"key", value)], 1000, producer_id=producer_id, producer_epoch=0,
                                   base_sequence=sequence, transactional=True))
            if control is not None:
                log.append_marker(producer_id, 0, control, 0)

        write(1, 0, b"committed", ControlType.COMMIT)
        write(2, 0, b"aborted", ControlType.ABORT)
        log.roll()
        write(3, 0, b"undecided", None)
        log.roll()
        write(1, 1, b"later", ControlType.COMMIT)
        log.roll()
        assert clean(log).swapped
        # The aborted record went without removing the committed one; the open transaction's segment and what
        # follows it were not cleaned.
        assert values_of(log) == [b"committed", b"undecided", b"later"]
        log.append_marker(3, 0, ControlType.COMMIT, 0)
        log.roll()
        assert clean(log).swapped
        assert values_of(log) == [b"later"]
    finally:
        opened.close()


def test_a_read_committed_long_poll_waits_for_the_lso_to_move(plog):
    from shmbroker.shm.fetch_condition import FetchCondition

    log = plog.log
    log.append(txn_batch(1, 0))
    state = log.state()
    committed = FetchCondition([(0, state.end_bytes, state.last_stable_offset)], 1)
    uncommitted = FetchCondition([(0, state.end_bytes, -1)], 1)
    log.append(txn_batch(1, 2))  # the open transaction grows: nothing new below the LSO
    assert uncommitted.satisfied(plog.table) and not committed.satisfied(plog.table)
    log.append_marker(1, 0, ControlType.COMMIT, 0)
    assert committed.satisfied(plog.table)
    state = log.state()
    without_transactions = FetchCondition([(0, state.end_bytes, state.last_stable_offset)], 1)
    log.append(plain_batch())  # nothing open: every append moves the LSO
    assert without_transactions.satisfied(plog.table)


def test_an_entry_a_killed_marker_writer_left_never_counts(plog):
    log = plog.log
    log.append(txn_batch(1, 0))  # 0-1
    end = log.state().log_end_offset
    # The writer of an ABORT marker at `end` wrote its index entry, then died before publishing the marker.
    log.segments[-1].txn_index().append(AbortedTransaction(1, 0, end, end + 1))
    assert log.aborted_transactions(0, 10) == []  # past the log end: unseen
    log.append(plain_batch())  # another batch takes that offset
    log.roll()
    assert log.aborted_transactions(0, 10) == []  # not producer 1's ABORT marker: still unseen
    log.append_marker(1, 0, ControlType.ABORT, 0)
    assert log.aborted_transactions(0, 10) == [AbortedTransaction(1, 0, end + 2, end + 3)]


def test_after_recovery_another_process_catches_up_on_the_markers_too(plog):
    log = plog.log
    log.append(txn_batch(1, 0))  # 0-1
    log.write_producer_snapshot()  # a snapshot with the transaction open
    log.append(plain_batch())  # 2-3
    log.append_marker(1, 0, ControlType.COMMIT, 0)  # 4: the newest batch with a producer id
    log = plog.reopen()
    assert log.state().producer_batches_end == 5
    worker = PartitionLog(plog.directory, plog.table, 0, SMALL)  # another process's view, from the snapshot
    try:
        worker.append(txn_batch(2, 0))  # 5-6
        assert worker.state().first_unstable_offset == 5  # producer 1's transaction is closed in its view too
    finally:
        worker.close()


def test_a_process_behind_the_log_start_takes_the_producer_state_as_of_the_deletion_not_its_stale_one(plog):
    """DeleteRecords moved the log start past what another process's producer state had seen: the batches between
    (a marker that closed a transaction among them) are no longer its to read. It must not keep that transaction
    open: it would publish the LSO back at that closed transaction (read_committed readers stalled) and index a
    later abort from the stale first offset. Found by Kafka Streams (exactly_once_v2), which purges its repartition topics
    with DeleteRecords: a read_committed fetch was answered an LSO of 38 after one of 92."""
    log = plog.log  # the timer's view, say
    other = PartitionLog(plog.directory, plog.table, 0, SMALL)  # a worker's
    try:
        log.append(txn_batch(1, 0))  # 0-1: producer 1's transaction
        other.append(txn_batch(2, 0))  # 2-3: `other` caught up: producer 1's transaction is open in its view
        log.append_marker(1, 0, ControlType.COMMIT, 0)  # 4
        log.append_marker(2, 0, ControlType.COMMIT, 0)  # 5
        log.append(txn_batch(1, 2))  # 6-7
        log.append_marker(1, 0, ControlType.COMMIT, 0)  # 8
        assert log.delete_records_before(9) == 9  # a consumer read up to here (read_committed)
        other.append(txn_batch(2, 2))  # 9-10: producer 2's next transaction, the one open
        assert other.state().last_stable_offset == 9
        assert other.open_transactions() == {2: (9, 0)}
        other.append_marker(2, 0, ControlType.ABORT, 0)  # 11
        assert other.state().last_stable_offset == other.state().high_watermark == 12
        assert other.aborted_transactions(9, 12) == [AbortedTransaction(2, 9, 11, 12)]
    finally:
        other.close()


def test_a_process_behind_a_retention_start_takes_the_producer_state_as_of_the_deletion_too(plog):
    """As above, with the segments the markers were in deleted whole (retention, or DeleteRecords past them)."""
    log = plog.log
    other = PartitionLog(plog.directory, plog.table, 0, SMALL)
    try:
        log.append(txn_batch(1, 0))  # 0-1
        other.append(txn_batch(2, 0))  # 2-3: both open in `other`'s view
        log.append_marker(1, 0, ControlType.COMMIT, 0)  # 4
        log.append_marker(2, 0, ControlType.COMMIT, 0)  # 5
        log.roll()
        log.append(plain_batch())  # 6-7
        log.roll()
        log.delete_records_before(6)  # the first segment goes whole
        assert [segment.base_offset for segment in log.segments] == [6, 8]
        other.append(txn_batch(3, 0))  # 8-9
        assert other.open_transactions() == {3: (8, 0)}
        assert other.state().last_stable_offset == 8
    finally:
        other.close()


class IndexDisk:
    """What a power cut leaves of a partition's aborted-transaction indexes: each file as of its last fdatasync
    (os.fdatasync wrapped to copy the file it syncs), the files as they were when this began counting as synced."""

    def __init__(self, monkeypatch, directory: str):
        self.directory = directory
        self.synced = {path: open(path, "rb").read() for path in self._paths()}
        self.syncs: list[str] = []  # the index files fdatasync'd, in order
        real = os.fdatasync

        def fdatasync(fd: int) -> None:
            real(fd)
            path = os.readlink(f"/proc/self/fd/{fd}")
            if path.endswith(".txnindex"):
                self.synced[path] = os.pread(fd, os.fstat(fd).st_size, 0)
                self.syncs.append(path)

        monkeypatch.setattr(os, "fdatasync", fdatasync)

    def _paths(self) -> list[str]:
        return [os.path.join(self.directory, name) for name in os.listdir(self.directory) if name.endswith(".txnindex")]

    def cut_power(self) -> None:
        """Every index file back to its last synced bytes (the logs stay whole: as flushed)."""
        for path in self._paths():
            with open(path, "wb") as file:
                file.write(self.synced.get(path, b""))


def test_flushes_and_snapshots_sync_the_aborted_transaction_index_only_when_it_gained_an_entry(plog, monkeypatch):
    log = plog.log
    disk = IndexDisk(monkeypatch, plog.directory)
    flusher = PartitionLog(plog.directory, plog.table, 0, SMALL)  # the timer's flusher: a view of its own
    try:
        log.append(txn_batch(1, 0))  # 0-1
        log.append_marker(1, 0, ControlType.COMMIT, 0)  # 2: a commit has no entry
        flusher.flush()
        assert disk.syncs == []
        log.append(txn_batch(1, 2))  # 3-4
        log.append_marker(1, 0, ControlType.ABORT, 0)  # 5
        flusher.flush()
        assert disk.syncs == [log.segments[-1].txn_index_path]
        log.append(plain_batch())  # 6-7
        flusher.flush()
        flusher.write_producer_snapshot()
        assert len(disk.syncs) == 1  # nothing new in the index: neither the flush nor the snapshot syncs it
        log.append(txn_batch(1, 4))  # 8-9
        log.append_marker(1, 0, ControlType.ABORT, 0)  # 10, not flushed
        flusher.write_producer_snapshot()  # recovery starts after it: the entry of 10 must be on disk first
        assert len(disk.syncs) == 2
        expected = log.aborted_transactions(0, log.state().high_watermark)
        assert [entry.last_offset for entry in expected] == [5, 10]
    finally:
        flusher.close()
    plog.log.close()
    disk.cut_power()
    log = plog.reopen()
    assert log.aborted_transactions(0, log.state().high_watermark) == expected


def test_recovery_makes_the_indexes_it_rebuilds_durable(plog, monkeypatch):
    log = plog.log
    for round_ in range(40):  # several segments, each with aborted transactions
        log.append(txn_batch(1, 2 * round_, tag=b"x" * 50))
        log.append_marker(1, 0, ControlType.ABORT, 0)
    log.write_producer_snapshot()
    expected = log.aborted_transactions(0, log.state().high_watermark)
    assert len(expected) == 40 and len(log.segments) >= 3
    log.flush()
    os.unlink(log.segments[0].txn_index_path)  # lost: recovery rebuilds every index from the log start
    disk = IndexDisk(monkeypatch, plog.directory)
    log = plog.reopen()
    log.write_producer_snapshot()  # the next recovery starts here: it rebuilds nothing before
    log.close()
    disk.cut_power()
    log = plog.reopen()
    assert log.aborted_transactions(0, log.state().high_watermark) == expected
