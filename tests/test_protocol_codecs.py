"""Hot-path codecs (workers/codecs/produce.py, workers/codecs/fetch.py) cross-checked byte for byte
against kio and kafka-python, plus the client-side helpers in scripts/harness/rawkafka.py."""

from __future__ import annotations

import datetime
import uuid
import io
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i32Timedelta, i64

from shmbroker.node.storage.records import iter_batches
from scripts.harness import rawkafka
from shmbroker.workers.codecs import protocol
from shmbroker.workers.codecs.consumer_group_heartbeat import encode_response_without_assignment
from shmbroker.workers.codecs.errors import ProtocolError
from shmbroker.workers.codecs.fetch import (FETCH_MAX_VERSION, FetchPartitionResult, FetchTopicResult,
                                            encode_fetch_response)
from shmbroker.workers.codecs.produce import (ProducePartitionResult, ProduceTopicResult, decode_produce_request,
                                              encode_produce_response)

PRODUCE_VERSIONS = range(3, 12)
FETCH_VERSIONS = range(4, FETCH_MAX_VERSION + 1)


def body_at(api_key: int, version: int) -> int:
    """Where a response frame's body starts: after the size, the correlation id and header v1's tags."""
    return 9 if protocol.response_class(api_key, version).__header_schema__.__version__ == 1 else 8
CODEC = settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

int16s = st.integers(-(2**15), 2**15 - 1)
int32s = st.integers(-(2**31), 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1)
names = st.text(max_size=12)
error_codes = st.sampled_from(list(ErrorCode))


def kio_bytes(entity: object) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def schema(api_key: int, version: int, kind: EntityType):
    if kind == EntityType.request:
        return protocol.request_schema(api_key, version)
    return protocol.response_schema(api_key, version)


def ms(value: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


# ------------------------------------------------------------------------------ produce request


produce_topics = st.lists(
    st.tuples(names, st.lists(st.tuples(int32s, st.none() | st.binary(max_size=200)), max_size=4)), max_size=4
)


@CODEC
@given(
    version=st.sampled_from(PRODUCE_VERSIONS),
    transactional_id=st.none() | names,
    acks=int16s,
    timeout_ms=int32s,
    topics=produce_topics,
)
def test_produce_request_decodes_kio_encoding_without_copies(version, transactional_id, acks, timeout_ms, topics):
    s = schema(0, version, EntityType.request)
    request = s.ProduceRequest(
        transactional_id=transactional_id,
        acks=i16(acks),
        timeout=ms(timeout_ms),
        topic_data=tuple(
            s.TopicProduceData(
                name=name,
                partition_data=tuple(s.PartitionProduceData(index=i32(i), records=r) for i, r in parts),
            )
            for name, parts in topics
        ),
    )
    wire = kio_bytes(request)
    buffer = bytearray(wire)
    view = decode_produce_request(version, memoryview(buffer))
    assert (view.version, view.transactional_id, view.acks, view.timeout_ms) == (
        version,
        transactional_id,
        acks,
        timeout_ms,
    )
    assert [(t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partitions])
            for t in view.topics] == [(n, list(parts)) for n, parts in topics]
    for topic in view.topics:
        for p in topic.partitions:
            if p.records is not None:
                # A view into the caller's buffer, not a copy: writing the buffer shows through.
                assert p.records.obj is buffer
    # And kio agrees with what our decoder accepted, in the other direction.
    assert entity_reader(type(request))(wire, 0) == (request, len(wire))


def test_produce_request_from_rawkafka_decodes_with_kio() -> None:
    batch = rawkafka.make_batch(3, 50)
    for version in PRODUCE_VERSIONS:
        body = rawkafka.produce_body({"t": {0: batch, 7: batch}, "u": {1: b""}}, acks=-1, timeout_ms=1500,
                                     version=version)
        request, used = entity_reader(protocol._payload_class(schema(0, version, EntityType.request),
                                                              EntityType.request))(body, 0)
        assert used == len(body)
        assert (request.acks, request.timeout.total_seconds(), request.transactional_id) == (-1, 1.5, None)
        assert [(t.name, [(p.index, p.records) for p in t.partition_data]) for t in request.topic_data] == [
            ("t", [(0, batch), (7, batch)]),
            ("u", [(1, b"")]),
        ]


def test_empty_and_null_record_sets_stay_distinct() -> None:
    body = rawkafka.produce_body({"t": {0: b""}})
    (partition,) = decode_produce_request(8, body).topics[0].partitions
    assert partition.records is not None and len(partition.records) == 0
    null = body[:-4] + b"\xff\xff\xff\xff"  # records length -1
    (partition,) = decode_produce_request(8, null).topics[0].partitions
    assert partition.records is None


