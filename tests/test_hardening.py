"""Hostile and unlucky clients against a real node: bounded memory (requests and responses), connection
limits, idle and incomplete-request timeouts, and hung children (SIGSTOP) replaced by the supervisor.

Memory is the node's RSS: the supervisor's and every child's, summed (shared pages count in every process,
the same way in the idle figure and under load, so the difference is what the load cost)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import struct
import threading
import time

import psutil
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from shmbroker.node.storage.log import PartitionLock
from scripts.harness import rawkafka as R
from tests.test_clients import CLIENT_TIMEOUT_S, consume_all, create_topic, produce
from tests.waiting import poll

pytestmark = pytest.mark.serial  # see tests/conftest.py: run alone

MiB = 1 << 20
API_VERSIONS, FETCH, PRODUCE = 18, 1, 0


def node_rss(node) -> int:
    total = 0
    for process in [psutil.Process(node.proc.pid)] + node.children():
        try:
            total += process.memory_info().rss
        except psutil.Error:
            pass
    return total


class PeakRss:
    """Samples the node's RSS in a thread; `peak` is the largest seen."""

    def __init__(self, node, interval_s: float = 0.05) -> None:
        self.node, self.interval_s = node, interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, node_rss(self.node))
            time.sleep(self.interval_s)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=CLIENT_TIMEOUT_S)


