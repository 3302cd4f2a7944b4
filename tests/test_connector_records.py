"""The Spark connector's record codec without Spark: decoding checked record for record against kafka-python's
reader on generated batches (sizes, keys, nulls, headers, timestamps, gzip), every codec through our own
encoder, control and partial batches, offset windows, corrupt bytes (only CorruptRecords, never anything
else), Kafka's murmur2, and the Arrow schema Spark expects."""

from __future__ import annotations

import struct

import cramjam
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_murmur2
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from shmbroker.node.storage.record_arrays import Runs
from shmbroker.node.storage.records import (NO_PARTITION_LEADER_EPOCH, ControlType, build_batch, build_control_batch,
                                            set_producer)
from pyspark_shmbroker import producer as P
from pyspark_shmbroker import records as R
from shmbroker.clients.wire import TopicPartition
from tests.record_batches import recrc

# Longer values repeat a short random pattern, so generating them costs little entropy.
blobs = st.one_of(st.none(), st.binary(max_size=40),
                  st.builds(lambda seed, n: (seed * n)[:n], st.binary(min_size=1, max_size=8),
                            st.sampled_from([63, 64, 100, 200, 8191, 8192, 8300])))
headers = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=3)
record = st.tuples(blobs, blobs, headers, st.integers(min_value=0, max_value=10**7))


def kafka_python_batch(base_offset: int, records: list, compression: int = 0, first_timestamp: int = 1_700_000_000_000,
                       log_append_time: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(2, compression, 0, -1, -1, -1, 1 << 30)
    for delta, (key, value, hdrs, ts_delta) in enumerate(records):
        builder.append(delta, first_timestamp + ts_delta, key, value, hdrs)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    if log_append_time:  # the timestamp-type attribute bit, as a broker sets it for LogAppendTime topics
        struct.pack_into(">h", data, 21, struct.unpack_from(">h", data, 21)[0] | 0x08)
        return recrc(bytes(data))
    return bytes(data)


def oracle(batch: bytes) -> list[tuple]:
    """What kafka-python reads from a batch: (offset, key, value, timestamp ms, headers)."""
    parsed = DefaultRecordBatch(batch)
    return [(r.offset, r.key, r.value, r.timestamp, [(k, v) for k, v in r.headers]) for r in parsed]


def decoded(result: R.DecodedRecords) -> list[tuple]:
    if result.batch is None:
        return []
    cols = result.batch.to_pydict()
    timestamps = [t.timestamp() * 1000 for t in cols["timestamp"]]
    return [(o, k, v, round(t), [(h["key"], h["value"]) for h in hs])
            for o, k, v, t, hs in zip(cols["offset"], cols["key"], cols["value"], timestamps, cols["headers"])]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(record, min_size=1, max_size=80), min_size=1, max_size=5),
       gzip=st.booleans())
def test_decode_matches_kafka_python(batches, gzip):
    data, expected, base = b"", [], 0
    for records in batches:
        batch = kafka_python_batch(base, records, compression=1 if gzip else 0)
        data += batch
        expected += oracle(batch)
        base += len(records) + 3  # gaps between batches, as compaction leaves them
    result = R.decode_record_set(data, "t", 7, include_headers=True)
    assert decoded(result) == expected
    assert result.next_offset == base - 3 and result.batches == len(batches)
    cols = result.batch.to_pydict()
    assert set(cols["topic"]) == {"t"} and set(cols["partition"]) == {7} and set(cols["timestampType"]) == {0}


