"""Transactions: what they cost a producer, a consume-transform-produce pipeline and a read_committed consumer.

One node (started here: --workers, stats published every STATS_PUBLISH_MS), three workloads, each measured in
alternating rounds against its baseline (ABBA, scripts/harness/abba.py): a mode's figure is its median over the
rounds, a ratio the median of the rounds' own ratios. All clients are confluent-kafka, in this process.
- produce: a transactional producer (--record-size byte records, a commit every --commit-interval-ms) against the
  idempotent producer at the same load: each produces flat out for --seconds to the same --partitions topic with
  the same client settings but the transactional ones (acks=all both, as transactions require: the node answers the
  idempotent records once fsync'd, the transaction's once appended and fsyncs them at its commit; the same batching;
  the same local queue of --queue-records, queue.buffering.max.messages). The transactional one commits on a
  fixed schedule, one commit every interval from the start: it produces until the commit is due, then flush()
  (the records still queued: reported as flush_*) and commit_transaction(). Why the bounded queue: a commit first
  drains librdkafka's queue, and with its default of 100,000 records that takes most of a second, so "a commit
  every 100 ms" would really be one every second or so, transactions ten times the size the target names; 5,000
  records drain in about 20 ms at 200,000 records/s and cost the idempotent producer nothing measurable. A commit
  that ends after the next one was due restarts the schedule (counted: late_commits; commit_period_ms is the
  measured span per commit). Records are keyless unless --keys: librdkafka's sticky partitioner then fills one
  partition at a time, and a transaction adds each partition when it first gets a record, with an
  AddPartitionsToTxn the producer must see answered (the first of a transaction fsync'd, the others appended)
  before it sends there; keyed records reach every partition at once, added by one request. Reported: acknowledged (for the transactional
  one, committed) records/s of each and transactional / idempotent (target >= 0.9); the commit latency,
  commit_transaction() timed after the flush() so that it is the EndTxn round trip (the records and the decision made durable,
  the markers written), p50/p99 over the commits of every round (target p50 <= 2 ms, p99 <= 10 ms), beside the
  disk's own fdatasync p50 of the same run. Where the time goes: the producing thread's share of each phase
  (produce, flush, commit, begin) and the node's CPU per acknowledged record (timer and workers), medians per
  mode.
- transform: consume-transform-produce of --records input records (one consumer and one producer in one thread,
  the consumer assigned every input partition from offset 0 in a new group): exactly-once (a read_committed
  consumer, a transaction per --txn-records records with send_offsets_to_transaction) against at-least-once (the
  same consumer and an idempotent producer; every --txn-records records a flush(), then a synchronous offset
  commit). Reported: input records/s of each, the ratio, each commit's latency.
- read: a topic of --read-transactions transactions of --txn-records records, one in --aborted-every aborted (10%
  by default), read from offset 0 to its end with isolation.level read_committed against read_uncommitted. Both
  read the same bytes and read_committed drops the aborted records, so the rate is the log's offsets per second
  (aborted records included: the time to read the log to its end) (target >= 0.95); each mode's delivered
  records are reported too. Zero copy: the workers' bytes_sendfile counter (shm/stats.py) read before and after
  each read, per byte of the topic's segment files and as a share of the fetch responses' bytes.

JSON lines with --json (a summary line per workload), a table otherwise; progress on stderr. Only 127.0.0.1;
every loop is bounded in count and time (--timeout-s bounds a transform or read step).
    .venv/bin/python -m scripts.bench_transactions [--workload produce|transform|read] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from shmbroker.node.tools.inspect import NodeReader
from scripts.consumer_perf import fill_topic
from scripts.harness import benchnode
from scripts.harness.abba import AlternatingRounds
from scripts.harness.nodeproc import NodeProcess

SCRIPT = "bench_transactions"
WORKLOADS = ("produce", "transform", "read")
STATS_PUBLISH_MS = 100
STATS_WAIT_S = 10.0  # for every worker's row to be published after a step
CLIENT_TIMEOUT_S = 60.0  # one client call (init, commit, flush, close)
PRODUCE_CHUNK = 1000  # produce() calls between looks at the clock
QUEUE_RECORDS = 5000  # both producers' local queue (see the docstring)
CONSUME_BATCH = 500
POLL_S = 0.2
FILL_BATCH_BYTES = 8192


def log(text: str) -> None:
    print(f"{SCRIPT}: {text}", file=sys.stderr, flush=True)


def _ms(samples_ns: list[int]) -> dict[str, float | None]:
    figures = benchnode.percentiles_ms(samples_ns)
    return {"p50_ms": figures["p50_ms"], "p99_ms": figures["p99_ms"]}


class Deliveries:
    """A producer's delivery reports: records acknowledged, and errors by code."""

    def __init__(self) -> None:
        self.acknowledged = 0
        self.errors: dict[str, int] = {}

    def __call__(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acknowledged += 1
        else:
            self.errors[err.name()] = self.errors.get(err.name(), 0) + 1


def producer_config(bootstrap: str, args: argparse.Namespace, transactional_id: str | None,
                    deliveries: Deliveries, queue_records: int | None = None) -> dict:
    config = {"bootstrap.servers": bootstrap, "linger.ms": args.linger_ms, "batch.size": args.batch_bytes,
              "enable.idempotence": True, "acks": "all", "on_delivery": deliveries}
    if queue_records is not None:
        config["queue.buffering.max.messages"] = queue_records
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    return config


# --------------------------------------------------------------------------- produce


PHASES = ("produce", "flush", "commit", "begin")  # where the producing thread's time goes


@dataclass
class ProduceStep:
    records: int = 0
    seconds: float = 0.0
    commits_ns: list[int] = field(default_factory=list)
    flushes_ns: list[int] = field(default_factory=list)  # the flush() before each commit: the queue drained
    phases_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    late_commits: int = 0  # commits that ended after the next one was due
    errors: dict[str, int] = field(default_factory=dict)


def produce_flat_out(bootstrap: str, topic: str, args: argparse.Namespace, transactional: bool) -> ProduceStep:
    """Produce as fast as the producer takes records for args.seconds, into a local queue of args.queue_records;
    the transactional one commits on a fixed schedule, one every args.commit_interval_ms from the start (each
    transaction produces until its commit is due, then flush() and commit_transaction(), timed apart). Records
    acknowledged over the whole span, the last flush or commit included; the producing thread's time per phase."""
    deliveries = Deliveries()
    producer = Producer(producer_config(bootstrap, args, "bench-produce" if transactional else None, deliveries,
                                        args.queue_records))
    step = ProduceStep()
    value = bytes(i % 251 for i in range(args.record_size))
    produce, poll = producer.produce, producer.poll
    interval = args.commit_interval_ms / 1000
    keys = [b"key-%d" % number for number in range(args.keys)]
    sent = 0
    clock = time.perf_counter_ns
    phases = step.phases_s

    def commit() -> None:
        started = clock()
        if producer.flush(CLIENT_TIMEOUT_S):
            raise RuntimeError("records still unsent after a flush")
        flushed = clock()
        producer.commit_transaction(CLIENT_TIMEOUT_S)
        committed = clock()
        step.commits_ns.append(committed - flushed)
        step.flushes_ns.append(flushed - started)
        phases["flush"] += (flushed - started) / 1e9
        phases["commit"] += (committed - flushed) / 1e9

    def begin() -> None:
        started = clock()
        producer.begin_transaction()
        phases["begin"] += (clock() - started) / 1e9

    try:
        # Before the clock: the producer id, the connections and the topic's metadata (one record, acknowledged).
        if transactional:
            producer.init_transactions(CLIENT_TIMEOUT_S)
            producer.begin_transaction()
        produce(topic, value)
        if transactional:
            producer.commit_transaction(CLIENT_TIMEOUT_S)
        elif producer.flush(CLIENT_TIMEOUT_S):
            raise RuntimeError("the first record is still unsent after a flush")
        deliveries.acknowledged = 0
        started = time.monotonic()
        deadline = started + args.seconds
        next_commit = started + interval
        if transactional:
            begin()
        while (now := time.monotonic()) < deadline:
            if transactional and now >= next_commit:
                commit()
                begin()
                # On the schedule (start to start), not an interval after this commit; a commit that ended past
                # the next one's time restarts the schedule, so that no transaction is cut short to catch up.
                next_commit += interval
                if (after := time.monotonic()) >= next_commit:
                    step.late_commits += 1
                    next_commit = after + interval
            producing = clock()
            for _ in range(PRODUCE_CHUNK):
                try:
                    if keys:
                        produce(topic, value, keys[sent % len(keys)])
                    else:
                        produce(topic, value)
                    sent += 1
                except BufferError:  # the local queue is full: serve delivery reports, then go on
                    poll(0.001)
            poll(0)
            phases["produce"] += (clock() - producing) / 1e9
        if transactional:
            commit()
        elif producer.flush(CLIENT_TIMEOUT_S):
            raise RuntimeError("records still unsent after the last flush")
        step.seconds = time.monotonic() - started
    finally:
        producer.flush(CLIENT_TIMEOUT_S)
    step.records = deliveries.acknowledged
    step.errors = deliveries.errors
    return step


def produce_workload(args: argparse.Namespace, node: NodeProcess) -> dict:
    topic = "txn-produce"
    benchnode.create_topic(benchnode.LOOPBACK, node.port, topic, args.partitions)
    rounds = AlternatingRounds("transactional", "idempotent", args.runs)
    commits_ns: list[int] = []
    flushes_ns: list[int] = []
    errors: dict[str, int] = {}
    records = seconds = 0.0  # the transactional producer's, over every round
    late_commits = 0
    for number, (round_index, mode) in enumerate(rounds.steps(), 1):
        meter = benchnode.CpuMeter(node)
        with meter:
            step = produce_flat_out(node.bootstrap, topic, args, mode == "transactional")
        if mode == "transactional":
            records, seconds = records + step.records, seconds + step.seconds
            late_commits += step.late_commits
        commits_ns += step.commits_ns
        flushes_ns += step.flushes_ns
        for name, count in step.errors.items():
            errors[name] = errors.get(name, 0) + count
        rate = step.records / step.seconds
        cores = {name: meter.fields[f"{name}_cores"] or 0.0 for name in ("node", "timer", "worker", "client")}
        # The node's CPU per record acknowledged: what a transactional record costs the node beyond a plain one.
        per_record_us = {f"{name}_us_per_record": cores[name] * step.seconds / step.records * 1e6
                         if step.records else 0.0 for name in ("node", "timer", "worker")}
        shares = {f"{phase}_share": spent / step.seconds for phase, spent in step.phases_s.items()}
        rounds.record(round_index, mode, {"records_per_s": rate, **{f"{k}_cores": v for k, v in cores.items()},
                                          **per_record_us, **shares})
        commit, flush = _ms(step.commits_ns), _ms(step.flushes_ns)
        log(f"produce [{number}/{2 * args.runs}] {mode}: {rate:,.0f} records/s, node {cores['node']:.3f} cores "
            f"({per_record_us['node_us_per_record']:.2f} us/record: timer "
            f"{per_record_us['timer_us_per_record']:.2f}, workers {per_record_us['worker_us_per_record']:.2f}), "
            f"client {cores['client']:.3f} cores; time " + ", ".join(f"{phase} {share:.1%}" for phase, share in
                                                                    zip(PHASES, shares.values()) if share)
            + (f"; {len(step.commits_ns)} commits ({step.late_commits} late), p50 {commit['p50_ms']} ms "
               f"p99 {commit['p99_ms']} ms (each after a flush: p50 {flush['p50_ms']} ms p99 {flush['p99_ms']} ms)"
               if step.commits_ns else ""))
    commit = benchnode.percentiles_ms(commits_ns)
    medians = {f"{mode}_{metric}": round(rounds.median(mode, metric), 3)
               for mode in ("transactional", "idempotent")
               for metric in ("node_cores", "timer_cores", "worker_cores", "client_cores", "node_us_per_record",
                              "timer_us_per_record", "worker_us_per_record", *(f"{p}_share" for p in PHASES))}
    # records, records_per_s, mb_per_s and the percentiles are the transactional producer's: its records and
    # seconds over every round, the latencies of its commits.
    return benchnode.result_row(
        SCRIPT, "confluent", int(records), seconds, int(records) * args.record_size, commits_ns,
        workload="produce", summary=True, runs=args.runs, record_size=args.record_size,
        partitions=args.partitions, commit_interval_ms=args.commit_interval_ms, linger_ms=args.linger_ms,
        batch_size=args.batch_bytes, queue_records=args.queue_records, keys=args.keys, workers=args.workers,
        transactional_records_per_s=round(rounds.median("transactional", "records_per_s")),
        idempotent_records_per_s=round(rounds.median("idempotent", "records_per_s")),
        records_per_s_ratio=rounds.ratio("records_per_s"), records_per_s_ratios=rounds.ratios("records_per_s"),
        commits=len(commits_ns), late_commits=late_commits,
        commit_period_ms=round(seconds * 1000 / len(commits_ns), 2) if commits_ns else None,
        commit_p50_ms=commit["p50_ms"], commit_p99_ms=commit["p99_ms"],
        commit_max_ms=round(max(commits_ns) / 1e6, 3) if commits_ns else None,
        flush_p50_ms=_ms(flushes_ns)["p50_ms"], flush_p99_ms=_ms(flushes_ns)["p99_ms"],
        **medians,
        fdatasync_p50_ms=benchnode.fdatasync_floor_ms(str(node.data_dir), 4096),
        errors=errors, target="records_per_s_ratio >= 0.9 and commit_p50_ms <= 2 and commit_p99_ms <= 10")


# --------------------------------------------------------------------------- transform


@dataclass
class TransformStep:
    records: int = 0
    seconds: float = 0.0
    commits_ns: list[int] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)


