"""Redis Streams as the peer of the node in the load-test report (scripts/bench_report.py): the server and the
Redis side of each workload, shaped like the node's.

- ``RedisServer``: the distribution's redis-server (`make redis`) on a free 127.0.0.1 port with its own temp dir,
  without persistence, with appendfsync always (the honest peer of acks=all) or everysec (an fsync a second),
  stopped by its pid.
- ``xadd_benchmark``: redis-benchmark XADD, pipelined (``PIPELINE`` commands in flight per client).
- ``read_stream``: reader processes (redis-py) counting what they receive, like the node's consumers:
  XREAD COUNT 1000 BLOCK from the start of the stream (each reader gets every entry), or XREADGROUP in one
  consumer group (each entry goes to one reader, which acknowledges its batch with XACK in the same round trip:
  the peer of Kafka group consumers with committed offsets).
- ``end_to_end``: paced XADD from one connection, XREAD BLOCK on another; produce-to-receive latencies.
- ``block_fanout``: N sockets each holding XREAD BLOCK 0 (a selector loop over raw RESP, the same loop as the
  node's long-poll waiters in bench_delayed.py), one XADD, the time until every one is answered.

Invariants: only 127.0.0.1; every wait and loop is bounded in time or count; the server dies with this process
(PR_SET_PDEATHSIG) and is stopped by its pid otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import psutil

from scripts import bench_delayed
from scripts.harness import benchnode
from scripts.harness.nodeproc import LOOPBACK, die_with_parent, free_port

PIPELINE = 16
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0
COMMAND_TIMEOUT_S = 600.0
READ_COUNT = 1000
READ_BLOCK_MS = 100
READER_READY_TIMEOUT_S = 60.0
APPENDFSYNC_MODES = ("always", "everysec", "no")


@dataclass
class RedisServer:
    port: int
    pid: int

    def memory(self) -> dict[str, int]:
        info = psutil.Process(self.pid).memory_full_info()
        return {"rss_bytes": info.rss, "pss_bytes": getattr(info, "pss", info.rss), "processes": 1}

    def client(self) -> Any:
        import redis

        return redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=COMMAND_TIMEOUT_S)


@contextlib.contextmanager
def redis_server(appendfsync_always: bool, max_clients: int = 10_000,
                 appendfsync: str | None = None) -> Iterator[RedisServer]:
    """`appendfsync` ("always", "everysec" or "no": no persistence), if given, overrides `appendfsync_always`."""
    mode = appendfsync or ("always" if appendfsync_always else "no")
    if mode not in APPENDFSYNC_MODES:
        raise ValueError(f"appendfsync must be one of {APPENDFSYNC_MODES}, not {mode!r}")
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is missing: run `make redis` (Debian package redis-server)")
    port = free_port()
    work = tempfile.mkdtemp(prefix="shmbroker-redis-")
    args = [binary, "--port", str(port), "--bind", LOOPBACK, "--dir", work, "--save", "", "--daemonize", "no",
            "--protected-mode", "yes", "--maxclients", str(max_clients), "--logfile", os.path.join(work, "redis.log")]
    args += ["--appendonly", "yes", "--appendfsync", mode] if mode != "no" else ["--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((LOOPBACK, port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {proc.returncode}")
                time.sleep(0.05)
        else:
            raise RuntimeError("redis-server did not start")
        print(f"redis_peer: redis-server pid {proc.pid} on {LOOPBACK}:{port}"
              f"{f', appendfsync {mode}' if mode != 'no' else ''}", file=sys.stderr, flush=True)
        yield RedisServer(port, proc.pid)
    finally:
        proc.terminate()  # by pid
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)
        shutil.rmtree(work, ignore_errors=True)


def xadd_benchmark(port: int, clients: int, value_size: int, requests: int, stream: str) -> dict:
    """redis-benchmark XADD, pipelined: records/s and MB/s (payload)."""
    value = "v" * value_size
    done = subprocess.run(["redis-benchmark", "-h", LOOPBACK, "-p", str(port), "-c", str(clients),
                           "-P", str(PIPELINE), "-n", str(requests), "--csv", "XADD", stream, "*", "f", value],
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    rows = [line for line in done.stdout.splitlines() if line.startswith('"XADD')]
    if done.returncode != 0 or not rows:
        raise RuntimeError(f"redis-benchmark failed: {done.stderr[-500:]}")
    rps = float(rows[-1].split(",")[1].strip('"'))
    return {"records_per_s": round(rps, 1), "mb_per_s": round(rps * value_size / benchnode.MB, 3)}


# --------------------------------------------------------------------------- readers


def stream_reader(slot: benchnode.CountSlot, port: int, stream: str, group: str | None, seconds: float) -> None:
    """One reader (a CountingProcesses child): XREAD from the start, or XREADGROUP as consumer `slot` of `group`
    with the previous batch's XACK in the same round trip; counts until stopped."""
    import redis

    client = redis.Redis(host=LOOPBACK, port=port, socket_timeout=COMMAND_TIMEOUT_S)
    name = f"reader-{os.getpid()}"
    last = "0-0"
    unacked: list[bytes] = []
    deadline = time.monotonic() + seconds
    try:
        slot.ready()
        while not slot.stopped() and time.monotonic() < deadline:
            if group is None:
                reply = client.xread({stream: last}, count=READ_COUNT, block=READ_BLOCK_MS)
            else:
                pipe = client.pipeline(transaction=False)
                if unacked:
                    pipe.xack(stream, group, *unacked)
                pipe.xreadgroup(group, name, {stream: ">"}, count=READ_COUNT, block=READ_BLOCK_MS)
                reply = pipe.execute()[-1]
            if not reply:
                unacked = []
                continue
            entries = reply[0][1]
            slot.add(len(entries), time.monotonic_ns())
            last = entries[-1][0]
            unacked = [entry_id for entry_id, _ in entries] if group is not None else []
    finally:
        client.close()


