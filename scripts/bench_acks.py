"""acks=all against acks=1 in one run: what group commit costs, at the loads that matter.

One node; for each load point, alternating rounds of acks=all and acks=1 (scripts/harness/abba.py: ABBA
order, so a drift of the shared machine hits both alike), each measurement one raw producer run of --seconds
(scripts/producer_perf.py's load: 100-byte records, Produce requests over sockets with requests in flight, a
fresh topic per acks). Per point: medians over rounds of records/s, request p50 and p99 for each acks, and
acks=all / acks=1 (records/s: the median of the rounds' own ratios). Each round's row also gives the timer's and
the workers' CPU microseconds per Produce request (`timer_us_per_op`, `worker_us_per_op`): under acks=all, the
timer's is the cost of one produce it holds until its batch is fsynced (acks=1 gives the baseline), and
`timer_loop_us_per_op` its main thread's share: the rest is the group commit's flusher and sync threads, whose
CPU is almost all the kernel's fdatasync.

Load points (`--points`, NAME=BATCH_BYTESxCONNECTIONSxINFLIGHT):
- reference: 64,000-byte batches from one producer with 2 requests in flight: Kafka's reference run for
  acks=-1 ("single producer thread, 3x synchronous replication", seed 004) used batch.size=64000.
- small: 8,192-byte batches over 4 sockets with 8 in flight each (producer_perf.py's default): many small
  requests, where the cost per request decides.
Before every round the machine's dirty pages are written out (sync(2), timed): an acks=1 round leaves about a
gigabyte in the page cache, and its writeback would otherwise land in the next round's fsyncs, a cost of the
benchmark's order, not of acks=all.
The target (acks=all p50 <= 2 ms at >= 500,000 records/s) is checked for every point; the disk's
own fdatasync (a plain write + fdatasync of one batch beside the data dir) is measured after each point.
A table goes to stderr as rounds finish; --json prints one line per round and one summary line per point.
Usage:
    .venv/bin/python -m scripts.bench_acks [--rounds 3] [--seconds 4] [--points reference=64000x1x2] [--json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

from scripts.harness import benchnode
from scripts.harness.abba import AlternatingRounds
from scripts.harness.nodeproc import NodeProcess
from scripts.producer_perf import RawProduceLoad, run_raw_producer

SCRIPT = "bench_acks"
PARTITIONS = 4
DEFAULT_POINTS = ("reference=64000x1x2", "small=8192x4x8")
TARGET_P50_MS = 2.0
TARGET_RECORDS_PER_S = 500_000
ACKS = {"all": -1, "1": 1}  # the modes: acks=all is measured against acks=1


@dataclass(frozen=True)
class LoadPoint:
    name: str
    batch_bytes: int
    connections: int
    inflight: int

    @classmethod
    def parse(cls, text: str) -> LoadPoint:
        name, _, shape = text.partition("=")
        try:
            batch_bytes, connections, inflight = (int(part) for part in shape.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=BATCH_BYTESxCONNECTIONSxINFLIGHT") from None
        if not name or min(batch_bytes, connections, inflight) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: a name and positive sizes are needed")
        return cls(name, batch_bytes, connections, inflight)

    def describe(self) -> str:
        return f"{self.batch_bytes:,} B batches, {self.connections} socket(s) x {self.inflight} in flight"


def run_point(node: NodeProcess, point: LoadPoint, rounds_count: int, seconds: float, as_json: bool) -> dict:
    topics = {mode: f"bench-acks-{point.name}-{mode}-{os.getpid()}" for mode in ACKS}
    for topic in topics.values():
        benchnode.create_topic(benchnode.LOOPBACK, node.port, topic, PARTITIONS)
    rounds = AlternatingRounds("all", "1", rounds_count)
    steps = 2 * rounds_count
    for step, (round_index, mode) in enumerate(rounds.steps(), 1):
        load = RawProduceLoad(topics[mode], PARTITIONS, 100, point.batch_bytes, ACKS[mode],
                              pipeline=benchnode.PipelineSettings(connections=point.connections,
                                                                  inflight=point.inflight))
        settle_started = time.monotonic()
        os.sync()
        settle_s = time.monotonic() - settle_started
        with benchnode.CpuMeter(node) as meter:
            outcome = run_raw_producer(benchnode.LOOPBACK, node.port, load, seconds)
        row = {"script": SCRIPT, "point": point.name, "step": step, "of": steps, "acks": mode,
               "records_per_s": round(outcome.records / outcome.elapsed_s) if outcome.elapsed_s else 0,
               **benchnode.percentiles_ms(outcome.latencies_ns), "records_per_batch": load.records_per_batch(),
               "settle_s": round(settle_s, 3), "errors": {str(k): v for k, v in outcome.errors.items()},
               "requests": outcome.requests, **meter.per_op_fields(outcome.requests)}
        rounds.record(round_index, mode, {key: row[key] for key in ("records_per_s", "p50_ms", "p99_ms")})
        if as_json:
            benchnode.emit(row, True)
        print(f"[{point.name} {step}/{steps}] acks={mode}: {row['records_per_s']:,} records/s, "
              f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms (settled {settle_s:.2f} s)", file=sys.stderr, flush=True)
    all_rate, all_p50 = rounds.median("all", "records_per_s"), rounds.median("all", "p50_ms")
    return {"script": SCRIPT, "summary": True, "point": point.name, "load": point.describe(),
            "batch_bytes": point.batch_bytes, "connections": point.connections, "inflight": point.inflight,
            "rounds": rounds_count, "seconds": seconds,
            "acks1_records_per_s": round(rounds.median("1", "records_per_s")),
            "acks1_p50_ms": rounds.median("1", "p50_ms"), "acks1_p99_ms": rounds.median("1", "p99_ms"),
            "acks_all_records_per_s": round(all_rate), "acks_all_p50_ms": all_p50,
            "acks_all_p99_ms": rounds.median("all", "p99_ms"), "all_over_1": rounds.ratio("records_per_s"),
            "fdatasync_p50_ms": benchnode.fdatasync_floor_ms(str(node.data_dir), point.batch_bytes),
            "target": f"acks=all p50 <= {TARGET_P50_MS} ms at >= {TARGET_RECORDS_PER_S:,} records/s",
            "target_met": all_p50 <= TARGET_P50_MS and all_rate >= TARGET_RECORDS_PER_S}


def print_table(summaries: list[dict]) -> None:
    print("| load | acks=1 records/s | acks=1 p50 ms | acks=all records/s | acks=all p50 ms | acks=all p99 ms "
          "| all / 1 | fdatasync p50 ms | target |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in summaries:
        print(f"| {s['point']}: {s['load']} | {s['acks1_records_per_s']:,} | {s['acks1_p50_ms']} "
              f"| {s['acks_all_records_per_s']:,} | {s['acks_all_p50_ms']} | {s['acks_all_p99_ms']} | {s['all_over_1']} "
              f"| {s['fdatasync_p50_ms']} | {'met' if s['target_met'] else 'missed'} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_acks", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per acks and point (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per round (default %(default)s)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--points", nargs="+", type=LoadPoint.parse, default=[LoadPoint.parse(p) for p in DEFAULT_POINTS],
                        help="NAME=BATCH_BYTESxCONNECTIONSxINFLIGHT ... (default: %s)" % " ".join(DEFAULT_POINTS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.workers < 1:
        parser.error("--rounds, --seconds and --workers must be positive")
    summaries = []
    with NodeProcess(workers=args.workers, announce=True) as node:
        for point in args.points:
            summaries.append(run_point(node, point, args.rounds, args.seconds, args.json))
            if args.json:
                benchnode.emit(summaries[-1], True)
    if not args.json:
        print_table(summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
