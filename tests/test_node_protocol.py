"""The live node at the protocol level: error codes, bad input, long polls, shutdown, and a fuzz
run while a well-behaved client keeps producing and consuming."""

from __future__ import annotations

import os
import random
import select
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from scripts.harness import rawkafka as R
from tests.test_clients import CLIENT_TIMEOUT_S, consume_all, create_topic, produce
from tests.test_crash import BackgroundProducer
from tests.test_hardening import worker_of
from tests.test_stats_cli import stats_json
from tests.waiting import wait_for
from scripts.harness.nodeproc import CLI

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, CREATE_TOPICS, INIT_PRODUCER_ID = 0, 1, 2, 3, 18, 19, 22
NONE, OFFSET_OUT_OF_RANGE, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION, UNSUPPORTED_VERSION = 0, 1, 2, 3, 35


def connect(node) -> R.RawConnection:
    return R.RawConnection("127.0.0.1", node.port)


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def raw_socket(node) -> socket.socket:
    return socket.create_connection(("127.0.0.1", node.port), timeout=5)


def test_api_versions_of_unknown_version_gets_error_35_with_v0_body(node):
    sock = raw_socket(node)
    frame = R.encode_request(API_VERSIONS, 99, 7, b"\x00\x00")  # some future flexible body
    sock.sendall(frame)
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    body = sock.recv(size, socket.MSG_WAITALL)
    correlation_id, error_code, count = struct.unpack_from(">ihi", body)
    assert (correlation_id, error_code) == (7, UNSUPPORTED_VERSION)
    apis = {struct.unpack_from(">hhh", body, 10 + 6 * i)[0] for i in range(count)}
    assert {PRODUCE, FETCH, METADATA, API_VERSIONS} <= apis
    sock.close()


@pytest.mark.parametrize("bad", ["unknown_api", "huge_length", "negative_length", "truncated_header",
                                 "unsupported_version", "garbage_body"])
def test_bad_input_closes_only_that_connection(node, bad):
    frames = {
        "unknown_api": R.encode_request(999, 0, 1, b""),
        "huge_length": struct.pack(">i", 200 * 1024 * 1024) + b"\x00" * 16,
        "negative_length": struct.pack(">i", -5) + b"\x00" * 16,
        "truncated_header": struct.pack(">i", 1) + b"\x00",
        "unsupported_version": R.encode_request(METADATA, 99, 1, b""),
        "garbage_body": R.encode_request(METADATA, 8, 1, b"\xff\xff\xff\x7f garbage"),
    }
    with connect(node) as good:
        sock = raw_socket(node)
        sock.sendall(frames[bad])
        assert closed_by_peer(sock)
        sock.close()
        # Another connection, opened before, is untouched and the worker is the same process.
        assert good.call(API_VERSIONS, 3, R.api_versions_body(3)).error_code == NONE
    assert "closing connection" in node.log()


def test_corrupt_batch_is_rejected_and_writes_nothing(node):
    create_topic(node.bootstrap, "crc", 1)
    batch = bytearray(R.build_record_batch([b"payload"]))
    batch[-1] ^= 0xFF
    with connect(node) as conn:
        body = R.produce_body({"crc": {0: bytes(batch)}}, acks=1)
        response = conn.call(PRODUCE, 8, body)
        assert response.responses[0].partition_responses[0].error_code == CORRUPT_MESSAGE
        offsets = conn.call(LIST_OFFSETS, 5, R.list_offsets_body({"crc": [0]}, timestamp=-1))
        assert offsets.topics[0].partitions[0].offset == 0
        good = conn.call(PRODUCE, 8, R.produce_body({"crc": {0: R.build_record_batch([b"ok"])}}, acks=1))
        assert good.responses[0].partition_responses[0].base_offset == 0


