"""The load-test report: the node beside Apache Kafka and Redis Streams on the same machine in the same run, as
JSON lines, PNG plots and a Markdown report.

The servers (scripts/harness/servers.py): the node; Apache Kafka 4.4.0 (scripts/harness/kafka_peer.py: KRaft,
broker and controller in one JVM, its default 1 GB heap), with its defaults ("kafka": an acknowledged append is
in the page cache) and, for the acks=all and transaction rows, with log.flush.interval.messages=1 ("kafka-fsync":
an fsync per append, the node's acks=all promise); Redis (scripts/redis_peer.py) without persistence and with
appendfsync always. The node and Kafka run the same clients (the raw protocol client, confluent-kafka, and
Kafka's own kafka-producer-perf-test, kafka-consumer-perf-test and EndToEndLatency); Redis its own (redis-py,
redis-benchmark). Every row carries the server's CPU per operation (psutil, user + system time of its whole
process tree during the measurement), so that a ratio of rates on a shared 2-core machine comes with its cost.

Sections (the Kafka reference benchmark table of seed 004, and what the issue beside Kafka adds):
0. start-up: seconds from launch to the first answer, idle RSS/PSS and CPU;
1. producer throughput, 100-byte records: 1 and 3 raw producers, confluent-kafka and kafka-producer-perf-test,
   acks=1 and acks=all, beside redis-benchmark XADD pipelined (no persistence; appendfsync always);
2. consumer throughput from the start of a filled topic: raw fetches, an assigned confluent-kafka consumer,
   kafka-consumer-perf-test, 1 and 3 group consumers, beside XREAD and XREADGROUP (each batch XACKed);
3. producer and consumer together: confluent-kafka flat out while one group consumer follows, beside XADD and
   XREAD BLOCK;
4. record size sweep 10 B - 100 KB (the raw producer; XADD);
5. producer throughput while the stored data grows (4 GB with --quick, 10 GB in full), the node and Kafka,
   each step against a first step written beside it on a second server of the same kind (first run only);
6. end-to-end latency with a long-polling consumer (confluent-kafka and the raw client, 1000 records/s) beside
   XREAD BLOCK, the three servers up together, in paired rounds; and Kafka's EndToEndLatency tool;
7. purgatory saturation: expiring long-poll fetches offered at rising rates (bench_delayed.py): completed/s,
   lateness as clients see it, the server's cores and CPU per answer;
8. 10,000 connections each holding a long-poll fetch while one producer sends 500 requests/s: memory (RSS
   and PSS summed over each server's processes), that producer's latency, the fan-out time of one append;
   beside 10,000 XREAD BLOCK clients;
9. consumer groups: 10,000 members heartbeating, classic (bench_groups.py) and KIP-848
   (bench_consumer_groups.py): p50/p99, CPU per heartbeat;
10. transactions: a transactional confluent-kafka producer committing every 100 ms beside the idempotent one
   (bench_transactions.py's produce workload): records/s, EndTxn p50/p99;
11. compaction: the same dirty log written to each broker, cleaned by each one's cleaner: MB/s.
Every section but 5 runs --runs times (3 by default), the servers taking turns to go first; every figure is the
median over the runs and each row lists its section's main figure per run. Each node row shows node / Kafka,
node / Kafka fsync and node / Redis ratios, and says where a peer is ahead; the report lists every row where
Kafka is. Targets, each with its measured ratio: producer records/s >= redis-benchmark XADD with pipelining;
end-to-end p99 <= 2x Redis XREAD BLOCK p99 (the median of the per-round ratios); throughput at the end of the
fill within 10% of a first step written beside it; 10,000 waiting consumers under 1 GB RSS for the whole node
and their fan-out within 1.5x of Redis's.

Every server is started here on free loopback ports with its own temp dir and stopped by its pid. Only
127.0.0.1; every step is bounded in time. Output in --out (default ./bench-report): results.jsonl (every run's
rows, then the medians), a PNG per section, report.md. Usage:
    .venv/bin/python -m scripts.bench_report --quick      # three runs, about 45 minutes (4 GB fills)
    .venv/bin/python -m scripts.bench_report              # three runs, about 2 hours (10 GB fills)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
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

from scripts import (bench_consumer_groups, bench_delayed, bench_groups, bench_transactions, consumer_perf, e2e_latency,
                     producer_perf, redis_peer)
from scripts.harness import benchnode, kafka_peer, rawkafka, servers, sparkjob
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
         "rates": [5000, 10000, 20000, 30000, 40000], "rate_seconds": 2.0, "waiting_seconds": 2.0,
         "e2e_runs": 1, "compact_mb": 256, "runs": 3}
FULL = {"seconds": 15.0, "records": 5_000_000, "fanout_rounds": 9, "grow_mb": 10240, "grow_steps": 10,
        "rates": [1000, 2000, 5000, 10000, 15000, 20000, 25000, 30000, 40000], "rate_seconds": 8.0,
        "waiting_seconds": 5.0, "e2e_runs": 2, "compact_mb": 1024, "runs": 3}
E2E_CONFLUENT_CASE = "confluent-kafka, 1000 records/s"
E2E_REDIS_CASE = "redis-py, 1000 records/s"
E2E_RAW_CASE = "raw protocol client, 1000 records/s"
E2E_TOOL_CASE = "Kafka's EndToEndLatency, one record at a time"
E2E_TOOL_RECORDS = 5000
# Section 6 starts right after a stage that wrote gigabytes and held 10,000 connections: its first round ran
# slow in three quick runs out of three (confluent-kafka's p99 4-240 ms against 0.5-1.4 ms later, the raw
# client's up to 3x its later rounds; Redis's in two of the three). So first the machine settles (bounded),
# then one short round of each case is run and dropped.
E2E_SETTLE_MAX_S = 30.0
E2E_SETTLE_BUSY_PERCENT = 10.0  # CPU busy, all CPUs, over one second
E2E_WARMUP_ROUND_S = 2.0
E2E_PLACEMENT_TIMEOUT_S = 3.0  # for every worker to publish its counters after a run (every 0.5 s)
STARTUP_IDLE_S = 2.0  # after the first answer, before the idle memory is read; then the idle CPU over as long
GROUP_MEMBERS = 10_000
GROUP_HEARTBEAT_MS = {"classic": 1000, "consumer": 5000}  # bench_groups' and KIP-848's default intervals
GROUP_HEARTBEAT_PERIODS = 3  # heartbeats of each member measured
GROUP_PARTITIONS_848 = 10  # of the topic the KIP-848 groups subscribe to (bench_consumer_groups' default)
TXN_PARTITIONS = 4
TXN_COMMIT_INTERVAL_MS = 100
TXN_CASES = {"transactional": "confluent-kafka transactional, a commit every {interval} ms",
             "idempotent": "confluent-kafka idempotent, acks=all"}
COMPACT_VERSIONS = 4  # records per key in the dirty log: the cleaner keeps one in four
COMPACT_BATCH_RECORDS = 1000
COMPACT_SEGMENT_BYTES = 16 << 20  # at most; a smaller log gets smaller ones, down to Kafka 4's floor
COMPACT_MIN_SEGMENT_BYTES = 1 << 20  # Kafka 4 refuses a segment.bytes below 1 MiB
COMPACT_MIN_SEGMENTS = 8  # sealed segments of the dirty log at least: the cleaners never clean the active one
COMPACT_QUIET_S = 5.0  # no cleaning logged for this long after one: the cleaner is done with the topic
COMPACT_TIMEOUT_S = 300.0
REDIS_ALWAYS = "redis-always"  # opens Redis with appendfsync always (its rows are the system "redis")
COMPACTING_NODE_CONFIG = "[cleaner]\nbackoff_ms = 1000\nio_max_bytes_per_second = 1099511627776\n"
COMPACTING_KAFKA_SETTINGS = {"log.cleaner.backoff.ms": "1000"}  # Kafka's cleaner has no I/O limit by default
# Kafka's deleted topics wait a minute (file.delete.delay.ms) before their files go: section 5 measures the disk.
# The peer's test setting of no initial rebalance delay is put back to Kafka's default (the node's too): a new
# group's first members then join one generation together (--group-join-delay-ms sets both).
# Kafka's listen backlog (socket.listen.backlog.size, 50) is the node's (1024): with 50, a burst of 10,000 connects
# overflows it and SYN retries take minutes, which sections 7-9 would measure instead of the long polls.
KAFKA_REPORT_SETTINGS = {"file.delete.delay.ms": "1000", "socket.listen.backlog.size": "1024"}
GROUP_JOIN_DELAY_MS = 3000  # group.initial.rebalance.delay.ms of both brokers (--group-join-delay-ms)
KAFKA_HEAP_MB = 1024  # Kafka's default heap (kafka-server-start.sh: -Xmx1G)


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
    e2e_runs: int = 1  # section 6: rounds of each case per run; a row gives their median percentiles
    compact_mb: int = 256  # the compaction section's dirty log
    group_members: int = GROUP_MEMBERS
    runs: int = 3  # every section but the fill, the servers taking turns to go first; medians reported
    e2e_settle_s: float = E2E_SETTLE_MAX_S  # section 6: the longest wait for an idle machine
    e2e_tool_records: int = E2E_TOOL_RECORDS  # section 6: records Kafka's EndToEndLatency sends
    group_periods: int = GROUP_HEARTBEAT_PERIODS  # consumer groups: heartbeat intervals measured
    e2e_seconds: float | None = None  # section 6: seconds of each case per round (None: twice `seconds`)
    e2e_warmup_s: float = E2E_WARMUP_ROUND_S  # section 6: seconds of each case in the dropped warm-up round
    group_join_delay_ms: int = GROUP_JOIN_DELAY_MS  # the initial rebalance delay of the node and Kafka
    notes: list[str] = field(default_factory=list)  # what was scaled down, and why: printed in the report


class Run:
    """The rows measured so far (each also a line of results.jsonl, with its run's index) and the samples the plots
    need (pooled over the runs). After the last run, ``merge()`` makes ``rows`` the medians over the runs."""

    def __init__(self, out: Path, plan: Plan) -> None:
        self.out = out
        self.plan = plan
        self.index = 0  # the run being measured
        self.rows: list[dict] = []
        self.latencies: dict[str, list[int]] = {}  # e2e: name -> ns
        self.fanout_latencies: dict[str, list[int]] = {}  # section 8: name -> ns per waiter
        self.results = open(out / "results.jsonl", "wb")
        self.load_at_start = os.getloadavg()[0]

    def record(self, row: dict) -> dict:
        row = {**row, "run": self.index}
        self.rows.append(row)
        self.results.write(orjson.dumps(row) + b"\n")
        self.results.flush()
        return row

    def find(self, section: str, system: str, case: str | None = None) -> dict | None:
        """The latest row of (section, system, case): this run's, while runs go on."""
        return next((r for r in reversed(self.rows) if r["section"] == section and r["system"] == system
                     and (case is None or r.get("case") == case)), None)

    def merge(self) -> None:
        """Each (section, system, case) once: every number the median over the runs that measured it, and the
        section's main figure of each run beside it ("each_run"). The merged rows go to results.jsonl too, with
        run "median"."""
        groups: dict[tuple, list[dict]] = {}
        for row in self.rows:
            groups.setdefault((row["section"], row["system"], row.get("case")), []).append(row)
        metrics = {section.name: section.metric for section in SECTIONS}
        merged = []
        for (section, _system, _case), same in groups.items():
            row = dict(same[-1])
            for key in row:
                values = [r.get(key) for r in same]
                if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                    middle = statistics.median(values)
                    row[key] = int(middle) if float(middle).is_integer() and all(isinstance(v, int) for v in values) \
                        else round(middle, 4)
            row["run"] = "median"
            row["runs_measured"] = len(same)
            metric = metrics.get(section)
            if metric and len(same) > 1:
                row["each_run"] = " / ".join(_figure(r.get(metric)) for r in same)
            merged.append(row)
            self.results.write(orjson.dumps(row) + b"\n")
        self.rows = merged

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


def producers(run: Run, server: servers.Server, client: str, count: int, acks: str) -> None:
    extra = ["--processes", str(count), "--connections", str(max(4, count))] if client == "raw" else []
    with servers.Spent(server) as spent:
        (row,) = run_script("producer_perf", "--bootstrap", server.bootstrap, "--client", client, "--acks", acks,
                            "--seconds", str(run.plan.seconds), *extra)
    mode = "no persistence" if acks == "1" else "appendfsync always"
    run.record({"section": "producer", "system": server.system, "case": f"{client} x{count} acks={acks}",
                "records_per_s": row["records_per_s"], "mb_per_s": row["mb_per_s"], "p99_ms": row.get("p99_ms"),
                **spent.fields(row["records"]), "peer": f"XADD -P {redis_peer.PIPELINE} x{count} {mode}"})


def perf_test_producer(run: Run, server: servers.Server, acks: str) -> None:
    """Kafka's own kafka-producer-perf-test (the Java client) flat out: --records 100-byte records, or as many
    as it sends in about --seconds (it stops at its count; a throughput of -1 means unthrottled)."""
    topic = f"report-perf-test-{acks}-{os.getpid()}"
    benchnode.create_topic(benchnode.LOOPBACK, server.port, topic, 1)
    with servers.Spent(server) as spent:
        done = kafka_peer.tool(PRODUCER_PERF_TEST, "--topic", topic, "--num-records", str(run.plan.records),
                               "--record-size", "100", "--throughput", "-1", "--producer-props",
                               f"bootstrap.servers={server.bootstrap}", f"acks={acks}", "linger.ms=5",
                               timeout=STEP_TIMEOUT_S)
    found = kafka_tool_summary(done.stdout, PERF_TEST_PRODUCER_LINE)
    run.record({"section": "producer", "system": server.system, "case": f"kafka-producer-perf-test acks={acks}",
                "records_per_s": found["records_per_s"], "mb_per_s": found["mb_per_s"], "p99_ms": found["p99_ms"],
                **spent.fields(found["records"])})


PRODUCER_PERF_TEST = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERF_TEST = "org.apache.kafka.tools.ConsumerPerformance"
END_TO_END_LATENCY = "org.apache.kafka.tools.EndToEndLatency"
# kafka-producer-perf-test's last line: "1000000 records sent, 312500.0 records/sec (29.80 MB/sec), 5.12 ms avg
# latency, 180.00 ms max latency, 3 ms 50th, 10 ms 95th, 20 ms 99th, 25 ms 99.9th."
PERF_TEST_PRODUCER_LINE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\).*?"
                                     r"(\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th")


