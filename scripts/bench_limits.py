"""What the node's bounds and limits cost: raw producer throughput and end-to-end latency with them on and
with them off, measured alternately in one run.

The bounds and limits (config `[server]`): the memory bound on requests and responses
(queued_max_request_bytes, connection_max_queued_response_bytes), the connection limits
(max_connections, max_connections_per_ip: set finite here so their accounting runs), the idle and
incomplete-request timeouts (connections_max_idle_ms, request_timeout_ms). "off" turns every one of them
off (-1, or Kafka's "no limit"); everything else (heartbeats included) is the same in both.

Both nodes run side by side for the whole run (scripts/harness/nodeproc.py, --workers workers each; the one
not being measured sits idle) and are measured in alternating rounds (scripts/harness/abba.py: ABBA order,
each ratio on/off the median of the rounds' own ratios), so the noise of a shared machine hits both alike at
a fine grain. Each round measures, on each node in turn:
- producer: producer_perf's raw load (acks=1, 8 KiB batches of 100-byte records, 4 connections with 8
  requests in flight each) for --producer-seconds: records/s, and the workers' CPU time per 1,000 records
  and per request;
- e2e: e2e_latency's raw client (one record per ms, acks=1, a long-polling consumer, a fresh topic per
  round, all created at the start) for --e2e-seconds: p50 and p99 of produce-to-receive.
The report gives every round's values, the median per mode, and the ratio on/off with its min and max.

    .venv/bin/python -m scripts.bench_limits [--runs 10] [--workers 2] [--json]

Only 127.0.0.1 is used; every measurement is bounded in time; nodes are stopped by pid.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from scripts import e2e_latency, producer_perf
from scripts.harness import abba, benchnode
from scripts.harness.nodeproc import LOOPBACK, NodeProcess

SCRIPT = "bench_limits"
MODES = {
    "on": ("[server]\nmax_connections = 100000\nmax_connections_per_ip = 100000\n"),
    "off": ("[server]\nqueued_max_request_bytes = -1\nconnection_max_queued_response_bytes = -1\n"
            "max_connections = 2147483647\nmax_connections_per_ip = 2147483647\n"
            "connections_max_idle_ms = -1\nrequest_timeout_ms = -1\n"),
}
METRICS = ("producer_records_per_s", "worker_cpu_us_per_1k_records", "worker_cpu_us_per_request", "e2e_p50_ms",
           "e2e_p99_ms")


def progress(args: argparse.Namespace, message: str) -> None:
    print(f"bench_limits: {message}", file=sys.stderr, flush=True)


def measure_producer(node: NodeProcess, topic: str, args: argparse.Namespace) -> dict:
    """Records/s, and the workers' CPU per 1,000 records (what the bounds cost per request, much less
    sensitive to other load on the machine than the rate)."""
    load = producer_perf.RawProduceLoad(topic, args.partitions, acks=1)
    started = time.monotonic()
    with benchnode.CpuMeter(node) as cpu:
        produced = producer_perf.run_raw_producer(LOOPBACK, node.port, load, args.producer_seconds)
    wall = time.monotonic() - started
    if produced.errors:
        raise RuntimeError(f"produce errors {produced.errors}")
    return {"producer_records_per_s": produced.records / produced.elapsed_s,
            "worker_cpu_us_per_1k_records": cpu.fields["worker_cores"] * wall / produced.records * 1e9,
            "worker_cpu_us_per_request": cpu.fields["worker_cores"] * wall / produced.requests * 1e6}


def measure_e2e(node: NodeProcess, topic: str, args: argparse.Namespace) -> dict:
    target = benchnode.Target(LOOPBACK, node.port, str(node.data_dir), node)
    outcome = e2e_latency.run_raw(target, e2e_latency.LatencyRun(topic, seconds=args.e2e_seconds))
    if outcome.send_errors or outcome.received < outcome.sent:
        raise RuntimeError(f"e2e lost {outcome.sent - outcome.received} of {outcome.sent}")
    latency = benchnode.percentiles_ms(outcome.latencies_ns)
    return {"e2e_p50_ms": latency["p50_ms"], "e2e_p99_ms": latency["p99_ms"]}


def main(argv: list[str] | None = None) -> int:
    parser = abba.ab_parser(SCRIPT, __doc__, 10, "rounds: one slice of each load on each node",
                            "one JSON object per measurement and a summary")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--producer-seconds", type=float, default=3.0)
    parser.add_argument("--e2e-seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.workers < 1 or args.partitions < 1 or args.producer_seconds <= 0 \
            or args.e2e_seconds <= 0:
        parser.error("counts and durations must be positive")
    rounds = abba.AlternatingRounds("on", "off", args.runs)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        nodes = {mode: stack.enter_context(NodeProcess(workers=args.workers, config=config, announce=True))
                 for mode, config in MODES.items()}
        for mode, node in nodes.items():
            benchnode.create_topic(LOOPBACK, node.port, f"limits-{mode}", args.partitions)
            # The latency topics up front: a topic is known to every worker a moment after its creation
            # returns, and the raw latency client does not retry UNKNOWN_TOPIC_OR_PARTITION.
            for run in range(args.runs):
                benchnode.create_topic(LOOPBACK, node.port, f"limits-e2e-{mode}-{run}", 1)
            measure_producer(node, f"limits-{mode}", argparse.Namespace(**{**vars(args), "producer_seconds": 1.0}))
        progress(args, f"both nodes up and warmed ({time.monotonic() - started:.0f} s)")
        for run in range(args.runs):
            order = rounds.order(run)
            got: dict[str, dict] = {mode: {} for mode in MODES}
            for mode in order:
                got[mode].update(measure_producer(nodes[mode], f"limits-{mode}", args))
            for mode in order:
                got[mode].update(measure_e2e(nodes[mode], f"limits-e2e-{mode}-{run}", args))
            for mode in MODES:
                rounds.record(run, mode, got[mode])
                if args.json:
                    benchnode.emit({"script": SCRIPT, "run": run + 1, "mode": mode, "workers": args.workers,
                                    **{k: round(v, 4) for k, v in got[mode].items()}}, True)
            progress(args, f"round {run + 1}/{args.runs}: " + "; ".join(
                f"{mode} {got[mode]['producer_records_per_s']:,.0f} records/s "
                f"({got[mode]['worker_cpu_us_per_1k_records']:,.0f} us CPU/1k), e2e p50 {got[mode]['e2e_p50_ms']:.3f} "
                f"ms, p99 {got[mode]['e2e_p99_ms']:.3f} ms" for mode in order)
                + f" ({time.monotonic() - started:.0f} s)")
    summary = {metric: rounds.compare(metric) for metric in METRICS}
    if args.json:
        benchnode.emit({"script": SCRIPT, "summary": summary, "runs": args.runs, "workers": args.workers,
                        "producer_seconds": args.producer_seconds, "e2e_seconds": args.e2e_seconds}, True)
    table = sys.stderr if args.json else sys.stdout  # with --json, stdout carries only JSON lines
    print(f"\n{'metric':30} {'on (median)':>14} {'off (median)':>14} {'on/off':>8} {'min':>7} {'max':>7}"
          f"   ({args.runs} rounds, ratio = median of the rounds' ratios)", file=table)
    for metric, row in summary.items():
        print(f"{metric:30} {row['on_median']:>14,.3f} {row['off_median']:>14,.3f} {row['ratio_median']:>8.3f} "
              f"{row['ratio_min']:>7.3f} {row['ratio_max']:>7.3f}", file=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
