"""The ring in one process: framing, wrap and exact-fit edges, backpressure, batching, re-attach."""

import time

import posix_ipc
import pytest
from shm_testing import fresh_instance

from shmbroker.shm.ring import (FRAME_HEADER_BYTES, FrameTooLarge, RingConfig, RingCorrupt, RingFull, RingReader,
                                RingWriter, frame_bytes, max_payload)

CAPACITY = 4096


@pytest.fixture
def ring():
    with fresh_instance() as instance:
        name = instance.create_ring(instance.name("r"), RingConfig(capacity=CAPACITY))
        writer, reader = RingWriter(name), RingReader(name)
        yield writer, reader
        writer.close()
        reader.close()


def read_all(reader):
    frames = [bytes(view) for view in reader.read_batch()]
    reader.release()
    return frames


def test_frames_come_out_in_order_with_their_lengths(ring):
    writer, reader = ring
    payloads = [bytes([i]) * i for i in range(60)]
    assert writer.write_many(payloads) == 60
    assert read_all(reader) == payloads
    assert read_all(reader) == []


def test_exact_fit_at_the_end_uses_no_skip_marker(ring):
    writer, reader = ring
    half = max_payload(CAPACITY)
    assert frame_bytes(half) * 2 == CAPACITY
    assert writer.write_many([b"a" * half, b"b" * half]) == 2  # fills the buffer exactly
    assert not writer.write(b"c")  # full
    assert read_all(reader) == [b"a" * half, b"b" * half]
    assert writer.write(b"d" * half)  # starts at offset 0 again
    assert writer._pending % CAPACITY == frame_bytes(half)
    assert read_all(reader) == [b"d" * half]


def test_frame_that_does_not_fit_before_the_end_wraps_with_a_skip(ring):
    writer, reader = ring
    assert writer.write_many([b"x" * 1500, b"x" * 1500]) == 2
    assert read_all(reader) == [b"x" * 1500] * 2
    # 4096 - 2 * 1512 = 1072 bytes left before the end; this frame needs 1208: offset 0
    big = b"y" * 1200
    assert writer.write(big)
    assert writer._pending == CAPACITY + frame_bytes(1200)
    assert read_all(reader) == [big]


def test_full_ring_never_overwrites_and_reports_clearly(ring):
    writer, reader = ring
    written = writer.write_many([b"z" * 100] * 1000)
    assert written == CAPACITY // frame_bytes(100)
    assert not writer.write(b"z" * 100)
    started = time.monotonic()
    with pytest.raises(RingFull):
        writer.write(b"z" * 100, timeout=0.05)
    assert 0.04 < time.monotonic() - started < 2
    frames = read_all(reader)
    assert len(frames) == written and set(frames) == {b"z" * 100}
    assert writer.write(b"after", timeout=0.05)
    assert read_all(reader) == [b"after"]


def test_too_large_frame_is_refused(ring):
    writer, _ = ring
    with pytest.raises(FrameTooLarge):
        writer.write(b"q" * (max_payload(CAPACITY) + 1))
    with pytest.raises(FrameTooLarge):
        writer.write_many([b"ok", b"q" * CAPACITY])


def test_reserved_frames_are_invisible_until_commit(ring):
    writer, reader = ring
    for i in range(3):
        writer.reserve(5)[:] = b"%05d" % i
    assert not reader.has_pending() and reader.read_batch() == []
    writer.commit()
    assert read_all(reader) == [b"00000", b"00001", b"00002"]
    writer.reserve(4)[:] = b"gone"
    writer.abandon()
    writer.commit()
    assert read_all(reader) == []


def test_space_comes_back_only_at_release(ring):
    writer, reader = ring
    assert writer.write_many([b"w" * 500] * 100) == CAPACITY // frame_bytes(500)
    views = reader.read_batch(max_frames=2)
    assert len(views) == 2
    assert not writer.write(b"w" * 500)  # read but not released: still occupied
    del views
    reader.release()  # one tail store for the batch
    assert writer.write_many([b"v" * 500] * 3) == 2


def test_restarted_consumer_gets_unreleased_frames_again(ring):
    writer, reader = ring
    writer.write_many([b"1", b"2"])
    assert len(reader.read_batch()) == 2  # read, not released, then "restart"
    again = RingReader(reader.name)
    assert read_all(again) == [b"1", b"2"]
    writer.write_many([b"3", b"4"])
    assert again.discard_pending() == 2 * (FRAME_HEADER_BYTES + 8)
    assert read_all(again) == []
    again.close()


