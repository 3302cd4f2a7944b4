"""Share groups (KIP-932, queues) beside Redis Streams' consumer groups in the same run: records acknowledged
per second, the time from append to acknowledgement, and what the servers spend per record.

The node (--workers, 2 by default) holds a topic of --partitions partitions (3) read by --consumers (3)
confluent-kafka ShareConsumers of one share group, each in its own process: every poll (at most --batch
records, max.poll.records) is acknowledged record by record (ACCEPT; `--ack explicit`, the default, calls
acknowledge() on each message, `--ack implicit` lets the client accept them all) and committed with
commit_sync, which returns once the node answered the ShareAcknowledge. Redis (scripts/redis_peer.py) holds a
stream read by as many consumers in one consumer group, each in its own process (redis-py with hiredis):
XREADGROUP COUNT --batch, then one XACK naming every entry of that read, awaited: the same batches and the
same two round trips per batch as the share consumers.

One producer (in this process) appends 100-byte records (--record-size), each carrying its append time (the
monotonic clock, one for every process of the machine): to the node with confluent-kafka (acks=all), to
Redis with XADDs over raw RESP, the records due in one write (at most --chunk), replies taken as they come (as
librdkafka keeps Produce requests in flight; both bounded only by --max-lag). An acknowledgement's time is
taken when the consumer holds the server's answer to it; the latency of a record is that time less its append
time.

Workloads, each measured for --seconds, in turn with the same consumers, once every consumer has acknowledged
a record (a slow priming append makes sure the group has formed); after each window every record appended is
acknowledged before the next begins:
- throughput: the producer appends as fast as it goes while fewer than --max-lag records are appended and not
  yet acknowledged (the queue stays bounded, so the producer does not starve the consumers of the two shared
  cores): records/s acknowledged is what the consumers and the server can do; latency is mostly queueing
  (about max-lag / rate).
- paced: the producer offers --rate records/s on an absolute schedule: p50/p99 from append to acknowledgement
  at a load both sides carry.
Per row: records/s acknowledged in the window, p50/p99/p99.9 of the records appended in it (and its two parts:
append -> delivery, `deliver_*`, and the acknowledgement's round trip, `ack_*`), the server's CPU microseconds per
acknowledged record (user + system of its processes: the whole path, appends included, on both sides); for the
node also the timer's (its share-partition acquisition, the lock deadline every acquisition arms in its wheel,
the share state records, and the acks=all appends it holds until fsync'd) and the workers' (the Produce,
ShareFetch and ShareAcknowledge handlers and the reads of the acquired batches), per thread (schedstat).

What each side promises (`durability` in every row): the node answers acks=all appends and share
acknowledgements once they are fsync'd (the share state goes to the offsets log, group commit); Redis with
appendfsync always fsyncs its AOF before replying to XADD and XACK (the same promise), with everysec once a
second (a crash loses up to a second of appends and acknowledgements: acknowledged entries come back pending).

Runs (--runs, 3) alternate the systems (node, redis-always, redis-everysec, then the other way round, ...: each
system measures its workloads in its turn, on a new topic or stream and group); every run's rows are printed
(JSON lines with --json) and then a summary per workload: the medians over the runs and
node / Redis ratios (the median of each run's own ratio). Every server starts here on a free 127.0.0.1 port
with its own temp dir and is stopped by its pid; every wait is bounded.
Usage: .venv/bin/python -m scripts.bench_share [--runs 3] [--seconds 5] [--rate 2000] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from scripts import redis_peer
from scripts.harness import benchnode, servers
from scripts.harness.nodeproc import LOOPBACK

SCRIPT = "bench_share"
NODE, REDIS_ALWAYS, REDIS_EVERYSEC = "shmbroker", "redis-always", "redis-everysec"
SYSTEMS = (NODE, REDIS_ALWAYS, REDIS_EVERYSEC)
REDIS_FSYNC = {REDIS_ALWAYS: "always", REDIS_EVERYSEC: "everysec"}
WORKLOADS = ("throughput", "paced")
DURABILITY = {
    NODE: "appends acks=all and share acknowledgements answered once fsync'd",
    REDIS_ALWAYS: "appendfsync always: XADD and XACK answered once fsync'd",
    REDIS_EVERYSEC: "appendfsync everysec: a crash loses up to 1 s of XADDs and XACKs",
}
CLIENTS = {NODE: "confluent-share", REDIS_ALWAYS: "redis-py", REDIS_EVERYSEC: "redis-py"}
STAMP = struct.Struct(">q")  # a node record's value starts with its append time (monotonic ns)
POLL_S = 0.1  # a share consumer's poll timeout; XREADGROUP's BLOCK
COMMIT_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 60.0  # consumer processes started (imports, connections)
JOIN_TIMEOUT_S = 60.0  # every consumer acknowledged a priming record
PRIME_RATE = 200.0  # records/s appended until every consumer has one
DRAIN_TIMEOUT_S = 60.0  # after the window, for every appended record to be acknowledged
PRODUCER_NAP_S = 0.0005  # the producer's sleep when nothing is due or the queue is full
FLUSH_TIMEOUT_S = 60.0
LINGER_MS = 1  # the node producer's batching; Redis's pipelines hold what was due at once


def progress(line: str) -> None:
    print(f"{SCRIPT}: {line}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- consumer processes


class AckLog:
    """A consumer's record of what it acknowledged: per record its append time and when its acknowledgement was
    answered (monotonic ns), saved as one array for the parent when the consumer stops."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.appended = array("q")
        self.received = array("q")  # when the poll (XREADGROUP) that delivered it returned
        self.acked = array("q")
        self.errors = 0

    def add(self, stamps: list[int], received_ns: int, acked_ns: int) -> None:
        self.appended.extend(stamps)
        self.received.extend([received_ns] * len(stamps))
        self.acked.extend([acked_ns] * len(stamps))

    def save(self) -> None:
        np.savez(self.path, appended=np.frombuffer(self.appended, dtype=np.int64),
                 received=np.frombuffer(self.received, dtype=np.int64),
                 acked=np.frombuffer(self.acked, dtype=np.int64), errors=self.errors)


