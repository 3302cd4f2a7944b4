"""Shared harness of the node benchmarks (producer_perf, consumer_perf, e2e_latency).

- ``node_for(args)``: the node under test: a real node started with scripts/harness/nodeproc.py (the one launcher
  of tests and benchmarks) on a free 127.0.0.1 port with a temporary data dir, or ``--bootstrap``.
- ``Pipeliner``: the raw load generators' request loop: several connections, a fixed number of
  requests in flight on each, responses matched by correlation id, per-request latency.
- ``result_row`` / ``emit``: the JSON line every benchmark prints; ``percentiles_ms``; ``CpuMeter``.
- ``create_topic``: CreateTopics + wait until Metadata shows the partitions.
- ``CountingProcesses``: consumer processes (of the node or of a peer) that count what they receive into
  shared memory while the parent watches the total; ``paced_calls``: a call at a fixed rate, timed.

Invariants:
- Only 127.0.0.1 is ever contacted (``parse_bootstrap`` refuses any other host).
- A node started here is stopped by its pid with SIGTERM (SIGKILL of its process tree only if it
  does not exit in time); shared memory a hard kill left is removed, and its temp dir. If the
  benchmark process dies, the kernel sends the node SIGTERM (PR_SET_PDEATHSIG).
- Every wait here is bounded in time; every loop bounded in count or time.
- The ``Pipeliner`` never keeps more than ``inflight`` requests outstanding per connection and
  hands each response body to its callback exactly once, in request order per connection; the
  body view is valid only during the callback.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import selectors
import signal
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import orjson
import psutil

from scripts.harness import rawkafka
from scripts.harness.nodeproc import CLI, LOOPBACK, NodeProcess

_LOOPBACK_NAMES = {"127.0.0.1", "localhost"}
# Fields every benchmark JSON line has (null where not measured).
RESULT_FIELDS = ("script", "client", "records", "records_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms")
MB = 1_000_000  # MB/s as Kafka's perf tools report it (10^6 bytes)


# --------------------------------------------------------------------------- node process

DEFAULT_WORKERS = 2


def parse_bootstrap(text: str) -> tuple[str, int]:
    """'HOST:PORT' with HOST a loopback name; any other host is refused (benchmarks stay on 127.0.0.1)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise SystemExit(f"--bootstrap wants HOST:PORT, got {text!r}")
    if host not in _LOOPBACK_NAMES:
        raise SystemExit(f"--bootstrap must be on 127.0.0.1 (benchmarks use loopback only), got {host!r}")
    return LOOPBACK, int(port)


@dataclass
class Target:
    """Where a benchmark sends its traffic, and the node (if it started one)."""

    host: str
    port: int
    data_dir: str | None  # the node's data dir, when known (for reading segment files)
    node: NodeProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


def add_common_arguments(parser: Any, default_seconds: float) -> None:
    parser.add_argument("--bootstrap", help="HOST:PORT of a running node on 127.0.0.1 (default: start one)")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                        help="network workers of the node started here (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=default_seconds,
                        help="upper bound of each measurement (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--node-cpus", type=cpu_list, help="CPUs of the node started here (taskset -c's list, "
                        "e.g. 0 or 0-2): with --client-cpus, node and load generator apart")
    parser.add_argument("--client-cpus", type=cpu_list, help="CPUs of this load generator (and its children)")


