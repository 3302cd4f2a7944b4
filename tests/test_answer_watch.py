"""The answer watch (workers.api.answer_watch, node.timer.groups.offsets_watch): on in every node the tests start, it
finds answers that break Kafka's rules, and the harness fails the test whose node logged one.

The rules are tried one by one on answers the node's own encoder builds, read by a watch over a real partition
store; then end to end, on a node serving a log that lost a segment (a hole the node never makes)."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import logging
import os
import socket
import time

import pytest
from kio.static.primitive import i32, i64

from shmbroker.clients import wire
from shmbroker.clients.wire import TopicPartition, millis
from scripts.harness import rawkafka as R
from scripts.harness.nodeproc import NodeProcess
from shmbroker.node.config import ANSWER_WATCH_BREACH, NodeConfig
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.groups.offsets import OffsetStore
from shmbroker.node.timer.groups.offsets_watch import OffsetsWatch
from shmbroker.workers.api.answer_watch import AnswerWatch
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.codecs.errors import ErrorCode
from shmbroker.workers.codecs.fetch import FetchPartitionResult, FetchTopicResult, encode_fetch_response
from shmbroker.workers.connection import Connection, Request
from tests.record_batches import SharedTable

FETCH_VERSION = 12  # sessions, topics by name
SESSION = 77


@pytest.fixture
def watch(tmp_path, caplog):
    """A watch over a real partition store with a topic `t` (delete) and `c` (compact), and a connection."""
    caplog.set_level(logging.ERROR, logger="shmbroker.answer_watch")
    with SharedTable(rows=4) as table:
        store = PartitionStore(str(tmp_path), table, NodeConfig().log, 4)
        assert store.create_topics([("t", 1, {}), ("c", 1, {"cleanup.policy": "compact"})]) == {
            "t": (0, None), "c": (0, None)}
        client, server = socket.socketpair()
        conn = Connection(server, "test", 1 << 20, 1 << 16)
        try:
            yield Watched(AnswerWatch(store), conn, caplog)
        finally:
            client.close()
            server.close()
            store.close()


class Watched:
    """Requests through the watch's hooks, as workers.worker sends them: dispatched in order, then answered."""

    def __init__(self, watch: AnswerWatch, conn: Connection, caplog) -> None:
        self.watch, self.conn, self.caplog = watch, conn, caplog
        self.correlation = 0

    def request(self, api_key: int, version: int, body: bytes) -> Request:
        self.correlation += 1
        frame = R.encode_request(api_key, version, self.correlation, body)[4:]
        header = P.parse_request_header(memoryview(frame))
        req = Request(self.conn, header, self.conn.new_slot())
        self.watch.dispatched(req, P.decode_request(api_key, version, memoryview(frame)[header.body_offset:]))
        return req

    def fetch(self, offsets: dict[str, int], session_id: int = 0, epoch: int = -1, committed: bool = False) -> Request:
        request = wire.fetch_request({TopicPartition(t, 0): o for t, o in offsets.items()}, max_wait_ms=0,
                                       min_bytes=1, max_bytes=1 << 20, partition_max_bytes=1 << 20,
                                       isolation_level=int(committed), version=FETCH_VERSION, topic_ids=None)
        request = dataclasses.replace(request, session_id=i32(session_id), session_epoch=i32(epoch))
        return self.request(P.FETCH, FETCH_VERSION, R.encode_body(request))

    def answer_fetch(self, req: Request, topic: str, batches: list[tuple[int, int]], high_watermark: int,
                     log_start: int = 0, last_stable: int | None = None, session_id: int = 0) -> None:
        records = b"".join(R.make_batch(last - base + 1, 10, base_offset=base) for base, last in batches)
        result = FetchPartitionResult(0, high_watermark=high_watermark, last_stable_offset=last_stable,
                                      log_start_offset=log_start, records=[records] if records else [])
        frame = encode_fetch_response(FETCH_VERSION, req.header.correlation_id, [FetchTopicResult(topic, [result])],
                                      session_id=session_id)
        self.conn.fill(req.slot, frame.pieces)
        self.watch.settled(req)

    def list_offsets(self, topic: str, timestamp: int) -> Request:
        return self.request(P.LIST_OFFSETS, 5, R.list_offsets_body({topic: [0]}, timestamp, version=5))

    def answer_list_offsets(self, req: Request, topic: str, offset: int) -> None:
        s = P.response_schema(P.LIST_OFFSETS, 5)
        answer = s.ListOffsetsResponse(throttle_time=millis(0), topics=(s.ListOffsetsTopicResponse(
            name=topic, partitions=(s.ListOffsetsPartitionResponse(
                partition_index=i32(0), error_code=ErrorCode.none, timestamp=i64(-1), offset=i64(offset),
                leader_epoch=i32(0)),)),))
        self.conn.fill(req.slot, [P.encode_response(P.LIST_OFFSETS, 5, req.header.correlation_id, answer)])
        self.watch.settled(req)

    def breaches(self) -> list[str]:
        return [r.getMessage() for r in self.caplog.records if ANSWER_WATCH_BREACH in r.getMessage()]