def kafka_tool_summary(stdout: str, pattern: re.Pattern) -> dict:
    found = pattern.findall(stdout)
    if not found:
        raise RuntimeError(f"no summary in the tool's output: {stdout[-2000:]}")
    records, rate, mb_rate, p50, _p95, p99 = found[-1]
    # Its MB are 2^20 bytes; the report's are 10^6 (as the rest of its MB/s).
    return {"records": int(records), "records_per_s": float(rate),
            "mb_per_s": round(float(mb_rate) * (1 << 20) / benchnode.MB, 3), "p50_ms": float(p50),
            "p99_ms": float(p99)}


def assigned_consumers(run: Run, server: servers.Server) -> None:
    """consumer_perf.py's raw and confluent (assigned, not grouped) consumers, from offset 0."""
    data_dir = ["--data-dir", server.data_dir] if server.data_dir else []
    with servers.Spent(server) as spent:
        consumed = run_script("consumer_perf", "--bootstrap", server.bootstrap, *data_dir, "--records",
                              str(run.plan.records), "--seconds", str(STEP_TIMEOUT_S / 4), "--passes", "1")
    for row in consumed:
        name = "raw fetch" if row["client"] == "raw" else "confluent"
        run.record({"section": "consumer", "system": server.system, "case": f"{name} x1, assigned", "consumers": 1,
                    "records": row["records"], "records_per_s": row["records_per_s"], "mb_per_s": row["mb_per_s"],
                    **spent.fields(sum(r["records"] for r in consumed)), "peer": "XREAD x1"})


def perf_test_consumer(run: Run, server: servers.Server) -> None:
    """Kafka's kafka-consumer-perf-test (the Java consumer, in a group) reading --records 100-byte records from
    the start of a topic filled by the raw producer."""
    filled = consumer_perf.fill_topic(server.target(), f"report-perf-consume-{os.getpid()}", run.plan.records, 1,
                                      100, 8192, STEP_TIMEOUT_S)
    with servers.Spent(server) as spent:
        done = kafka_peer.tool(CONSUMER_PERF_TEST, "--bootstrap-server", server.bootstrap, "--topic", filled.topic,
                               "--messages", str(filled.records), "--timeout", str(int(STEP_TIMEOUT_S * 1000 / 4)),
                               "--group", f"report-perf-{os.getpid()}", "--hide-header", timeout=STEP_TIMEOUT_S)
    # One CSV line: start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec,
    # rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec (MB: 2^20 bytes). The fetch.* rates leave
    # the group's join out, as the other group rows do.
    fields = [line.split(", ") for line in done.stdout.splitlines() if line.count(",") >= 9][-1]
    records, rate = int(fields[4]), float(fields[9])
    run.record({"section": "consumer", "system": server.system, "case": "kafka-consumer-perf-test x1, group",
                "consumers": 1, "records": records, "records_per_s": rate,
                "mb_per_s": round(float(fields[8]) * (1 << 20) / benchnode.MB, 3),
                "join_s": round(float(fields[6]) / 1000, 2), **spent.fields(records)})


def group_consumers(run: Run, server: servers.Server) -> None:
    """One topic of --records records in GROUP_PARTITIONS partitions, read by a new group of 1, then of 3."""
    target = server.target()
    filled = consumer_perf.fill_topic(target, f"report-group-{os.getpid()}", run.plan.records, GROUP_PARTITIONS,
                                      100, 8192, STEP_TIMEOUT_S)
    for consumers in (1, 3):
        with servers.Spent(server) as spent:
            got = consumer_perf.consume_group(target, filled, consumers, GROUP_CONSUME_TIMEOUT_S, 1)
        run.record({"section": "consumer", "system": server.system, "case": f"confluent group x{consumers}",
                    "consumers": consumers, "records": got.records,
                    "records_per_s": round(got.records / got.elapsed_s, 1) if got.elapsed_s else None,
                    "mb_per_s": round(got.records * 100 / got.elapsed_s / benchnode.MB, 3) if got.elapsed_s else None,
                    "join_s": got.join_s, **spent.fields(got.records), "peer": f"XREADGROUP x{consumers}"})


def together(run: Run, server: servers.Server) -> None:
    """A confluent-kafka producer flat out for --seconds while one group consumer reads the same topic."""
    topic = f"report-together-{os.getpid()}"
    benchnode.create_topic(benchnode.LOOPBACK, server.port, topic, GROUP_PARTITIONS)
    group = f"report-together-{os.getpid()}"
    with benchnode.CountingProcesses(consumer_perf.group_member, 1, server.bootstrap, topic, group, 1,
                                     consumer_perf.GROUP_JOIN_TIMEOUT_S + run.plan.seconds + TOGETHER_DRAIN_S) as procs:
        procs.wait_ready(consumer_perf.GROUP_JOIN_TIMEOUT_S)
        with servers.Spent(server) as spent:
            produced = producer_perf.run_confluent_producer(server.bootstrap, topic, 100, 1, run.plan.seconds, 8192,
                                                            5)
            behind = produced.records - procs.records()
            procs.wait_for(produced.records, TOGETHER_DRAIN_S)
    run.record({**together_row(server.system, "confluent-kafka producer + 1 group consumer",
                               produced.records / produced.elapsed_s, procs.records(), procs.span_s(), behind,
                               "redis-benchmark XADD + 1 XREAD BLOCK reader"),
                **spent.fields(produced.records + procs.records())})


def together_row(system: str, case: str, producer_rate: float, consumed: int, span_s: float, behind: int,
                 peer: str | None = None) -> dict:
    return {"section": "together", "system": system, "case": case, "producer_records_per_s": round(producer_rate, 1),
            "consumer_records_per_s": round(consumed / span_s, 1) if span_s else None, "consumed": consumed,
            "behind_at_end": behind, "peer": peer}


def size_sweep(run: Run, server: servers.Server, size: int) -> None:
    batch = max(SWEEP_BATCH_BYTES, size + 128)
    with servers.Spent(server) as spent:
        (row,) = run_script("producer_perf", "--bootstrap", server.bootstrap, "--client", "raw", "--acks", "1",
                            "--record-size", str(size), "--batch-bytes", str(batch), "--seconds",
                            str(run.plan.seconds / 2))
    run.record({"section": "size_sweep", "system": server.system, "case": f"{size:,} B", "record_size": size,
                "records_per_s": row["records_per_s"], "mb_per_s": row["mb_per_s"], **spent.fields(row["records"]),
                "peer": f"{size:,} B"})


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