def test_fixed_size_records_take_the_run_path_and_varying_ones_the_loop():
    fixed = [(None, b"v" * 100, [], 0)] * 9000  # offset deltas pass 64 and 8192: the record size grows twice
    batch = kafka_python_batch(0, fixed)
    arena = np.frombuffer(batch[R.BATCH_HEADER_SIZE:] + bytes(16), dtype=np.uint8)
    runs = Runs(arena, [0], [len(batch) - R.BATCH_HEADER_SIZE], [9000])
    runs.run()
    assert not runs.scalar.any() and sum(len(f) for f in runs.found) == 9000
    assert decoded(R.decode_record_set(batch, "t", 0, include_headers=True)) == oracle(batch)
    varying = [(None, b"v" * (i % 50), [], i) for i in range(500)]
    batch = kafka_python_batch(0, varying)
    arena = np.frombuffer(batch[R.BATCH_HEADER_SIZE:] + bytes(16), dtype=np.uint8)
    runs = Runs(arena, [0], [len(batch) - R.BATCH_HEADER_SIZE], [500])
    runs.run()
    assert runs.scalar.all()
    assert decoded(R.decode_record_set(batch, "t", 0, include_headers=True)) == oracle(batch)


def test_log_append_time_windows_control_and_partial_batches():
    records = [(b"k", b"v%d" % i, [], i) for i in range(10)]
    appended = kafka_python_batch(0, records, log_append_time=True)
    result = R.decode_record_set(appended, "t", 0)
    assert set(result.batch.column("timestampType").to_pylist()) == {1}
    max_ts = struct.unpack_from(">q", appended, 35)[0]
    assert {t.timestamp() * 1000 for t in result.batch.column("timestamp").to_pylist()} == {max_ts}
    # A control batch (transaction marker) is skipped but counted in next_offset.
    control = bytearray(kafka_python_batch(10, [(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [], 0)]))
    struct.pack_into(">h", control, 21, 0x20 | 0x10)
    control = recrc(bytes(control))
    tail = kafka_python_batch(11, records)
    data = appended + control + tail + tail[:50]  # and a partial batch at the end
    result = R.decode_record_set(data, "t", 0, keep_from=5, keep_until=15)
    assert result.batch.column("offset").to_pylist() == [5, 6, 7, 8, 9, 11, 12, 13, 14]
    assert result.next_offset == 21 and result.batches == 3
    assert R.decode_record_set(tail[:50], "t", 0) == R.DecodedRecords(None, None, 0)
    assert R.decode_record_set(data, "t", 0, keep_from=21).batch is None


def test_read_committed_skips_the_batches_of_aborted_transactions():
    """Kafka's consumer algorithm: a listed producer id is aborting from its first offset up to its ABORT marker;
    its committed transactions, other producers' batches and plain batches stay."""
    def txn(base_offset, producer_id, value):
        return build_batch([(b"k", value)], 1000, base_offset=base_offset, producer_id=producer_id,
                           producer_epoch=0, base_sequence=base_offset, transactional=True)

    data = b"".join([
        txn(0, 7, b"aborted-1"), txn(1, 8, b"committed-8"), build_batch([(b"k", b"plain")], 1000, base_offset=2),
        build_control_batch(7, 0, ControlType.ABORT, 0, 1000, base_offset=3),
        build_control_batch(8, 0, ControlType.COMMIT, 0, 1000, base_offset=4),
        txn(5, 7, b"committed-7"), build_control_batch(7, 0, ControlType.COMMIT, 0, 1000, base_offset=6),
        txn(7, 7, b"aborted-2"), build_control_batch(7, 0, ControlType.ABORT, 0, 1000, base_offset=8),
    ])
    values = R.decode_record_set(data, "t", 0, aborted_transactions=[(7, 7), (7, 0)]).batch.column("value")
    assert values.to_pylist() == [b"committed-8", b"plain", b"committed-7"]
    everything = R.decode_record_set(data, "t", 0).batch.column("value").to_pylist()
    assert everything == [b"aborted-1", b"committed-8", b"plain", b"committed-7", b"aborted-2"]