def transform(bootstrap: str, source: str, partitions: int, sink: str, total: int, args: argparse.Namespace,
              exactly_once: bool, group: str) -> TransformStep:
    """Read `total` records of `source` from offset 0, write each (transformed) to `sink`; every args.txn_records
    records commit the output and the input offsets together (exactly_once) or one after the other."""
    deliveries = Deliveries()
    producer = Producer(producer_config(bootstrap, args, "bench-transform" if exactly_once else None, deliveries))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "isolation.level": "read_committed" if exactly_once else "read_uncommitted",
                         "fetch.queue.backoff.ms": args.fetch_queue_backoff_ms})
    step = TransformStep()
    positions: dict[int, int] = {}

    def commit() -> None:
        offsets = [TopicPartition(source, p, offset) for p, offset in positions.items()]
        started = time.perf_counter_ns()
        if exactly_once:
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), CLIENT_TIMEOUT_S)
            producer.commit_transaction(CLIENT_TIMEOUT_S)
        else:
            if producer.flush(CLIENT_TIMEOUT_S):
                raise RuntimeError("records still unsent after a flush")
            consumer.commit(offsets=offsets, asynchronous=False)
        step.commits_ns.append(time.perf_counter_ns() - started)

    try:
        if exactly_once:
            producer.init_transactions(CLIENT_TIMEOUT_S)
        consumer.assign([TopicPartition(source, p, 0) for p in range(partitions)])
        started = time.monotonic()
        deadline = started + args.timeout_s
        pending = 0
        if exactly_once:
            producer.begin_transaction()
        while step.records < total and time.monotonic() < deadline:
            messages = consumer.consume(num_messages=min(CONSUME_BATCH, args.txn_records - pending), timeout=POLL_S)
            for message in messages:
                if message.error():
                    raise KafkaException(message.error())
                producer.produce(sink, value=message.value().upper(), key=message.key())
                positions[message.partition()] = message.offset() + 1
            producer.poll(0)
            pending += len(messages)
            step.records += len(messages)
            if pending >= args.txn_records or (pending and step.records >= total):
                commit()
                pending = 0
                if exactly_once and step.records < total:
                    producer.begin_transaction()
        step.seconds = time.monotonic() - started
        if pending:  # out of time: what was read but not committed does not count
            step.records -= pending
            if exactly_once:
                producer.abort_transaction(CLIENT_TIMEOUT_S)
    finally:
        consumer.close()
        producer.flush(CLIENT_TIMEOUT_S)
    step.errors = deliveries.errors
    return step


