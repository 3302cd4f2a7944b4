"""Partition logs on real files, appended to by real processes, killed with real signals."""

from __future__ import annotations

import contextlib
import dataclasses
import ctypes
import mmap
import multiprocessing
import os
import random
import signal
import time
from typing import Iterator

import pytest
from kafka.record.default_records import DefaultRecordBatch

from shmbroker.node.storage.log import LONG_MAX, LogConfig, PartitionLog
from shmbroker.node.storage.producer_state import load_latest_snapshot, snapshot_name
from shmbroker.node.storage.records import ErrorCode, StorageError, parse_header, stored_batch_is_valid
from shmbroker.node.storage.segment import BatchScanner, Segment, segment_base_offsets
from shmbroker.shm.table import PartitionTable
from tests.record_batches import GZIP, SharedTable, edit, make_batch, opaque_compressed_batch

FORK = multiprocessing.get_context("fork")
SMALL = LogConfig(segment_bytes=20_000, index_interval_bytes=1000, index_max_bytes=4096)


pytestmark = pytest.mark.usefixtures("nothing_left_in_dev_shm")


@contextlib.contextmanager
def recover(directory: str, config: LogConfig = SMALL, **kwargs) -> Iterator[PartitionLog]:
    """The partition log in `directory` recovered as at a node's start (a fresh partition table), closed
    afterwards."""
    with SharedTable() as table:
        log = PartitionLog.recover(directory, table, 0, config, **kwargs)
        try:
            yield log
        finally:
            log.close()


def stored_batches(log: PartitionLog, start: int | None = None, max_bytes: int = 1 << 20) -> list[bytes]:
    """Every batch from `start` (default: log start) to the log end, through the fetch path."""
    state = log.state()
    offset = state.log_start_offset if start is None else start
    batches = []
    for _ in range(100_000):
        if offset >= state.log_end_offset:
            return batches
        fetched = log.read(offset, max_bytes)
        assert fetched.size > 0
        for fd, position, length in fetched.ranges:
            data = os.pread(fd, length, position)
            while data:
                header = parse_header(data)
                batches.append(data[: header.size])
                data = data[header.size :]
                offset = header.last_offset + 1
    raise AssertionError("log did not end")


def check_dense_and_valid(batches: list[bytes], first_offset: int = 0) -> list[bytes]:
    """Assert offsets are dense and every batch's CRC holds; return every record value."""
    expected = first_offset
    values = []
    for batch in batches:
        header = parse_header(batch)
        assert header.base_offset == expected
        assert stored_batch_is_valid(batch, expected)
        expected = header.last_offset + 1
        if header.compression == 0 or header.compression == GZIP:
            values.extend(record.value for record in DefaultRecordBatch(batch))
    return values


# Append and read -------------------------------------------------------------------------------------


def test_append_assigns_dense_offsets_and_reads_back_exact_bytes(tmp_path, table):
    log = PartitionLog.recover(str(tmp_path / "t-0"), table, 0, SMALL)
    sent = [make_batch(count=n % 4 + 1, tag=b"b%d" % n) for n in range(60)]
    results = [log.append(batch) for batch in sent]
    assert [r.base_offset for r in results] == [sum(n % 4 + 1 for n in range(i)) for i in range(60)]
    stored = stored_batches(log)
    assert len(stored) == 60
    for original, kept, result in zip(sent, stored, results):
        assert kept[8:] == original[8:]  # only baseOffset is rewritten
        assert parse_header(kept).base_offset == result.base_offset
    state = log.state()
    assert state.log_end_offset == state.high_watermark == results[-1].last_offset + 1
    assert state.end_bytes == sum(map(len, sent))
    assert len(segment_base_offsets(log.directory)) > 1  # rolled by size
    assert all(name[:20].isdigit() for name in os.listdir(log.directory) if name.endswith(".log"))
    log.close()


def test_compressed_batches_are_stored_as_received(tmp_path, table):
    log = PartitionLog.recover(str(tmp_path / "t-0"), table, 0)
    sent = [make_batch(count=30, compression=GZIP)] + [opaque_compressed_batch(codec) for codec in (2, 3, 4)]
    for batch in sent:
        log.append(batch)
    stored = stored_batches(log)
    assert [batch[8:] for batch in stored] == [batch[8:] for batch in sent]
    assert len(check_dense_and_valid(stored)) == 30 + 10 * 3 - 30  # gzip records decode; opaque ones are skipped
    log.close()