def xerial(raw: bytes, block: int = 100) -> bytes:
    out = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for i in range(0, len(raw), block):
        compressed = bytes(cramjam.snappy.compress_raw(raw[i : i + block]))
        out += struct.pack(">i", len(compressed)) + compressed
    return out


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd", "xerial"])
def test_every_codec_round_trips_through_our_encoder(codec):
    keys = pa.array([None, b"a", b"bb" * 50] * 100, pa.binary())
    values = pa.array([b"value-%d" % i * (i % 5) for i in range(300)], pa.binary())
    hdrs = pa.array([[("h", b"1")], [], None] * 100, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    code = P.CODECS["snappy" if codec == "xerial" else codec]
    batches = P.encode_partition(TopicPartition("t", 0), keys, values, hdrs, 1 << 20, code, 1_700_000_000_000)
    assert len(batches) == 1
    data = batches[0].data
    if codec == "xerial":  # the Java client's framing of snappy
        raw = bytes(cramjam.snappy.decompress_raw(bytes(data[R.BATCH_HEADER_SIZE:])))
        data = data[: R.BATCH_HEADER_SIZE] + xerial(raw)
        struct.pack_into(">i", data, 8, len(data) - 12)
    batch = P.EncodedBatch(TopicPartition("t", 0), 300, bytearray(data))
    set_producer(batch.data, 5, 0, 0)
    result = R.decode_record_set(bytes(batch.data), "t", 0, include_headers=True)
    assert result.batch.column("key").to_pylist() == keys.to_pylist()
    assert result.batch.column("value").to_pylist() == values.to_pylist()
    assert result.batch.column("headers").to_pylist() == [[{"key": "h", "value": b"1"}], [], []] * 100
    if codec == "gzip":  # kafka-python reads gzip by itself (the other codecs need libraries it lacks here)
        assert decoded(result) == oracle(bytes(batch.data))


def test_the_vectorised_encoder_writes_what_the_shared_codec_builds():
    """encode_partition is the columnar twin of node.storage.records.build_batch: the same bytes."""
    rows = [(None, b"v0", []), (b"k1", b"", [("h", b"1")]), (b"k2", None, [("a", None), ("b", b"")]),
            (b"", b"x" * 300, [])]
    keys = pa.array([r[0] for r in rows], pa.binary())
    values = pa.array([r[1] for r in rows], pa.binary())
    hdrs = pa.array([r[2] for r in rows], pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    (batch,) = P.encode_partition(TopicPartition("t", 0), keys, values, hdrs, 1 << 20, 0, 1_000)
    set_producer(batch.data, 7, 1, 5)
    assert bytes(batch.data) == build_batch([r[:2] for r in rows], 1_000, headers=[r[2] for r in rows],
                                            partition_leader_epoch=NO_PARTITION_LEADER_EPOCH, producer_id=7,
                                            producer_epoch=1, base_sequence=5)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(blobs, st.binary(max_size=300), headers), min_size=1, max_size=300),
       batch_bytes=st.sampled_from([1024, 4096, 1 << 20]))
