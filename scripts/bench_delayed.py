"""Delayed fetches in the live node: long-poll fan-out and expiry, the timer process's purgatory under load.

Two workloads over ``--waiters`` raw connections (one Fetch v11 waiting on each, spread over ``--partitions``
partitions of a new topic), ``--rounds`` times:
- ``fanout``: every waiter long-polls at the log end of its partition (max_wait ``--max-wait-ms``, large,
  min_bytes 1); once all are waiting (``--settle-ms``, no answer may come before), one Produce appends a
  record to every partition. Measured per round: the fan-out time, from sending the Produce until the last
  waiter holds its answer, and each waiter's latency (pooled over rounds for p50/p99/p99.9).
- ``expire``: every waiter asks with max_wait ``--expire-ms`` where nothing arrives; measured: how late
  past max_wait each answer comes (timer lateness as a client sees it: wheel, rings and worker together).
- ``offered`` (not run by default): the purgatory's saturation curve. Expiring long polls are offered at each
  of ``--rates`` fetches/s in turn, open loop, for ``--step-seconds`` each; per rate: offered vs completed
  per second, lateness past max_wait, and the timer's own lateness and expiries from the node's stats
  segment (see run_offered).
Node CPU (cores: CPU seconds per wall second, all node processes) is taken over the rounds (fanout: the settle
time included), and per operation: `timer_us_per_op` and `worker_us_per_op` are the timer's and the workers' CPU
microseconds per answered long poll (fanout: one an append completed; expire and offered: one that expired),
robust on a shared machine where cores are not. acks=all produces held by the timer: scripts/bench_acks.py
(`timer_us_per_request`).

The load generator is one process with every connection in one selector: its own time is in the figures,
the same for whatever node it runs against. Only 127.0.0.1; every wait is bounded.
Usage: .venv/bin/python -m scripts.bench_delayed [--waiters 1000] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import functools
import selectors
import socket
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from scripts.harness import benchnode, rawkafka

SCRIPT = "bench_delayed"
FETCH_VERSION = 11
PRODUCE_VERSION = 8
TOPIC = "bench-delayed"  # one topic per workload: expiring waiters must find nothing to read
CONNECT_TIMEOUT_S = 30.0
# offered: after a step's last send, how long answers still due are waited for.
OFFERED_DRAIN_S = 5.0
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


def kafka_answer_end(buf: bytearray) -> int:
    """Where the first whole Kafka response (size-prefixed) in `buf` ends; 0 while it is not whole."""
    if len(buf) < 4:
        return 0
    end = 4 + _SIZE.unpack_from(buf)[0]
    return end if len(buf) >= end else 0


@functools.lru_cache(maxsize=4096)
def fetch_frame(topic: str, partition: int, offset: int, max_wait_ms: int, correlation_id: int) -> bytes:
    body = rawkafka.fetch_body({topic: {partition: offset}}, max_wait_ms=max_wait_ms, min_bytes=1,
                               version=FETCH_VERSION)
    return rawkafka.encode_request(rawkafka.FETCH, FETCH_VERSION, correlation_id, body)


class Waiters:
    """N connections to one server, each with at most one request in flight; an answer is timed when it has
    arrived whole (`answer_end` says where the first whole answer in a connection's bytes ends: Kafka's size
    prefix by default, a RESP reply for Redis). Waiter i is on partition i % partitions."""

    def __init__(self, host: str, port: int, count: int, partitions: int = 1,
                 answer_end: Callable[[bytearray], int] = kafka_answer_end) -> None:
        self.answer_end = answer_end
        self.selector = selectors.DefaultSelector()
        self.waiters: list[Waiter] = []
        self.in_flight = 0
        self.answered: list[Waiter] = []  # answered since the caller last cleared it
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        try:
            for index in range(count):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"connected only {index} of {count} waiters in {CONNECT_TIMEOUT_S}s")
                sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setblocking(False)
                waiter = Waiter(sock, index % partitions)
                self.waiters.append(waiter)
                self.selector.register(sock, selectors.EVENT_READ, waiter)
        except BaseException:
            self.close()
            raise

    def send(self, waiter: Waiter, frame: bytes) -> None:
        # Stamped before the send: a load generator descheduled meanwhile makes an answer look later, never early.
        waiter.sent_at = time.monotonic_ns()
        sent = waiter.sock.send(frame)  # a small request into an empty socket buffer: all of it, as a rule
        if sent < len(frame):
            waiter.sock.setblocking(True)
            waiter.sock.sendall(frame[sent:])
            waiter.sock.setblocking(False)
        waiter.answered_at = 0
        self.in_flight += 1

    def send_fetches(self, topic: str, max_wait_ms: int, correlation_id: int) -> None:
        for waiter in self.waiters:
            self.send(waiter, fetch_frame(topic, waiter.partition, waiter.offset, max_wait_ms, correlation_id))

    def collect(self, timeout_s: float) -> int:
        """Read answers until none is in flight or timeout_s passes (one look at least); returns how many are
        still in flight."""
        deadline = time.monotonic() + timeout_s
        while True:
            for key, _ in self.selector.select(min(0.1, max(0.0, deadline - time.monotonic()))):
                waiter = key.data
                try:
                    data = waiter.sock.recv(RECV_BYTES)
                except BlockingIOError:
                    continue
                if not data:
                    raise RuntimeError("the server closed a waiter's connection")
                waiter.inbuf += data
                while end := self.answer_end(waiter.inbuf):
                    del waiter.inbuf[:end]
                    if not waiter.answered_at:
                        waiter.answered_at = time.monotonic_ns()
                        self.in_flight -= 1
                        self.answered.append(waiter)
            if not self.in_flight or time.monotonic() >= deadline:
                return self.in_flight

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


@dataclass
class FanoutOutcome:
    fanouts_ms: list[float] = field(default_factory=list)  # per round: the wake-up until the last answer
    latencies_ns: list[int] = field(default_factory=list)  # per waiter and round: the wake-up until its answer
    while_waiting: list[dict[str, Any]] = field(default_factory=list)  # per round
    memory: list[dict[str, int]] = field(default_factory=list)  # per round, while every waiter waits


def fanout_rounds(waiters: Waiters, rounds: int, settle_s: float, answer_timeout_s: float,
                  arm: Callable[[int], None], wake: Callable[[], int], label: str = "fanout",
                  while_waiting: Callable[[int], dict[str, Any]] | None = None,
                  memory: Callable[[], dict[str, int]] | None = None) -> FanoutOutcome:
    """Rounds of one fan-out, whatever the server: arm(round) sends every waiter its waiting request; after
    settle_s none may be answered; memory() and while_waiting(round) are taken while all wait (and still none
    may be answered after them); wake() makes one append and returns when it was sent (monotonic ns); then
    every waiter must be answered within answer_timeout_s."""
    outcome = FanoutOutcome()
    for round_index in range(rounds):
        arm(round_index)
        time.sleep(settle_s)
        if waiters.any_answered():
            raise RuntimeError(f"{label}: a waiter was answered before any append: the waiters are not waiting")
        if memory is not None:
            outcome.memory.append(memory())
        if while_waiting is not None:
            outcome.while_waiting.append(while_waiting(round_index))
            if waiters.any_answered():
                raise RuntimeError(f"{label}: a waiter was answered while waiting: the round is void")
        started = wake()
        left = waiters.collect(answer_timeout_s)
        if left:
            raise RuntimeError(f"{label} round {round_index}: {left} of {len(waiters.waiters)} waiters not answered")
        waiters.answered.clear()
        ends = np.array([w.answered_at for w in waiters.waiters], dtype=np.int64)
        outcome.fanouts_ms.append((int(ends.max()) - started) / 1e6)
        outcome.latencies_ns.extend((ends - started).tolist())
        progress(None, f"{label} round {round_index + 1}/{rounds}: {outcome.fanouts_ms[-1]:.1f} ms")
    return outcome


def run_fanout(args, target, while_waiting: Callable[[int], dict[str, Any]] | None = None,
               samples: list[int] | None = None, memory: Callable[[], dict[str, int]] | None = None) -> dict:
    """The fanout workload. `while_waiting(round)`, if given, runs once per round while every waiter waits (say,
    a producer on another topic); its fields are listed per round in the row. The server's memory (`memory()`,
    by default nodeproc.NodeProcess.memory when the node was started here) is taken at the same moment.
    `samples`, if given, receives every waiter's latency (ns)."""
    if memory is None and target.node is not None:
        memory = target.node.memory
    host, port, topic = target.host, target.port, f"{TOPIC}-fanout"
    benchnode.create_topic(host, port, topic, args.partitions)
    waiters = Waiters(host, port, args.waiters, args.partitions)

    def arm(round_index: int) -> None:
        for waiter in waiters.waiters:
            waiter.offset = round_index  # each round appended one record to every partition
        waiters.send_fetches(topic, args.max_wait_ms, round_index + 1)

    try:
        with benchnode.CpuMeter(target.node) as meter:
            outcome = fanout_rounds(waiters, args.rounds, args.settle_ms / 1000, args.max_wait_ms / 1000, arm,
                                    lambda: produce_one_each(host, port, topic, args.partitions),
                                    while_waiting=while_waiting, memory=memory)
    finally:
        waiters.close()
    if samples is not None:
        samples.extend(outcome.latencies_ns)
    extra: dict[str, Any] = {"while_waiting": outcome.while_waiting} if while_waiting is not None else {}
    if outcome.memory:
        extra["node_rss_bytes_max"] = max(m["rss_bytes"] for m in outcome.memory)
        extra["node_pss_bytes_max"] = max(m["pss_bytes"] for m in outcome.memory)
    fanouts_ms = outcome.fanouts_ms
    return benchnode.result_row(SCRIPT, "raw", args.waiters * args.rounds, sum(fanouts_ms) / 1000, None,
                                outcome.latencies_ns, workload="fanout", waiters=args.waiters,
                                partitions=args.partitions, rounds=args.rounds,
                                fanout_ms_median=round(float(np.median(fanouts_ms)), 3),
                                fanout_ms=[round(f, 3) for f in fanouts_ms], **extra, **meter.fields,
                                **meter.per_op_fields(len(outcome.latencies_ns)))