def test_rejected_batches_write_nothing(tmp_path, table):
    log = PartitionLog.recover(str(tmp_path / "t-0"), table, 0, LogConfig(max_message_bytes=5000))
    log.append(make_batch())
    before_state = log.state()
    before_size = os.path.getsize(log.segments[-1].log_path)
    good = make_batch(count=2)
    bad = [
        good[:30],
        good + good,
        edit(good, 0, ">q", 3),
        edit(good, 16, ">b", 1, fix_crc=False),
        good[:-1] + bytes([good[-1] ^ 1]),
        edit(good, 23, ">i", 4),
        make_batch(count=60, value_size=100),  # over max_message_bytes
    ]
    codes = []
    for batch in bad:
        with pytest.raises(StorageError) as caught:
            log.append(batch)
        codes.append(caught.value.error_code)
    assert codes == [2, 87, 87, 87, 2, 87, 10]
    assert log.state() == before_state
    assert os.path.getsize(log.segments[-1].log_path) == before_size
    log.close()


def test_read_returns_whole_batches_within_max_bytes_but_at_least_one(tmp_path, table):
    log = PartitionLog.recover(str(tmp_path / "t-0"), table, 0, LogConfig(index_interval_bytes=500))
    sizes = []
    for n in range(40):
        batch = make_batch(count=2, value_size=50 + 20 * n)
        sizes.append(len(batch))
        log.append(batch)
    for start_batch in (0, 7, 39):
        for max_bytes in (1, 300, 2000, 5000, 10**6):
            fetched = log.read(start_batch * 2 + 1, max_bytes)  # an offset inside the batch
            (fd, position, length), = fetched.ranges
            assert position == sum(sizes[:start_batch])
            fitting, total = 0, 0
            for size in sizes[start_batch:]:
                if total + size > max_bytes:
                    break
                total += size
                fitting += 1
            assert length == (total if fitting else sizes[start_batch])
    assert log.read(80, 100).ranges == ()  # at the log end: nothing yet
    assert log.read(0, 10, min_one_batch=False).ranges == ()
    for bad_offset in (-1, 81):
        with pytest.raises(StorageError) as caught:
            log.read(bad_offset, 100)
        assert caught.value.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    log.close()


def test_offset_for_timestamp(tmp_path, table):
    log = PartitionLog.recover(str(tmp_path / "t-0"), table, 0, SMALL)
    for n in range(100):
        log.append(make_batch(count=5, timestamp=1_000_000 + n * 10))  # records at +0..+4
    assert log.offset_for_timestamp(0) == (0, 1_000_000)
    assert log.offset_for_timestamp(1_000_000 + 37 * 10 + 3) == (37 * 5 + 3, 1_000_373)
    assert log.offset_for_timestamp(1_000_000 + 37 * 10 + 6) == (38 * 5, 1_000_380)
    assert log.offset_for_timestamp(2_000_000) is None
    assert len(log.segments) > 2
    # Records below the log start are gone: a look-up answers the first record at or after it (before, it
    # answered the log start with a deleted record's timestamp; tests/test_differential.py compares with Kafka).
    log.delete_records_before(37 * 5 + 2)
    assert log.offset_for_timestamp(0) == (37 * 5 + 2, 1_000_372)
    assert log.offset_for_timestamp(1_000_000 + 37 * 10 + 1) == (37 * 5 + 2, 1_000_372)
    assert log.offset_for_timestamp(1_000_000 + 37 * 10 + 3) == (37 * 5 + 3, 1_000_373)
    log.delete_records_before(38 * 5)  # the start at a batch boundary, past every record of batch 37
    assert log.offset_for_timestamp(1_000_000 + 37 * 10) == (38 * 5, 1_000_380)
    log.close()


def test_offset_of_max_timestamp_is_the_first_record_with_the_largest_timestamp(tmp_path, table):
    from shmbroker.node.storage.records import build_batch

    log = PartitionLog.recover(str(tmp_path / "t-0"), table, 0, SMALL)
    assert log.offset_of_max_timestamp() is None  # no record yet
    records = [(b"k", b"v" * 100)] * 4
    for n in range(40):  # several segments, timestamps rising slowly
        log.append(make_batch(count=5, timestamp=1_000_000 + n))
    log.append(build_batch(records, 5_000_000, timestamp_deltas=[0, 700, 100, 700], compression=GZIP))  # 200-203
    for n in range(40):  # later segments, all older than 5,000,700
        log.append(make_batch(count=5, timestamp=2_000_000 + n))
    log.append(build_batch(records, 5_000_000, timestamp_deltas=[0, 700, 0, 0]))  # 404-407: a tie, later
    assert len(log.segments) > 2
    assert log.offset_of_max_timestamp() == (201, 5_000_700)
    log.close()