def test_a_failed_produce_with_acks_0_closes_its_connection_once_the_answers_before_it_are_out(node):
    """As Kafka: a Produce with acks=0 has no answer to carry an error, so a failed one closes the connection (one
    log line naming the partitions and errors); a clean one leaves it open."""
    create_topic(node.bootstrap, "acks0", 1)
    with connect(node) as conn:
        conn.send(PRODUCE, 8, R.produce_body({"acks0": {0: R.build_record_batch([b"kept"])}}, acks=0),
                  expect_response=False)
        assert conn.call(LIST_OFFSETS, 5, R.list_offsets_body({"acks0": [0]})).topics[0].partitions[0].offset == 1
        # A long poll waits in front of the failing Produce: its answer still comes, then the close.
        ids = conn.send_frames([
            (FETCH, 11, R.encode_request(FETCH, 11, 0, R.fetch_body({"acks0": {0: 1}}, max_wait_ms=500, min_bytes=1))),
            (PRODUCE, 8, R.encode_request(PRODUCE, 8, 0, R.produce_body(
                {"acks0": {0: R.build_record_batch([b"lost"]), 5: R.build_record_batch([b"x"])}}, acks=0))),
            (API_VERSIONS, 3, R.encode_request(API_VERSIONS, 3, 0, R.api_versions_body(3))),
        ])
        assert conn.recv_response()[0] == ids[0]
        assert closed_by_peer(conn.sock)
    assert "Produce with acks=0 failed (acks0-5: UNKNOWN_TOPIC_OR_PARTITION)" in node.log()
    with connect(node) as conn:  # the other partition of that request was written, as Kafka does
        assert conn.call(LIST_OFFSETS, 5, R.list_offsets_body({"acks0": [0]})).topics[0].partitions[0].offset == 2


def test_fetch_out_of_range_and_unknown_partition(node):
    create_topic(node.bootstrap, "range", 1)
    with connect(node) as conn:
        body = R.fetch_body({"range": {0: 1000, 5: 0}}, max_wait_ms=0)
        result = R.parse_fetch_response(11, conn.request(FETCH, 11, body))
        errors = {p.partition: p.error_code for p in result.partitions}
        assert errors == {0: OFFSET_OUT_OF_RANGE, 5: UNKNOWN_TOPIC_OR_PARTITION}


def test_long_poll_waits_for_data_then_answers(node):
    create_topic(node.bootstrap, "poll", 1)
    with connect(node) as consumer, connect(node) as producer:
        started = time.monotonic()
        consumer.send(FETCH, 11, R.fetch_body({"poll": {0: 0}}, max_wait_ms=10_000, min_bytes=1))
        time.sleep(0.3)
        producer.call(PRODUCE, 8, R.produce_body({"poll": {0: R.build_record_batch([b"wake up"])}}, acks=1))
        _, _, _, body = consumer.recv_response()
        waited = time.monotonic() - started
        result = R.parse_fetch_response(11, body)
        assert result.record_count == 1
        assert 0.3 <= waited < 5, "the fetch must wait for the append, then answer without waiting max_wait"
        # With nothing to come, it waits max_wait and answers empty.
        started = time.monotonic()
        empty = R.parse_fetch_response(11, consumer.request(FETCH, 11, R.fetch_body({"poll": {0: 1}}, max_wait_ms=400)))
        assert empty.record_count == 0 and empty.partitions[0].error_code == NONE
        assert time.monotonic() - started >= 0.39