def test_answers_by_kafkas_rules_pass(watch):
    req = watch.fetch({"t": 5})
    watch.answer_fetch(req, "t", [(3, 7), (8, 9)], high_watermark=10)  # the batch holding 5 comes first
    req = watch.fetch({"c": 5})
    watch.answer_fetch(req, "c", [(9, 9), (12, 14)], high_watermark=15)  # compacted: 5..8 cleaned away
    req = watch.list_offsets("t", -1)
    watch.answer_list_offsets(req, "t", 10)
    req = watch.fetch({"t": 10})
    watch.answer_fetch(req, "t", [], high_watermark=10)
    assert watch.breaches() == [] and watch.watch.breaches == 0


@pytest.mark.parametrize("topic, offset, batches, high_watermark, breach", [
    ("t", 5, [(7, 9)], 10, "fetched from 5, the first batch starts after it (7..9) on a log that is not compacted"),
    ("c", 5, [(2, 4)], 10, "fetched from 5, the first batch ends before it (2..4)"),
    ("t", 0, [(0, 4), (6, 9)], 10, "a batch 6..9 after one ending at 4"),
    ("c", 0, [(0, 4), (3, 9)], 10, "a batch 3..9 after one ending at 4"),
    ("t", 0, [(0, 4), (5, 9)], 8, "a batch 5..9 at or past the high watermark 8"),
])
def test_a_fetch_answer_against_the_rules_is_a_breach(watch, topic, offset, batches, high_watermark, breach):
    req = watch.fetch({topic: offset})
    watch.answer_fetch(req, topic, batches, high_watermark)
    found = watch.breaches()
    assert len(found) == 1 and breach in found[0], found
    assert f"correlation id {req.header.correlation_id}" in found[0] and "api 1 v12" in found[0]


def test_offsets_that_go_back_on_a_connection_are_breaches(watch):
    req = watch.fetch({"t": 0})
    watch.answer_fetch(req, "t", [], high_watermark=10, log_start=4, last_stable=8)
    req = watch.fetch({"t": 0})
    watch.answer_fetch(req, "t", [], high_watermark=9, log_start=3, last_stable=7)
    found = watch.breaches()
    assert ["high watermark 9 after 10" in found[0], "last stable offset 7 after 8" in found[1],
            "log start offset 3 after 4" in found[2]] == [True] * 3, found


def test_a_list_offsets_answer_binds_the_fetches_after_it(watch):
    req = watch.list_offsets("t", -1)
    watch.answer_list_offsets(req, "t", 12)
    req = watch.fetch({"t": 0})
    watch.answer_fetch(req, "t", [(0, 9)], high_watermark=10)
    found = watch.breaches()
    assert len(found) == 1 and "high watermark 10 after 12" in found[0], found