def test_produce_decode_allocates_nothing_for_record_data() -> None:
    batch = rawkafka.make_batch(10000, 100)  # about 1 MiB
    body = memoryview(rawkafka.produce_body({"t": {p: batch for p in range(4)}}))
    decode_produce_request(8, body)  # warm up caches
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        view = decode_produce_request(8, body)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 16 * 1024, f"{grown} bytes allocated decoding {len(body)} bytes"
    assert all(p.records.obj is body.obj for p in view.topics[0].partitions)


def test_kafka_python_built_batch_decodes() -> None:
    from kafka.protocol.old.produce import ProduceRequest_v7
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False,
        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )
    for i in range(5):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"v" * i, headers=[("h", b"x")])
    batch = bytes(builder.build())
    wire = ProduceRequest_v7(
        transactional_id=None, required_acks=1, timeout=1000, topics=[("kp", [(2, batch)])]
    ).encode()
    view = decode_produce_request(7, wire)
    assert (view.acks, view.timeout_ms, view.topics[0].name) == (1, 1000, "kp")
    (partition,) = view.topics[0].partitions
    assert partition.index == 2 and bytes(partition.records) == batch
    ((_, header),) = iter_batches(partition.records)
    assert (header.record_count, header.last_offset, header.size) == (5, 4, len(batch))
    parsed = DefaultRecordBatch(bytes(partition.records))
    assert parsed.validate_crc()
    assert [(r.key, r.value) for r in parsed] == [(b"k%d" % i, b"v" * i) for i in range(5)]


def test_rawkafka_batches_parse_in_kafka_python() -> None:
    from kafka.record.default_records import DefaultRecordBatch

    batch = rawkafka.build_record_batch([b"a", None, b"ccc"], keys=[None, b"k", b"k2"], first_timestamp_ms=5,
                                        producer_id=9, producer_epoch=1, base_sequence=40)
    parsed = DefaultRecordBatch(batch)
    assert parsed.validate_crc()
    assert (parsed.producer_id, parsed.producer_epoch, parsed.base_sequence) == (9, 1, 40)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in parsed] == [
        (0, 5, None, b"a"), (1, 5, b"k", None), (2, 5, b"k2", b"ccc")]


# ------------------------------------------------------------------------------ produce response


produce_results = st.lists(
    st.tuples(
        names,
        st.lists(
            # log_append_time: -1 (CreateTime) or a time kio can read back exactly through a datetime
            st.tuples(int32s, error_codes, int64s, st.just(-1) | st.integers(0, 4 * 10**12), int64s,
                      st.none() | names,
                      st.lists(st.tuples(int32s, st.none() | names), max_size=2)),
            max_size=4,
        ),
    ),
    max_size=3,
)


@CODEC
@given(version=st.sampled_from(PRODUCE_VERSIONS), correlation_id=int32s, throttle=st.integers(0, 2**31 - 1),
       topics=produce_results)
def test_produce_response_is_byte_identical_to_kio(version, correlation_id, throttle, topics) -> None:
    s = schema(0, version, EntityType.response)
    ours = [
        ProduceTopicResult(name, [
            ProducePartitionResult(i, int(err), base, append_ms, start, message if version >= 8 else None,
                                   tuple(errs) if version >= 8 else ())
            for i, err, base, append_ms, start, message, errs in parts
        ])
        for name, parts in topics
    ]

    def kio_partition(i, err, base, append_ms, start, message, errs):
        fields = {"index": i32(i), "error_code": err, "base_offset": i64(base)}
        fields["log_append_time"] = (
            None if append_ms == -1 else datetime.datetime.fromtimestamp(append_ms / 1000, datetime.UTC)
        )
        if version >= 5:
            fields["log_start_offset"] = i64(start)
        if version >= 8:
            fields["record_errors"] = tuple(
                s.BatchIndexAndErrorMessage(batch_index=i32(b), batch_index_error_message=m) for b, m in errs)
            fields["error_message"] = message
        return s.PartitionProduceResponse(**fields)

    frame = encode_produce_response(version, correlation_id, ours, throttle_time_ms=throttle)
    decoded, used = entity_reader(s.ProduceResponse)(frame, body_at(0, version))
    assert used == len(frame) - body_at(0, version)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert int.from_bytes(frame[4:8], "big", signed=True) == correlation_id
    assert decoded.throttle_time == datetime.timedelta(milliseconds=throttle)
    got = [(t.name, [(p.index, p.error_code, p.base_offset,
                      -1 if p.log_append_time is None else round(p.log_append_time.timestamp() * 1000),
                      p.log_start_offset if version >= 5 else None,
                      p.error_message if version >= 8 else None,
                      [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] if version >= 8 else [])
                     for p in t.partition_responses]) for t in decoded.responses]
    want = [(n, [(i, err, base, append_ms, start if version >= 5 else None, message if version >= 8 else None,
                  list(errs) if version >= 8 else [])
                 for i, err, base, append_ms, start, message, errs in parts]) for n, parts in topics]
    assert got == want
    kio_response = s.ProduceResponse(
        responses=tuple(
            s.TopicProduceResponse(name=n, partition_responses=tuple(kio_partition(*p) for p in parts))
            for n, parts in topics
        ),
        throttle_time=ms(throttle),
    )
    assert frame == protocol.encode_response(0, version, correlation_id, kio_response)