def cpu_list(text: str) -> set[int]:
    """A taskset -c style list of CPUs ("0", "0,2", "1-3") as a set, each CPU one this machine has."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a CPU list such as 0 or 0,2 or 1-3") from None
    missing = cpus - os.sched_getaffinity(0)
    if not cpus or missing:
        raise argparse.ArgumentTypeError(f"{text!r}: CPUs {sorted(missing)} are not available here")
    return cpus


def _sigterm_as_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def node_for(args: Any, data_dir: str | None = None, config_toml: str = "") -> Iterator[Target]:
    """The node under test: ``--bootstrap`` if given, else a node started (and stopped) here.
    SIGTERM to the benchmark becomes SystemExit, so the node is still stopped cleanly."""
    signal.signal(signal.SIGTERM, _sigterm_as_exit)
    if args.bootstrap:
        host, port = parse_bootstrap(args.bootstrap)
        yield Target(host, port, data_dir)
        return
    if args.workers < 1:
        raise SystemExit("--workers must be at least 1")
    node_cpus, client_cpus = getattr(args, "node_cpus", None), getattr(args, "client_cpus", None)
    # taskset execs the node's command: the pid NodeProcess holds is the node's, its children inherit the CPUs.
    command = ["taskset", "-c", ",".join(map(str, sorted(node_cpus))), *CLI] if node_cpus else None
    with NodeProcess(workers=args.workers, config=config_toml, announce=True, command=command) as node:
        if client_cpus:
            os.sched_setaffinity(0, client_cpus)  # this process's threads and the children it starts from now on
        yield Target(LOOPBACK, node.port, str(node.data_dir), node)


class CpuMeter:
    """CPU used during a measurement, in cores (CPU seconds per wall second): by this process
    (its threads included, load generator child processes not) and by the node's processes,
    when the node was started here, in all and per role (timer, workers). Tells which side a figure
    is limited by on a small machine."""

    def __init__(self, node: NodeProcess | None) -> None:
        self.node = node
        self.fields: dict[str, float | None] = {"client_cores": None, "node_cores": None,
                                                "timer_cores": None, "worker_cores": None}
        self.cpu_s: dict[str, float] = {}  # CPU seconds used per role (timer, worker, supervisor) once exited
        self._threads: dict[int, dict[int, int]] = {}

    def _node_cpu(self) -> dict[int, tuple[str, float]]:
        if self.node is None or self.node.proc is None:
            return {}
        roles = {pid: role for role in ("timer", "worker") for pid in self.node.pids(role)}
        found = {}
        for pid in [self.node.proc.pid] + self.node.pids():
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                found[pid] = (roles.get(pid, "supervisor"), times.user + times.system)
        return found

    @staticmethod
    def _thread_cpu_ns(pid: int) -> dict[int, int]:
        """CPU nanoseconds of each live thread of `pid` (/proc/PID/task/TID/schedstat: exact, where cpu_times()
        counts 10 ms ticks, too coarse for the timer's share of a short step); {} if unreadable."""
        found = {}
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                        found[int(tid)] = int(stat.read().split()[0])
        return found

    def __enter__(self) -> CpuMeter:
        self._wall = time.monotonic()
        self._self = time.process_time()
        self._node = self._node_cpu()
        self._threads = {pid: self._thread_cpu_ns(pid) for pid in self._node}
        return self

    def __exit__(self, *exc: Any) -> None:
        wall = time.monotonic() - self._wall
        if wall <= 0:
            return
        self.fields["client_cores"] = round((time.process_time() - self._self) / wall, 3)
        if self.node is not None:
            used: dict[str, float] = {}
            for pid, (role, cpu) in self._node_cpu().items():
                used[role] = used.get(role, 0.0) + cpu - self._node.get(pid, (role, 0.0))[1]
            self.fields["node_cores"] = round(sum(used.values()) / wall, 3)
            self.fields["timer_cores"] = round(used.get("timer", 0.0) / wall, 3)
            self.fields["worker_cores"] = round(used.get("worker", 0.0) / wall, 3)
            # Per operation, the exact per-thread figures (a thread that ended during the step is missed: the
            # node's threads live as long as their process).
            exact: dict[str, float] = {}
            for pid, (role, _) in self._node.items():
                before = self._threads.get(pid, {})
                after = self._thread_cpu_ns(pid)
                if not after:
                    exact = {}
                    break
                exact[role] = exact.get(role, 0.0) + sum(ns - before.get(tid, 0) for tid, ns in after.items()) / 1e9
                if role == "timer":  # its main thread runs the loop; the others are the group commit's syncs
                    exact["timer_loop"] = (after.get(pid, 0) - before.get(pid, 0)) / 1e9
            self.cpu_s = exact or used

    def per_op_fields(self, operations: int) -> dict[str, float | None]:
        """The timer's and the workers' CPU microseconds per operation over the measurement (None when the node
        was not started here or no operation completed): what an operation costs, whatever else the shared
        machine runs meanwhile, and whatever the wall time (idle ticks in the measurement are included)."""
        fields: dict[str, float | None] = {"timer_us_per_op": None, "timer_loop_us_per_op": None,
                                           "worker_us_per_op": None}
        if self.node is not None and self.cpu_s and operations > 0:
            fields["timer_us_per_op"] = round(self.cpu_s.get("timer", 0.0) / operations * 1e6, 3)
            if "timer_loop" in self.cpu_s:  # the timer's main thread alone (the rest: its fsync threads)
                fields["timer_loop_us_per_op"] = round(self.cpu_s["timer_loop"] / operations * 1e6, 3)
            fields["worker_us_per_op"] = round(self.cpu_s.get("worker", 0.0) / operations * 1e6, 3)
        return fields


# --------------------------------------------------------------------------- topics


def create_topic(host: str, port: int, topic: str, partitions: int, timeout_s: float = 30.0) -> None:
    """Create `topic` (an existing one is accepted) and wait until Metadata lists all its partitions and each
    partition's leader answers ListOffsets: Apache Kafka lists a new partition a moment before its broker has
    taken the leadership, and refuses produces (NOT_LEADER_OR_FOLLOWER) until then."""
    deadline = time.monotonic() + timeout_s
    with rawkafka.RawConnection(host, port, timeout_s=timeout_s) as conn:
        created = conn.call(rawkafka.CREATE_TOPICS, 4, rawkafka.create_topics_body({topic: partitions}))
        for result in created.topics:
            if int(result.error_code) not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS
                raise RuntimeError(f"CreateTopics {topic}: error {int(result.error_code)} {result.error_message}")
        while time.monotonic() < deadline:
            meta = conn.call(rawkafka.METADATA, 8, rawkafka.metadata_body([topic], allow_auto_topic_creation=False))
            found = [t for t in meta.topics if t.name == topic and int(t.error_code) == 0]
            if found and len(found[0].partitions) >= partitions and _led(conn, topic, partitions):
                return
            time.sleep(0.05)
    raise RuntimeError(f"topic {topic} did not show {partitions} partitions in {timeout_s}s")


FIND_COORDINATOR, OFFSET_FETCH = 10, 9  # Kafka API keys
COORDINATOR_RETRY_S = 0.1


def wait_for_group_coordinator(host: str, port: int, groups: Sequence[str], timeout_s: float = 60.0) -> None:
    """Until the broker coordinates every one of `groups` and has loaded their state (OffsetFetch answers them):
    Apache Kafka makes __consumer_offsets on the first FindCoordinator and answers NOT_COORDINATOR or
    COORDINATOR_LOAD_IN_PROGRESS until its partitions are loaded."""
    from kio.static.primitive import i8

    deadline = time.monotonic() + timeout_s
    find = rawkafka.request_body(FIND_COORDINATOR, 4, "FindCoordinatorRequest", key_type=i8(0),
                                 coordinator_keys=tuple(groups))
    fetch = rawkafka.request_body(OFFSET_FETCH, 8, "OffsetFetchRequest", require_stable=False, groups=tuple(
        rawkafka.request_entity(OFFSET_FETCH, 8, "OffsetFetchRequestGroup", group_id=group, topics=None)
        for group in groups))
    with rawkafka.RawConnection(host, port, timeout_s=timeout_s) as conn:
        while time.monotonic() < deadline:
            found = conn.call(FIND_COORDINATOR, 4, find)
            if all(int(c.error_code) == 0 for c in found.coordinators):
                fetched = conn.call(OFFSET_FETCH, 8, fetch)
                if all(int(g.error_code) == 0 for g in fetched.groups):
                    return
            time.sleep(COORDINATOR_RETRY_S)
    raise RuntimeError(f"no coordinator for {len(groups)} groups in {timeout_s}s")


def _led(conn: rawkafka.RawConnection, topic: str, partitions: int) -> bool:
    answer = conn.call(rawkafka.LIST_OFFSETS, 5, rawkafka.list_offsets_body({topic: range(partitions)}))
    return all(int(p.error_code) == 0 for t in answer.topics for p in t.partitions)


def delete_topic(host: str, port: int, topic: str, timeout_s: float = 30.0) -> None:
    """Delete `topic` (its files go with the answer)."""
    with rawkafka.RawConnection(host, port, timeout_s=timeout_s) as conn:
        deleted = conn.call(rawkafka.DELETE_TOPICS, 3, rawkafka.delete_topics_body([topic], int(timeout_s * 1000)))
        for result in deleted.responses:
            if int(result.error_code) != 0:
                raise RuntimeError(f"DeleteTopics {topic}: error {int(result.error_code)}")


# --------------------------------------------------------------------------- results


def fdatasync_floor_ms(data_dir: str | None, write_bytes: int, count: int = 50) -> float | None:
    """Median ms of one fdatasync after a write of `write_bytes`, in a temp file beside `data_dir` (the node's
    filesystem): the disk's floor under an acks=all answer, measured in the same run as the node. None
    without a data dir (a node given by --bootstrap)."""
    if data_dir is None:
        return None
    import tempfile

    fd, path = tempfile.mkstemp(prefix="fsync-floor-", dir=os.path.dirname(os.path.abspath(data_dir)))
    try:
        samples = []
        chunk = b"\0" * write_bytes
        for _ in range(count):
            os.write(fd, chunk)
            started = time.perf_counter_ns()
            os.fdatasync(fd)
            samples.append(time.perf_counter_ns() - started)
        return round(float(np.median(samples)) / 1e6, 3)
    finally:
        os.close(fd)
        os.unlink(path)


def percentiles_ms(latencies_ns: Sequence[int] | np.ndarray) -> dict[str, float | None]:
    """p50/p99/p99.9 in milliseconds (None when there are no samples)."""
    if len(latencies_ns) == 0:
        return {"p50_ms": None, "p99_ms": None, "p999_ms": None}
    values = np.percentile(np.asarray(latencies_ns, dtype=np.float64), [50, 99, 99.9]) / 1e6
    return {"p50_ms": round(float(values[0]), 4), "p99_ms": round(float(values[1]), 4),
            "p999_ms": round(float(values[2]), 4)}


def result_row(script: str, client: str, records: int, seconds: float, data_bytes: int | None,
               latencies_ns: Sequence[int] | np.ndarray | None = None, **extra: Any) -> dict[str, Any]:
    """One benchmark result; mb_per_s is `data_bytes` (None: not measured) per second in 10^6 bytes."""
    row: dict[str, Any] = {"script": script, "client": client, "records": int(records),
                           "records_per_s": round(records / seconds, 1) if seconds > 0 else None,
                           "mb_per_s": (round(data_bytes / seconds / MB, 3)
                                        if data_bytes is not None and seconds > 0 else None)}
    row.update(percentiles_ms(latencies_ns if latencies_ns is not None else ()))
    row["seconds"] = round(seconds, 3)
    row.update(extra)
    return row


def produce_when_room(producer: Any, topic: str, value: bytes) -> None:
    """confluent-kafka's produce, waiting on delivery reports while its local queue is full."""
    while True:
        try:
            producer.produce(topic, value)
            return
        except BufferError:
            producer.poll(0.01)


def emit(row: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(orjson.dumps(row).decode(), flush=True)
    else:
        print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)


def run_workloads(workloads: Sequence[str], runners: dict[str, Callable[[], list[dict[str, Any]]]],
                  as_json: bool) -> list[dict[str, Any]]:
    """Each of `workloads` in turn (runners[name]() measures it: its rows), every row emitted as it comes;
    returns them all."""
    rows: list[dict[str, Any]] = []
    for workload in workloads:
        for row in runners[workload]():
            emit(row, as_json)
            rows.append(row)
    return rows


# --------------------------------------------------------------------------- pipelined requests


@dataclass(frozen=True)
class PipelineSettings:
    connections: int = 4
    inflight: int = 8  # requests outstanding per connection
    socket_timeout_s: float = 30.0
    # Responses larger than this are read straight into their own buffer (fetches), not via the
    # small-frame receive buffer, so their bytes are copied once.
    large_frame_bytes: int = 64 * 1024
    recv_chunk_bytes: int = 64 * 1024


@dataclass
class PipelineStats:
    responses: int = 0
    requests: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0


class _Channel:
    __slots__ = ("index", "sock", "next_cid", "sent", "inbuf", "big_buffer", "big_view", "big_have", "exhausted")

    def __init__(self, index: int, sock: socket.socket) -> None:
        self.index = index
        self.sock = sock
        self.next_cid = 0
        self.sent: deque[tuple[int, int, Any]] = deque()  # (correlation id, send time ns, tag)
        self.inbuf = bytearray()
        # Reused for every large response (allocating 1 MiB per fetch cost a third of the client's time).
        self.big_buffer = bytearray()
        self.big_view: memoryview | None = None  # the large response being received, if any
        self.big_have = 0
        self.exhausted = False


_I32 = struct.Struct(">i")
# A request source: (connection index) -> (pre-encoded frame, tag) or None when it has no more.
NextRequest = Callable[[int], "tuple[bytes | bytearray, Any] | None"]
# A response sink: (connection index, tag, response body after the correlation id, latency ns).
OnResponse = Callable[[int, Any, memoryview, int], None]


class Pipeliner:
    """Keeps `inflight` requests outstanding on each of `connections` sockets to one node.

    Written here rather than with ``rawkafka.RawConnection`` (blocking, one socket at a time)
    because a load generator must read whichever connection answers first: one selector loop
    over all sockets, one send per refill, large responses received straight into place.
    Frames come pre-encoded; only the correlation id (bytes 8..11) is rewritten per request.
    """

    def __init__(self, host: str, port: int, settings: PipelineSettings = PipelineSettings()) -> None:
        self.settings = settings
        self.channels: list[_Channel] = []
        self.selector = selectors.DefaultSelector()
        try:
            for index in range(settings.connections):
                sock = socket.create_connection((host, port), timeout=settings.socket_timeout_s)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                channel = _Channel(index, sock)
                self.channels.append(channel)
                self.selector.register(sock, selectors.EVENT_READ, channel)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for channel in self.channels:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(channel.sock)
            channel.sock.close()
        self.channels = []
        self.selector.close()

    def __enter__(self) -> Pipeliner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _refill(self, channel: _Channel, next_request: NextRequest, stats: PipelineStats) -> None:
        channel.exhausted = False
        out = bytearray()
        now = time.perf_counter_ns()
        while len(channel.sent) < self.settings.inflight:
            got = next_request(channel.index)
            if got is None:
                channel.exhausted = True
                break
            frame, tag = got
            start = len(out)
            out += frame
            cid = channel.next_cid
            channel.next_cid = (cid + 1) & 0x7FFFFFFF
            _I32.pack_into(out, start + 8, cid)
            channel.sent.append((cid, now, tag))
            stats.requests += 1
        if out:
            channel.sock.sendall(out)

    def _deliver(self, channel: _Channel, frame: memoryview, on_response: OnResponse, stats: PipelineStats) -> None:
        now = time.perf_counter_ns()
        if not channel.sent:
            raise rawkafka.RawProtocolError(f"connection {channel.index}: response with no request in flight")
        cid, sent_ns, tag = channel.sent.popleft()
        (got,) = _I32.unpack_from(frame, 0)
        if got != cid:
            raise rawkafka.RawProtocolError(f"connection {channel.index}: correlation id {got}, expected {cid}")
        latency = now - sent_ns
        stats.responses += 1
        stats.latencies_ns.append(latency)
        on_response(channel.index, tag, frame[4:], latency)

    def _on_readable(self, channel: _Channel, on_response: OnResponse, stats: PipelineStats) -> None:
        if channel.big_view is not None:
            n = channel.sock.recv_into(channel.big_view[channel.big_have:])
            if n == 0:
                raise rawkafka.RawProtocolError(f"connection {channel.index}: node closed it mid-response")
            channel.big_have += n
            if channel.big_have == len(channel.big_view):
                view, channel.big_view = channel.big_view, None
                with view:
                    self._deliver(channel, view, on_response, stats)
            return
        chunk = channel.sock.recv(self.settings.recv_chunk_bytes)
        if not chunk:
            raise rawkafka.RawProtocolError(f"connection {channel.index}: node closed it")
        buf = channel.inbuf
        buf += chunk
        pos, end = 0, len(buf)
        with memoryview(buf) as view:
            while end - pos >= 4:
                (size,) = _I32.unpack_from(view, pos)
                if size < 4:
                    raise rawkafka.RawProtocolError(f"connection {channel.index}: response size {size}")
                if end - pos - 4 >= size:
                    with view[pos + 4 : pos + 4 + size] as frame:
                        self._deliver(channel, frame, on_response, stats)
                    pos += 4 + size
                elif size > self.settings.large_frame_bytes:
                    if size > len(channel.big_buffer):
                        channel.big_buffer = bytearray(size)  # replaced, never resized: views may be out
                    channel.big_view = memoryview(channel.big_buffer)[:size]
                    channel.big_have = end - pos - 4
                    channel.big_view[: channel.big_have] = view[pos + 4 : end]
                    pos = end
                else:
                    break
        del buf[:pos]

    def run(self, next_request: NextRequest, on_response: OnResponse, deadline: float,
            start_at: float | None = None) -> PipelineStats:
        """Send and receive until every source is exhausted and answered, or until `deadline`
        (a source may offer more requests again after a response: it is asked after each one)
        (time.monotonic()); responses still outstanding then are not waited for (closing the
        connections drops them). `start_at`: wait until that monotonic time before the first send."""
        stats = PipelineStats()
        if start_at is not None:
            time.sleep(max(0.0, start_at - time.monotonic()))
        started = time.monotonic()
        for channel in self.channels:
            self._refill(channel, next_request, stats)
        while time.monotonic() < deadline:
            if all(ch.exhausted and not ch.sent for ch in self.channels):
                break
            for key, _ in self.selector.select(timeout=min(1.0, max(0.0, deadline - time.monotonic()))):
                channel = key.data
                self._on_readable(channel, on_response, stats)
                self._refill(channel, next_request, stats)
        stats.elapsed_s = time.monotonic() - started
        return stats


# --------------------------------------------------------------------------- consumer processes


class CountSlot:
    """One child's counters in the shared array of CountingProcesses: records received, first and last receipt
    (time.monotonic_ns, one clock for every process of the machine), and whether it is ready (subscribed,
    assigned: able to receive)."""

    FIELDS = 4  # records, first_ns, last_ns, ready

    def __init__(self, counters: Any, index: int, stop: Any) -> None:
        self.counters, self.base, self.stop = counters, index * self.FIELDS, stop

    def ready(self) -> None:
        self.counters[self.base + 3] = 1

    def add(self, records: int, now_ns: int) -> None:
        if not self.counters[self.base + 1]:
            self.counters[self.base + 1] = now_ns
        self.counters[self.base + 2] = now_ns
        self.counters[self.base] += records

    def stopped(self) -> bool:
        return self.stop.is_set()


class CountingProcesses:
    """`count` spawned processes running target(slot, *args): each receives records and counts them in its
    CountSlot (plain shared int64 words: one writer each, the parent only reads) until slot.stopped(). The
    rate of the whole set is its records over the span from the first receipt of any to the last of any.
    Stopping sets the event and joins each child within a bound, killing it (by pid) past that; a child that
    failed (non-zero exit, its traceback on stderr) makes stop() raise."""

    def __init__(self, target: Callable[..., None], count: int, *args: Any, join_timeout_s: float = 30.0) -> None:
        context = multiprocessing.get_context("spawn")
        self.counters = context.Array("q", count * CountSlot.FIELDS, lock=False)
        self.stop_event = context.Event()
        self.join_timeout_s = join_timeout_s
        self.children = [context.Process(target=target, args=(CountSlot(self.counters, i, self.stop_event), *args),
                                         daemon=True) for i in range(count)]

    def __enter__(self) -> CountingProcesses:
        for child in self.children:
            child.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop(raise_on_failure=exc[0] is None)

    def _column(self, field: int) -> list[int]:
        return [self.counters[i * CountSlot.FIELDS + field] for i in range(len(self.children))]

    def records(self) -> int:
        return sum(self._column(0))

    def _check_alive(self) -> None:
        for child in self.children:
            if child.exitcode not in (None, 0):
                raise RuntimeError(f"consumer process {child.pid} exited with {child.exitcode} (its stderr above)")

    def wait_ready(self, timeout_s: float) -> float:
        """Until every child is ready; returns the seconds it took."""
        started = time.monotonic()
        while not all(self._column(3)):
            self._check_alive()
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"consumers not ready in {timeout_s}s "
                                   f"({sum(self._column(3))} of {len(self.children)})")
            time.sleep(0.02)
        return time.monotonic() - started

    def wait_for(self, total: int, timeout_s: float) -> int:
        """Until the children received `total` records together, or timeout_s; returns what they received."""
        deadline = time.monotonic() + timeout_s
        while self.records() < total and time.monotonic() < deadline:
            self._check_alive()
            time.sleep(0.01)
        return self.records()

    def span_s(self) -> float:
        firsts = [t for t in self._column(1) if t]
        return (max(self._column(2)) - min(firsts)) / 1e9 if firsts else 0.0

    def per_process(self) -> list[int]:
        return self._column(0)

    def stop(self, raise_on_failure: bool = True) -> None:
        self.stop_event.set()
        failed = []
        for child in self.children:
            if child.pid is None:
                continue
            child.join(timeout=self.join_timeout_s)
            if child.is_alive():
                child.kill()  # by pid
                child.join(timeout=self.join_timeout_s)
            if child.exitcode not in (0, None):
                failed.append(child.exitcode)
        if failed and raise_on_failure:
            raise RuntimeError(f"consumer processes exited with {failed} (their stderr above)")


def paced_calls(rate: float, seconds: float, call: Callable[[], Any], stop: Any = None) -> list[int]:
    """call() every 1/rate s on an absolute schedule (a late call goes at once, none is skipped) for `seconds`
    or until `stop` (a threading.Event) is set; returns each call's duration in ns."""
    interval = 1.0 / rate
    started = time.monotonic()
    latencies = []
    for i in range(max(1, int(rate * seconds))):
        if stop is not None and stop.is_set():
            break
        wait = started + i * interval - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        sent = time.perf_counter_ns()
        call()
        latencies.append(time.perf_counter_ns() - sent)
    return latencies
