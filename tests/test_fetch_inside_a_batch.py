"""A fetch at any offset inside a stored batch is answered from that batch on, never from a later offset: the
first batch of the answer holds the offset asked for (a client skips the records before it), with and
without a fetch session, at aiokafka's Fetch version (11, no session) and at the session tests' (12)."""
from __future__ import annotations

import pytest
from confluent_kafka import Producer

from shmbroker.node.storage import records
from shmbroker.clients import wire
from scripts.harness import rawkafka as R
from tests.test_fetch_sessions import request
from tests.test_node_protocol import connect
from shmbroker.workers.codecs.protocol import FETCH

AIOKAFKA_FETCH_VERSION = 11
SESSION_FETCH_VERSION = 12
TOPIC = "inside"


def produce_in_one_batch(bootstrap: str, count: int) -> None:
    """As the stream-processor tests' produce(): an idempotent producer, flushed once (one batch here)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        producer.produce(TOPIC, key=b"w%d" % (i % 5), value=b"w%d" % (i % 5))
    assert producer.flush(30) == 0


def answered_offsets(conn, version: int, body) -> tuple[int, list[tuple[int, int, list[int]]]]:
    """(session id, [(base offset, last offset, record offsets)] of the partition's batches) of one fetch."""
    encoded = body if isinstance(body, bytes) else R.encode_body(body)
    answer = wire.parse_fetch_response(memoryview(conn.request(FETCH, version, encoded)), 0, version, None)
    assert answer.error_code == 0
    batches = []
    for partition in answer.partitions:
        assert (partition.topic, partition.partition, partition.error_code) == (TOPIC, 0, 0)
        assert partition.high_watermark == 150
        buf = bytes(partition.records)
        for position, header in records.iter_batches(buf):
            one = buf[position:position + header.size]
            batches.append((header.base_offset, header.last_offset,
                            [offset for offset, _, _ in records.iter_records(one, header)]))
    return answer.session_id, batches


def holds(batches, offset: int) -> bool:
    """The first batch holds `offset` (a record of that offset), and the batches after it follow on."""
    first = batches[0]
    return first[0] <= offset <= first[1] and offset in first[2] and all(
        earlier[1] + 1 == later[0] for earlier, later in zip(batches, batches[1:]))


@pytest.mark.parametrize("workers", [1, 2])
def test_every_offset_inside_a_batch_is_answered_from_its_own_batch(node_factory, workers):
    node = node_factory(workers=workers)
    produce_in_one_batch(node.bootstrap, 100)
    produce_in_one_batch(node.bootstrap, 50)
    with connect(node) as conn:
        # aiokafka's fetch: Fetch v11 without a session, one partition at the consumer's position.
        for offset in range(150):
            body = R.fetch_body({TOPIC: {0: offset}}, max_wait_ms=0, version=AIOKAFKA_FETCH_VERSION)
            _, batches = answered_offsets(conn, AIOKAFKA_FETCH_VERSION, body)
            assert batches and holds(batches, offset), (offset, [(b, last) for b, last, _ in batches])
            if offset == 0:  # stored as two batches, 0-99 and 100-149: the other fetches land inside one
                assert [(base, last) for base, last, _ in batches] == [(0, 99), (100, 149)]
        # In a fetch session: opened at 0, then each incremental fetch moves the position one record on.
        session_id, batches = answered_offsets(conn, SESSION_FETCH_VERSION, request({(TOPIC, 0): 0}, 0, 0))
        assert session_id != 0 and holds(batches, 0)
        for epoch, offset in enumerate(range(1, 150), start=1):
            fetch = request({(TOPIC, 0): offset}, session_id, epoch)
            answered_id, batches = answered_offsets(conn, SESSION_FETCH_VERSION, fetch)
            assert answered_id == session_id and batches and holds(batches, offset), \
                (offset, [(b, last) for b, last, _ in batches])
