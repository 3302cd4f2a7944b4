"""The interest table: one writer counts, other processes read the same counts."""

from __future__ import annotations

import multiprocessing
import os

from shm.interest import InterestTable


def _read_in_child(name: str, row: int, out) -> None:
    table = InterestTable.attach(name)
    out.put(int(table.counts[row]))
    table.close()


def test_counts_are_shared_and_never_negative():
    name = f"/shmbroker-tinterest{os.getpid()}-interest"
    table = InterestTable.create(name, 64)
    try:
        table.add([3, 5], +1)
        table.add([3], +1)
        table.add([5], -1)
        table.add([5], -1)  # more releases than waiters must not wrap around
        assert (table.watched(3), table.watched(5), table.watched(4)) == (True, False, False)
        results = multiprocessing.get_context("spawn").Queue()
        child = multiprocessing.get_context("spawn").Process(target=_read_in_child, args=(name, 3, results))
        child.start()
        assert results.get(timeout=30) == 2
        child.join(timeout=30)
    finally:
        table.close()
        import posix_ipc
        posix_ipc.unlink_shared_memory(name)
    assert not any("tinterest" in n for n in os.listdir("/dev/shm"))