def run_expire(args, target) -> dict:
    host, port, topic = target.host, target.port, f"{TOPIC}-expire"
    benchnode.create_topic(host, port, topic, args.partitions)
    time.sleep(args.settle_ms / 1000)  # every worker learns of the new topic (else: an early UNKNOWN_TOPIC answer)
    lateness_ns = []
    waiters = Waiters(host, port, args.waiters, args.partitions)
    try:
        with benchnode.CpuMeter(target.node) as meter:
            for round_index in range(args.rounds):
                waiters.send_fetches(topic, args.expire_ms, round_index + 1)
                left = waiters.collect(args.expire_ms / 1000 + CONNECT_TIMEOUT_S)
                if left:
                    raise RuntimeError(f"round {round_index}: {left} of {args.waiters} waiters not answered")
                waiters.answered.clear()
                lateness_ns.extend(w.answered_at - w.sent_at - args.expire_ms * 1_000_000 for w in waiters.waiters)
                progress(args, f"expire round {round_index + 1}/{args.rounds}")
    finally:
        waiters.close()
    late = np.asarray(lateness_ns, dtype=np.int64)
    seconds = args.rounds * args.expire_ms / 1000
    return benchnode.result_row(SCRIPT, "raw", len(late), seconds, None, np.maximum(late, 1),
                                workload="expire", waiters=args.waiters, partitions=args.partitions,
                                rounds=args.rounds, expire_ms=args.expire_ms,
                                early_answers=int((late < -EARLY_TOLERANCE_NS).sum()), **meter.fields,
                                **meter.per_op_fields(len(late)))