def test_flush_publishes_flushed_offset(tmp_path, table):
    log = PartitionLog.recover(str(tmp_path / "t-0"), table, 0, SMALL)
    for _ in range(50):
        log.append(make_batch())
    state = log.state()
    assert state.flushed_offset == 0 and state.end_bytes > state.flushed_bytes
    assert log.flush() == 150
    state = log.state()
    assert (state.flushed_offset, state.flushed_bytes) == (150, state.end_bytes)
    log.close()


# Roll and retention ---------------------------------------------------------------------------------


def test_roll_by_age(tmp_path, table):
    # A clock of its own: the records' (real) timestamps are far in its future, which this test does not bound.
    config = LogConfig(segment_ms=1000, message_timestamp_after_max_ms=LONG_MAX)
    log = PartitionLog.recover(str(tmp_path / "t-0"), table, 0, config)
    log.append(make_batch(), now=10_000)
    log.append(make_batch(), now=10_900)
    assert segment_base_offsets(log.directory) == [0]
    log.append(make_batch(), now=11_100)
    assert segment_base_offsets(log.directory) == [0, 6]
    assert log.state().active_base_offset == 6
    assert len(check_dense_and_valid(stored_batches(log))) == 9
    log.close()


def test_retention_by_size_deletes_whole_old_segments(tmp_path, table):
    config = LogConfig(segment_bytes=10_000, retention_bytes=25_000, retention_ms=-1)
    log = PartitionLog.recover(str(tmp_path / "t-0"), table, 0, config)
    for _ in range(100):
        log.append(make_batch(count=1, value_size=900))
    segments_before = segment_base_offsets(log.directory)
    deleted = log.enforce_retention()
    bases = segment_base_offsets(log.directory)
    assert deleted == len(segments_before) - len(bases) > 0
    state = log.state()
    assert state.log_start_offset == bases[0] > 0
    total = sum(os.path.getsize(os.path.join(log.directory, f"{b:020d}.log")) for b in bases)
    assert total >= 25_000 - 10_000 and total - os.path.getsize(log.segments[0].log_path) < 25_000
    with pytest.raises(StorageError):
        log.read(state.log_start_offset - 1, 1000)
    assert len(check_dense_and_valid(stored_batches(log), bases[0])) == 100 - bases[0]
    assert not any(name.startswith(f"{segments_before[0]:020d}") for name in os.listdir(log.directory))
    log.close()


def test_retention_by_time_and_other_processes_notice(tmp_path, table):
    config = LogConfig(segment_bytes=5_000, retention_ms=60_000)
    directory = str(tmp_path / "t-0")
    log = PartitionLog.recover(directory, table, 0, config)
    for n in range(30):
        log.append(make_batch(count=1, value_size=900, timestamp=1_000_000 + n * 10_000))
    other = PartitionLog(directory, table, 0, config)  # another process's view, opened before retention
    assert len(stored_batches(other)) == 30
    deleted = log.enforce_retention(now=1_000_000 + 29 * 10_000 + 1)
    assert deleted > 0
    start = log.state().log_start_offset
    # Every deleted segment's newest record is older than the horizon; the first kept one is not.
    assert 1_000_000 + (start - 1) * 10_000 < 1_000_000 + 29 * 10_000 + 1 - 60_000
    assert len(stored_batches(other)) == 30 - start
    other.append(make_batch(count=1))
    assert log.state().log_end_offset == 31
    other.close()
    log.close()


# Recovery -------------------------------------------------------------------------------------------


def test_missing_and_corrupt_indexes_are_rebuilt(tmp_path):
    directory = str(tmp_path / "t-0")
    with recover(directory) as log:
        for n in range(200):
            log.append(make_batch(count=2, value_size=40 + n % 7 * 30, timestamp=5000 + n))
    bases = segment_base_offsets(directory)
    assert len(bases) >= 4
    index = lambda base, suffix: os.path.join(directory, f"{base:020d}.{suffix}")  # noqa: E731
    originals = {(b, s): open(index(b, s), "rb").read() for b in bases for s in ("index", "timeindex")}
    assert any(originals[(b, "index")].strip(b"\0") for b in bases)
    os.unlink(index(bases[1], "index"))
    os.unlink(index(bases[2], "timeindex"))
    with open(index(bases[0], "index"), "r+b") as file:
        file.seek(8)
        file.write(os.urandom(64))
    with open(index(bases[-1], "index"), "r+b") as file:
        file.write(b"\xff" * 16)
    with recover(directory) as log:
        for key, content in originals.items():
            assert open(index(*key), "rb").read() == content, key
        assert len(check_dense_and_valid(stored_batches(log))) == 400
        for offset in range(0, 400, 7):
            (fd, position, length), = log.read(offset, 1).ranges
            header = parse_header(os.pread(fd, length, position))
            assert header.base_offset <= offset <= header.last_offset and header.size == length