def share_consumer_child(slot: benchnode.CountSlot, bootstrap: str, group: str, topic: str, batch: int,
                         explicit: bool, path: str, seconds: float) -> None:
    """One share consumer (a CountingProcesses child): poll, acknowledge each record (ACCEPT), commit_sync."""
    from confluent_kafka import ShareConsumer

    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "max.poll.records": batch,
                              "share.acknowledgement.mode": "explicit" if explicit else "implicit"})
    log = AckLog(path)
    deadline = time.monotonic() + seconds
    try:
        consumer.subscribe([topic])
        slot.ready()
        while not slot.stopped() and time.monotonic() < deadline:
            messages = consumer.poll(POLL_S)
            if not messages:
                continue
            received_ns = time.monotonic_ns()
            stamps = []
            for message in messages:
                if message.error() is not None:
                    log.errors += 1
                    continue
                stamps.append(STAMP.unpack_from(message.value())[0])
                if explicit:
                    consumer.acknowledge(message)
            results = consumer.commit_sync(COMMIT_TIMEOUT_S)
            acked_ns = time.monotonic_ns()
            log.errors += sum(1 for error in results.values() if error is not None)
            log.add(stamps, received_ns, acked_ns)
            slot.add(len(stamps), acked_ns)
    finally:
        consumer.close()
        log.save()


def redis_consumer_child(slot: benchnode.CountSlot, port: int, stream: str, group: str, batch: int, path: str,
                         seconds: float) -> None:
    """One Redis consumer (a CountingProcesses child): XREADGROUP COUNT batch, then XACK of every entry read."""
    import redis

    client = redis.Redis(host=LOOPBACK, port=port, socket_timeout=redis_peer.COMMAND_TIMEOUT_S)
    name = f"consumer-{os.getpid()}"
    log = AckLog(path)
    deadline = time.monotonic() + seconds
    try:
        slot.ready()
        while not slot.stopped() and time.monotonic() < deadline:
            reply = client.xreadgroup(group, name, {stream: ">"}, count=batch, block=int(POLL_S * 1000))
            if not reply:
                continue
            received_ns = time.monotonic_ns()
            entries = reply[0][1]
            acked = client.xack(stream, group, *(entry_id for entry_id, _ in entries))
            acked_ns = time.monotonic_ns()
            log.errors += len(entries) - int(acked)
            log.add([int(fields[b"t"]) for _, fields in entries], received_ns, acked_ns)
            slot.add(len(entries), acked_ns)
    finally:
        client.close()
        log.save()


