"""The load-test report: the node beside Redis Streams on the same machine in the same run, as JSON lines,
PNG plots and a Markdown report.

The sections are the Kafka reference benchmark table (seed 004); the peer of each is named in the report:
1. producer throughput, 100-byte records: the node with 1 and 3 raw producers and confluent-kafka, acks=1 and
   acks=all; Redis with redis-benchmark XADD pipelined, 1 and 3 clients, without persistence and with
   appendfsync always (the honest peer of acks=all);
2. consumer throughput from the start of a filled topic: raw fetches and a confluent-kafka consumer assigned
   every partition, beside one XREAD reader; 1 and 3 confluent-kafka group consumers (group.id, subscribe, a
   topic of 6 partitions, one process each) beside 1 and 3 XREADGROUP readers of one consumer group, each
   batch acknowledged (XACK): each record goes to one member and its delivery is recorded, on both sides;
3. producer and consumer together: a confluent-kafka producer flat out while one group consumer reads the
   same topic, beside redis-benchmark XADD while one reader follows with XREAD BLOCK; both rates and how far
   behind the consumer was when the producer stopped;
4. record size sweep 10 B - 100 KB: records/s and MB/s, the node's raw producer beside XADD;
5. producer throughput while the stored data grows (a fresh node; 10 GB in the full run, --grow-mb): the
   rate of each step of the fill against the data stored, and against a first step written again beside it
   on a second fresh node, in turn chunk by chunk; node only (Redis keeps its data in memory);
6. end-to-end latency with a long-polling consumer (confluent-kafka, and the raw protocol client, 1000 records/s)
   beside XREAD BLOCK, a fresh node and Redis side by side, in rounds of one run each (3 rounds, 5 in the full
   run): medians over the runs, and node / Redis p99 per round; the target is judged on confluent-kafka;
7. purgatory saturation in the live node: expiring long-poll fetches offered at rising rates
   (bench_delayed.py's offered workload): offered vs completed per second, lateness past max_wait as clients
   see it and the timer's own (from the node's stats segment); node only;
8. 10,000 connections each holding a long-poll fetch (bench_delayed.py's fanout workload) while one producer
   sends 500 single-record requests/s to another topic: the whole node's memory (RSS and PSS summed over its
   processes), that producer's latency (and without the waiters, before), the time until all 10,000 are
   answered after one append; beside 10,000 XREAD BLOCK clients (one selector loop over raw RESP) and XADD.
Targets, each with its measured ratio: producer records/s >= redis-benchmark XADD with pipelining; end-to-end
p99 <= 2x Redis XREAD BLOCK p99 (the median of the per-round ratios); throughput at the end of the fill within
10% of a first step written beside it; 10,000 waiting consumers under 1 GB RSS for the whole node and their
fan-out within 1.5x of Redis's.

The node's figures come from the benchmark scripts (producer_perf, consumer_perf, e2e_latency, bench_delayed),
against a node started here (fresh ones for sections 5 and 6); Redis (scripts/redis_peer.py) runs the
distribution's redis-server, started here on a free loopback port with its own temp dir and stopped by its pid.
Only 127.0.0.1; every step is bounded in time. Output in --out (default ./bench-report): results.jsonl, *.png,
report.md. Usage:
    .venv/bin/python -m scripts.bench_report --quick      # about 6 minutes (4 GB stored in section 5)
    .venv/bin/python -m scripts.bench_report              # about 23 minutes with the 10 GB fill
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import orjson
import psutil

from scripts import bench_delayed, consumer_perf, e2e_latency, producer_perf, redis_peer
from scripts.harness import benchnode, rawkafka
from scripts.harness.nodeproc import NodeProcess

SIZES = (10, 100, 1000, 10_000, 100_000)
STEP_TIMEOUT_S = 600.0
SWEEP_BATCH_BYTES = 128_000  # the reference run's batch.size for its record size sweep
GROUP_PARTITIONS = 6  # the reference benchmark's topic: 1, 2, 3 or 6 consumers share it evenly
GROUP_CONSUME_TIMEOUT_S = 300.0
TOGETHER_DRAIN_S = 60.0
GROW_PARTITIONS = 4
GROW_DISK_MARGIN_BYTES = 1 << 30  # free space left on the disk after the fill
GROW_OVERHEAD = 1.05  # indexes and batch headers beyond the payload
MIN_GROW_BYTES = 64 << 20
GROW_WARMUP_S = 1.0
# Each step of the fill is written in this many chunks, alternating with the chunks of a first step written
# again on a second, otherwise empty node: the two rates of a step share the machine's state of that minute.
GROW_CHUNKS = 6  # even: each node goes first as often as the other
SATURATION_EXPIRE_MS = 100
FANOUT_MAX_WAIT_MS = 120_000
FANOUT_SETTLE_S_PER_10K = 2.0  # time for 10,000 waiting requests to be sent and parked
WAITING_PRODUCE_RATE = 500.0  # single-record produce requests (XADDs) per second while the waiters wait
FDS_SPARE = 1024  # descriptors kept for everything but the waiters (files, other sockets)
GB = 1e9
QUICK = {"seconds": 4.0, "records": 1_000_000, "fanout_rounds": 5, "grow_mb": 4096, "grow_steps": 4,
         "rates": [1000, 2000, 5000, 10000, 15000, 20000, 30000], "rate_seconds": 2.0, "waiting_seconds": 2.0,
         "e2e_runs": 3}
FULL = {"seconds": 15.0, "records": 5_000_000, "fanout_rounds": 9, "grow_mb": 10240, "grow_steps": 10,
        "rates": [1000, 2000, 5000, 10000, 15000, 20000, 25000, 30000, 40000], "rate_seconds": 8.0,
        "waiting_seconds": 5.0, "e2e_runs": 5}


class Progress:
    """One line per step on stderr: [step/total] what (elapsed)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.started = time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        bar = "#" * (20 * self.done // self.total)
        print(f"[{bar:<20}] {self.done}/{self.total} {what} ({time.monotonic() - self.started:.0f} s)",
              file=sys.stderr, flush=True)


def loud(line: str) -> None:
    print(f"bench_report: !!! {line}", file=sys.stderr, flush=True)


@dataclass
class Plan:
    """The sizes of one run: --quick or full defaults, overridden by the options."""

    quick: bool
    workers: int
    seconds: float
    records: int
    waiters: int
    fanout_rounds: int
    grow_mb: int
    grow_steps: int
    rates: list[float]
    rate_seconds: float
    waiting_seconds: float
    e2e_runs: int = 1  # section 6: runs of each case; a row gives their median percentiles
    notes: list[str] = field(default_factory=list)  # what was scaled down, and why: printed in the report


class Run:
    """The rows measured so far (each also a line of results.jsonl) and the samples the plots need."""

    def __init__(self, out: Path, plan: Plan) -> None:
        self.out = out
        self.plan = plan
        self.rows: list[dict] = []
        self.latencies: dict[str, list[int]] = {}  # e2e: name -> ns
        self.fanout_latencies: dict[str, list[int]] = {}  # section 8: name -> ns per waiter
        self.results = open(out / "results.jsonl", "wb")
        self.load_at_start = os.getloadavg()[0]

    def record(self, row: dict) -> dict:
        self.rows.append(row)
        self.results.write(orjson.dumps(row) + b"\n")
        self.results.flush()
        return row

    def find(self, section: str, system: str, case: str | None = None) -> dict | None:
        return next((r for r in self.rows if r["section"] == section and r["system"] == system
                     and (case is None or r.get("case") == case)), None)

    def close(self) -> None:
        self.results.close()


# -- limits ------------------------------------------------------------------------------------------


def raise_fd_limit(plan: Plan) -> None:
    """Raise RLIMIT_NOFILE to its hard limit (this process, and the node and Redis it starts, inherit it); scale
    the waiters and the saturation rates down, loudly, if even that is too few."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    limit = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if plan.waiters + FDS_SPARE > limit:
        wanted, plan.waiters = plan.waiters, max(1, limit - FDS_SPARE)
        plan.notes.append(f"Section 8 ran {plan.waiters:,} waiters, not {wanted:,}: the hard limit of open files "
                          f"(`ulimit -Hn`) is {limit:,}.")
        loud(plan.notes[-1])
    top = [r for r in plan.rates if saturation_pool(r) + FDS_SPARE <= limit]
    if len(top) < len(plan.rates):
        plan.notes.append(f"Section 7 offered at most {max(top or [0]):,.0f} fetches/s: more needs more connections "
                          f"than `ulimit -Hn` ({limit:,}) allows.")
        loud(plan.notes[-1])
        plan.rates = top


def saturation_pool(rate: float) -> int:
    """Connections for `rate` fetches/s that each wait SATURATION_EXPIRE_MS: three times what is in flight."""
    return int(rate * SATURATION_EXPIRE_MS / 1000 * 3) + 64


def grow_budget(plan: Plan) -> int:
    """Bytes section 5 writes: --grow-mb, scaled down (loudly) to what the disk of the temp dir can hold."""
    wanted = plan.grow_mb << 20
    free = shutil.disk_usage(tempfile.gettempdir()).free
    # The reference node holds one step beside the fill at most.
    room = int((free - GROW_DISK_MARGIN_BYTES) / GROW_OVERHEAD / (1 + 1 / plan.grow_steps))
    if room >= wanted:
        return wanted
    if room < MIN_GROW_BYTES:
        plan.notes.append(f"Section 5 was not run: {free / GB:.1f} GB free in {tempfile.gettempdir()}, "
                          f"{wanted * GROW_OVERHEAD * (1 + 1 / plan.grow_steps) / GB + GROW_DISK_MARGIN_BYTES / GB:.1f}"
                          " GB needed.")
        loud(plan.notes[-1])
        return 0
    plan.notes.append(f"Section 5 stored {room / GB:.1f} GB, not {wanted / GB:.1f} GB: only {free / GB:.1f} GB "
                      f"free in {tempfile.gettempdir()}.")
    loud(plan.notes[-1])
    return room


# -- the node -----------------------------------------------------------------------------------------


def run_script(name: str, *args: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", f"scripts.{name}", "--json", *args], capture_output=True, text=True,
                          timeout=STEP_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed: {done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def target_of(node: NodeProcess) -> benchnode.Target:
    return benchnode.Target(benchnode.LOOPBACK, node.port, str(node.data_dir), node)


def node_producers(run: Run, node: NodeProcess, client: str, producers: int, acks: str) -> None:
    extra = ["--processes", str(producers), "--connections", str(max(4, producers))] if client == "raw" else []
    (row,) = run_script("producer_perf", "--bootstrap", node.bootstrap, "--client", client, "--acks", acks,
                        "--seconds", str(run.plan.seconds), *extra)
    mode = "no persistence" if acks == "1" else "appendfsync always"
    run.record({"section": "producer", "system": "shmbroker", "workers": run.plan.workers,
                "case": f"{client} x{producers} acks={acks}", "records_per_s": row["records_per_s"],
                "mb_per_s": row["mb_per_s"], "p99_ms": row.get("p99_ms"),
                "peer": f"XADD -P {redis_peer.PIPELINE} x{producers} {mode}"})


def node_assigned_consumers(run: Run, node: NodeProcess) -> None:
    """consumer_perf.py's raw and confluent (assigned, not grouped) consumers, from offset 0."""
    consumed = run_script("consumer_perf", "--bootstrap", node.bootstrap, "--data-dir", str(node.data_dir),
                          "--records", str(run.plan.records), "--seconds", str(STEP_TIMEOUT_S / 4), "--passes", "1")
    for row in consumed:
        name = "raw fetch" if row["client"] == "raw" else "confluent"
        run.record({"section": "consumer", "system": "shmbroker", "case": f"{name} x1, assigned", "consumers": 1,
                    "records": row["records"], "records_per_s": row["records_per_s"], "mb_per_s": row["mb_per_s"],
                    "peer": "XREAD x1"})


def node_group_consumers(run: Run, node: NodeProcess) -> None:
    """One topic of --records records in GROUP_PARTITIONS partitions, read by a new group of 1, then of 3."""
    target = target_of(node)
    filled = consumer_perf.fill_topic(target, f"report-group-{os.getpid()}", run.plan.records, GROUP_PARTITIONS,
                                      100, 8192, STEP_TIMEOUT_S)
    for consumers in (1, 3):
        got = consumer_perf.consume_group(target, filled, consumers, GROUP_CONSUME_TIMEOUT_S, 1)
        run.record({"section": "consumer", "system": "shmbroker", "case": f"confluent group x{consumers}",
                    "consumers": consumers, "records": got.records,
                    "records_per_s": round(got.records / got.elapsed_s, 1) if got.elapsed_s else None,
                    "mb_per_s": round(got.records * 100 / got.elapsed_s / benchnode.MB, 3) if got.elapsed_s else None,
                    "join_s": got.join_s, "peer": f"XREADGROUP x{consumers}"})


def node_together(run: Run, node: NodeProcess) -> None:
    """A confluent-kafka producer flat out for --seconds while one group consumer reads the same topic."""
    topic = f"report-together-{os.getpid()}"
    benchnode.create_topic(benchnode.LOOPBACK, node.port, topic, GROUP_PARTITIONS)
    group = f"report-together-{os.getpid()}"
    with benchnode.CountingProcesses(consumer_perf.group_member, 1, node.bootstrap, topic, group, 1,
                                     consumer_perf.GROUP_JOIN_TIMEOUT_S + run.plan.seconds + TOGETHER_DRAIN_S) as procs:
        procs.wait_ready(consumer_perf.GROUP_JOIN_TIMEOUT_S)
        produced = producer_perf.run_confluent_producer(node.bootstrap, topic, 100, 1, run.plan.seconds, 8192, 5)
        behind = produced.records - procs.records()
        procs.wait_for(produced.records, TOGETHER_DRAIN_S)
    run.record(together_row("shmbroker", "confluent-kafka producer + 1 group consumer",
                            produced.records / produced.elapsed_s, procs.records(), procs.span_s(), behind,
                            "redis-benchmark XADD + 1 XREAD BLOCK reader"))


def together_row(system: str, case: str, producer_rate: float, consumed: int, span_s: float, behind: int,
                 peer: str | None = None) -> dict:
    return {"section": "together", "system": system, "case": case, "producer_records_per_s": round(producer_rate, 1),
            "consumer_records_per_s": round(consumed / span_s, 1) if span_s else None, "consumed": consumed,
            "behind_at_end": behind, "peer": peer}


def node_size(run: Run, node: NodeProcess, size: int) -> None:
    batch = max(SWEEP_BATCH_BYTES, size + 128)
    (row,) = run_script("producer_perf", "--bootstrap", node.bootstrap, "--client", "raw", "--acks", "1",
                        "--record-size", str(size), "--batch-bytes", str(batch), "--seconds", str(run.plan.seconds / 2))
    run.record({"section": "size_sweep", "system": "shmbroker", "case": f"{size:,} B", "record_size": size,
                "records_per_s": row["records_per_s"], "mb_per_s": row["mb_per_s"], "peer": f"{size:,} B"})


E2E_CONFLUENT_CASE = "confluent-kafka, 1000 records/s"
E2E_REDIS_CASE = "redis-py, 1000 records/s"
# Section 6 starts right after a stage that wrote gigabytes and held 10,000 connections: its first round ran
# slow in three quick runs out of three (confluent-kafka's p99 4-240 ms against 0.5-1.4 ms later, the raw
# client's up to 3x its later rounds; Redis's in two of the three). So first the machine settles (bounded),
# then one short round of each case is run and dropped.
E2E_SETTLE_MAX_S = 30.0
E2E_SETTLE_BUSY_PERCENT = 10.0  # CPU busy, all CPUs, over one second
E2E_WARMUP_ROUND_S = 2.0
E2E_PLACEMENT_TIMEOUT_S = 3.0  # for every worker to publish its counters after a run (every 0.5 s)


def settle(max_s: float, busy_percent: float) -> float:
    """Flush dirty pages, then wait (at most max_s) for one second with the CPUs at most busy_percent busy;
    the seconds waited."""
    started = time.monotonic()
    os.sync()
    while time.monotonic() - started < max_s and psutil.cpu_percent(interval=1.0) > busy_percent:
        pass
    return time.monotonic() - started


class ServingWorkers:
    """Whether one worker served both a run's produce requests and its fetches, or two workers did, or the
    consumer moved to the producer's worker during the run (server.connection_affinity_*): per-worker request
    and move counts from the node's stats segment (node.tools.inspect, read-only), before and after the run. The
    kernel spreads connections over the workers (SO_REUSEPORT), so a producer and a consumer share a worker by
    chance; across two, each append reaches the consumer's worker through its doorbell, one process wake more,
    until the consumer moves."""

    PRODUCE, FETCH = 0, 1  # Kafka API keys
    PLACEMENTS = ONE, MOVED, TWO = "one worker", "moved to one", "two workers"

    def __init__(self, node: NodeProcess) -> None:
        from shmbroker.node.tools.inspect import NodeReader

        self.reader = NodeReader.open(str(node.data_dir))

    def counts(self) -> dict[int, tuple[int, int, int, int]]:
        """Per worker index: (published_ms, produce requests, fetch requests, connections moved in)."""
        found = {}
        for row in self.reader.rows():
            if row.role == "worker":
                requests = row.array("requests")
                found[row.index] = (row.get("published_ms"), int(requests[self.PRODUCE]), int(requests[self.FETCH]),
                                    int(row.get("connections_moved_in")))
        return found

    def placement(self, before: dict[int, tuple[int, int, int, int]], timeout_s: float) -> str:
        """ONE, MOVED or TWO (since `before`), once every worker has published after the run."""
        ended_ms = time.time_ns() // 1_000_000
        deadline = time.monotonic() + timeout_s
        after = self.counts()
        while min(counts[0] for counts in after.values()) < ended_ms and time.monotonic() < deadline:
            time.sleep(0.05)
            after = self.counts()
        since = {index: [now - then for now, then in zip(after[index], before.get(index, (0, 0, 0, 0)))]
                 for index in after}
        produced = {index: counts[1] for index, counts in since.items()}
        fetched = {index: counts[2] for index, counts in since.items()}
        if max(produced, key=produced.get) != max(fetched, key=fetched.get):
            return self.TWO
        return self.MOVED if any(counts[3] for counts in since.values()) else self.ONE

    def close(self) -> None:
        self.reader.close()


def e2e_rounds(run: Run, node: NodeProcess, server: redis_peer.RedisServer) -> None:
    """Section 6, node and Redis both up: each round runs confluent-kafka (what users run; the target's row),
    the project's raw protocol client (a thin blocking client as redis-py is, so the two node rows tell the
    node's share from librdkafka's thread hand-offs) and Redis, one after the other. A p99 on a shared 2-CPU
    machine swings by tens of percent from one minute to the next; a round's three runs share their minute, so
    each round's node / Redis ratio is a paired measurement and the target takes their median."""
    cases = ((e2e_latency.run_confluent, E2E_CONFLUENT_CASE, "shmbroker (confluent-kafka, long-poll fetch)"),
             (e2e_latency.run_raw, "raw protocol client, 1000 records/s", "shmbroker (raw client, long-poll fetch)"))
    runs: dict[str, list[list[int]]] = {case: [] for _, case, _ in cases}
    placements: dict[str, list[str]] = {case: [] for _, case, _ in cases}
    redis_runs: list[list[int]] = []
    serving = ServingWorkers(node)
    settled_s = settle(E2E_SETTLE_MAX_S, E2E_SETTLE_BUSY_PERCENT)
    print(f"bench_report: end-to-end: the machine settled in {settled_s:.1f} s", file=sys.stderr, flush=True)
    for round_ in range(-1, run.plan.e2e_runs):  # round -1: the warm-up, dropped
        seconds = E2E_WARMUP_ROUND_S if round_ < 0 else run.plan.seconds * 2
        for client, case, _ in cases:
            topic = f"report-e2e-{client.__name__}-{round_ + 1}-{os.getpid()}"
            benchnode.create_topic(benchnode.LOOPBACK, node.port, topic, 1)
            latency_run = e2e_latency.LatencyRun(topic, 1000.0, seconds, 0.5, 100)
            before = serving.counts()
            latencies = list(client(target_of(node), latency_run).latencies_ns)
            if round_ >= 0:
                runs[case].append(latencies)
                placements[case].append(serving.placement(before, E2E_PLACEMENT_TIMEOUT_S))
        latencies = redis_peer.end_to_end(server, 1000.0, seconds, 100)
        if round_ >= 0:
            redis_runs.append(latencies)
    serving.close()
    redis_p99s = [benchnode.percentiles_ms(latencies)["p99_ms"] for latencies in redis_runs]
    for _, case, curve in cases:
        run.latencies[curve] = [latency for one in runs[case] for latency in one]
        paired = [benchnode.percentiles_ms(latencies)["p99_ms"] / peer for latencies, peer in zip(runs[case],
                                                                                                  redis_p99s)]
        by_placement = {where: [ratio for ratio, at in zip(paired, placements[case]) if at == where]
                        for where in ServingWorkers.PLACEMENTS}
        run.record({"section": "e2e", "system": "shmbroker", "case": case, **median_percentiles(runs[case]),
                    "vs_redis_runs": " / ".join(f"{r:.2f}" for r in paired),
                    "placement_runs": " / ".join(placements[case]),
                    **{f"vs_redis_{where.replace(' ', '_')}": round(statistics.median(ratios), 3) if ratios else None
                       for where, ratios in by_placement.items()},
                    "vs_redis_paired": round(statistics.median(paired), 3), "peer": E2E_REDIS_CASE})
    run.latencies["redis (XREAD BLOCK)"] = [latency for one in redis_runs for latency in one]
    run.record({"section": "e2e", "system": "redis", "case": E2E_REDIS_CASE, **median_percentiles(redis_runs)})


def median_percentiles(runs: list[list[int]]) -> dict:
    """Section 6's row: each percentile the median over the runs, each run's p99, and the samples of all."""
    each = [benchnode.percentiles_ms(latencies) for latencies in runs]
    return {**{key: statistics.median(p[key] for p in each) for key in ("p50_ms", "p99_ms", "p999_ms")},
            "p99_runs": " / ".join(f"{p['p99_ms']:.2f}" for p in each), "runs": len(runs),
            "samples": sum(len(latencies) for latencies in runs)}


def node_saturation(run: Run, node: NodeProcess) -> None:
    args = argparse.Namespace(partitions=4, settle_ms=500, rates=run.plan.rates, step_seconds=run.plan.rate_seconds,
                              expire_ms=SATURATION_EXPIRE_MS, connections=saturation_pool(max(run.plan.rates)))
    for row in bench_delayed.run_offered(args, target_of(node)):
        run.record({"section": "saturation", "system": "shmbroker", "case": f"{row['rate']:,.0f} fetches/s",
                    **{k: row[k] for k in ("offered_per_s", "sent_per_s", "completed_per_s", "unsent", "unanswered",
                                           "p50_ms", "p99_ms", "timer_lateness_p50_us", "timer_lateness_p99_us",
                                           "node_fetches_expired", "node_cores", "client_cores") if k in row}})


def paced_latency_row(latencies_ns: list[int]) -> dict:
    p = benchnode.percentiles_ms(latencies_ns)
    return {"p50_ms": p["p50_ms"], "p99_ms": p["p99_ms"], "samples": len(latencies_ns)}


def node_waiters(run: Run, node: NodeProcess) -> None:
    """bench_delayed's fanout with --waiters long polls; meanwhile one producer sends single-record requests to
    another topic (its latency also measured before the waiters connect)."""
    topic = f"report-waiting-producer-{os.getpid()}"
    benchnode.create_topic(benchnode.LOOPBACK, node.port, topic, 1)
    body = rawkafka.produce_body({topic: {0: rawkafka.make_batch(1, 100)}}, acks=1)
    errors = [0]
    with rawkafka.RawConnection(benchnode.LOOPBACK, node.port) as conn:
        def produce() -> None:
            errors[0] += bool(e2e_latency._produce_error(conn.request(rawkafka.PRODUCE, 8, body), topic))

        def while_waiting(_round: int) -> dict:
            return paced_latency_row(benchnode.paced_calls(WAITING_PRODUCE_RATE, run.plan.waiting_seconds, produce))

        alone = while_waiting(-1)
        before = node.memory()
        args = argparse.Namespace(waiters=run.plan.waiters, partitions=4, rounds=run.plan.fanout_rounds,
                                  max_wait_ms=FANOUT_MAX_WAIT_MS, settle_ms=int(fanout_settle_s(run.plan) * 1000))
        samples: list[int] = []
        row = bench_delayed.run_fanout(args, target_of(node), while_waiting=while_waiting, samples=samples)
    if errors[0]:
        raise RuntimeError(f"{errors[0]} produce requests failed while the waiters waited")
    run.fanout_latencies[f"shmbroker: {run.plan.waiters:,} long-poll fetches"] = samples
    run.record(waiters_row("shmbroker", run.plan.waiters, f"{run.plan.waiters:,} long-poll fetches; raw Produce",
                           row["fanout_ms"], row["p99_ms"], before, {"rss_bytes": row["node_rss_bytes_max"],
                                                   "pss_bytes": row["node_pss_bytes_max"]},
                           alone, row["while_waiting"], f"{run.plan.waiters:,} XREAD BLOCK; XADD"))


def fanout_settle_s(plan: Plan) -> float:
    return max(0.5, FANOUT_SETTLE_S_PER_10K * plan.waiters / 10_000)


def waiters_row(system: str, waiters: int, case: str, fanouts_ms: list[float], waiter_p99_ms: float | None,
                before: dict, waiting: dict, alone: dict, during: list[dict], peer: str | None = None) -> dict:
    """Section 8's row; memory `before` the waiters connected and (the most seen) `waiting` while they wait."""
    return {"section": "waiters", "system": system, "case": case, "waiters": waiters,
            "fanout_ms_median": round(float(np.median(fanouts_ms)), 3), "fanout_ms": fanouts_ms,
            "waiter_p99_ms": waiter_p99_ms, "rss_mb_before": round(before["rss_bytes"] / 1e6, 1),
            "rss_mb": round(waiting["rss_bytes"] / 1e6, 1), "pss_mb": round(waiting["pss_bytes"] / 1e6, 1),
            "kb_per_waiter": round((waiting["pss_bytes"] - before["pss_bytes"]) / waiters / 1e3, 2),
            "produce_p50_ms_alone": alone["p50_ms"],
            "produce_p99_ms_alone": alone["p99_ms"],
            "produce_p50_ms_waiting": round(float(np.median([d["p50_ms"] for d in during])), 4),
            "produce_p99_ms_waiting": max(d["p99_ms"] for d in during), "peer": peer}


def stored_bytes(data_dir: Path) -> int:
    """Disk blocks the data dir holds (index files are sparse: their length is not what they store)."""
    total = 0
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue  # a file replaced meanwhile
    return total


def node_growth(run: Run, growing: NodeProcess, reference: NodeProcess, budget: int) -> None:
    """Fill a fresh node with the raw producer (consumer_perf's fill: 100-byte records in 8 KiB batches, acks=1)
    in --grow-steps equal steps up to `budget` bytes of payload. A step's rate alone would judge the stored data
    by minutes of a shared machine that swing by tens of percent, so beside each step a second node writes a
    first step again, from empty, chunk for chunk in turn with the fill; the step's "first step now" is that
    rate, and the ratio of the two is the stored data's own effect. One row per step."""
    topic = f"report-grow-{os.getpid()}"
    warm = f"report-grow-warm-{os.getpid()}"
    for node in (growing, reference):
        # A fresh node's first second (children's first requests, first segments) is not the stored data's doing.
        benchnode.create_topic(benchnode.LOOPBACK, node.port, warm, GROW_PARTITIONS)
        producer_perf.run_raw_producer(benchnode.LOOPBACK, node.port,
                                       producer_perf.RawProduceLoad(warm, GROW_PARTITIONS, 100, 8192, 1), GROW_WARMUP_S)
        benchnode.delete_topic(benchnode.LOOPBACK, node.port, warm)
    chunk_records = max(1, budget // run.plan.grow_steps // GROW_CHUNKS // 100)
    first = None
    for step in range(run.plan.grow_steps):
        again = f"report-first-step-{step}-{os.getpid()}"
        benchnode.create_topic(benchnode.LOOPBACK, growing.port, topic, GROW_PARTITIONS)  # outside the timing
        benchnode.create_topic(benchnode.LOOPBACK, reference.port, again, GROW_PARTITIONS)
        chunks: dict[int, list[tuple[int, float]]] = {growing.port: [], reference.port: []}  # (records, s) each
        for chunk in range(GROW_CHUNKS):
            pair = ((growing, topic), (reference, again))
            for node, name in pair if chunk % 2 == 0 else reversed(pair):  # neither always goes first
                started = time.monotonic()
                filled = consumer_perf.fill_topic(target_of(node), name, chunk_records, GROW_PARTITIONS, 100, 8192,
                                                  STEP_TIMEOUT_S)
                chunks[node.port].append((filled.records, time.monotonic() - started))
        seconds = sum(spent for _, spent in chunks[growing.port])
        rate, first_now = (sum(records for records, _ in done) / sum(spent for _, spent in done)
                           for done in (chunks[growing.port], chunks[reference.port]))
        paired = [(mine / mine_s) / (peer / peer_s)
                  for (mine, mine_s), (peer, peer_s) in zip(chunks[growing.port], chunks[reference.port])]
        first = first or rate
        stored, stored_again = stored_bytes(growing.data_dir), stored_bytes(reference.data_dir)
        benchnode.delete_topic(benchnode.LOOPBACK, reference.port, again)
        run.record({"section": "growth", "system": "shmbroker", "case": f"step {step + 1}/{run.plan.grow_steps}",
                    "stored_gb": round(stored / GB, 3), "records_per_s": round(rate, 1),
                    "mb_per_s": round(rate * 100 / benchnode.MB, 3), "seconds": round(seconds, 2),
                    "vs_first": round(rate / first, 3), "first_step_gb": round(stored_again / GB, 3),
                    "first_step_records_per_s": round(first_now, 1), "vs_first_now": round(rate / first_now, 3),
                    "vs_first_now_chunks": " / ".join(f"{r:.2f}" for r in paired)})
        print(f"bench_report: growth step {step + 1}/{run.plan.grow_steps}: {stored / GB:.2f} GB stored, "
              f"{rate:,.0f} records/s; a first step beside it {first_now:,.0f} records/s", file=sys.stderr,
              flush=True)


# -- Redis ----------------------------------------------------------------------------------------------


def redis_producers(run: Run, server: redis_peer.RedisServer, clients: int, always: bool) -> None:
    mode = "appendfsync always" if always else "no persistence"
    requests = (run.plan.records if not always else run.plan.records // 10) * clients
    got = redis_peer.xadd_benchmark(server.port, clients, 100, requests, f"p{clients}")
    run.record({"section": "producer", "system": "redis", "case": f"XADD -P {redis_peer.PIPELINE} x{clients} {mode}",
                **got})


def redis_consumers(run: Run, server: redis_peer.RedisServer) -> None:
    """One stream of --records entries, read by one XREAD reader, then by groups of 1 and 3 XREADGROUP readers."""
    stream = "consume"
    redis_peer.xadd_benchmark(server.port, 1, 100, run.plan.records, stream)
    for case, readers, group in (("XREAD x1", 1, None), ("XREADGROUP x1", 1, "g1"), ("XREADGROUP x3", 3, "g3")):
        got = redis_peer.read_stream(server, stream, readers, group, run.plan.records, GROUP_CONSUME_TIMEOUT_S)
        run.record({"section": "consumer", "system": "redis", "case": case, "consumers": readers,
                    "records": got["records"], "records_per_s": got["records_per_s"],
                    "mb_per_s": round(got["records_per_s"] * 100 / benchnode.MB, 3) if got["records_per_s"] else None})


def redis_together(run: Run, server: redis_peer.RedisServer) -> None:
    """redis-benchmark XADD (as many as it does in --seconds alone, from section 1) while one reader follows."""
    alone = run.find("producer", "redis", f"XADD -P {redis_peer.PIPELINE} x1 no persistence")
    requests = max(1000, int((alone["records_per_s"] if alone else 100_000) * run.plan.seconds))
    produced: dict[str, Any] = {}

    def produce(received: Callable[[], int]) -> int:
        produced.update(redis_peer.xadd_benchmark(server.port, 1, 100, requests, "together"))
        client = server.client()
        written = client.xlen("together")  # redis-benchmark's pipelining may add a few beyond -n
        client.close()
        produced["behind"] = written - received()
        return written

    got = redis_peer.read_stream(server, "together", 1, None, requests, TOGETHER_DRAIN_S, while_reading=produce)
    run.record(together_row("redis", "redis-benchmark XADD + 1 XREAD BLOCK reader", produced["records_per_s"],
                            got["records"], got["seconds"], produced["behind"]))


def redis_size(run: Run, server: redis_peer.RedisServer, size: int) -> None:
    count = max(2000, min(run.plan.records, int(run.plan.records * 100 / size)))
    got = redis_peer.xadd_benchmark(server.port, 1, size, count, f"s{size}")
    run.record({"section": "size_sweep", "system": "redis", "case": f"{size:,} B", "record_size": size, **got})


def redis_waiters(run: Run, server: redis_peer.RedisServer) -> None:
    client = server.client()
    value = {"v": b"x" * 100}
    try:
        def while_waiting(_round: int) -> dict:
            return paced_latency_row(benchnode.paced_calls(WAITING_PRODUCE_RATE, run.plan.waiting_seconds,
                                                           lambda: client.xadd("waiting-producer", value)))

        alone = while_waiting(-1)
        before = server.memory()
        outcome = redis_peer.block_fanout(server, run.plan.waiters, run.plan.fanout_rounds, fanout_settle_s(run.plan),
                                          FANOUT_MAX_WAIT_MS / 1000, while_waiting=while_waiting)
    finally:
        client.close()
    run.fanout_latencies[f"redis: {run.plan.waiters:,} XREAD BLOCK"] = outcome.latencies_ns
    run.record(waiters_row("redis", run.plan.waiters, f"{run.plan.waiters:,} XREAD BLOCK; XADD",
                           [round(f, 3) for f in outcome.fanouts_ms],
                           benchnode.percentiles_ms(outcome.latencies_ns)["p99_ms"], before,
                           {key: max(m[key] for m in outcome.memory) for key in ("rss_bytes", "pss_bytes")},
                           alone, outcome.while_waiting))


# -- report ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: str = "{}"


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    columns: tuple[Column, ...]
    ratios: tuple[Column, ...] = ()  # node / peer of these metrics, in columns of their own
    text: str = ""


RATE = "{:,.0f}"
MS = "{:.2f}"
SECTIONS = (
    Section("producer", "1. Producer throughput, 100-byte records",
            (Column("system", "system"), Column("case", "case"), Column("records_per_s", "records/s", RATE),
             Column("mb_per_s", "MB/s", "{:,.1f}"), Column("p99_ms", "request p99 ms", MS)),
            (Column("records_per_s", "node / Redis records/s", MS),),
            "Peers: acks=1 beside Redis without persistence, acks=all beside appendfsync always, by number of "
            "producers (redis-benchmark clients). Raw producers send 8 KiB batches with 8 requests in flight per "
            "connection; confluent-kafka produces flat out (its p99 is mostly time queued in librdkafka)."),
    Section("consumer", "2. Consumer throughput from the start of a filled topic",
            (Column("system", "system"), Column("case", "case"), Column("records", "records", "{:,}"),
             Column("records_per_s", "records/s", RATE), Column("mb_per_s", "MB/s", "{:,.1f}"),
             Column("join_s", "group join s", "{:.1f}")),
            (Column("records_per_s", "node / Redis records/s", MS),),
            "Group consumers: confluent-kafka Consumers with one group.id, subscribed to a topic of 6 partitions, "
            "one process each. Their peer is one Redis consumer group read by XREADGROUP (COUNT 1000), one process "
            "per reader, each batch acknowledged with XACK in the same round trip: on both sides every record goes "
            "to one member and its delivery is recorded. Assigned consumers (no group) beside one XREAD reader. "
            "Rates run from the first record received to the last, the group's join (Kafka's 3 s initial "
            "rebalance delay) apart."),
    Section("together", "3. Producer and consumer together",
            (Column("system", "system"), Column("case", "case"),
             Column("producer_records_per_s", "producer records/s", RATE),
             Column("consumer_records_per_s", "consumer records/s", RATE),
             Column("behind_at_end", "consumer behind when the producer stopped", "{:,}")),
            (Column("producer_records_per_s", "node / Redis producer", MS),
             Column("consumer_records_per_s", "node / Redis consumer", MS)),
            "The consumer is subscribed (a group member, on a new 6-partition topic) or blocked in XREAD before the "
            "producer starts; the consumer's rate runs from its first record to its last."),
    Section("size_sweep", "4. Record size sweep (producer)",
            (Column("system", "system"), Column("case", "record size"), Column("records_per_s", "records/s", RATE),
             Column("mb_per_s", "MB/s", "{:,.1f}")),
            (Column("records_per_s", "node / Redis", MS),),
            "The node's raw producer (acks=1, 128 KB batches as the reference run's batch.size=128000) beside "
            "redis-benchmark XADD -P 16 without persistence."),
    Section("growth", "5. Producer throughput while the stored data grows",
            (Column("case", "step"), Column("stored_gb", "stored GB", "{:.2f}"),
             Column("records_per_s", "records/s", RATE), Column("mb_per_s", "MB/s", "{:,.1f}"),
             Column("seconds", "s", "{:.1f}"), Column("vs_first", "vs first step", MS),
             Column("first_step_records_per_s", "a first step beside it, records/s", RATE),
             Column("vs_first_now", "vs the first step beside it", MS)),
            (), "Node only: Redis keeps its data in memory. A fresh node, the raw producer (100-byte records in "
                "8 KiB batches, acks=1, 4 partitions) after 1 s of warm-up, equal steps of the fill; stored: the "
                "disk blocks of the data dir. Beside each step a second fresh node writes a first step again "
                f"(from empty, then deleted), the two in turn {GROW_CHUNKS} chunks each, so that the step and its "
                "peer share the machine's state of that minute: \"vs first step\" also holds how the machine "
                "changed since the first step, \"vs the first step beside it\" only the stored data's effect "
                "(the target's ratio)."),
    Section("e2e", "6. End-to-end latency, long-polling consumer",
            (Column("system", "system"), Column("case", "case"), Column("p50_ms", "p50 ms", MS),
             Column("p99_ms", "p99 ms", MS), Column("p999_ms", "p99.9 ms", MS), Column("p99_runs", "p99 of each run"),
             Column("samples", "samples", "{:,}"), Column("vs_redis_runs", "node / Redis p99, each round"),
             Column("placement_runs", "producer and consumer on, each round"),
             Column("vs_redis_paired", "node / Redis p99, median of rounds", MS),
             Column("vs_redis_one_worker", "median, one worker", MS),
             Column("vs_redis_moved_to_one", "median, moved to one", MS),
             Column("vs_redis_two_workers", "median, two workers", MS)),
            (Column("p99_ms", "node / Redis p99 (medians)", MS),),
            "Paced records (100 B, 1000/s) from a producer to a consumer long-polling one partition; latency from "
            "the send to the record in the consumer's hands. A fresh node and Redis run side by side; each round "
            "runs the node's two clients and Redis one after the other, so a round's runs share the machine's "
            f"state of that minute. First the machine settles (at most {E2E_SETTLE_MAX_S:.0f} s, until a second "
            f"with the CPUs at most {E2E_SETTLE_BUSY_PERCENT:.0f}% busy) and a {E2E_WARMUP_ROUND_S:.0f}-second round "
            "of each case is run and dropped: the section follows one that wrote gigabytes and held 10,000 "
            "connections. p50, p99 and p99.9 are the medians over the runs, and the CDF pools every sample. The "
            "target judges confluent-kafka's row by the median of its per-round p99 ratios. The raw "
            "protocol client (scripts/harness/rawkafka.py) is a thin blocking client, as redis-py is: the two node rows "
            "differ by the client alone, the node serving both alike. The kernel spreads connections over the "
            "workers, so in each run the producer and the consumer share a worker or not, by chance (read from "
            "the node's stats segment: which worker served the produce requests, which the fetches); across two "
            "workers each append wakes the consumer's worker through its doorbell, one process wake more on the "
            "way, until the consumer's connection moves to the producer's worker (after "
            "server.connection_affinity_waits long polls, within the warm-up: \"moved to one\"). The medians "
            "per placement give the rounds of each kind apart."),
    Section("saturation", "7. Purgatory saturation (delayed fetches)",
            (Column("offered_per_s", "offered/s", RATE), Column("sent_per_s", "sent/s", RATE),
             Column("completed_per_s", "completed/s", RATE), Column("p50_ms", "lateness p50 ms", MS),
             Column("p99_ms", "lateness p99 ms", MS), Column("timer_lateness_p50_us", "timer p50 us", RATE),
             Column("timer_lateness_p99_us", "timer p99 us", RATE), Column("node_cores", "node cores", MS),
             Column("client_cores", "client cores", MS)),
            (), f"Node only. Long-poll fetches (max_wait {SATURATION_EXPIRE_MS} ms, where nothing arrives) offered "
                "on a fixed schedule, one in flight per connection; sent < offered when every connection still "
                "waits; completed = answers due in the step's window. Lateness: past max_wait as the client sees "
                "it; the timer's own from the stats segment (median of p50, worst p99 over its 0.5 s intervals)."),
    Section("waiters", "8. Long-poll waiters while one producer runs",
            (Column("system", "system"), Column("case", "case"), Column("rss_mb_before", "RSS MB before", RATE),
             Column("rss_mb", "RSS MB waiting", RATE), Column("pss_mb", "PSS MB waiting", RATE),
             Column("kb_per_waiter", "KB per waiter (PSS)", "{:.1f}"),
             Column("fanout_ms_median", "fan-out ms (median)", "{:.1f}"),
             Column("waiter_p99_ms", "waiter p99 ms", "{:.1f}"),
             Column("produce_p99_ms_alone", "produce p99 ms, no waiters", MS),
             Column("produce_p99_ms_waiting", "produce p99 ms, waiting", MS)),
            (Column("fanout_ms_median", "node / Redis fan-out", MS),
             Column("kb_per_waiter", "node / Redis KB per waiter", MS)),
            "Memory before the waiters connect and while they wait (the most over the rounds): the node's summed over "
            "supervisor, timer and workers (RSS counts shared memory once per process that maps it; PSS splits it), "
            "Redis's one process; both hold the data of the earlier sections. Fan-out: from sending the append (one "
            "record to each of 4 partitions; one XADD) until the last waiter holds its answer. The producer sends "
            f"{WAITING_PRODUCE_RATE:.0f} single-record requests/s (raw Produce acks=1; XADD) to another topic."),
)


def _format(value: object, fmt: str) -> str:
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return fmt.format(value)
    return str(value)


def peer_of(rows: list[dict], row: dict) -> dict | None:
    return next((r for r in rows if r["section"] == row["section"] and r["system"] == "redis"
                 and r.get("case") == row.get("peer")), None) if row.get("peer") else None


def ratio(value: Any, base: Any) -> float | None:
    return value / base if isinstance(value, (int, float)) and isinstance(base, (int, float)) and base else None


def section_table(rows: list[dict], section: Section) -> list[str]:
    chosen = [r for r in rows if r["section"] == section.name]
    if not chosen:
        return []
    headers = [c.header for c in section.columns] + [c.header for c in section.ratios]
    lines = [f"## {section.title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in chosen:
        peer = peer_of(rows, row)
        cells = [_format(row.get(c.key), c.fmt) for c in section.columns]
        cells += [_format(ratio(row.get(c.key), peer.get(c.key)) if peer else None, c.fmt) for c in section.ratios]
        lines.append("| " + " | ".join(cells) + " |")
    if section.text:
        lines += ["", section.text]
    return lines + [""]


def targets(run: Run) -> list[dict]:
    """The report's targets, each measured in this run: node value, peer value or limit, ratio, met."""
    found = []

    def add(target: str, value: Any, base: Any, low: float | None, high: float | None, unit: str,
            paired: float | None = None) -> None:
        """The ratio value / base, or the paired ratio measured beside them, must lie in [low, high] (None: no
        bound on that side)."""
        r = paired if paired is not None else ratio(value, base)
        if r is None:
            return
        met = (low is None or r >= low) and (high is None or r <= high)
        limit = f"{low} to {high}" if low is not None and high is not None else (
            f">= {low}" if low is not None else f"<= {high}")
        found.append({"section": "target", "system": "shmbroker", "target": target, "value": value, "base": base,
                      "unit": unit, "ratio": round(r, 3), "limit": limit, "met": met})

    rows = run.rows

    def best(section: str, system: str, has: str) -> float | None:
        return max((r["records_per_s"] for r in rows if r["section"] == section and r["system"] == system
                    and has in r.get("case", "")), default=None)

    add("producer records/s >= redis-benchmark XADD pipelined (acks=1 / no persistence, best of 1 and 3)",
        best("producer", "shmbroker", "acks=1"), best("producer", "redis", "no persistence"), 1.0, None, "records/s")
    add("producer records/s >= redis-benchmark XADD pipelined (acks=all / appendfsync always, best of 1 and 3)",
        best("producer", "shmbroker", "acks=all"), best("producer", "redis", "appendfsync always"), 1.0, None,
        "records/s")
    e2e = {r["system"]: r for r in rows
           if r["section"] == "e2e" and (r["system"] == "redis" or r["case"] == E2E_CONFLUENT_CASE)}
    if len(e2e) == 2:
        add("end-to-end p99 <= 2x Redis XREAD BLOCK p99 (median of per-round ratios)", e2e["shmbroker"]["p99_ms"],
            e2e["redis"]["p99_ms"], None, 2.0, "ms", e2e["shmbroker"].get("vs_redis_paired"))
    growth = [r for r in rows if r["section"] == "growth"]
    if growth:
        add(f"throughput at {growth[-1]['stored_gb']:.1f} GB stored within 10% of a first step "
            f"({growth[-1]['first_step_gb']:.2f} GB) written beside it", growth[-1]["records_per_s"],
            growth[-1]["first_step_records_per_s"], 0.9, 1.1, "records/s")
    waiting = {r["system"]: r for r in rows if r["section"] == "waiters"}
    if "shmbroker" in waiting:
        add(f"{run.plan.waiters:,} waiting consumers: whole-node RSS < 1 GB", waiting["shmbroker"]["rss_mb"], 1000.0,
            None, 1.0, "MB")
    if len(waiting) == 2:
        add(f"{run.plan.waiters:,} waiting consumers: fan-out <= 1.5x Redis's",
            waiting["shmbroker"]["fanout_ms_median"], waiting["redis"]["fanout_ms_median"], None, 1.5, "ms")
    return found


def targets_table(found: list[dict]) -> list[str]:
    lines = ["## Targets", "", "| target | node | peer or limit | ratio | wanted | result |",
             "|---|---|---|---|---|---|"]
    for t in found:
        fmt = MS if t["unit"] == "ms" else RATE
        lines.append(f"| {t['target']} | {_format(t['value'], fmt)} {t['unit']} "
                     f"| {_format(t['base'], fmt)} {t['unit']} "
                     f"| {t['ratio']:.2f} | {t['limit']} | {'met' if t['met'] else '**missed**'} |")
    return lines + [""]


def markdown(run: Run, made: list[str], elapsed_s: float, found: list[dict]) -> str:
    plan = run.plan
    growth = [r for r in run.rows if r["section"] == "growth"]
    fill = (f" Section 5's fill took {sum(r['seconds'] for r in growth):.0f} s of it "
            f"({growth[-1]['stored_gb']:.1f} GB stored)." if growth else "")
    lines = [f"# shmbroker load-test report ({'quick' if plan.quick else 'full'} run)", "",
             f"Same machine ({os.cpu_count()} CPUs, shared), same run: the node (started here, {plan.workers} "
             f"worker{'s' if plan.workers != 1 else ''}) "
             f"and Redis Streams ({redis_version()}, started here). Run time {elapsed_s:.0f} s.{fill} Load average "
             f"{run.load_at_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end (other work on the machine "
             "moves single figures). Ratios are node / Redis in the same run.", ""]
    for note in plan.notes:
        lines += [f"**{note}**", ""]
    lines += targets_table(found)
    for section in SECTIONS:
        lines += section_table(run.rows, section)
    for png in made:
        lines += [f"![{png}]({png})", ""]
    text = "\n".join(lines)
    (run.out / "report.md").write_text(text)
    return text


def redis_version() -> str:
    try:
        done = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10)
        return next(part for part in done.stdout.split() if part.startswith("v=")).replace("v=", "redis ")
    except (OSError, StopIteration, subprocess.TimeoutExpired):
        return "redis"


# -- plots ------------------------------------------------------------------------------------------------------

COLORS = {"shmbroker": "tab:blue", "redis": "tab:red"}


def cdf(axis: Any, samples: list[int], label: str, color: str | None = None, style: str = "-") -> None:
    ordered = np.sort(np.asarray(samples, dtype=np.float64)) / 1e6
    axis.plot(ordered, np.arange(1, len(ordered) + 1) / len(ordered), style, label=label, color=color)


def plots(run: Run) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows, out, made = run.rows, run.out, []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)

    sweep = [r for r in rows if r["section"] == "size_sweep"]
    if sweep:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        for system, style in (("shmbroker", "o-"), ("redis", "s--")):
            points = sorted((r["record_size"], r["records_per_s"], r["mb_per_s"])
                            for r in sweep if r["system"] == system)
            if points:
                left.plot([p[0] for p in points], [p[1] for p in points], style, label=system, color=COLORS[system])
                right.plot([p[0] for p in points], [p[2] for p in points], style, label=system, color=COLORS[system])
        for axis, label in ((left, "records/s"), (right, "MB/s (payload)")):
            axis.set_xscale("log")
            axis.set_yscale("log")
            axis.set_xlabel("record size (bytes)")
            axis.set_ylabel(label)
            axis.grid(True, which="both", alpha=0.3)
            axis.legend()
        fig.suptitle("Producer throughput against record size (acks=1 / no persistence)")
        save(fig, "throughput_vs_record_size.png")
    if run.latencies or run.fanout_latencies:
        # End-to-end latencies span decades (log scale); a fan-out's answers lie within one (linear, from 0).
        panels = [p for p in ((run.latencies, "end-to-end latency (ms, log scale)", "log",
                               "End-to-end: long-poll fetch vs XREAD BLOCK"),
                              (run.fanout_latencies, "append to answer (ms)", "linear",
                               f"Fan-out: each of {run.plan.waiters:,} waiters after one append"))
                  if p[0]]
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
        for axis, (samples, xlabel, scale, title) in zip(axes[0], panels):
            for name, values in samples.items():
                if values:  # the node's second curve (the raw client) dashed, in the node's colour
                    cdf(axis, values, name, COLORS["redis" if name.startswith("redis") else "shmbroker"],
                        "--" if "raw client" in name else "-")
            axis.set_xscale(scale)
            if scale == "linear":
                axis.set_xlim(left=0)
            axis.set_xlabel(xlabel)
            axis.set_ylabel("fraction")
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(loc="lower right", fontsize=8)
            axis.set_title(title, fontsize=10)
        fig.suptitle("Latency CDFs")
        save(fig, "latency_cdf.png")
    producers = [r for r in rows if r["section"] == "producer"]
    if producers:
        fig, axis = plt.subplots(figsize=(9, 4.5))
        bars = axis.barh([r["case"] for r in producers], [r["records_per_s"] for r in producers],
                         color=[COLORS[r["system"]] for r in producers])
        axis.bar_label(bars, labels=[f" {r['records_per_s']:,.0f}" for r in producers], fontsize=8)
        axis.invert_yaxis()
        axis.set_xscale("log")
        values = [r["records_per_s"] for r in producers]
        axis.set_xlim(min(values) / 2, max(values) * 4)  # room for the labels
        axis.grid(True, which="both", axis="x", alpha=0.3)
        axis.set_xlabel("records/s (100-byte records, log scale)")
        axis.set_title("Producer throughput: shmbroker (blue) and Redis Streams (red)")
        save(fig, "producer_throughput.png")
    saturation = [r for r in rows if r["section"] == "saturation"]
    if saturation:
        offered = [r["offered_per_s"] for r in saturation]
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        top = max(offered) * 1.05
        left.plot([0, top], [0, top], ":", color="gray", label="completed = offered")
        left.plot(offered, [r["completed_per_s"] for r in saturation], "o-", color=COLORS["shmbroker"],
                  label="completed")
        left.plot(offered, [r["sent_per_s"] for r in saturation], "x--", color="tab:orange",
                  label="sent (a connection free)")
        left.set_xlabel("delayed fetches offered per second")
        left.set_ylabel("per second")
        left.set_title("Offered vs completed")
        for key, label, style, scale in (("p50_ms", "client-seen lateness p50", "o-", 1.0),
                                         ("p99_ms", "client-seen lateness p99", "o--", 1.0),
                                         ("timer_lateness_p99_us", "timer lateness p99 (stats)", "s:", 1e-3)):
            points = [(r["offered_per_s"], r[key] * scale) for r in saturation if r.get(key)]
            if points:
                right.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
        right.set_yscale("log")
        right.set_xlabel("delayed fetches offered per second")
        right.set_ylabel("ms past max_wait (log)")
        right.set_title(f"Lateness past max_wait ({SATURATION_EXPIRE_MS} ms)")
        for axis in (left, right):
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize=8)
        fig.suptitle("Purgatory saturation in the live node")
        save(fig, "saturation.png")
    growth = [r for r in rows if r["section"] == "growth"]
    if growth:
        fig, axis = plt.subplots(figsize=(8, 4.2))
        stored = [r["stored_gb"] for r in growth]
        rates = [r["records_per_s"] for r in growth]
        again = [r["first_step_records_per_s"] for r in growth]
        axis.fill_between(stored, [r * 0.9 for r in again], [r * 1.1 for r in again], color="tab:green", alpha=0.12,
                          label="the first step beside each step ± 10%")
        axis.plot(stored, again, "s--", color="tab:gray", label="a first step on a second node, beside each step")
        axis.plot(stored, rates, "o-", color=COLORS["shmbroker"], label="shmbroker, raw producer, the fill")
        axis.set_ylim(0, max(rates + again) * 1.25)
        axis.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _pos: f"{value / 1e6:g} M"))
        axis.set_xlim(0, max(stored) * 1.05)
        axis.set_xlabel("data stored at the end of the step (GB)")
        axis.set_ylabel("records/s (100-byte records)")
        axis.grid(True, alpha=0.3)
        axis.legend(loc="lower right")
        axis.set_title("Producer throughput against stored data")
        save(fig, "throughput_vs_stored.png")
    return made


