"""The timer's outbox on a real ring: completions leave in chunks as they are made, and at the end of the turn."""

from shm_testing import fresh_instance

from shmbroker.node.timer.outbox import Outbox
from shmbroker.shm import messages as M
from shmbroker.shm.ring import RingConfig, RingReader, RingWriter


def received(reader: RingReader) -> list:
    messages = [M.decode(view) for view in reader.read_batch()]
    reader.release()
    return messages


def test_completions_leave_in_chunks_behind_what_was_queued_before_them():
    with fresh_instance() as instance:
        name = instance.create_ring(instance.name("c"), RingConfig(capacity=1 << 16))
        with RingWriter(name) as writer, RingReader(name) as reader:
            outbox = Outbox([writer], chunk=3)
            outbox.send(0, M.encode(M.Kind.TIMER_STARTED, 1))
            outbox.complete(0, 1, M.Status.SATISFIED)
            outbox.complete(0, 2, M.Status.EXPIRED)
            assert received(reader) == []  # fewer than a chunk: they wait for the end of the turn
            outbox.complete(0, 3, M.Status.FAILED, 56)
            started, chunk = received(reader)  # a chunk: out at once, behind the frame queued before it
            assert started.kind == M.Kind.TIMER_STARTED
            assert chunk.kind == M.Kind.COMPLETION
            assert [tuple(item) for item in chunk.items] == [(1, M.Status.SATISFIED, 0), (2, M.Status.EXPIRED, 0),
                                                             (3, M.Status.FAILED, 56)]
            outbox.complete(0, 4, M.Status.SATISFIED)
            assert received(reader) == [] and outbox.pending()
            outbox.flush()  # the end of the turn: the rest
            (rest,) = received(reader)
            assert [tuple(item) for item in rest.items] == [(4, M.Status.SATISFIED, 0)]
            assert not outbox.pending() and outbox.frames_sent == [3]
