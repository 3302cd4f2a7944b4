"""The shared partition-state table: lock-free consistent reads across real processes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import numpy as np
import posix_ipc
import pytest

from shmbroker.shm.table import (END_BYTES, FLUSHED_OFFSET, SLOT_WORDS, VERSION_WORDS, WORD, PartitionState,
                                 PartitionTable)
from tests.record_batches import SharedTable, unique_shm_name

FORK = multiprocessing.get_context("fork")


pytestmark = pytest.mark.usefixtures("nothing_left_in_dev_shm")


def uniform_state(value: int) -> PartitionState:
    return PartitionState(*([value] * len(PartitionState._fields)))


def test_create_attach_publish_read_unlink():
    name = unique_shm_name("table")
    table = PartitionTable.create(name, 3)
    try:
        assert table.read(2) == PartitionState(*([0] * len(PartitionState._fields)))
        table.publish(1, PartitionState(log_end_offset=10, end_bytes=500, online=1))
        other = PartitionTable.attach(name)
        assert other.rows == 3 and other.read(1).log_end_offset == 10
        assert other.update(1, flushed_offset=10).end_bytes == 500
        assert table.read(1).flushed_offset == 10
        assert (table.read_field(1, END_BYTES), table.read_field(1, FLUSHED_OFFSET)) == (500, 10)
        assert [table.read_field(1, i) for i in range(len(PartitionState._fields))] == list(table.read(1))
        other.close()
        with pytest.raises(posix_ipc.ExistentialError):
            PartitionTable.create(name, 3)  # exclusive creation
        with pytest.raises(IndexError):
            table.read(3)
    finally:
        table.close()
        table.unlink()
    with pytest.raises(posix_ipc.ExistentialError):
        PartitionTable.attach(name)


def test_attach_refuses_foreign_memory():
    name = unique_shm_name("foreign")
    memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=4096)
    memory.close_fd()
    try:
        with pytest.raises(ValueError):
            PartitionTable.attach(name)
    finally:
        posix_ipc.unlink_shared_memory(name)


def test_vectorised_read_matches_row_reads():
    with SharedTable(rows=50) as table:
        for row in range(50):
            table.publish(row, PartitionState(log_end_offset=row * 3, end_bytes=row * 100))
        rows = table.read_rows()
        assert rows.shape == (50,)
        assert np.array_equal(rows["log_end_offset"], np.arange(50) * 3)
        some = table.read_rows([4, 9])
        assert list(some["end_bytes"]) == [400, 900]
        # One field of many rows (the timer's array path), in the rows' order, repeats allowed.
        picked = np.array([9, 4, 4, 49], np.int64)
        assert table.read_field_rows(picked, END_BYTES).tolist() == [900, 400, 400, 4900]
        assert table.read_field_rows(picked, 0).tolist() == [27, 12, 12, 147]


def _writer(name: str, row: int, count: int, ready) -> None:
    table = PartitionTable.attach(name)
    ready.set()
    for value in range(1, count + 1):
        table.publish(row, uniform_state(value))
    table.close()


def test_readers_never_see_a_torn_row_while_another_process_writes():
    with SharedTable(rows=2) as table:
        ready = FORK.Event()
        writer = FORK.Process(target=_writer, args=(table.name, 1, 200_000, ready))
        writer.start()
        try:
            assert ready.wait(10)
            deadline = time.monotonic() + 20
            seen = set()
            last_field = 0
            while writer.is_alive() and time.monotonic() < deadline:
                state = table.read(1)
                assert len(set(state)) == 1, state  # every field was written with the same value
                field = table.read_field(1, END_BYTES)  # one field alone: a published value, never going back
                assert field >= max(last_field, state[0]), (field, last_field, state[0])
                last_field = field
                rows = table.read_rows([0, 1])
                assert len(set(rows[1].tolist())) == 1
                both = table.read_field_rows(np.array([1, 1], np.int64), END_BYTES).tolist()
                assert min(both) >= field, (both, field)  # published values, never going back
                seen.add(state[0])
            writer.join(20)
            assert writer.exitcode == 0
            assert len(seen) > 2  # reads really overlapped the writes
            assert table.read(1) == uniform_state(200_000)
        finally:
            if writer.is_alive():
                os.kill(writer.pid, signal.SIGKILL)
                writer.join(5)


def _die_mid_publish(name: str) -> None:
    table = PartitionTable.attach(name)
    # What publish() does up to the version store, then death: the half-written slot must stay invisible.
    base = 64  # header
    memory = table._memory
    version = int.from_bytes(memory[base : base + 8], "little")
    slot = base + VERSION_WORDS * WORD + ((version + 1) & 1) * SLOT_WORDS * WORD
    memory[slot : slot + 8] = (999).to_bytes(8, "little")
    os.kill(os.getpid(), signal.SIGKILL)


def test_writer_killed_mid_publish_leaves_previous_state_readable():
    with SharedTable(rows=1) as table:
        table.publish(0, uniform_state(5))
        child = FORK.Process(target=_die_mid_publish, args=(table.name,))
        child.start()
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
        assert table.read(0) == uniform_state(5)
        table.publish(0, uniform_state(6))  # the next writer overwrites the half-written slot whole
        assert table.read(0) == uniform_state(6)
