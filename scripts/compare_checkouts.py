"""Before and after in one run: the same benchmark scripts, alternately from two checkouts of the node.

Each checkout's node is started here, the same way for both (scripts/harness/nodeproc.py running the
checkout's own `shmbroker` command, `<checkout>/.venv/bin/shmbroker`, from the checkout, then --settle-s for
every child to be up), and measured by that checkout's own scripts with its own venv
(`<checkout>/.venv/bin/python`, from the checkout) through --bootstrap: the figures compare the nodes, not
the checkouts' ways of starting them. A checkout's scripts run as modules (`python -m scripts.NAME`) when
its scripts/ is a package (scripts/__init__.py), else as files (`python scripts/NAME.py`). A fresh node per
script run. Runs alternate the order of the two (new, base, base, new, ...) so drift on a shared machine
hits both alike; the report gives per-metric medians, the ratio new/base (scripts/harness/abba.py: the
median of the runs' own ratios) and every run's values.

    .venv/bin/python -m scripts.compare_checkouts --base ../main-before --new . --runs 5 [--json]

Workloads (--workload, all by default) and their metrics, from the scripts' JSON lines: producer (raw
producer records/s, acks=1 and acks=all), consumer (raw consumer ceiling ratio and MB/s), e2e (end-to-end
p50/p99, raw and confluent-kafka clients), groups (bench_groups: heartbeat p99 of 1,000 members, OffsetCommit
rate of 10 committers; under a minute a run). Only 127.0.0.1 is used; every run is bounded by --timeout-s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from scripts.harness.abba import AlternatingRounds
from scripts.harness.nodeproc import NodeProcess


@dataclass(frozen=True)
class Workload:
    label: str
    script: str  # the module's name in scripts/
    args: tuple[str, ...]
    metrics: dict[str, tuple[dict[str, str], str]] = field(hash=False)  # metric: (row filter, field)
    data_dir: bool = False  # the script reads the node's segment files (--data-dir)


WORKLOADS = [
    Workload("producer", "producer_perf", ("--client", "raw", "--seconds", "5"),
             {"producer_raw_acks1_records_per_s": ({"acks": "1"}, "records_per_s"),
              "producer_raw_acksall_records_per_s": ({"acks": "all"}, "records_per_s")}),
    Workload("consumer", "consumer_perf", ("--client", "raw", "--records", "1000000", "--seconds", "30"),
             {"consumer_raw_ceiling_ratio": ({}, "ceiling_ratio"), "consumer_raw_mb_per_s": ({}, "mb_per_s")},
             data_dir=True),
    Workload("e2e", "e2e_latency", ("--seconds", "8"),
             {"e2e_raw_p50_ms": ({"client": "raw"}, "p50_ms"), "e2e_raw_p99_ms": ({"client": "raw"}, "p99_ms"),
              "e2e_confluent_p50_ms": ({"client": "confluent"}, "p50_ms"),
              "e2e_confluent_p99_ms": ({"client": "confluent"}, "p99_ms")}),
    Workload("groups", "bench_groups",
             ("--workload", "heartbeat", "--members", "1000", "--group-size", "10", "--connections", "8",
              "--seconds", "10", "--workload", "commit", "--committers", "10", "--commit-seconds", "5"),
             {"groups_heartbeat_p99_ms": ({"workload": "heartbeat"}, "p99_ms"),
              "groups_commits_per_s": ({"workload": "commit"}, "records_per_s")}),
]


def script_command(checkout: Path, script: str) -> list[str]:
    """How `checkout` runs one of its scripts, with its own venv, from the checkout as the current directory."""
    python = str(checkout / ".venv" / "bin" / "python")
    if (checkout / "scripts" / "__init__.py").exists():
        return [python, "-m", f"scripts.{script}"]
    return [python, str(checkout / "scripts" / f"{script}.py")]


def run_workload(checkout: Path, workload: Workload, timeout_s: float, workers: int, settle_s: float) -> list[dict]:
    node = NodeProcess(workers=workers, repo=checkout, wait_ready=False,
                       command=[str(checkout / ".venv" / "bin" / "shmbroker")])
    try:
        node.start()
        time.sleep(settle_s)
        extra = ["--bootstrap", node.bootstrap] + (["--data-dir", str(node.data_dir)] if workload.data_dir else [])
        done = subprocess.run([*script_command(checkout, workload.script), "--json", *workload.args, *extra],
                              cwd=checkout, capture_output=True, text=True, timeout=timeout_s)
    finally:
        node.close()
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: {workload.script} {' '.join(workload.args)} failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def pick(rows: list[dict], where: dict, field: str) -> float | None:
    for row in rows:
        if all(str(row.get(k)) == v for k, v in where.items()):
            return row.get(field)
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.compare_checkouts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, type=Path, help="checkout measured as the baseline")
    parser.add_argument("--new", required=True, type=Path, help="checkout compared with it")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="bound of one script run")
    parser.add_argument("--workers", type=int, default=2, help="network workers of each node")
    parser.add_argument("--settle-s", type=float, default=3.0, help="wait after a node answers, for every child")
    parser.add_argument("--workload", action="append", choices=[w.label for w in WORKLOADS],
                        help="the workloads to run (repeat it; default: all)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = parser.parse_args(argv)
    workloads = [w for w in WORKLOADS if not args.workload or w.label in args.workload]
    checkouts = {"base": args.base.resolve(), "new": args.new.resolve()}
    rounds = AlternatingRounds("new", "base", args.runs)
    started = time.monotonic()
    for run in range(args.runs):
        got: dict[str, dict[str, float]] = {"base": {}, "new": {}}
        for workload in workloads:
            for side in rounds.order(run):
                rows = run_workload(checkouts[side], workload, args.timeout_s, args.workers, args.settle_s)
                for metric, (where, field_name) in workload.metrics.items():
                    value = pick(rows, where, field_name)
                    if value is None:
                        raise RuntimeError(f"{checkouts[side]}: {workload.script} printed no {field_name} "
                                           f"where {where}, for {metric}")
                    got[side][metric] = value
            print(f"compare_checkouts: run {run + 1}/{args.runs} {workload.label} done "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
        for side, measured in got.items():
            rounds.record(run, side, measured)
    summary = {metric: rounds.compare(metric) for metric in rounds.measured["new"][0]}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{'metric':38} {'base':>12} {'new':>12} {'new/base':>9}  (medians of {args.runs} runs)")
        for metric, row in summary.items():
            print(f"{metric:38} {row['base_median']:>12.3f} {row['new_median']:>12.3f} {row['ratio_median']:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
