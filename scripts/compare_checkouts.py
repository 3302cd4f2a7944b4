"""Before and after in one run: the same benchmark scripts, alternately from two checkouts of the node.

Each checkout's node is started here, the same way for both (scripts/harness/nodeproc.py with the checkout as its
code, then --settle-s for every child to be up), and measured by that checkout's own scripts with its own venv
(`<checkout>/.venv/bin/python`) through --bootstrap: the figures compare the nodes, not the checkouts' ways of
starting them. A fresh node per script run. Runs alternate (base, new, new, base, ...) so drift on a shared
machine hits both alike; the report gives per-metric medians, the median of the per-run ratios new/base,
and every run's values.

    scripts/compare_checkouts.py --base ../main-before --new . --runs 5 [--json]

Metrics (from the scripts' JSON lines): raw producer records/s (acks=1 and acks=all), raw consumer
ceiling ratio and MB/s, end-to-end p50/p99 (raw and confluent-kafka clients). Only 127.0.0.1 is used
(the scripts start their nodes there); every run is bounded by --timeout-s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.harness.nodeproc import NodeProcess

# (label, script and arguments, {metric name: (row filter, field)})
WORKLOADS = [
    ("producer", ["producer_perf.py", "--client", "raw", "--seconds", "5"],
     {"producer_raw_acks1_records_per_s": ({"acks": "1"}, "records_per_s"),
      "producer_raw_acksall_records_per_s": ({"acks": "all"}, "records_per_s")}),
    ("consumer", ["consumer_perf.py", "--client", "raw", "--records", "1000000", "--seconds", "30"],
     {"consumer_raw_ceiling_ratio": ({}, "ceiling_ratio"), "consumer_raw_mb_per_s": ({}, "mb_per_s")}),
    ("e2e", ["e2e_latency.py", "--seconds", "8"],
     {"e2e_raw_p50_ms": ({"client": "raw"}, "p50_ms"), "e2e_raw_p99_ms": ({"client": "raw"}, "p99_ms"),
      "e2e_confluent_p50_ms": ({"client": "confluent"}, "p50_ms"),
      "e2e_confluent_p99_ms": ({"client": "confluent"}, "p99_ms")}),
]


def run_workload(checkout: Path, args: list[str], timeout_s: float, workers: int, settle_s: float) -> list[dict]:
    python = checkout / ".venv" / "bin" / "python"
    node = NodeProcess(workers=workers, repo=checkout, wait_ready=False)
    try:
        node.start()
        time.sleep(settle_s)
        extra = ["--bootstrap", node.bootstrap, "--data-dir", str(node.data_dir)] if args[0] == "consumer_perf.py" \
            else ["--bootstrap", node.bootstrap]
        done = subprocess.run([str(python), str(checkout / "scripts" / args[0]), "--json", *args[1:], *extra],
                              cwd=checkout, capture_output=True, text=True, timeout=timeout_s)
    finally:
        node.close()
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: {' '.join(args)} failed:\n{done.stderr[-3000:]}")
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
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = parser.parse_args(argv)
    checkouts = {"base": args.base.resolve(), "new": args.new.resolve()}
    values: dict[str, dict[str, list[float]]] = {"base": {}, "new": {}}
    started = time.monotonic()
    for run in range(args.runs):
        order = ("base", "new") if run % 2 == 0 else ("new", "base")
        for label, script_args, metrics in WORKLOADS:
            for side in order:
                rows = run_workload(checkouts[side], script_args, args.timeout_s, args.workers, args.settle_s)
                for metric, (where, field) in metrics.items():
                    value = pick(rows, where, field)
                    if value is not None:
                        values[side].setdefault(metric, []).append(value)
            print(f"compare_checkouts: run {run + 1}/{args.runs} {label} done "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    summary = {}
    for metric in values["base"]:
        base, new = values["base"][metric], values["new"].get(metric, [])
        ratios = [n / b for b, n in zip(base, new) if b]
        summary[metric] = {"base_median": statistics.median(base), "new_median": statistics.median(new) if new else None,
                           "ratio_median": round(statistics.median(ratios), 3) if ratios else None,
                           "base": base, "new": new}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{'metric':38} {'base':>12} {'new':>12} {'new/base':>9}  (medians of {args.runs} runs)")
        for metric, row in summary.items():
            print(f"{metric:38} {row['base_median']:>12.3f} {row['new_median']:>12.3f} {row['ratio_median']:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
