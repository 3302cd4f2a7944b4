"""Peer process for the shm tests: run as `python tests/ring_peer.py <command> ...`.

Each command is a real process that opens rings by name, like the node's children do.
Every loop is bounded in time (PEER_MAX_SECONDS) so a forgotten peer ends by itself.
"""

from __future__ import annotations

import os
import selectors
import sys
import time

import numpy as np

from shmbroker.shm.doorbell import EventfdDoorbell, SemaphoreDoorbell
from shmbroker.shm.instance import Instance, completion_ring_name, request_ring_name, timer_doorbell_name
from shmbroker.shm.ring import RingConfig, RingReader, RingWriter

PEER_MAX_SECONDS = 120
STRESS_CHUNK = 1 << 16
UNIFORM_STRETCH = 300  # frames of one size in a row (a 256-frame writer batch falls inside one, or spans two)


def stress_sizes(seed: int, count: int, max_size: int):
    """The frame sizes of the stress test, in chunks; both sides generate the same ones.

    Multiples of 8 from 8 up (so exact fits at the buffer end are common), plus odd sizes, and
    stretches of one size (which the ring writes and reads with its numpy uniform-batch paths).
    """
    rng = np.random.default_rng(seed)
    done = 0
    while done < count:
        n = min(STRESS_CHUNK, count - done)
        sizes = rng.integers(1, max_size // 8 + 1, size=n) * 8
        odd = rng.random(n) < 0.3
        sizes[odd] -= rng.integers(0, 8, size=int(odd.sum()))
        for start in np.flatnonzero(rng.random((n + UNIFORM_STRETCH - 1) // UNIFORM_STRETCH) < 0.3) * UNIFORM_STRETCH:
            sizes[start : start + UNIFORM_STRETCH] = sizes[start]
        yield np.maximum(sizes, 8).tolist()
        done += n


def pattern_frame(seq: int) -> bytes:
    """Frame `seq` of the kill tests: seq, then its low byte repeated; size depends on seq."""
    size = 8 + (seq * 37) % 300
    return seq.to_bytes(8, "little") + bytes([seq & 0xFF]) * (size - 8)


def _deadline() -> float:
    return time.monotonic() + PEER_MAX_SECONDS


def cmd_stress_write(ring: str, seed: str, count: str, max_size: str) -> None:
    writer = RingWriter(ring)
    fill = [bytes([b]) * int(max_size) for b in range(256)]
    seq = 0
    deadline = _deadline()
    for sizes in stress_sizes(int(seed), int(count), int(max_size)):
        payloads = [(seq + i).to_bytes(8, "little") + fill[(seq + i) & 0xFF][: size - 8] for i, size in enumerate(sizes)]
        sent = 0
        while sent < len(payloads):
            batch = payloads[sent : sent + 256]
            n = writer.write_many(batch)
            sent += n
            if n < len(batch):
                if time.monotonic() > deadline:
                    sys.exit("stress writer: reader stalled")
                os.sched_yield()
        seq += len(sizes)


def cmd_write_forever(ring: str, start_seq: str) -> None:
    writer = RingWriter(ring)
    seq = int(start_seq)
    announced = False
    deadline = _deadline()
    while time.monotonic() < deadline:
        batch = [pattern_frame(s) for s in range(seq, seq + 16)]
        n = writer.write_many(batch)
        seq += n
        if n and not announced:
            print("started", flush=True)
            announced = True
        if n < len(batch):
            time.sleep(0.0005)  # full: the test kills us while we wait or write


def cmd_write_range(ring: str, start_seq: str, count: str) -> None:
    writer = RingWriter(ring)
    deadline = _deadline()
    for seq in range(int(start_seq), int(start_seq) + int(count)):
        while not writer.write(pattern_frame(seq)):
            if time.monotonic() > deadline:
                sys.exit("write_range: ring stayed full")
            time.sleep(0.0005)


def cmd_reserve_and_hang(ring: str) -> None:
    writer = RingWriter(ring)
    for seq in range(3):
        assert writer.write(pattern_frame(seq))
    torn = pattern_frame(3)
    view = writer.reserve(len(torn))
    view[: len(torn) // 2] = torn[: len(torn) // 2]  # half a frame, never committed
    print("hung", flush=True)
    time.sleep(PEER_MAX_SECONDS)


def cmd_read_no_release(ring: str, count: str) -> None:
    reader = RingReader(ring)
    got = 0
    deadline = _deadline()
    while got < int(count) and time.monotonic() < deadline:
        got += len(reader.read_batch(int(count) - got))
        time.sleep(0.001)
    print("read", got, flush=True)
    time.sleep(PEER_MAX_SECONDS)


def cmd_hold_instance(instance_id: str, workers: str) -> None:
    instance = Instance.start(instance_id)
    for worker in range(int(workers)):
        instance.create_ring(request_ring_name(instance_id, worker), RingConfig(capacity=4096))
        instance.create_ring(completion_ring_name(instance_id, worker), RingConfig(capacity=4096))
    instance.create_semaphore_doorbell(timer_doorbell_name(instance_id)).close()
    print("ready", flush=True)
    time.sleep(PEER_MAX_SECONDS)


def cmd_echo_worker(instance_id: str, worker: str, bell_fd: str) -> None:
    """A network worker's loop: one selector over its doorbell fd; echo completions back."""
    worker_index = int(worker)
    bell = EventfdDoorbell(int(bell_fd))
    timer_bell = SemaphoreDoorbell(timer_doorbell_name(instance_id))
    completions = RingReader(completion_ring_name(instance_id, worker_index))
    requests = RingWriter(request_ring_name(instance_id, worker_index), timer_bell)
    selector = selectors.DefaultSelector()
    selector.register(bell.fileno(), selectors.EVENT_READ)
    deadline = _deadline()
    while time.monotonic() < deadline:
        frames = completions.read_batch()
        if frames:
            stop = any(bytes(frame) == b"stop" for frame in frames)
            assert requests.write_many([bytes(frame) for frame in frames]) == len(frames)
            del frames
            completions.release()
            if stop:
                return
            continue
        bell.drain()
        if completions.announce_sleep():
            selector.select(timeout=PEER_MAX_SECONDS)
            completions.woke()


def cmd_jittered_write(ring: str, count: str, bell_kind: str, bell_arg: str, seed: str) -> None:
    """Write `count` frames with random 0-40 us busy gaps, so commits land at every phase of
    the consumer's announce-recheck-sleep sequence. Prints how often it rang."""
    import random

    rng = random.Random(int(seed))
    bell = EventfdDoorbell(int(bell_arg)) if bell_kind == "eventfd" else SemaphoreDoorbell(bell_arg)
    writer = RingWriter(ring, bell)
    rang = 0
    deadline = _deadline()
    for seq in range(int(count)):
        gap_end = time.perf_counter() + rng.random() * 40e-6
        while time.perf_counter() < gap_end:
            pass
        while True:
            view = writer.reserve(8)
            if view is not None:
                break
            if time.monotonic() > deadline:
                sys.exit("jittered_write: ring stayed full")
            time.sleep(0.0001)
        view[:] = seq.to_bytes(8, "little")
        del view
        rang += writer.commit()
    print("rang", rang, flush=True)


if __name__ == "__main__":
    globals()["cmd_" + sys.argv[1]](*sys.argv[2:])