def test_answers_are_checked_in_the_order_the_client_reads_them(watch):
    """A long poll answered after a ListOffsets sent behind it: the client reads the poll's answer first."""
    poll = watch.fetch({"t": 0})
    listed = watch.list_offsets("t", -1)
    watch.answer_list_offsets(listed, "t", 10)  # answered first, read second
    assert watch.breaches() == []
    watch.answer_fetch(poll, "t", [(0, 11)], high_watermark=12)
    found = watch.breaches()
    assert len(found) == 1 and "latest offset 10 after 12" in found[0], found


def test_an_incremental_fetch_is_checked_at_the_offsets_its_session_holds(watch):
    req = watch.fetch({"t": 5, "c": 0}, epoch=0)
    watch.answer_fetch(req, "t", [(5, 5)], high_watermark=6, session_id=SESSION)
    req = watch.fetch({}, session_id=SESSION, epoch=1)  # nothing changed: t is read from 5 again
    watch.answer_fetch(req, "t", [(6, 6)], high_watermark=7, session_id=SESSION)
    found = watch.breaches()
    assert len(found) == 1 and "fetched from 5, the first batch starts after it (6..6)" in found[0], found
    req = watch.fetch({"t": 6}, session_id=SESSION, epoch=2)  # the client moved on: 6 is right
    watch.answer_fetch(req, "t", [(6, 6)], high_watermark=7, session_id=SESSION)
    assert len(watch.breaches()) == 1


# ------------------------------------------------------------------------------ end to end


def remove_the_middle_segment(partition_dir: str) -> None:
    """Delete the files of the second of three segments: a log with a hole that neither the node nor Kafka leaves
    but after a loss (Kafka's reader would skip it too, the watch calls it what it is)."""
    logs = sorted(glob.glob(os.path.join(partition_dir, "*.log")))
    assert len(logs) == 3, logs
    for path in glob.glob(logs[1][:-len(".log")] + ".*"):
        os.unlink(path)


@pytest.mark.node
def test_a_node_that_answers_across_a_hole_fails_the_test_that_started_it(tmp_path):
    node = NodeProcess(tmp_path, workers=1)
    try:
        node.start()
        with R.RawConnection("127.0.0.1", node.port) as conn:
            one_batch_per_segment = {"segment.bytes": "100"}
            created = conn.call(P.CREATE_TOPICS, 4, R.create_topics_body({"holes": 1}, configs=one_batch_per_segment))
            assert created.topics[0].error_code == 0
            for _ in range(3):
                conn.call(P.PRODUCE, 8, R.produce_body({"holes": {0: R.make_batch(5, 10)}}))
        node.stop()
        remove_the_middle_segment(str(node.data_dir / "holes-0"))
        node.start()
        with R.RawConnection("127.0.0.1", node.port) as conn:
            fetched = R.parse_fetch_response(11, conn.request(P.FETCH, 11, R.fetch_body({"holes": {0: 5}})))
        assert [(p.high_watermark, p.next_offset) for p in fetched.partitions] == [(15, 15)]  # 0..4, 10..14
        with pytest.raises(AssertionError, match=ANSWER_WATCH_BREACH) as failed:
            node.stop()
        assert "holes-0: fetched from 5, the first batch starts after it (10..14)" in str(failed.value)
        assert len(node.breaches()) == 1
    finally:
        with contextlib.suppress(AssertionError):  # the breach, said once above
            node.close()


@pytest.mark.node
def test_every_process_of_a_test_node_watches_its_answers(node_factory):
    node = node_factory(workers=2)
    assert node.log(-1).count("answer watch on") == 3  # two workers and the timer


# ------------------------------------------------------------------------------ committed offsets


