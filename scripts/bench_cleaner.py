"""The log cleaner: how fast it cleans, and what it costs the clients while it works.

A dirty compacted log is built once (--dirty-mb of --value-bytes values over --keys keys, in 1000-record
batches, segments of --segment-mb), then two workloads run on copies of it:
- throughput: the cleaner (node.storage.cleaner, no rate limit) cleans a copy, against its baseline, a plain
  sequential copy of the same segment files (read, write, fsync), timed in the same run, alternating (ABBA:
  scripts/harness/abba.py). Reported: dirty log MB/s cleaned, the offset map's keys and memory (24 bytes a
  key), the process's peak RSS, and cleaner / copy. Target: >= 100 MB/s of dirty log.
- impact: one node, its cleaner with its default settings (cleaner.*: the rate, the survey period) on
  --impact-partitions dirty partitions;
  raw producer records/s (scripts/producer_perf.py's load) and end-to-end p99 (raw client,
  scripts/e2e_latency.py, a new topic each step) on other topics, in alternating steps with the cleaner
  running and stopped (SIGSTOP/SIGCONT), with how many cleaning steps ended with the cleaner still busy.
  The p99 is given two ways: the median of the rounds' ratios, and the ratio of each mode's p99 over all its
  samples pooled (steadier on a shared machine). Target: within 10% (records/s ratio >= 0.9 and p99 ratio
  <= 1.1). `--control` keeps the cleaner stopped in both modes (an A/A run: the bench's own noise and bias).

JSON lines with --json (a summary line per workload), a table otherwise. Only 127.0.0.1; every step is bounded.
    .venv/bin/python -m scripts.bench_cleaner [--workload throughput|impact] [--dirty-mb 1024] [--keys 1000000]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from shmbroker.node.storage.cleaner import MAP_ENTRY_BYTES, Cleaner, CleanerConfig
from shmbroker.node.storage.log import LogConfig
from shmbroker.node.storage.records import build_batch
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.tools.inspect import NodeReader
from scripts.harness import benchnode
from scripts.harness.abba import AlternatingRounds
from scripts.harness.nodeproc import NodeProcess
from scripts.e2e_latency import LatencyRun, run_raw
from scripts.producer_perf import RawProduceLoad, run_raw_producer
from shmbroker.shm.table import PartitionTable

SCRIPT = "bench_cleaner"
TOPIC = "dirty"
RECORDS_PER_BATCH = 1000
COPY_CHUNK = 4 << 20
BUSY_POLL_S = 0.2


def log(text: str) -> None:
    print(f"bench_cleaner: {text}", file=sys.stderr, flush=True)


def build_dirty_log(data_dir: Path, dirty_mb: int, keys: int, value_bytes: int, segment_mb: int,
                    partitions: int = 1) -> int:
    """A node data directory holding the compacted topic TOPIC with about dirty_mb of keyed updates in each of
    its partitions (the same batches in each), nothing cleaned yet; returns partition 0's log bytes."""
    data_dir.mkdir(parents=True)
    table_name = f"/shmbroker-bench-cleaner-{os.getpid()}"
    table = PartitionTable.create(table_name, partitions)
    store = PartitionStore(str(data_dir), table, LogConfig(), partitions)
    try:
        configs = {"cleanup.policy": "compact", "segment.bytes": str(segment_mb << 20)}
        code, message = store.create_topics([(TOPIC, partitions, configs)])[TOPIC]
        assert not code, message
        plogs = [store.log(store.row(TOPIC, partition)) for partition in range(partitions)]
        value = b"v" * value_bytes
        record_bytes = value_bytes + 20
        batches = max(1, (dirty_mb << 20) // (record_bytes * RECORDS_PER_BATCH))
        now = time.time_ns() // 1_000_000
        step = max(1, batches // 10)
        for number in range(batches):
            first = number * RECORDS_PER_BATCH
            batch = build_batch([(b"key-%09d" % ((first + i) % keys), value) for i in range(RECORDS_PER_BATCH)], now)
            for plog in plogs:
                plog.append(batch)
            if number % step == 0:
                log(f"building the dirty log ({partitions} partition(s)): {number * 100 // batches}%")
        for plog in plogs:
            plog.roll()
            plog.flush(indexes=True)
        return sum(s.sealed_size() for s in plogs[0].segments[:-1])
    finally:
        store.close()
        table.close()
        table.unlink()


def copy_partition(source: Path, target: Path) -> float:
    """A plain copy of a partition's segment files (read, write, fsync): the baseline. Returns its seconds."""
    target.mkdir(parents=True)
    started = time.monotonic()
    for path in sorted(source.iterdir()):
        if not path.is_file():
            continue
        with open(path, "rb") as reader, open(target / path.name, "wb") as writer:
            while chunk := reader.read(COPY_CHUNK):
                writer.write(chunk)
            writer.flush()
            os.fsync(writer.fileno())
    return time.monotonic() - started


def clean_copy(data_dir: Path) -> dict:
    """Clean the copy of TOPIC's partition in `data_dir` with no rate limit; what it did and took."""
    table_name = f"/shmbroker-bench-cleaner-{os.getpid()}-clean"
    table = PartitionTable.create(table_name, 4)
    store = PartitionStore(str(data_dir), table, LogConfig(), 4)
    try:
        store.recover_all()
        plog = store.log(store.row(TOPIC, 0))
        dirty = sum(s.sealed_size() for s in plog.segments[:-1])
        result = Cleaner(CleanerConfig(io_max_bytes_per_second=-1)).clean(plog)
        return {"dirty_bytes": dirty, "seconds": result.seconds, "keys": result.keys,
                "records_read": result.records_read, "records_kept": result.records_kept,
                "bytes_reclaimed": result.bytes_reclaimed}
    finally:
        store.close()
        table.close()
        table.unlink()


def throughput(args, work: Path) -> dict:
    template = work / "template"
    size = build_dirty_log(template, args.dirty_mb, args.keys, args.value_bytes, args.segment_mb)
    log(f"dirty log: {size / 1e6:.0f} MB over {args.keys:,} keys")
    rounds = AlternatingRounds("cleaner", "copy", args.runs)
    source = template / f"{TOPIC}-0"
    last_clean: dict = {}
    for step, (round_index, mode) in enumerate(rounds.steps(), 1):
        target = work / f"run-{step}"
        if mode == "copy":
            seconds = copy_partition(source, target / f"{TOPIC}-0")
            dirty = sum(p.stat().st_size for p in source.glob("*.log"))
            measured = {"mb_per_s": dirty / seconds / 1e6}
        else:
            shutil.copytree(template, target)
            outcome = clean_copy(target)
            measured = {"mb_per_s": outcome["dirty_bytes"] / outcome["seconds"] / 1e6}
            last_clean = outcome
        rounds.record(round_index, mode, measured)
        shutil.rmtree(target)
        log(f"[{step}/{2 * args.runs}] {mode}: {measured['mb_per_s']:.0f} MB/s")
    outcome = last_clean
    return {"script": SCRIPT, "workload": "throughput", "summary": True, "runs": args.runs,
            "dirty_mb": round(outcome["dirty_bytes"] / 1e6), "keys": outcome["keys"],
            "records_read": outcome["records_read"], "records_kept": outcome["records_kept"],
            "cleaner_mb_per_s": round(rounds.median("cleaner", "mb_per_s"), 1),
            "copy_mb_per_s": round(rounds.median("copy", "mb_per_s"), 1),
            "cleaner_over_copy": rounds.ratio("mb_per_s"),
            "offset_map_mb": round(outcome["keys"] * MAP_ENTRY_BYTES / 1e6, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "target": "cleaner_mb_per_s >= 100"}


def _cleaner(node: NodeProcess) -> tuple[bool, int, int]:
    """Whether the node's cleaner is cleaning now, how many cleanings it finished and the bytes they read."""
    reader = NodeReader.open(str(node.data_dir))
    try:
        rows = [row for row in reader.rows() if row.role == "cleaner"]
        return (any(row.get("cleaner_busy") for row in rows), sum(row.get("cleanings") for row in rows),
                sum(row.get("cleaner_bytes_read") for row in rows))
    finally:
        reader.close()


def impact(args, work: Path) -> dict:
    # One node, its cleaner at its default rate on --impact-partitions dirty partitions (enough to keep it
    # busy through the cleaning steps). Its steps alternate between the cleaner running (SIGCONT) and the
    # cleaner stopped (SIGSTOP; the hang watch off, so it is not replaced meanwhile): same node, same data,
    # only the cleaner's work differs.
    rounds = AlternatingRounds("cleaning", "idle", args.runs)
    data_dir = work / "impact"
    build_dirty_log(data_dir, args.dirty_mb, args.keys, args.value_bytes, args.segment_mb, args.impact_partitions)
    # The node's own cleaner settings unless --cleaner-setting says otherwise: its survey period too (the timer
    # surveys again right after each cleaning, so the cleaner stays busy without a short backoff_ms, and a
    # survey every 200 ms raised the cleaning steps' end-to-end p99 by about 30% in its own right).
    config = "[server]\nchild_hang_timeout_ms = 0\n[cleaner]\n" + "".join(
        f"{setting}\n" for setting in args.cleaner_setting)
    with NodeProcess(workers=args.workers, config=config, data_dir=data_dir, announce=True) as node:
        benchnode.create_topic(benchnode.LOOPBACK, node.port, "load", 4)
        deadline = time.monotonic() + 60  # the first survey comes backoff_ms (15 s) after the start
        while not _cleaner(node)[0]:
            if time.monotonic() > deadline:
                raise SystemExit("the cleaner never started on the dirty log")
            time.sleep(BUSY_POLL_S)
        cleaner_pid, = node.pids("cleaner")
        busy_steps = 0
        pooled: dict[str, list] = {"cleaning": [], "idle": []}  # each mode's latencies over all its steps
        try:
            for step, (round_index, mode) in enumerate(rounds.steps(), 1):
                running = mode == "cleaning" and not args.control
                os.kill(cleaner_pid, signal.SIGCONT if running else signal.SIGSTOP)
                produced = run_raw_producer(benchnode.LOOPBACK, node.port, RawProduceLoad("load", 4), args.seconds)
                # A new topic each step: the consumer of a reused one would start with the records of the last.
                topic = f"latency-{step}"
                benchnode.create_topic(benchnode.LOOPBACK, node.port, topic, 1)
                target = benchnode.Target(benchnode.LOOPBACK, node.port, str(node.data_dir), node)
                latency = run_raw(target, LatencyRun(topic, seconds=args.seconds))
                p99 = benchnode.percentiles_ms(latency.latencies_ns)["p99_ms"]
                pooled[mode].extend(latency.latencies_ns)
                busy = running and _cleaner(node)[0]  # still cleaning at the end of this step
                busy_steps += busy
                rounds.record(round_index, mode, {"records_per_s": produced.records / produced.elapsed_s,
                                                  "p99_ms": p99 or 0.0})
                log(f"[{step}/{2 * args.runs}] {mode}: {produced.records / produced.elapsed_s:,.0f} records/s, "
                    f"e2e p99 {p99} ms" + (f", cleaner busy at the end: {busy}" if mode == "cleaning" else ""))
        finally:
            os.kill(cleaner_pid, signal.SIGCONT)  # the node stops as usual
        _, cleanings, bytes_read = _cleaner(node)
    pooled_p99 = {mode: benchnode.percentiles_ms(latencies)["p99_ms"] or 0.0 for mode, latencies in pooled.items()}
    return {"script": SCRIPT, "workload": "impact", "summary": True, "rounds": args.runs, "control": args.control,
            "cleaner_busy_at_cleaning_step_ends": f"{busy_steps} of {args.runs}",
            # Whether it still gets on with its work under the load: cleanings finished by the end of the run.
            "cleanings_finished": cleanings, "cleaned_mb": round(bytes_read / 1e6),
            "cleaning_records_per_s": round(rounds.median("cleaning", "records_per_s")),
            "idle_records_per_s": round(rounds.median("idle", "records_per_s")),
            "records_per_s_ratio": rounds.ratio("records_per_s"),
            "cleaning_e2e_p99_ms": round(rounds.median("cleaning", "p99_ms"), 3),
            "idle_e2e_p99_ms": round(rounds.median("idle", "p99_ms"), 3),
            "e2e_p99_ratio": rounds.ratio("p99_ms"),
            # The p99 of all of a mode's samples together: steadier than any one step's.
            "pooled_cleaning_e2e_p99_ms": pooled_p99["cleaning"], "pooled_idle_e2e_p99_ms": pooled_p99["idle"],
            "pooled_e2e_p99_ratio": (round(pooled_p99["cleaning"] / pooled_p99["idle"], 4)
                                     if pooled_p99["idle"] else None),
            "target": "records_per_s_ratio >= 0.9 and e2e_p99_ratio <= 1.1"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_cleaner", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", action="append", choices=["throughput", "impact"],
                        help="default: both")
    parser.add_argument("--dirty-mb", type=int, default=1024, help="dirty log to build (default %(default)s)")
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct keys (default %(default)s)")
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes per value (default %(default)s)")
    parser.add_argument("--segment-mb", type=int, default=128, help="segment size (default %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="rounds of each mode (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=4.0, help="impact: seconds per measurement")
    parser.add_argument("--workers", type=int, default=2, help="impact: network workers of each node")
    parser.add_argument("--impact-partitions", type=int, default=2,
                        help="impact: dirty partitions of the cleaning node, to keep its cleaner busy throughout "
                             "(default %(default)s)")
    parser.add_argument("--cleaner-setting", action="append", default=[], metavar="'KEY = VALUE'",
                        help="impact: a [cleaner] setting of the node, as in its config file (repeatable)")
    parser.add_argument("--control", action="store_true",
                        help="impact: the cleaner stopped in both modes (an A/A run: the bench's own noise and bias)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if min(args.dirty_mb, args.keys, args.value_bytes, args.segment_mb, args.runs, args.impact_partitions) < 1 or args.seconds <= 0:
        parser.error("sizes, --runs and --seconds must be positive")
    work = Path(tempfile.mkdtemp(prefix="bench-cleaner-"))
    try:
        for workload in args.workload or ["throughput", "impact"]:
            row = (throughput if workload == "throughput" else impact)(args, work)
            if args.json:
                benchnode.emit(row, True)
            else:
                for key, value in row.items():
                    print(f"{key:>28}  {value}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
