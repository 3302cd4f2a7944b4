"""A long-poll fetch on the worker side: it must not miss an append that races its read, and the worker
answers it on its own append without the timer.

The worker's fetch handler reads the log, and if it found too little hands the timer a watch: "complete
me when min_bytes are appended past what I saw". An append that lands between the read and the watch must
count as new. This runs the real worker-side objects (partition store and log on a real shared table,
handlers, delayed requests, the timer link over real rings) in-process, with one hook: PartitionLog.read is
wrapped so that another log handle (standing for another worker) appends right after the read returns.
The watch that reaches the request ring must start at the read's end; the worker's own check of the new
wait (after it counted the wait in the watches table) answers it in the same turn, and the timer's
DelayedFetch would find it satisfied at once too. The other tests produce through the same handlers: an
append that satisfies a fetch this worker holds answers it at once and cancels its wait in the timer; one
that does not, does not. The last ones give the worker a handoff delay (timer.fetch_handoff_ms): a long poll
answered or closed before it never reaches the timer, one still waiting then goes with its first deadline.
"""

from __future__ import annotations

import os
import socket
import time

import pytest
from shm_testing import fresh_instance

from shmbroker.node.config import NodeConfig
from shmbroker.node.storage.log import PartitionLog
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.delayed import DelayedFetch
from scripts.harness import rawkafka as R
from shmbroker.shm import instance as shm_instance
from shmbroker.shm import messages as M
from shmbroker.shm.doorbell import EventfdDoorbell
from shmbroker.shm.fetch_condition import FetchCondition
from shmbroker.shm.interest import WorkerWatches
from shmbroker.shm.ring import RingReader
from shmbroker.shm.table import PartitionTable
from shmbroker.shm.timer_link import TimerLink
from shmbroker.workers.api import handlers as handlers_module
from shmbroker.workers.api.fetch_sessions import FetchSessionCache
from shmbroker.workers.api.handlers import Handlers
from shmbroker.workers.api.quotas import ClientQuotas, Throttler
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Connection, Request
from shmbroker.workers.timer_client.delayed import DelayedRequests, monotonic_ms


@pytest.fixture
def worker_side(tmp_path):
    config = NodeConfig()
    with fresh_instance("race") as instance:
        iid = instance.instance_id
        table = PartitionTable.create(shm_instance.table_name(iid), 8)
        instance.create_ring(shm_instance.request_ring_name(iid, 0), config.rings)
        instance.create_ring(shm_instance.completion_ring_name(iid, 0), config.rings)
        instance.create_semaphore_doorbell(shm_instance.timer_doorbell_name(iid)).close()
        bell = EventfdDoorbell()
        link = TimerLink(iid, 0, config.rings, os.dup(bell.fileno()))
        store = PartitionStore(str(tmp_path), table, config.log, 8)
        assert store.create_topics([("t", 1, {})]) == {"t": (0, None)}
        settled = []
        delayed = DelayedRequests(link, table, config.timer.delayed_grace_ms,
                                  lambda req, outcome: settled.append(outcome), config.groups.max_request_document_bytes)
        handlers = Handlers(store, config, delayed, "cluster",
                            Throttler(ClientQuotas(config.quotas, 0), delayed, lambda conn: None, lambda conn: None),
                            FetchSessionCache(0, 0, 0, 1, lambda: 0))
        requests = RingReader(shm_instance.request_ring_name(iid, 0), config=config.rings)
        client, server = socket.socketpair()
        try:
            yield store, handlers, delayed, requests, Connection(server, "test", config.server.request_max_bytes, config.server.recv_bytes)
        finally:
            for closable in (client, server, requests, link, bell, store):
                closable.close()
            table.close()