def read_stream(server: RedisServer, stream: str, readers: int, group: str | None, total: int, seconds: float,
                while_reading: Callable[[Callable[[], int]], int] | None = None) -> dict:
    """`readers` reader processes read `stream` (as one group when `group` is given, created here at the start
    of the stream) until they hold `total` entries together, or for `seconds`; the rate is over the first
    receipt to the last. `while_reading(received)`, if given, runs once they are ready (a producer, say;
    `received()` is what they hold so far) and returns the count they must reach instead of `total`."""
    if group is not None:
        client = server.client()
        client.xgroup_create(stream, group, id="0", mkstream=True)
        client.close()
    with benchnode.CountingProcesses(stream_reader, readers, server.port, stream, group,
                                     READER_READY_TIMEOUT_S + COMMAND_TIMEOUT_S + seconds) as procs:
        procs.wait_ready(READER_READY_TIMEOUT_S)
        if while_reading is not None:
            total = while_reading(procs.records)
        procs.wait_for(total, seconds)
    got, span = procs.records(), procs.span_s()
    return {"records": got, "records_per_s": round(got / span, 1) if span else None, "seconds": round(span, 3)}


# --------------------------------------------------------------------------- end-to-end latency


def end_to_end(server: RedisServer, rate: float, seconds: float, value_size: int) -> list[int]:
    """Paced XADD (a monotonic ns stamp in each entry) from one connection, XREAD BLOCK from another: latencies
    in ns, stamped on receipt (both sides in this process: one clock)."""
    stream = f"e2e-{os.getpid()}"
    producer, consumer = server.client(), server.client()
    latencies: list[int] = []
    stop = threading.Event()
    padding = b"x" * max(0, value_size - 20)

    def send() -> None:
        producer.xadd(stream, {"t": str(time.monotonic_ns()).encode(), "p": padding})

    thread = threading.Thread(target=benchnode.paced_calls, args=(rate, seconds, send, stop))
    try:
        consumer.xadd(stream, {"t": b"0"})
        last = "$"
        thread.start()
        deadline = time.monotonic() + seconds + 10
        while time.monotonic() < deadline:
            reply = consumer.xread({stream: last}, block=1000, count=READ_COUNT)
            now = time.monotonic_ns()
            if not reply:
                if not thread.is_alive():
                    break
                continue
            for entry_id, fields in reply[0][1]:
                last = entry_id
                stamp = int(fields[b"t"])
                if stamp:
                    latencies.append(now - stamp)
    finally:
        stop.set()
        thread.join(seconds + 10)
        producer.close()
        consumer.close()
    return latencies


# --------------------------------------------------------------------------- XREAD BLOCK fan-out


def resp_command(*args: str | bytes) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else arg
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def resp_end(buf: bytearray, pos: int = 0) -> int:
    """Where the RESP reply starting at `pos` ends; 0 while it is not whole."""
    line = buf.find(b"\r\n", pos)
    if line < 0:
        return 0
    kind, after = buf[pos], line + 2
    if kind in b"+-:_,#":
        return after
    length = int(buf[pos + 1 : line])
    if kind in b"$=!":
        end = after + length + 2 if length >= 0 else after
        return end if len(buf) >= end else 0
    for _ in range(max(0, length) * (2 if kind == ord("%") else 1)):  # arrays, sets, pushes; maps hold pairs
        after = resp_end(buf, after)
        if not after:
            return 0
    return after


def block_fanout(server: RedisServer, waiters: int, rounds: int, settle_s: float, answer_timeout_s: float,
                 while_waiting: Callable[[int], dict[str, Any]] | None = None) -> bench_delayed.FanoutOutcome:
    """`waiters` sockets each send XREAD BLOCK 0 STREAMS s $; after settle_s, one XADD to s; the time until every
    socket holds its reply (bench_delayed.fanout_rounds, as for the node's long polls)."""
    stream = f"fanout-{os.getpid()}"
    request = resp_command("XREAD", "BLOCK", "0", "STREAMS", stream, "$")
    adder = server.client()
    pool = bench_delayed.Waiters(LOOPBACK, server.port, waiters, answer_end=resp_end)

    def arm(_round: int) -> None:
        for waiter in pool.waiters:
            pool.send(waiter, request)

    def wake() -> int:
        started = time.monotonic_ns()
        adder.xadd(stream, {"v": b"wake"})
        return started

    try:
        return bench_delayed.fanout_rounds(pool, rounds, settle_s, answer_timeout_s, arm, wake, label="redis fanout",
                                           while_waiting=while_waiting, memory=server.memory)
    finally:
        pool.close()
        adder.close()
