"""Batch reads through Spark against a real node: records produced by librdkafka come back record for record
(offsets, keys, values, headers, timestamps, every compression codec), through the Arrow and the row path;
assign, subscribePattern, explicit and by-timestamp offsets, minPartitions; clear option errors;
failOnDataLoss both ways after retention deleted a segment; kafka.isolation.level: read_committed returns the
committed transactions' records and the plain ones below the last stable offset, read_uncommitted every data
record, neither a control record (a transaction marker)."""

from __future__ import annotations

import json
import time

import pytest
from spark_testing import TransactionalWriter, create_topic, produce, read, rows

from pyspark_shmbroker.options import ConsumerSettings
from pyspark_shmbroker.offsets import OffsetResolver
from shmbroker.clients.wire import TopicPartition, parse_servers

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def sample_records(count: int, tag: str) -> list[dict]:
    """Keys, null keys, tombstones, empty and large values, headers (a null header value too)."""
    records = []
    for i in range(count):
        record = {"value": f"{tag}-{i}".encode() * (1 + i % 3)}
        if i % 5:
            record["key"] = f"key-{i % 7}".encode()
        if i % 11 == 3:
            record["value"] = None
        if i % 13 == 4:
            record["value"] = b""
        if i % 17 == 5:
            record["value"] = bytes(range(256)) * 40  # 10 KiB: three-byte length varints
        if i % 4 == 1:
            record["headers"] = [("h1", f"x{i}".encode()), ("h2", None), ("h3", b"")][: 1 + i % 3]
        records.append(record)
    return records


def test_spark_finds_the_source_by_itself(spark):
    # No spark.dataSource.register anywhere: pyspark looked up top-level pyspark_* modules.
    assert spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("shmbroker")


def test_batch_read_matches_what_was_produced_with_every_codec(spark, node_factory):
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "codecs", 3)
    produced = []
    for codec in CODECS:
        produced += produce(node.bootstrap, "codecs", sample_records(120, codec), **{"compression.type": codec})
    expected = sorted((r.as_row() for r in produced), key=lambda row: (row[2], row[3], row[4]))
    df = read(spark, node.bootstrap, subscribe="codecs", includeHeaders="true")
    assert df.rdd.getNumPartitions() == 3  # one Spark partition per topic-partition
    assert rows(df) == expected
    # The row path gives the same records.
    assert rows(read(spark, node.bootstrap, subscribe="codecs", includeHeaders="true", useArrow="false")) == expected
    # Without includeHeaders, Spark's Kafka schema has no headers column.
    plain = read(spark, node.bootstrap, subscribe="codecs")
    assert plain.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    assert rows(plain) == [row[:7] for row in expected]


def test_assign_pattern_and_explicit_offsets(spark, node_factory):
    node = node_factory(workers=1)
    for topic in ("orders-eu", "orders-us", "audit"):
        create_topic(node.bootstrap, topic, 2)
    produced = {topic: produce(node.bootstrap, topic, [{"value": f"{topic}-{i}".encode(), "partition": i % 2}
                                                       for i in range(40)])
                for topic in ("orders-eu", "orders-us", "audit")}

    def offsets_of(df):
        return sorted((r["topic"], r["partition"], r["offset"]) for r in df.select("topic", "partition", "offset").collect())

    pattern = read(spark, node.bootstrap, subscribePattern="orders-.*")
    assert offsets_of(pattern) == sorted((r.topic, r.partition, r.offset)
                                         for t in ("orders-eu", "orders-us") for r in produced[t])
    assigned = read(spark, node.bootstrap, assign=json.dumps({"audit": [1], "orders-us": [0]}))
    assert offsets_of(assigned) == sorted((r.topic, r.partition, r.offset) for t in ("audit", "orders-us")
                                          for r in produced[t] if (t, r.partition) in (("audit", 1), ("orders-us", 0)))
    ranged = read(spark, node.bootstrap, subscribe="audit",
                  startingOffsets=json.dumps({"audit": {"0": 5, "1": -2}}),
                  endingOffsets=json.dumps({"audit": {"0": 12, "1": -1}}))
    assert offsets_of(ranged) == [("audit", 0, o) for o in range(5, 12)] + [("audit", 1, o) for o in range(20)]
    # minPartitions splits the ranges in proportion to their sizes; the records stay the same.
    split = read(spark, node.bootstrap, subscribe="audit", minPartitions="8")
    assert split.rdd.getNumPartitions() == 8
    assert offsets_of(split) == sorted((r.topic, r.partition, r.offset) for r in produced["audit"])
    capped = read(spark, node.bootstrap, subscribe="audit", maxRecordsPerPartition="6")
    assert capped.rdd.getNumPartitions() == 8  # 20 offsets per partition, 6 at most per range: 4 + 4
    assert read(spark, node.bootstrap, subscribe="no-such-topic").count() == 0