def test_an_append_between_the_read_and_the_watch_counts_as_new(worker_side, monkeypatch):
    store, handlers, delayed, requests, conn = worker_side
    row = store.row("t", 0)
    other_worker = PartitionLog(store.log(row).directory, store.table, row, store.log_config)
    racing_batch = R.build_record_batch([b"raced"])
    seen_at_read = []
    real_read = PartitionLog.read

    def read_then_another_worker_appends(self, *args, **kwargs):
        piece = real_read(self, *args, **kwargs)
        seen_at_read.append(self.table.read(self.row).end_bytes)
        other_worker.append(racing_batch)  # lands after the read, before the handler builds its watch
        return piece

    monkeypatch.setattr(PartitionLog, "read", read_then_another_worker_appends)
    header = P.RequestHeader(P.FETCH, 11, 1, "test", 0)
    request = P.decode_request(P.FETCH, 11, R.fetch_body({"t": {0: 0}}, max_wait_ms=500, min_bytes=1))
    try:
        outcome = handlers.fetch(Request(conn, header, conn.new_slot()), request)
    finally:
        other_worker.close()
    assert outcome.deferred, "nothing was there when the handler read: it must wait"
    answers = []
    delayed.settle = lambda req, outcome: answers.append(outcome)
    delayed.end_turn()
    watch, cancel = _sent(requests)
    assert watch.kind == M.Kind.DELAY_FETCH
    assert watch.items == [(row, seen_at_read[0], -1)], "the watch starts where the read ended, before the racing append"
    assert len(answers) == 1, "the new wait's own check finds the raced append: answered in this turn"
    assert (cancel.kind, cancel.items) == (M.Kind.CANCEL, [(watch.request_id,)])
    fetch = DelayedFetch(0, watch.request_id, FetchCondition(watch.items, watch.min_bytes), store.table,
                         lambda op, expired: None)
    assert fetch.satisfied(), "the timer must find the raced append at once, not at max_wait"


def _fetch(handlers, conn, min_bytes: int):
    header = P.RequestHeader(P.FETCH, 11, 1, "test", 0)
    request = P.decode_request(P.FETCH, 11, R.fetch_body({"t": {0: 0}}, max_wait_ms=30_000, min_bytes=min_bytes))
    return handlers.fetch(Request(conn, header, conn.new_slot()), request)


def _produce(handlers, conn, values: list[bytes]):
    header = P.RequestHeader(P.PRODUCE, 8, 2, "test", 0)
    request = P.decode_request(P.PRODUCE, 8, R.produce_body({"t": {0: R.build_record_batch(values)}}, acks=1))
    return handlers.produce(Request(conn, header, conn.new_slot()), request)


def _sent(requests):
    frames = [M.decode(frame) for frame in requests.read_batch()]
    requests.release()
    return frames


def _parked_fetch(worker_side, min_bytes: int):
    """A long poll the handlers delayed, its DELAY_FETCH read off the ring; answers land in the list."""
    _, handlers, delayed, requests, conn = worker_side
    answers = []
    delayed.settle = lambda req, outcome: answers.append(outcome)
    assert _fetch(handlers, conn, min_bytes).deferred
    delayed.end_turn()
    (watch,) = _sent(requests)
    assert watch.kind == M.Kind.DELAY_FETCH
    return answers, watch


def test_the_worker_answers_its_own_delayed_fetch_on_its_append(worker_side):
    store, handlers, delayed, requests, conn = worker_side
    answers, watch = _parked_fetch(worker_side, 1)
    assert not _produce(handlers, conn, [b"hello"]).deferred
    delayed.answer_appended(lambda: None)
    assert len(answers) == 1, "the append satisfied the fetch: answered in this turn, not by the timer"
    records = [p for p in answers[0].pieces if not isinstance(p, (bytes, bytearray, memoryview))]
    assert sum(piece.length for piece in records) > 0, "the answer carries the appended records"
    assert len(delayed) == 0 and delayed.answered_on_append == 1
    delayed.end_turn()
    assert [(m.kind, m.items) for m in _sent(requests)] == [(M.Kind.CANCEL, [(watch.request_id,)])], \
        "the timer is told to drop the wait"
    # The timer completed it before it read the CANCEL: that completion finds no wait, and is dropped.
    late = M.decode(M.encode(M.Kind.COMPLETION, items=[(watch.request_id, M.Status.SATISFIED, 0)]))
    delayed.on_completion(late)
    assert len(answers) == 1, "a fetch is answered once"


