"""Streaming reads: Trigger.AvailableNow in several micro-batches (maxOffsetsPerTrigger), a crash inside a
micro-batch and a restart from the checkpoint that sees every record exactly once; and the stream reader's
admission control (read limits, minOffsetsPerTrigger with maxTriggerDelay, AvailableNow's target, new
partitions) called directly against a real node."""

from __future__ import annotations

import json
import pickle
import time

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows
from spark_testing import create_topic, produce

from pyspark_shmbroker.options import SourceOptions
from pyspark_shmbroker.reader import RangePartition, StreamReader


def produce_values(bootstrap: str, topic: str, first: int, count: int, partitions: int) -> None:
    produce(bootstrap, topic, [{"value": b"%d" % i, "partition": i % partitions} for i in range(first, first + count)])


def test_available_now_in_micro_batches_and_a_restart_see_every_record_once(spark, node_factory, tmp_path):
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "events", 3)
    produce_values(node.bootstrap, "events", 0, 300, 3)
    batches: dict[int, list] = {}  # micro-batch id -> rows its last successful run wrote
    attempts: list[tuple[int, int]] = []
    crash = {"at": 2}

    def sink(df, batch_id):
        got = sorted((r.topic, r.partition, r.offset, int(r.v)) for r in
                     df.selectExpr("topic", "partition", "offset", "cast(value as string) v").collect())
        attempts.append((batch_id, len(got)))
        if crash.get("at") == batch_id:
            del crash["at"]
            raise RuntimeError("crash injected in micro-batch %d" % batch_id)
        batches[batch_id] = got  # idempotent per batch id, like a sink keyed by it

    def run():
        stream = (spark.readStream.format("shmbroker").option("kafka.bootstrap.servers", node.bootstrap)
                  .option("subscribe", "events").option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", "100").load())
        query = (stream.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(180)
        finally:
            query.stop()
        return query

    with pytest.raises(Exception, match="crash injected in micro-batch 2"):
        run()  # awaitTermination raises the failure of the query
    assert sorted(batches) == [0, 1]
    produce_values(node.bootstrap, "events", 300, 150, 3)
    assert run().exception() is None
    # Micro-batch 2 ran again after the restart, with the same offsets, then the new records came.
    crashed = next(n for b, n in attempts if b == 2)
    assert len(batches[2]) == crashed == 100
    assert len(batches) >= 5 and all(len(rows) <= 100 for rows in batches.values())
    seen = [row for b in sorted(batches) for row in batches[b]]
    assert sorted(r[3] for r in seen) == list(range(450))  # every record, exactly once
    assert len({r[:3] for r in seen}) == 450


def source(bootstrap: str, **options) -> StreamReader:
    return StreamReader(SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, **options}))


def total(start: dict, end: dict) -> int:
    return sum(end[t][p] - start.get(t, {}).get(p, 0) for t in end for p in end[t])


def test_read_limits_and_trigger_delay(node_factory):
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "lim", 3)
    produce(node.bootstrap, "lim", [{"value": b"x", "partition": 0}] * 90 + [{"value": b"y", "partition": 1}] * 10)
    reader = source(node.bootstrap, subscribe="lim", startingOffsets="earliest", maxOffsetsPerTrigger="20")
    assert reader.getDefaultReadLimit() == ReadMaxRows(20)
    start = reader.initialOffset()
    assert start == {"lim": {"0": 0, "1": 0, "2": 0}}
    end = reader.latestOffset(start, ReadMaxRows(20))
    assert total(start, end) == 20 and end["lim"] == {"0": 18, "1": 2, "2": 0}  # in proportion to the backlog
    assert reader.latestOffset(start, ReadAllAvailable()) == {"lim": {"0": 90, "1": 10, "2": 0}}
    assert reader.reportLatestOffset() == {"lim": {"0": 90, "1": 10, "2": 0}}
    parts = reader.partitions(start, end)
    assert [(p.partition, p.start, p.end) for p in parts] == [(0, 0, 18), (1, 0, 2)]
    # Readers and partitions pickle (Spark ships them to its Python workers).
    assert pickle.loads(pickle.dumps(reader)).options == reader.options
    assert pickle.loads(pickle.dumps(parts[0])) == parts[0]
    assert isinstance(parts[0], RangePartition)

    waiting = source(node.bootstrap, subscribe="lim", minOffsetsPerTrigger="500", maxTriggerDelay="300ms")
    assert waiting.getDefaultReadLimit() == ReadMinRows(500)
    assert waiting.latestOffset(start, ReadMinRows(500)) == start  # too few new offsets: no micro-batch yet
    time.sleep(0.4)
    assert waiting.latestOffset(start, ReadMinRows(500)) == {"lim": {"0": 90, "1": 10, "2": 0}}  # delay is up
    both = source(node.bootstrap, subscribe="lim", minOffsetsPerTrigger="50", maxOffsetsPerTrigger="60")
    assert total(start, both.latestOffset(start, ReadMaxRows(60))) == 60
    assert both.latestOffset({"lim": {"0": 90, "1": 0, "2": 0}}, ReadMaxRows(60)) == {"lim": {"0": 90, "1": 0, "2": 0}}