def test_produce_response_bad_values_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        encode_produce_response(8, 1, [ProduceTopicResult("t", [ProducePartitionResult(2**31)])])
    with pytest.raises(ProtocolError):
        encode_produce_response(12, 1, [])


# ------------------------------------------------------------------------------ fetch response


class FileSlice:
    """A (file, position, length) range like workers.connection.FileRange."""

    def __init__(self, file, position: int, length: int) -> None:
        self.file, self.position, self.length = file, position, length


fetch_partitions = st.lists(
    st.tuples(int32s, error_codes, int64s, st.none() | int64s, int64s,
              st.lists(st.tuples(st.sampled_from(["mem", "file"]), st.integers(0, 300)), max_size=3),
              st.lists(st.tuples(int64s, int64s), max_size=2)),  # aborted transactions
    max_size=4,
)


@pytest.fixture(scope="module")
def segment(tmp_path_factory):
    path = tmp_path_factory.mktemp("seg") / "00000000000000000000.log"
    data = bytes(range(256)) * 8
    path.write_bytes(data)
    with open(path, "rb") as f:
        yield f, data


@CODEC
@given(version=st.sampled_from(FETCH_VERSIONS), correlation_id=int32s, throttle=st.integers(0, 2**31 - 1),
       error=error_codes, session=int32s, topics=st.lists(st.tuples(names, fetch_partitions), max_size=3))
def test_fetch_response_decodes_with_kio_and_matches_its_bytes(segment, version, correlation_id, throttle, error,
                                                               session, topics) -> None:
    file, data = segment
    ours, expected = [], []
    for name, parts in topics:
        results, want = [], []
        for index, err, hwm, lso, start, pieces, aborted in parts:
            records, content = [], b""
            for pos, (kind, length) in enumerate(pieces):
                chunk = data[pos * 7 : pos * 7 + length]
                records.append(FileSlice(file, pos * 7, length) if kind == "file" else chunk)
                content += chunk
            results.append(FetchPartitionResult(index, int(err), hwm, lso, start, records, aborted))
            want.append((index, err, hwm, hwm if lso is None else lso, start, content, tuple(aborted)))
        topic_id = uuid.uuid5(uuid.NAMESPACE_DNS, name)  # v13+ name the topic by its id
        ours.append(FetchTopicResult(name, results, topic_id.bytes))
        expected.append((name if version < 13 else topic_id, want))
    frame = encode_fetch_response(version, correlation_id, ours, throttle_time_ms=throttle, error_code=int(error),
                                  session_id=session)
    wire = frame.to_bytes()
    assert len(wire) == frame.size
    assert int.from_bytes(wire[:4], "big") == len(wire) - 4
    assert int.from_bytes(wire[4:8], "big", signed=True) == correlation_id
    s = schema(1, version, EntityType.response)
    decoded, used = entity_reader(s.FetchResponse)(wire, body_at(1, version))
    assert used == len(wire) - body_at(1, version)
    assert decoded.throttle_time == datetime.timedelta(milliseconds=throttle)
    if version >= 7:
        assert (decoded.error_code, decoded.session_id) == (error, session)
    got = []
    for t in decoded.responses:
        got.append((t.topic if version < 13 else t.topic_id, [(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                               p.log_start_offset if version >= 5 else start_placeholder(p), p.records,
                               tuple((a.producer_id, a.first_offset) for a in p.aborted_transactions))
                              for p in t.partitions]))
        for p in t.partitions:
            assert p.aborted_transactions is not None  # an empty array, never null
            assert p.records is not None  # an empty record set is length 0, never null
            if version >= 11:
                assert p.preferred_read_replica == -1
    if version < 5:
        expected = [(n, [w[:4] + (None,) + w[5:] for w in want]) for n, want in expected]
    assert got == expected

    # Byte-identical to kio encoding the same response with the records in memory.
    def kio_partition(index, err, hwm, lso, start, content, aborted):
        fields = dict(partition_index=i32(index), error_code=err, high_watermark=i64(hwm),
                      last_stable_offset=i64(lso), records=content, aborted_transactions=tuple(
                          s.AbortedTransaction(producer_id=i64(pid), first_offset=i64(first)) for pid, first in aborted))
        if version >= 5:
            fields["log_start_offset"] = i64(start)
        if version >= 11:
            fields["preferred_read_replica"] = i32(-1)
        return s.PartitionData(**fields)

    top = dict(throttle_time=ms(throttle), responses=tuple(
        protocol.build_entity(s.FetchableTopicResponse, topic=n, topic_id=n,
                              partitions=tuple(kio_partition(*w) for w in want))
        for n, want in [(n, [w[:4] + (0 if w[4] is None else w[4],) + w[5:] for w in ws]) for n, ws in expected]))
    if version >= 7:
        top.update(error_code=error, session_id=i32(session))
    assert wire == protocol.encode_response(1, version, correlation_id, s.FetchResponse(**top))


