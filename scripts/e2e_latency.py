"""End-to-end latency of the node: paced records, a long-polling consumer, produce-to-receive percentiles.

A producer thread sends one record every 1/``--rate`` seconds (default 1000/s: one per millisecond)
on an absolute schedule; each record's value starts with time.monotonic_ns() taken just before it is
handed to the client. The consumer, in the same process (so both read one monotonic clock), polls
with fetch.wait.max.ms = ``--fetch-wait-ms`` (large) and fetch.min.bytes = 1: its fetch waits in the
node's purgatory until an append wakes it. Latency = receive time - value timestamp, per record.
- ``--client confluent`` (default): confluent-kafka Producer (acks=1, linger.ms=0) and Consumer.
- ``--client raw``: a raw Produce connection (acks=1, one request per record, waiting for its ack)
  and a raw Fetch v11 long-poll loop that decodes the record values (node.storage.records).
Without ``--client`` both run. ``--producer-client X --consumer-client Y`` runs one pair of them, mixed: which
side a tail comes from (its row's client is "X->Y"). Records sent before the consumer received its first record, and
during ``--warmup-seconds`` after that, are not measured.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from shmbroker.node.storage import records
from shmbroker.clients import wire
from scripts.harness import benchnode, rawkafka, results

SCRIPT = "e2e_latency"
FETCH_VERSION = 11
PRODUCE_VERSION = 8
# Value prefix: monotonic send time (ns) and whether the record is measured (0 during warm-up).
STAMP = struct.Struct(">qB")


Sender = Callable[[bytes], None]  # hands one record's value to a producer
Poller = Callable[[], None]  # one consumer poll: the records it got measured


@dataclass(frozen=True)
class LatencyRun:
    topic: str
    rate: float = 1000.0
    seconds: float = 10.0
    warmup_seconds: float = 0.5
    record_size: int = 100
    fetch_wait_ms: int = 10_000
    # After the last send, how long the consumer may still wait for what is missing.
    drain_seconds: float = 5.0
    request_timeout_s: float = 30.0
    # The consumer must receive its first (warm-up) record within this long.
    ready_timeout_s: float = 30.0

    def value(self, measured: bool) -> bytes:
        stamp = STAMP.pack(time.monotonic_ns(), 1 if measured else 0)
        return stamp + bytes(max(0, self.record_size - len(stamp)))


@dataclass
class LatencyOutcome:
    sent: int = 0
    received: int = 0  # measured records received
    latencies_ns: list[int] = field(default_factory=list)
    send_errors: int = 0
    elapsed_s: float = 0.0  # first measured send to last measured receipt
    producer_error: BaseException | None = None
    ready: threading.Event = field(default_factory=threading.Event)  # the consumer received a record
    first_measured_send_ns: int = 0
    last_receive_ns: int = 0


def paced_sends(run: LatencyRun, send: Callable[[bytes], None], outcome: LatencyOutcome, stop: threading.Event) -> None:
    """Call send(value) at run.rate per second on an absolute schedule (late sends go at once,
    they are not skipped). Warm-up lasts until the consumer has received a record (a client may
    take a second to connect to the partition leader) and then run.warmup_seconds; after it,
    run.seconds * run.rate measured records are sent."""
    interval = 1.0 / run.rate
    measured_total = int(run.seconds * run.rate)
    started = time.monotonic()
    give_up = started + run.ready_timeout_s
    warm_until = None
    try:
        for i in itertools.count():
            if stop.is_set() or outcome.sent >= measured_total:
                return
            wait = started + i * interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            now = time.monotonic()
            if warm_until is None:
                if outcome.ready.is_set():
                    warm_until = now + run.warmup_seconds
                elif now > give_up:
                    raise RuntimeError(f"the consumer received nothing in {run.ready_timeout_s}s")
            measured = warm_until is not None and now >= warm_until
            if measured and not outcome.first_measured_send_ns:
                outcome.first_measured_send_ns = time.monotonic_ns()
            send(run.value(measured))
            outcome.sent += measured
    except BaseException as exc:  # the consumer loop re-raises it
        outcome.producer_error = exc


def _measure(outcome: LatencyOutcome, value: bytes | memoryview, received_ns: int) -> None:
    sent_ns, measured = STAMP.unpack_from(value, 0)
    outcome.ready.set()
    if measured:
        outcome.last_receive_ns = received_ns
        outcome.received += 1
        outcome.latencies_ns.append(received_ns - sent_ns)


def _consume_until(outcome: LatencyOutcome, producer: threading.Thread, run: LatencyRun,
                   poll_once: Callable[[], None]) -> None:
    """Run poll_once until every measured record arrived (the producer may still be waiting for its last
    record's acknowledgement: a long poll sent now would wait its whole fetch_wait_ms for nothing), or the
    producer is done and the drain bound passed."""
    started = time.monotonic()
    hard_stop = started + run.ready_timeout_s + run.warmup_seconds + run.seconds + run.drain_seconds \
        + run.request_timeout_s
    measured_total = int(run.seconds * run.rate)
    drain_until = None
    while time.monotonic() < hard_stop:
        if outcome.producer_error is not None:
            raise RuntimeError("producer failed") from outcome.producer_error
        if outcome.received >= measured_total:
            break
        if not producer.is_alive():
            if outcome.received >= outcome.sent:
                break
            drain_until = drain_until or time.monotonic() + run.drain_seconds
            if time.monotonic() > drain_until:
                break
        poll_once()
    if outcome.received:
        outcome.elapsed_s = (outcome.last_receive_ns - outcome.first_measured_send_ns) / 1e9


def _send_and_consume(run: LatencyRun, outcome: LatencyOutcome, send: Callable[[bytes], None],
                      poll_once: Callable[[], None], join_timeout_s: float) -> None:
    """paced_sends(send) in a thread while this one runs poll_once (_consume_until); the thread is stopped
    and joined however that ends."""
    stop = threading.Event()
    thread = threading.Thread(target=paced_sends, args=(run, send, outcome, stop), daemon=True)
    thread.start()
    try:
        _consume_until(outcome, thread, run, poll_once)
    finally:
        stop.set()
        thread.join(timeout=join_timeout_s)
    if outcome.producer_error is not None:  # the last send's, after its record arrived
        raise RuntimeError("producer failed") from outcome.producer_error


# --------------------------------------------------------------------------- confluent


@contextlib.contextmanager
def confluent_producer(target: benchnode.Target, run: LatencyRun, outcome: LatencyOutcome) -> Iterator[Sender]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": target.bootstrap, "acks": 1, "linger.ms": 0,
                         "enable.idempotence": False})

    def send(value: bytes) -> None:
        producer.produce(run.topic, value, partition=0)
        producer.poll(0)

    yield send
    producer.flush(run.request_timeout_s)


@contextlib.contextmanager
def confluent_consumer(target: benchnode.Target, run: LatencyRun, outcome: LatencyOutcome) -> Iterator[Poller]:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": target.bootstrap, "group.id": f"e2e-{os.getpid()}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": run.fetch_wait_ms,
                         "fetch.min.bytes": 1, "enable.partition.eof": False})
    try:
        consumer.assign([TopicPartition(run.topic, 0, 0)])

        def poll_once() -> None:
            msg = consumer.poll(0.1)
            if msg is None:
                return
            received_ns = time.monotonic_ns()
            if msg.error():
                raise KafkaException(msg.error())
            _measure(outcome, msg.value(), received_ns)

        yield poll_once
    finally:
        consumer.close()


# --------------------------------------------------------------------------- raw


def _produce_error(body: memoryview, topic: str) -> int:
    (code,) = struct.unpack_from(">h", body, 4 + 2 + len(topic.encode()) + 4 + 4)
    return code


class FetchFrame:
    """A Fetch v11 body for one partition, encoded once by rawkafka; only the fetch offset changes."""

    _SENTINEL = 0x0102030405060708

    def __init__(self, topic: str, partition: int, max_wait_ms: int, max_bytes: int = 1024 * 1024) -> None:
        def body(offset: int) -> bytes:
            return rawkafka.fetch_body({topic: {partition: offset}}, max_wait_ms=max_wait_ms, min_bytes=1,
                                       max_bytes=max_bytes, partition_max_bytes=max_bytes, version=FETCH_VERSION)

        self.body = bytearray(body(0))
        marked = body(self._SENTINEL)
        self.offset_at = marked.find(struct.pack(">q", self._SENTINEL))
        if self.offset_at < 0 or len(marked) != len(self.body):
            raise RuntimeError("cannot locate the fetch offset in the encoded request")

    def at(self, offset: int) -> bytes:
        struct.pack_into(">q", self.body, self.offset_at, offset)
        return bytes(self.body)


def fetched_values(partition: wire.FetchedPartition, fetch_offset: int) -> tuple[list[bytes | memoryview], int]:
    """The values an application gets from one partition's fetched record set, from `fetch_offset` on (no control
    record, none of an aborted transaction the answer lists), and the offset to fetch next."""
    values, next_offset = [], fetch_offset
    aborted = rawkafka.AbortedBatches(partition.aborted_transactions)
    record_set = partition.records
    for position, header in records.iter_batches(record_set):
        batch = record_set[position : position + header.size]
        if not aborted.skips(batch, header) and header.last_offset >= next_offset:  # else before the fetch offset
            values.extend(value for offset, _, value in records.iter_records(batch, header) if offset >= next_offset)
        next_offset = max(next_offset, header.last_offset + 1)
    return values, next_offset


def _raw_timeout_s(run: LatencyRun) -> float:
    return run.request_timeout_s + run.fetch_wait_ms / 1000


@contextlib.contextmanager
def raw_producer(target: benchnode.Target, run: LatencyRun, outcome: LatencyOutcome) -> Iterator[Sender]:
    with rawkafka.RawConnection(target.host, target.port, timeout_s=_raw_timeout_s(run)) as producer_conn:
        def send(value: bytes) -> None:
            batch = rawkafka.build_record_batch([value])
            body = rawkafka.produce_body({run.topic: {0: batch}}, acks=1)
            if _produce_error(producer_conn.request(rawkafka.PRODUCE, PRODUCE_VERSION, body), run.topic):
                outcome.send_errors += 1

        yield send


@contextlib.contextmanager
def raw_consumer(target: benchnode.Target, run: LatencyRun, outcome: LatencyOutcome) -> Iterator[Poller]:
    fetch = FetchFrame(run.topic, 0, run.fetch_wait_ms)
    with rawkafka.RawConnection(target.host, target.port, timeout_s=_raw_timeout_s(run)) as fetch_conn:
        next_offset = [0]

        def poll_once() -> None:
            body = fetch_conn.request(rawkafka.FETCH, FETCH_VERSION, fetch.at(next_offset[0]))
            received_ns = time.monotonic_ns()
            answer = wire.parse_fetch_response(body, 0, FETCH_VERSION)
            if answer.error_code or len(answer.partitions) != 1 or answer.partitions[0].error_code:
                raise RuntimeError(f"fetch error {answer.error_code} {[p.error_code for p in answer.partitions]}")
            values, next_offset[0] = fetched_values(answer.partitions[0], next_offset[0])
            for value in values:
                _measure(outcome, value, received_ns)

        yield poll_once


PRODUCERS = {"confluent": confluent_producer, "raw": raw_producer}
CONSUMERS = {"confluent": confluent_consumer, "raw": raw_consumer}


def run_clients(target: benchnode.Target, run: LatencyRun, producer: str, consumer: str) -> LatencyOutcome:
    """The paced producer of one client library, the long-polling consumer of one (the same or the other)."""
    outcome = LatencyOutcome()
    with PRODUCERS[producer](target, run, outcome) as send, CONSUMERS[consumer](target, run, outcome) as poll_once:
        _send_and_consume(run, outcome, send, poll_once, _raw_timeout_s(run))
    return outcome


def run_confluent(target: benchnode.Target, run: LatencyRun) -> LatencyOutcome:
    return run_clients(target, run, "confluent", "confluent")


def run_raw(target: benchnode.Target, run: LatencyRun) -> LatencyOutcome:
    return run_clients(target, run, "raw", "raw")


def client_label(producer: str, consumer: str) -> str:
    """A row's client: the library, or producer->consumer when they differ."""
    return producer if producer == consumer else f"{producer}->{consumer}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.e2e_latency", description=__doc__.splitlines()[0])
    benchnode.add_common_arguments(parser, default_seconds=10.0)
    parser.add_argument("--client", choices=("confluent", "raw"), help="default: both")
    parser.add_argument("--producer-client", choices=tuple(PRODUCERS),
                        help="with --consumer-client: one run with this producer (where the tail comes from)")
    parser.add_argument("--consumer-client", choices=tuple(CONSUMERS))
    parser.add_argument("--rate", type=float, default=1000.0, help="records per second (default %(default)s)")
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--fetch-wait-ms", type=int, default=10_000, help="consumer long-poll wait")
    parser.add_argument("--warmup-seconds", type=float, default=0.5)
    parser.add_argument("--topic", default="e2e-latency")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    recorder = results.Recorder(args, SCRIPT)
    if args.rate <= 0 or args.seconds <= 0 or args.record_size < STAMP.size or args.fetch_wait_ms < 0 \
            or args.warmup_seconds < 0:
        parser.error(f"--rate and --seconds must be positive, --record-size at least {STAMP.size}")
    if (args.producer_client is None) != (args.consumer_client is None):
        parser.error("--producer-client and --consumer-client go together")
    if args.producer_client:
        pairs = [(args.producer_client, args.consumer_client)]
    else:
        pairs = [(client, client) for client in ([args.client] if args.client else ["confluent", "raw"])]

    with benchnode.node_for(args) as target:
        for producer, consumer in pairs:
            client = client_label(producer, consumer)
            topic = f"{args.topic}-{producer}-{consumer}-{os.getpid()}"
            benchnode.create_topic(target.host, target.port, topic, 1)
            run = LatencyRun(topic, args.rate, args.seconds, args.warmup_seconds, args.record_size, args.fetch_wait_ms)
            recorder.start()
            with benchnode.CpuMeter(target.node) as meter:
                outcome = run_clients(target, run, producer, consumer)
            row = benchnode.result_row(
                SCRIPT, client, outcome.received, outcome.elapsed_s, outcome.received * args.record_size,
                outcome.latencies_ns, sent=outcome.sent, lost=outcome.sent - outcome.received,
                send_errors=outcome.send_errors, rate=args.rate, fetch_wait_ms=args.fetch_wait_ms,
                max_ms=round(max(outcome.latencies_ns) / 1e6, 4) if outcome.latencies_ns else None,
                workers=None if args.bootstrap else args.workers, **meter.fields)
            benchnode.emit(row, args.json)
            recorder.record(row, outcome.latencies_ns, load=args.rate, load_unit="records/s offered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
