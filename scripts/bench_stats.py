"""What the stats segment costs: raw producer throughput of a node with `[stats] enabled = true` against the
same node with stats disabled, in one run.

Both nodes run side by side (same code, same config but for the stats switch); rounds alternate between them
(ABBA order, so a drift of the shared machine hits both alike) and each round is one raw producer run of
--seconds (scripts/producer_perf.py's load: 100-byte records in 8 KiB batches, acks=1). The figure is the
median over rounds of enabled/disabled records/s; the issue's target is a cost of at most 3% (ratio >= 0.97).
One JSON line per round and a summary line with --json; a table otherwise. Usage:
    .venv/bin/python -m scripts.bench_stats [--rounds 6] [--seconds 5] [--json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from scripts.harness import benchnode
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
    rates: dict[str, list[float]] = {"enabled": [], "disabled": []}
    # Worker CPU per record: less at the mercy of the shared machine than throughput (which is what the
    # other tenants' load moves most), so the cost shows here first if there is one.
    cpu_ns: dict[str, list[float]] = {"enabled": [], "disabled": []}
    with NodeProcess(workers=args.workers, config="[stats]\nenabled = true\n", announce=True) as on, \
            NodeProcess(workers=args.workers, config="[stats]\nenabled = false\n", announce=True) as off:
        nodes = {"enabled": on, "disabled": off}
        topics = {}
        for name, node in nodes.items():
            topics[name] = f"bench-stats-{name}-{os.getpid()}"
            benchnode.create_topic(benchnode.LOOPBACK, node.port, topics[name], PARTITIONS)
        order = []
        for round_index in range(args.rounds):
            order += ["enabled", "disabled"] if round_index % 2 == 0 else ["disabled", "enabled"]
        for step, name in enumerate(order, 1):
            node = nodes[name]
            load = RawProduceLoad(topics[name], PARTITIONS)
            meter = benchnode.CpuMeter(node)
            with meter:
                outcome = run_raw_producer(benchnode.LOOPBACK, node.port, load, args.seconds)
            rate = outcome.records / outcome.elapsed_s if outcome.elapsed_s else 0.0
            rates[name].append(rate)
            worker_cores = meter.fields.get("worker_cores") or 0.0
            per_record = worker_cores * outcome.elapsed_s / outcome.records * 1e9 if outcome.records else 0.0
            cpu_ns[name].append(per_record)
            row = {"script": SCRIPT, "step": step, "of": len(order), "stats": name, "records_per_s": round(rate),
                   "worker_cpu_ns_per_record": round(per_record, 1),
                   "errors": {str(k): v for k, v in outcome.errors.items()}}
            if args.json:
                benchnode.emit(row, True)
            else:
                print(f"[{step}/{len(order)}] stats {name}: {rate:,.0f} records/s", file=sys.stderr, flush=True)
    pairs = [a / b for a, b in zip(rates["enabled"], rates["disabled"]) if b]
    summary = {"script": SCRIPT, "summary": True, "rounds": args.rounds, "seconds": args.seconds,
               "enabled_median_records_per_s": round(statistics.median(rates["enabled"])),
               "disabled_median_records_per_s": round(statistics.median(rates["disabled"])),
               "ratio_median": round(statistics.median(pairs), 4) if pairs else None,
               "ratio_of_medians": round(statistics.median(rates["enabled"]) / statistics.median(rates["disabled"]), 4),
               "cost_percent": round(100 * (1 - statistics.median(pairs)), 2) if pairs else None,
               "enabled_worker_cpu_ns_per_record": round(statistics.median(cpu_ns["enabled"]), 1),
               "disabled_worker_cpu_ns_per_record": round(statistics.median(cpu_ns["disabled"]), 1),
               "cpu_per_record_ratio": (round(statistics.median(cpu_ns["enabled"]) / statistics.median(cpu_ns["disabled"]), 4)
                                        if statistics.median(cpu_ns["disabled"]) else None),
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