# -- main ---------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def node_and_redis(plan: Plan) -> Iterator[tuple[NodeProcess, redis_peer.RedisServer]]:
    """A fresh node and Redis (no persistence) up together, for the section that alternates between them."""
    with NodeProcess(workers=plan.workers, announce=True) as node, redis_peer.redis_server(False) as server:
        yield node, server


@contextlib.contextmanager
def two_nodes(plan: Plan) -> Iterator[tuple[NodeProcess, NodeProcess]]:
    """Two fresh nodes: section 5's growing one and the one that writes a first step beside each of its steps."""
    with NodeProcess(workers=plan.workers, announce=True) as growing, \
            NodeProcess(workers=plan.workers, announce=True) as reference:
        yield growing, reference


def stages(run: Run, budget: int) -> list[tuple[Callable[[], Any], list[tuple[str, Callable[[Any], None]]]]]:
    """What runs, in order: (open the system under test, [(step label, step(system))])."""
    plan = run.plan
    node_steps: list[tuple[str, Callable[[Any], None]]] = []
    for client, producers in (("raw", 1), ("raw", 3), ("confluent", 1)):
        for acks in ("1", "all"):
            node_steps.append((f"node producer {client} x{producers} acks={acks}",
                               lambda node, c=client, p=producers, a=acks: node_producers(run, node, c, p, a)))
    node_steps += [("node consumers (raw, assigned)", lambda node: node_assigned_consumers(run, node)),
                   ("node group consumers x1, x3", lambda node: node_group_consumers(run, node)),
                   ("node producer and consumer together", lambda node: node_together(run, node))]
    node_steps += [(f"node size {size}", lambda node, s=size: node_size(run, node, s)) for size in SIZES]
    node_steps += [("node purgatory saturation", lambda node: node_saturation(run, node)),
                   (f"node {plan.waiters:,} waiters", lambda node: node_waiters(run, node))]
    redis_steps: list[tuple[str, Callable[[Any], None]]] = [
        (f"redis XADD x{clients} no persistence", lambda server, c=clients: redis_producers(run, server, c, False))
        for clients in (1, 3)]
    redis_steps += [("redis consumers (XREAD, XREADGROUP x1, x3)", lambda server: redis_consumers(run, server)),
                    ("redis producer and consumer together", lambda server: redis_together(run, server))]
    redis_steps += [(f"redis size {size}", lambda server, s=size: redis_size(run, server, s)) for size in SIZES]
    redis_steps += [(f"redis {plan.waiters:,} XREAD BLOCK waiters", lambda server: redis_waiters(run, server))]
    always_steps = [(f"redis XADD x{clients} appendfsync always",
                     lambda server, c=clients: redis_producers(run, server, c, True)) for clients in (1, 3)]
    found = [(lambda: NodeProcess(workers=plan.workers, announce=True), node_steps),
             (lambda: node_and_redis(plan), [(f"end-to-end latency, {plan.e2e_runs} rounds of node and Redis",
                                              lambda both: e2e_rounds(run, *both))])]
    if budget:
        found.append((lambda: two_nodes(plan),
                      [(f"node throughput while {budget / GB:.2f} GB of records are written",
                        lambda both: node_growth(run, *both, budget))]))
    found += [(lambda: redis_peer.redis_server(False, max_clients=plan.waiters + FDS_SPARE), redis_steps),
              (lambda: redis_peer.redis_server(True), always_steps)]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_report", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about 6 minutes (4 GB stored in section 5)")
    parser.add_argument("--out", default="bench-report", help="output directory (default %(default)s)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, help="seconds per producer measurement (4 with --quick, else 15)")
    parser.add_argument("--records", type=int, help="records per consumer run (1,000,000 with --quick, else 5,000,000)")
    parser.add_argument("--waiters", type=int, default=10_000, help="section 8: long polls and XREAD BLOCKs waiting")
    parser.add_argument("--fanout-rounds", type=int, help="section 8: rounds, one append each (5 with --quick, else 9)")
    parser.add_argument("--grow-mb", type=int, help="section 5: payload MB written (4096 with --quick, else 10240)")
    parser.add_argument("--grow-steps", type=int, help="section 5: steps of the fill (4 with --quick, else 10)")
    parser.add_argument("--rates", type=float, nargs="+", help="section 7: delayed fetches offered per second")
    parser.add_argument("--rate-seconds", type=float, help="section 7: seconds per rate (2 with --quick, else 8)")
    parser.add_argument("--e2e-runs", type=int, help="section 6: runs of each case, medians reported (3 with --quick, "
                                                     "else 5)")
    parser.add_argument("--json", action="store_true", help="the JSON lines on stdout instead of the Markdown")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL

    def pick(name: str) -> Any:
        value = getattr(args, name, None)
        return base[name] if value is None else value

    plan = Plan(args.quick, args.workers, pick("seconds"), pick("records"), args.waiters, pick("fanout_rounds"),
                pick("grow_mb"), pick("grow_steps"), sorted(pick("rates")), pick("rate_seconds"),
                min(base["waiting_seconds"], pick("seconds")), pick("e2e_runs"))
    if plan.seconds <= 0 or plan.records < 1000 or plan.workers < 1 or plan.waiters < 1 or plan.fanout_rounds < 1 \
            or plan.grow_mb < 0 or plan.grow_steps < 1 or min(plan.rates) <= 0 or plan.rate_seconds <= 0 \
            or plan.e2e_runs < 1:
        parser.error("sizes, counts and durations must be positive, --records at least 1000")
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))  # stop the node and Redis cleanly
    raise_fd_limit(plan)
    budget = grow_budget(plan) if plan.grow_mb else 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = Run(out, plan)
    started = time.monotonic()
    plan_of_run = stages(run, budget)
    progress = Progress(total=sum(len(steps) for _, steps in plan_of_run))
    try:
        for open_system, steps in plan_of_run:
            with open_system() as system:
                for label, step in steps:
                    step(system)
                    progress.step(label)
        found = [run.record(t) for t in targets(run)]
    finally:
        run.close()
    made = plots(run)
    text = markdown(run, made, time.monotonic() - started, found)
    if args.json:
        for row in run.rows:
            print(orjson.dumps(row).decode())
    else:
        print(text)
    print(f"bench_report: {out / 'report.md'}, {out / 'results.jsonl'}, {', '.join(made)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