def transform_workload(args: argparse.Namespace, node: NodeProcess) -> dict:
    target = benchnode.Target(benchnode.LOOPBACK, node.port, str(node.data_dir), node)
    source, sink = "txn-transform-in", "txn-transform-out"
    log(f"transform: writing {args.records:,} input records")
    filled = fill_topic(target, source, args.records, args.partitions, args.record_size, FILL_BATCH_BYTES,
                        args.timeout_s)
    benchnode.create_topic(benchnode.LOOPBACK, node.port, sink, args.partitions)
    rounds = AlternatingRounds("exactly_once", "at_least_once", args.runs)
    commits_ns: dict[str, list[int]] = {"exactly_once": [], "at_least_once": []}
    errors: dict[str, int] = {}
    complete = True
    records = seconds = 0.0  # the exactly-once pipeline's, over every round
    for number, (round_index, mode) in enumerate(rounds.steps(), 1):
        meter = benchnode.CpuMeter(node)
        with meter:
            step = transform(node.bootstrap, source, filled.partitions, sink, filled.records, args,
                             mode == "exactly_once", f"bench-transform-{number}")
        complete &= step.records == filled.records
        if mode == "exactly_once":
            records, seconds = records + step.records, seconds + step.seconds
        commits_ns[mode] += step.commits_ns
        for name, count in step.errors.items():
            errors[name] = errors.get(name, 0) + count
        rate = step.records / step.seconds if step.seconds > 0 else 0.0
        rounds.record(round_index, mode, {"records_per_s": rate, "node_cores": meter.fields["node_cores"] or 0.0})
        commit = _ms(step.commits_ns)
        log(f"transform [{number}/{2 * args.runs}] {mode}: {step.records:,} records at {rate:,.0f}/s, "
            f"{len(step.commits_ns)} commits p50 {commit['p50_ms']} ms p99 {commit['p99_ms']} ms, "
            f"client {meter.fields['client_cores']} node {meter.fields['node_cores']} cores")
    eos, alo = _ms(commits_ns["exactly_once"]), _ms(commits_ns["at_least_once"])
    # records, records_per_s, mb_per_s and the percentiles are the exactly-once pipeline's (its commits).
    return benchnode.result_row(
        SCRIPT, "confluent", int(records), seconds, int(records) * args.record_size, commits_ns["exactly_once"],
        workload="transform", summary=True, runs=args.runs, records_per_step=filled.records,
        txn_records=args.txn_records, record_size=args.record_size, partitions=filled.partitions,
        workers=args.workers, complete=complete,
        exactly_once_records_per_s=round(rounds.median("exactly_once", "records_per_s")),
        at_least_once_records_per_s=round(rounds.median("at_least_once", "records_per_s")),
        records_per_s_ratio=rounds.ratio("records_per_s"), records_per_s_ratios=rounds.ratios("records_per_s"),
        exactly_once_commit_p50_ms=eos["p50_ms"], exactly_once_commit_p99_ms=eos["p99_ms"],
        at_least_once_commit_p50_ms=alo["p50_ms"], at_least_once_commit_p99_ms=alo["p99_ms"],
        exactly_once_node_cores=round(rounds.median("exactly_once", "node_cores"), 3),
        at_least_once_node_cores=round(rounds.median("at_least_once", "node_cores"), 3),
        errors=errors, target="report records_per_s_ratio")


