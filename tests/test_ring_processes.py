"""The ring between real processes: 10M-frame stress, kill -9 of either end, liveness."""

import os
import random
import time

import pytest
from ring_peer import pattern_frame, stress_sizes
from shm_testing import Peer, fresh_instance

from shmbroker.shm.ring import RingBusy, RingConfig, RingReader, RingWriter, frame_bytes

pytestmark = pytest.mark.serial  # see tests/conftest.py: run alone

STRESS_FRAMES = int(os.environ.get("SHM_STRESS_FRAMES", 10_000_000))
STRESS_CAPACITY = 16 * 1024
STRESS_MAX_SIZE = 256
STRESS_SEED = 20261121
STRESS_TIMEOUT_S = 240


def ring_edges(sizes, capacity):
    """(exact fits at the buffer end, skip markers) the given frame sizes produce."""
    pos = exact = skips = 0
    for size in sizes:
        total = frame_bytes(size)
        off = pos % capacity
        if total > capacity - off:
            skips += 1
            pos += capacity - off
        pos += total
        exact += pos % capacity == 0
    return exact, skips


def test_ten_million_frames_without_loss_duplication_or_reordering():
    first_chunk = next(stress_sizes(STRESS_SEED, STRESS_FRAMES, STRESS_MAX_SIZE))
    exact, skips = ring_edges(first_chunk, STRESS_CAPACITY)
    assert exact > 10 and skips > 100  # the sizes really exercise both wrap edges
    with fresh_instance() as instance:
        name = instance.create_ring(instance.name("stress"), RingConfig(capacity=STRESS_CAPACITY))
        reader = RingReader(name)
        with Peer("stress_write", name, STRESS_SEED, STRESS_FRAMES, STRESS_MAX_SIZE) as writer:
            deadline = time.monotonic() + STRESS_TIMEOUT_S
            seq = 0
            for sizes in stress_sizes(STRESS_SEED, STRESS_FRAMES, STRESS_MAX_SIZE):
                index = 0
                while index < len(sizes):
                    frames = reader.read_batch(len(sizes) - index)
                    if not frames:
                        assert time.monotonic() < deadline, f"stalled at frame {seq}"
                        assert writer.proc.poll() in (None, 0)
                        os.sched_yield()
                        continue
                    for view in frames:
                        assert len(view) == sizes[index], f"frame {seq}: size {len(view)} != {sizes[index]}"
                        assert int.from_bytes(view[:8], "little") == seq, f"frame {seq} out of order"
                        assert view[-1] == seq & 0xFF or len(view) == 8, f"frame {seq} payload damaged"
                        seq += 1
                        index += 1
                    del frames, view
                    reader.release()
            writer.wait_ok()
            assert seq == STRESS_FRAMES
            assert reader.read_batch() == []  # nothing extra
        reader.close()


def read_patterns(reader, expected_from):
    """Read all committed frames; each must be the complete pattern frame of the next seq."""
    seq = expected_from
    frames = reader.read_batch()
    for view in frames:
        assert bytes(view) == pattern_frame(seq), f"frame {seq} torn or out of order"
        seq += 1
    del frames
    reader.release()
    return seq


def read_patterns_until_exit(peer, reader, seq):
    """Keep reading while a writer peer runs (it may need the space), until it exits cleanly."""
    deadline = time.monotonic() + STRESS_TIMEOUT_S
    while peer.proc.poll() is None and time.monotonic() < deadline:
        seq = read_patterns(reader, seq)
        time.sleep(0.001)
    peer.wait_ok(timeout=1)
    return read_patterns(reader, seq)


def test_writer_killed_in_the_middle_of_a_frame_leaves_no_torn_frame():
    with fresh_instance() as instance:
        name = instance.create_ring(instance.name("torn"), RingConfig(capacity=64 * 1024))
        reader = RingReader(name)
        with Peer("reserve_and_hang", name) as peer:
            peer.expect_line("hung")  # 3 frames committed, half of the 4th written
            assert reader.producer_alive()
            peer.kill9()
        assert not reader.producer_alive()
        assert read_patterns(reader, 0) == 3
        # a restarted producer needs no takeover (the old one is dead) and resumes cleanly
        with Peer("write_range", name, 3, 1000) as successor:
            assert read_patterns_until_exit(successor, reader, 3) == 1003
        reader.close()


@pytest.mark.parametrize("attempt", range(5))
def test_writer_killed_at_a_random_moment_while_writing(attempt):
    with fresh_instance() as instance:
        name = instance.create_ring(instance.name("kill"), RingConfig(capacity=64 * 1024))
        reader = RingReader(name)
        seq = 0
        with Peer("write_forever", name, 0) as peer:
            peer.expect_line("started")
            deadline = time.monotonic() + random.uniform(0.01, 0.2)
            while time.monotonic() < deadline:  # keep the writer busy writing, not waiting
                seq = read_patterns(reader, seq)
            peer.kill9()
        seq = read_patterns(reader, seq)
        assert seq > 0 and not reader.has_pending()
        with Peer("write_range", name, seq, 1000) as successor:
            assert read_patterns_until_exit(successor, reader, seq) == seq + 1000
        reader.close()


def test_consumer_killed_before_release_gets_frames_redelivered_to_its_successor():
    with fresh_instance() as instance:
        name = instance.create_ring(instance.name("redeliver"), RingConfig(capacity=8192))
        writer = RingWriter(name)
        assert writer.write_many([pattern_frame(seq) for seq in range(10)]) == 10
        with Peer("read_no_release", name, 10) as peer:
            peer.expect_line("read 10")
            with pytest.raises(RingBusy):
                RingReader(name)  # the consumer is alive
            assert writer.consumer_alive()
            peer.kill9()
        assert not writer.consumer_alive()
        successor = RingReader(name)
        assert read_patterns(successor, 0) == 10
        successor.close()
        writer.close()


def test_live_producer_is_not_taken_over_unless_asked():
    with fresh_instance() as instance:
        name = instance.create_ring(instance.name("busy"), RingConfig(capacity=8192))
        with Peer("reserve_and_hang", name) as peer:
            peer.expect_line("hung")
            with pytest.raises(RingBusy):
                RingWriter(name)
            RingWriter(name, takeover=True).close()