def test_an_expired_long_poll_is_read_again_only_if_its_partitions_moved(node_factory):
    """An idle long poll that expires with every partition as its first read saw it is answered with that read,
    not read again; one whose partition moved meanwhile (an append short of min_bytes) is read again, and its
    answer carries the record and the new high watermark."""
    node = node_factory(workers=1, config="[stats]\npublish_interval_ms = 100\n")
    create_topic(node.bootstrap, "expiring", 2)

    def from_first_read() -> int:
        return stats_json(node)["totals"].get("fetches_answered_from_first_read", 0)

    with connect(node) as consumer, connect(node) as producer:
        started = time.monotonic()
        idle = R.parse_fetch_response(11, consumer.request(FETCH, 11, R.fetch_body(
            {"expiring": {0: 0, 1: 0}}, max_wait_ms=300, min_bytes=1)))
        assert time.monotonic() - started >= 0.29
        assert [(p.partition, p.error_code, p.high_watermark, p.record_count) for p in idle.partitions] == \
            [(0, NONE, 0, 0), (1, NONE, 0, 0)]
        wait_for(lambda: from_first_read() == 1, what="the idle long poll answered from its first read")

        consumer.send(FETCH, 11, R.fetch_body({"expiring": {0: 0, 1: 0}}, max_wait_ms=1500, min_bytes=10_000_000))
        time.sleep(0.3)
        body = R.produce_body({"expiring": {1: R.build_record_batch([b"short of min_bytes"])}}, acks=1)
        assert producer.call(PRODUCE, 8, body).responses[0].partition_responses[0].error_code == NONE
        moved = R.parse_fetch_response(11, consumer.recv_response()[3])
        assert [(p.partition, p.error_code, p.high_watermark, p.record_count) for p in moved.partitions] == \
            [(0, NONE, 0, 0), (1, NONE, 1, 1)]
        time.sleep(0.3)  # a publish interval and then some
        assert from_first_read() == 1


def _connections_on_two_workers(node, attempts: int = 64) -> tuple[R.RawConnection, R.RawConnection]:
    """Two connections accepted by different workers (the kernel spreads connections over the workers'
    listeners; which worker holds one is read from its sockets)."""
    held: dict[int, R.RawConnection] = {}
    for _ in range(attempts):
        conn = connect(node)
        owner = wait_for(lambda: worker_of(node, conn.sock), timeout=5, what="a worker to accept")
        if owner in held:
            conn.close()
        else:
            held[owner] = conn
        if len(held) == 2:
            first, second = held.values()
            return first, second
    for conn in held.values():
        conn.close()
    raise AssertionError(f"no connection reached each worker in {attempts} attempts")


def test_a_created_topic_is_known_to_every_worker_once_its_creation_is_answered(node_factory):
    """A CreateTopics answer means every worker knows the topic: a request sent after it, on a connection another
    worker holds, finds the topic even when that worker gets the request and the timer's catalog change in the
    same turn (here: it was stopped while both arrived, so its one wake-up reports both)."""
    node = node_factory(workers=2)
    creator, other = _connections_on_two_workers(node)
    other_worker = worker_of(node, other.sock)
    try:
        os.kill(other_worker, signal.SIGSTOP)
        try:
            created = creator.call(CREATE_TOPICS, 4, R.create_topics_body({"fresh": 1}))
            assert [(t.name, t.error_code) for t in created.topics] == [("fresh", NONE)]
            other.send(FETCH, 11, R.fetch_body({"fresh": {0: 0}}, max_wait_ms=0))
            time.sleep(0.2)  # the request reaches the stopped worker's socket
        finally:
            os.kill(other_worker, signal.SIGCONT)
        fetched = R.parse_fetch_response(11, other.recv_response()[3])
        assert [(p.partition, p.error_code) for p in fetched.partitions] == [(0, NONE)]
    finally:
        creator.close()
        other.close()


@pytest.mark.parametrize("workers", [1, 2], ids=["same-worker", "other-worker"])
def test_an_append_answers_a_long_poll_without_the_timer(node_factory, workers):
    # One worker: its append answers the fetch in the same turn, as Kafka's request handler completes the
    # fetches its append satisfies. Two, with the fetch on the other one: the appending worker rings the
    # doorbell of the worker that counts a watch on the row (the shared watches table), which checks its waits.
    # The timer is stopped meanwhile, so the answer cannot have come from it; once it runs again it has dropped
    # the wait (the CANCEL), and nothing waits there.
    node = node_factory(workers=workers, config="[stats]\npublish_interval_ms = 100\n")
    create_topic(node.bootstrap, "answered", 1)
    (timer,) = node.pids("timer")

    def totals() -> dict:
        return stats_json(node)["totals"]

    consumer, producer = _connections_on_two_workers(node) if workers == 2 else (connect(node), connect(node))
    with consumer, producer:
        consumer.send(FETCH, 11, R.fetch_body({"answered": {0: 0}}, max_wait_ms=30_000, min_bytes=1))
        wait_for(lambda: totals()["purgatory_fetch_pending"] == 1, what="the timer to hold the long poll")
        node.stop_outside_partition_locks(timer)  # the append needs the partition's lock
        try:
            started = time.monotonic()
            body = R.produce_body({"answered": {0: R.build_record_batch([b"v"])}}, acks=1)
            assert producer.call(PRODUCE, 8, body).responses[0].partition_responses[0].error_code == NONE
            assert R.parse_fetch_response(11, consumer.recv_response()[3]).record_count == 1
            assert time.monotonic() - started < 5
        finally:
            os.kill(timer, signal.SIGCONT)
    done = wait_for(lambda: (lambda t: t if t["purgatory_fetch_pending"] == 0 else None)(totals()),
                    what="the timer to drop the answered wait")
    assert done["fetches_answered_on_append"] == 1