# --------------------------------------------------------------------------- producers


class NodeAppender:
    """confluent-kafka, acks=all: produce() is asynchronous; the stamp is taken as the record is handed over."""

    def __init__(self, bootstrap: str, topic: str, record_size: int) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.padding = b"x" * max(0, record_size - STAMP.size)
        self.failed = 0
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": LINGER_MS,
                                  "delivery.report.only.error": True, "on_delivery": self._delivered})

    def _delivered(self, error: Any, _message: Any) -> None:
        if error is not None:
            self.failed += 1

    def append(self, count: int) -> None:
        for _ in range(count):
            value = STAMP.pack(time.monotonic_ns()) + self.padding
            while True:
                try:
                    self.producer.produce(self.topic, value)
                    break
                except BufferError:
                    self.producer.poll(0.001)
        self.producer.poll(0)

    def idle(self) -> None:
        self.producer.poll(0)

    def flush(self) -> None:
        """Until every record handed over is answered (those still unanswered after FLUSH_TIMEOUT_S: failed)."""
        self.failed += self.producer.flush(FLUSH_TIMEOUT_S)

    def close(self) -> None:
        self.flush()


class RedisAppender:
    """XADDs over raw RESP (redis_peer.resp_command), stamped as each command is encoded: the records due go out
    in one write, and up to `max_unanswered` records may wait for their replies (Redis answers a batch after its
    fsync under appendfsync always), as librdkafka keeps several Produce requests in flight; replies are taken as
    they come."""

    def __init__(self, server: redis_peer.RedisServer, stream: str, record_size: int, max_unanswered: int) -> None:
        self.stream = stream.encode()
        self.padding = b"x" * max(0, record_size - 20)  # 19 digits of the stamp and a byte of field name each
        self.max_unanswered = max_unanswered
        self.failed = 0
        self.unanswered = 0
        self.sock = socket.create_connection((LOOPBACK, server.port), timeout=redis_peer.COMMAND_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.inbuf = bytearray()

    def append(self, count: int) -> None:
        self.sock.sendall(b"".join(redis_peer.resp_command(b"XADD", self.stream, b"*", b"t",
                                                           str(time.monotonic_ns()).encode(), b"p", self.padding)
                                   for _ in range(count)))
        self.unanswered += count
        self._receive(wait=False)
        while self.unanswered > self.max_unanswered:
            self._receive(wait=True)

    def _receive(self, wait: bool) -> None:
        """Read what arrived (waiting for it if `wait`: the socket's timeout bounds that), then count the whole
        replies off the unanswered XADDs."""
        if wait or select.select([self.sock], [], [], 0)[0]:
            data = self.sock.recv(1 << 16)
            if not data:
                raise RuntimeError("redis-server closed the producer's connection")
            self.inbuf += data
        while self.unanswered and (end := redis_peer.resp_end(self.inbuf)):
            self.failed += self.inbuf[0] == ord("-")
            del self.inbuf[:end]
            self.unanswered -= 1

    def idle(self) -> None:
        self._receive(wait=False)

    def flush(self) -> None:
        while self.unanswered:
            self._receive(wait=True)

    def close(self) -> None:
        self.sock.close()


@dataclass
class Window:
    started_ns: int
    ended_ns: int
    appended: int  # in the window

    @property
    def seconds(self) -> float:
        return (self.ended_ns - self.started_ns) / 1e9


def produce(appender: Any, acked: Callable[[], int], appended_before: int, seconds: float, rate: float,
            max_lag: int, chunk: int, until: Callable[[], bool] | None = None) -> Window:
    """Append for `seconds` (or until `until()` holds): at `rate` records/s on an absolute schedule, or as fast
    as the appender goes (rate 0); never more than `max_lag` appended and not yet acknowledged (`acked()`:
    acknowledged so far, of `appended_before` + what this call appends)."""
    started = time.monotonic_ns()
    end = started + int(seconds * 1e9)
    sent = 0
    while (now := time.monotonic_ns()) < end and not (until is not None and until()):
        due = int((now - started) * rate / 1e9) - sent if rate else chunk
        room = max_lag - (appended_before + sent - acked())
        count = min(due, room, chunk)
        if count <= 0:
            appender.idle()
            time.sleep(PRODUCER_NAP_S)
            continue
        appender.append(count)
        sent += count
    return Window(started, time.monotonic_ns(), sent)


# --------------------------------------------------------------------------- one measurement


class Systems:
    """The servers under test, each started once for all runs: the node and Redis with each appendfsync."""

    def __init__(self, node_target: benchnode.Target | None, redis: dict[str, redis_peer.RedisServer]) -> None:
        self.node_target, self.redis = node_target, redis

    def meter(self, system: str) -> Any:
        if system == NODE:
            return benchnode.CpuMeter(self.node_target.node)
        return servers.Spent(servers.of_redis(self.redis[system]))


def measure(systems: Systems, system: str, workloads: list[str], run_index: int, args: argparse.Namespace,
            out_dir: str) -> list[dict]:
    """One system's workloads, in turn, with one set of consumers: each workload's window is followed by a
    drain (every record appended so far acknowledged), so the windows never overlap. A row per workload."""
    name = f"share-{run_index}-{system}"
    paths = [os.path.join(out_dir, f"{name}-{i}.npz") for i in range(args.consumers)]
    life_s = READY_TIMEOUT_S + JOIN_TIMEOUT_S + len(workloads) * (args.seconds + DRAIN_TIMEOUT_S)
    if system == NODE:
        target = systems.node_target
        benchnode.create_topic(target.host, target.port, name, args.partitions)
        start_at_earliest(target.bootstrap, name)
        appender: Any = NodeAppender(target.bootstrap, name, args.record_size)
        child, child_args = share_consumer_child, [(target.bootstrap, name, name, args.batch,
                                                    args.ack == "explicit", path, life_s) for path in paths]
    else:
        server = systems.redis[system]
        client = server.client()
        client.xgroup_create(name, name, id="0", mkstream=True)
        client.close()
        appender = RedisAppender(server, name, args.record_size, args.max_lag)
        child, child_args = redis_consumer_child, [(server.port, name, name, args.batch, path, life_s)
                                                   for path in paths]
    windows: list[tuple[str, Window, Any]] = []
    try:
        with benchnode.CountingProcesses(_each_child, args.consumers, child, child_args) as procs:
            procs.wait_ready(READY_TIMEOUT_S)
            total = produce(appender, procs.records, 0, JOIN_TIMEOUT_S, PRIME_RATE, args.max_lag, 1,
                            until=lambda: all(procs.per_process())).appended
            if not all(procs.per_process()):
                raise RuntimeError(f"{system}: consumers with no record after {JOIN_TIMEOUT_S:.0f} s: "
                                   f"{procs.per_process()}")
            for workload in workloads:
                rate = args.rate if workload == "paced" else 0.0
                with systems.meter(system) as meter:
                    window = produce(appender, procs.records, total, args.seconds, rate, args.max_lag, args.chunk)
                windows.append((workload, window, meter))
                appender.flush()
                total += window.appended
                if procs.wait_for(total, DRAIN_TIMEOUT_S) < total:
                    raise RuntimeError(f"{system}: {procs.records()} of {total} records acknowledged after "
                                       f"{DRAIN_TIMEOUT_S:.0f} s")
    finally:
        appender.close()
    logs = []
    for path in paths:
        with np.load(path) as saved:
            logs.append((saved["appended"], saved["acked"], int(saved["errors"]), saved["received"]))
        os.unlink(path)
    appended_ns, acked_ns, received_ns = (np.concatenate([log[i] for log in logs]) for i in (0, 1, 3))
    errors = sum(log[2] for log in logs) + appender.failed
    return [window_row(system, workload, window, meter, run_index, args, logs, appended_ns, acked_ns, received_ns,
                       {"delivered": len(acked_ns), "appended": total, "errors": errors})
            for workload, window, meter in windows]


def window_row(system: str, workload: str, window: Window, meter: Any, run_index: int, args: argparse.Namespace,
               logs: list, appended_ns: np.ndarray, acked_ns: np.ndarray, received_ns: np.ndarray,
               totals: dict) -> dict:
    """The row of one workload's window: records acknowledged in it, latencies of the records appended in it
    (and their two parts: append -> delivery, and the acknowledgement's round trip)."""
    in_window = (acked_ns >= window.started_ns) & (acked_ns <= window.ended_ns)
    acked = int(in_window.sum())
    appended_in_window = (appended_ns >= window.started_ns) & (appended_ns <= window.ended_ns)
    latencies = (acked_ns - appended_ns)[appended_in_window]
    delivery = benchnode.percentiles_ms((received_ns - appended_ns)[appended_in_window])
    ack_trip = benchnode.percentiles_ms((acked_ns - received_ns)[appended_in_window])
    parts = {"deliver_p50_ms": delivery["p50_ms"], "deliver_p99_ms": delivery["p99_ms"],
             "ack_p50_ms": ack_trip["p50_ms"], "ack_p99_ms": ack_trip["p99_ms"]}
    per_process = [int(((log[1] >= window.started_ns) & (log[1] <= window.ended_ns)).sum()) for log in logs]
    if system == NODE:
        cpu = {**meter.per_op_fields(acked), "node_cores": meter.fields["node_cores"],
               "server_us_per_record": round(sum(meter.cpu_s.values()) / acked * 1e6, 3)
               if acked and meter.cpu_s else None}  # None for a node given by --bootstrap
    else:
        spent = meter.fields(acked)
        cpu = {"timer_us_per_op": None, "worker_us_per_op": None, "node_cores": None,
               "server_us_per_record": spent["cpu_us_per_op"]}
    rate = args.rate if workload == "paced" else None
    return benchnode.result_row(
        SCRIPT, CLIENTS[system], acked, window.seconds, acked * args.record_size, latencies, system=system,
        workload=workload, run=run_index, durability=DURABILITY[system], consumers=args.consumers,
        partitions=args.partitions if system == NODE else 1, batch=args.batch, ack=args.ack,
        offered_per_s=rate, appended_per_s=round(window.appended / window.seconds, 1),
        acked_per_consumer=per_process, appended_in_window=window.appended,
        acked_of_window=int(appended_in_window.sum()), **parts, **totals, **cpu)


def start_at_earliest(bootstrap: str, group: str) -> None:
    """The group's share-partitions start at the earliest offset (share.auto.offset.reset, a GROUP config), as a
    Redis group made at 0 does: the priming records appended before a consumer's first ShareFetch reach it."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    resource = ConfigResource("group", group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the answer came: its end fails the future
    admin.incremental_alter_configs([resource])[resource].result(timeout=COMMIT_TIMEOUT_S)


def _each_child(slot: benchnode.CountSlot, target: Callable[..., None], per_child: list[tuple]) -> None:
    """A CountingProcesses child running `target` with its own arguments (its slot's index picks them)."""
    target(slot, *per_child[slot.base // benchnode.CountSlot.FIELDS])


# --------------------------------------------------------------------------- runs and summary

FIGURES = ("records_per_s", "p50_ms", "p99_ms", "timer_us_per_op", "worker_us_per_op", "server_us_per_record")


def summarize(rows: list[dict], workload: str, systems: list[str]) -> dict:
    """Medians over the runs per system, and node / Redis as the median of each run's own ratio."""
    summary: dict[str, Any] = {"script": SCRIPT, "summary": True, "workload": workload,
                               "runs": len({r["run"] for r in rows})}
    by_system = {s: sorted((r for r in rows if r["workload"] == workload and r["system"] == s),
                           key=lambda r: r["run"]) for s in systems}
    for system, measured in by_system.items():
        for figure in FIGURES:
            values = [r[figure] for r in measured if r[figure] is not None]
            summary[f"{system}_{figure}"] = round(statistics.median(values), 3) if values else None
        summary[f"{system}_durability"] = DURABILITY[system]
    if NODE in by_system:
        for peer in (s for s in systems if s != NODE):
            for figure in ("records_per_s", "p50_ms", "p99_ms", "server_us_per_record"):
                ratios = [a[figure] / b[figure] for a, b in zip(by_system[NODE], by_system[peer])
                          if a[figure] is not None and b[figure]]
                summary[f"{figure}_node_over_{peer}"] = round(statistics.median(ratios), 3) if ratios else None
                summary[f"{figure}_node_over_{peer}_runs"] = [round(r, 3) for r in ratios]
    return summary


def print_table(summaries: list[dict], systems: list[str]) -> None:
    print(f"\n{'workload':10} {'system':15} {'records/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'timer us':>9} "
          f"{'workers us':>10} {'server us':>9}  (per record; medians of {summaries[0]['runs']} runs)")
    for summary in summaries:
        for system in systems:
            cells = [summary[f"{system}_{figure}"] for figure in FIGURES]
            print(f"{summary['workload']:10} {system:15} " + " ".join(
                f"{'-' if v is None else format(v, ',.1f' if i == 0 else '.3f'):>{w}}"
                for i, (v, w) in enumerate(zip(cells, (10, 8, 8, 9, 10, 9)))))
        for peer in (s for s in systems if s != NODE):
            if NODE in systems:
                print(f"{'':10} node / {peer}: records/s {summary[f'records_per_s_node_over_{peer}']}, "
                      f"p99 {summary[f'p99_ms_node_over_{peer}']}, "
                      f"server us/record {summary[f'server_us_per_record_node_over_{peer}']}")


@contextlib.contextmanager
def started(args: argparse.Namespace, systems: list[str]) -> Iterator[Systems]:
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(benchnode.node_for(args)) if NODE in systems else None
        redis = {s: stack.enter_context(redis_peer.redis_server(False, appendfsync=REDIS_FSYNC[s]))
                 for s in systems if s != NODE}
        yield Systems(target, redis)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m scripts.{SCRIPT}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="HOST:PORT of a running node on 127.0.0.1 (default: start one)")
    parser.add_argument("--workers", type=int, default=benchnode.DEFAULT_WORKERS,
                        help="network workers of the node started here (default %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of every system (default 3)")
    parser.add_argument("--seconds", type=float, default=5.0, help="the measured window of each workload")
    parser.add_argument("--workload", choices=WORKLOADS, action="append", help="default: both")
    parser.add_argument("--system", choices=SYSTEMS, action="append", help="default: all three")
    parser.add_argument("--partitions", type=int, default=3, help="of the node's topic")
    parser.add_argument("--consumers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=500, help="max.poll.records; XREADGROUP COUNT")
    parser.add_argument("--ack", choices=("explicit", "implicit"), default="explicit",
                        help="the share consumers' share.acknowledgement.mode (both ACCEPT every record)")
    parser.add_argument("--rate", type=float, default=2000.0, help="paced: records/s offered")
    parser.add_argument("--max-lag", type=int, default=20_000,
                        help="records appended and not yet acknowledged at most (both workloads)")
    parser.add_argument("--chunk", type=int, default=1000, help="records appended per producer step at most "
                        "(a Redis pipeline's XADDs)")
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="JSON lines: every run's rows, then the summaries")
    args = parser.parse_args(argv)
    if min(args.runs, args.partitions, args.consumers, args.batch, args.max_lag, args.chunk, args.workers) < 1 \
            or args.seconds <= 0 or args.rate <= 0 or args.record_size < STAMP.size:
        parser.error("counts, --seconds and --rate must be positive, --record-size at least 8")
    systems = list(args.system or SYSTEMS)
    workloads = list(args.workload or WORKLOADS)
    rows: list[dict] = []
    out_dir = tempfile.mkdtemp(prefix="shmbroker-bench-share-")
    try:
        with started(args, systems) as running:
            for run_index in range(args.runs):
                order = systems if run_index % 2 == 0 else systems[::-1]
                for system in order:
                    for row in measure(running, system, workloads, run_index, args, out_dir):
                        rows.append(row)
                        progress(f"run {run_index + 1}/{args.runs} {row['workload']} {system}: "
                                 f"{row['records_per_s']:,.0f} records/s acknowledged, p50 {row['p50_ms']} ms, "
                                 f"p99 {row['p99_ms']} ms, server {row['server_us_per_record']} us/record")
                        if args.json:
                            benchnode.emit(row, True)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    summaries = [summarize(rows, workload, systems) for workload in workloads]
    if args.json:
        for summary in summaries:
            benchnode.emit(summary, True)
    else:
        print_table(summaries, systems)
    return 0


if __name__ == "__main__":
    sys.exit(main())