def e2e_rounds(run: Run, brokers: list[servers.Server], redis: servers.Server) -> None:
    """Section 6, the node, Kafka and Redis all up: each round runs, against the node and then Kafka,
    confluent-kafka (what users run; the target's row) and the project's raw protocol client (a thin blocking
    client as redis-py is, so the two rows of a broker tell its share from librdkafka's thread hand-offs), then
    Redis, one after the other. A p99 on a shared 2-CPU machine swings by tens of percent from one minute to the
    next; a round's runs share their minute, so each round's node / Redis and node / Kafka ratios are paired
    measurements and the report takes their medians. Kafka's EndToEndLatency tool (one record at a time, sent
    once the last one arrived) runs against both brokers after the rounds."""
    cases = ((e2e_latency.run_confluent, E2E_CONFLUENT_CASE, "confluent-kafka, long-poll fetch"),
             (e2e_latency.run_raw, E2E_RAW_CASE, "raw client, long-poll fetch"))
    runs = {(broker.system, case): [] for broker in brokers for _, case, _ in cases}
    placements: dict[str, list[str]] = {case: [] for _, case, _ in cases}
    spent = {(broker.system, case): 0.0 for broker in brokers for _, case, _ in cases}
    redis_runs: list[list[int]] = []
    redis_spent = 0.0
    node = next(broker.node for broker in brokers if broker.node is not None)
    serving = ServingWorkers(node)
    settled_s = settle(run.plan.e2e_settle_s, E2E_SETTLE_BUSY_PERCENT)
    print(f"bench_report: end-to-end: the machine settled in {settled_s:.1f} s", file=sys.stderr, flush=True)
    for round_ in range(-1, run.plan.e2e_runs):  # round -1: the warm-up, dropped
        seconds = run.plan.e2e_warmup_s if round_ < 0 else run.plan.e2e_seconds or run.plan.seconds * 2
        for broker in brokers:
            for client, case, _ in cases:
                topic = f"report-e2e-{client.__name__}-{round_ + 1}-{os.getpid()}"
                benchnode.create_topic(benchnode.LOOPBACK, broker.port, topic, 1)
                latency_run = e2e_latency.LatencyRun(topic, 1000.0, seconds, 0.5, 100)
                before = serving.counts()
                with servers.Spent(broker) as used:
                    latencies = list(client(broker.target(), latency_run).latencies_ns)
                if round_ >= 0:
                    runs[broker.system, case].append(latencies)
                    spent[broker.system, case] += used.cpu_s
                    if broker.node is not None:
                        placements[case].append(serving.placement(before, E2E_PLACEMENT_TIMEOUT_S))
        with servers.Spent(redis) as used:
            latencies = redis_peer.end_to_end(redis.handle, 1000.0, seconds, 100)
        if round_ >= 0:
            redis_runs.append(latencies)
            redis_spent += used.cpu_s
    serving.close()

    def p99s(latency_runs: list[list[int]]) -> list[float]:
        return [benchnode.percentiles_ms(latencies)["p99_ms"] for latencies in latency_runs]

    def per_record(cpu_s: float, latency_runs: list[list[int]]) -> dict:
        records = sum(len(latencies) for latencies in latency_runs)
        return {"server_cpu_s": round(cpu_s, 3), "cpu_us_per_op": round(cpu_s / records * 1e6, 3) if records else None}

    redis_p99s = p99s(redis_runs)
    for broker in brokers:
        for _, case, curve in cases:
            mine = runs[broker.system, case]
            run.latencies.setdefault(f"{broker.system} ({curve})", []).extend(
                latency for one in mine for latency in one)
            paired = [p99 / peer for p99, peer in zip(p99s(mine), redis_p99s)]
            row = {"section": "e2e", "system": broker.system, "case": case, **median_percentiles(mine),
                   "vs_redis_runs": " / ".join(f"{r:.2f}" for r in paired),
                   "vs_redis_paired": round(statistics.median(paired), 3),
                   **per_record(spent[broker.system, case], mine),
                   "peer": E2E_REDIS_CASE}
            if broker.node is not None:
                by_placement = {where: [ratio for ratio, at in zip(paired, placements[case]) if at == where]
                                for where in ServingWorkers.PLACEMENTS}
                row["placement_runs"] = " / ".join(placements[case])
                row.update({f"vs_redis_{where.replace(' ', '_')}": round(statistics.median(ratios), 3) if ratios
                            else None for where, ratios in by_placement.items()})
                for other in brokers:
                    if other.node is None:
                        vs = [p99 / peer for p99, peer in zip(p99s(mine), p99s(runs[other.system, case]))]
                        row[f"vs_{other.system.replace('-', '_')}_paired"] = round(statistics.median(vs), 3)
            run.record(row)
    run.latencies.setdefault("redis (XREAD BLOCK)", []).extend(latency for one in redis_runs for latency in one)
    run.record({"section": "e2e", "system": "redis", "case": E2E_REDIS_CASE, **median_percentiles(redis_runs),
                **per_record(redis_spent, redis_runs)})
    for broker in brokers:
        end_to_end_tool(run, broker)


def end_to_end_tool(run: Run, server: servers.Server) -> None:
    """Kafka's EndToEndLatency: --e2e-records records of 100 B, acks=1, each sent once the last one was
    consumed (no pacing, no long poll waiting long: its consumer polls)."""
    topic = f"report-e2e-tool-{os.getpid()}"
    benchnode.create_topic(benchnode.LOOPBACK, server.port, topic, 1)
    with servers.Spent(server) as spent:
        done = kafka_peer.tool(END_TO_END_LATENCY, server.bootstrap, topic, str(run.plan.e2e_tool_records), "1", "100",
                               timeout=STEP_TIMEOUT_S)
    # "Avg latency: 1.2345 ms" and "Percentiles: 50th = 1, 99th = 3, 99.9th = 9" (ms, whole).
    average = float(re.findall(r"Avg latency: ([\d.]+) ms", done.stdout)[-1])
    p50, p99, p999 = (float(v) for v in re.findall(r"50th = (\d+), 99th = (\d+), 99.9th = (\d+)", done.stdout)[-1])
    run.record({"section": "e2e", "system": server.system, "case": E2E_TOOL_CASE, "p50_ms": p50, "p99_ms": p99,
                "p999_ms": p999, "average_ms": average, "samples": run.plan.e2e_tool_records, "runs": 1,
                **spent.fields(run.plan.e2e_tool_records)})


def median_percentiles(runs: list[list[int]]) -> dict:
    """Section 6's row: each percentile the median over the runs, each run's p99, and the samples of all."""
    each = [benchnode.percentiles_ms(latencies) for latencies in runs]
    return {**{key: statistics.median(p[key] for p in each) for key in ("p50_ms", "p99_ms", "p999_ms")},
            "p99_runs": " / ".join(f"{p['p99_ms']:.2f}" for p in each), "runs": len(runs),
            "samples": sum(len(latencies) for latencies in runs)}


def saturation(run: Run, server: servers.Server) -> None:
    args = argparse.Namespace(partitions=4, settle_ms=500, rates=run.plan.rates, step_seconds=run.plan.rate_seconds,
                              expire_ms=SATURATION_EXPIRE_MS, connections=saturation_pool(max(run.plan.rates)))
    for row in bench_delayed.run_offered(args, server.target(), server_cpu_s=server.cpu_seconds):
        run.record({"section": "saturation", "system": server.system, "case": f"{row['rate']:,.0f} fetches/s",
                    **{k: row[k] for k in ("offered_per_s", "sent_per_s", "completed_per_s", "unsent", "unanswered",
                                           "p50_ms", "p99_ms", "timer_lateness_p50_us", "timer_lateness_p99_us",
                                           "node_fetches_expired", "server_cores", "cpu_us_per_op", "client_cores")
                       if k in row}})


def paced_latency_row(latencies_ns: list[int]) -> dict:
    p = benchnode.percentiles_ms(latencies_ns)
    return {"p50_ms": p["p50_ms"], "p99_ms": p["p99_ms"], "samples": len(latencies_ns)}


def waiters(run: Run, server: servers.Server) -> None:
    """bench_delayed's fanout with --waiters long polls; meanwhile one producer sends single-record requests to
    another topic (its latency also measured before the waiters connect)."""
    topic = f"report-waiting-producer-{os.getpid()}"
    benchnode.create_topic(benchnode.LOOPBACK, server.port, topic, 1)
    body = rawkafka.produce_body({topic: {0: rawkafka.make_batch(1, 100)}}, acks=1)
    errors = [0]
    with rawkafka.RawConnection(benchnode.LOOPBACK, server.port) as conn:
        def produce() -> None:
            errors[0] += bool(e2e_latency._produce_error(conn.request(rawkafka.PRODUCE, 8, body), topic))

        def while_waiting(_round: int) -> dict:
            return paced_latency_row(benchnode.paced_calls(WAITING_PRODUCE_RATE, run.plan.waiting_seconds, produce))

        alone = while_waiting(-1)
        before = server.memory()
        args = argparse.Namespace(waiters=run.plan.waiters, partitions=4, rounds=run.plan.fanout_rounds,
                                  max_wait_ms=FANOUT_MAX_WAIT_MS, settle_ms=int(fanout_settle_s(run.plan) * 1000))
        samples: list[int] = []
        with servers.Spent(server) as spent:
            row = bench_delayed.run_fanout(args, server.target(), while_waiting=while_waiting, samples=samples,
                                           memory=server.memory)
    if errors[0]:
        raise RuntimeError(f"{errors[0]} produce requests failed while the waiters waited")
    run.fanout_latencies.setdefault(f"{server.system}: {run.plan.waiters:,} long-poll fetches", []).extend(samples)
    run.record({**waiters_row(server.system, run.plan.waiters, WAITERS_CASE.format(waiters=run.plan.waiters),
                              row["fanout_ms"], row["p99_ms"], before, {"rss_bytes": row["node_rss_bytes_max"],
                                                                        "pss_bytes": row["node_pss_bytes_max"]},
                              alone, row["while_waiting"], f"{run.plan.waiters:,} XREAD BLOCK; XADD"),
                **spent.fields(run.plan.waiters * run.plan.fanout_rounds)})


WAITERS_CASE = "{waiters:,} long-poll fetches; raw Produce"


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