def test_a_long_poll_reaches_the_timer_only_past_its_handoff(node_factory):
    # timer.fetch_handoff_ms: a long poll an append answers sooner never reaches the timer (no purgatory entry,
    # no DELAY_FETCH or CANCEL frame); one still waiting then is handed over and held there to its deadline.
    node = node_factory(workers=1, config="[stats]\npublish_interval_ms = 100\n[timer]\nfetch_handoff_ms = 1000\n")
    create_topic(node.bootstrap, "handoff", 1)

    def totals() -> dict:
        return stats_json(node)["totals"]

    with connect(node) as consumer, connect(node) as producer:
        def append() -> None:
            body = R.produce_body({"handoff": {0: R.build_record_batch([b"v"])}}, acks=1)
            assert producer.call(PRODUCE, 8, body).responses[0].partition_responses[0].error_code == NONE

        consumer.send(FETCH, 11, R.fetch_body({"handoff": {0: 0}}, max_wait_ms=30_000, min_bytes=1))
        time.sleep(0.2)
        append()
        assert R.parse_fetch_response(11, consumer.recv_response()[3]).record_count == 1
        quick = wait_for(lambda: (lambda t: t if t["fetches_answered_on_append"] == 1 else None)(totals()),
                         what="the worker to publish its answer")
        assert quick["fetches_handed_off"] == 0
        assert quick["purgatory_fetch_completed"] == quick["purgatory_fetch_pending"] == 0

        consumer.send(FETCH, 11, R.fetch_body({"handoff": {0: 1}}, max_wait_ms=30_000, min_bytes=1))
        held = wait_for(lambda: (lambda t: t if t["purgatory_fetch_pending"] == 1 else None)(totals()),
                        what="the handed-off long poll in the timer")
        assert held["fetches_handed_off"] == 1
        append()
        assert R.parse_fetch_response(11, consumer.recv_response()[3]).record_count == 1
    done = wait_for(lambda: (lambda t: t if t["purgatory_fetch_pending"] == 0 else None)(totals()),
                    what="the timer to drop the answered wait")
    assert done["fetches_answered_on_append"] == 2 and done["fetches_handed_off"] == 1


def test_a_long_poll_answered_by_an_append_is_written_before_the_produce_ack(node_factory):
    # The consumer is what waits on the record, so its answer leaves first: on loopback a send delivers at
    # once, so when the producer holds its ack the consumer's answer must already be readable. Several
    # producer connections and rounds, so that no order of the worker's dirty set passes by chance.
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "first", 1)
    producers = [connect(node) for _ in range(4)]
    try:
        with connect(node) as consumer:
            for round_ in range(24):
                consumer.send(FETCH, 11, R.fetch_body({"first": {0: round_}}, max_wait_ms=30_000, min_bytes=1))
                time.sleep(0.02)  # the fetch waits in the worker before the append
                producer = producers[round_ % len(producers)]
                body = R.produce_body({"first": {0: R.build_record_batch([b"v"])}}, acks=1)
                assert producer.call(PRODUCE, 8, body).responses[0].partition_responses[0].error_code == NONE
                readable, _, _ = select.select([consumer.sock], [], [], 0)
                assert readable, f"round {round_}: the produce ack came before the fetch's answer"
                assert R.parse_fetch_response(11, consumer.recv_response()[3]).record_count == 1
    finally:
        for producer in producers:
            producer.close()


