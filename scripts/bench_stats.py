"""What the stats segment costs: raw producer throughput of a node with `[stats] enabled = true` against the
same node with stats disabled, in one run.

Both nodes run side by side (same code, same config but for the stats switch) and are measured in alternating
rounds (scripts/harness/abba.py: ABBA order, the ratio is the median of the rounds' own enabled/disabled
ratios); each measurement is one raw producer run of --seconds (scripts/producer_perf.py's load: 100-byte
records in 8 KiB batches, acks=1). Target: a cost of at most 3% (ratio >= 0.97). Beside throughput, the
workers' CPU time per record, which the other load of a shared machine moves less.
One JSON line per measurement and a summary line with --json; a table otherwise. Usage:
    .venv/bin/python -m scripts.bench_stats [--rounds 6] [--seconds 5] [--json]
"""

from __future__ import annotations

import argparse
import os
import sys

from scripts.harness import benchnode
from scripts.harness.abba import AlternatingRounds
from scripts.harness.nodeproc import NodeProcess
from scripts.producer_perf import RawProduceLoad, run_raw_producer

SCRIPT = "bench_stats"
PARTITIONS = 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_stats", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per node (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per round (default %(default)s)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.workers < 1:
        parser.error("--rounds, --seconds and --workers must be positive")
    rounds = AlternatingRounds("enabled", "disabled", args.rounds)
    steps = 2 * args.rounds
    with NodeProcess(workers=args.workers, config="[stats]\nenabled = true\n", announce=True) as on, \
            NodeProcess(workers=args.workers, config="[stats]\nenabled = false\n", announce=True) as off:
        nodes = {"enabled": on, "disabled": off}
        topics = {}
        for name, node in nodes.items():
            topics[name] = f"bench-stats-{name}-{os.getpid()}"
            benchnode.create_topic(benchnode.LOOPBACK, node.port, topics[name], PARTITIONS)
        for step, (round_index, name) in enumerate(rounds.steps(), 1):
            node = nodes[name]
            load = RawProduceLoad(topics[name], PARTITIONS)
            meter = benchnode.CpuMeter(node)
            with meter:
                outcome = run_raw_producer(benchnode.LOOPBACK, node.port, load, args.seconds)
            rate = outcome.records / outcome.elapsed_s if outcome.elapsed_s else 0.0
            # Worker CPU per record: less at the mercy of the shared machine than throughput (which is what the
            # other tenants' load moves most), so the cost shows here first if there is one.
            worker_cores = meter.fields.get("worker_cores") or 0.0
            per_record = worker_cores * outcome.elapsed_s / outcome.records * 1e9 if outcome.records else 0.0
            rounds.record(round_index, name, {"records_per_s": rate, "worker_cpu_ns_per_record": per_record})
            row = {"script": SCRIPT, "step": step, "of": steps, "stats": name, "records_per_s": round(rate),
                   "worker_cpu_ns_per_record": round(per_record, 1),
                   "errors": {str(k): v for k, v in outcome.errors.items()}}
            if args.json:
                benchnode.emit(row, True)
            else:
                print(f"[{step}/{steps}] stats {name}: {rate:,.0f} records/s", file=sys.stderr, flush=True)
    ratio = rounds.ratio("records_per_s")
    summary = {"script": SCRIPT, "summary": True, "rounds": args.rounds, "seconds": args.seconds,
               "enabled_median_records_per_s": round(rounds.median("enabled", "records_per_s")),
               "disabled_median_records_per_s": round(rounds.median("disabled", "records_per_s")),
               "ratio_median": ratio, "cost_percent": round(100 * (1 - ratio), 2) if ratio is not None else None,
               "enabled_worker_cpu_ns_per_record": round(rounds.median("enabled", "worker_cpu_ns_per_record"), 1),
               "disabled_worker_cpu_ns_per_record": round(rounds.median("disabled", "worker_cpu_ns_per_record"), 1),
               "cpu_per_record_ratio": rounds.ratio("worker_cpu_ns_per_record"),
               "target": "cost <= 3%"}
    if args.json:
        benchnode.emit(summary, True)
    else:
        print(f"stats enabled  {summary['enabled_median_records_per_s']:>12,} records/s (median)")
        print(f"stats disabled {summary['disabled_median_records_per_s']:>12,} records/s (median)")
        print(f"enabled/disabled: {summary['ratio_median']} (median of round ratios); cost {summary['cost_percent']}%")
        print(f"worker CPU per record: {summary['enabled_worker_cpu_ns_per_record']} ns enabled, "
              f"{summary['disabled_worker_cpu_ns_per_record']} ns disabled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