def start_placeholder(_partition) -> None:
    return None


def test_fetch_pieces_keep_file_ranges_and_merge_headers(segment) -> None:
    file, data = segment
    ranges = [FileSlice(file, 0, 100), FileSlice(file, 100, 0), FileSlice(file, 500, 20)]
    frame = encode_fetch_response(11, 3, [FetchTopicResult("t", [
        FetchPartitionResult(0, high_watermark=10, records=ranges),
        FetchPartitionResult(1, high_watermark=0),
        FetchPartitionResult(2, high_watermark=0),
    ])])
    kinds = ["bytes" if isinstance(p, (bytes, bytearray, memoryview)) else "range" for p in frame.pieces]
    # header run, the two non-empty ranges (the caller's objects, untouched), one header run for the rest
    assert kinds == ["bytes", "range", "range", "bytes"]
    assert frame.pieces[1] is ranges[0] and frame.pieces[2] is ranges[2]
    assert frame.size == sum(len(p) if k == "bytes" else p.length for p, k in zip(frame.pieces, kinds))


def test_fetch_response_parses_in_kafka_python_and_rawkafka(segment, tmp_path) -> None:
    from kafka.protocol.old.fetch import FetchResponse_v11
    from kafka.record.default_records import DefaultRecordBatch

    log = tmp_path / "0.log"
    batches = [rawkafka.build_record_batch([b"x" * 10] * n, base_offset=base) for base, n in [(0, 3), (3, 2)]]
    log.write_bytes(b"".join(batches))
    with open(log, "rb") as f:
        frame = encode_fetch_response(11, 42, [FetchTopicResult("events", [
            FetchPartitionResult(0, high_watermark=5, log_start_offset=0,
                                 records=[FileSlice(f, 0, log.stat().st_size)]),
            FetchPartitionResult(1, error_code=int(ErrorCode.offset_out_of_range), high_watermark=0),
        ])])
        wire = frame.to_bytes()
    body = wire[8:]
    parsed = FetchResponse_v11.decode(body)
    ((topic, partitions),) = parsed.responses
    assert topic == "events"
    p0, p1 = partitions
    assert p0[0] == 0 and p0[2] == 5 and p0[3] == 5 and p0[5] == [] and p0[6] == -1
    assert p0[7] == b"".join(batches)
    assert p1[1] == 1 and p1[7] == b""
    assert [r.offset for b in batches for r in DefaultRecordBatch(b)] == [0, 1, 2, 3, 4]
    result = rawkafka.parse_fetch_response(11, body)
    counts = [(p.partition, p.record_count, p.batch_count, p.next_offset, p.error_code) for p in result.partitions]
    assert counts == [(0, 5, 2, 5, 0), (1, 0, 0, None, 1)]


def test_rawkafka_skips_a_trailing_partial_batch() -> None:
    whole = rawkafka.make_batch(4, 10)
    partial = rawkafka.make_batch(3, 10, base_offset=4)[:-5]
    headers = [header for _, header in iter_batches(whole + partial)]
    assert [(h.base_offset, h.record_count, h.last_offset) for h in headers] == [(0, 4, 3)]