@pytest.fixture
def committed_offsets(tmp_path, caplog):
    """A watched OffsetStore over a real partition store; the test plays its flusher (`flushes`: the callbacks
    waiting for each commit's fsync, in the order they were written)."""
    caplog.set_level(logging.ERROR, logger="shmbroker.offsets_watch")
    with SharedTable(rows=4) as table:
        store = PartitionStore(str(tmp_path), table, NodeConfig().log, 4)
        flushes: list = []
        offsets = OffsetStore(store, lambda rows, ends, deadline_ms, done: flushes.append(done),
                              lambda name, job: None, load_bytes_per_turn=1 << 20, load_interval_ms=0,
                              segment_bytes=1 << 20, commit_timeout_ms=1000)
        assert offsets.load_step(0)
        watch = OffsetsWatch(offsets)
        try:
            yield offsets, flushes, watch, lambda: [r.getMessage() for r in caplog.records
                                                    if ANSWER_WATCH_BREACH in r.getMessage()]
        finally:
            store.close()


def test_reads_of_the_last_acknowledged_commits_pass(committed_offsets):
    offsets, flushes, watch, breaches = committed_offsets
    acked = []
    for offset in (10, 20):
        offsets.commit("g", {("t", 0): (offset, -1, None)}, 0, lambda flushed, fault=False, o=offset: acked.append(o))
    for flushed in flushes:
        flushed(True)
    assert acked == [10, 20] and offsets.fetch("g", [("t", 0)])[("t", 0)].offset == 20
    offsets.delete("g", [("t", 0)], 0)
    assert offsets.fetch("g", None) == {} and breaches() == [] and watch.breaches == 0


def test_a_read_that_misses_the_last_acknowledged_commit_is_a_breach(committed_offsets):
    """Two commits of one partition whose fsyncs complete in the other order: both are acknowledged, the one
    written last must stay (as it does in the log), and the table keeps the first."""
    offsets, flushes, watch, breaches = committed_offsets
    for offset in (10, 20):
        offsets.commit("g", {("t", 0): (offset, -1, None)}, 0, lambda flushed, fault=False: None)
    flushes[1](True)
    flushes[0](True)
    assert offsets.fetch("g", [("t", 0)])[("t", 0)].offset == 10
    found = breaches()
    assert len(found) == 1 and "group 'g' reads t-0 at offset 10; the last commit acknowledged was 20" in found[0]


@pytest.mark.node
def test_a_fetch_pipelined_behind_a_long_poll_never_answers_an_older_high_watermark(node_factory):
    """Found by the watch (aiokafka, after a rebalance, sends a new Fetch while its last one still waits): the
    node answered the second at once, from the log as it was, while the first, still waiting, was answered later
    from a newer state; the client read the newer high watermark, then the older one. Kafka reads the second
    only once it answered the first. Now the first is answered as the second arrives, then the second."""
    node = node_factory(workers=1)
    with R.RawConnection("127.0.0.1", node.port) as conn:
        assert conn.call(P.CREATE_TOPICS, 4, R.create_topics_body({"polled": 1, "busy": 1})).topics[0].error_code == 0
        ten = R.make_batch(10, 10)
        conn.call(P.PRODUCE, 8, R.produce_body({"polled": {0: ten}, "busy": {0: ten}}))
    with R.RawConnection("127.0.0.1", node.port) as reader, R.RawConnection("127.0.0.1", node.port) as writer:
        reader.send(P.FETCH, 11, R.fetch_body({"polled": {0: 10}}, max_wait_ms=5000))  # waits: nothing past 10
        time.sleep(0.3)
        reader.send(P.FETCH, 11, R.fetch_body({"polled": {0: 10}, "busy": {0: 0}}, max_wait_ms=5000))  # has records
        time.sleep(0.3)
        writer.call(P.PRODUCE, 8, R.produce_body({"polled": {0: R.make_batch(5, 10)}}))
        answers = [R.parse_fetch_response(11, reader.recv_response()[3]) for _ in range(2)]
    polled = [next(p.high_watermark for p in answer.partitions if p.topic == "polled") for answer in answers]
    assert polled[0] <= polled[1], polled  # the old node: [15, 10]