class TimerStats:
    """The timer process's row of the node's stats segment (node.tools.inspect: read-only, no request to the node):
    one sample per publish interval of its lateness percentiles, and its fetch purgatory counters."""

    def __init__(self, data_dir: str) -> None:
        from shmbroker.node.tools.inspect import NodeReader

        self.reader = NodeReader.open(data_dir)
        self.published_ms = 0
        self.lateness_us: list[tuple[int, int]] = []  # (p50, p99) of each interval seen

    def timer_row(self) -> Any:
        return next(row for row in self.reader.rows() if row.role == "timer")

    def fetch_counts(self, timeout_s: float = 2.0) -> tuple[int, int]:
        """(expired, completed) fetches as of a publish made after this call: everything until now is in it."""
        published = self.timer_row().get("published_ms")
        deadline = time.monotonic() + timeout_s
        while (row := self.timer_row()).get("published_ms") == published and time.monotonic() < deadline:
            time.sleep(0.02)
        return row.get("purgatory_fetch_expired"), row.get("purgatory_fetch_completed")

    def sample(self) -> None:
        row = self.timer_row()
        if row.get("published_ms") != self.published_ms and row.get("timer_wakeups_late"):
            self.published_ms = row.get("published_ms")
            self.lateness_us.append((row.get("timer_lateness_p50_us"), row.get("timer_lateness_p99_us")))

    def close(self) -> None:
        self.reader.close()


