"""Delayed fetches in the live node: long-poll fan-out and expiry, the timer process's purgatory under load.

Two workloads over ``--waiters`` raw connections (one Fetch v11 waiting on each, spread over ``--partitions``
partitions of a new topic), ``--rounds`` times:
- ``fanout``: every waiter long-polls at the log end of its partition (max_wait ``--max-wait-ms``, large,
  min_bytes 1); once all are waiting (``--settle-ms``, no answer may come before), one Produce appends a
  record to every partition. Measured per round: the fan-out time, from sending the Produce until the last
  waiter holds its answer, and each waiter's latency (pooled over rounds for p50/p99/p99.9).
- ``expire``: every waiter asks with max_wait ``--expire-ms`` where nothing arrives; measured: how late
  past max_wait each answer comes (timer lateness as a client sees it: wheel, rings and worker together).
Node CPU (cores: CPU seconds per wall second, all node processes) is taken over the rounds.

The load generator is one process with every connection in one selector: its own time is in the figures,
the same for whatever node it runs against. Only 127.0.0.1; every wait is bounded.
Usage: .venv/bin/python scripts/bench_delayed.py [--waiters 1000] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import struct
import sys
import time
from dataclasses import dataclass, field

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchnode  # noqa: E402
import rawkafka  # noqa: E402

SCRIPT = "bench_delayed"
FETCH_VERSION = 11
PRODUCE_VERSION = 8
TOPIC = "bench-delayed"  # one topic per workload: expiring waiters must find nothing to read
CONNECT_TIMEOUT_S = 30.0
RECV_BYTES = 1 << 16
# The node keeps deadlines in whole milliseconds (it truncates "now"): an answer up to 1 ms before max_wait
# is that rounding, not an early expiry.
EARLY_TOLERANCE_NS = 1_000_000
_SIZE = struct.Struct(">i")
_SIZE_AND_CORRELATION = struct.Struct(">ii")


@dataclass
class Waiter:
    sock: socket.socket
    partition: int
    offset: int = 0
    inbuf: bytearray = field(default_factory=bytearray)
    sent_at: int = 0
    answered_at: int = 0


class Waiters:
    """N connections, each with at most one Fetch in flight; answers are timed by arrival."""

    def __init__(self, host: str, port: int, count: int, topic: str, partitions: int) -> None:
        self.topic = topic
        self.selector = selectors.DefaultSelector()
        self.waiters: list[Waiter] = []
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        for index in range(count):
            if time.monotonic() > deadline:
                raise RuntimeError(f"connected only {index} of {count} waiters in {CONNECT_TIMEOUT_S}s")
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            waiter = Waiter(sock, index % partitions)
            self.waiters.append(waiter)
            self.selector.register(sock, selectors.EVENT_READ, waiter)

    def send_fetches(self, max_wait_ms: int, correlation_id: int) -> None:
        for waiter in self.waiters:
            body = rawkafka.fetch_body({self.topic: {waiter.partition: waiter.offset}}, max_wait_ms=max_wait_ms,
                                       min_bytes=1, version=FETCH_VERSION)
            frame = rawkafka.encode_request(rawkafka.FETCH, FETCH_VERSION, correlation_id, body)
            waiter.sock.setblocking(True)
            waiter.sock.sendall(frame)
            waiter.sock.setblocking(False)
            waiter.sent_at = time.monotonic_ns()
            waiter.answered_at = 0

    def collect(self, timeout_s: float) -> int:
        """Read answers until every waiter has one or timeout_s passes; returns how many answered."""
        pending = sum(1 for w in self.waiters if not w.answered_at)
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for key, _ in self.selector.select(min(0.1, max(0.0, deadline - time.monotonic()))):
                waiter = key.data
                try:
                    data = waiter.sock.recv(RECV_BYTES)
                except BlockingIOError:
                    continue
                if not data:
                    raise RuntimeError("the node closed a waiter's connection")
                waiter.inbuf += data
                while len(waiter.inbuf) >= 4:
                    size = _SIZE.unpack_from(waiter.inbuf)[0]
                    if len(waiter.inbuf) < 4 + size:
                        break
                    del waiter.inbuf[:4 + size]
                    if not waiter.answered_at:
                        waiter.answered_at = time.monotonic_ns()
                        pending -= 1
        return len(self.waiters) - pending

    def any_answered(self) -> bool:
        self.collect(0)
        return any(w.answered_at for w in self.waiters)

    def close(self) -> None:
        for waiter in self.waiters:
            waiter.sock.close()
        self.selector.close()


def produce_one_each(host: str, port: int, topic: str, partitions: int) -> int:
    """One Produce (acks=1) of one record to every partition; returns its send time (ns)."""
    batch = rawkafka.build_record_batch([b"wake"])
    body = rawkafka.produce_body({topic: {p: batch for p in range(partitions)}}, acks=1)
    with rawkafka.RawConnection(host, port) as conn:
        started = time.monotonic_ns()
        conn.send(rawkafka.PRODUCE, PRODUCE_VERSION, body)
        conn.recv_response()
    return started


def run_fanout(args, target) -> dict:
    host, port, topic = target.host, target.port, f"{TOPIC}-fanout"
    benchnode.create_topic(host, port, topic, args.partitions)
    fanouts_ms, latencies_ns = [], []
    waiters = Waiters(host, port, args.waiters, topic, args.partitions)
    try:
        with benchnode.CpuMeter(target.node) as meter:
            for round_index in range(args.rounds):
                waiters.send_fetches(args.max_wait_ms, round_index + 1)
                time.sleep(args.settle_ms / 1000)
                if waiters.any_answered():
                    raise RuntimeError("a long poll was answered before any append: the waiters are not waiting")
                started = produce_one_each(host, port, topic, args.partitions)
                answered = waiters.collect(args.max_wait_ms / 1000)
                if answered != args.waiters:
                    raise RuntimeError(f"round {round_index}: only {answered} of {args.waiters} waiters answered")
                ends = np.array([w.answered_at for w in waiters.waiters], dtype=np.int64)
                fanouts_ms.append((int(ends.max()) - started) / 1e6)
                latencies_ns.extend((ends - started).tolist())
                for waiter in waiters.waiters:
                    waiter.offset += 1
                progress(args, f"fanout round {round_index + 1}/{args.rounds}: {fanouts_ms[-1]:.1f} ms")
    finally:
        waiters.close()
    seconds = sum(fanouts_ms) / 1000
    return benchnode.result_row(SCRIPT, "raw", args.waiters * args.rounds, seconds, None, latencies_ns,
                                workload="fanout", waiters=args.waiters, partitions=args.partitions,
                                rounds=args.rounds, fanout_ms_median=round(float(np.median(fanouts_ms)), 3),
                                fanout_ms=[round(f, 3) for f in fanouts_ms], **meter.fields)


def run_expire(args, target) -> dict:
    host, port, topic = target.host, target.port, f"{TOPIC}-expire"
    benchnode.create_topic(host, port, topic, args.partitions)
    time.sleep(args.settle_ms / 1000)  # every worker learns of the new topic (else: an early UNKNOWN_TOPIC answer)
    lateness_ns = []
    waiters = Waiters(host, port, args.waiters, topic, args.partitions)
    try:
        with benchnode.CpuMeter(target.node) as meter:
            for round_index in range(args.rounds):
                waiters.send_fetches(args.expire_ms, round_index + 1)
                answered = waiters.collect(args.expire_ms / 1000 + CONNECT_TIMEOUT_S)
                if answered != args.waiters:
                    raise RuntimeError(f"round {round_index}: only {answered} of {args.waiters} waiters answered")
                lateness_ns.extend(w.answered_at - w.sent_at - args.expire_ms * 1_000_000 for w in waiters.waiters)
                progress(args, f"expire round {round_index + 1}/{args.rounds}")
    finally:
        waiters.close()
    late = np.asarray(lateness_ns, dtype=np.int64)
    seconds = args.rounds * args.expire_ms / 1000
    return benchnode.result_row(SCRIPT, "raw", len(late), seconds, None, np.maximum(late, 1),
                                workload="expire", waiters=args.waiters, partitions=args.partitions,
                                rounds=args.rounds, expire_ms=args.expire_ms,
                                early_answers=int((late < -EARLY_TOLERANCE_NS).sum()), **meter.fields)


def progress(args, line: str) -> None:
    print(f"{SCRIPT}: {line}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    benchnode.add_common_arguments(parser, default_seconds=60)
    parser.add_argument("--workload", choices=["fanout", "expire"], action="append",
                        help="default: both")
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-wait-ms", type=int, default=30000, help="fanout: the waiters' max_wait")
    parser.add_argument("--settle-ms", type=int, default=500, help="fanout: time for every fetch to reach the timer")
    parser.add_argument("--expire-ms", type=int, default=200, help="expire: the waiters' max_wait")
    parser.add_argument("--config", default="", help="extra TOML for the node started here")
    args = parser.parse_args(argv)
    if args.waiters < 1 or args.rounds < 1 or args.partitions < 1:
        raise SystemExit("--waiters, --rounds and --partitions must be at least 1")
    with benchnode.node_for(args, config_toml=args.config) as target:
        for workload in args.workload or ["fanout", "expire"]:
            row = run_fanout(args, target) if workload == "fanout" else run_expire(args, target)
            benchnode.emit(row, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
