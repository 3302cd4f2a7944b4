"""The Spark connector's idempotent producer and fetch loop against a real node, without Spark: a node killed
(SIGKILL) and restarted in the middle of a write loses nothing and, thanks to the producer's sequence
numbers, writes nothing twice; a read of the result gives every record once, in order; an unreachable
node fails with a message naming the address."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from pyspark_shmbroker.offsets import OffsetRange, OffsetResolver
from pyspark_shmbroker.options import ConsumerSettings, ProducerSettings, SourceOptions
from pyspark_shmbroker.producer import IdempotentProducer, encode_partition
from pyspark_shmbroker.reader import read_range
from shmbroker.clients.wire import Connection, NodeUnavailable, TopicPartition, parse_servers

RECORDS_PER_CHUNK = 2000
CHUNKS = 40


def test_a_node_killed_mid_write_loses_and_repeats_nothing(node_factory):
    node = node_factory(workers=1)
    servers = tuple(parse_servers(node.bootstrap))
    producer = IdempotentProducer(ProducerSettings(servers=servers, batch_bytes=16 * 1024, retry_backoff_ms=50))
    assert producer.partitions_of("durable") == 1  # created on demand
    restarted = threading.Event()

    def kill_and_restart():
        node.kill_all()
        time.sleep(0.5)
        node.start()
        restarted.set()

    killer = None
    try:
        for chunk in range(CHUNKS):
            values = pa.array([b"%08d" % (chunk * RECORDS_PER_CHUNK + i) for i in range(RECORDS_PER_CHUNK)])
            producer.add(encode_partition(TopicPartition("durable", 0), None, values, None, 16 * 1024, 0,
                                          int(time.time() * 1000)))
            if chunk == CHUNKS // 2:
                killer = threading.Thread(target=kill_and_restart)
                killer.start()
        producer.flush()
        written = producer.written()
    finally:
        producer.close()
        if killer is not None:
            killer.join(60)
    assert restarted.is_set() and producer.reconnects >= 1
    total = CHUNKS * RECORDS_PER_CHUNK
    assert written[TopicPartition("durable", 0)][0] == total
    options = SourceOptions.parse({"kafka.bootstrap.servers": node.bootstrap, "subscribe": "durable"})
    end = OffsetResolver(options.consumer).latest([TopicPartition("durable", 0)])[TopicPartition("durable", 0)]
    values = [v for batch in read_range(options, OffsetRange("durable", 0, 0, end))
              for v in batch.column("value").to_pylist()]
    assert values == [b"%08d" % i for i in range(total)]  # all of them, once each, in order
    assert end == total


def test_unreachable_node_is_named():
    settings = ConsumerSettings(servers=(("127.0.0.1", 9),), request_timeout_ms=2000, offset_retries=0)
    with pytest.raises(NodeUnavailable, match="cannot connect to kafka.bootstrap.servers 127.0.0.1:9"):
        OffsetResolver(settings).latest([TopicPartition("t", 0)])
    with pytest.raises(NodeUnavailable, match="127.0.0.1:9"):
        Connection([("127.0.0.1", 9)], 2.0)
