"""Topic administration in the live node: how long creating partitions takes, through CreateTopics as clients
send it, against a validate-only baseline measured in the same run (the same request, every check, nothing
created: what the protocol, the worker and the timer cost without the creation itself).

The node's creation is also set beside the filesystem's own cost in the same run (`floor`): making the same
directories and segment files (Segment.create_files, one partition after another) in a sibling directory of
the node's data dir. On a virtual disk that cost swings many-fold with the state of the page cache (file
creation reads evicted inode bitmaps), so only the ratio to it compares runs.

Shapes (each --runs times on the same node, fresh topic names each run; the medians are reported):
- batch: one CreateTopics request of --topics topics of --partitions partitions (default 250 x 4 = 1,000
  partitions); the time to its answer, and until Metadata lists every partition;
- wide: one topic of --topics x --partitions partitions (1,000) in one request;
- sequential: --sequential requests one after the other, one topic of --partitions each (librdkafka's test
  0045 pattern: 100 topics of 4); the time per topic.
Target: 1,000 partitions created in under 1 s (batch and wide).

Prints one JSON line per shape with --json (medians, every run, the baseline and the ratio), else a table;
progress goes to stderr. Only 127.0.0.1; every wait is bounded. Usage:
    .venv/bin/python -m scripts.bench_admin [--runs 5] [--topics 250] [--partitions 4] [--json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import sys
import time
from typing import Any

from shmbroker.node.storage.log import LogConfig
from shmbroker.node.storage.segment import Segment
from scripts.harness import benchnode
from scripts.harness import rawkafka as R

SCRIPT = "bench_admin"
CREATE_VERSION = 4
TIMEOUT_MS = 60_000
METADATA_WAIT_S = 60.0
METADATA_POLL_S = 0.01


def progress(text: str) -> None:
    print(f"[{SCRIPT}] {text}", file=sys.stderr, flush=True)


def create(conn: R.RawConnection, topics: dict[str, int], validate_only: bool) -> float:
    """Seconds until the CreateTopics answer; raises on any error in it."""
    body = R.create_topics_body(topics, timeout_ms=TIMEOUT_MS, version=CREATE_VERSION, validate_only=validate_only)
    started = time.perf_counter()
    response = conn.call(R.CREATE_TOPICS, CREATE_VERSION, body)
    elapsed = time.perf_counter() - started
    errors = {t.name: (int(t.error_code), t.error_message) for t in response.topics if int(t.error_code)}
    if errors:
        raise RuntimeError(f"CreateTopics errors: {dict(list(errors.items())[:5])}")
    return elapsed


def visible(conn: R.RawConnection, topics: dict[str, int]) -> None:
    """Wait until Metadata lists every partition of `topics`."""
    deadline = time.monotonic() + METADATA_WAIT_S
    names = list(topics)
    while time.monotonic() < deadline:
        meta = conn.call(R.METADATA, 8, R.metadata_body(names, allow_auto_topic_creation=False))
        seen = {t.name: len(t.partitions) for t in meta.topics if int(t.error_code) == 0}
        if all(seen.get(name, 0) >= count for name, count in topics.items()):
            return
        time.sleep(METADATA_POLL_S)
    raise RuntimeError(f"{len(topics)} topics not all visible after {METADATA_WAIT_S}s")


def filesystem_floor(data_dir: str | None, partitions: int, label: str) -> dict[str, float]:
    """Seconds to make `partitions` partition directories with their segment files next to `data_dir`, one
    after another, as the node makes them; nothing when the node is not ours (--bootstrap)."""
    if data_dir is None:
        return {}
    root = tempfile.mkdtemp(prefix=f"floor-{label}-", dir=os.path.dirname(os.path.abspath(data_dir)))
    try:
        started = time.perf_counter()
        for i in range(partitions):
            directory = os.path.join(root, f"p-{i}")
            os.mkdir(directory)
            Segment.create_files(directory, 0, LogConfig().index_max_bytes)
        return {"floor_s": time.perf_counter() - started}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_shape(conn: R.RawConnection, shape: str, args: Any, run: int, data_dir: str | None) -> dict[str, float]:
    prefix = f"bench-admin-{os.getpid()}-{shape}-{run}"
    if shape == "batch":
        topics = {f"{prefix}-{i}": args.partitions for i in range(args.topics)}
    else:
        topics = {prefix: args.topics * args.partitions}
    baseline = create(conn, topics, validate_only=True)
    floor = filesystem_floor(data_dir, sum(topics.values()), f"{shape}-{run}")
    answered = create(conn, topics, validate_only=False)
    started = time.perf_counter()
    visible(conn, topics)
    return {"baseline_s": baseline, "create_s": answered,
            "visible_s": answered + time.perf_counter() - started, **floor}


def run_sequential(conn: R.RawConnection, args: Any, run: int) -> dict[str, float]:
    prefix = f"bench-admin-{os.getpid()}-seq-{run}"
    baselines, creations = [], []
    for i in range(args.sequential):
        topic = {f"{prefix}-{i}": args.partitions}
        baselines.append(create(conn, topic, validate_only=True))
        creations.append(create(conn, topic, validate_only=False))
    return {"baseline_s": statistics.median(baselines), "create_s": statistics.median(creations),
            "total_s": sum(creations)}


def summarise(shape: str, runs: list[dict[str, float]], partitions: int, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"script": SCRIPT, "shape": shape, "partitions": partitions, "runs": len(runs)}
    for key in runs[0]:
        row[f"{key[:-2]}_ms_median"] = round(statistics.median(r[key] for r in runs) * 1000, 2)
        row[f"{key[:-2]}_ms_all"] = [round(r[key] * 1000, 2) for r in runs]
    row["create_over_baseline"] = round(row["create_ms_median"] / row["baseline_ms_median"], 2)
    if "floor_ms_median" in row:  # per run, then the median: the floor moves with the disk's state
        row["create_over_floor"] = round(statistics.median(r["create_s"] / r["floor_s"] for r in runs), 2)
    row["us_per_partition"] = round(row["create_ms_median"] * 1000 / partitions, 1)
    row.update(extra)
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'shape':11} {'partitions':>10} {'created (median)':>17} {'visible':>10} {'validate-only':>14} "
          f"{'files alone':>12} {'x files':>8} {'per partition':>14}  target")
    for row in rows:
        visible_ms = row.get("visible_ms_median")
        floor_ms = row.get("floor_ms_median")
        target = "< 1000 ms" if row["shape"] != "sequential" else "per topic"
        print(f"{row['shape']:11} {row['partitions']:>10} {row['create_ms_median']:>14.1f} ms "
              f"{(f'{visible_ms:.1f} ms' if visible_ms is not None else '-'):>10} "
              f"{row['baseline_ms_median']:>11.1f} ms "
              f"{(f'{floor_ms:.1f} ms' if floor_ms is not None else '-'):>12} {row.get('create_over_floor', '-'):>8} "
              f"{row['us_per_partition']:>11.1f} us  {target}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_admin", description=__doc__.split("\n\n")[0])
    benchnode.add_common_arguments(parser, default_seconds=0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--topics", type=int, default=250)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--sequential", type=int, default=100, help="topics created one request each")
    parser.add_argument("--shape", action="append", choices=["batch", "wide", "sequential"])
    parser.add_argument("--create-threads", type=int, help="the node's [topics] create_threads (default: its own)")
    args = parser.parse_args(argv)
    if min(args.runs, args.topics, args.partitions, args.sequential) < 1:
        parser.error("counts must be positive")
    shapes = args.shape or ["batch", "wide", "sequential"]
    per_run = args.topics * args.partitions * sum(1 for s in shapes if s != "sequential") + (
        args.sequential * args.partitions if "sequential" in shapes else 0)
    config = f"[topics]\nmax_partitions = {per_run * args.runs + 64}\n"
    if args.create_threads:
        config += f"create_threads = {args.create_threads}\n"
    rows = []
    with benchnode.node_for(args, config_toml=config) as target:
        with R.RawConnection(target.host, target.port, timeout_s=TIMEOUT_MS / 1000 + 10) as conn:
            for shape in shapes:
                runs = []
                for run in range(args.runs):
                    if shape == "sequential":
                        runs.append(run_sequential(conn, args, run))
                    else:
                        runs.append(run_shape(conn, shape, args, run, target.data_dir))
                    progress(f"{shape} run {run + 1}/{args.runs}: created in {runs[-1]['create_s'] * 1000:.1f} ms "
                             f"(validate-only {runs[-1]['baseline_s'] * 1000:.1f} ms)")
                if shape == "sequential":
                    row = summarise(shape, runs, args.partitions, topics=args.sequential,
                                    workers=None if args.bootstrap else args.workers)
                else:
                    row = summarise(shape, runs, args.topics * args.partitions,
                                    topics=args.topics if shape == "batch" else 1,
                                    workers=None if args.bootstrap else args.workers)
                row["create_threads"] = args.create_threads
                benchnode.emit(row, args.json)
                rows.append(row)
    if not args.json:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
