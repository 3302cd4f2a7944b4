"""Storage hot-path benchmark: microseconds per append of an 8 KiB batch and per fetch lookup.

Each measurement is paired with a baseline measured in the same run, so the ratio survives a noisy machine:
- append vs. the bare minimum an append must do (CRC-32C of the batch + one pwrite at the end);
- read lookup vs. one table read (the lock-free seqlock snapshot every read starts with);
- two processes appending to one partition (contending for its lock) vs. one process, aggregate appends/s;
- the timer's producer-snapshot round over --snapshot-partitions idle partitions (one idempotent batch each): the
  round in which each keeps the snapshot it has at its log end vs. one in which each writes and fsyncs its
  snapshot again (every round did, before a snapshot at the log end was kept; the files are removed first,
  outside the timing).
Prints one JSON line per measurement with --json (median of --runs runs), otherwise a table.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

import crc32c
import orjson

from shmbroker.node.storage.log import LogConfig, PartitionLog
from shmbroker.node.storage.producer_state import snapshot_name
from scripts.harness import rawkafka
from shmbroker.shm.table import PartitionTable


def per_call_us(function, calls: int) -> float:
    started = time.perf_counter_ns()
    for _ in range(calls):
        function()
    return (time.perf_counter_ns() - started) / calls / 1000


def one_run(directory: str, table: PartitionTable, batch: bytes, appends: int, reads: int, row: int) -> dict:
    config = LogConfig(segment_bytes=256 << 20)
    log = PartitionLog.recover(os.path.join(directory, f"bench-{row}"), table, row, config)
    append_us = per_call_us(lambda: log.append(batch), appends)

    baseline_fd = os.open(os.path.join(directory, f"baseline-{row}"), os.O_RDWR | os.O_CREAT, 0o644)
    position = [0]

    def bare_append():
        crc32c.crc32c(batch)
        os.pwrite(baseline_fd, batch, position[0])
        position[0] += len(batch)

    baseline_append_us = per_call_us(bare_append, appends)
    os.close(baseline_fd)

    end = log.state().log_end_offset
    rng = random.Random(row)
    offsets = [rng.randrange(end) for _ in range(reads)]
    iterator = iter(offsets)
    read_us = per_call_us(lambda: log.read(next(iterator), 1 << 20), reads)
    baseline_read_us = per_call_us(lambda: table.read(row), reads)
    log.close()
    return {
        "append_us": append_us,
        "baseline_append_us": baseline_append_us,
        "read_lookup_us": read_us,
        "baseline_table_read_us": baseline_read_us,
    }


def _contending_writer(directory: str, table_name: str, row: int, batch: bytes, appends: int) -> None:
    table = PartitionTable.attach(table_name)
    log = PartitionLog(directory, table, row, LogConfig(segment_bytes=256 << 20))
    for _ in range(appends):
        log.append(batch)
    log.close()
    table.close()


def contended_appends_per_s(directory: str, table: PartitionTable, row: int, batch: bytes, appends: int, writers: int):
    """Aggregate appends/s of `writers` processes appending to one partition (the fcntl lock contended)."""
    import multiprocessing

    partition = os.path.join(directory, f"contended-{row}")
    PartitionLog.recover(partition, table, row, LogConfig(segment_bytes=256 << 20)).close()
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(target=_contending_writer, args=(partition, table.name, row, batch, appends // writers))
        for _ in range(writers)
    ]
    started = time.perf_counter()
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    elapsed = time.perf_counter() - started
    if any(process.exitcode != 0 for process in processes):
        raise RuntimeError("a writer failed")
    return (appends // writers) * writers / elapsed


def snapshot_rounds_ms(directory: str, partitions: int, run: int) -> tuple[float, float]:
    """(ms of a round in which every partition writes its producer snapshot again, ms of one in which each keeps
    the one at its log end), over `partitions` idle partitions as the timer's round goes over them."""
    table = PartitionTable.create(f"/shmbroker-bench-snapshots-{os.getpid()}-{run}", partitions)
    logs = []
    try:
        for row in range(partitions):
            log = PartitionLog.recover(os.path.join(directory, f"snapshots-{run}-{row}"), table, row, LogConfig())
            logs.append(log)
            log.append(rawkafka.build_record_batch([b"v" * 100], producer_id=1000 + row, producer_epoch=0,
                                                   base_sequence=0))
            log.write_producer_snapshot()
        for log in logs:  # what every round did before: write and fsync each snapshot again
            os.unlink(os.path.join(log.directory, snapshot_name(log.state().log_end_offset)))
        started = time.perf_counter_ns()
        for log in logs:
            log.write_producer_snapshot()
        writing_ms = (time.perf_counter_ns() - started) / 1e6
        started = time.perf_counter_ns()
        for log in logs:
            log.write_producer_snapshot()
        return writing_ms, (time.perf_counter_ns() - started) / 1e6
    finally:
        for log in logs:
            log.close()
        table.close()
        table.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_storage", description=__doc__)
    parser.add_argument("--batch-bytes", type=int, default=8192)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--appends", type=int, default=20_000)
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--snapshot-partitions", type=int, default=1000, help="idle partitions of a snapshot round")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    batch = rawkafka.make_batch(rawkafka.records_for_batch_bytes(args.batch_bytes, args.record_bytes), args.record_bytes)
    directory = tempfile.mkdtemp(prefix="bench-storage-")
    name = f"/shmbroker-bench-storage-{os.getpid()}"
    table = PartitionTable.create(name, args.runs * 3)
    try:
        runs = [one_run(directory, table, batch, args.appends, args.reads, row) for row in range(args.runs)]
        for number, run in enumerate(runs):
            row = args.runs + 2 * number
            run["one_process_appends_per_s"] = contended_appends_per_s(directory, table, row, batch, args.appends, 1)
            run["two_process_appends_per_s"] = contended_appends_per_s(
                directory, table, row + 1, batch, args.appends, 2
            )
            run["snapshot_round_writing_ms"], run["snapshot_round_kept_ms"] = snapshot_rounds_ms(
                directory, args.snapshot_partitions, number)
            print(f"bench_storage: run {number + 1}/{args.runs} done", file=sys.stderr, flush=True)
    finally:
        table.close()
        table.unlink()
        shutil.rmtree(directory, ignore_errors=True)
    result = {"script": "bench_storage", "batch_bytes": len(batch), "runs": args.runs}
    for key in runs[0]:
        result[key] = round(statistics.median(run[key] for run in runs), 2)
    result["append_vs_baseline"] = round(result["append_us"] / result["baseline_append_us"], 2)
    result["read_vs_table_read"] = round(result["read_lookup_us"] / result["baseline_table_read_us"], 2)
    result["appends_per_s"] = round(1e6 / result["append_us"])
    result["two_vs_one_process"] = round(result["two_process_appends_per_s"] / result["one_process_appends_per_s"], 2)
    result["append_mb_per_s"] = round(len(batch) * result["appends_per_s"] / 1e6, 1)
    result["snapshot_partitions"] = args.snapshot_partitions
    result["snapshot_kept_vs_writing"] = round(statistics.median(
        run["snapshot_round_kept_ms"] / run["snapshot_round_writing_ms"] for run in runs), 4)
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")


if __name__ == "__main__":
    main()