def gone_or_zombie(pid: int) -> bool:
    """A killed child: not reaped yet (a zombie) or reaped, also between the two looks a pid_exists() and a
    status() would take."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    sock.settimeout(timeout)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    return False


def api_versions_ok(sock: socket.socket, timeout: float = 5.0) -> bool:
    """One ApiVersions v0 round trip on a raw socket."""
    sock.settimeout(timeout)
    try:
        sock.sendall(R.encode_request(API_VERSIONS, 0, 7, b""))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        body = sock.recv(size, socket.MSG_WAITALL)
        return len(body) == size and struct.unpack_from(">ih", body) == (7, 0)
    except (OSError, struct.error):
        return False


def connect(node, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", node.port))
    return sock


def well_behaved_round(node, topic: str, count: int, tag: str) -> None:
    """Produce `count` records and read them all back: a client the node must keep serving."""
    sent = [{"value": f"{tag}-{i}".encode(), "partition": 0} for i in range(count)]
    produce(node.bootstrap, topic, sent, acks="1")
    got = consume_all(node.bootstrap, topic, 1, count, at_least=True)
    assert {r["value"] for r in sent} <= {m.value() for m in got}


# -- bounded memory ------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_hostile_partial_requests_hold_bounded_memory_and_give_it_back(node_factory, workers):
    """200 connections each announce a 100 MiB request and send 20 MiB of it. The node stops reading the
    ones holding the most once its bound (256 MiB across the node, split over its workers) is reached,
    keeps serving a well-behaved client meanwhile, and gives the memory back when they close."""
    bound = 256 * MiB
    node = node_factory(workers=workers, config="[server]\nrequest_timeout_ms = 300000\n")
    create_topic(node.bootstrap, "calm", 1)
    well_behaved_round(node, "calm", 200, "warmup")
    idle = node_rss(node)
    chunk = memoryview(bytes(MiB))
    attackers = []
    selector = selectors.DefaultSelector()
    try:
        with PeakRss(node) as sampler:
            for _ in range(200):
                sock = socket.create_connection(("127.0.0.1", node.port), timeout=5)
                sock.setblocking(False)
                sock.send(struct.pack(">i", 100 * MiB))
                attackers.append([sock, 0])
                selector.register(sock, selectors.EVENT_WRITE, attackers[-1])
            target = 20 * MiB
            started = last_progress = time.monotonic()
            # Send until every attacker sent its 20 MiB or nobody could send for 3 s (the node stopped reading).
            while selector.get_map() and time.monotonic() - last_progress < 3 and time.monotonic() - started < 120:
                for key, _ in selector.select(0.5):
                    entry = key.data
                    try:
                        sent = entry[0].send(chunk[:min(len(chunk), target - entry[1])])
                    except BlockingIOError:
                        continue
                    entry[1] += sent
                    last_progress = time.monotonic()
                    if entry[1] >= target:
                        selector.unregister(entry[0])
            pushed = sum(sent for _, sent in attackers)
            # The hostile connections stay open and stuck; a well-behaved client is served meanwhile.
            well_behaved_round(node, "calm", 500, "during")
            under_attack = node_rss(node)
        peak = sampler.peak
    finally:
        for sock, _ in attackers:
            sock.close()
        selector.close()
    given_back = poll(lambda: node_rss(node) <= idle + 32 * MiB, timeout_s=60)
    after = node_rss(node)
    figures = (f"idle {idle / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB (+{(peak - idle) / MiB:.0f}), under attack "
               f"{under_attack / MiB:.0f} MiB, after close {after / MiB:.0f} MiB; attackers pushed "
               f"{pushed / MiB:.0f} MiB into their sockets")
    print(f"hostile connections, {workers} worker(s):", figures)
    assert pushed > 2 * bound, figures  # they did try to make the node hold far more than the bound
    # The slack: each worker's oldest request is read on to its end (here 20 MiB), plus allocator noise.
    assert peak <= idle + bound + 64 * MiB, figures
    assert given_back, figures
    well_behaved_round(node, "calm", 100, "after")


def test_a_client_that_never_reads_its_fetch_responses_holds_bounded_memory(node_factory):
    """A client pipelines thousands of fetches of 1 MiB each and never reads: after its queued responses
    pass the bound the node stops reading its requests; its memory stays small and others are served."""
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "big", 1)
    value = bytes(64 * 1024)
    produce(node.bootstrap, "big", [{"value": value, "partition": 0} for _ in range(64)], acks="1")
    well_behaved_round(node, "big", 10, "warmup")
    idle = node_rss(node)
    fetch = R.encode_request(FETCH, 11, 1, R.fetch_body({"big": {0: 0}}, max_wait_ms=0,
                                                        partition_max_bytes=MiB, max_bytes=MiB))
    reader = socket.create_connection(("127.0.0.1", node.port), timeout=5)
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    reader.setblocking(False)
    sent_requests = 0
    try:
        with PeakRss(node) as sampler:
            burst = fetch * 100
            deadline = time.monotonic() + 20
            last_progress = time.monotonic()
            while time.monotonic() < deadline and time.monotonic() - last_progress < 2 and sent_requests < 100_000:
                try:
                    sent = reader.send(burst)
                except BlockingIOError:
                    time.sleep(0.01)
                    continue
                sent_requests += sent / len(fetch)
                last_progress = time.monotonic()
            well_behaved_round(node, "big", 20, "during")
        peak = sampler.peak
        figures = (f"idle {idle / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB; {sent_requests:.0f} fetch requests "
                   f"sent ({sent_requests:.0f} MiB of responses asked for), none read")
        print("non-reading client:", figures)
        assert sent_requests > 1000, figures  # far more asked for than the output bound lets it queue
        assert peak <= idle + 48 * MiB, figures
    finally:
        reader.close()
    well_behaved_round(node, "big", 5, "after")


# -- limits and timeouts ---------------------------------------------------------------------------


def test_connection_limits_refuse_at_accept_with_one_log_line_per_cause(node_factory):
    """max_connections and max_connections_per_ip count the whole node (two workers); connections over
    them are closed at accept; each cause logs one line however often it happens."""
    node = node_factory(workers=2, config="[server]\nmax_connections = 6\nmax_connections_per_ip = 4\n")
    opened = []
    try:
        for _ in range(4):
            opened.append(connect(node))
            assert api_versions_ok(opened[-1])
        for _ in range(3):  # a 5th, 6th, 7th from 127.0.0.1: over the per-address limit
            extra = connect(node)
            assert closed_by_peer(extra)
            extra.close()
        for _ in range(2):  # another address still has room, up to the node's limit of 6
            opened.append(connect(node, "127.0.0.2"))
            assert api_versions_ok(opened[-1])
        for _ in range(3):
            extra = connect(node, "127.0.0.2")
            assert closed_by_peer(extra)
            extra.close()
        # The worker logs after it closed the socket: the line may come a moment after the client saw the close.
        poll(lambda: "over server.max_connections (6)" in node.log(), timeout_s=5)
        log = node.log()
        assert log.count("over server.max_connections_per_ip (4)") == 1, log
        assert log.count("over server.max_connections (6)") == 1, log
        # Connections that were admitted are untouched; closing two makes room again.
        assert all(api_versions_ok(sock) for sock in opened)
        for sock in opened[:2]:
            sock.close()
        again = poll(lambda: _admitted(node), timeout_s=10)
        assert again is not None
        again.close()
    finally:
        for sock in opened:
            sock.close()


def _admitted(node):
    sock = connect(node)
    if api_versions_ok(sock, timeout=2):
        return sock
    sock.close()
    return None


def assert_closed_and_kept(node, closed: socket.socket, kept: socket.socket, timeout: float, *logged: str) -> None:
    """The node closed `closed` (within `timeout` s), still answers on `kept`, and logged each of `logged`; both
    sockets are closed after."""
    try:
        assert closed_by_peer(closed, timeout=timeout)
        assert api_versions_ok(kept)
        log = node.log()
        assert all(line in log for line in logged), log
    finally:
        closed.close()
        kept.close()


def test_idle_connections_are_closed_busy_and_waiting_ones_are_not(node_factory):
    node = node_factory(workers=1, config="[server]\nconnections_max_idle_ms = 700\n")
    create_topic(node.bootstrap, "poll", 1)
    idle = connect(node)
    busy = connect(node)
    assert api_versions_ok(idle) and api_versions_ok(busy)
    with R.RawConnection("127.0.0.1", node.port) as waiting:
        # A long poll of 2 s: the connection waits on the node, so it is not idle.
        waiting.send(FETCH, 11, R.fetch_body({"poll": {0: 0}}, max_wait_ms=2000))
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert api_versions_ok(busy)
            time.sleep(0.2)
        _, _, _, body = waiting.recv_response()
        assert R.parse_fetch_response(11, body).partitions[0].error_code == 0
    assert_closed_and_kept(node, idle, busy, 1, "(server.connections_max_idle_ms)", "idle for")


def test_a_request_that_stays_incomplete_closes_its_connection(node_factory):
    node = node_factory(workers=1, config="[server]\nrequest_timeout_ms = 800\n")
    stalled = connect(node)
    stalled.sendall(struct.pack(">i", 100) + b"\x00" * 10)  # 10 of 100 bytes, then nothing
    slow = connect(node)
    frame = R.encode_request(API_VERSIONS, 0, 7, b"")
    for piece in (frame[:3], frame[3:9], frame[9:]):  # a slow client that does finish in time
        slow.sendall(piece)
        time.sleep(0.2)
    slow.settimeout(5)
    size = struct.unpack(">i", slow.recv(4, socket.MSG_WAITALL))[0]
    assert struct.unpack_from(">ih", slow.recv(size, socket.MSG_WAITALL)) == (7, 0)
    assert_closed_and_kept(node, stalled, slow, 5, "request incomplete for", "(server.request_timeout_ms)")


# -- hung children ---------------------------------------------------------------------------------

HANG_CONFIG = "[server]\nchild_hang_timeout_ms = 3000\nheartbeat_interval_ms = 250\n"


def worker_of(node, sock: socket.socket) -> int | None:
    """The pid of the worker holding the node's end of `sock`."""
    port = sock.getsockname()[1]
    for pid in node.pids("worker"):
        try:
            if any(c.raddr and c.raddr.port == port for c in psutil.Process(pid).net_connections()):
                return pid
        except psutil.Error:
            continue
    return None


