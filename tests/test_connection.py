"""A worker's connection on real sockets: memory follows the bytes that arrived (not the size announced),
large requests land in a mapping of their own, output is counted (sendfile ranges at their length), and the
timestamps the timeouts use."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from shmbroker.workers.connection import PAUSED_MEMORY, Connection, ConnectionClosed, FileRange

RECV = 64 * 1024
MAX_REQUEST = 100 * 1024 * 1024


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
    yield Connection(ours, "peer", MAX_REQUEST, RECV), theirs
    ours.close()
    theirs.close()


def drain(conn: Connection, now: float = 1.0) -> list[bytes]:
    """Receive until the socket has nothing more to read now."""
    frames = []
    for _ in range(1000):
        frames += [bytes(f) for f in conn.receive(now)]
        try:
            conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            break
    return frames


def test_small_requests_are_cut_from_reads_and_split_ones_wait(pair):
    conn, client = pair
    frames = [os.urandom(n) for n in (1, 100, 5000)]
    stream = b"".join(struct.pack(">i", len(f)) + f for f in frames)
    client.sendall(stream[:7])
    assert drain(conn) == [frames[0]] and conn.request_since is not None  # the second is incomplete
    client.sendall(stream[7:])
    assert drain(conn, now=2.0) == frames[1:]
    assert conn.partial_bytes == 0 and conn.request_since is None and conn.last_active == 2.0


def test_a_large_request_costs_what_arrived_and_comes_out_whole_and_read_only(pair):
    conn, client = pair
    size = 40 * 1024 * 1024
    client.sendall(struct.pack(">i", size) + b"a" * 300_000)
    drain(conn)
    assert conn.large is not None
    assert 300_000 <= conn.memory <= 300_000 + 4  # not the 40 MiB announced
    body = os.urandom(size - 300_000)
    client.setblocking(False)
    sent, frames = 0, []
    while sent < len(body) or not frames:
        if sent < len(body):
            try:
                sent += client.send(body[sent:sent + 1024 * 1024])
            except BlockingIOError:
                pass
        frames += conn.receive(3.0)
    (frame,) = frames
    assert len(frame) == size and frame.readonly
    assert bytes(frame[:300_000]) == b"a" * 300_000 and bytes(frame[300_000:]) == body
    assert conn.large is None and conn.memory == 0


def test_a_bad_size_prefix_breaks_the_connection_without_allocating(pair):
    conn, client = pair
    client.sendall(struct.pack(">i", MAX_REQUEST + 1))
    with pytest.raises(ConnectionClosed):
        conn.receive(1.0)


def test_output_counts_bytes_and_sendfile_ranges_and_drains(pair, tmp_path):
    conn, client = pair
    path = tmp_path / "segment"
    path.write_bytes(b"r" * 10_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        conn.fill(conn.new_slot(), [b"head", FileRange(fd, 0, 10_000), b"tail"])
        assert (conn.queued_bytes, conn.queued_memory) == (10_008, 8)
        conn.collect_ready()
        assert conn.flush(now=5.0)
        assert (conn.queued_bytes, conn.queued_memory) == (0, 0) and conn.last_active == 5.0
        assert conn.sendfile_bytes == 10_000  # the range's bytes, not the ones sent from memory
        client.settimeout(5)
        got = b""
        while len(got) < 10_008:
            got += client.recv(65536)
        assert got == b"head" + b"r" * 10_000 + b"tail"
    finally:
        os.close(fd)


def test_empty_pieces_in_a_response_are_passed_over(pair):
    conn, client = pair
    conn.fill(conn.new_slot(), [b"", b"head", b"", memoryview(b""), b"tail", b""])
    conn.collect_ready()
    assert conn.flush(now=2.0) and not conn.pending_output()
    client.settimeout(5)
    assert client.recv(100) == b"headtail"
    conn.fill(conn.new_slot(), [b""])
    conn.collect_ready()
    assert conn.flush(now=3.0) and not conn.pending_output()


def test_paused_time_does_not_count_against_the_incomplete_request(pair):
    conn, client = pair
    client.sendall(struct.pack(">i", 50) + b"x")
    conn.receive(10.0)
    assert conn.request_since == 10.0
    assert conn.pause(PAUSED_MEMORY, now=11.0)
    assert conn.unpause(PAUSED_MEMORY, now=15.0)
    assert conn.request_since == 14.0  # four seconds paused, not charged