def test_a_produce_answers_the_long_polls_it_satisfied_before_building_its_own_response(worker_side, monkeypatch):
    """Handlers.after_appends runs once the Produce has appended, before its response is encoded: the worker
    answers (and writes) the waiting consumer's fetch first, as its client is the one waiting."""
    store, handlers, delayed, requests, conn = worker_side
    answers, _ = _parked_fetch(worker_side, 1)
    order = []
    real_encode = handlers_module.encode_produce_response

    def encode_and_note(*args, **kwargs):
        order.append(f"produce response, {len(answers)} fetch answered")
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(handlers_module, "encode_produce_response", encode_and_note)
    handlers.after_appends = lambda: delayed.answer_appended(lambda: order.append("fetch answered"))
    assert not _produce(handlers, conn, [b"hello"]).deferred
    assert order == ["fetch answered", "produce response, 1 fetch answered"]


def test_an_append_short_of_min_bytes_leaves_the_fetch_to_the_timer(worker_side):
    store, handlers, delayed, requests, conn = worker_side
    answers, _ = _parked_fetch(worker_side, 100_000)
    _produce(handlers, conn, [b"small"])
    delayed.answer_appended(lambda: None)
    assert answers == [] and len(delayed) == 1
    delayed.end_turn()
    assert [m.kind for m in _sent(requests)] == [], "nothing answered, nothing to cancel"
    _produce(handlers, conn, [bytes(100_000)])
    delayed.answer_appended(lambda: None)
    assert len(answers) == 1 and len(delayed) == 0


def test_an_append_rings_a_watching_peer_at_once_and_its_later_appends_at_the_turns_end(worker_side):
    """Another worker waits on the row: the first append of a turn rings it before the request is done (it
    wakes while this worker answers its producer); later appends that turn ring it once more, at the end."""
    store, handlers, delayed, requests, conn = worker_side
    row = store.row("t", 0)
    with fresh_instance("peers") as instance:
        watches = WorkerWatches.create(shm_instance.watches_name(instance.instance_id), 2, store.table.rows)
        peer_bell = EventfdDoorbell()
        try:
            delayed._watches, delayed._index = watches, 0
            delayed._peer_bells = {1: EventfdDoorbell(os.dup(peer_bell.fileno()))}
            watches.counts[1, row] = 1  # worker 1 holds a long poll on the row
            _produce(handlers, conn, [b"first"])
            assert peer_bell.drain() == 1, "rung at the append itself, before the turn ends"
            _produce(handlers, conn, [b"second"])
            delayed.answer_appended(lambda: None)  # as the worker does after each request: rings nobody
            _produce(handlers, conn, [b"third"])
            assert peer_bell.drain() == 0, "rung once per turn at an append"
            delayed.end_turn()
            assert peer_bell.drain() == 1, "the later appends ring it once more at the turn's end"
            _produce(handlers, conn, [b"next turn"])
            assert peer_bell.drain() == 1, "a new turn rings at its first append again"
            watches.counts[1, row] = 0
            delayed.end_turn()
            _produce(handlers, conn, [b"nobody waits"])
            delayed.end_turn()
            assert peer_bell.drain() == 0, "a worker that waits on nothing is never rung"
        finally:
            delayed._peer_bells[1].close()
            delayed._watches = None
            peer_bell.close()
            watches.close()


# -- the handoff: a long poll reaches the timer only once it has waited timer.fetch_handoff_ms ----------------


def test_a_long_poll_answered_before_its_handoff_costs_the_timer_nothing(worker_side):
    store, handlers, delayed, requests, conn = worker_side
    delayed.fetch_handoff_ms = 10_000
    answers = []
    delayed.settle = lambda req, outcome: answers.append(outcome)
    assert _fetch(handlers, conn, 1).deferred  # max wait 30 s
    delayed.end_turn()
    assert _sent(requests) == [], "the wait stays in the worker until its handoff"
    assert 0 < delayed.next_handoff_ms(monotonic_ms()) <= 10_000
    _produce(handlers, conn, [b"soon"])
    delayed.answer_appended(lambda: None)
    delayed.end_turn()
    assert len(answers) == 1 and delayed.answered_on_append == 1
    assert _sent(requests) == [], "no DELAY_FETCH, no CANCEL: the timer never heard of it"
    assert delayed.handed_off == 0 and delayed.next_handoff_ms(monotonic_ms()) is None