def test_a_stopped_worker_is_replaced_and_the_others_keep_serving(node_factory):
    node = node_factory(workers=2, config=HANG_CONFIG)
    by_worker: dict[int, list[socket.socket]] = {}
    for _ in range(64):
        sock = connect(node)
        assert api_versions_ok(sock)
        by_worker.setdefault(poll(lambda: worker_of(node, sock), timeout_s=5), []).append(sock)
        if len(by_worker) == 2 and all(len(s) >= 2 for s in by_worker.values()):
            break
    assert len(by_worker) == 2, "the kernel put every connection on one worker"
    victim, survivor = list(by_worker)
    os.kill(victim, signal.SIGSTOP)
    try:
        # Well before the hang timeout: the other worker's clients are served, the stopped one's are not.
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert all(api_versions_ok(sock) for sock in by_worker[survivor])
        assert not api_versions_ok(by_worker[victim][0], timeout=0.3)
        assert psutil.Process(victim).status() == psutil.STATUS_STOPPED
        # The supervisor notices, kills and replaces it.
        assert poll(lambda: gone_or_zombie(victim), timeout_s=20)
        node.wait_for_pids("worker", 2, exclude={victim})
    finally:
        with contextlib.suppress(ProcessLookupError):  # reaped already
            os.kill(victim, signal.SIGCONT)
    assert all(closed_by_peer(sock) for sock in by_worker[victim])
    assert all(api_versions_ok(sock) for sock in by_worker[survivor])
    for sock in [s for socks in by_worker.values() for s in socks]:
        sock.close()
    for _ in range(8):  # new connections land on either worker, the replacement included
        with connect(node) as sock:
            assert api_versions_ok(sock)
    log = node.log()
    assert log.count("has not turned its loop") == 1, log  # the idle children were never taken for hung
    assert f"(pid {victim}) has not turned its loop" in log, log