def test_sigterm_answers_inflight_long_poll_then_exits_0(node_factory):
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "bye", 1)
    with connect(node) as consumer:
        consumer.send(FETCH, 11, R.fetch_body({"bye": {0: 0}}, max_wait_ms=1500, min_bytes=1))
        time.sleep(0.2)
        node.proc.send_signal(15)
        _, _, _, body = consumer.recv_response()
        assert R.parse_fetch_response(11, body).partitions[0].error_code == NONE
    assert node.proc.wait(timeout=CLIENT_TIMEOUT_S) == 0
    assert node.leftovers() == []


def test_list_offsets_earliest_latest_and_by_time(node):
    create_topic(node.bootstrap, "times", 1)
    records = [{"value": f"v{i}".encode(), "partition": 0, "timestamp": 1_000_000 + 1000 * i} for i in range(20)]
    produce(node.bootstrap, "times", records, **{"linger.ms": 0, "batch.num.messages": 1})
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "x"})
    found = consumer.offsets_for_times([TopicPartition("times", 0, 1_000_000 + 1000 * 7 - 1)], timeout=CLIENT_TIMEOUT_S)
    assert found[0].offset == 7
    beyond = consumer.offsets_for_times([TopicPartition("times", 0, 9_000_000)], timeout=CLIENT_TIMEOUT_S)
    assert beyond[0].offset == -1  # no record at or after that time: the latest offset is unknown (-1)
    assert consumer.get_watermark_offsets(TopicPartition("times", 0), timeout=CLIENT_TIMEOUT_S) == (0, 20)
    consumer.close()


def test_create_and_delete_topics_errors(node):
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    create_topic(node.bootstrap, "exists", 2)

    def create_error(topic: NewTopic) -> str:
        with pytest.raises(KafkaException) as info:
            admin.create_topics([topic])[topic.topic].result(timeout=CLIENT_TIMEOUT_S)
        return info.value.args[0].name()

    assert create_error(NewTopic("exists", 1, 1)) == "TOPIC_ALREADY_EXISTS"
    assert create_error(NewTopic("three-replicas", 1, 3)) == "INVALID_REPLICATION_FACTOR"
    assert create_error(NewTopic("bad name!", 1, 1)) == "TOPIC_EXCEPTION"  # librdkafka's name for code 17
    produce(node.bootstrap, "exists", [{"value": b"x", "partition": 1}])
    admin.delete_topics(["exists"])["exists"].result(timeout=CLIENT_TIMEOUT_S)
    assert "exists" not in admin.list_topics(timeout=CLIENT_TIMEOUT_S).topics
    assert not (node.data_dir / "exists-1").exists()
    with pytest.raises(KafkaException) as info:
        admin.delete_topics(["exists"])["exists"].result(timeout=CLIENT_TIMEOUT_S)
    assert info.value.args[0].name() == "UNKNOWN_TOPIC_OR_PART"
    # The name can be used again, from offset 0.
    create_topic(node.bootstrap, "exists", 1)
    produce(node.bootstrap, "exists", [{"value": b"again", "partition": 0}])
    assert [m.offset() for m in consume_all(node.bootstrap, "exists", 1, 1)] == [0]


def test_producer_ids_unique_across_restarts(node):
    def init_producer_id() -> int:
        body = R.request_body(INIT_PRODUCER_ID, 1, "InitProducerIdRequest", transactional_id=None,
                              transaction_timeout=R.millis(60000))
        with connect(node) as conn:
            response = conn.call(INIT_PRODUCER_ID, 1, body)
        assert response.error_code == NONE
        return response.producer_id

    first = [init_producer_id() for _ in range(3)]
    node.kill_all()  # even kill -9 must not make an id come back
    node.start()
    after = [init_producer_id() for _ in range(3)]
    ids = first + after
    assert len(set(ids)) == len(ids) and ids == sorted(ids)


