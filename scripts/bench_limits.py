"""What the node's bounds and limits cost: raw producer throughput and end-to-end latency with them on and
with them off, measured alternately in one run.

The bounds and limits (config `[server]`): the memory bound on requests and responses
(queued_max_request_bytes, connection_max_queued_response_bytes), the connection limits
(max_connections, max_connections_per_ip: set finite here so their accounting runs), the idle and
incomplete-request timeouts (connections_max_idle_ms, request_timeout_ms). "off" turns every one of them
off (-1, or Kafka's "no limit"); everything else (heartbeats included) is the same in both.

Each run starts a fresh node per mode (scripts/nodeproc.py, --workers workers) and measures, on it:
- producer: producer_perf's raw load (acks=1, 8 KiB batches of 100-byte records, 4 connections with 8
  requests in flight each) for --producer-seconds: records/s;
- e2e: e2e_latency's raw client (one record per ms, acks=1, a long-polling consumer) for --e2e-seconds:
  p50 and p99 of produce-to-receive.
Modes alternate (on, off, then off, on, ...) so drift on a shared machine hits both alike. The report gives
every run's values, the median per mode, and the median of the per-run ratios on/off.

    .venv/bin/python scripts/bench_limits.py --runs 5 [--json]

Only 127.0.0.1 is used; every measurement is bounded in time; nodes are stopped by pid.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchnode  # noqa: E402
import e2e_latency  # noqa: E402
import producer_perf  # noqa: E402
from nodeproc import LOOPBACK, NodeProcess  # noqa: E402

SCRIPT = "bench_limits"
MODES = {
    "on": ("[server]\nmax_connections = 100000\nmax_connections_per_ip = 100000\n"),
    "off": ("[server]\nqueued_max_request_bytes = -1\nconnection_max_queued_response_bytes = -1\n"
            "max_connections = 2147483647\nmax_connections_per_ip = 2147483647\n"
            "connections_max_idle_ms = -1\nrequest_timeout_ms = -1\n"),
}
METRICS = ("producer_records_per_s", "e2e_p50_ms", "e2e_p99_ms")


def progress(args: argparse.Namespace, message: str) -> None:
    print(f"bench_limits: {message}", file=sys.stderr, flush=True)


def measure(mode: str, args: argparse.Namespace, run: int) -> dict:
    """One node in `mode`: the producer load, then the latency run. Returns the metrics."""
    with NodeProcess(workers=args.workers, config=MODES[mode], announce=True) as node:
        target = benchnode.Target(LOOPBACK, node.port, str(node.data_dir), node)
        topic = f"limits-{mode}-{run}"
        benchnode.create_topic(LOOPBACK, node.port, topic, args.partitions)
        load = producer_perf.RawProduceLoad(topic, args.partitions, acks=1)
        produced = producer_perf.run_raw_producer(LOOPBACK, node.port, load, args.producer_seconds)
        if produced.errors:
            raise RuntimeError(f"{mode}: produce errors {produced.errors}")
        latency_topic = f"limits-e2e-{mode}-{run}"
        benchnode.create_topic(LOOPBACK, node.port, latency_topic, 1)
        outcome = e2e_latency.run_raw(target, e2e_latency.LatencyRun(latency_topic, seconds=args.e2e_seconds))
        if outcome.send_errors or outcome.received < outcome.sent:
            raise RuntimeError(f"{mode}: e2e lost {outcome.sent - outcome.received} of {outcome.sent}")
        latency = benchnode.percentiles_ms(outcome.latencies_ns)
        return {"producer_records_per_s": produced.records / produced.elapsed_s,
                "e2e_p50_ms": latency["p50_ms"], "e2e_p99_ms": latency["p99_ms"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--producer-seconds", type=float, default=5.0)
    parser.add_argument("--e2e-seconds", type=float, default=5.0)
    parser.add_argument("--json", action="store_true", help="one JSON object per measurement and a summary")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.workers < 1 or args.partitions < 1 or args.producer_seconds <= 0 \
            or args.e2e_seconds <= 0:
        parser.error("counts and durations must be positive")
    values: dict[str, dict[str, list[float]]] = {mode: {m: [] for m in METRICS} for mode in MODES}
    started = time.monotonic()
    for run in range(args.runs):
        order = ("on", "off") if run % 2 == 0 else ("off", "on")
        for mode in order:
            got = measure(mode, args, run)
            for metric in METRICS:
                values[mode][metric].append(got[metric])
            if args.json:
                benchnode.emit({"script": SCRIPT, "run": run + 1, "mode": mode, "workers": args.workers,
                                **{k: round(v, 4) for k, v in got.items()}}, True)
            progress(args, f"run {run + 1}/{args.runs} {mode}: {got['producer_records_per_s']:,.0f} records/s, "
                           f"e2e p50 {got['e2e_p50_ms']:.3f} ms, p99 {got['e2e_p99_ms']:.3f} ms "
                           f"({time.monotonic() - started:.0f} s)")
    summary = {}
    for metric in METRICS:
        on, off = values["on"][metric], values["off"][metric]
        ratios = [a / b for a, b in zip(on, off) if b]
        summary[metric] = {"on_median": round(statistics.median(on), 4), "off_median": round(statistics.median(off), 4),
                           "ratio_median": round(statistics.median(ratios), 4),
                           "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4),
                           "on": [round(v, 4) for v in on], "off": [round(v, 4) for v in off]}
    if args.json:
        benchnode.emit({"script": SCRIPT, "summary": summary, "runs": args.runs, "workers": args.workers,
                        "producer_seconds": args.producer_seconds, "e2e_seconds": args.e2e_seconds}, True)
    table = sys.stderr if args.json else sys.stdout  # with --json, stdout carries only JSON lines
    print(f"\n{'metric':26} {'on (median)':>14} {'off (median)':>14} {'on/off':>8} {'min':>7} {'max':>7}"
          f"   ({args.runs} runs, ratio = median of per-run ratios)", file=table)
    for metric, row in summary.items():
        print(f"{metric:26} {row['on_median']:>14,.3f} {row['off_median']:>14,.3f} {row['ratio_median']:>8.3f} "
              f"{row['ratio_min']:>7.3f} {row['ratio_max']:>7.3f}", file=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