def test_a_stopped_timer_is_covered_by_self_answers_then_replaced(node_factory):
    node = node_factory(workers=1, config=HANG_CONFIG + "\n[timer]\ndelayed_grace_ms = 300\n")
    create_topic(node.bootstrap, "timerless", 1)
    timer = node.pids("timer")[0]
    os.kill(timer, signal.SIGSTOP)
    try:
        with R.RawConnection("127.0.0.1", node.port, timeout_s=10) as conn:
            # A long poll the timer would answer: the worker answers it by itself, empty, past its deadline.
            started = time.monotonic()
            result = R.parse_fetch_response(11, conn.request(FETCH, 11, R.fetch_body({"timerless": {0: 0}},
                                                                                       max_wait_ms=200)))
            assert result.partitions[0].error_code == 0 and result.partitions[0].record_count == 0
            answered_s = time.monotonic() - started
            still_stopped = psutil.Process(timer).status() == psutil.STATUS_STOPPED
        assert still_stopped, f"answered after {answered_s:.2f} s, but by the timer's replacement"
        assert poll(lambda: gone_or_zombie(timer), timeout_s=20)
        node.wait_for_pids("timer", 1, exclude={timer})
    finally:
        with contextlib.suppress(ProcessLookupError):  # reaped already
            os.kill(timer, signal.SIGCONT)
    # The new timer's flusher answers acks=all; its purgatory the long polls.
    produce(node.bootstrap, "timerless", [{"value": b"after", "partition": 0}], acks="all")
    got = consume_all(node.bootstrap, "timerless", 1, 1, **{"fetch.wait.max.ms": 500})
    assert [m.value() for m in got] == [b"after"]
    log = node.log()
    assert f"timer 0 (pid {timer}) has not turned its loop" in log, log
    assert log.count("has not turned its loop") == 1, log


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_held_up_by_a_hung_timers_partition_lock_keeps_its_connections(node_factory, workers):
    """A timer hung while it holds a partition's lock (here stopped inside a group-commit round, which publishes
    the fsync'd offset under the lock) holds up the worker appending to that partition, whose loop stops turning
    too. Only the timer is replaced: the worker goes on once the lock is freed, with its connections, and the
    append it was making is answered."""
    node = node_factory(workers=workers, config=HANG_CONFIG)
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    for future in admin.create_topics([NewTopic("held", 1, 1, config={"flush.messages": "1"})]).values():
        future.result(timeout=CLIENT_TIMEOUT_S)
    (timer,) = node.pids("timer")
    worker_pids = sorted(node.pids("worker"))
    with contextlib.closing(connect(node)) as idle:
        assert api_versions_ok(idle)
        answers: list[int] = []
        producing = threading.Event()
        producing.set()

        def keep_producing() -> None:  # acks=1: answered once appended, whatever the timer does
            body = R.produce_body({"held": {0: R.build_record_batch([b"x" * 100])}}, acks=1)
            with R.RawConnection("127.0.0.1", node.port, timeout_s=CLIENT_TIMEOUT_S) as conn:
                while producing.is_set():
                    answers.append(conn.call(PRODUCE, 8, body).responses[0].partition_responses[0].error_code)

        producer = threading.Thread(target=keep_producing, daemon=True)
        producer.start()
        try:
            assert poll(lambda: answers, timeout_s=CLIENT_TIMEOUT_S)
            node.stop_when_holding(timer, lambda held: "held-0" in held, timeout_s=20)
            try:
                time.sleep(0.2)  # for the answer of an append made before the stop
                held_up = len(answers)
                time.sleep(0.5)
                assert len(answers) == held_up  # the worker waits on the lock in its next append
                assert poll(lambda: gone_or_zombie(timer), timeout_s=20)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(timer, signal.SIGCONT)
            assert poll(lambda: len(answers) > held_up, timeout_s=5), node.log()
        finally:
            producing.clear()
            producer.join(CLIENT_TIMEOUT_S)
        assert set(answers) == {0}
        node.wait_for_pids("timer", 1, exclude={timer})
        assert api_versions_ok(idle)  # the same connection, on the same worker
        assert sorted(node.pids("worker")) == worker_pids
    log = node.log()
    assert log.count("has not turned its loop") == 1, log
    assert f"timer 0 (pid {timer}) has not turned its loop" in log, log