def test_restarted_producer_resumes_from_committed_head(ring):
    writer, reader = ring
    writer.write(b"committed")
    writer.reserve(9)[:] = b"uncommitt"  # this producer "dies" here
    successor = RingWriter(writer.name)
    successor.write(b"next")
    assert read_all(reader) == [b"committed", b"next"]
    successor.close()


def test_segment_that_is_not_a_ring_is_refused():
    with fresh_instance() as instance:
        name = instance.name("junk")
        junk = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=8192)
        junk.close_fd()
        with pytest.raises(RingCorrupt):
            RingReader(name)
        with pytest.raises(FileNotFoundError):
            RingWriter(instance.name("missing"))


def test_corrupt_frame_header_raises_not_crashes(ring):
    writer, reader = ring
    writer.write(b"fine")
    writer._data_words[0] = 100_000  # length beyond head and beyond any frame
    with pytest.raises(RingCorrupt):
        reader.read_batch()


def test_capacity_must_be_a_power_of_two():
    with pytest.raises(ValueError):
        RingConfig(capacity=5000)


def test_uniform_batches_take_the_numpy_paths_and_keep_order_across_the_wrap():
    """write_many of >= uniform_batch_min equal frames and read_batch of >= uniform_read_min of them use numpy;
    a batch that reaches the end of the data area is written up to the end that way and the rest wraps."""
    config = RingConfig(capacity=CAPACITY, uniform_batch_min=4, uniform_read_min=4)
    with fresh_instance() as instance:
        name = instance.create_ring(instance.name("u"), config)
        with RingWriter(name, config=config) as writer, RingReader(name, config=config) as reader:
            first = [bytes([i]) * 8 for i in range(240)]  # 240 frames of 16 bytes: 3840 of the 4096 bytes
            assert writer.write_many(first) == 240
            assert read_all(reader) == first
            second = [bytes([i]) * 8 for i in range(40)]  # 16 fit before the end; 24 wrap to offset 0
            assert writer.write_many(second) == 40
            assert writer._pending == CAPACITY + 24 * frame_bytes(8)
            assert read_all(reader) == second
            empty = [b""] * 20  # header-only frames
            assert writer.write_many(empty) == 20
            mixed_after = [b"m" * 5] * 8 + [b"x" * 3, b"yy"]  # a uniform run, then frames of other sizes
            assert writer.write_many(mixed_after) == 10
            assert read_all(reader) == empty + mixed_after
            assert writer.write_many([b"k" * 24] * 10) == 10
            assert [bytes(v) for v in reader.read_batch(max_frames=6)] == [b"k" * 24] * 6  # bounds the run too
            assert [bytes(v) for v in reader.read_batch()] == [b"k" * 24] * 4
            reader.release()


