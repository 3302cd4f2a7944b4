"""The Spark connector's options, offset ranges and read limits, without Spark; and its layering: a client
package that imports nothing of the node."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_shmbroker.offsets import OffsetRange, limit_offsets, split_ranges
from pyspark_shmbroker.options import OptionError, SinkOptions, SourceOptions
from shmbroker.clients.wire import TopicPartition

REPO = Path(__file__).resolve().parent.parent
BOOT = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_source_defaults_and_spark_spellings():
    options = SourceOptions.parse({**BOOT, "SUBSCRIBE": "a, b", "includeheaders": "TRUE", "kafka.group.id": "g",
                                   "maxOffsetsPerTrigger": "1000", "kafka.max.partition.fetch.bytes": "65536"})
    assert options.subscription.topics == ("a", "b")
    assert options.include_headers and options.fail_on_data_loss and options.use_arrow
    assert options.starting is None and options.ending is None
    assert options.max_offsets_per_trigger == 1000 and options.consumer.max_partition_fetch_bytes == 65536
    assert options.ignored == ("kafka.group.id",)
    assigned = SourceOptions.parse({**BOOT, "assign": json.dumps({"t": [1, 0], "u": [2]})})
    assert assigned.subscription.partitions == (TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 2))
    spec = SourceOptions.parse({**BOOT, "subscribe": "t", "startingOffsets": '{"t": {"0": -2, "1": 17}}'}).starting
    assert spec.kind == "offsets" and spec.as_dict() == {TopicPartition("t", 0): -2, TopicPartition("t", 1): 17}
    delay = SourceOptions.parse({**BOOT, "subscribe": "t", "minOffsetsPerTrigger": "5", "maxTriggerDelay": "2m"})
    assert delay.max_trigger_delay_ms == 120_000
    sink = SinkOptions.parse({**BOOT, "topic": "out", "kafka.compression.type": "zstd", "kafka.batch.size": "65536"})
    assert (sink.topic, sink.producer.compression, sink.producer.batch_bytes, sink.producer.acks) == ("out", "zstd",
                                                                                                      65536, -1)


@pytest.mark.parametrize("options, message", [
    ({"subscribe": "t"}, "'kafka.bootstrap.servers' must be specified"),
    ({**BOOT, "subscribe": "t", "kafka.bootstrap.servers": "nohost"}, "is not HOST:PORT"),
    ({**BOOT, "subscribePattern": "(unclosed"}, "'subscribePattern' is not a valid pattern"),
    ({**BOOT, "assign": '{"t": ["0"]}'}, "'assign': topic 't' must map to a list of partition numbers"),
    ({**BOOT, "subscribe": "t", "startingOffsets": '{"t": {"0": -3}}'}, r"t-0 must be a number >= 0 \(or -2 / -1\)"),
    ({**BOOT, "subscribe": "t", "startingOffsets": "first"}, "must be earliest, latest or JSON"),
    ({**BOOT, "subscribe": "t", "endingTimestamp": "soon"}, "'endingTimestamp' must be a timestamp"),
    ({**BOOT, "subscribe": "t", "startingOffsetsByTimestamp": "{}", "startingOffsets": "earliest"}, "conflict"),
    ({**BOOT, "subscribe": "t", "startingOffsetsByTimestampStrategy": "closest"}, "must be error or latest"),
    ({**BOOT, "subscribe": "t", "maxTriggerDelay": "5m"}, "only applies with 'minOffsetsPerTrigger'"),
    ({**BOOT, "subscribe": "t", "minOffsetsPerTrigger": "1", "maxTriggerDelay": "5 fortnights"}, "duration"),
    ({**BOOT, "subscribe": "t", "kafka.security.protocol": "SSL"}, "must be PLAINTEXT"),
    ({**BOOT, "subscribe": "t", "kafka.isolation.level": "serializable"}, "read_uncommitted or read_committed"),
    ({**BOOT, "subscribe": "t", "kafka.value.deserializer": "x"}, "'value.deserializer' is not supported"),
    ({**BOOT, "subscribe": "t", "topic": "x"}, "unknown option 'topic' for the shmbroker source"),
])
def test_source_option_errors_name_the_option(options, message):
    with pytest.raises(OptionError, match=message):
        SourceOptions.parse(options)


@pytest.mark.parametrize("options, message", [
    ({**BOOT, "kafka.acks": "0"}, "'kafka.acks' must be all"),
    ({**BOOT, "kafka.enable.idempotence": "false"}, "'kafka.enable.idempotence' cannot be false"),
    ({**BOOT, "kafka.compression.type": "brotli"}, "'kafka.compression.type' must be"),
    ({**BOOT, "kafka.max.in.flight.requests.per.connection": "6"}, "at most 5"),
    ({**BOOT, "kafka.batch.size": "4000000"}, "larger than 'kafka.max.request.size'"),
    ({**BOOT, "subscribe": "t"}, "unknown option 'subscribe' for the shmbroker sink"),
    ({**BOOT, "kafka.linger.ms": "5"}, "unsupported Kafka client option 'kafka.linger.ms'"),
])
def test_sink_option_errors_name_the_option(options, message):
    with pytest.raises(OptionError, match=message):
        SinkOptions.parse(options)


def test_query_kind_checks():
    with pytest.raises(OptionError, match="can't be latest"):
        SourceOptions.parse({**BOOT, "subscribe": "t", "startingOffsets": '{"t": {"0": -1}}'}).check_batch()
    with pytest.raises(OptionError, match="can't be earliest"):
        SourceOptions.parse({**BOOT, "subscribe": "t", "endingOffsets": "earliest"}).check_batch()
    with pytest.raises(OptionError, match="not valid in streaming queries"):
        SourceOptions.parse({**BOOT, "subscribe": "t", "endingTimestamp": "5"}).check_streaming()


ranges = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6), st.integers(0, 5000)), min_size=1, max_size=6,
                  unique_by=lambda r: r[0])


@given(ranges, st.one_of(st.none(), st.integers(1, 40)), st.one_of(st.none(), st.integers(1, 3000)))
def test_split_ranges_cover_each_offset_once(spans, min_partitions, max_records):
    given_ranges = [OffsetRange("t", p, start, start + size) for p, start, size in spans]
    pieces = split_ranges(given_ranges, min_partitions, max_records)
    for r in given_ranges:
        mine = [piece for piece in pieces if piece.partition == r.partition]
        assert [o for piece in mine for o in range(piece.start, piece.end)] == list(range(r.start, r.end))
        if max_records:
            assert all(piece.size <= max_records for piece in mine)
    assert all(piece.size > 0 for piece in pieces)
    non_empty = [r for r in given_ranges if r.size]
    if min_partitions and non_empty and sum(r.size for r in non_empty) >= min_partitions:
        assert len(pieces) >= min(min_partitions, len(non_empty)) and len(pieces) >= len(non_empty)


def test_split_ranges_in_proportion():
    pieces = split_ranges([OffsetRange("t", 0, 0, 900), OffsetRange("t", 1, 0, 100)], min_partitions=10)
    assert [(p.partition, p.start, p.end) for p in pieces if p.partition == 1] == [(1, 0, 100)]
    assert [(p.start, p.end) for p in pieces if p.partition == 0] == [(i * 100, i * 100 + 100) for i in range(9)]


@given(st.dictionaries(st.integers(0, 7), st.tuples(st.integers(0, 10**6), st.integers(0, 10**5)), min_size=1),
       st.integers(1, 10**5))
def test_limit_offsets_respects_the_limit(backlogs, max_rows):
    start = {TopicPartition("t", p): s for p, (s, _) in backlogs.items()}
    latest = {TopicPartition("t", p): s + n for p, (s, n) in backlogs.items()}
    end = limit_offsets(start, latest, max_rows)
    taken = {tp: end[tp] - start[tp] for tp in start}
    assert all(0 <= taken[tp] <= latest[tp] - start[tp] for tp in start)
    assert sum(taken.values()) == min(max_rows, sum(latest[tp] - start[tp] for tp in start))


def test_the_connector_imports_nothing_of_the_node_but_the_shared_codec():
    """pyspark_shmbroker is a client: of the node it imports only the record-batch codec they share, which
    starts nothing and imports nothing else of the node (tests/test_layering.py holds those modules to it)."""
    shared = {"node.storage.records", "node.storage.record_arrays", "node.storage.compression", "node.storage"}
    forbidden = {"node", "shm", "workers", "scripts", "tests"}
    for path in sorted((REPO / "pyspark_shmbroker").glob("*.py")):
        for statement in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(statement, ast.Import):
                names = [alias.name for alias in statement.names]
            elif isinstance(statement, ast.ImportFrom) and statement.level == 0:
                names = [statement.module or ""]
            for name in names:
                assert name in shared or name.split(".")[0] not in forbidden, f"{path.name} imports {name}"