def test_fetch_response_bad_values_are_protocol_errors(segment) -> None:
    file, _ = segment
    for bad in (FetchPartitionResult(2**31), FetchPartitionResult(0, high_watermark=2**63)):
        with pytest.raises(ProtocolError):
            encode_fetch_response(11, 1, [FetchTopicResult("t", [bad])])
    with pytest.raises(ProtocolError):
        encode_fetch_response(FETCH_MAX_VERSION + 1, 1, [])
    with pytest.raises(ProtocolError):
        encode_fetch_response(11, 1, [FetchTopicResult("t", [FetchPartitionResult(0, records=[FileSlice(file, 10**9, 5)])])]).to_bytes()


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_rawkafka_fetch_request_decodes_in_the_worker(version: int) -> None:
    topic_id = uuid.uuid4()
    body = rawkafka.fetch_body({"a": {0: 5, 3: 9}}, max_wait_ms=250, min_bytes=7, partition_max_bytes=1000,
                               version=version, topic_ids={"a": topic_id})
    request = protocol.decode_request(1, version, body)
    assert request.max_wait == datetime.timedelta(milliseconds=250)
    assert request.min_bytes == 7
    ((topic,),) = [request.topics]
    assert (topic.topic if version < 13 else topic.topic_id) == ("a" if version < 13 else topic_id)
    assert [(p.partition, p.fetch_offset, p.partition_max_bytes) for p in topic.partitions] == [
        (0, 5, 1000), (3, 9, 1000)]


def test_rawkafka_control_requests_decode_in_the_worker() -> None:
    for version in range(0, 9):
        request = protocol.decode_request(3, version, rawkafka.metadata_body(["a", "b"], version=version))
        assert [t.name for t in request.topics] == ["a", "b"]
    for version in range(2, 5):
        request = protocol.decode_request(19, version, rawkafka.create_topics_body({"x": 3}, version=version))
        assert [(t.name, t.num_partitions) for t in request.topics] == [("x", 3)]
    for version in range(1, 6):
        request = protocol.decode_request(2, version, rawkafka.list_offsets_body({"x": [0, 1]}, -2, version=version))
        assert [p.timestamp for p in request.topics[0].partitions] == [-2, -2]
    for version in range(0, 4):
        request = protocol.decode_request(18, version, rawkafka.api_versions_body(version))
        if version >= 3:
            assert request.client_software_name == "rawkafka"
    frame = rawkafka.encode_request(18, 3, 11, rawkafka.api_versions_body(3))
    header = protocol.parse_request_header(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (18, 3, 11, "rawkafka")
    protocol.decode_request(18, 3, memoryview(frame)[4 + header.body_offset:])


# -- ConsumerGroupHeartbeat: a settled member's answer (workers.codecs.consumer_group_heartbeat) -----------------

HEARTBEAT_VERSIONS = range(protocol.SUPPORTED_APIS[protocol.CONSUMER_GROUP_HEARTBEAT][0],
                           protocol.SUPPORTED_APIS[protocol.CONSUMER_GROUP_HEARTBEAT][1] + 1)
nullable_texts = st.none() | st.text(max_size=300)


@CODEC
@given(version=st.sampled_from(HEARTBEAT_VERSIONS), correlation_id=int32s, throttle=st.integers(0, 2**31 - 1),
       error=st.sampled_from([int(e) for e in ErrorCode]), message=nullable_texts, member=nullable_texts,
       epoch=int32s, interval=st.integers(0, 2**31 - 1))
def test_heartbeat_answer_without_assignment_is_byte_identical_to_kio(version, correlation_id, throttle, error,
                                                                      message, member, epoch, interval) -> None:
    s = schema(protocol.CONSUMER_GROUP_HEARTBEAT, version, EntityType.response)
    frame = encode_response_without_assignment(correlation_id, throttle, error, message, member, epoch, interval)
    assert frame == protocol.encode_response(protocol.CONSUMER_GROUP_HEARTBEAT, version, correlation_id,
                                             s.ConsumerGroupHeartbeatResponse(
                                                 throttle_time=ms(throttle), error_code=ErrorCode(error),
                                                 error_message=message, member_id=member, member_epoch=i32(epoch),
                                                 heartbeat_interval=ms(interval), assignment=None))


def test_heartbeat_answer_bad_values_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        encode_response_without_assignment(1, 0, 0, None, "m", 2**31, 5000)
    with pytest.raises(ProtocolError):
        encode_response_without_assignment(1, 0, 2**15, None, "m", 1, 5000)
