"""Partition logs on real small filesystems that fill up or fail: a full disk costs an error code
(KAFKA_STORAGE_ERROR), never a torn batch, a SIGBUS or a traceback, and appends resume by themselves."""

from __future__ import annotations

import logging
import multiprocessing
import os

import pytest

from shmbroker.node.storage.log import LogConfig, PartitionLog
from shmbroker.node.storage.records import ErrorCode, StorageError
from shmbroker.node.storage.store import PartitionStore
from tests.record_batches import SharedTable, make_batch
from tests.small_fs import MiB, ballast, ext4_on_thin_storage, fill, tmpfs
from tests.test_log import check_dense_and_valid, stored_batches

FORK = multiprocessing.get_context("fork")
# Small segments and a dense index with small reservations: rolls and index reservations happen near the
# moment the disk fills, the paths that could tear a batch or SIGBUS.
TIGHT = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=256, index_max_bytes=64 * 1024,
                  index_reserve_entries=8, retention_ms=-1)


pytestmark = pytest.mark.usefixtures("nothing_left_in_dev_shm")


def _fill_with_appends(directory: str, table_name: str, attempts: int, pipe) -> None:
    """In a child process: append batches of growing sizes until the disk is full and long after; report
    which appends were acknowledged (their results) and the error codes of the others."""
    from shmbroker.shm.table import PartitionTable

    table = PartitionTable.attach(table_name)
    log = PartitionLog(directory, table, 0, TIGHT)
    acked, codes = [], []
    for n in range(attempts):
        batch = make_batch(count=1 + n % 5, value_size=100 + (n * 37) % 3000, tag=b"n%d" % n)
        try:
            result = log.append(batch)
            acked.append((n, result.base_offset, result.last_offset))
        except StorageError as exc:
            codes.append(exc.error_code)
    log.close()
    table.close()
    pipe.send((acked, codes))


def test_append_on_a_full_disk_answers_storage_error_tears_nothing_and_resumes(tmp_path, table, caplog):
    with tmpfs(tmp_path / "fs", 2 * MiB) as fs:
        directory = str(fs / "t-0")
        PartitionLog.recover(directory, table, 0, TIGHT).close()
        room = ballast(fs, "ballast", 256 * 1024)
        mine, theirs = FORK.Pipe()
        child = FORK.Process(target=_fill_with_appends, args=(directory, table.name, 3000, theirs))
        child.start()
        acked, codes = mine.recv()
        child.join(60)
        assert child.exitcode == 0, f"the appending process died (exit {child.exitcode}; -7 is SIGBUS)"
        assert codes and set(codes) == {ErrorCode.KAFKA_STORAGE_ERROR}
        assert len(acked) > 100
        log = PartitionLog(directory, table, 0, TIGHT)
        state = log.state()
        # Exactly the acknowledged batches are there, dense and CRC-valid; nothing torn is ever served.
        expected = [(b"n%d.%d" % (n, i)).ljust(100 + (n * 37) % 3000, b"x")
                    for n, base, last in acked for i in range(last - base + 1)]
        assert check_dense_and_valid(stored_batches(log)) == expected
        assert state.log_end_offset == acked[-1][2] + 1
        assert state.storage_errors == len(codes)
        # The torn tail of the last failed append lies past the published end; the next append goes there.
        os.unlink(room)
        result = log.append(make_batch(count=2, tag=b"after"))
        assert result.base_offset == state.log_end_offset
        assert check_dense_and_valid(stored_batches(log))[-2:] == [b"after.0".ljust(100, b"x"),
                                                                  b"after.1".ljust(100, b"x")]
        log.close()


def test_storage_faults_log_one_line_per_partition_per_interval_across_processes(tmp_path, table, caplog):
    with tmpfs(tmp_path / "fs", 1 * MiB) as fs:
        directory = str(fs / "t-0")
        first = PartitionLog.recover(directory, table, 0, TIGHT)
        second = PartitionLog(directory, table, 0, TIGHT)  # another process's handle on the same row
        fill(fs)
        big = make_batch(count=5, value_size=4000)
        caplog.set_level(logging.WARNING, logger="shmbroker.storage")
        for log in (first, second) * 20:
            with pytest.raises(StorageError) as caught:
                log.append(big)
            assert caught.value.error_code == ErrorCode.KAFKA_STORAGE_ERROR
        lines = [r.getMessage() for r in caplog.records if r.name == "shmbroker.storage"]
        assert len(lines) == 1 and "partition t-0: append failed" in lines[0] and "No space left" in lines[0]
        assert first.state().storage_errors == 40
        first.close()
        second.close()


def test_snapshots_retention_and_topic_creation_on_a_full_disk(tmp_path, table):
    config = LogConfig(segment_bytes=16 * 1024, retention_bytes=40 * 1024, retention_ms=-1,
                       index_max_bytes=8 * 1024, index_reserve_entries=8)
    with tmpfs(tmp_path / "fs", 1 * MiB) as fs:
        directory = str(fs / "t-0")
        log = PartitionLog.recover(directory, table, 0, config)
        for n in range(30):
            log.append(make_batch(count=3, value_size=1000, producer_id=7, epoch=0, sequence=3 * n))
        fill(fs)
        # A producer snapshot cannot be written: an error code, and no partial temporary file left.
        with pytest.raises(StorageError) as caught:
            log.write_producer_snapshot()
        assert caught.value.error_code == ErrorCode.KAFKA_STORAGE_ERROR
        assert not [name for name in os.listdir(directory) if ".tmp." in name]
        # Retention still works on a full disk (it only deletes) and frees room for appends.
        start = log.state().log_start_offset
        assert log.enforce_retention() > 0
        assert log.state().log_start_offset > start
        log.append(make_batch(count=1, value_size=100))
        # A topic that cannot be created for lack of space leaves nothing behind and says why.
        fill(fs, "filler2")
        store = PartitionStore(str(fs), table, config, max_partitions=4)
        outcome = store.create_topics([("new", 2, {})])
        assert outcome["new"][0] == ErrorCode.KAFKA_STORAGE_ERROR
        assert "new" not in store.catalog.topics and not os.path.exists(fs / "new-0")
        store.close()
        log.close()