def test_the_partition_locks_a_process_holds_are_seen_from_outside(node_factory):
    """What the tests that stop the timer rely on (NodeProcess.partition_locks_held_by, read from /proc): a lock
    this process takes is seen as its own and no other's, and is gone once released; the timer, stopped outside
    its partition locks, holds none."""
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "locked", 1)
    (timer,) = node.pids("timer")
    lock = PartitionLock(str(node.data_dir / "locked-0"))
    try:
        assert node.partition_locks_held_by(os.getpid()) == []
        with lock:
            assert node.partition_locks_held_by(os.getpid()) == ["locked-0"]
            assert "locked-0" not in node.partition_locks_held_by(timer)
        assert node.partition_locks_held_by(os.getpid()) == []
    finally:
        lock.close()
    node.stop_outside_partition_locks(timer)
    try:
        assert psutil.Process(timer).status() == psutil.STATUS_STOPPED
        assert node.partition_locks_held_by(timer) == []
    finally:
        os.kill(timer, signal.SIGCONT)


def test_out_of_file_descriptors_the_listener_rests_and_recovers(node_factory):
    """accept() failing with EMFILE (the worker's fd limit lowered under it) neither spins the worker nor
    ends it: one log line, the listener rests, and accepts again once descriptors are free."""
    node = node_factory(workers=1)
    worker = psutil.Process(node.pids("worker")[0])
    open_fds = worker.num_fds()
    original = worker.rlimit(psutil.RLIMIT_NOFILE)
    held = []
    try:
        worker.rlimit(psutil.RLIMIT_NOFILE, (open_fds + 3, original[1]))
        for _ in range(8):
            held.append(connect(node))
        served = [api_versions_ok(sock, timeout=1) for sock in held]
        assert any(served) and not all(served), served  # the rest wait in the backlog
        cpu_before = sum(worker.cpu_times()[:2])
        time.sleep(1)
        assert sum(worker.cpu_times()[:2]) - cpu_before < 0.5  # resting, not spinning on EMFILE
        waiting = held[served.index(False)]
        for sock, ok in zip(held, served):
            if ok:
                sock.close()
        # A connection that waited is accepted now that descriptors are free again.
        assert poll(lambda: api_versions_ok(waiting, timeout=1), timeout_s=10)
    finally:
        worker.rlimit(psutil.RLIMIT_NOFILE, original)
        for sock in held:
            sock.close()
    log = node.log()
    assert log.count("cannot accept connections") == 1 and "Too many open files" in log, log
    with connect(node) as sock:
        assert api_versions_ok(sock)