def test_encoder_round_trip_and_batch_sizes(rows, batch_bytes):
    keys = pa.array([r[0] for r in rows], pa.binary())
    values = pa.array([r[1] for r in rows], pa.binary())
    hdrs = pa.array([r[2] for r in rows], pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    batches = P.encode_partition(TopicPartition("t", 0), keys, values, hdrs, batch_bytes, 0, 1_000)
    assert sum(b.records for b in batches) == len(rows)
    data, base = b"", 0
    for batch in batches:
        assert len(batch.data) <= batch_bytes or batch.records == 1
        set_producer(batch.data, 1, 0, base)
        raw = bytearray(batch.data)
        struct.pack_into(">q", raw, 0, base)
        assert [r[0] for r in oracle(bytes(raw))] == list(range(base, base + batch.records))
        data += raw
        base += batch.records
    got = R.decode_record_set(data, "t", 0, include_headers=True)
    assert got.batch.column("key").to_pylist() == [r[0] for r in rows]
    assert got.batch.column("value").to_pylist() == [r[1] for r in rows]
    assert got.batch.column("headers").to_pylist() == [[{"key": k, "value": v} for k, v in r[2]] for r in rows]


@settings(max_examples=300, deadline=None)
@given(position=st.integers(min_value=0, max_value=10**6), byte=st.integers(min_value=0, max_value=255),
       crc=st.booleans())
@example(position=6736, byte=69, crc=False)  # a record length made small: the guessed starts ran backwards
def test_corrupt_bytes_raise_corrupt_records_only(position, byte, crc):
    records = [(b"k%d" % i, b"v" * (i % 90), [("h", b"x")] if i % 3 else [], i) for i in range(40)]
    data = bytearray(kafka_python_batch(0, records))
    data[position % len(data)] = byte
    try:
        result = R.decode_record_set(bytes(data), "t", 0, include_headers=True, check_crc=crc)
    except R.CorruptRecords:
        return
    if result.batch is not None:
        result.batch.validate(full=True)  # whatever decoded is a well-formed Arrow batch


def test_crc_mismatch_is_reported():
    data = bytearray(kafka_python_batch(0, [(None, b"abc", [], 0)]))
    data[-1] ^= 1
    with pytest.raises(R.CorruptRecords, match="CRC-32C"):
        R.decode_record_set(bytes(data), "t", 0)


@given(keys=st.lists(st.binary(max_size=40), min_size=1, max_size=60))
def test_murmur2_is_kafkas(keys):
    got = P.murmur2(pa.array(keys, pa.binary()))
    assert [int(h) for h in got] == [kafka_murmur2(k) & 0xFFFFFFFF for k in keys]


def test_arrow_schema_is_what_spark_expects():
    from pyspark.sql.pandas.types import to_arrow_schema

    from pyspark_shmbroker.source import kafka_schema

    for headers in (False, True):
        assert to_arrow_schema(kafka_schema(headers), timezone="UTC").equals(R.arrow_schema(headers))


def test_fetch_response_walk_matches_kio():
    """wire.parse_fetch_response (the read path's own walk) against kio's decoding of the same bytes."""
    import datetime
    import io

    from kio.index import load_payload_module
    from kio.schema.errors import ErrorCode
    from kio.serial import entity_reader, entity_writer
    from kio.static.constants import EntityType
    from kio.static.primitive import i32, i32Timedelta, i64

    from shmbroker.clients import wire

    schema = load_payload_module(1, 11, EntityType.response)
    batch = kafka_python_batch(5, [(b"k", b"v", [], 0)] * 3)

    def partition(index, records, aborted=0):
        return schema.PartitionData(
            partition_index=i32(index), error_code=ErrorCode.none if index else ErrorCode.offset_out_of_range,
            high_watermark=i64(100 + index), last_stable_offset=i64(90), log_start_offset=i64(index),
            aborted_transactions=tuple(schema.AbortedTransaction(producer_id=i64(7), first_offset=i64(3))
                                       for _ in range(aborted)),
            preferred_read_replica=i32(-1), records=records)

    response = schema.FetchResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)), error_code=ErrorCode.none, session_id=i32(0),
        responses=(schema.FetchableTopicResponse(topic="tópico", partitions=(
            partition(0, None), partition(1, batch, aborted=2), partition(2, b""))),
            schema.FetchableTopicResponse(topic="other", partitions=(partition(3, batch + batch),))))
    body = io.BytesIO()
    entity_writer(type(response))(body, response)
    frame = b"\x00\x00\x00\x07" + body.getvalue() + bytes(wire.FRAME_SLACK)  # correlation id, body, slack
    view = memoryview(frame)[: len(frame) - wire.FRAME_SLACK]
    walked = wire.parse_fetch_response(view, 4)
    decoded, _ = entity_reader(type(response))(view, 4)
    assert walked.error_code == 0
    flat = [(t.topic, p) for t in decoded.responses for p in t.partitions]
    assert len(walked.partitions) == len(flat)
    for got, (topic, want) in zip(walked.partitions, flat):
        assert (got.topic, got.partition, got.error_code, got.high_watermark, got.last_stable_offset,
                got.log_start_offset) == (topic, want.partition_index, want.error_code, want.high_watermark,
                                          want.last_stable_offset, want.log_start_offset)
        assert bytes(got.records) == (want.records or b"")
        assert bytes(frame[got.records_at : got.records_at + len(got.records)]) == bytes(got.records)
        assert got.aborted_transactions == tuple((a.producer_id, a.first_offset)
                                                 for a in (want.aborted_transactions or ()))
    with pytest.raises(ValueError):
        wire.parse_fetch_response(view[:-3], 4)
