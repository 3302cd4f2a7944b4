"""What the quota check costs when no client is throttled: raw producer throughput of a node with quotas
disabled against the same node with a default quota every client is checked against but none reaches
(1 TB/s for produce and fetch), in the same run.

Each run starts the two nodes one after the other and drives each with scripts/producer_perf.py (raw client,
acks=1, --seconds each); runs alternate the order of the modes so a drift of the shared machine falls on
both. Reported: records/s per trial, the medians, and the ratio quotas-on / quotas-off (target >= 0.97); and
the node's CPU time per record (all its processes), whose on/off ratio is the cost with less of the noise of
a shared machine.

Only 127.0.0.1; bounded by --runs x 2 x (--seconds + node start). Usage:
    .venv/bin/python -m scripts.bench_quotas [--runs 6] [--seconds 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import psutil

from scripts.harness import benchnode
from scripts.harness.nodeproc import NodeProcess

SCRIPT = "bench_quotas"
UNREACHABLE = 10**12  # bytes/s: every request is measured and checked, none is throttled
MODES = {
    "off": "",
    "on": f"[quotas]\n[quotas.default]\nproducer_byte_rate = {UNREACHABLE}\nconsumer_byte_rate = {UNREACHABLE}\n",
}


def progress(line: str) -> None:
    print(f"{SCRIPT}: {line}", file=sys.stderr, flush=True)


def trial(args: Any, mode: str) -> dict[str, Any]:
    # The previous trial's writes (GBs of page cache) are written back now, not during this trial.
    os.sync()
    time.sleep(args.settle_s)
    with NodeProcess(workers=args.workers, config=MODES[mode], announce=True) as node:
        processes = [psutil.Process(pid) for pid in [node.proc.pid] + node.pids()]
        cpu_before = sum(cpu_seconds(process) for process in processes)
        done = subprocess.run(
            [sys.executable, "-m", "scripts.producer_perf", "--bootstrap", node.bootstrap,
             "--client", "raw", "--acks", "1", "--seconds", str(args.seconds), "--json"],
            capture_output=True, text=True, timeout=args.seconds + 120)
        if done.returncode != 0:
            raise SystemExit(f"producer_perf failed: {done.stderr[-2000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        node_cpu = sum(cpu_seconds(process) for process in processes) - cpu_before
    # CPU per record: what the check costs, steadier than throughput on a machine shared with other work.
    return {**row, "script": SCRIPT, "quotas": mode, "node_cpu_ns_per_record": round(node_cpu / row["records"] * 1e9, 1)}


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_quotas", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=benchnode.DEFAULT_WORKERS)
    parser.add_argument("--runs", type=int, default=6, help="pairs of trials, the order alternating (even)")
    parser.add_argument("--settle-s", type=float, default=2.0, help="pause after the sync before each trial")
    parser.add_argument("--seconds", type=float, default=8.0, help="producer time per trial")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.seconds <= 0:
        parser.error("--runs >= 1 and --seconds > 0")
    rows = []
    for run in range(args.runs):
        for mode in (("off", "on") if run % 2 == 0 else ("on", "off")):
            progress(f"run {run + 1}/{args.runs}: quotas {mode}")
            rows.append(trial(args, mode))
            progress(f"  {rows[-1]['records_per_s']:,.0f} records/s")
    medians = {mode: statistics.median(row["records_per_s"] for row in rows if row["quotas"] == mode)
               for mode in MODES}
    # Each run's own ratio too: the pair ran minutes apart at most, so noise between runs cancels.
    pairs = [rows[i:i + 2] for i in range(0, len(rows), 2)]
    ratios = [next(r for r in pair if r["quotas"] == "on")["records_per_s"] /
              next(r for r in pair if r["quotas"] == "off")["records_per_s"] for pair in pairs]
    cpu = {mode: statistics.median(row["node_cpu_ns_per_record"] for row in rows if row["quotas"] == mode)
           for mode in MODES}
    summary = {"script": SCRIPT, "summary": True, "runs": args.runs, "off_records_per_s": medians["off"],
               "off_node_cpu_ns_per_record": cpu["off"], "on_node_cpu_ns_per_record": cpu["on"],
               "cpu_per_record_ratio": round(cpu["on"] / cpu["off"], 4),
               "on_records_per_s": medians["on"], "ratio_of_medians": round(medians["on"] / medians["off"], 4),
               "median_run_ratio": round(statistics.median(ratios), 4),
               "geomean_run_ratio": round(statistics.geometric_mean(ratios), 4), "run_ratios": [round(r, 4) for r in ratios]}
    if args.json:
        for row in rows:
            benchnode.emit(row, True)
        benchnode.emit(summary, True)
    else:
        print(f"\n{'run':>3} {'quotas off':>14} {'quotas on':>14} {'on/off':>8}")
        for index, (pair, ratio) in enumerate(zip(pairs, ratios)):
            by = {row["quotas"]: row["records_per_s"] for row in pair}
            print(f"{index + 1:>3} {by['off']:>14,.0f} {by['on']:>14,.0f} {ratio:>8.3f}")
        print(f"median {medians['off']:>11,.0f} {medians['on']:>14,.0f} {summary['ratio_of_medians']:>8.3f}"
              f"   (runs' ratios: median {summary['median_run_ratio']}, "
              f"geometric mean {summary['geomean_run_ratio']}; target >= 0.97)")
        print(f"node CPU per record: off {cpu['off']} ns, on {cpu['on']} ns (ratio {summary['cpu_per_record_ratio']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