def growth(run: Run, growing: servers.Server, reference: servers.Server, budget: int) -> None:
    """Fill a fresh server (the node, or Kafka) with the raw producer (consumer_perf's fill: 100-byte records in
    8 KiB batches, acks=1) in --grow-steps equal steps up to `budget` bytes of payload. A step's rate alone would
    judge the stored data by minutes of a shared machine that swing by tens of percent, so beside each step a
    second server of the same kind writes a
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
        cpu_s = 0.0  # the growing server's
        for chunk in range(GROW_CHUNKS):
            pair = ((growing, topic), (reference, again))
            for node, name in pair if chunk % 2 == 0 else reversed(pair):  # neither always goes first
                started = time.monotonic()
                with servers.Spent(node) as spent:
                    filled = consumer_perf.fill_topic(node.target(), name, chunk_records, GROW_PARTITIONS, 100, 8192,
                                                      STEP_TIMEOUT_S)
                chunks[node.port].append((filled.records, time.monotonic() - started))
                cpu_s += spent.cpu_s if node is growing else 0.0
        seconds = sum(spent for _, spent in chunks[growing.port])
        rate, first_now = (sum(records for records, _ in done) / sum(spent for _, spent in done)
                           for done in (chunks[growing.port], chunks[reference.port]))
        paired = [(mine / mine_s) / (peer / peer_s)
                  for (mine, mine_s), (peer, peer_s) in zip(chunks[growing.port], chunks[reference.port])]
        first = first or rate
        stored, stored_again = stored_bytes(Path(growing.log_dir)), stored_bytes(Path(reference.log_dir))
        benchnode.delete_topic(benchnode.LOOPBACK, reference.port, again)
        run.record({"section": "growth", "system": growing.system, "case": f"step {step + 1}/{run.plan.grow_steps}",
                    "stored_gb": round(stored / GB, 3), "records_per_s": round(rate, 1),
                    "mb_per_s": round(rate * 100 / benchnode.MB, 3), "seconds": round(seconds, 2),
                    "vs_first": round(rate / first, 3), "first_step_gb": round(stored_again / GB, 3),
                    "first_step_records_per_s": round(first_now, 1), "vs_first_now": round(rate / first_now, 3),
                    "vs_first_now_chunks": " / ".join(f"{r:.2f}" for r in paired), "server_cpu_s": round(cpu_s, 3),
                    "cpu_us_per_op": round(cpu_s / sum(n for n, _ in chunks[growing.port]) * 1e6, 3)})
        print(f"bench_report: {growing.system} growth step {step + 1}/{run.plan.grow_steps}: {stored / GB:.2f} GB "
              f"stored, {rate:,.0f} records/s; a first step beside it {first_now:,.0f} records/s", file=sys.stderr,
              flush=True)


def startup(run: Run, system: str) -> None:
    """A fresh server of `system` on an empty data dir: seconds from launch until its first answer (ApiVersions;
    PING for Redis), and its memory once idle (STARTUP_IDLE_S later)."""
    extra: dict[str, Any] = {}
    started = time.monotonic()
    with open_server(run.plan, system) as server:
        first_answer_s = time.monotonic() - started
        if system in (servers.KAFKA, servers.KAFKA_FSYNC):
            peer = server.handle
            # Launch to first answer, the storage format (a JVM of its own, once per data dir) apart.
            first_answer_s = peer.first_answer_s
            extra = {"serving_s": round(peer.serving_s, 3), "format_s": round(peer.format_s, 3)}
        time.sleep(STARTUP_IDLE_S)
        memory = server.memory()
        with servers.Spent(server) as spent:
            time.sleep(STARTUP_IDLE_S)
    run.record({"section": "startup", "system": system, "case": "a fresh start, empty data dir",
                "first_answer_s": round(first_answer_s, 3), **extra,
                "idle_rss_mb": round(memory["rss_bytes"] / 1e6, 1), "idle_pss_mb": round(memory["pss_bytes"] / 1e6, 1),
                "processes": memory["processes"], "idle_cores": round(spent.cpu_s / spent.wall_s, 4)})


def group_heartbeats(run: Run, server: servers.Server, protocol: str) -> None:
    """--group-members members in groups of 10 (bench_groups for the classic protocol, bench_consumer_groups for
    KIP-848's), each heartbeating at its own phase, for --group-periods heartbeat intervals (each member's first
    heartbeat comes within the first interval)."""
    members, seconds = run.plan.group_members, run.plan.group_periods * GROUP_HEARTBEAT_MS[protocol] / 1000
    # A connection per member, as real consumers have: Kafka reads a connection's next request only once it has
    # answered the last, so members sharing one would join one at a time, each JoinGroup held in the join phase.
    common = {"members": members, "group_size": 10, "heartbeat_ms": GROUP_HEARTBEAT_MS[protocol],
              "connections": members,
              "seconds": seconds, "setup_timeout_s": STEP_TIMEOUT_S / 2}
    groups = [f"{'heartbeat' if protocol == 'classic' else 'hb'}-{g}" for g in range(members // 10)]  # their names
    benchnode.wait_for_group_coordinator(benchnode.LOOPBACK, server.port, groups, STEP_TIMEOUT_S / 4)
    if protocol == "classic":
        row = bench_groups.run_heartbeat(argparse.Namespace(**common, session_ms=30_000), server.target(),
                                         server.cpu_seconds)
    else:
        # Every KIP-848 group subscribes to this topic; its assignor (each server's default) spreads its partitions.
        benchnode.create_topic(benchnode.LOOPBACK, server.port, bench_consumer_groups.TOPIC, GROUP_PARTITIONS_848)
        row = bench_consumer_groups.run_heartbeat(argparse.Namespace(**common, partitions=GROUP_PARTITIONS_848,
                                                                     rebalance_timeout_ms=60_000),
                                                  server.target(), server.cpu_seconds)
    beats = row["records"]
    run.record({"section": "groups", "system": server.system,
                "case": f"{members:,} {protocol} members, a heartbeat each {GROUP_HEARTBEAT_MS[protocol]} ms",
                "heartbeats": beats, "heartbeats_per_s": round(beats / seconds, 1), "p50_ms": row["p50_ms"],
                "p99_ms": row["p99_ms"], "p999_ms": row["p999_ms"], "members_with_errors": row["members_with_errors"],
                "server_cpu_s": row["server_cpu_s"],
                "cpu_us_per_op": round(row["server_cpu_s"] / beats * 1e6, 3) if beats else None})


def transactions(run: Run, server: servers.Server) -> None:
    """bench_transactions' produce workload, once each: a transactional confluent-kafka producer committing every
    TXN_COMMIT_INTERVAL_MS, and the idempotent producer at the same load (acks=all both). The transactional row
    gives EndTxn's latency (commit_transaction() after a flush(): the round trip of the decision and markers)."""
    topic = f"report-txn-{os.getpid()}"
    benchnode.create_topic(benchnode.LOOPBACK, server.port, topic, TXN_PARTITIONS)
    args = argparse.Namespace(seconds=run.plan.seconds, commit_interval_ms=TXN_COMMIT_INTERVAL_MS,
                              queue_records=bench_transactions.QUEUE_RECORDS, keys=0, record_size=100, linger_ms=5,
                              batch_bytes=16384)
    for mode in ("idempotent", "transactional"):
        with servers.Spent(server) as spent:
            step = bench_transactions.produce_flat_out(server.bootstrap, topic, args, mode == "transactional")
        if step.errors:
            raise RuntimeError(f"{mode} producer: delivery errors {step.errors}")
        commits = benchnode.percentiles_ms(step.commits_ns) if step.commits_ns else {}
        run.record({"section": "transactions", "system": server.system,
                    "case": TXN_CASES[mode].format(interval=TXN_COMMIT_INTERVAL_MS),
                    "records_per_s": round(step.records / step.seconds, 1),
                    "commits": len(step.commits_ns) if mode == "transactional" else None,
                    "end_txn_p50_ms": commits.get("p50_ms"), "end_txn_p99_ms": commits.get("p99_ms"),
                    **spent.fields(step.records)})