def test_partitions_made_by_many_threads_on_a_filesystem_out_of_inodes(tmp_path):
    """A batch of topics made by several threads, where the filesystem runs out of inodes partway: a topic
    that met the fault is refused whole and leaves no directory, the others are created and online; with
    room again a refused one is created. (Which topics meet the fault depends on the threads' timing.)"""
    config = LogConfig(index_max_bytes=8 * 1024)
    with SharedTable(rows=64) as shared, tmpfs(tmp_path / "fs", 16 * MiB, inodes=60) as fs:
        store = PartitionStore(str(fs), shared, config, max_partitions=64, create_threads=4)
        # Each partition takes 4 inodes (its directory, the log and both indexes): 72 for these, 60 exist.
        outcome = store.create_topics([("first", 6, {}), ("second", 6, {}), ("third", 6, {})])
        refused = sorted(name for name, (code, _) in outcome.items() if code)
        created = sorted(name for name, (code, _) in outcome.items() if not code)
        assert refused, outcome
        assert {outcome[name][0] for name in refused} == {ErrorCode.KAFKA_STORAGE_ERROR}
        assert sorted(store.catalog.topics) == created
        on_disk = sorted(p.name for p in fs.iterdir() if p.is_dir())
        assert on_disk == sorted(f"{name}-{i}" for name in created for i in range(6))
        for name in created:
            assert all(shared.read(row).online for row in store.catalog.topics[name].rows)
        store.delete_topics(created)
        assert store.create_topics([(refused[0], 6, {})]) == {refused[0]: (0, None)}
        assert sorted(p.name for p in fs.iterdir() if p.is_dir()) == [f"{refused[0]}-{i}" for i in range(6)]
        store.close()


def test_recovery_on_a_full_disk_opens_the_partition_and_reports_it(tmp_path, table):
    with tmpfs(tmp_path / "fs", 1 * MiB) as fs:
        directory = str(fs / "t-0")
        log = PartitionLog.recover(directory, table, 0, TIGHT)
        count = 0
        while True:  # fill with appends: the last failed one leaves a torn tail
            try:
                log.append(make_batch(count=2, value_size=700))
                count += 2
            except StorageError:
                break
        end = log.state().log_end_offset
        log.close()
        fill(fs)
        recovered = PartitionLog.recover(directory, table, 1, TIGHT)  # another row: a fresh start
        assert recovered.state().log_end_offset == end == count
        assert len(check_dense_and_valid(stored_batches(recovered))) == count
        with pytest.raises(StorageError):
            recovered.append(make_batch(count=2, value_size=700))
        recovered.close()


def test_a_failed_fsync_marks_the_partition_and_acks_wait_for_a_rewritten_fsync(tmp_path, table):
    """ext4 on thin storage: writes land in the page cache, then fsync fails (EIO) when the backing store
    is full. The partition is marked, its flushed offset does not move, and stays so."""
    with ext4_on_thin_storage(tmp_path / "ext4", 64 * MiB, 12 * MiB) as fs:
        log = PartitionLog.recover(str(fs / "t-0"), table, 0, LogConfig(index_max_bytes=64 * 1024))
        flushed_once = False
        failure = None
        for round_number in range(200):
            for _ in range(50):
                try:
                    log.append(make_batch(count=10, value_size=1000))
                except StorageError:
                    break
            try:
                log.flush()
                flushed_once = True
            except StorageError as exc:
                failure = exc
                break
        assert flushed_once and failure is not None
        assert failure.error_code == ErrorCode.KAFKA_STORAGE_ERROR
        state = log.state()
        assert state.flush_failed == 1 and state.flushed_offset < state.log_end_offset
        # Linux reports a writeback error once: a plain second fsync would "succeed". Ours does not.
        with pytest.raises(StorageError):
            log.flush()
        assert log.state().flushed_offset == state.flushed_offset
        log.close()


def test_after_a_failed_fsync_unflushed_batches_are_rewritten_before_the_next(tmp_path, table):
    """The mark's way out: batches after the flushed offset are CRC-checked, written again from the page
    cache and fsync'd; a batch whose bytes were lost keeps the mark."""
    log = PartitionLog.recover(str(tmp_path / "t-0"), table, 0, TIGHT)
    for _ in range(20):
        log.append(make_batch(count=2))
    log.flush()
    for _ in range(20):
        log.append(make_batch(count=2))
    with log.lock:
        table.update(0, flush_failed=1)
    assert log.flush() == 80
    state = log.state()
    assert (state.flushed_offset, state.flush_failed) == (80, 0)
    log.append(make_batch(count=2))
    with log.lock:
        table.update(0, flush_failed=1)
    segment = log.segments[-1]
    position = log.state().end_position - 10
    os.pwrite(segment.log_fd, b"\x00" * 4, position)  # what a page dropped after a writeback error looks like
    with pytest.raises(StorageError):
        log.flush()
    state = log.state()
    assert (state.flushed_offset, state.flush_failed) == (80, 1)
    log.close()
