"""Consumer throughput of the node from offset 0, against the loopback sendfile ceiling of the same run.

1. Fill: the raw producer writes ``--records`` records of ``--record-size`` bytes (8 KiB batches) into
   ``--partitions`` partitions of a new topic, so every partition is a run of identical batches.
2. Ceiling: a bare ``os.sendfile`` of that topic's segment files (<data_dir>/<topic>-<p>/*.log) to a
   127.0.0.1 socket whose peer (another process) reads into a buffer and discards, repeated for at
   least ``--ceiling-seconds``. This is what a zero-copy fetch path could at best do on this machine.
3. Consume everything from offset 0, bounded by ``--seconds``:
   - ``--client raw``: pipelined Fetch v11 requests (``--connections``, ``--inflight`` each), reading
     everything ``--passes`` times (default 3: one pass lasts well under a second). Since the
     batch layout is known, the fetch offsets are too: each request asks for ``--fetch-bytes`` worth of
     whole batches at a precomputed offset, so requests need not wait for each other. Records are
     counted from batch headers; a short answer is re-asked for the rest.
   - ``--client confluent``: a confluent-kafka Consumer assigned every partition at offset 0, with
     fetch.queue.backoff.ms = ``--fetch-queue-backoff-ms`` (1; see consume_confluent for why).
   - ``--client group``: ``--consumers`` confluent-kafka Consumers in one new group (group.id, subscribe,
     auto.offset.reset=earliest, auto commit), each its own process, as Kafka's consumer perf runs them
     (one consumer per machine); the rate is the records of all of them over the span from the first
     receipt to the last (the group's join, about group.initial.rebalance.delay.ms, is reported apart as
     join_s). Use as many partitions as consumers or more.
One JSON line per client: mb_per_s is payload (records x record size, as Kafka's consumer perf
reports), log_mb_per_s the record-set bytes received, ceiling_mb_per_s the sendfile rate of the same
files and ceiling_ratio = log_mb_per_s / ceiling_mb_per_s. With ``--bootstrap``, pass ``--data-dir``
(the node's) for a ceiling; without it the ceiling is null.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import itertools
import math
import multiprocessing
import os
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from scripts import producer_perf
from scripts.harness import benchnode, rawkafka, results

SCRIPT = "consumer_perf"
FIRST_TOPIC_ID_FETCH = 13
FETCH_VERSION = 17  # raw: the newest the node serves (topic ids); --fetch-version 12 for names, 11 non-flexible


@dataclass(frozen=True)
class CeilingSettings:
    min_seconds: float = 2.0
    max_rounds: int = 1000
    # Same as the node's default socket_send_buffer_bytes, so both paths send through equal buffers;
    # the reading side keeps the kernel's default (autotuned) buffer, as the raw consumer's sockets do.
    send_buffer_bytes: int = 1024 * 1024
    read_chunk_bytes: int = 1024 * 1024
    timeout_s: float = 60.0


@dataclass
class FilledTopic:
    topic: str
    partitions: int
    record_size: int
    records_per_batch: int
    batch_bytes: int
    batches_per_partition: int

    @property
    def records(self) -> int:
        return self.partitions * self.batches_per_partition * self.records_per_batch

    @property
    def end_offset(self) -> int:
        return self.batches_per_partition * self.records_per_batch


def fill_topic(target: benchnode.Target, topic: str, records: int, partitions: int, record_size: int,
               batch_bytes: int, timeout_s: float) -> FilledTopic:
    """Create `topic` and write at least `records` records in identical batches, evenly per partition."""
    benchnode.create_topic(target.host, target.port, topic, partitions)
    load = producer_perf.RawProduceLoad(
        topic, partitions, record_size, batch_bytes, acks=1,
        pipeline=benchnode.PipelineSettings(connections=partitions, inflight=8))
    per_batch = load.records_per_batch()
    batches = max(1, math.ceil(records / per_batch / partitions))
    load = dataclasses.replace(load, batches_per_partition=batches)
    outcome = producer_perf.run_raw_producer(target.host, target.port, load, timeout_s)
    if outcome.errors or outcome.batches != batches * partitions:
        raise RuntimeError(f"fill wrote {outcome.batches} of {batches * partitions} batches in {timeout_s}s "
                           f"(errors {outcome.errors})")
    return FilledTopic(topic, partitions, record_size, per_batch, outcome.batch_bytes, batches)


# --------------------------------------------------------------------------- ceiling


def segment_files(data_dir: str, topic: str, partitions: int) -> list[str]:
    files = []
    for partition in range(partitions):
        files += sorted(glob.glob(os.path.join(data_dir, f"{topic}-{partition}", "*.log")))
    return files


def _discard_sink(port: int, read_chunk_bytes: int, timeout_s: float, pipe: Any) -> None:
    """Peer of the ceiling: connect, read into one buffer until EOF, report the byte count."""
    try:
        with socket.create_connection((benchnode.LOOPBACK, port), timeout=timeout_s) as sock:
            buffer = memoryview(bytearray(read_chunk_bytes))
            total = 0
            while True:
                n = sock.recv_into(buffer)
                if n == 0:
                    break
                total += n
        pipe.send(total)
    except Exception as exc:
        pipe.send(exc)
    finally:
        pipe.close()


def sendfile_ceiling(files: list[str], settings: CeilingSettings = CeilingSettings()) -> tuple[int, float]:
    """(bytes, seconds) of os.sendfile of `files`, in rounds until min_seconds passed, to a reading peer process."""
    sizes = [os.path.getsize(path) for path in files]
    if not files or sum(sizes) == 0:
        raise RuntimeError("no segment data to send")
    context = multiprocessing.get_context("spawn")
    with socket.create_server((benchnode.LOOPBACK, 0)) as listener:
        listener.settimeout(settings.timeout_s)
        mine, theirs = context.Pipe()
        sink = context.Process(target=_discard_sink, daemon=True,
                               args=(listener.getsockname()[1], settings.read_chunk_bytes, settings.timeout_s, theirs))
        sink.start()
        theirs.close()
        fds = [os.open(path, os.O_RDONLY) for path in files]
        try:
            conn, _ = listener.accept()
            with conn:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, settings.send_buffer_bytes)
                conn.setblocking(True)
                out = conn.fileno()
                sent = 0
                started = time.monotonic()
                for _ in range(settings.max_rounds):
                    for fd, size in zip(fds, sizes):
                        offset = 0
                        while offset < size:
                            n = os.sendfile(out, fd, offset, size - offset)
                            if n == 0:
                                raise RuntimeError("sendfile sent nothing")
                            offset += n
                        sent += size
                    if time.monotonic() - started >= settings.min_seconds:
                        break
                conn.shutdown(socket.SHUT_WR)
                if not mine.poll(settings.timeout_s):
                    raise RuntimeError("the ceiling's reading peer did not report")
                received = mine.recv()
                elapsed = time.monotonic() - started
            if isinstance(received, Exception):
                raise received
            if received != sent:
                raise RuntimeError(f"ceiling peer read {received} bytes of {sent}")
            return sent, elapsed
        finally:
            for fd in fds:
                os.close(fd)
            mine.close()
            sink.join(timeout=settings.timeout_s)
            if sink.is_alive():
                sink.kill()
                sink.join(timeout=10.0)


# --------------------------------------------------------------------------- consumers


@dataclass
class ConsumeOutcome:
    records: int = 0
    log_bytes: int = 0
    elapsed_s: float = 0.0
    refetches: int = 0
    latencies_ns: list[int] | None = None
    join_s: float | None = None  # group: from starting the consumers until every one holds partitions


def consume_raw(target: benchnode.Target, filled: FilledTopic, fetch_bytes: int, connections: int, inflight: int,
                seconds: float, passes: int = 1, max_wait_ms: int = 500,
                fetch_version: int = FETCH_VERSION) -> ConsumeOutcome:
    """Pipelined fetches of every partition from offset 0 to its end, `passes` times over (one pass of 2M
    records takes well under a second); connection c serves partitions c, c+C, ..."""
    batches_per_fetch = max(1, fetch_bytes // filled.batch_bytes)
    span = batches_per_fetch * filled.records_per_batch
    limit = batches_per_fetch * filled.batch_bytes
    pending: list[deque[tuple[int, int, int]]] = [deque() for _ in range(connections)]
    for _, partition in itertools.product(range(passes), range(filled.partitions)):
        for start in range(0, filled.end_offset, span):
            pending[partition % connections].append((partition, start, min(start + span, filled.end_offset)))
    outcome = ConsumeOutcome()
    ids = rawkafka.topic_ids(target.host, target.port, [filled.topic]) if fetch_version >= FIRST_TOPIC_ID_FETCH else {}
    names = {topic_id.bytes: name for name, topic_id in ids.items()}

    def next_request(connection: int) -> tuple[bytes, tuple[int, int, int]] | None:
        if not pending[connection]:
            return None
        partition, start, end = pending[connection].popleft()
        body = rawkafka.fetch_body({filled.topic: {partition: start}}, max_wait_ms=max_wait_ms, min_bytes=1,
                                   max_bytes=limit, partition_max_bytes=limit, version=fetch_version,
                                   topic_ids=ids)
        return rawkafka.encode_request(rawkafka.FETCH, fetch_version, 0, body), (partition, start, end)

    def on_response(connection: int, tag: tuple[int, int, int], body: memoryview, latency_ns: int) -> None:
        partition, start, end = tag
        result = rawkafka.parse_fetch_response(fetch_version, body, names)
        if result.error_code or len(result.partitions) != 1 or result.partitions[0].error_code:
            raise RuntimeError(f"fetch {filled.topic}-{partition}@{start}: error "
                               f"{result.error_code} {[p.error_code for p in result.partitions]}")
        got = result.partitions[0]
        reached = got.next_offset if got.next_offset is not None else start
        # Batches are contiguous from `start`: what goes past `end` belongs to the next request.
        outcome.records += got.record_count - max(0, reached - end)
        outcome.log_bytes += got.records_bytes
        if reached < end:
            outcome.refetches += 1
            pending[connection].appendleft((partition, reached, end))

    settings = benchnode.PipelineSettings(connections=connections, inflight=inflight)
    with benchnode.Pipeliner(target.host, target.port, settings) as pipeliner:
        stats = pipeliner.run(next_request, on_response, time.monotonic() + seconds)
    outcome.elapsed_s = stats.elapsed_s
    outcome.latencies_ns = stats.latencies_ns
    return outcome


def consume_confluent(target: benchnode.Target, filled: FilledTopic, seconds: float,
                      fetch_queue_backoff_ms: int) -> ConsumeOutcome:
    """confluent-kafka Consumer, assign at offset 0, consume() in batches until all records or `seconds`.

    librdkafka (>= 2.4) pauses a partition's fetching for fetch.queue.backoff.ms (default 1000) once its
    local queue passes queued.min.messages; with a consumer that drains fast, both client and node then
    sit idle most of the time (measured here: 0.15 cores, 145k records/s at the default, 0.7 cores and
    ~700k records/s at 1 ms), which measures librdkafka's pacing rather than the node."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": target.bootstrap, "group.id": f"consumer-perf-{os.getpid()}",
                         "enable.auto.commit": False, "enable.partition.eof": False,
                         "fetch.queue.backoff.ms": fetch_queue_backoff_ms})
    outcome = ConsumeOutcome()
    try:
        started = time.monotonic()
        deadline = started + seconds
        consumer.assign([TopicPartition(filled.topic, p, 0) for p in range(filled.partitions)])
        total = filled.records
        while outcome.records < total and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10000, timeout=min(0.5, max(0.0, deadline - time.monotonic()))):
                if msg.error():
                    raise KafkaException(msg.error())
                outcome.records += 1
        outcome.elapsed_s = time.monotonic() - started
    finally:
        consumer.close()
    outcome.log_bytes = outcome.records * filled.batch_bytes // filled.records_per_batch  # same layout as fetched
    return outcome