def test_offsets_by_timestamp(spark, node_factory):
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "timed", 2)
    base = 1_700_000_000_000
    produce(node.bootstrap, "timed", [{"value": b"%d" % i, "partition": i % 2, "timestamp": base + 1000 * i}
                                      for i in range(20)])

    def values(**options):
        df = read(spark, node.bootstrap, subscribe="timed", **options)
        return sorted(int(r["value"]) for r in df.select("value").collect())

    assert values(startingTimestamp=str(base + 10_000)) == list(range(10, 20))
    assert values(startingTimestamp=str(base + 9_500), endingTimestamp=str(base + 15_000)) == list(range(10, 15))
    by_partition = json.dumps({"timed": {"0": base + 4_000, "1": base + 15_000}})
    assert values(startingOffsetsByTimestamp=by_partition) == sorted([4, 6, 8, 10, 12, 14, 16, 18, 15, 17, 19])
    ending = json.dumps({"timed": {"0": base + 6_000, "1": base + 99_000}})
    assert values(endingOffsetsByTimestamp=ending) == sorted([0, 2, 4] + list(range(1, 20, 2)))
    # No record at or after the timestamp: an error by default, the latest offset with strategy latest.
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy"):
        values(startingTimestamp=str(base + 99_000))
    assert values(startingTimestamp=str(base + 99_000), startingOffsetsByTimestampStrategy="latest") == []


@pytest.mark.parametrize("options, message", [
    ({"subscribe": "t", "fooBar": "1"}, "unknown option 'foobar'"),
    ({}, "'subscribe', 'subscribePattern' or 'assign' must be specified"),
    ({"subscribe": "t", "assign": '{"t":[0]}'}, "'subscribe' and 'assign'"),
    ({"assign": "[0]"}, "option 'assign' must be a JSON object"),
    ({"subscribe": "t", "startingOffsets": "{not json"}, "option 'startingOffsets' is not valid JSON"),
    ({"subscribe": "t", "startingOffsets": "earliest", "startingTimestamp": "5"},
     "'startingOffsets' and 'startingTimestamp' conflict"),
    ({"subscribe": "t", "maxOffsetsPerTrigger": "10", "minOffsetsPerTrigger": "20"}, "'minOffsetsPerTrigger'"),
    ({"subscribe": "t", "kafka.auto.offset.reset": "earliest"}, "'auto.offset.reset' is not supported"),
    ({"subscribe": "t", "kafka.sasl.mechanism": "PLAIN"}, "'kafka.sasl.mechanism'"),
    ({"subscribe": "t", "failOnDataLoss": "maybe"}, "'failOnDataLoss' must be true or false"),
    ({"subscribe": "t", "minPartitions": "0"}, "'minPartitions' must be at least 1"),
])
def test_bad_options_fail_at_load_naming_the_option(spark, options, message):
    reader = spark.read.format("shmbroker").option("kafka.bootstrap.servers", "127.0.0.1:9")
    for name, value in options.items():
        reader = reader.option(name, value)
    with pytest.raises(Exception, match=message):
        reader.load()  # no action: the options fail when the DataFrame is defined, before any connection