def _write_half_batch_and_wait(directory, table_name, ready, full):
    """Hold the partition lock and write (half) a batch at the end position, as an append does, then hang."""
    table = PartitionTable.attach(table_name)
    log = PartitionLog(directory, table, 0, SMALL)
    with log.lock:
        state = log._current_state()
        batch = edit(make_batch(count=3, tag=b"torn"), 0, ">q", state.log_end_offset, fix_crc=False)
        written = batch if full else batch[: len(batch) // 2]
        os.pwrite(log.segments[-1].log_fd, written, state.end_position)
        ready.set()
        time.sleep(60)


@pytest.mark.parametrize("full", [False, True])
def test_writer_killed_mid_append_leaves_no_torn_batch(tmp_path, table, full):
    directory = str(tmp_path / "t-0")
    log = PartitionLog.recover(directory, table, 0, SMALL)
    for n in range(5):
        log.append(make_batch(tag=b"before%d" % n))
    ready = FORK.Event()
    child = FORK.Process(target=_write_half_batch_and_wait, args=(directory, table.name, ready, full))
    child.start()
    try:
        assert ready.wait(10)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    assert child.exitcode == -signal.SIGKILL
    assert os.path.getsize(log.segments[-1].log_path) > log.state().end_position  # the torn tail is there
    assert len(stored_batches(log)) == 5  # but is never served
    log.close()
    # Recovery truncates it away...
    with recover(directory) as recovered:
        assert os.path.getsize(recovered.segments[-1].log_path) == recovered.state().end_position
        # A whole batch that was never published is kept (it is valid and on disk); a half one is not.
        assert recovered.state().log_end_offset == (18 if full else 15)
    # ...and, without recovery, the next append (the lock died with its holder) overwrites it.
    log = PartitionLog(directory, table, 0, SMALL)
    result = log.append(make_batch(tag=b"after"))
    assert result.base_offset == 15
    values = check_dense_and_valid(stored_batches(log))
    assert len(values) == 18 and not any(value.startswith(b"torn") for value in values)
    log.close()


def _append_many(directory, table_name, config, tag, count, acked_path=None):
    table = PartitionTable.attach(table_name)
    log = PartitionLog(directory, table, 0, config)
    acked = open(acked_path, "a", buffering=1) if acked_path else None
    for n in range(count):
        log.append(make_batch(count=1 + n % 3, value_size=200, tag=b"%s-%d" % (tag, n)))
        if acked:
            acked.write(f"{tag.decode()}-{n}\n")
    log.close()
    table.close()


def test_concurrent_appends_from_many_processes_lose_and_duplicate_nothing(tmp_path, table):
    directory = str(tmp_path / "t-0")
    config = LogConfig(segment_bytes=60_000, index_interval_bytes=2000, index_max_bytes=4096)
    PartitionLog.recover(directory, table, 0, config).close()
    writers = [
        FORK.Process(target=_append_many, args=(directory, table.name, config, b"w%d" % w, 250)) for w in range(4)
    ]
    for writer in writers:
        writer.start()
    reader = PartitionLog(directory, table, 0, config)
    deadline = time.monotonic() + 60
    reads = 0
    while any(writer.is_alive() for writer in writers) and time.monotonic() < deadline:
        # Meanwhile this process reads: whatever is published is whole, valid and dense.
        state = reader.state()
        start = max(state.log_end_offset - 50, state.log_start_offset)
        batches = stored_batches(reader, start=start)
        if batches:
            check_dense_and_valid(batches[1:], parse_header(batches[0]).last_offset + 1)
        reads += 1
    reader.close()
    for writer in writers:
        writer.join(max(1, deadline - time.monotonic()))
    try:
        assert reads > 3
        assert [writer.exitcode for writer in writers] == [0] * 4
    finally:
        for writer in writers:
            if writer.is_alive():
                os.kill(writer.pid, signal.SIGKILL)
                writer.join(5)
    log = PartitionLog(directory, table, 0, config)
    values = check_dense_and_valid(stored_batches(log))
    tags = [value.split(b".")[0] for value in values]
    expected = [b"w%d-%d" % (w, n) for w in range(4) for n in range(250) for _ in range(1 + n % 3)]
    assert sorted(tags) == sorted(expected)
    assert len(segment_base_offsets(directory)) > 3
    log.close()


def test_kill_9_of_every_writer_under_load_then_recovery_keeps_every_acked_batch(tmp_path):
    directory = str(tmp_path / "t-0")
    config = LogConfig(segment_bytes=100_000, index_interval_bytes=2000, index_max_bytes=4096)
    rng = random.Random(4)
    acked_files = [str(tmp_path / f"acked{w}") for w in range(3)]
    for round_number in range(3):
        with SharedTable() as table:
            PartitionLog.recover(directory, table, 0, config).close()
            writers = [
                FORK.Process(
                    target=_append_many,
                    args=(directory, table.name, config, b"r%dw%d" % (round_number, w), 100_000, acked_files[w]),
                )
                for w in range(3)
            ]
            for writer in writers:
                writer.start()
            time.sleep(rng.uniform(0.3, 0.8))
            for writer in writers:
                os.kill(writer.pid, signal.SIGKILL)
            for writer in writers:
                writer.join(10)
            assert all(writer.exitcode == -signal.SIGKILL for writer in writers)
    with recover(directory, config) as log:
        values = check_dense_and_valid(stored_batches(log))
    stored_tags = {}
    for value in values:
        tag = value.split(b".")[0].decode()
        stored_tags[tag] = stored_tags.get(tag, 0) + 1
    acked = [line.strip() for path in acked_files for line in open(path) if line.endswith("\n")]
    assert len(acked) > 100
    for tag in acked:
        assert stored_tags.get(tag) == 1 + int(tag.rsplit("-", 1)[1]) % 3, tag
    assert len(stored_tags) <= len(acked) + 9  # at most one unacknowledged batch per killed writer


# Idempotent producers ---------------------------------------------------------------------------------


def idempotent(sequence: int, count: int = 2, producer_id: int = 77, epoch: int = 0) -> bytes:
    return make_batch(count=count, producer_id=producer_id, epoch=epoch, sequence=sequence, tag=b"s%d" % sequence)


def test_retry_gets_original_offsets_without_second_append(tmp_path, table):
    log = PartitionLog.recover(str(tmp_path / "t-0"), table, 0, SMALL)
    first = [log.append(idempotent(sequence)) for sequence in range(0, 12, 2)]
    end_bytes = log.state().end_bytes
    for original, sequence in zip(first[-5:], range(2, 12, 2)):
        retry = log.append(idempotent(sequence))
        assert retry.duplicate and (retry.base_offset, retry.last_offset) == original[:2]
    assert log.state().end_bytes == end_bytes
    with pytest.raises(StorageError) as caught:
        log.append(idempotent(0))  # older than the last 5 batches kept
    assert caught.value.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    with pytest.raises(StorageError) as caught:
        log.append(idempotent(14))  # gap: 12 expected
    assert caught.value.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert not log.append(idempotent(12)).duplicate
    assert not log.append(idempotent(0, epoch=1)).duplicate  # a new epoch starts at 0
    with pytest.raises(StorageError) as caught:
        log.append(idempotent(2, epoch=0))
    assert caught.value.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    with pytest.raises(StorageError) as caught:
        log.append(idempotent(5, epoch=2))
    assert caught.value.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert not log.append(idempotent(40, producer_id=78)).duplicate  # unknown producer: any sequence
    log.close()


@pytest.mark.parametrize("snapshot", ["none", "roll", "explicit"])
def test_producer_state_survives_restart(tmp_path, snapshot):
    directory = str(tmp_path / "t-0")
    with recover(directory) as log:
        originals = [log.append(idempotent(sequence)) for sequence in range(0, 10, 2)]
        if snapshot == "roll":
            log.roll()
        elif snapshot == "explicit":
            assert log.write_producer_snapshot() == 10
        if snapshot != "none":
            loaded = load_latest_snapshot(directory, 10**9)
            assert loaded.end_offset == 10 and loaded.producers[77].last_sequence == 9
            assert [batch.base_offset for batch in loaded.producers[77].batches] == [0, 2, 4, 6, 8]
            log.append(make_batch())  # a non-idempotent batch after the snapshot
    with recover(directory) as log:
        retry = log.append(idempotent(8))
        assert retry.duplicate and retry.base_offset == originals[-1].base_offset
        with pytest.raises(StorageError):
            log.append(idempotent(12))
        assert not log.append(idempotent(10)).duplicate


def test_a_snapshot_at_the_log_end_stands_and_a_loaded_one_forgets_expired_producers(tmp_path):
    """The periodic snapshot writes nothing for a partition that has one at its log end already (an idle node
    does not rewrite and fsync every partition's snapshot each round); an append makes the next one new. So an
    idle partition's snapshot may be old: producers that expired since it was written are not loaded back."""
    directory = str(tmp_path / "t-0")
    with recover(directory) as log:
        log.append(idempotent(0))
        log.append(idempotent(2))
        assert log.write_producer_snapshot() == 4
        path = os.path.join(directory, snapshot_name(4))
        written = os.stat(path)
        assert log.write_producer_snapshot() == 4
        kept = os.stat(path)
        assert (kept.st_ino, kept.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    with recover(directory) as log:  # within the expiration: a retry is still a duplicate
        assert log.append(idempotent(2)).duplicate
    time.sleep(0.2)
    with recover(directory, dataclasses.replace(SMALL, producer_id_expiration_ms=100)) as log:
        assert load_latest_snapshot(directory, 10**9).end_offset == 4
        assert not log.append(idempotent(2)).duplicate  # producer 77 expired: a new producer to the log
        assert log.write_producer_snapshot() == 6


def test_producer_state_catches_up_with_other_processes(tmp_path, table):
    directory = str(tmp_path / "t-0")
    log = PartitionLog.recover(directory, table, 0, SMALL)
    log.append(idempotent(0, producer_id=5))  # this process's producer state now exists, as of offset 2
    child = FORK.Process(target=_append_idempotent, args=(directory, table.name))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    original = PartitionLog(directory, table, 0, SMALL)
    retried = log.append(idempotent(8, producer_id=6))
    assert retried.duplicate
    assert retried.base_offset == stored_offset_of(original, b"s8")
    with pytest.raises(StorageError) as caught:
        log.append(idempotent(12, producer_id=6))
    assert caught.value.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.append(idempotent(2, producer_id=5)).base_offset == log.state().log_end_offset - 2
    original.close()
    log.close()


def _append_plain(directory, table_name, count):
    table = PartitionTable.attach(table_name)
    log = PartitionLog(directory, table, 0, SMALL)
    for _ in range(count):
        log.append(make_batch(count=1))
    log.close()
    table.close()


def test_catching_up_reads_no_batch_after_the_newest_idempotent_one(tmp_path, table, monkeypatch):
    """Another process appended many plain batches after this one's idempotent ones: the roll's snapshot (and
    any later check) catches up without reading them back under the lock, and still dedupes."""
    directory = str(tmp_path / "t-0")
    log = PartitionLog.recover(directory, table, 0, SMALL)
    originals = [log.append(idempotent(sequence)) for sequence in range(0, 10, 2)]
    assert log.state().producer_batches_end == 10
    child = FORK.Process(target=_append_plain, args=(directory, table.name, 400))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    read = []
    real_headers = BatchScanner.headers

    def counted_headers(scanner, start, end):
        for item in real_headers(scanner, start, end):
            read.append(item[1][0])
            yield item

    monkeypatch.setattr(BatchScanner, "headers", counted_headers)
    state = log.state()
    assert state.producer_batches_end == 10 and state.log_end_offset == 410
    log.roll()  # catches up to the log end and writes a snapshot there
    assert read == []
    snapshot = load_latest_snapshot(directory, 10**9)
    assert snapshot.end_offset == 410 and snapshot.producers[77].last_sequence == 9
    fresh = PartitionLog(directory, table, 0, SMALL)  # a process whose first look is after all of it
    retry = fresh.append(idempotent(8))
    assert retry.duplicate and retry.base_offset == originals[-1].base_offset
    assert read == []
    fresh.close()
    log.close()


def resident_bytes(path: str) -> int:
    """Bytes of the file in the page cache (mincore over a private mapping, which shares the cache's pages)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    pages = -(-size // mmap.PAGESIZE)
    vector = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as file:
        memory = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        address = ctypes.c_char.from_buffer(memory)
        try:
            assert libc.mincore(ctypes.addressof(address), size, vector) == 0, os.strerror(ctypes.get_errno())
        finally:
            del address
    finally:
        memory.close()
    return sum(byte & 1 for byte in vector) * mmap.PAGESIZE


def filesystem_type(path: str) -> str:
    best = ("", "")
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            _, mount_point, kind = line.split()[:3]
            if os.path.realpath(path).startswith(mount_point.rstrip("/") + "/") and len(mount_point) > len(best[0]):
                best = (mount_point, kind)
    return best[1]


@pytest.mark.parametrize("window", [1 << 20, -1])
def test_flushed_data_behind_the_window_leaves_the_page_cache(tmp_path, table, window):
    if filesystem_type(str(tmp_path)) == "tmpfs":
        pytest.skip("tmpfs pages are the file: the page cache cannot drop them")
    directory = str(tmp_path / "t-0")
    config = LogConfig(segment_bytes=4 << 20, page_cache_window_bytes=window, page_cache_drop_bytes=256 << 10)
    log = PartitionLog.recover(directory, table, 0, config)
    for n in range(60):
        log.append(make_batch(count=10, value_size=10_000, tag=b"b%d" % n))  # about 100 KB each
    log.flush()
    sealed, active = [os.path.join(directory, f"{base:020d}.log") for base in segment_base_offsets(directory)]
    sealed_size, active_size = os.path.getsize(sealed), log.state().end_position
    if window < 0:  # the kernel's to keep: nothing dropped
        assert resident_bytes(sealed) >= 0.9 * sealed_size and resident_bytes(active) >= 0.9 * active_size
    else:
        assert active_size > window  # the newer segment alone covers the window: the sealed one goes whole
        assert resident_bytes(sealed) == 0
        assert window <= resident_bytes(active) <= window + config.page_cache_drop_bytes + mmap.PAGESIZE
    values = check_dense_and_valid(stored_batches(log))  # what left the cache reads back from the disk
    assert len(values) == 600 and values[0].startswith(b"b0.") and values[-1].startswith(b"b59.")
    appended = log.append(make_batch(count=1))  # unflushed bytes are never dropped: nothing to drop yet
    assert appended.base_offset == 600
    log.close()


def _append_idempotent(directory, table_name):
    table = PartitionTable.attach(table_name)
    log = PartitionLog(directory, table, 0, SMALL)
    for sequence in range(0, 10, 2):
        log.append(idempotent(sequence, producer_id=6))
        log.append(make_batch(count=1))
    log.close()
    table.close()


def stored_offset_of(log: PartitionLog, tag: bytes) -> int:
    for batch in stored_batches(log):
        if any(record.value.startswith(tag + b".") for record in DefaultRecordBatch(batch)):
            return parse_header(batch).base_offset
    raise AssertionError(tag)


def _roll_and_die(directory, table_name):
    """A roll killed after sealing the active segment and creating the next one, before publishing."""
    table = PartitionTable.attach(table_name)
    log = PartitionLog(directory, table, 0, SMALL)
    with log.lock:
        state = log._current_state()
        log.segments[-1].seal(state.end_position, state.active_index_entries, state.active_max_timestamp, state.log_end_offset)
        log._segment(state.log_end_offset, create=True)
        os.kill(os.getpid(), signal.SIGKILL)


def test_roll_killed_before_publishing_is_finished_by_the_next_append(tmp_path, table):
    directory = str(tmp_path / "t-0")
    log = PartitionLog.recover(directory, table, 0, SMALL)
    for _ in range(3):
        log.append(make_batch(count=2))
    child = FORK.Process(target=_roll_and_die, args=(directory, table.name))
    child.start()
    child.join(10)
    assert child.exitcode == -signal.SIGKILL
    assert segment_base_offsets(directory) == [0, 6]
    assert log.state().active_base_offset == 0  # the roll was never published
    assert log.append(make_batch(count=2)).base_offset == 6
    assert log.state().active_base_offset == 6  # the next append finished the roll
    log.append(make_batch(count=2))
    assert len(check_dense_and_valid(stored_batches(log))) == 10
    log.close()
    with recover(directory) as recovered:
        assert recovered.state().log_end_offset == 10
        assert len(check_dense_and_valid(stored_batches(recovered))) == 10


def test_full_index_rolls_the_segment(tmp_path, table):
    config = LogConfig(index_interval_bytes=0, index_max_bytes=64)  # 8 entries per segment
    log = PartitionLog.recover(str(tmp_path / "t-0"), table, 0, config)
    for _ in range(30):
        log.append(make_batch(count=1))
    assert len(segment_base_offsets(log.directory)) >= 4
    for offset in range(30):
        (fd, position, length), = log.read(offset, 1).ranges
        assert parse_header(os.pread(fd, length, position)).base_offset == offset
    log.close()


def test_recovery_truncates_at_a_corrupt_batch_after_the_last_index_entry(tmp_path):
    directory = str(tmp_path / "t-0")
    with recover(directory) as log:
        sizes = [len(make_batch(count=2))] * 10
        for _ in range(10):
            log.append(make_batch(count=2))
        path = log.segments[-1].log_path
    with open(path, "r+b") as file:
        file.seek(sum(sizes[:9]) + 100)  # inside the last batch's records, after the last index entry
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0x55]))
    with recover(directory) as log:
        assert log.state().log_end_offset == 18
        assert os.path.getsize(path) == sum(sizes[:9])
        assert len(check_dense_and_valid(stored_batches(log))) == 18
        assert log.append(make_batch(count=2)).base_offset == 18


def test_full_verification_truncates_at_a_corrupt_batch_anywhere_in_the_last_segment(tmp_path):
    directory = str(tmp_path / "t-0")
    with recover(directory) as log:
        for _ in range(10):
            log.append(make_batch(count=2))
        size = len(make_batch(count=2))
        path = log.segments[-1].log_path
    with open(path, "r+b") as file:
        file.seek(size * 6 + 100)  # inside the 7th batch, before the last index entry
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0x55]))
    with recover(directory, verify_all_crc=True) as log:
        assert log.state().log_end_offset == 12 and os.path.getsize(path) == size * 6
        assert len(check_dense_and_valid(stored_batches(log))) == 12


def test_deleted_partition_is_unknown_to_every_process(tmp_path, table):
    directory = str(tmp_path / "t-0")
    log = PartitionLog.recover(directory, table, 0, SMALL)
    log.append(make_batch())
    other = PartitionLog(directory, table, 0, SMALL)
    log.delete()
    assert not os.path.exists(directory)
    for operation in (lambda: other.read(0, 100), lambda: other.append(make_batch())):
        with pytest.raises(StorageError) as caught:
            operation()
        assert caught.value.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    other.close()
    recreated = PartitionLog.recover(directory, table, 0, SMALL)  # a new topic of the same name
    assert recreated.state().log_end_offset == 0 and recreated.append(make_batch()).base_offset == 0
    recreated.close()


def test_a_repeated_read_is_answered_once_until_another_process_changes_the_partition(tmp_path, table):
    """Thousands of long polls on one partition re-read the same offset in one turn: the answer is shared while
    the published state is unchanged, and a change made through another handle (another worker) is seen."""
    directory = str(tmp_path / "t-0")
    reader = PartitionLog.recover(directory, table, 0, LogConfig(index_interval_bytes=500))
    writer = PartitionLog(directory, table, 0, LogConfig(index_interval_bytes=500))
    first = make_batch(count=2, value_size=60)
    writer.append(first)
    once = reader.read(0, 10**6)
    assert reader.read(0, 10**6) is once  # same state, same arguments: the same answer
    assert reader.read(0, 10) is not once  # other arguments: read again
    second = make_batch(count=2, value_size=70)
    writer.append(second)
    again = reader.read(0, 10**6)
    assert again.size == len(first) + len(second) and again.end_bytes == once.end_bytes + len(second)
    assert [len(batch) for batch in stored_batches(reader)] == [len(first), len(second)]
    writer.close()
    reader.close()


def test_a_read_at_the_log_end_finds_the_next_batch_without_a_lookup(tmp_path, table, monkeypatch):
    """A tailing consumer reads at the log end, finds nothing, and reads the same offset once an append (by
    another handle: another worker) lands: the batch starts where the log ended, with no index lookup or
    header scan. After a roll the remembered end is another segment's, and the lookup finds the batch."""
    directory = str(tmp_path / "t-0")
    config = LogConfig(segment_bytes=20_000, index_interval_bytes=4096, index_max_bytes=4096)
    reader = PartitionLog.recover(directory, table, 0, config)
    writer = PartitionLog(directory, table, 0, config)
    for _ in range(20):
        writer.append(make_batch(count=1, value_size=100))
    lookups = []
    real_position_of = Segment.position_of

    def counted_position_of(segment, offset, entries, end):
        lookups.append(offset)
        return real_position_of(segment, offset, entries, end)

    monkeypatch.setattr(Segment, "position_of", counted_position_of)
    for offset in range(20, 30):
        assert reader.read(offset, 10**6).size == 0  # at the end: nothing yet
        batch = make_batch(count=1, value_size=100)
        writer.append(batch)
        got = reader.read(offset, 10**6)
        ((fd, position, length),) = got.ranges
        assert length == len(batch) and position == reader.state().end_position - len(batch)
        assert stored_batches(reader, offset)[-1][12:] == batch[12:]  # the same batch (its base offset set)
    assert lookups == [], "each batch was found where the log had ended"
    lookups.clear()
    end = reader.state().log_end_offset
    assert reader.read(end, 10**6).size == 0
    writer.roll()
    rolled = make_batch(count=1, value_size=100)
    writer.append(rolled)
    got = reader.read(end, 10**6)
    assert got.size == len(rolled) and got.ranges[0][1] == 0, "the new segment's first batch"
    assert lookups, "after the roll the remembered end is stale: the index is looked up"
    writer.close()
    reader.close()