def run_offered(args, target, server_cpu_s: Callable[[], float] | None = None) -> list[dict]:
    """The offered workload: long polls that expire (max_wait ``--expire-ms`` where nothing arrives) sent on an
    absolute schedule at each of ``--rates`` fetches/s for ``--step-seconds`` (open loop: a fetch is offered
    whether or not earlier ones were answered), over a pool of connections with one fetch in flight each
    (sized for the highest rate: rate x max_wait x 2; an offer finding every connection busy is counted as
    `unsent`). Per rate: offered, sent and completed per second (completed: answers arriving in the window
    [start + max_wait, start + max_wait + step], where every fetch of the step is due), lateness past max_wait
    as the client sees it, and, from the node's stats segment (when the node's data dir is known), the timer's
    own lateness (p50 median and p99 max over its publish intervals) and fetches expired per second;
    `server_cpu_s()`, if given, the server's CPU seconds so far: its cores over each step, and CPU per answer."""
    host, port, topic = target.host, target.port, f"{TOPIC}-offered"
    benchnode.create_topic(host, port, topic, args.partitions)
    time.sleep(args.settle_ms / 1000)
    rates = sorted(args.rates)
    pool = args.connections or int(max(rates) * args.expire_ms / 1000 * 2) + 64
    frames = [fetch_frame(topic, p, 0, args.expire_ms, 1) for p in range(args.partitions)]
    expire_ns = args.expire_ms * 1_000_000
    timer = TimerStats(target.data_dir) if target.data_dir else None
    waiters = Waiters(host, port, pool, args.partitions)
    idle = deque(waiters.waiters)
    rows = []
    try:
        for rate in rates:
            planned = max(1, int(rate * args.step_seconds))
            interval_ns = int(1e9 / rate)
            lateness_ns: list[int] = []
            sent = unsent = in_window = 0
            counts_before = timer.fetch_counts() if timer else None
            if timer:
                timer.lateness_us.clear()
            cpu_before = server_cpu_s() if server_cpu_s else 0.0
            with benchnode.CpuMeter(target.node) as meter:
                started = time.monotonic_ns()
                window = (started + expire_ns, started + expire_ns + int(args.step_seconds * 1e9))
                give_up = window[1] + int(OFFERED_DRAIN_S * 1e9)
                offered = 0
                while True:
                    now = time.monotonic_ns()
                    while offered < planned and started + offered * interval_ns <= now:
                        offered += 1
                        if idle:
                            waiter = idle.popleft()
                            waiters.send(waiter, frames[waiter.partition])
                            sent += 1
                        else:
                            unsent += 1
                    if (offered >= planned and not waiters.in_flight) or now > give_up:
                        break
                    next_send = started + offered * interval_ns if offered < planned else now + 50_000_000
                    waiters.collect(max(0, next_send - time.monotonic_ns()) / 1e9)
                    for waiter in waiters.answered:
                        lateness_ns.append(waiter.answered_at - waiter.sent_at - expire_ns)
                        in_window += window[0] <= waiter.answered_at <= window[1]
                        idle.append(waiter)
                    waiters.answered.clear()
                    if timer:
                        timer.sample()
            late = np.asarray(lateness_ns, dtype=np.int64)
            server = {}
            if server_cpu_s:
                used = server_cpu_s() - cpu_before
                server = {"server_cores": round(used / ((time.monotonic_ns() - started) / 1e9), 3),
                          "cpu_us_per_op": round(used / len(late) * 1e6, 3) if len(late) else None}
            row = benchnode.result_row(SCRIPT, "raw", len(late), args.step_seconds, None, np.maximum(late, 1),
                                       workload="offered", rate=rate, expire_ms=args.expire_ms,
                                       partitions=args.partitions, connections=pool,
                                       offered_per_s=round(planned / args.step_seconds, 1),
                                       sent_per_s=round(sent / args.step_seconds, 1), unsent=unsent,
                                       completed_per_s=round(in_window / args.step_seconds, 1),
                                       unanswered=waiters.in_flight,
                                       early_answers=int((late < -EARLY_TOLERANCE_NS).sum()), **meter.fields,
                                       **meter.per_op_fields(len(late)), **server)
            if timer:
                expired, completed = (after - before for after, before in zip(timer.fetch_counts(), counts_before))
                row["node_fetches_expired"] = expired
                row["node_fetches_completed"] = completed
                samples = timer.lateness_us
                row["timer_lateness_p50_us"] = int(np.median([p50 for p50, _ in samples])) if samples else None
                row["timer_lateness_p99_us"] = max(p99 for _, p99 in samples) if samples else None
            rows.append(row)
            progress(args, f"offered {rate:,.0f}/s: completed {row['completed_per_s']:,.0f}/s, lateness p99 "
                           f"{row['p99_ms']} ms")
            if waiters.in_flight:
                break  # the node no longer answers within the drain bound: higher rates would only pile up
    finally:
        waiters.close()
        if timer:
            timer.close()
    return rows