def _fuzz_frames(rng: random.Random, templates: list[bytes]) -> bytes:
    """One hostile input: random bytes, a truncated or bit-flipped real request, a huge or
    negative length, or a real request under a wrong version."""
    choice = rng.randrange(6)
    template = rng.choice(templates)
    if choice == 0:
        return rng.randbytes(rng.randrange(1, 300))
    if choice == 1:
        return template[: rng.randrange(1, len(template))]
    if choice == 2:
        flipped = bytearray(template)
        for _ in range(rng.randrange(1, 8)):
            flipped[rng.randrange(4, len(flipped))] ^= 1 << rng.randrange(8)
        return bytes(flipped)
    if choice == 3:
        return struct.pack(">i", rng.choice([2**31 - 1, 100 * 1024 * 1024 + 1, -1, -(2**31)])) + rng.randbytes(20)
    if choice == 4:
        wrong = bytearray(template)
        struct.pack_into(">h", wrong, 6, rng.choice([-1, 12, 99, 32767]))
        return bytes(wrong)
    # A valid size prefix with a random body.
    body = rng.randbytes(rng.randrange(0, 200))
    return struct.pack(">i", len(body)) + body


@pytest.mark.parametrize("workers", [1, 2])
def test_fuzz_live_node_while_clients_work(node_factory, workers):
    node = node_factory(workers=workers)
    create_topic(node.bootstrap, "steady", 2)
    worker_pids = set(node.pids("worker"))
    timer_pids = set(node.pids("timer"))
    load = BackgroundProducer(node.bootstrap, "steady", 2).start()
    templates = [
        R.encode_request(API_VERSIONS, 3, 1, R.api_versions_body(3)),
        R.encode_request(METADATA, 8, 1, R.metadata_body(["steady"])),
        R.encode_request(PRODUCE, 8, 1, R.produce_body({"steady": {0: R.build_record_batch([b"fuzz"] * 3)}}, acks=1)),
        R.encode_request(FETCH, 11, 1, R.fetch_body({"steady": {0: 0, 1: 0}}, max_wait_ms=50)),
        R.encode_request(LIST_OFFSETS, 5, 1, R.list_offsets_body({"steady": [0, 1]})),
    ]
    rng = random.Random(20261121 + workers)
    deadline = time.monotonic() + 60
    sent = 0
    while sent < 400 and time.monotonic() < deadline:
        sock = raw_socket(node)
        try:
            sock.sendall(_fuzz_frames(rng, templates))
            if rng.random() < 0.5:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the node may close first: that is an answer too
        sock.close()
        sent += 1
    load.wait_acked(len(load.acked) + 200)
    load.stop()
    assert load.failed == []
    assert set(node.pids("worker")) == worker_pids and set(node.pids("timer")) == timer_pids, "no process may die"
    assert "Traceback" not in node.log()
    # Fuzz frames that happened to be valid produces may have added records; the client's are all there once.
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "x", "enable.auto.commit": False})
    consumer.assign([TopicPartition("steady", p, 0) for p in range(2)])
    values = []
    end = time.monotonic() + CLIENT_TIMEOUT_S
    while time.monotonic() < end:
        msg = consumer.poll(0.5)
        if msg is None:
            if load.acked <= set(values):
                break
            continue
        if not msg.error():
            values.append(msg.value())
    consumer.close()
    client_values = [v for v in values if v.startswith(b"value-")]
    assert len(client_values) == len(set(client_values)) and set(client_values) == load.acked


def test_pipelined_responses_keep_request_order(node):
    """A long poll first, then quick requests on the same connection: answers come in request order."""
    create_topic(node.bootstrap, "order", 1)
    with connect(node) as conn:
        requests = [
            (FETCH, 11, R.fetch_body({"order": {0: 0}}, max_wait_ms=700, min_bytes=1)),
            (API_VERSIONS, 3, R.api_versions_body(3)),
            (METADATA, 8, R.metadata_body(["order"])),
            (PRODUCE, 8, R.produce_body({"order": {0: R.build_record_batch([b"x"])}}, acks=1)),
        ]
        ids = conn.send_frames([(key, version, R.encode_request(key, version, 0, body))
                                for key, version, body in requests])
        got = [conn.recv_response()[0] for _ in ids]
    assert got == ids