# --------------------------------------------------------------------------- read


@dataclass
class TransactionalTopic:
    topic: str
    partitions: int
    records: int  # every record written, aborted ones included
    committed: int
    end_offsets: list[int]  # each partition's log end (markers included)
    log_bytes: int  # the partitions' segment files


def write_transactions(node: NodeProcess, topic: str, args: argparse.Namespace) -> TransactionalTopic:
    """args.read_transactions transactions of args.txn_records records each; every args.aborted_every-th is
    written (flushed), then aborted."""
    benchnode.create_topic(benchnode.LOOPBACK, node.port, topic, args.partitions)
    deliveries = Deliveries()
    producer = Producer(producer_config(node.bootstrap, args, "bench-read-writer", deliveries))
    value = bytes(i % 251 for i in range(args.record_size))
    committed = 0
    deadline = time.monotonic() + args.timeout_s
    try:
        producer.init_transactions(CLIENT_TIMEOUT_S)
        for number in range(args.read_transactions):
            if time.monotonic() > deadline:
                raise RuntimeError(f"wrote {number} of {args.read_transactions} transactions in {args.timeout_s}s")
            producer.begin_transaction()
            for _ in range(args.txn_records):
                benchnode.produce_when_room(producer, topic, value)
            if (number + 1) % args.aborted_every == 0:
                producer.flush(CLIENT_TIMEOUT_S)  # written, then aborted (abort drops what is not sent yet)
                producer.abort_transaction(CLIENT_TIMEOUT_S)
            else:
                producer.commit_transaction(CLIENT_TIMEOUT_S)
                committed += args.txn_records
    finally:
        producer.flush(CLIENT_TIMEOUT_S)
    if deliveries.errors or deliveries.acknowledged != args.read_transactions * args.txn_records:
        raise RuntimeError(f"writing the transactions: {deliveries.acknowledged} acknowledged, {deliveries.errors}")
    reader = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "bench-read-ends"})
    try:
        end_offsets = [reader.get_watermark_offsets(TopicPartition(topic, p), CLIENT_TIMEOUT_S)[1]
                       for p in range(args.partitions)]
    finally:
        reader.close()
    files = [path for p in range(args.partitions) for path in glob.glob(os.path.join(node.data_dir, f"{topic}-{p}", "*.log"))]
    return TransactionalTopic(topic, args.partitions, deliveries.acknowledged, committed, end_offsets,
                              sum(os.path.getsize(path) for path in files))