def test_a_long_poll_still_waiting_at_its_handoff_goes_to_the_timer_with_its_first_deadline(worker_side):
    store, handlers, delayed, requests, conn = worker_side
    delayed.fetch_handoff_ms = 50
    answers = []
    delayed.settle = lambda req, outcome: answers.append(outcome)
    before = monotonic_ms()
    assert _fetch(handlers, conn, 1).deferred  # max wait 30 s
    after = monotonic_ms()
    delayed.end_turn()
    assert _sent(requests) == []
    due = delayed.next_handoff_ms(monotonic_ms())
    assert due is not None and due <= 50
    time.sleep((due + 5) / 1000)
    delayed.end_turn()
    (watch,) = _sent(requests)
    assert watch.kind == M.Kind.DELAY_FETCH
    assert before + 30_000 <= watch.deadline_ms <= after + 30_000, "the deadline is the one the fetch began with"
    assert delayed.handed_off == 1 and delayed.next_handoff_ms(monotonic_ms()) is None
    _produce(handlers, conn, [b"late"])
    delayed.answer_appended(lambda: None)
    delayed.end_turn()
    assert len(answers) == 1
    assert [(m.kind, m.items) for m in _sent(requests)] == [(M.Kind.CANCEL, [(watch.request_id,)])]


def test_a_long_poll_closed_before_its_handoff_sends_nothing_ever(worker_side):
    store, handlers, delayed, requests, conn = worker_side
    delayed.fetch_handoff_ms = 20
    assert _fetch(handlers, conn, 1).deferred
    delayed.cancel_connection(conn)
    time.sleep(0.03)
    delayed.end_turn()
    assert _sent(requests) == [] and len(delayed) == 0
    assert delayed.next_handoff_ms(monotonic_ms()) is None


def test_a_long_poll_no_longer_than_the_handoff_goes_to_the_timer_at_once(worker_side):
    store, handlers, delayed, requests, conn = worker_side
    delayed.fetch_handoff_ms = 60_000
    header = P.RequestHeader(P.FETCH, 11, 1, "test", 0)
    request = P.decode_request(P.FETCH, 11, R.fetch_body({"t": {0: 0}}, max_wait_ms=500, min_bytes=1))
    assert handlers.fetch(Request(conn, header, conn.new_slot()), request).deferred
    delayed.end_turn()
    (watch,) = _sent(requests)
    assert watch.kind == M.Kind.DELAY_FETCH and delayed.handed_off == 1


def test_a_read_committed_fetch_stops_at_the_lso_and_lists_the_aborted_transactions(worker_side):
    from shmbroker.node.storage.records import ControlType, build_batch
    from shmbroker.clients import wire

    store, handlers, delayed, requests, conn = worker_side
    plog = store.log(store.row("t", 0))

    def transactional(producer_id: int, sequence: int) -> bytes:
        return build_batch([(b"k", b"v")], 1000, producer_id=producer_id, producer_epoch=0, base_sequence=sequence,
                           transactional=True)

    plog.append(transactional(7, 0))  # 0: aborted below
    plog.append_marker(7, 0, ControlType.ABORT, 0)  # 1
    plog.append(transactional(8, 0))  # 2: still open
    plog.append(R.build_record_batch([b"after"]))  # 3

    def fetch(isolation_level: int):
        header = P.RequestHeader(P.FETCH, 11, 1, "test", 0)
        request = P.decode_request(P.FETCH, 11, R.fetch_body({"t": {0: 0}}, max_wait_ms=0,
                                                             isolation_level=isolation_level))
        outcome = handlers.fetch(Request(conn, header, conn.new_slot()), request)
        frame = b"".join(piece if isinstance(piece, (bytes, bytearray)) else
                         os.pread(piece.file if isinstance(piece.file, int) else piece.file.fileno(), piece.length,
                                  piece.position) for piece in outcome.pieces)
        (partition,) = wire.parse_fetch_response(memoryview(frame), 8, 11).partitions
        return partition

    committed = fetch(1)
    assert (committed.high_watermark, committed.last_stable_offset) == (4, 2)
    assert committed.aborted_transactions == ((7, 0),)
    assert [h.base_offset for _, h in R.records.iter_batches(committed.records)] == [0, 1]  # below the LSO
    uncommitted = fetch(0)
    assert uncommitted.aborted_transactions == ()
    assert [h.base_offset for _, h in R.records.iter_batches(uncommitted.records)] == [0, 1, 2, 3]