def test_uniform_batch_fills_a_nearly_full_ring_and_refuses_too_large_frames(ring):
    writer, reader = ring
    assert writer.write_many([b"f" * 100] * 30) == 30  # 30 * 112 = 3360 bytes
    assert writer.write_many([b"g" * 100] * 30) == (CAPACITY - 3360) // frame_bytes(100)  # only what fits
    frames = read_all(reader)
    assert frames == [b"f" * 100] * 30 + [b"g" * 100] * ((CAPACITY - 3360) // frame_bytes(100))
    with pytest.raises(FrameTooLarge):
        writer.write_many([b"q" * (max_payload(CAPACITY) + 1)] * 20)
    assert read_all(reader) == []


# --------------------------------------------------------------------------- the compiled write path
def test_compiled_write_path_is_built():
    """`make` installs a C compiler and the Python headers, so the fast path must be there."""
    from shmbroker.shm import ring

    assert ring._ringops is not None, "shm._ringops did not build: pip install -e . with gcc and python3-dev"


def _segment_bytes(writer) -> tuple[bytes, int, int]:
    return bytes(writer._map.data), writer._words[16], writer._words[32]


def test_compiled_and_python_paths_leave_identical_rings():
    """Same frames, same reads: the C paths (write, one-frame read, announce) and the Python paths must produce
    the same outcomes, frames, bytes, head and tail, through exact fits, wraps and skip markers (which C hands
    to Python), full rings, empty frames, and reads of one frame and of several."""
    sizes = [0, 1, 7, 8, 9, 100, 1000, 2040, 5, 1500, 64, 0, 511, 2000, 2040, 17] * 8
    with fresh_instance() as instance:
        results = []
        for compiled in (True, False):
            name = instance.create_ring(instance.name(f"c{int(compiled)}"), RingConfig(capacity=CAPACITY))
            with RingWriter(name) as writer, RingReader(name) as reader:
                if not compiled:
                    writer._header_addr = reader._header_addr = 0
                assert bool(writer._header_addr) == bool(reader._header_addr) == compiled
                outcomes, got, announced = [], [], []
                for every in (3, 1):  # read after every third write (batches), then after each (single frames)
                    for i, size in enumerate(sizes):
                        outcomes.append(writer.write(bytes([i % 251]) * size))
                        if i % every == every - 1:
                            announced.append(reader.announce_sleep())
                            got += read_all(reader)
                            announced.append(reader.announce_sleep())
                            reader.woke()
                    got += read_all(reader)
                with pytest.raises(FrameTooLarge):
                    writer.write(b"x" * (max_payload(CAPACITY) + 1))
                results.append((outcomes, got, announced, _segment_bytes(writer)))
        assert results[0] == results[1]
        outcomes, _, announced, _ = results[0]
        assert False in outcomes and True in outcomes  # the run did hit a full ring
        assert False in announced and True in announced  # announce saw frames, and an empty ring


@pytest.mark.parametrize("kind", ["eventfd", "semaphore"])
def test_compiled_write_rings_only_for_a_sleeping_consumer(kind):
    """An eventfd doorbell is rung inside the C call; a semaphore is rung by Python on its return."""
    from shmbroker.shm.doorbell import EventfdDoorbell

    with fresh_instance() as instance:
        if kind == "semaphore":
            bell = instance.create_semaphore_doorbell(instance.name("bell"))
        else:
            bell = EventfdDoorbell()
        try:
            name = instance.create_ring(instance.name("e"), RingConfig(capacity=CAPACITY))
            with RingWriter(name, bell) as writer, RingReader(name) as reader:
                assert writer._header_addr and (writer._fd_bell is bell) == (kind != "semaphore")
                assert writer.write(b"awake")
                assert bell.drain() == 0
                assert read_all(reader) == [b"awake"]
                assert reader.announce_sleep()
                assert writer.write(b"asleep") and writer.write(b"still asleep")
                assert bell.drain() == 2
                reader.woke()
                assert read_all(reader) == [b"asleep", b"still asleep"]
        finally:
            bell.close()


@pytest.mark.parametrize("frames", [1, 3])  # the compiled one-frame write and the batch write
def test_a_consumer_asleep_until_a_time_is_rung_only_for_frames_needed_before_it(frames):
    """Lazy wakeups: frames needed no earlier than the consumer's wake-up leave it asleep; earlier ones, frames
    needed at once, and a consumer asleep with no wake-up time of its own are rung as always."""
    from shmbroker.shm.ring import announce_sleep_all, woke_all

    with fresh_instance() as instance:
        bell = instance.create_semaphore_doorbell(instance.name("bell"))
        try:
            name = instance.create_ring(instance.name("l"), RingConfig(capacity=CAPACITY))
            with RingWriter(name, bell) as writer, RingReader(name) as reader:
                batch = [b"poll"] * frames
                rung = []
                for until_ms, lazy_until_ms in ((1000, 1000), (1000, 5000), (1000, 999), (1000, None),
                                                (None, 5000)):
                    assert announce_sleep_all([reader], until_ms)
                    writer.lazy_until_ms = lazy_until_ms
                    assert writer.write_many(batch) == frames
                    writer.lazy_until_ms = None
                    rung.append(bell.drain())
                    woke_all([reader])
                    assert read_all(reader) == batch  # rung or not, the frames are there for the wake-up
                assert rung == [0, 0, 1, 1, 1]
        finally:
            bell.close()


def test_write_after_close_raises_instead_of_touching_the_unmapped_segment(ring):
    writer, _ = ring
    writer.close()
    assert writer._header_addr == 0
    with pytest.raises(ValueError):
        writer.write(b"late")


def test_a_doorbell_that_fails_after_the_frame_is_published_raises_but_loses_nothing():
    import os

    from shmbroker.shm.doorbell import EventfdDoorbell

    # An eventfd whose descriptor is a pipe's read end: the compiled write's ring fails with EBADF.
    read_end, write_end = os.pipe()
    bell = EventfdDoorbell(read_end)
    try:
        with fresh_instance() as instance:
            name = instance.create_ring(instance.name("f"), RingConfig(capacity=CAPACITY))
            with RingWriter(name, bell) as writer, RingReader(name) as reader:
                assert reader.announce_sleep()
                with pytest.raises(OSError):
                    writer.write(b"published")
                reader.woke()
                assert writer.write(b"next")
                assert read_all(reader) == [b"published", b"next"]
    finally:
        bell.close()
        os.close(write_end)