GROUP_JOIN_TIMEOUT_S = 60.0


def group_member(slot: benchnode.CountSlot, bootstrap: str, topic: str, group_id: str, fetch_queue_backoff_ms: int,
                 seconds: float) -> None:
    """One confluent-kafka group consumer (a CountingProcesses child): subscribe, count until stopped."""
    from confluent_kafka import Consumer, KafkaException

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id, "auto.offset.reset": "earliest",
                         "enable.auto.commit": True, "enable.partition.eof": False,
                         "fetch.queue.backoff.ms": fetch_queue_backoff_ms})
    try:
        consumer.subscribe([topic], on_assign=lambda _consumer, partitions: partitions and slot.ready())
        deadline = time.monotonic() + seconds
        while not slot.stopped() and time.monotonic() < deadline:
            messages = consumer.consume(num_messages=10000, timeout=0.1)
            if messages:
                received_ns = time.monotonic_ns()
                for msg in messages:
                    if msg.error():
                        raise KafkaException(msg.error())
                slot.add(len(messages), received_ns)
    finally:
        consumer.close()


def consume_group(target: benchnode.Target, filled: FilledTopic, consumers: int, seconds: float,
                  fetch_queue_backoff_ms: int) -> ConsumeOutcome:
    """`consumers` group consumers (processes) in a new group read the whole topic, bounded by `seconds` once
    they all hold partitions."""
    group = f"consumer-perf-group-{os.getpid()}-{consumers}-{time.monotonic_ns()}"
    with benchnode.CountingProcesses(group_member, consumers, target.bootstrap, filled.topic, group,
                                     fetch_queue_backoff_ms, GROUP_JOIN_TIMEOUT_S + seconds) as members:
        join_s = members.wait_ready(GROUP_JOIN_TIMEOUT_S)
        members.wait_for(filled.records, seconds)
    outcome = ConsumeOutcome(records=members.records(), elapsed_s=members.span_s(), join_s=round(join_s, 3))
    outcome.log_bytes = outcome.records * filled.batch_bytes // filled.records_per_batch
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.consumer_perf", description=__doc__.splitlines()[0])
    benchnode.add_common_arguments(parser, default_seconds=30.0)
    parser.add_argument("--client", choices=("raw", "confluent", "group"), help="default: raw and confluent")
    parser.add_argument("--consumers", type=int, default=1, help="group: consumers in the group (processes)")
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--batch-bytes", type=int, default=8192)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--connections", type=int, help="raw: sockets (default: one per partition)")
    parser.add_argument("--inflight", type=int, default=4, help="raw: fetches in flight per socket")
    # 4 MiB: at 1 MiB the Python client's per-response work, not the node, bounds the rate (measured:
    # 0.4-0.57 of the ceiling at 1 MiB with the client at 1 core and the node at 0.4; 0.98 at 4 MiB).
    parser.add_argument("--fetch-bytes", type=int, default=4 * 1024 * 1024, help="raw: bytes asked per fetch")
    parser.add_argument("--passes", type=int, default=3,
                        help="raw: read everything from offset 0 this many times (default %(default)s)")
    parser.add_argument("--fetch-queue-backoff-ms", type=int, default=1,
                        help="confluent: librdkafka fetch.queue.backoff.ms (its default, 1000, idles the consumer)")
    parser.add_argument("--fill-seconds", type=float, default=300.0, help="bound of the fill")
    parser.add_argument("--ceiling-seconds", type=float, help="minimum ceiling measurement (default min(2, --seconds))")
    parser.add_argument("--data-dir", help="with --bootstrap: the node's data dir, for the ceiling")
    parser.add_argument("--topic", default="consumer-perf")
    parser.add_argument("--fetch-version", type=int, default=FETCH_VERSION, choices=range(4, 18),
                        help="raw: Fetch version (default %(default)s; 12 is flexible)")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    recorder = results.Recorder(args, SCRIPT)
    connections = args.connections or args.partitions
    if min(args.records, args.record_size, args.batch_bytes, args.partitions, connections, args.inflight,
           args.fetch_bytes, args.passes, args.consumers) < 1 or args.seconds <= 0 or args.fill_seconds <= 0:
        parser.error("sizes, counts and durations must be positive")
    clients = [args.client] if args.client else ["raw", "confluent"]
    ceiling_settings = CeilingSettings(min_seconds=args.ceiling_seconds or min(2.0, args.seconds))

    with benchnode.node_for(args, data_dir=args.data_dir) as target:
        filled = fill_topic(target, f"{args.topic}-{os.getpid()}", args.records, args.partitions, args.record_size,
                            args.batch_bytes, args.fill_seconds)
        ceiling_mb_per_s = None
        if target.data_dir:
            sent, elapsed = sendfile_ceiling(segment_files(target.data_dir, filled.topic, filled.partitions),
                                             ceiling_settings)
            ceiling_mb_per_s = round(sent / elapsed / benchnode.MB, 3)
        for client in clients:
            meter = benchnode.CpuMeter(target.node)
            recorder.start()
            if client == "raw":
                with meter:
                    outcome = consume_raw(target, filled, args.fetch_bytes, connections, args.inflight, args.seconds,
                                          args.passes, fetch_version=args.fetch_version)
                expected = filled.records * args.passes
                extra = {"connections": connections, "inflight": args.inflight, "fetch_bytes": args.fetch_bytes,
                         "refetches": outcome.refetches, "passes": args.passes, "fetch_version": args.fetch_version}
            elif client == "confluent":
                with meter:
                    outcome = consume_confluent(target, filled, args.seconds, args.fetch_queue_backoff_ms)
                expected = filled.records
                extra = {"fetch_queue_backoff_ms": args.fetch_queue_backoff_ms}
            else:
                with meter:
                    outcome = consume_group(target, filled, args.consumers, args.seconds, args.fetch_queue_backoff_ms)
                expected = filled.records
                extra = {"fetch_queue_backoff_ms": args.fetch_queue_backoff_ms, "consumers": args.consumers,
                         "join_s": outcome.join_s}
            log_mb_per_s = outcome.log_bytes / outcome.elapsed_s / benchnode.MB if outcome.elapsed_s > 0 else None
            row = benchnode.result_row(
                SCRIPT, client, outcome.records, outcome.elapsed_s, outcome.records * filled.record_size,
                outcome.latencies_ns, ceiling_mb_per_s=ceiling_mb_per_s,
                log_mb_per_s=None if log_mb_per_s is None else round(log_mb_per_s, 3),
                ceiling_ratio=(round(log_mb_per_s / ceiling_mb_per_s, 4)
                               if ceiling_mb_per_s and log_mb_per_s is not None else None),
                complete=outcome.records >= expected, records_filled=filled.records,
                record_size=filled.record_size, partitions=filled.partitions,
                workers=None if args.bootstrap else args.workers, **meter.fields, **extra)
            benchnode.emit(row, args.json)
            recorder.record(row, outcome.latencies_ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