def test_idempotent_retry_after_restart_gets_original_offsets(node):
    create_topic(node.bootstrap, "idem", 1)
    producer_id = 4242

    def send(sequence: int, values: list[bytes]):
        batch = R.build_record_batch(values, producer_id=producer_id, producer_epoch=0, base_sequence=sequence)
        with connect(node) as conn:
            return conn.call(PRODUCE, 8, R.produce_body({"idem": {0: batch}}, acks=-1)).responses[0].partition_responses[0]

    first = send(0, [b"a", b"b"])
    second = send(2, [b"c"])
    assert (first.error_code, first.base_offset, second.base_offset) == (NONE, 0, 2)
    node.kill_all()
    node.start()
    retried = send(0, [b"a", b"b"])  # a retry of an acknowledged batch: same offsets, no second copy
    assert (retried.error_code, retried.base_offset) == (NONE, 0)
    gap = send(7, [b"z"])
    assert gap.error_code == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
    assert consume_all(node.bootstrap, "idem", 1, 3)[-1].value() == b"c"


def test_acks_all_times_out_when_the_fsync_does_not_come(node_factory):
    # A stalled timer process (SIGSTOP: its flusher thread stops with it) never fsyncs the batch: the worker
    # answers REQUEST_TIMED_OUT by itself, and the node serves on once the timer runs again. The stats count
    # the error the wait added (the appends themselves went well).
    node = node_factory(workers=1, config="[timer]\ndelayed_grace_ms = 200\n[stats]\npublish_interval_ms = 100\n")
    create_topic(node.bootstrap, "slowdisk", 1)
    (timer,) = node.pids("timer")
    with connect(node) as conn:
        node.stop_outside_partition_locks(timer)  # the append needs the partition's lock
        try:
            started = time.monotonic()
            body = R.produce_body({"slowdisk": {0: R.build_record_batch([b"x"])}}, acks=-1, timeout_ms=300)
            result = conn.call(PRODUCE, 8, body).responses[0].partition_responses[0]
            assert result.error_code == 7  # REQUEST_TIMED_OUT
            assert time.monotonic() - started >= 0.29
        finally:
            os.kill(timer, signal.SIGCONT)
        ok = conn.call(PRODUCE, 8, R.produce_body({"slowdisk": {0: R.build_record_batch([b"y"])}}, acks=-1))
        assert ok.responses[0].partition_responses[0].error_code == NONE
    counted = wait_for(lambda: (lambda doc: doc if doc["apis"]["Produce"]["requests"] >= 2 else None)(stats_json(node)),
                       what="both produces in the stats")
    assert counted["errors"] == {"REQUEST_TIMED_OUT": 1}
    assert counted["apis"]["Produce"]["error_responses"] == 1


