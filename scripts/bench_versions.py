"""What the newest protocol versions cost on the hot paths: raw producer and raw consumer records/s at the newest
Produce and Fetch versions the node serves (flexible: compact encodings and tagged fields; Fetch by topic id)
against the newest non-flexible ones, on one node, in one run.

One node (scripts/harness/nodeproc.py, --workers workers). Rounds alternate the two modes
(scripts/harness/abba.py: ABBA order; each ratio newest/non-flexible is the median of the rounds' own ratios).
A step of a mode runs, for --seconds each:
- scripts.producer_perf's raw load generator (pre-encoded batches, --connections sockets, --inflight requests
  each) at that mode's Produce version: records/s and the workers' CPU per 1,000 records;
- scripts.consumer_perf's raw consumer (pipelined fetches of a topic filled once before the rounds, read from
  offset 0 over and over until the time is up) at that mode's Fetch version: records/s and the workers' CPU
  per 1,000 records.
Any error code in a response fails the run. Target (issue 37): both records/s ratios >= 0.97.
--control: both modes use the newest versions (an A/A run: the bench's own noise).

    .venv/bin/python -m scripts.bench_versions [--runs 6] [--seconds 5] [--workers 2] [--json]

Only 127.0.0.1 is used; every measurement and wait is bounded in time; the node is stopped by pid.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from scripts import consumer_perf
from scripts.harness import abba, benchnode
from scripts.harness.nodeproc import NodeProcess
from scripts.producer_perf import RawProduceLoad, run_raw_producer

SCRIPT = "bench_versions"
METRICS = ("produce_records_per_s", "produce_worker_cpu_us_per_1k_records",
           "fetch_records_per_s", "fetch_worker_cpu_us_per_1k_records")
PRODUCE_TOPIC = "bench-versions-produce"
FETCH_TOPIC = "bench-versions-fetch"
TARGET_RATIO = 0.97
# Passes over the filled topic a consume step may take: more than --seconds allows, so time ends each step.
FETCH_PASSES = 1_000


@dataclass(frozen=True)
class Versions:
    produce: int
    fetch: int


NEWEST = Versions(produce=11, fetch=17)
NON_FLEXIBLE = Versions(produce=8, fetch=11)  # the last versions before KIP-482's flexible encodings


def measure(node: NodeProcess, args: argparse.Namespace, versions: Versions,
            filled: consumer_perf.FilledTopic) -> dict:
    pipeline = benchnode.PipelineSettings(connections=args.connections, inflight=args.inflight)
    load = RawProduceLoad(topic=PRODUCE_TOPIC, partitions=args.partitions, pipeline=pipeline,
                          produce_version=versions.produce)
    with benchnode.CpuMeter(node) as produce_cpu:
        produced = run_raw_producer("127.0.0.1", node.port, load, args.seconds)
    if produced.errors:
        raise RuntimeError(f"produce v{versions.produce} errors (code: responses) {produced.errors}")
    target = benchnode.Target("127.0.0.1", node.port, str(node.data_dir), node)
    with benchnode.CpuMeter(node) as fetch_cpu:
        fetched = consumer_perf.consume_raw(target, filled, args.fetch_bytes, args.connections, args.inflight,
                                            args.seconds, passes=FETCH_PASSES, fetch_version=versions.fetch)
    produce_rate = produced.records / produced.elapsed_s
    fetch_rate = fetched.records / fetched.elapsed_s
    return {"produce_records_per_s": produce_rate,
            "produce_worker_cpu_us_per_1k_records": produce_cpu.fields["worker_cores"] * 1e9 / produce_rate,
            "fetch_records_per_s": fetch_rate,
            "fetch_worker_cpu_us_per_1k_records": fetch_cpu.fields["worker_cores"] * 1e9 / fetch_rate}


def main(argv: list[str] | None = None) -> int:
    parser = abba.ab_parser(SCRIPT, __doc__, 6, "rounds: a step of each mode", "one JSON document on stdout")
    abba.add_pipeline_arguments(parser)
    parser.add_argument("--fetch-records", type=int, default=1_000_000, help="records in the consumed topic")
    parser.add_argument("--fetch-bytes", type=int, default=4 * 1024 * 1024, help="bytes asked per fetch")
    parser.add_argument("--control", action="store_true", help="the newest versions in both modes (A/A)")
    args = parser.parse_args(argv)
    if min(args.runs, args.partitions, args.connections, args.inflight, args.fetch_records) < 1 or args.seconds <= 0:
        parser.error("counts and --seconds must be positive")
    versions = {"newest": NEWEST, "non_flexible": NEWEST if args.control else NON_FLEXIBLE}
    rounds = abba.AlternatingRounds("newest", "non_flexible", args.runs)
    with tempfile.TemporaryDirectory(prefix="bench-versions-") as work_dir:
        node = NodeProcess(Path(work_dir), workers=args.workers, announce=True).start()
        try:
            target = benchnode.Target("127.0.0.1", node.port, str(node.data_dir), node)
            benchnode.create_topic("127.0.0.1", node.port, PRODUCE_TOPIC, args.partitions)
            filled = consumer_perf.fill_topic(target, FETCH_TOPIC, args.fetch_records, args.partitions,
                                              record_size=100, batch_bytes=8192, timeout_s=300.0)
            for round_index, mode in rounds.steps():
                values = measure(node, args, versions[mode], filled)
                rounds.record(round_index, mode, values)
                abba.log_step(SCRIPT, round_index, mode, values)
        finally:
            node.stop()
    report = {"script": SCRIPT, "workers": args.workers, "seconds": args.seconds, "control": args.control,
              "versions": {mode: vars(v) for mode, v in versions.items()}, "target_ratio": TARGET_RATIO,
              "metrics": {metric: rounds.compare(metric, 2) for metric in METRICS}}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"\n{'metric':40} {'newest/non-flexible':>20} {'min':>7} {'max':>7}")
        for metric, summary in report["metrics"].items():
            print(f"{metric:40} {summary['ratio_median']:>20} {summary['ratio_min']:>7} {summary['ratio_max']:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
