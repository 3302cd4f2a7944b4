"""Producer throughput of the node: records/s, MB/s and request latency, like Kafka's producer-perf-test.

Two load generators, 100-byte records by default:
- ``--client raw``: one v2 batch of about ``--batch-bytes`` (8 KiB, as in Kafka's reference run) is
  encoded once; Produce requests carrying it go over ``--connections`` sockets with ``--inflight``
  requests outstanding on each, so the node is what gets measured, not a Python client. Latency
  is per request (send to response). ``--processes`` spreads the connections over that many load
  generator processes, started and synchronised before the clock starts. One process is the
  default: sending a pre-encoded batch costs the generator a small fraction of what answering it
  costs the node (``client_cores`` against ``node_cores`` in the JSON line).
- ``--client confluent``: a confluent-kafka Producer, the way users produce (``batch.size`` =
  ``--batch-bytes``, ``linger.ms`` = ``--linger-ms``); latency per delivery callback
  (``Message.latency()``: produce() call to acknowledgement). It produces flat out, so its latency
  is mostly time queued inside librdkafka (up to queue.buffering.max.messages), as in Kafka's
  producer-perf-test with --throughput -1; the raw figures are the node's.
Without ``--client`` both run, without ``--acks`` both acks=1 and acks=all; one JSON line each.

MB/s counts record payload (records x record size), as Kafka's ProducerPerformance does.
Only acknowledged, error-free records are counted. Usage:
    .venv/bin/python -m scripts.producer_perf [--bootstrap 127.0.0.1:9092] [--seconds 10] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scripts.harness import benchnode, rawkafka, results

SCRIPT = "producer_perf"
ACKS = {"1": 1, "all": -1}
# Load generator processes: how long they may take to start and connect, and the head start the
# parent gives itself to hand every one the common start time before it comes.
PROCESS_START_TIMEOUT_S = 60.0
PROCESS_START_MARGIN_S = 0.1
# A process reports at most this long after its deadline (its last responses, pickling latencies).
PROCESS_REPORT_GRACE_S = 60.0


@dataclass(frozen=True)
class RawProduceLoad:
    """What the raw load generator sends."""

    topic: str
    partitions: int
    record_size: int = 100
    batch_bytes: int = 8192
    acks: int = 1
    request_timeout_ms: int = 30000
    produce_version: int = 11  # the newest the node serves (flexible); --produce-version 8 for the non-flexible form
    pipeline: benchnode.PipelineSettings = benchnode.PipelineSettings()
    # Fill mode: stop after this many batches per partition (None: run until the deadline).
    batches_per_partition: int | None = None

    def records_per_batch(self) -> int:
        return rawkafka.records_for_batch_bytes(self.batch_bytes, self.record_size)


@dataclass
class ProduceOutcome:
    records: int = 0
    requests: int = 0
    batches: int = 0  # acknowledged without error
    batch_bytes: int = 0  # bytes of one batch as sent
    errors: dict[int, int] = field(default_factory=dict)  # error code -> responses
    latencies_ns: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    elapsed_s: float = 0.0

    def merge(self, other: ProduceOutcome) -> None:
        self.records += other.records
        self.requests += other.requests
        self.batches += other.batches
        self.batch_bytes = other.batch_bytes or self.batch_bytes
        for code, n in other.errors.items():
            self.errors[code] = self.errors.get(code, 0) + n
        self.latencies_ns = np.concatenate([self.latencies_ns, other.latencies_ns])
        self.elapsed_s = max(self.elapsed_s, other.elapsed_s)


_ERROR_CODE = struct.Struct(">h")


def _produce_error_offset(topic: str, version: int) -> int:
    """Where the error code sits in a Produce response body (after the correlation id) for one topic and one
    partition: v3-8: topic count (4), name (2 + n), partition count (4), partition index (4); v9+ (flexible): the
    header's tags (1), then the counts and the name's length as one-byte varints (a name under 127 bytes)."""
    name = len(topic.encode("utf-8"))
    if version >= rawkafka.PRODUCE_FIRST_FLEXIBLE:
        return 1 + 1 + 1 + name + 1 + 4
    return 4 + 2 + name + 4 + 4


def produce_with_connections(host: str, port: int, load: RawProduceLoad, deadline: float,
                             first_connection: int = 0, start_at: float | None = None) -> ProduceOutcome:
    """One process's share of the raw load: connection i (global index first_connection + i)
    produces to partition (global index % partitions)."""
    records_per_batch = load.records_per_batch()
    batch = rawkafka.make_batch(records_per_batch, load.record_size)
    frames = [rawkafka.produce_request(load.topic, p, batch, load.acks, load.request_timeout_ms,
                                       version=load.produce_version) for p in range(load.partitions)]
    partition_of = [(first_connection + i) % load.partitions for i in range(load.pipeline.connections)]
    remaining = [load.batches_per_partition] * load.partitions if load.batches_per_partition is not None else None
    error_at = _produce_error_offset(load.topic, load.produce_version)
    outcome = ProduceOutcome(batch_bytes=len(batch))

    def next_request(connection: int) -> tuple[bytes, None] | None:
        partition = partition_of[connection]
        if remaining is not None:
            if remaining[partition] <= 0:
                return None
            remaining[partition] -= 1
        return frames[partition], None

    def on_response(connection: int, tag: Any, body: memoryview, latency_ns: int) -> None:
        (code,) = _ERROR_CODE.unpack_from(body, error_at)
        if code:
            outcome.errors[code] = outcome.errors.get(code, 0) + 1
        else:
            outcome.batches += 1

    with benchnode.Pipeliner(host, port, load.pipeline) as pipeliner:
        stats = pipeliner.run(next_request, on_response, deadline, start_at=start_at)
    outcome.records = outcome.batches * records_per_batch
    outcome.requests = stats.responses
    outcome.latencies_ns = np.asarray(stats.latencies_ns, dtype=np.int64)
    outcome.elapsed_s = stats.elapsed_s
    return outcome


def _produce_process(host: str, port: int, load: RawProduceLoad, first_connection: int, pipe: Any) -> None:
    """Child of run_raw_producer: connect, say ready, wait for (start_at, deadline), run, report."""
    try:
        pipe.send("ready")
        if not pipe.poll(PROCESS_START_TIMEOUT_S):
            return
        start_at, deadline = pipe.recv()
        outcome = produce_with_connections(host, port, load, deadline, first_connection, start_at)
        pipe.send(outcome)
    except Exception as exc:  # reported to the parent, which raises it
        pipe.send(exc)
    finally:
        pipe.close()


def run_raw_producer(host: str, port: int, load: RawProduceLoad, seconds: float, processes: int = 1) -> ProduceOutcome:
    """The raw load for at most `seconds` (or until batches_per_partition are all sent), from
    `processes` processes sharing load.pipeline.connections connections between them."""
    if processes <= 1:
        return produce_with_connections(host, port, load, time.monotonic() + seconds)
    per_process = max(1, load.pipeline.connections // processes)
    share = dataclasses.replace(load, pipeline=dataclasses.replace(load.pipeline, connections=per_process))
    context = multiprocessing.get_context("spawn")
    children, pipes = [], []
    try:
        for index in range(processes):
            mine, theirs = context.Pipe()
            child = context.Process(target=_produce_process, daemon=True,
                                    args=(host, port, share, index * per_process, theirs))
            child.start()
            theirs.close()
            children.append(child)
            pipes.append(mine)
        for pipe in pipes:
            if not pipe.poll(PROCESS_START_TIMEOUT_S) or pipe.recv() != "ready":
                raise RuntimeError("a load generator process did not start")
        start_at = time.monotonic() + PROCESS_START_MARGIN_S
        for pipe in pipes:
            pipe.send((start_at, start_at + seconds))
        total = ProduceOutcome()
        for pipe in pipes:
            if not pipe.poll(seconds + PROCESS_REPORT_GRACE_S):
                raise RuntimeError("a load generator process did not report")
            got = pipe.recv()
            if isinstance(got, Exception):
                raise got
            total.merge(got)
        return total
    finally:
        for pipe in pipes:
            pipe.close()
        for child in children:
            child.join(timeout=PROCESS_REPORT_GRACE_S)
            if child.is_alive():
                child.kill()  # by pid
                child.join(timeout=PROCESS_REPORT_GRACE_S)


def run_confluent_producer(bootstrap: str, topic: str, record_size: int, acks: int, seconds: float,
                           batch_bytes: int, linger_ms: int, flush_timeout_s: float = 60.0) -> ProduceOutcome:
    """confluent-kafka Producer, produce() as fast as it accepts for `seconds`, then flush."""
    from confluent_kafka import Producer

    latencies: list[float] = []
    outcome = ProduceOutcome()

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            latencies.append(msg.latency())
        else:
            code = err.code()
            outcome.errors[code] = outcome.errors.get(code, 0) + 1

    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": acks, "linger.ms": linger_ms, "batch.size": batch_bytes,
        "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1024 * 1024,
        "enable.idempotence": False, "on_delivery": on_delivery,
    })
    value = bytes(i % 251 for i in range(record_size))
    produce, poll = producer.produce, producer.poll
    started = time.monotonic()
    deadline = started + seconds
    while time.monotonic() < deadline:
        for _ in range(1000):
            try:
                produce(topic, value)
            except BufferError:  # local queue full: serve delivery reports, then go on
                poll(0.001)
        poll(0)
    left = producer.flush(flush_timeout_s)
    outcome.elapsed_s = time.monotonic() - started
    if left:
        outcome.errors[-1] = left  # still undelivered after the flush bound
    outcome.records = len(latencies)
    outcome.latencies_ns = (np.asarray([x for x in latencies if x is not None]) * 1e9).astype(np.int64)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.producer_perf", description=__doc__.splitlines()[0])
    benchnode.add_common_arguments(parser, default_seconds=10.0)
    parser.add_argument("--client", choices=("raw", "confluent"), help="default: both")
    parser.add_argument("--acks", choices=tuple(ACKS), help="default: both")
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--batch-bytes", type=int, default=8192)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--connections", type=int, default=4, help="raw: sockets (default %(default)s)")
    parser.add_argument("--inflight", type=int, default=8, help="raw: requests in flight per socket")
    parser.add_argument("--processes", type=int, default=1, help="raw: load generator processes")
    parser.add_argument("--linger-ms", type=int, default=5, help="confluent: linger.ms")
    parser.add_argument("--topic", default="producer-perf", help="topic name prefix")
    parser.add_argument("--produce-version", type=int, default=RawProduceLoad.produce_version, choices=range(3, 12),
                        help="raw: Produce version (default %(default)s; 9+ are flexible)")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    recorder = results.Recorder(args, SCRIPT)
    if args.record_size < 1 or args.batch_bytes < 1 or args.partitions < 1 or args.connections < 1 \
            or args.inflight < 1 or args.processes < 1 or args.seconds <= 0:
        parser.error("sizes, counts and --seconds must be positive")
    clients = [args.client] if args.client else ["raw", "confluent"]
    acks_list = [args.acks] if args.acks else ["1", "all"]

    with benchnode.node_for(args) as target:
        for client in clients:
            for acks_name in acks_list:
                topic = f"{args.topic}-{client}-acks{acks_name}-{os.getpid()}"
                benchnode.create_topic(target.host, target.port, topic, args.partitions)
                meter = benchnode.CpuMeter(target.node)
                recorder.start()
                if client == "raw":
                    load = RawProduceLoad(topic, args.partitions, args.record_size, args.batch_bytes, ACKS[acks_name],
                                          produce_version=args.produce_version,
                                          pipeline=benchnode.PipelineSettings(connections=args.connections,
                                                                              inflight=args.inflight))
                    with meter:
                        outcome = run_raw_producer(target.host, target.port, load, args.seconds, args.processes)
                    extra = {"produce_version": args.produce_version,
                             "connections": args.connections, "inflight": args.inflight, "processes": args.processes,
                             "records_per_batch": load.records_per_batch(), "batch_bytes": outcome.batch_bytes,
                             "requests": outcome.requests}
                else:
                    with meter:
                        outcome = run_confluent_producer(target.bootstrap, topic, args.record_size, ACKS[acks_name],
                                                         args.seconds, args.batch_bytes, args.linger_ms)
                    extra = {"linger_ms": args.linger_ms, "batch_size": args.batch_bytes}
                row = benchnode.result_row(SCRIPT, client, outcome.records, outcome.elapsed_s,
                                           outcome.records * args.record_size, outcome.latencies_ns,
                                           acks=acks_name, record_size=args.record_size, partitions=args.partitions,
                                           workers=None if args.bootstrap else args.workers,
                                           errors={str(k): v for k, v in outcome.errors.items()},
                                           **meter.fields, **extra)
                if acks_name == "all":  # the disk's own fdatasync, just after: what acks=all cannot go below
                    row["fdatasync_p50_ms"] = benchnode.fdatasync_floor_ms(target.data_dir, args.batch_bytes)
                benchnode.emit(row, args.json)
                # Load of a raw point: the requests kept in flight (a sweep of --inflight draws a saturation curve).
                raw = client == "raw"
                recorder.record(row, outcome.latencies_ns, load=args.connections * args.inflight if raw else None,
                                load_unit="requests in flight" if raw else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
