"""Connection affinity (workers.affinity) and the handoff that moves a connection (shm.handoff).

The node tests run two real workers with a raw producer and a raw long-polling consumer placed on different
workers by the kernel: the consumer's connection moves to the producer's worker after
server.connection_affinity_waits answers in a row, keeps its socket (no reconnect, every record in order), and
stays put when the balance slack or the setting forbids the move. The handoff tests pass real sockets
between real processes; the policy tests drive ConnectionAffinity directly.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import socket
import sys
import time

import psutil
import pytest

from shmbroker.node.tools.inspect import NodeReader
from scripts.harness import rawkafka as R
from shmbroker.shm.handoff import AFFINITY, BALANCE, HEADER, MAGIC, Handoffs, Inbox
from tests.test_clients import create_topic
from tests.test_hardening import worker_of
from tests.test_node_protocol import _connections_on_two_workers, connect
from tests.waiting import wait_for
from shmbroker.workers.affinity import ConnectionAffinity

pytestmark = pytest.mark.serial  # see tests/conftest.py: run alone

FETCH, PRODUCE, NONE = 1, 0, 0
WAITS = 3
STATS = "[stats]\npublish_interval_ms = 20\n"
# A long poll stays in its worker, whose doorbell tells which worker's append answered it: one handed over to the
# timer (after fetch_handoff_ms, which a loaded machine can take before the append comes) may be answered by the
# timer, and such an answer counts for no worker (workers.affinity).
IN_WORKER = "[timer]\nfetch_handoff_ms = 60000\n"


def _worker_totals(reader: NodeReader, field: str) -> int:
    return sum(int(row.get(field)) for row in reader.rows() if row.role == "worker")


def _wait_for(predicate, what: str):
    return wait_for(predicate, timeout=10.0, what=what, poll_s=0.005)


@contextlib.contextmanager
def _apart(node_factory, settings: str, topic: str):
    """A two-worker node with `settings` under [server], and a raw consumer and producer on different workers."""
    node = node_factory(workers=2, config=STATS + IN_WORKER + f"[server]\n{settings}\n")
    create_topic(node.bootstrap, topic, 1)
    reader = NodeReader.open(str(node.data_dir))
    consumer, producer = _connections_on_two_workers(node)
    try:
        with consumer, producer:
            yield node, reader, consumer, producer
    finally:
        reader.close()


def _long_poll_rounds(node, reader: NodeReader, consumer: R.RawConnection, producer: R.RawConnection, topic: str,
                      first: int, rounds: int) -> list[int]:
    """Each round: the consumer's fetch waits (seen in the stats), the producer appends one record, the fetch
    answers with it. Returns the pid of the worker holding the consumer after each round."""
    holders = []
    for offset in range(first, first + rounds):
        # The last round's wait gone from the stats first: a stale count of it would let the append come before
        # this round's fetch waits (that fetch then finds its record at once, and no worker's append answers it).
        _wait_for(lambda: _worker_totals(reader, "delayed_waiting") == 0, what="the last long poll to be gone")
        consumer.send(FETCH, 11, R.fetch_body({topic: {0: offset}}, max_wait_ms=30_000, min_bytes=1))
        _wait_for(lambda: _worker_totals(reader, "delayed_waiting") == 1, what="the long poll to wait")
        body = R.produce_body({topic: {0: R.build_record_batch([b"record-%d" % offset])}}, acks=1)
        assert producer.call(PRODUCE, 8, body).responses[0].partition_responses[0].error_code == NONE
        fetched = R.parse_fetch_response(11, consumer.recv_response()[3])
        (partition,) = fetched.partitions
        assert partition.error_code == NONE and fetched.record_count == 1
        assert partition.next_offset == offset + 1  # the one record appended this round, in order
        holders.append(_wait_for(lambda: _sole_holder(node, consumer.sock), what="one worker to hold the consumer"))
    return holders


def _sole_holder(node, sock: socket.socket) -> int | None:
    """The pid of the one worker holding the node's end of `sock` (None meanwhile a move is under way: both
    hold it, or neither, while it is in the inbox)."""
    port = sock.getsockname()[1]
    holders = []
    for pid in node.pids("worker"):
        try:
            if any(c.raddr and c.raddr.port == port for c in psutil.Process(pid).net_connections()):
                holders.append(pid)
        except psutil.Error:
            continue
    return holders[0] if len(holders) == 1 else None


def test_a_long_polling_consumer_moves_to_the_worker_whose_appends_answer_it(node_factory):
    with _apart(node_factory, f"connection_affinity_waits = {WAITS}", "moves") as (node, reader, consumer, producer):
        home, appender = worker_of(node, consumer.sock), worker_of(node, producer.sock)
        # Answers 1..WAITS-1 by the other worker's appends: the consumer stays.
        assert _long_poll_rounds(node, reader, consumer, producer, "moves", 0, WAITS - 1) == [home] * (WAITS - 1)
        assert _worker_totals(reader, "connections_moved_out") == 0
        # The WAITS-th: it moves, on the same socket, and is served there from then on.
        holders = _long_poll_rounds(node, reader, consumer, producer, "moves", WAITS - 1, 1 + WAITS)
        assert holders == [appender] * (1 + WAITS)
        _wait_for(lambda: _worker_totals(reader, "connections_moved_in") == 1, what="the move in the stats")
        assert _worker_totals(reader, "connections_moved_out") == 1
        assert _worker_totals(reader, "connections") == 2
        # An ordinary request on the moved connection: still in order, still answered.
        assert consumer.call(R.API_VERSIONS, 3, R.api_versions_body()).error_code == NONE


@pytest.mark.parametrize("setting", [f"connection_affinity_waits = {WAITS}\nconnection_affinity_slack = 0",
                                     "connection_affinity_waits = 0"], ids=["over-the-slack", "off"])
def test_a_consumer_stays_when_the_balance_or_the_setting_forbids_the_move(node_factory, setting):
    # Slack 0: the move would leave the producer's worker with two connections and this one with none.
    with _apart(node_factory, setting, "stays") as (node, reader, consumer, producer):
        home = worker_of(node, consumer.sock)
        assert _long_poll_rounds(node, reader, consumer, producer, "stays", 0, 2 * WAITS) == [home] * (2 * WAITS)
        assert _worker_totals(reader, "connections_moved_out") == 0


# -- new connections, balanced at accept (server.balance_connections) ---------------------------------------

def _balanced_in(reader: NodeReader) -> int:
    return _worker_totals(reader, "connections_balanced_in")


def _within(seconds: float, predicate) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_new_connections_are_spread_evenly_over_the_workers(node_factory):
    # The kernel's SO_REUSEPORT hash alone leaves 8 connections 4 and 4 only about one time in four.
    node = node_factory(workers=2, config=STATS)
    reader = NodeReader.open(str(node.data_dir))
    conns = []
    try:
        for _ in range(8):
            conn = connect(node)
            assert conn.call(R.API_VERSIONS, 3, R.api_versions_body()).error_code == NONE
            conns.append(conn)
        holders = [_wait_for(lambda: _sole_holder(node, conn.sock), what="one worker to hold it") for conn in conns]
        assert sorted(holders.count(pid) for pid in set(holders)) == [4, 4]
        _wait_for(lambda: _balanced_in(reader) == _worker_totals(reader, "connections_balanced_out"),
                  what="both ends of the passes in the stats")
        for conn in conns:  # every one still served where it landed
            assert conn.call(R.API_VERSIONS, 3, R.api_versions_body()).error_code == NONE
    finally:
        for conn in conns:
            conn.close()
        reader.close()


def test_a_worker_whose_loop_stopped_is_passed_no_new_connections(node_factory):
    # A peer whose heartbeat stopped (SIGSTOP here; hung, or dead and not yet replaced) would leave a connection
    # passed to it unanswered: the running worker keeps every one it accepts. (Connections the kernel itself
    # queues at the stopped worker's listener wait for it to run again, balancing or not.)
    node = node_factory(workers=2, config=STATS + "[server]\nheartbeat_interval_ms = 100\nchild_hang_timeout_ms = 60000\n")
    reader = NodeReader.open(str(node.data_dir))
    stopped, running = node.pids("worker")
    conns, waiting = [], []
    os.kill(stopped, signal.SIGSTOP)
    try:
        time.sleep(0.5)  # past two heartbeat intervals: its beats no longer move
        for _ in range(12):
            conn = R.RawConnection("127.0.0.1", node.port, timeout_s=1.0)
            conns.append(conn)
            conn.send(R.API_VERSIONS, 3, R.api_versions_body())
            try:
                conn.recv_response()
            except TimeoutError:
                waiting.append(conn)  # in the stopped worker's accept queue
                continue
            assert worker_of(node, conn.sock) == running
        assert len(waiting) < len(conns)  # the kernel placed some on the running worker: they were kept there
        running_row = next(row for row in reader.rows() if row.pid == running)
        assert running_row.get("connections_balanced_out") == 0
    finally:
        os.kill(stopped, signal.SIGCONT)
    try:
        for conn in waiting:
            conn.sock.settimeout(10.0)
            conn.recv_response()  # answered once the stopped worker runs again
    finally:
        for conn in conns:
            conn.close()
        reader.close()


def test_a_connection_balanced_at_accept_still_moves_to_its_producers_worker(node_factory):
    # Passed at accept is not an affinity move: no cooldown, so a long poll there still follows its producer.
    node = node_factory(workers=2, config=STATS + f"[server]\nconnection_affinity_waits = {WAITS}\n")
    create_topic(node.bootstrap, "follows", 1)
    reader = NodeReader.open(str(node.data_dir))
    producer = connect(node)
    consumer = None
    try:
        assert producer.call(R.API_VERSIONS, 3, R.api_versions_body()).error_code == NONE
        appender = _wait_for(lambda: _sole_holder(node, producer.sock), what="the producer's worker")
        # The topic's admin client gone: the producer's is the only connection the balance counts.
        _wait_for(lambda: _worker_totals(reader, "connections") == 1, what="the admin client's connections to close")
        for _ in range(32):  # until the kernel hands one to the producer's worker, which passes it on
            before = _balanced_in(reader)
            candidate = connect(node)
            assert candidate.call(R.API_VERSIONS, 3, R.api_versions_body()).error_code == NONE
            home = _wait_for(lambda: _sole_holder(node, candidate.sock), what="one worker to hold it")
            assert home != appender  # one connection each, whichever worker the kernel chose
            if _within(1.0, lambda: _balanced_in(reader) > before):
                consumer = candidate
                break
            candidate.close()
            _wait_for(lambda: _worker_totals(reader, "connections") == 1, what="the candidate's close")
        assert consumer is not None, "the kernel never put a second connection on the producer's worker"
        rounds = _long_poll_rounds(node, reader, consumer, producer, "follows", 0, WAITS + 1)
        assert rounds == [home] * (WAITS - 1) + [appender] * 2
    finally:
        producer.close()
        if consumer is not None:
            consumer.close()
        reader.close()


# -- the handoff between processes ---------------------------------------------------------------------

def _serve_one_handoff(receiving_fd: int, done: multiprocessing.Queue) -> None:
    """A stand-in for a worker started after the handoff was sent: take the socket, answer what waits in it."""
    handoffs = Handoffs(1, receiving_fd, {})
    deadline = time.monotonic() + 10
    received = []
    while not received and time.monotonic() < deadline:
        received = handoffs.receive()
        time.sleep(0.01)
    (fd, sender, reason), = received
    with socket.socket(fileno=fd) as sock:
        sock.setblocking(True)
        sock.sendall(b"answered: " + sock.recv(64))
    done.put((sender, reason))


def test_a_connection_sent_while_no_worker_reads_waits_for_the_next_one():
    # The supervisor holds the inbox for the node's life, so a socket passed to a worker that is gone (dead, or
    # not yet replaced) waits in it, and the bytes its client sent meanwhile wait in the socket.
    inbox, own = Inbox.create(), Inbox.create()
    # Handoffs owns the descriptors it is given (a worker's inherited ones): copies here, the inboxes keep theirs.
    sender = Handoffs(0, os.dup(own.receiving.fileno()), {1: os.dup(inbox.sending.fileno())})
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        served, _ = listener.accept()
        with client:
            assert sender.send(1, served.fileno(), BALANCE)
            served.close()  # the sender's copy: the socket lives on in the inbox
            client.sendall(b"request")
            context = multiprocessing.get_context("fork")
            done = context.Queue()
            worker = context.Process(target=_serve_one_handoff, args=(inbox.receiving.fileno(), done))
            gc.collect()  # earlier tests' garbage (librdkafka clients) is destroyed here, not in the forked child
            worker.start()
            client.settimeout(10)
            assert client.recv(64) == b"answered: request"
            worker.join(10)
            assert worker.exitcode == 0 and done.get(timeout=1) == (0, BALANCE)
    sender.close()
    inbox.close()
    own.close()


def test_a_malformed_handoff_is_returned_without_a_sender_and_a_message_without_a_descriptor_is_skipped():
    inbox = Inbox.create()
    handoffs = Handoffs(0, os.dup(inbox.receiving.fileno()), {})
    inbox.sending.send(HEADER.pack(MAGIC, 1, AFFINITY))  # no descriptor: nothing to serve
    with socket.socket() as stray, socket.socket() as unknown_reason:
        for header, sock in ((b"not a handoff", stray), (HEADER.pack(MAGIC, 1, 7), unknown_reason)):
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, sock.fileno().to_bytes(4, sys.byteorder))]
            inbox.sending.sendmsg([header], rights)
    received = handoffs.receive()
    assert [sender for _, sender, _ in received] == [None, None]
    for fd, _, _ in received:
        os.close(fd)
    assert handoffs.receive() == []
    handoffs.close()
    inbox.close()


# -- the policy ---------------------------------------------------------------------------------------------

class _Conn:  # a connection as the policy sees it: a hashable key
    pass


def test_the_policy_counts_answers_in_a_row_from_one_peer_and_keeps_the_balance():
    counts = {0: 5, 1: 5}
    policy = ConnectionAffinity(0, waits=3, slack=4, cooldown_s=30.0, connections_of=counts.__getitem__)
    conn = _Conn()
    for _ in range(2):
        policy.answered(conn, 1, now=0.0)
    policy.answered(conn, None, now=0.0)  # found its records at once: neither counts nor breaks the row
    assert policy.destination(conn) is None
    policy.answered(conn, 1, now=0.0)
    assert policy.destination(conn) == 1
    policy.answered(conn, 0, now=0.0)  # this worker's own append: start again
    assert policy.destination(conn) is None
    for peer in (1, 1, 2, 2, 2):  # another peer breaks the row and starts its own
        policy.answered(conn, peer, now=0.0)
    assert policy.due[conn] == 2
    counts[2] = 8  # 8 + 1 > 5 - 1 + 4: over the slack, the row starts again
    assert policy.destination(conn) is None and conn not in policy.due


def test_an_adopted_connection_does_not_move_again_within_the_cooldown():
    policy = ConnectionAffinity(1, waits=1, slack=4, cooldown_s=30.0, connections_of=lambda worker: 0)
    conn = _Conn()
    policy.adopted(conn, now=100.0)
    policy.answered(conn, 0, now=129.0)
    assert policy.destination(conn) is None
    policy.answered(conn, 0, now=130.0)
    assert policy.destination(conn) == 0
    policy.forget(conn)
    assert conn not in policy.due