def progress(args, line: str) -> None:
    print(f"{SCRIPT}: {line}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_delayed", description=__doc__.split("\n")[0])
    benchnode.add_common_arguments(parser, default_seconds=60)
    parser.add_argument("--workload", choices=["fanout", "expire", "offered"], action="append",
                        help="default: fanout and expire")
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-wait-ms", type=int, default=30000, help="fanout: the waiters' max_wait")
    parser.add_argument("--settle-ms", type=int, default=500, help="fanout: time for every fetch to reach the timer")
    parser.add_argument("--expire-ms", type=int, default=200, help="expire: the waiters' max_wait")
    parser.add_argument("--rates", type=float, nargs="+", default=[1000, 2000, 5000, 10000, 20000],
                        help="offered: fetches per second offered, one step each")
    parser.add_argument("--step-seconds", type=float, default=5.0, help="offered: seconds per rate")
    parser.add_argument("--connections", type=int, help="offered: connection pool (default: sized for the top rate)")
    parser.add_argument("--config", default="", help="extra TOML for the node started here")
    args = parser.parse_args(argv)
    if args.waiters < 1 or args.rounds < 1 or args.partitions < 1:
        raise SystemExit("--waiters, --rounds and --partitions must be at least 1")
    if min(args.rates) <= 0 or args.step_seconds <= 0 or args.expire_ms < 1:
        raise SystemExit("--rates, --step-seconds and --expire-ms must be positive")
    runs = {"fanout": lambda: [run_fanout(args, target)], "expire": lambda: [run_expire(args, target)],
            "offered": lambda: run_offered(args, target)}
    with benchnode.node_for(args, config_toml=args.config) as target:
        for workload in args.workload or ["fanout", "expire"]:
            for row in runs[workload]():
                benchnode.emit(row, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
