"""The watches table: each worker writes its own row of counts, other processes read the same counts."""

from __future__ import annotations

import multiprocessing
import os

import posix_ipc

from shmbroker.shm.interest import WorkerWatches

ROWS = 64


def _read_in_child(name: str, out) -> None:
    watches = WorkerWatches.attach(name)
    out.put((watches.workers, int(watches.counts[0, 3]), int(watches.counts[1, 3]), int(watches.counts[2, 5])))
    watches.close()


def test_each_worker_has_its_own_row_seen_by_other_processes():
    name = f"/shmbroker-twatches{os.getpid()}-watches"
    watches = WorkerWatches.create(name, 3, ROWS)
    try:
        assert watches.workers == 3 and watches.counts.shape == (3, ROWS) and not watches.counts.any()
        watches.counts[0, 3] += 2
        watches.counts[2, 5] += 1
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        child = context.Process(target=_read_in_child, args=(name, results))
        child.start()
        assert results.get(timeout=30) == (3, 2, 0, 1), "worker 1's row is untouched by worker 0's counts"
        child.join(timeout=30)
    finally:
        watches.close()
        posix_ipc.unlink_shared_memory(name)
    assert not any("twatches" in n for n in os.listdir("/dev/shm"))