def test_available_now_stops_at_its_target_and_new_partitions_start_at_earliest(node_factory):
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "feed-a", 1)
    produce_values(node.bootstrap, "feed-a", 0, 30, 1)
    reader = source(node.bootstrap, subscribePattern="feed-.*", startingOffsets="earliest")
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    produce_values(node.bootstrap, "feed-a", 30, 5, 1)  # after the target: not read by this run
    first = reader.latestOffset(start, ReadMaxRows(20))
    assert first == {"feed-a": {"0": 20}}
    second = reader.latestOffset(first, ReadMaxRows(20))
    assert second == {"feed-a": {"0": 30}}
    assert reader.latestOffset(second, ReadMaxRows(20)) == second  # done: the same offsets back
    # A query without AvailableNow finds new topics of its pattern and reads them from their start.
    live = source(node.bootstrap, subscribePattern="feed-.*", startingOffsets="earliest")
    create_topic(node.bootstrap, "feed-b", 2)
    produce_values(node.bootstrap, "feed-b", 0, 4, 2)
    latest = live.latestOffset(second, ReadAllAvailable())
    assert latest == {"feed-a": {"0": 35}, "feed-b": {"0": 2, "1": 2}}
    ranges = sorted((p.topic, p.partition, p.start, p.end) for p in live.partitions(second, latest))
    assert ranges == [("feed-a", 0, 30, 35), ("feed-b", 0, 0, 2), ("feed-b", 1, 0, 2)]
    assert json.loads(json.dumps(latest)) == latest  # checkpoint-ready JSON


def test_a_recreated_topic_is_data_loss_or_skipped(node_factory):
    from confluent_kafka.admin import AdminClient

    node = node_factory(workers=1)
    create_topic(node.bootstrap, "again", 1)
    produce_values(node.bootstrap, "again", 0, 50, 1)
    strict = source(node.bootstrap, subscribe="again", startingOffsets="earliest")
    lenient = source(node.bootstrap, subscribe="again", startingOffsets="earliest", failOnDataLoss="false")
    start = strict.latestOffset(strict.initialOffset(), ReadAllAvailable())
    assert start == {"again": {"0": 50}}
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    admin.delete_topics(["again"], operation_timeout=30)["again"].result(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            create_topic(node.bootstrap, "again", 1)
            break
        except Exception:  # the deletion may still be under way
            time.sleep(0.2)
    produce_values(node.bootstrap, "again", 0, 10, 1)
    # The offsets went back from 50 to 10: a new micro-batch ends there, and planning it is data loss...
    end = strict.latestOffset(start, ReadAllAvailable())
    assert end == {"again": {"0": 10}}
    with pytest.raises(Exception, match=r"offsets of again-0 went back from 50 to 10.*failOnDataLoss"):
        strict.partitions(start, end)
    # ...or, without failOnDataLoss, nothing is read for it and the query goes on from the new offsets.
    assert lenient.partitions(start, lenient.latestOffset(start, ReadAllAvailable())) == []
    assert lenient.latestOffset(end, ReadAllAvailable()) == end
