"""What the quota check costs when no client is throttled: raw producer throughput of a node with quotas
disabled against the same node with a default quota every client is checked against but none reaches
(1 TB/s for produce and fetch), in the same run.

Each run starts the two nodes one after the other and drives each with scripts/producer_perf.py (raw client,
acks=1, --seconds each); runs alternate the order of the modes (scripts/harness/abba.py: ABBA order) so a
drift of the shared machine falls on both. Reported: records/s per trial, the medians, and the ratio
quotas-on / quotas-off, the median of the runs' own ratios (target >= 0.97); and the node's CPU time per
record (all its processes), whose on/off ratio is the cost with less of the noise of a shared machine.

Only 127.0.0.1; bounded by --runs x 2 x (--seconds + node start). Usage:
    .venv/bin/python -m scripts.bench_quotas [--runs 6] [--seconds 8] [--json]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import psutil

from scripts.harness import abba, benchnode
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
    parser = abba.ab_parser(SCRIPT, __doc__, 6, "pairs of trials, the order alternating (even)",
                            "one JSON object per line")
    parser.add_argument("--settle-s", type=float, default=2.0, help="pause after the sync before each trial")
    parser.add_argument("--seconds", type=float, default=8.0, help="producer time per trial")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.seconds <= 0:
        parser.error("--runs >= 1 and --seconds > 0")
    rounds = abba.AlternatingRounds("on", "off", args.runs)
    rows = []
    for run, mode in rounds.steps():
        progress(f"run {run + 1}/{args.runs}: quotas {mode}")
        rows.append(trial(args, mode))
        rounds.record(run, mode, {metric: rows[-1][metric] for metric in ("records_per_s", "node_cpu_ns_per_record")})
        progress(f"  {rows[-1]['records_per_s']:,.0f} records/s")
    summary = {"script": SCRIPT, "summary": True, "runs": args.runs,
               "off_records_per_s": rounds.median("off", "records_per_s"),
               "on_records_per_s": rounds.median("on", "records_per_s"),
               "median_run_ratio": rounds.ratio("records_per_s"), "run_ratios": rounds.ratios("records_per_s"),
               "off_node_cpu_ns_per_record": rounds.median("off", "node_cpu_ns_per_record"),
               "on_node_cpu_ns_per_record": rounds.median("on", "node_cpu_ns_per_record"),
               "cpu_per_record_ratio": rounds.ratio("node_cpu_ns_per_record")}
    if args.json:
        for row in rows:
            benchnode.emit(row, True)
        benchnode.emit(summary, True)
    else:
        print(f"\n{'run':>3} {'quotas off':>14} {'quotas on':>14} {'on/off':>8}")
        for index, (on, off, ratio) in enumerate(zip(rounds.values("on", "records_per_s"),
                                                      rounds.values("off", "records_per_s"), summary["run_ratios"])):
            print(f"{index + 1:>3} {off:>14,.0f} {on:>14,.0f} {ratio:>8.3f}")
        print(f"median {summary['off_records_per_s']:>11,.0f} {summary['on_records_per_s']:>14,.0f} "
              f"{summary['median_run_ratio']:>8.3f}   (median of the runs' ratios; target >= 0.97)")
        print(f"node CPU per record: off {summary['off_node_cpu_ns_per_record']} ns, "
              f"on {summary['on_node_cpu_ns_per_record']} ns (ratio {summary['cpu_per_record_ratio']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