class WorkerBytes:
    """The workers' bytes sent by sendfile and their fetch responses' bytes, summed, as of a moment: read once
    every worker's row was published after that moment."""

    FETCH = 1

    def __init__(self, node: NodeProcess) -> None:
        self.node = node

    def read(self) -> tuple[int, int]:
        after_ms = time.time_ns() // 1_000_000
        deadline = time.monotonic() + STATS_WAIT_S
        reader = NodeReader.open(str(self.node.data_dir))
        try:
            while True:
                rows = [row for row in reader.rows() if row.role == "worker"]
                if rows and all(row.get("published_ms") > after_ms for row in rows):
                    return (sum(row.get("bytes_sendfile") for row in rows),
                            sum(int(row.array("bytes_out")[self.FETCH]) for row in rows))
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the workers' stats were not published within {STATS_WAIT_S}s")
                time.sleep(STATS_PUBLISH_MS / 1000 / 2)
        finally:
            reader.close()


@dataclass
class ReadStep:
    delivered: int = 0
    offsets: int = 0  # of the log read through (to the partitions' ends)
    seconds: float = 0.0
    at_end: bool = False


def read_to_end(bootstrap: str, topic: TransactionalTopic, isolation: str, group: str, args: argparse.Namespace) -> ReadStep:
    """Read every partition from offset 0 to its end (partition EOF); the clock runs from the first record
    received to the last end reached."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "isolation.level": isolation, "enable.partition.eof": True,
                         "fetch.queue.backoff.ms": args.fetch_queue_backoff_ms})
    step = ReadStep()
    at_end: set[int] = set()
    first = last = 0.0
    try:
        consumer.assign([TopicPartition(topic.topic, p, 0) for p in range(topic.partitions)])
        deadline = time.monotonic() + args.timeout_s
        while len(at_end) < topic.partitions and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=POLL_S):
                error = message.error()
                if error is None:
                    step.delivered += 1
                    at_end.discard(message.partition())
                    if not first:
                        first = time.monotonic()
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    last = time.monotonic()
                else:
                    raise KafkaException(error)
    finally:
        consumer.close()
    step.at_end = len(at_end) == topic.partitions
    step.offsets = sum(topic.end_offsets)
    step.seconds = last - first if first and last > first else 0.0
    return step


def read_workload(args: argparse.Namespace, node: NodeProcess) -> dict:
    log(f"read: writing {args.read_transactions} transactions of {args.txn_records} records, one in "
        f"{args.aborted_every} aborted")
    topic = write_transactions(node, "txn-read", args)
    rounds = AlternatingRounds("read_committed", "read_uncommitted", args.runs)
    counters = WorkerBytes(node)
    delivered: dict[str, set[int]] = {"read_committed": set(), "read_uncommitted": set()}
    complete = True
    records = seconds = 0.0  # the read_committed consumer's, over every round
    for number, (round_index, mode) in enumerate(rounds.steps(), 1):
        sendfile_before, fetch_before = counters.read()
        meter = benchnode.CpuMeter(node)
        with meter:
            step = read_to_end(node.bootstrap, topic, mode, f"bench-read-{number}", args)
        sendfile_after, fetch_after = counters.read()
        expected = topic.committed if mode == "read_committed" else topic.records
        complete &= step.at_end and step.delivered == expected
        delivered[mode].add(step.delivered)
        if mode == "read_committed":
            records, seconds = records + step.delivered, seconds + step.seconds
        sendfile = sendfile_after - sendfile_before
        fetched = fetch_after - fetch_before
        rate = step.offsets / step.seconds if step.seconds > 0 else 0.0
        rounds.record(round_index, mode, {
            "log_records_per_s": rate, "delivered_per_s": step.delivered / step.seconds if step.seconds > 0 else 0.0,
            "sendfile_per_log_byte": sendfile / topic.log_bytes,
            "sendfile_share": sendfile / fetched if fetched else 0.0,
            "client_cores": meter.fields["client_cores"] or 0.0, "node_cores": meter.fields["node_cores"] or 0.0})
        log(f"read [{number}/{2 * args.runs}] {mode}: {step.delivered:,} records delivered, log read at "
            f"{rate:,.0f} offsets/s, sendfile {sendfile / topic.log_bytes:.3f} bytes per log byte "
            f"({sendfile / fetched if fetched else 0:.3f} of the fetch bytes), client {meter.fields['client_cores']} "
            f"node {meter.fields['node_cores']} cores")
    # records, records_per_s and mb_per_s are the read_committed consumer's: the records delivered to it.
    return benchnode.result_row(
        SCRIPT, "confluent", int(records), seconds, int(records) * args.record_size, None,
        workload="read", summary=True, runs=args.runs, transactions=args.read_transactions,
        txn_records=args.txn_records, aborted_every=args.aborted_every, record_size=args.record_size,
        partitions=topic.partitions, workers=args.workers, log_records=sum(topic.end_offsets),
        log_bytes=topic.log_bytes, complete=complete,
        read_committed_delivered=sorted(delivered["read_committed"]),
        read_uncommitted_delivered=sorted(delivered["read_uncommitted"]),
        read_committed_log_records_per_s=round(rounds.median("read_committed", "log_records_per_s")),
        read_uncommitted_log_records_per_s=round(rounds.median("read_uncommitted", "log_records_per_s")),
        records_per_s_ratio=rounds.ratio("log_records_per_s"), records_per_s_ratios=rounds.ratios("log_records_per_s"),
        read_committed_sendfile_per_log_byte=round(rounds.median("read_committed", "sendfile_per_log_byte"), 4),
        read_uncommitted_sendfile_per_log_byte=round(rounds.median("read_uncommitted", "sendfile_per_log_byte"), 4),
        read_committed_sendfile_share=round(rounds.median("read_committed", "sendfile_share"), 4),
        read_uncommitted_sendfile_share=round(rounds.median("read_uncommitted", "sendfile_share"), 4),
        read_committed_client_cores=round(rounds.median("read_committed", "client_cores"), 3),
        read_uncommitted_client_cores=round(rounds.median("read_uncommitted", "client_cores"), 3),
        target="records_per_s_ratio >= 0.95, sendfile_per_log_byte about 1 in both modes")


RUNNERS: dict[str, Callable[[argparse.Namespace, NodeProcess], dict]] = {
    "produce": produce_workload, "transform": transform_workload, "read": read_workload}


# The numeric options: name -> (type, default, whether 0 is allowed (else it must be above 0), help).
NUMBER_OPTIONS: dict[str, tuple[type, float, bool, str]] = {
    "runs": (int, 3, False, "rounds of each mode (default %(default)s)"),
    "seconds": (float, 5.0, False, "produce: seconds per step (default %(default)s)"),
    "commit-interval-ms": (int, 100, False, "produce: a commit this often (default %(default)s)"),
    "records": (int, 100_000, False, "transform: input records per step (default %(default)s)"),
    "txn-records": (int, 1000, False, "transform and read: records per transaction (default %(default)s)"),
    "read-transactions": (int, 300, False, "read: transactions in the topic (default %(default)s)"),
    "aborted-every": (int, 10, False, "read: one transaction in this many is aborted (default %(default)s)"),
    "queue-records": (int, QUEUE_RECORDS, False,
                      "produce: both producers' local queue, queue.buffering.max.messages (default %(default)s)"),
    "keys": (int, 0, True, "produce: records keyed with this many keys, round robin (default 0: keyless, so "
                           "librdkafka's sticky partitioner fills one partition at a time)"),
    "record-size": (int, 100, False, "bytes per value (default %(default)s)"),
    "partitions": (int, 4, False, "of each topic (default %(default)s)"),
    "linger-ms": (int, 5, True, "producers' linger.ms (default %(default)s)"),
    "batch-bytes": (int, 16384, False, "producers' batch.size (default %(default)s)"),
    "fetch-queue-backoff-ms": (int, 1, True,
                               "consumers' fetch.queue.backoff.ms (librdkafka's default, 1000, idles a fast consumer)"),
    "timeout-s": (float, 300.0, False, "bound of a transform or read step and of each fill (default %(default)s)"),
    "workers": (int, benchnode.DEFAULT_WORKERS, False, "network workers of the node (default %(default)s)"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_transactions", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", action="append", choices=WORKLOADS, help="default: all three")
    for name, (kind, default, _, help_text) in NUMBER_OPTIONS.items():
        parser.add_argument(f"--{name}", type=kind, default=default, help=help_text)
    parser.add_argument("--json", action="store_true", help="one JSON summary line per workload")
    args = parser.parse_args(argv)
    for name, (_, _, zero_allowed, _) in NUMBER_OPTIONS.items():
        value = getattr(args, name.replace("-", "_"))
        if value < 0 or (value == 0 and not zero_allowed):
            parser.error(f"--{name} must be {'>= 0' if zero_allowed else '> 0'}, got {value}")
    config = f"[stats]\npublish_interval_ms = {STATS_PUBLISH_MS}\n"
    with NodeProcess(workers=args.workers, config=config, announce=True) as node:
        for workload in args.workload or WORKLOADS:
            log(f"{workload}: {args.runs} rounds")
            row = RUNNERS[workload](args, node)
            if args.json:
                benchnode.emit(row, True)
            else:
                for key, value in row.items():
                    print(f"{key:>38}  {value}")
                print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