def compaction(run: Run, system: str) -> None:
    """The same dirty log (--compact-mb of 100-byte values, COMPACT_VERSIONS per key, keyed batches of
    COMPACT_BATCH_RECORDS through the raw producer, at least COMPACT_MIN_SEGMENTS segments) written to a fresh server
    of `system`, then cleaned by its log cleaner with the same settings (no I/O rate limit, one cleaner, a 128 MB
    offset map, a look for dirty logs every second): the log's MB per second of cleaning, the seconds as each
    cleaner logs them (summed over its passes on the topic)."""
    with open_server(run.plan, system, compacting=True) as server:
        topic = f"report-compact-{os.getpid()}"
        batches = max(1, run.plan.compact_mb * 1_000_000 // (COMPACT_BATCH_RECORDS * 120))
        segment_bytes = min(COMPACT_SEGMENT_BYTES, max(COMPACT_MIN_SEGMENT_BYTES, batches * COMPACT_BATCH_RECORDS
                                                       * 120 // COMPACT_MIN_SEGMENTS))
        with rawkafka.RawConnection(benchnode.LOOPBACK, server.port) as conn:
            created = conn.call(rawkafka.CREATE_TOPICS, 4, rawkafka.create_topics_body(
                {topic: 1}, configs={"cleanup.policy": "compact", "segment.bytes": str(segment_bytes)}))
            if int(created.topics[0].error_code):
                raise RuntimeError(f"CreateTopics {topic}: {int(created.topics[0].error_code)}")
            benchnode.create_topic(benchnode.LOOPBACK, server.port, topic, 1)
            value = b"v" * 100
            distinct = max(1, batches * COMPACT_BATCH_RECORDS // COMPACT_VERSIONS)
            log_bytes = 0
            with servers.Spent(server) as spent:
                for number in range(batches):
                    first = number * COMPACT_BATCH_RECORDS
                    keys = [b"key-%09d" % ((first + i) % distinct) for i in range(COMPACT_BATCH_RECORDS)]
                    batch = rawkafka.build_record_batch([value] * COMPACT_BATCH_RECORDS, keys)
                    log_bytes += len(batch)
                    answer = conn.call(rawkafka.PRODUCE, 8, rawkafka.produce_body({topic: {0: batch}}, acks=1))
                    code = int(answer.responses[0].partition_responses[0].error_code)
                    if code:
                        raise RuntimeError(f"produce to {topic}: error {code}")
                cleaned = wait_cleaned(server, topic)
        written_mb = batches * COMPACT_BATCH_RECORDS * 100 / 1e6
    log_mb = log_bytes / (1 << 20)
    run.record({"section": "compaction", "system": system, "case": f"{written_mb:,.0f} MB of values, "
                f"{COMPACT_VERSIONS} per key", "log_mb": round(log_mb, 1), "cleaner_mb_read": round(cleaned[0], 1),
                "clean_seconds": round(cleaned[1], 3), "passes": cleaned[2],
                "clean_mb_per_s": round(log_mb / cleaned[1], 1) if cleaned[1] else None,
                "server_cpu_s": round(spent.cpu_s, 3)})


# The cleaners' own log lines: the node's (node.cleaner.process) and Kafka's LogCleaner (MB: 2^20 bytes).
NODE_CLEANED = re.compile(r"cleaned (\S+)-0: .*?([\d.]+) MB read, .*? ([\d.]+) s")
# Kafka logs seconds to a tenth; its MB/sec is of the exact time, so the seconds are MB / (MB/sec).
KAFKA_CLEANED = re.compile(r"cleaned log (\S+)-0 .*?\n\s*([\d,.]+) MB of log processed in [\d,.]+ seconds "
                           r"\(([\d,.]+) MB/sec\)")


def wait_cleaned(server: servers.Server, topic: str) -> tuple[float, float, int]:
    """(MB read, seconds, passes) of the cleaner's work on `topic`, once it has logged a cleaning of it and then
    nothing more for COMPACT_QUIET_S (at most COMPACT_TIMEOUT_S)."""
    pattern = NODE_CLEANED if server.node is not None else KAFKA_CLEANED
    deadline = time.monotonic() + COMPACT_TIMEOUT_S
    seen: list[tuple[float, float]] = []
    changed = time.monotonic()
    while time.monotonic() < deadline:
        text = server.node.log() if server.node is not None else server.handle.log(chars=1 << 22)
        found = [(mb, seconds if server.node is not None else mb / seconds if seconds else 0.0)
                 for name, mb, seconds in ((name, float(mb.replace(",", "")), float(value.replace(",", "")))
                                           for name, mb, value in pattern.findall(text)) if name == topic]
        if len(found) != len(seen):
            seen, changed = found, time.monotonic()
        if seen and time.monotonic() - changed >= COMPACT_QUIET_S:
            return sum(mb for mb, _ in seen), sum(s for _, s in seen), len(seen)
        time.sleep(0.2)
    raise RuntimeError(f"{server.system}: {topic} was not cleaned in {COMPACT_TIMEOUT_S:.0f} s")


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
    run.fanout_latencies.setdefault(f"redis: {run.plan.waiters:,} XREAD BLOCK", []).extend(outcome.latencies_ns)
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
    higher_is_better: bool = True  # for a ratio: on which side of 1 the node is ahead


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    columns: tuple[Column, ...]
    ratios: tuple[Column, ...] = ()  # node / peer of these figures, a column per peer measured in the section
    text: str = ""
    metric: str = ""  # the figure each run's value of is listed in the merged row ("each_run")


RATE = "{:,.0f}"
MS = "{:.2f}"
SYSTEM = Column("system", "system")
CASE = Column("case", "case")
CPU_PER_OP = Column("cpu_us_per_op", "server CPU us/op", "{:,.1f}", higher_is_better=False)
EACH_RUN = Column("each_run", "each run")
SECTIONS = (
    Section("startup", "0. Start-up and idle",
            (SYSTEM, CASE, Column("first_answer_s", "first answer s", "{:.2f}"),
             Column("serving_s", "Kafka: listed in Metadata s", "{:.2f}"),
             Column("format_s", "Kafka: format s", "{:.2f}"),
             Column("idle_rss_mb", "idle RSS MB", "{:,.1f}"), Column("idle_pss_mb", "idle PSS MB", "{:,.1f}"),
             Column("processes", "processes"), Column("idle_cores", "idle cores", "{:.4f}"), EACH_RUN),
            (Column("first_answer_s", "first answer", MS, False), Column("idle_pss_mb", "idle PSS", MS, False)),
            "A fresh server on an empty data dir: from launching it until its first answer (ApiVersions; PING for "
            "Redis). The node's figure waits for every worker's ready line too. Kafka's is its broker JVM's, "
            "launched after `kafka-storage format` (another JVM, once per data dir, timed apart); a broker answers "
            "before it has registered with its controller and takes produces once Metadata lists it (\"listed\"). "
            f"Memory {STARTUP_IDLE_S:.0f} s after the first answer, then the CPU over {STARTUP_IDLE_S:.0f} s idle. "
            f"Kafka runs with a {KAFKA_HEAP_MB} MB heap (its default): the JVM's RSS is mostly the heap it touched.",
            "first_answer_s"),
    Section("producer", "1. Producer throughput, 100-byte records",
            (SYSTEM, CASE, Column("records_per_s", "records/s", RATE), Column("mb_per_s", "MB/s", "{:,.1f}"),
             Column("p99_ms", "request p99 ms", MS), CPU_PER_OP, EACH_RUN),
            (Column("records_per_s", "records/s", MS), CPU_PER_OP),
            "The same clients against the node and Kafka. Kafka's defaults for acks=1 (page cache, no fsync); "
            "acks=all beside Kafka's default (kafka: page cache, an acknowledged append not yet on disk) and "
            "beside log.flush.interval.messages=1 (kafka-fsync: an fsync per append, the node's acks=all promise); "
            "Redis without persistence beside acks=1 and with appendfsync always beside acks=all, by number of "
            "producers (redis-benchmark clients). Raw producers send 8 KiB batches with 8 requests in flight per "
            "connection; confluent-kafka produces flat out (its p99 is mostly time queued in librdkafka); "
            "kafka-producer-perf-test is Kafka's own tool (the Java producer, linger.ms=5, --records records).",
            "records_per_s"),
    Section("consumer", "2. Consumer throughput from the start of a filled topic",
            (SYSTEM, CASE, Column("records", "records", "{:,}"), Column("records_per_s", "records/s", RATE),
             Column("mb_per_s", "MB/s", "{:,.1f}"), Column("join_s", "group join s", "{:.1f}"), CPU_PER_OP, EACH_RUN),
            (Column("records_per_s", "records/s", MS), CPU_PER_OP),
            "Group consumers: confluent-kafka Consumers with one group.id, subscribed to a topic of 6 partitions, "
            "one process each. Their Redis peer is one consumer group read by XREADGROUP (COUNT 1000), one process "
            "per reader, each batch acknowledged with XACK in the same round trip: on both sides every record goes "
            "to one member and its delivery is recorded. Assigned consumers (no group) beside one XREAD reader. "
            "kafka-consumer-perf-test: Kafka's tool (the Java consumer in a group; its fetch rate, the join apart). "
            "Rates run from the first record received to the last, the group's join apart. The assigned consumers' "
            "CPU is the raw and confluent runs' together.",
            "records_per_s"),
    Section("together", "3. Producer and consumer together",
            (SYSTEM, CASE, Column("producer_records_per_s", "producer records/s", RATE),
             Column("consumer_records_per_s", "consumer records/s", RATE),
             Column("behind_at_end", "consumer behind when the producer stopped", "{:,}"), CPU_PER_OP, EACH_RUN),
            (Column("producer_records_per_s", "producer", MS), Column("consumer_records_per_s", "consumer", MS)),
            "The consumer is subscribed (a group member, on a new 6-partition topic) or blocked in XREAD before the "
            "producer starts; the consumer's rate runs from its first record to its last. CPU per record produced "
            "and consumed.", "producer_records_per_s"),
    Section("size_sweep", "4. Record size sweep (producer)",
            (SYSTEM, Column("case", "record size"), Column("records_per_s", "records/s", RATE),
             Column("mb_per_s", "MB/s", "{:,.1f}"), CPU_PER_OP, EACH_RUN),
            (Column("records_per_s", "records/s", MS),),
            "The raw producer (acks=1, 128 KB batches as the reference run's batch.size=128000) against the node "
            "and Kafka, beside redis-benchmark XADD -P 16 without persistence.", "records_per_s"),
    Section("growth", "5. Producer throughput while the stored data grows",
            (SYSTEM, Column("case", "step"), Column("stored_gb", "stored GB", "{:.2f}"),
             Column("records_per_s", "records/s", RATE), Column("mb_per_s", "MB/s", "{:,.1f}"),
             Column("seconds", "s", "{:.1f}"), Column("vs_first", "vs first step", MS),
             Column("first_step_records_per_s", "a first step beside it, records/s", RATE),
             Column("vs_first_now", "vs the first step beside it", MS), CPU_PER_OP),
            (Column("records_per_s", "records/s", MS),),
            "The node and Kafka (Redis keeps its data in memory), once each, in the first run. A fresh server, the "
            "raw producer (100-byte records in 8 KiB batches, acks=1, 4 partitions) after 1 s of warm-up, equal "
            "steps of the fill; stored: the disk blocks of the data dir. Beside each step a second fresh server of "
            f"the same kind writes a first step again (from empty, then deleted), the two in turn {GROW_CHUNKS} "
            "chunks each, so that the step and its peer share the machine's state of that minute: \"vs first "
            "step\" also holds how the machine changed since the first step, \"vs the first step beside it\" only "
            "the stored data's effect (the target's ratio)."),
    Section("e2e", "6. End-to-end latency, long-polling consumer",
            (SYSTEM, CASE, Column("p50_ms", "p50 ms", MS), Column("p99_ms", "p99 ms", MS),
             Column("p999_ms", "p99.9 ms", MS), Column("samples", "samples", "{:,}"),
             Column("vs_redis_paired", "node / Redis p99, paired", MS),
             Column("vs_kafka_paired", "node / Kafka p99, paired", MS),
             Column("vs_redis_one_worker", "node / Redis, one worker", MS),
             Column("vs_redis_two_workers", "node / Redis, two workers", MS), CPU_PER_OP, EACH_RUN),
            (Column("p50_ms", "p50", MS, False), Column("p99_ms", "p99", MS, False)),
            "Paced records (100 B, 1000/s) from a producer to a consumer long-polling one partition; latency from "
            "the send to the record in the consumer's hands. A fresh node, Kafka and Redis run side by side; each "
            "round runs the node's and Kafka's two clients and Redis one after the other, so a round's runs share "
            f"the machine's state of that minute. First the machine settles (at most {E2E_SETTLE_MAX_S:.0f} s, "
            f"until a second with the CPUs at most {E2E_SETTLE_BUSY_PERCENT:.0f}% busy) and a "
            f"{E2E_WARMUP_ROUND_S:.0f}-second round of each case is run and dropped. \"paired\": the median of the "
            "rounds' own p99 ratios (the target judges confluent-kafka's row by it). The raw protocol client "
            "(scripts/harness/rawkafka.py) is a thin blocking client, as redis-py is. The kernel spreads "
            "connections over the node's workers, so in each round the producer and the consumer share a worker or "
            "not, by chance (read from the node's stats segment); across two, each append wakes the consumer's "
            "worker through its doorbell until its connection moves (server.connection_affinity_waits). Kafka's "
            f"EndToEndLatency tool sends {E2E_TOOL_RECORDS:,} records one at a time (acks=1), each once the last "
            "arrived, its consumer polling; its percentiles are whole milliseconds.", "p99_ms"),
    Section("saturation", "7. Purgatory saturation (delayed fetches)",
            (SYSTEM, Column("offered_per_s", "offered/s", RATE), Column("sent_per_s", "sent/s", RATE),
             Column("completed_per_s", "completed/s", RATE), Column("p50_ms", "lateness p50 ms", MS),
             Column("p99_ms", "lateness p99 ms", MS), Column("timer_lateness_p99_us", "timer p99 us", RATE),
             Column("server_cores", "server cores", MS), CPU_PER_OP, Column("client_cores", "client cores", MS),
             EACH_RUN),
            (Column("completed_per_s", "completed/s", MS), Column("p99_ms", "lateness p99", MS, False), CPU_PER_OP),
            f"Long-poll fetches (max_wait {SATURATION_EXPIRE_MS} ms, where nothing arrives) offered on a fixed "
            "schedule, one in flight per connection; sent < offered when every connection still waits; completed = "
            "answers due in the step's window. Lateness: past max_wait as the client sees it; the node's timer's "
            "own from its stats segment (worst p99 over its 0.5 s intervals). Server cores: the server's CPU "
            "seconds per second over the step; CPU per answer. Redis has no expiring long poll to offer.",
            "completed_per_s"),
    Section("waiters", "8. Long-poll waiters while one producer runs",
            (SYSTEM, CASE, Column("rss_mb_before", "RSS MB before", RATE), Column("rss_mb", "RSS MB waiting", RATE),
             Column("pss_mb", "PSS MB waiting", RATE), Column("kb_per_waiter", "KB per waiter (PSS)", "{:.1f}"),
             Column("fanout_ms_median", "fan-out ms (median)", "{:.1f}"),
             Column("waiter_p99_ms", "waiter p99 ms", "{:.1f}"),
             Column("produce_p99_ms_alone", "produce p99 ms, no waiters", MS),
             Column("produce_p99_ms_waiting", "produce p99 ms, waiting", MS), CPU_PER_OP, EACH_RUN),
            (Column("fanout_ms_median", "fan-out", MS, False), Column("kb_per_waiter", "KB per waiter", MS, False)),
            "Memory before the waiters connect and while they wait (the most over the rounds), summed over each "
            "server's processes (RSS counts shared memory once per process that maps it; PSS splits it); each holds "
            "the data of the earlier sections. Fan-out: from sending the append (one record to each of 4 "
            "partitions; one XADD) until the last waiter holds its answer. The producer sends "
            f"{WAITING_PRODUCE_RATE:.0f} single-record requests/s (raw Produce acks=1; XADD) to another topic. "
            "CPU per waiter answered, the waits included.", "fanout_ms_median"),
    Section("groups", "9. Consumer groups: heartbeats",
            (SYSTEM, CASE, Column("heartbeats_per_s", "heartbeats/s", RATE), Column("p50_ms", "p50 ms", MS),
             Column("p99_ms", "p99 ms", MS), Column("p999_ms", "p99.9 ms", MS),
             Column("members_with_errors", "members answered an error"), CPU_PER_OP, EACH_RUN),
            (Column("p99_ms", "p99", MS, False), CPU_PER_OP),
            "Raw-protocol members, a connection each (as real consumers), in groups of 10: the classic protocol "
            "(JoinGroup, SyncGroup, then Heartbeat) and KIP-848's (ConsumerGroupHeartbeat, settled before the "
            f"clock), each member at its own phase for {GROUP_HEARTBEAT_PERIODS} intervals. Redis has no group "
            "membership to heartbeat.", "p99_ms"),
    Section("transactions", "10. Transactions",
            (SYSTEM, CASE, Column("records_per_s", "records/s", RATE), Column("commits", "commits", "{:,}"),
             Column("end_txn_p50_ms", "EndTxn p50 ms", MS), Column("end_txn_p99_ms", "EndTxn p99 ms", MS),
             CPU_PER_OP, EACH_RUN),
            (Column("records_per_s", "records/s", MS), Column("end_txn_p99_ms", "EndTxn p99", MS, False)),
            "bench_transactions' produce workload: confluent-kafka flat out for --seconds to a 4-partition topic, "
            f"transactional (a commit every {TXN_COMMIT_INTERVAL_MS} ms: flush(), then commit_transaction() timed "
            "alone, the EndTxn round trip) and idempotent, both acks=all. Against Kafka with its defaults and with "
            "an fsync per append. Redis has no transactions of this kind (MULTI/EXEC is not a producer's).",
            "records_per_s"),
    Section("compaction", "11. Log compaction",
            (SYSTEM, CASE, Column("log_mb", "log MB", "{:,.1f}"), Column("clean_seconds", "cleaning s", "{:.2f}"),
             Column("clean_mb_per_s", "log MB/s", "{:,.1f}"), Column("passes", "passes"),
             Column("cleaner_mb_read", "MB the cleaner says it read", "{:,.1f}"),
             Column("server_cpu_s", "server CPU s, writing", MS), EACH_RUN),
            (Column("clean_mb_per_s", "MB/s", MS),),
            "The same dirty log written to a fresh node and a fresh Kafka through the raw producer (keyed 100-byte "
            f"values in batches of {COMPACT_BATCH_RECORDS:,}, keys cycling so that each has {COMPACT_VERSIONS} "
            f"values, at least {COMPACT_MIN_SEGMENTS} segments of at most "
            f"{COMPACT_SEGMENT_BYTES >> 20} MB), then cleaned by each one's own cleaner with the same settings: one "
            "cleaner, a 128 MB offset map, no I/O limit, a look for dirty logs every second. Log MB/s: the log "
            "written (its batches' bytes, MB of 2^20, the same for both) per second of cleaning, the seconds each "
            "cleaner logs for its passes on the topic summed. What each says it read differs by definition: the "
            "node counts both of its reads (building the offset map, then copying), Kafka only the copy. The "
            "node's cleaner runs at nice 10.", "clean_mb_per_s"),
)


def _figure(value: object) -> str:
    """A figure of one run, as its row shows it: whole above 100, three significant digits below."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "" if value is None else str(value)
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _format(value: object, fmt: str) -> str:
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return fmt.format(value)
    return str(value)


PEERS = ((servers.KAFKA, "Kafka"), (servers.KAFKA_FSYNC, "Kafka fsync"), (servers.REDIS, "Redis"))


def peers_of(rows: list[dict], row: dict) -> dict[str, dict]:
    """The rows a node row is compared with, by system: Kafka's of the same case (each durability measured),
    Redis's of the case the row names as its peer (or of the same case)."""
    found = {}
    for other in rows:
        if other["section"] != row["section"] or other is row:
            continue
        if other["system"] in (servers.KAFKA, servers.KAFKA_FSYNC) and other.get("case") == row.get("case"):
            found[other["system"]] = other
        elif other["system"] == servers.REDIS and other.get("case") == row.get("peer", row.get("case")):
            found[servers.REDIS] = other
    return found


def ratio(value: Any, base: Any) -> float | None:
    return value / base if isinstance(value, (int, float)) and isinstance(base, (int, float)) and base else None


def peers_ahead(section: Section, row: dict, peers: dict[str, dict]) -> list[str]:
    """Where a peer beats the node in this row: "Kafka: records/s 0.62" for each ratio on the peer's side."""
    ahead = []
    for system, label in PEERS:
        if system not in peers:
            continue
        behind = [f"{column.header} {r:.2f}" for column in section.ratios
                  if (r := ratio(row.get(column.key), peers[system].get(column.key))) is not None
                  and (r < 1 if column.higher_is_better else r > 1)]
        if behind:
            ahead.append(f"{label}: {', '.join(behind)}")
    return ahead


def ordered(chosen: list[dict]) -> list[dict]:
    """Each node row followed by its peers' rows, then the rows no node row names."""
    out: list[dict] = []
    for row in chosen:
        if row["system"] == servers.NODE:
            out.append(row)
            out += [peer for peer in peers_of(chosen, row).values() if not any(peer is seen for seen in out)]
    return out + [row for row in chosen if not any(row is seen for seen in out)]


def section_table(rows: list[dict], section: Section) -> list[str]:
    chosen = ordered([r for r in rows if r["section"] == section.name])
    if not chosen:
        return []
    columns = [c for c in section.columns if any(r.get(c.key) is not None for r in chosen)]
    measured = {r["system"] for r in chosen}
    ratio_columns = [(column, system, label) for column in section.ratios for system, label in PEERS
                     if system in measured]
    headers = ([c.header for c in columns] + [f"node / {label}: {c.header}" for c, _, label in ratio_columns]
               + ["a peer ahead"])
    lines = [f"## {section.title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in chosen:
        peers = peers_of(chosen, row) if row["system"] == servers.NODE else {}
        cells = [_format(row.get(c.key), c.fmt) for c in columns]
        cells += [_format(ratio(row.get(c.key), peers[system].get(c.key)) if system in peers else None, MS)
                  for c, system, _ in ratio_columns]
        cells.append("; ".join(peers_ahead(section, row, peers)))
        lines.append("| " + " | ".join(cells) + " |")
    if section.text:
        lines += ["", section.text]
    return lines + [""]


def where_kafka_is_ahead(rows: list[dict]) -> list[str]:
    """Every node row where Kafka (either durability) beats the node on a compared figure, as Markdown."""
    lines = []
    for section in SECTIONS:
        chosen = [r for r in rows if r["section"] == section.name]
        for row in chosen:
            if row["system"] != servers.NODE:
                continue
            peers = {system: peer for system, peer in peers_of(chosen, row).items() if system != servers.REDIS}
            for found in peers_ahead(section, row, peers):
                where = row.get("case") or ""
                lines.append(f"- {section.title}, {where}: {found}")
    return ["## Where Kafka is ahead", "", *(lines or ["Nowhere in this run."]), ""]


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
    e2e = {r["system"]: r for r in rows if r["section"] == "e2e" and r["system"] in (servers.NODE, servers.REDIS)
           and r["case"] in (E2E_CONFLUENT_CASE, E2E_REDIS_CASE)}
    if len(e2e) == 2:
        add("end-to-end p99 <= 2x Redis XREAD BLOCK p99 (median of per-round ratios)", e2e["shmbroker"]["p99_ms"],
            e2e["redis"]["p99_ms"], None, 2.0, "ms", e2e["shmbroker"].get("vs_redis_paired"))
    growth = [r for r in rows if r["section"] == "growth" and r["system"] == servers.NODE]
    if growth:
        add(f"throughput at {growth[-1]['stored_gb']:.1f} GB stored within 10% of a first step "
            f"({growth[-1]['first_step_gb']:.2f} GB) written beside it", growth[-1]["records_per_s"],
            growth[-1]["first_step_records_per_s"], 0.9, 1.1, "records/s")
    waiting = {r["system"]: r for r in rows if r["section"] == "waiters"}
    if "shmbroker" in waiting:
        add(f"{run.plan.waiters:,} waiting consumers: whole-node RSS < 1 GB", waiting["shmbroker"]["rss_mb"], 1000.0,
            None, 1.0, "MB")
    if "shmbroker" in waiting and "redis" in waiting:
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
    fill = (f" Section 5's fills took {sum(r['seconds'] for r in growth):.0f} s of it "
            f"({max(r['stored_gb'] for r in growth):.1f} GB stored)." if growth else "")
    lines = [f"# shmbroker load-test report ({'quick' if plan.quick else 'full'} run)", "",
             f"Same machine ({os.cpu_count()} CPUs, shared), same run: the node (started here, {plan.workers} "
             f"worker{'s' if plan.workers != 1 else ''}), Apache Kafka {kafka_peer.KAFKA_VERSION} (KRaft, broker "
             f"and controller in one JVM, {KAFKA_HEAP_MB} MB heap, started here: \"kafka\" with its defaults, "
             "\"kafka-fsync\" with log.flush.interval.messages=1) "
             f"and Redis Streams ({redis_version()}, started here). {plan.runs} run(s) of every section but the "
             "fill, the servers taking turns to go first; every figure is the median over the runs, \"each run\" "
             f"lists the section's main one. Run time {elapsed_s:.0f} s.{fill} Load average "
             f"{run.load_at_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end (other work on the machine "
             "moves single figures). Ratios are node / peer of the medians; server CPU is psutil's user + system "
             "time over each server's process tree during the measurement, per operation.", ""]
    for note in plan.notes:
        lines += [f"**{note}**", ""]
    lines += targets_table(found)
    lines += where_kafka_is_ahead(run.rows)
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

COLORS = {servers.NODE: "tab:blue", servers.KAFKA: "tab:green", servers.KAFKA_FSYNC: "tab:olive",
          servers.REDIS: "tab:red"}
BAR_PLOTS = {"startup": ("first_answer_s", "seconds to the first answer"), "producer": ("records_per_s", "records/s"),
             "consumer": ("records_per_s", "records/s"), "together": ("producer_records_per_s", "producer records/s"),
             "e2e": ("p99_ms", "p99 ms"), "waiters": ("fanout_ms_median", "fan-out ms (median)"),
             "groups": ("p99_ms", "heartbeat p99 ms"), "transactions": ("records_per_s", "records/s"),
             "compaction": ("clean_mb_per_s", "MB/s cleaned")}


def color_of(name: str) -> str:
    return next((COLORS[system] for system in sorted(COLORS, key=len, reverse=True) if name.startswith(system)),
                "tab:gray")


def cdf(axis: Any, samples: list[int], label: str, color: str | None = None, style: str = "-") -> None:
    ordered_ms = np.sort(np.asarray(samples, dtype=np.float64)) / 1e6
    axis.plot(ordered_ms, np.arange(1, len(ordered_ms) + 1) / len(ordered_ms), style, label=label, color=color)


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

    for section in SECTIONS:
        if section.name in BAR_PLOTS:
            fig = section_bars(plt, section, rows, *BAR_PLOTS[section.name])
            if fig is not None:
                save(fig, f"{section.name}.png")
    sweep = [r for r in rows if r["section"] == "size_sweep"]
    if sweep:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        for system, style in ((servers.NODE, "o-"), (servers.KAFKA, "^-"), (servers.REDIS, "s--")):
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
                if values:  # a broker's second curve (the raw client) dashed, in its colour
                    cdf(axis, values, name, color_of(name), "--" if "raw client" in name else "-")
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
    saturation_rows = [r for r in rows if r["section"] == "saturation"]
    if saturation_rows:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        top = max(r["offered_per_s"] for r in saturation_rows) * 1.05
        left.plot([0, top], [0, top], ":", color="gray", label="completed = offered")
        for system in (servers.NODE, servers.KAFKA):
            mine = sorted((r for r in saturation_rows if r["system"] == system), key=lambda r: r["offered_per_s"])
            if not mine:
                continue
            offered = [r["offered_per_s"] for r in mine]
            left.plot(offered, [r["completed_per_s"] for r in mine], "o-", color=COLORS[system],
                      label=f"{system}: completed")
            for key, label, style in (("p50_ms", "lateness p50", "o-"), ("p99_ms", "lateness p99", "o--")):
                points = [(r["offered_per_s"], r[key]) for r in mine if r.get(key)]
                if points:
                    right.plot([p[0] for p in points], [p[1] for p in points], style, color=COLORS[system],
                               label=f"{system}: {label}")
        left.set_xlabel("delayed fetches offered per second")
        left.set_ylabel("per second")
        left.set_title("Offered vs completed")
        right.set_yscale("log")
        right.set_xlabel("delayed fetches offered per second")
        right.set_ylabel("ms past max_wait (log)")
        right.set_title(f"Lateness past max_wait ({SATURATION_EXPIRE_MS} ms), as clients see it")
        for axis in (left, right):
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize=8)
        fig.suptitle("Purgatory saturation: the node beside Kafka")
        save(fig, "saturation.png")
    growth_rows = [r for r in rows if r["section"] == "growth"]
    if growth_rows:
        fig, axis = plt.subplots(figsize=(8, 4.2))
        for system in (servers.NODE, servers.KAFKA):
            mine = [r for r in growth_rows if r["system"] == system]
            if mine:
                axis.plot([r["stored_gb"] for r in mine], [r["vs_first_now"] for r in mine], "o-",
                          color=COLORS[system], label=f"{system}: each step / a first step beside it")
        axis.axhspan(0.9, 1.1, color="tab:green", alpha=0.12, label="within 10%")
        axis.set_ylim(0, 1.5)
        axis.set_xlim(left=0)
        axis.set_xlabel("data stored at the end of the step (GB)")
        axis.set_ylabel("records/s, step / first step beside it")
        axis.grid(True, alpha=0.3)
        axis.legend(loc="lower right", fontsize=8)
        axis.set_title("Producer throughput against stored data")
        save(fig, "throughput_vs_stored.png")
    return made


def section_bars(plt: Any, section: Section, rows: list[dict], key: str, label: str) -> Any:
    """One figure: a group of bars per node row of the section (its case), one bar per server that measured it
    (the node, Kafka, Kafka with fsync, Redis), values labelled; a log scale where they span a decade."""
    chosen = [r for r in rows if r["section"] == section.name]
    groups = []
    for row in chosen:
        if row["system"] == servers.NODE and row.get(key) is not None:
            peers = peers_of(chosen, row)
            groups.append((row.get("case") or "", {servers.NODE: row.get(key),
                                                   **{system: peer.get(key) for system, peer in peers.items()}}))
    if not groups:
        return None
    systems = [system for system in COLORS if any(values.get(system) is not None for _, values in groups)]
    height = 0.8 / len(systems)
    fig, axis = plt.subplots(figsize=(10, 1.0 + 0.32 * len(groups) * len(systems)))
    for index, system in enumerate(systems):
        ys = [number + index * height for number in range(len(groups))]
        values = [values.get(system) for _, values in groups]
        bars = axis.barh([y for y, v in zip(ys, values) if v is not None], [v for v in values if v is not None],
                         height=height, color=COLORS[system], label=system)
        axis.bar_label(bars, labels=[f" {_figure(v)}" for v in values if v is not None], fontsize=7)
    axis.set_yticks([number + 0.4 - height / 2 for number in range(len(groups))], [case for case, _ in groups],
                    fontsize=8)
    axis.invert_yaxis()
    every = [v for _, values in groups for v in values.values() if isinstance(v, (int, float)) and v > 0]
    if every and max(every) / min(every) > 10:
        axis.set_xscale("log")
        axis.set_xlim(min(every) / 2, max(every) * 4)
    else:
        axis.set_xlim(0, max(every or [1]) * 1.25)
    axis.grid(True, which="both", axis="x", alpha=0.3)
    axis.set_xlabel(label)
    axis.legend(fontsize=8, loc="lower right")
    axis.set_title(section.title)
    return fig


# -- main ---------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def open_server(plan: Plan, system: str, max_clients: int = 10_000, compacting: bool = False,
                settings: dict[str, str] | None = None) -> Iterator[servers.Server]:
    """A fresh server of `system`, stopped by its pid afterwards: the node (--workers), Kafka with its defaults
    or with an fsync per append (kafka_peer's durabilities), Redis without persistence or with appendfsync
    always. `compacting`: the cleaners of the node and Kafka look for dirty logs every second, with no I/O
    limit (the compaction section's like for like)."""
    if system == servers.NODE:
        config = f"[groups]\ninitial_rebalance_delay_ms = {plan.group_join_delay_ms}\n" \
            + (COMPACTING_NODE_CONFIG if compacting else "")
        with NodeProcess(workers=plan.workers, config=config, announce=True) as node:
            yield servers.of_node(node)
    elif system in (servers.KAFKA, servers.KAFKA_FSYNC):
        extra = {**KAFKA_REPORT_SETTINGS, "group.initial.rebalance.delay.ms": str(plan.group_join_delay_ms),
                 **(COMPACTING_KAFKA_SETTINGS if compacting else {}), **(settings or {})}
        with kafka_peer.KafkaPeer("fsync" if system == servers.KAFKA_FSYNC else "page-cache",
                                  heap_mb=KAFKA_HEAP_MB, settings=extra) as peer:
            yield servers.of_kafka(peer)
    else:
        with redis_peer.redis_server(system == REDIS_ALWAYS, max_clients=max_clients) as server:
            yield servers.of_redis(server)


@contextlib.contextmanager
def all_up(plan: Plan) -> Iterator[tuple[list[servers.Server], servers.Server]]:
    """A fresh node, Kafka and Redis (no persistence) up together, for the section that alternates between them."""
    with open_server(plan, servers.NODE) as node, open_server(plan, servers.KAFKA) as kafka, \
            open_server(plan, servers.REDIS) as redis:
        yield [node, kafka], redis


@contextlib.contextmanager
def two_of(plan: Plan, system: str) -> Iterator[tuple[servers.Server, servers.Server]]:
    """Two fresh servers of `system`: section 5's growing one and the one that writes a first step beside each
    of its steps."""
    with open_server(plan, system) as growing, open_server(plan, system) as reference:
        yield growing, reference


Step = tuple[str, Callable[[Any], None]]


def kafka_protocol_steps(run: Run, system: str) -> list[Step]:
    """Every step a server speaking Kafka's protocol runs, the same clients for each. Kafka with an fsync per
    append runs the rows it is the peer of: acks=all and transactions."""
    plan = run.plan
    acks_modes = ("all",) if system == servers.KAFKA_FSYNC else ("1", "all")
    steps: list[Step] = [(f"{system} producer {client} x{count} acks={acks}",
                          lambda server, c=client, n=count, a=acks: producers(run, server, c, n, a))
                         for client, count in (("raw", 1), ("raw", 3), ("confluent", 1)) for acks in acks_modes]
    steps += [(f"{system} kafka-producer-perf-test acks={acks}",
               lambda server, a=acks: perf_test_producer(run, server, a)) for acks in acks_modes]
    if system != servers.KAFKA_FSYNC:
        steps += [(f"{system} consumers (raw, assigned)", lambda server: assigned_consumers(run, server)),
                  (f"{system} kafka-consumer-perf-test", lambda server: perf_test_consumer(run, server)),
                  (f"{system} group consumers x1, x3", lambda server: group_consumers(run, server)),
                  (f"{system} producer and consumer together", lambda server: together(run, server))]
        steps += [(f"{system} size {size}", lambda server, n=size: size_sweep(run, server, n)) for size in SIZES]
        steps += [(f"{system} purgatory saturation", lambda server: saturation(run, server)),
                  (f"{system} {plan.waiters:,} waiters", lambda server: waiters(run, server))]
        steps += [(f"{system} {plan.group_members:,} {protocol} group members heartbeating",
                   lambda server, p=protocol: group_heartbeats(run, server, p)) for protocol in ("classic", "consumer")]
    steps.append((f"{system} transactional and idempotent producers", lambda server: transactions(run, server)))
    return steps


def redis_steps(run: Run) -> list[Step]:
    plan = run.plan
    steps: list[Step] = [(f"redis XADD x{clients} no persistence",
                          lambda server, c=clients: redis_producers(run, server.handle, c, False))
                         for clients in (1, 3)]
    steps += [("redis consumers (XREAD, XREADGROUP x1, x3)", lambda server: redis_consumers(run, server.handle)),
              ("redis producer and consumer together", lambda server: redis_together(run, server.handle))]
    steps += [(f"redis size {size}", lambda server, n=size: redis_size(run, server.handle, n)) for size in SIZES]
    steps += [(f"redis {plan.waiters:,} XREAD BLOCK waiters", lambda server: redis_waiters(run, server.handle))]
    return steps


def stages(run: Run, budget: int, index: int) -> list[tuple[Callable[[], Any], list[Step]]]:
    """What run `index` runs, in order: (open the system under test, [(step label, step(system))]). The servers
    take turns going first: run i starts with the (i mod 3)-th of node, Kafka and Redis. Section 5 (the fill)
    runs in the first run only: it pairs its own steps."""
    plan = run.plan
    per_server = [
        [(lambda: open_server(plan, servers.NODE), kafka_protocol_steps(run, servers.NODE))],
        [(lambda: open_server(plan, servers.KAFKA), kafka_protocol_steps(run, servers.KAFKA)),
         (lambda: open_server(plan, servers.KAFKA_FSYNC), kafka_protocol_steps(run, servers.KAFKA_FSYNC))],
        [(lambda: open_server(plan, servers.REDIS, max_clients=plan.waiters + FDS_SPARE), redis_steps(run)),
         (lambda: open_server(plan, REDIS_ALWAYS), [
             (f"redis XADD x{clients} appendfsync always",
              lambda server, c=clients: redis_producers(run, server.handle, c, True)) for clients in (1, 3)])]]
    turn = index % len(per_server)
    order = per_server[turn:] + per_server[:turn]
    found = [stage for group in order for stage in group]
    systems = [servers.NODE, servers.KAFKA, servers.REDIS]
    found.append((contextlib.nullcontext, [(f"start-up of {system}", lambda _none, name=system: startup(run, name))
                                           for system in systems[turn:] + systems[:turn]]))
    found.append((lambda: all_up(plan), [(f"end-to-end latency, {plan.e2e_runs} rounds of node, Kafka and Redis",
                                          lambda up: e2e_rounds(run, *up))]))
    found.append((contextlib.nullcontext, [(f"compaction of {system}", lambda _none, name=system: compaction(run, name))
                                           for system in (systems[:2] if turn != 1 else systems[1::-1])]))
    if budget and index == 0:
        for system in (servers.NODE, servers.KAFKA):
            found.append((lambda name=system: two_of(plan, name),
                          [(f"{system} throughput while {budget / GB:.2f} GB of records are written",
                            lambda both: growth(run, *both, budget))]))
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
    parser.add_argument("--e2e-runs", type=int, help="section 6: rounds of each case per run, medians reported (1 with "
                                                     "--quick, else 2)")
    parser.add_argument("--runs", type=int, help="runs of every section but the fill, the servers taking turns to "
                                                 "go first; the report gives medians (default 3)")
    parser.add_argument("--group-members", type=int, default=GROUP_MEMBERS, help="consumer groups: members "
                                                                                  "heartbeating (default %(default)s)")
    parser.add_argument("--compact-mb", type=int, help="compaction: MB of values in the dirty log (256 with --quick, "
                                                       "else 1024)")
    parser.add_argument("--e2e-settle-s", type=float, default=E2E_SETTLE_MAX_S,
                        help="section 6: the longest wait for an idle machine (default %(default)s)")
    parser.add_argument("--e2e-tool-records", type=int, default=E2E_TOOL_RECORDS,
                        help="section 6: records Kafka's EndToEndLatency sends (default %(default)s)")
    parser.add_argument("--group-periods", type=int, default=GROUP_HEARTBEAT_PERIODS,
                        help="consumer groups: heartbeat intervals measured, of 1 s (classic) and 5 s (KIP-848) "
                             "(default %(default)s)")
    parser.add_argument("--e2e-seconds", type=float,
                        help="section 6: seconds of each case per round (default: twice --seconds)")
    parser.add_argument("--e2e-warmup-s", type=float, default=E2E_WARMUP_ROUND_S,
                        help="section 6: seconds of each case in the warm-up round, dropped (default %(default)s)")
    parser.add_argument("--group-join-delay-ms", type=int, default=GROUP_JOIN_DELAY_MS,
                        help="the node's and Kafka's initial rebalance delay, which every new group's first join "
                             "waits (default %(default)s, Kafka's)")
    parser.add_argument("--json", action="store_true", help="the JSON lines on stdout instead of the Markdown")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL

    def pick(name: str) -> Any:
        value = getattr(args, name, None)
        return base[name] if value is None else value

    plan = Plan(args.quick, args.workers, pick("seconds"), pick("records"), args.waiters, pick("fanout_rounds"),
                pick("grow_mb"), pick("grow_steps"), sorted(pick("rates")), pick("rate_seconds"),
                min(base["waiting_seconds"], pick("seconds")), pick("e2e_runs"), pick("compact_mb"),
                args.group_members, pick("runs"), args.e2e_settle_s, args.e2e_tool_records, args.group_periods,
                args.e2e_seconds, args.e2e_warmup_s, args.group_join_delay_ms)
    if plan.seconds <= 0 or plan.records < 1000 or plan.workers < 1 or plan.waiters < 1 or plan.fanout_rounds < 1 \
            or plan.grow_mb < 0 or plan.grow_steps < 1 or min(plan.rates) <= 0 or plan.rate_seconds <= 0 \
            or plan.e2e_runs < 1 or plan.compact_mb < 1 or plan.group_members < 10 or plan.runs < 1 \
            or plan.e2e_settle_s < 0 or plan.e2e_tool_records < 1 or plan.group_periods < 1 \
            or (plan.e2e_seconds is not None and plan.e2e_seconds <= 0) or plan.e2e_warmup_s <= 0 \
            or plan.group_join_delay_ms < 0:
        parser.error("sizes, counts and durations must be positive, --records at least 1000")
    if plan.group_periods != GROUP_HEARTBEAT_PERIODS:
        plan.notes.append(f"Section 9 measured {plan.group_periods} heartbeat intervals of each member, not "
                          f"{GROUP_HEARTBEAT_PERIODS} (--group-periods).")
    if plan.e2e_warmup_s != E2E_WARMUP_ROUND_S:
        plan.notes.append(f"Section 6's warm-up round ran {plan.e2e_warmup_s:g} s of each case, not "
                          f"{E2E_WARMUP_ROUND_S:g} (--e2e-warmup-s).")
    if kafka_peer.jvm_options() != kafka_peer.JVM_OPTIONS:
        quick = kafka_peer.jvm_options()[len(kafka_peer.JVM_OPTIONS):]
        plan.notes.append(f"Kafka's JVMs ran with {' '.join(quick)} "
                          f"({sparkjob.QUICK_JVMS_ENV}=1, the tests' setting): its figures are not Kafka's.")
    if plan.group_join_delay_ms != GROUP_JOIN_DELAY_MS:
        plan.notes.append(f"The node's and Kafka's initial rebalance delay was {plan.group_join_delay_ms} ms, not "
                          f"{GROUP_JOIN_DELAY_MS} (--group-join-delay-ms).")
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))  # stop the servers cleanly
    raise_fd_limit(plan)
    budget = grow_budget(plan) if plan.grow_mb else 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = Run(out, plan)
    started = time.monotonic()
    kafka_peer.jars()  # fetched once, before any clock
    plans = [stages(run, budget, index) for index in range(plan.runs)]
    progress = Progress(total=sum(len(steps) for one in plans for _, steps in one))
    try:
        for index, plan_of_run in enumerate(plans):
            run.index = index
            for open_system, steps in plan_of_run:
                with open_system() as system:
                    for label, step in steps:
                        step(system)
                        progress.step(f"run {index + 1}/{plan.runs}: {label}")
        run.merge()
        run.index = "median"
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
