"""Writes through Spark against a real node: write then read round trips (Arrow and row paths, every codec,
topic and partition columns, headers, Kafka's key partitioning), the rows written reported on commit,
streaming writes, and clear errors for bad columns, modes, topics and partitions."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from pyspark.sql import Row
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructField, StructType
from spark_testing import create_topic, read, rows

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
SCHEMA = StructType([StructField("key", BinaryType()), StructField("value", StringType()),
                     StructField("topic", StringType()), StructField("partition", IntegerType()),
                     StructField("headers", HEADERS)])


def source_rows(count: int) -> list[tuple]:
    out = []
    for i in range(count):
        key = None if i % 6 == 0 else f"user-{i % 23}".encode()
        partition = 2 if i % 10 == 7 else None  # explicit partition for some rows
        headers = [("trace", f"t{i}".encode()), ("empty", None)][: i % 3]
        out.append((key, f"value-{i}" * (1 + i % 4), "left" if i % 2 else "right", partition, headers))
    return out


def write(df, bootstrap: str, **options):
    writer = df.write.format("shmbroker").option("kafka.bootstrap.servers", bootstrap).mode("append")
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def librdkafka_partitions(bootstrap: str, topic: str, keys: list[bytes]) -> dict[bytes, int]:
    """Where librdkafka's murmur2 partitioner (the Java client's default) puts each key."""
    placed: dict[bytes, int] = {}
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for key in keys:
        producer.produce(topic, key=key, value=b"", on_delivery=lambda err, msg: placed.__setitem__(msg.key(), msg.partition()))
    assert producer.flush(60) == 0
    return placed


@pytest.mark.parametrize("use_arrow", ["true", "false"])
def test_write_then_read_round_trip(spark, node_factory, use_arrow):
    node = node_factory(workers=1)
    for topic in ("left", "right", "probe"):
        create_topic(node.bootstrap, topic, 4)
    data = source_rows(3000)
    df = spark.createDataFrame(data, SCHEMA).coalesce(1)  # one task: its order per partition is kept
    write(df, node.bootstrap, useArrow=use_arrow)
    back = rows(read(spark, node.bootstrap, subscribe="left,right", includeHeaders="true"))
    assert len(back) == len(data)
    got = [(r[0], r[1].decode(), r[2], r[7]) for r in back]
    assert sorted(got, key=repr) == sorted(((k, v, t, [(a, b) for a, b in h]) for k, v, t, _, h in data), key=repr)
    # Explicit partitions are kept; keyed rows go where Kafka's default partitioner puts them.
    where = {r[1].decode(): r[3] for r in back}
    expected_for_key = librdkafka_partitions(node.bootstrap, "probe", sorted({k for k, *_ in data if k is not None}))
    for key, value, _, partition, _ in data:
        if partition is not None:
            assert where[value] == partition
        elif key is not None:
            assert where[value] == expected_for_key[key], (key, value)
    # One task wrote them in order: each partition holds its rows in the DataFrame's order.
    order = {v: i for i, (_, v, *_) in enumerate(data)}
    for topic in ("left", "right"):
        for partition in range(4):
            values = [r[1].decode() for r in back if r[2] == topic and r[3] == partition]
            assert [order[v] for v in values] == sorted(order[v] for v in values)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_write_compressed(spark, node_factory, codec):
    node = node_factory(workers=1)
    df = spark.range(20000).selectExpr("cast(id as string) as value", "cast(id % 97 as string) as key")
    write(df, node.bootstrap, topic="packed", **{"kafka.compression.type": codec, "kafka.batch.size": "65536"})
    back = read(spark, node.bootstrap, subscribe="packed").selectExpr("cast(value as string) v", "cast(key as string) k")
    assert sorted((int(r.v), int(r.k)) for r in back.collect()) == [(i, i % 97) for i in range(20000)]


def test_rows_written_are_reported_on_commit(spark, node_factory):
    node = node_factory(workers=1)
    spark.conf.set("spark.sql.pyspark.worker.logging.enabled", "true")
    try:
        write(spark.range(5000).selectExpr("cast(cast(id as string) as binary) as value").repartition(2), node.bootstrap,
              topic="reported")
        logs = spark.tvf.python_worker_logs().filter("logger = 'pyspark_shmbroker'").select("msg").collect()
    finally:
        spark.conf.unset("spark.sql.pyspark.worker.logging.enabled")
    assert any("shmbroker sink: wrote 5000 rows in 2 tasks: reported 5000" in r.msg for r in logs), logs
    assert read(spark, node.bootstrap, subscribe="reported").count() == 5000


def test_streaming_write_copies_a_topic(spark, node_factory, tmp_path):
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "source", 2)
    write(spark.range(1000).selectExpr("cast(id as string) as value", "cast(id as string) as key"), node.bootstrap,
          topic="source")
    stream = (spark.readStream.format("shmbroker").option("kafka.bootstrap.servers", node.bootstrap)
              .option("subscribe", "source").option("startingOffsets", "earliest").option("includeHeaders", "true")
              .load().selectExpr("key", "value", "headers"))
    query = (stream.writeStream.format("shmbroker").option("kafka.bootstrap.servers", node.bootstrap)
             .option("topic", "copy").option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    copied = read(spark, node.bootstrap, subscribe="copy").selectExpr("cast(value as string) v")
    assert sorted(int(r.v) for r in copied.collect()) == list(range(1000))


def test_write_errors_are_clear(spark, node_factory):
    node = node_factory(workers=1, config="[topics]\nauto_create_topics = false\n")
    create_topic(node.bootstrap, "exists", 2)
    values = spark.range(10).selectExpr("cast(id as string) as value")
    with pytest.raises(Exception, match="has no 'value' column"):
        write(spark.range(3).selectExpr("id as payload"), node.bootstrap, topic="exists")
    with pytest.raises(Exception, match="column 'key' must be binary or string, not bigint"):
        write(spark.range(3).selectExpr("id as key", "cast(id as string) as value"), node.bootstrap, topic="exists")
    with pytest.raises(Exception, match="no topic to write to"):
        write(values, node.bootstrap)
    with pytest.raises(Exception, match="only appends"):
        values.write.format("shmbroker").option("kafka.bootstrap.servers", node.bootstrap) \
            .option("topic", "exists").mode("overwrite").save()
    with pytest.raises(Exception, match="'kafka.acks' must be all"):
        write(values, node.bootstrap, topic="exists", **{"kafka.acks": "1"})
    with pytest.raises(Exception, match="topic 'missing' does not exist and the node does not create topics"):
        write(values, node.bootstrap, topic="missing")
    with pytest.raises(Exception, match="partition 5 does not exist: topic 'exists' has 2 partitions"):
        write(values.selectExpr("value", "5 as partition"), node.bootstrap, topic="exists")
    with pytest.raises(Exception, match="a row has a null topic"):
        write(spark.createDataFrame([Row(value="a", topic=None)], "value string, topic string"), node.bootstrap)
    assert read(spark, node.bootstrap, subscribe="exists").count() == 0