def test_batch_only_and_streaming_only_option_errors(spark, node_factory):
    node = node_factory(workers=1)
    with pytest.raises(Exception, match="'startingOffsets' can't be latest for batch queries"):
        read(spark, node.bootstrap, subscribe="t", startingOffsets="latest").collect()
    stream = (spark.readStream.format("shmbroker").option("kafka.bootstrap.servers", node.bootstrap)
              .option("subscribe", "t").option("endingOffsets", "latest").load())
    with pytest.raises(Exception, match="'endingOffsets' is not valid in streaming queries"):
        stream.writeStream.format("noop").start().awaitTermination(30)
    with pytest.raises(Exception, match="must give every partition the query reads"):
        create_topic(node.bootstrap, "two", 2)
        read(spark, node.bootstrap, subscribe="two", startingOffsets='{"two":{"0":0}}').collect()
    with pytest.raises(Exception, match="partition two-5 does not exist"):
        read(spark, node.bootstrap, assign='{"two":[5]}').collect()


RETENTION_CONFIG = """
[log]
segment_bytes = 4096
retention_bytes = 4096

[flush]
retention_check_interval_ms = 100
"""


def test_fail_on_data_loss_both_ways_after_retention_deletes_a_segment(spark, node_factory):
    node = node_factory(workers=1, config=RETENTION_CONFIG)
    create_topic(node.bootstrap, "short", 1)
    produced = produce(node.bootstrap, "short", [{"value": b"%05d" % i + b"." * 100} for i in range(400)],
                       **{"batch.num.messages": 10})
    resolver = OffsetResolver(ConsumerSettings(servers=tuple(parse_servers(node.bootstrap))))
    tp = TopicPartition("short", 0)
    deadline = time.monotonic() + 30
    while resolver.earliest([tp])[tp] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    log_start = resolver.earliest([tp])[tp]
    assert 0 < log_start < 400, log_start
    from_zero = json.dumps({"short": {"0": 0}})
    with pytest.raises(Exception, match=r"Cannot fetch offset 0 of short-0.*failOnDataLoss"):
        read(spark, node.bootstrap, subscribe="short", startingOffsets=from_zero).collect()
    kept = read(spark, node.bootstrap, subscribe="short", startingOffsets=from_zero, failOnDataLoss="false")
    offsets = [r["offset"] for r in kept.select("offset").collect()]
    # Retention may have moved on meanwhile; what is left is read, in order, to the end.
    assert offsets == list(range(offsets[0], 400)) and offsets[0] >= log_start
    assert [bytes(r["value"]) for r in kept.orderBy("offset").select("value").collect()] == \
        [r.value for r in produced[offsets[0]:]]


def test_isolation_levels_over_committed_aborted_and_open_transactions(spark, node_factory):
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "txn", 2)

    def records(tag: str, count: int = 12) -> list[dict]:
        return [{"value": f"{tag}-{i}".encode(), "partition": i % 2} for i in range(count)]

    first, second = TransactionalWriter(node.bootstrap, "spark-first"), TransactionalWriter(node.bootstrap,
                                                                                            "spark-second")
    first.begin()
    committed = first.write("txn", records("committed"))
    first.commit()
    committed += produce(node.bootstrap, "txn", records("plain"))
    # Interleaved in both partitions: the second writer's batches between two of the first's aborted ones.
    first.begin()
    second.begin()
    aborted = first.write("txn", records("aborted-a"))
    committed += second.write("txn", records("interleaved"))
    aborted += first.write("txn", records("aborted-b"))
    second.commit()
    first.abort()
    first.begin()
    left_open = first.write("txn", records("open"))  # past the last stable offset while it is open

    def read_rows(isolation: str, **options) -> list[tuple]:
        df = read(spark, node.bootstrap, subscribe="txn", **{"kafka.isolation.level": isolation}, **options)
        return [(row[1], row[3], row[4]) for row in rows(df)]  # value, partition, offset

    def expected(produced) -> list[tuple]:
        return sorted(((r.value, r.partition, r.offset) for r in produced), key=lambda row: (row[1], row[2]))

    for arrow in ("true", "false"):
        assert read_rows("read_committed", useArrow=arrow) == expected(committed)
        assert read_rows("read_uncommitted", useArrow=arrow) == expected(committed + aborted + left_open)
    first.commit()
    assert read_rows("read_committed") == expected(committed + left_open)