def test_no_auto_create_when_disabled(node_factory):
    node = node_factory(workers=1, config="[topics]\nauto_create_topics = false\n")
    with connect(node) as conn:
        metadata = conn.call(METADATA, 8, R.metadata_body(["nope"]))
        assert metadata.topics[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
        result = conn.call(PRODUCE, 8, R.produce_body({"nope": {0: R.build_record_batch([b"x"])}}, acks=1))
        assert result.responses[0].partition_responses[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert not (node.data_dir / "nope-0").exists()


def test_zstd_needs_produce_v7(node):
    create_topic(node.bootstrap, "zstd", 1)
    batch = bytearray(R.build_record_batch([b"x"]))
    batch[22] |= 4  # claim zstd; the version check comes before any decompression or CRC check
    with connect(node) as conn:
        old = conn.call(PRODUCE, 6, R.produce_body({"zstd": {0: bytes(batch)}}, acks=1))
        assert old.responses[0].partition_responses[0].error_code == 76  # UNSUPPORTED_COMPRESSION_TYPE


def test_timer_killed_during_long_poll_resubmitted_and_answered(node_factory):
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "resubmit", 1)
    with connect(node) as consumer, connect(node) as producer:
        consumer.send(FETCH, 11, R.fetch_body({"resubmit": {0: 0}}, max_wait_ms=20_000, min_bytes=1))
        time.sleep(0.3)
        timer = node.pids("timer")[0]
        os.kill(timer, 9)
        node.wait_for_pids("timer", 1, exclude={timer})
        time.sleep(0.5)  # the new timer announces itself; the worker re-submits the waiting fetch
        started = time.monotonic()
        producer.call(PRODUCE, 8, R.produce_body({"resubmit": {0: R.build_record_batch([b"late"])}}, acks=1))
        _, _, _, body = consumer.recv_response()
        assert R.parse_fetch_response(11, body).record_count == 1
        assert time.monotonic() - started < 5, "the re-submitted fetch must complete on the append"


def test_segments_roll_and_retention_deletes_old_ones(node_factory):
    config = ("[log]\nsegment_bytes = 16384\nretention_bytes = 65536\n"
              "[flush]\nretention_check_interval_ms = 200\n")
    node = node_factory(workers=1, config=config)
    create_topic(node.bootstrap, "rolling", 1)
    with connect(node) as conn:
        for i in range(60):
            batch = R.build_record_batch([b"%04d" % i + b"x" * 1000] * 4)
            assert conn.call(PRODUCE, 8, R.produce_body({"rolling": {0: batch}}, acks=1)) \
                .responses[0].partition_responses[0].error_code == NONE
        # Retention runs every 200 ms; wait (bounded) for a pass that started after the last append
        # (one during the appends may have left more behind than retention_bytes allows).
        appended_at = time.monotonic()
        deadline = appended_at + 10
        while True:
            time.sleep(0.2)
            earliest = conn.call(LIST_OFFSETS, 5, R.list_offsets_body({"rolling": [0]}, timestamp=-2)) \
                .topics[0].partitions[0].offset
            segments = sorted((node.data_dir / "rolling-0").glob("*.log"))
            settled = time.monotonic() - appended_at > 0.6
            if (settled and earliest > 0 and len(segments) <= 8) or time.monotonic() > deadline:
                break
    assert earliest > 0, "retention by size must delete whole old segments and advance the log start"
    assert 2 <= len(segments) <= 8
    assert int(segments[0].stem) == earliest
    got = consume_all(node.bootstrap, "rolling", 1, 240 - earliest, **{"auto.offset.reset": "earliest"})
    assert got[0].offset() == earliest and got[-1].offset() == 239


def test_failed_auto_create_answers_instead_of_retrying_forever(node_factory):
    # Three rows: __consumer_offsets takes one, the topic below the other two.
    node = node_factory(workers=1, config="[topics]\nmax_partitions = 3\nnum_partitions = 2\n")
    create_topic(node.bootstrap, "fills-the-node", 2)
    with connect(node) as conn:
        started = time.monotonic()
        result = conn.call(PRODUCE, 8, R.produce_body({"no-room": {0: R.build_record_batch([b"x"])}}, acks=1))
        assert result.responses[0].partition_responses[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
        metadata = conn.call(METADATA, 8, R.metadata_body(["no-room"]))
        assert metadata.topics[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert time.monotonic() - started < 5


def test_second_node_on_the_same_port_is_refused(node_factory, tmp_path):
    first = node_factory(workers=2)
    second = subprocess.run([*CLI, "serve", "--listen", first.bootstrap,
                             "--data-dir", str(tmp_path / "other-data"), "--workers", "1"],
                            capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S,
                            cwd=Path(__file__).resolve().parent.parent)
    assert second.returncode != 0
    assert "Address already in use" in second.stderr
    with connect(first) as conn:
        assert conn.call(API_VERSIONS, 3, R.api_versions_body(3)).error_code == NONE
