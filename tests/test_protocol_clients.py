"""Real Kafka clients against the protocol layer alone.

A small in-memory answerer built only from workers.codecs.protocol (no storage, no workers) serves
ApiVersions, Metadata, InitProducerId, Produce and Fetch on 127.0.0.1. librdkafka
(confluent-kafka) produces to it with every compression codec and with idempotence, and
kafka-python consumes from it: so the ApiVersions negotiation, the Metadata and
InitProducerId answers, the zero-copy Produce decoder, the Produce response encoder and the
Fetch response encoder are all checked by the clients the node must serve, not only by kio.
"""

from __future__ import annotations

import datetime
import socket
import struct
import threading
import time
import uuid
from collections import defaultdict

import crc32c
import pytest

from scripts.harness import rawkafka
from shmbroker.workers.codecs import protocol
from shmbroker.workers.codecs.errors import NONE, UNKNOWN_TOPIC_OR_PARTITION, ErrorCode, ProtocolError
from shmbroker.workers.codecs.fetch import FetchPartitionResult, FetchTopicResult, encode_fetch_response
from shmbroker.workers.codecs.produce import ProducePartitionResult, ProduceTopicResult, encode_produce_response

PARTITIONS = 2
CLIENT_DEADLINE_S = 30.0
FETCH_WAIT_CAP_S = 0.05
PRODUCER_ID = 4242
FLEXIBLE_PRODUCE = protocol.FIRST_FLEXIBLE[protocol.PRODUCE]
ZERO = datetime.timedelta(0)


class ProtocolAnswerer:
    """Answers requests from memory, one thread per connection, everything bounded in time."""

    def __init__(self, advertised: dict[int, tuple[int, int]] | None = None) -> None:
        self.advertised = advertised
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.logs: dict[tuple[str, int], list[bytes]] = defaultdict(list)  # batches with offsets assigned
        self.next_offset: dict[tuple[str, int], int] = defaultdict(int)
        self.requests: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def versions(self, api_key: int) -> set[int]:
        """The versions of `api_key` the clients sent."""
        with self.lock:
            return {version for key, version in self.requests if key == api_key}

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)
        self.listener.close()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.1)
        buffer = bytearray()
        with conn:
            while not self.stop.is_set():
                try:
                    chunk = conn.recv(1 << 20)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                buffer += chunk
                try:
                    frames, used = protocol.split_frames(bytes(buffer))
                    del buffer[:used]
                    for frame in frames:
                        reply = self._answer(frame)
                        if reply:
                            conn.sendall(reply)
                except ProtocolError as exc:
                    self.errors.append(str(exc))
                    return

    def _answer(self, frame: memoryview) -> bytes | None:
        header = protocol.parse_request_header(frame)
        key, version, cid = header.api_key, header.api_version, header.correlation_id
        self.requests.append((key, version))
        if key == protocol.API_VERSIONS and not protocol.is_supported(key, version):
            return protocol.encode_api_versions_unsupported(cid)
        request = protocol.decode_request(key, version, frame[header.body_offset :])
        if key == protocol.API_VERSIONS:
            return protocol.encode_response(key, version, cid, protocol.api_versions_response(version, apis=self.advertised))
        if key == protocol.METADATA:
            return protocol.encode_response(key, version, cid, self._metadata(version, request))
        if key == protocol.INIT_PRODUCER_ID:
            s = protocol.response_schema(key, version)
            resp = s.InitProducerIdResponse(throttle_time=ZERO, error_code=NONE, producer_id=PRODUCER_ID, producer_epoch=0)
            return protocol.encode_response(key, version, cid, resp)
        if key == protocol.PRODUCE:
            return self._produce(version, cid, request)
        if key == protocol.FETCH:
            return self._fetch(version, cid, request)
        if key == protocol.FIND_COORDINATOR:  # as the node answers it until groups exist
            s = protocol.response_schema(key, version)
            resp = protocol.build_entity(s.FindCoordinatorResponse, throttle_time=ZERO,
                                         error_code=ErrorCode.coordinator_not_available, error_message=None,
                                         node_id=-1, host="", port=-1)
            return protocol.encode_response(key, version, cid, resp)
        raise ProtocolError(f"this test answerer does not serve api {key}")

    def _metadata(self, version: int, request) -> object:
        s = protocol.response_schema(protocol.METADATA, version)
        names = ["t"] if request.topics is None else [t.name for t in request.topics]
        build = protocol.build_entity
        topics = tuple(
            build(s.MetadataResponseTopic, error_code=NONE, name=name, topic_id=topic_id_of(name), is_internal=False,
                  partitions=tuple(
                      build(s.MetadataResponsePartition, error_code=NONE, partition_index=p, leader_id=0,
                            leader_epoch=0, replica_nodes=(0,), isr_nodes=(0,), offline_replicas=())
                      for p in range(PARTITIONS)),
                  topic_authorized_operations=-2147483648)
            for name in names
        )
        broker = build(s.MetadataResponseBroker, node_id=0, host="127.0.0.1", port=self.port, rack=None)
        return build(s.MetadataResponse, throttle_time=ZERO, brokers=(broker,), cluster_id="test", controller_id=0,
                     topics=topics, cluster_authorized_operations=-2147483648, error_code=NONE)

    def _produce(self, version: int, cid: int, request) -> bytes | None:
        results = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                batch = bytearray(p.records)
                (stored_crc,) = struct.unpack_from(">I", batch, 17)
                if stored_crc != crc32c.crc32c(bytes(batch[21:])) or batch[16] != 2:
                    parts.append(ProducePartitionResult(p.index, int(ErrorCode.corrupt_message)))
                    continue
                if not 0 <= p.index < PARTITIONS:
                    parts.append(ProducePartitionResult(p.index, int(UNKNOWN_TOPIC_OR_PARTITION)))
                    continue
                (last_delta,) = struct.unpack_from(">i", batch, 23)
                with self.lock:
                    tp = (topic.name, p.index)
                    base = self.next_offset[tp]
                    struct.pack_into(">q", batch, 0, base)  # CRC covers attributes onward: still valid
                    self.logs[tp].append(bytes(batch))
                    self.next_offset[tp] = base + last_delta + 1
                parts.append(ProducePartitionResult(p.index, 0, base, -1, 0))
            results.append(ProduceTopicResult(topic.name, parts))
        if request.acks == 0:
            return None
        return encode_produce_response(version, cid, results)

    def _fetch(self, version: int, cid: int, request) -> bytes:
        deadline = time.monotonic() + min(request.max_wait.total_seconds(), FETCH_WAIT_CAP_S)
        while True:
            topics, total = [], 0
            with self.lock:
                for t in request.topics:
                    name = t.topic if version < 13 else NAMES_BY_ID[t.topic_id]
                    parts = []
                    for p in t.partitions:
                        tp = (name, p.partition)
                        hw = self.next_offset[tp]
                        batches = [b for b in self.logs[tp] if _next_offset(b) > p.fetch_offset]
                        total += sum(map(len, batches))
                        parts.append(FetchPartitionResult(p.partition, 0, hw, None, 0, batches))
                    topics.append(FetchTopicResult(name, parts, topic_id_of(name).bytes))
            if total >= request.min_bytes or time.monotonic() >= deadline:
                return encode_fetch_response(version, cid, topics).to_bytes()
            time.sleep(0.005)


LIBRDKAFKA_NEWEST_FETCH = 16  # librdkafka 2.16: topic ids (v13+), its newest below the node's 17
KAFKA_PYTHON_NEWEST_FETCH = 12  # kafka-python 3.0 has no topic ids: it stops below Fetch v13
NAMES_BY_ID: dict[uuid.UUID, str] = {}


def topic_id_of(name: str) -> uuid.UUID:
    """The answerer's topic ids (KIP-516): one per name, for Metadata v10+ and Fetch v13+."""
    topic_id = uuid.uuid5(uuid.NAMESPACE_URL, name)
    NAMES_BY_ID[topic_id] = name
    return topic_id


def _next_offset(batch: bytes) -> int:
    base, = struct.unpack_from(">q", batch, 0)
    last_delta, = struct.unpack_from(">i", batch, 23)
    return base + last_delta + 1


# librdkafka enables LZ4 only for brokers advertising FindCoordinator (see api_versions_response);
# the node advertises it, so SUPPORTED_APIS has it and this is the advertisement without it.
WITH_FIND_COORDINATOR = protocol.SUPPORTED_APIS
WITHOUT_FIND_COORDINATOR = {k: v for k, v in protocol.SUPPORTED_APIS.items() if k != protocol.FIND_COORDINATOR}


@pytest.fixture
def answerer(request):
    server = ProtocolAnswerer(getattr(request, "param", None))
    try:
        yield server
    finally:
        server.close()
    assert server.errors == []


def produce_with_confluent(port: int, config: dict, messages: list[tuple[int, bytes, bytes]]) -> list:
    from confluent_kafka import Producer

    delivered = []
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 5,
                         "message.timeout.ms": int(CLIENT_DEADLINE_S * 1000), **config})
    for partition, key, value in messages:
        producer.produce("t", value=value, key=key, partition=partition,
                         headers=[("h", b"1")], on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    remaining = producer.flush(CLIENT_DEADLINE_S)
    assert remaining == 0
    return delivered


@pytest.mark.parametrize("answerer", [WITH_FIND_COORDINATOR], indirect=True)
@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_producer_every_codec(answerer: ProtocolAnswerer, compression: str) -> None:
    messages = [(i % PARTITIONS, b"k%d" % i, b"value-%d" % i * 20) for i in range(200)]
    delivered = produce_with_confluent(answerer.port, {"compression.type": compression, "acks": "all"}, messages)
    assert [err for err, _ in delivered if err is not None] == []
    assert sorted(offset for _, offset in delivered) == sorted(list(range(100)) * 2)
    counts = {tp: sum(struct.unpack_from(">i", b, 57)[0] for b in batches) for tp, batches in answerer.logs.items()}
    assert counts == {("t", 0): 100, ("t", 1): 100}
    codec_bits = {b[22] & 0x07 for batches in answerer.logs.values() for b in batches}
    assert codec_bits == {{"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[compression]}
    api_versions = {v for k, v in answerer.requests if k == protocol.API_VERSIONS}
    assert api_versions & {3}  # librdkafka negotiates with ApiVersions v3 (flexible, header v2)
    # librdkafka negotiates Produce's flexible versions (v10 in 2.x: its newest)
    assert answerer.versions(protocol.PRODUCE) and min(answerer.versions(protocol.PRODUCE)) >= FLEXIBLE_PRODUCE
    assert min(answerer.versions(protocol.METADATA)) >= protocol.FIRST_FLEXIBLE[protocol.METADATA]


@pytest.mark.parametrize("answerer", [WITHOUT_FIND_COORDINATOR], indirect=True)
def test_librdkafka_sends_lz4_uncompressed_unless_find_coordinator_is_advertised(answerer) -> None:
    """Documents the client behaviour behind api_versions_response's note."""
    messages = [(0, None, b"abc" * 100) for _ in range(20)]
    delivered = produce_with_confluent(answerer.port, {"compression.type": "lz4"}, messages)
    assert [err for err, _ in delivered if err is not None] == []
    assert {b[22] & 0x07 for b in answerer.logs[("t", 0)]} == {0}


def test_confluent_idempotent_producer(answerer: ProtocolAnswerer) -> None:
    messages = [(0, None, b"x" * 100) for _ in range(50)]
    delivered = produce_with_confluent(answerer.port, {"enable.idempotence": True}, messages)
    assert [err for err, _ in delivered if err is not None] == []
    assert any(k == protocol.INIT_PRODUCER_ID for k, _ in answerer.requests)
    batches = answerer.logs[("t", 0)]
    producer_ids = {struct.unpack_from(">q", b, 43)[0] for b in batches}
    assert producer_ids == {PRODUCER_ID}
    sequences = [struct.unpack_from(">i", b, 53)[0] for b in batches]
    assert sequences[0] == 0 and sequences == sorted(sequences)


def check_consumed(messages: list[tuple[int, bytes, bytes]], got: dict[int, list]) -> None:
    """Each partition's (offset, key, value, headers) as consumed: what was produced to it, in order, from
    offset 0, each with the header the producer sent."""
    for p in range(PARTITIONS):
        sent = [(k, v) for part, k, v in messages if part == p]
        assert [(o, k, v) for o, k, v, _ in got[p]] == [(i, k, v) for i, (k, v) in enumerate(sent)]
        assert all(h == [("h", b"1")] for *_, h in got[p])


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_kafka_python_consumer_reads_what_was_produced(answerer: ProtocolAnswerer, compression: str) -> None:
    from kafka import KafkaConsumer, TopicPartition

    messages = [(i % PARTITIONS, b"k%d" % i, b"v%d" % i) for i in range(120)]
    produce_with_confluent(answerer.port, {"compression.type": compression}, messages)
    consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{answerer.port}", group_id=None,
                             enable_auto_commit=False, fetch_max_wait_ms=50, request_timeout_ms=10000)
    try:
        tps = [TopicPartition("t", p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        got: dict[int, list] = defaultdict(list)
        deadline = time.monotonic() + CLIENT_DEADLINE_S
        while sum(map(len, got.values())) < len(messages) and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                got[tp.partition].extend((r.offset, r.key, r.value, r.headers) for r in records)
    finally:
        consumer.close()
    check_consumed(messages, got)
    assert answerer.versions(protocol.FETCH) == {KAFKA_PYTHON_NEWEST_FETCH}  # flexible, by topic name


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_confluent_consumer_reads_what_was_produced(answerer: ProtocolAnswerer, isolation: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    messages = [(i % PARTITIONS, b"k%d" % i, b"v%d" % i) for i in range(120)]
    produce_with_confluent(answerer.port, {"compression.type": "zstd"}, messages)
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{answerer.port}", "group.id": "g",
                         "enable.auto.commit": False, "isolation.level": isolation, "fetch.wait.max.ms": 50})
    try:
        consumer.assign([TopicPartition("t", p, 0) for p in range(PARTITIONS)])
        got: dict[int, list] = defaultdict(list)
        deadline = time.monotonic() + CLIENT_DEADLINE_S
        while sum(map(len, got.values())) < len(messages) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got[msg.partition()].append((msg.offset(), msg.key(), msg.value(), msg.headers()))
    finally:
        consumer.close()
    check_consumed(messages, got)
    assert answerer.versions(protocol.FETCH) == {LIBRDKAFKA_NEWEST_FETCH}  # by topic id


def test_rawkafka_pipelines_produce_fetch_and_control_requests(answerer: ProtocolAnswerer) -> None:
    batch = rawkafka.make_batch(10, 100)
    with rawkafka.RawConnection("127.0.0.1", answerer.port, timeout_s=CLIENT_DEADLINE_S) as conn:
        versions = conn.call(protocol.API_VERSIONS, 3, rawkafka.api_versions_body(3))
        assert {a.api_key: (a.min_version, a.max_version) for a in versions.api_keys} == protocol.SUPPORTED_APIS
        # An ApiVersions version we do not know gets error 35 in a v0 body.
        unknown = conn.request(protocol.API_VERSIONS, 9, rawkafka.api_versions_body(3))
        assert rawkafka.decode_response(protocol.API_VERSIONS, 0, unknown).error_code == 35
        metadata = conn.call(protocol.METADATA, 8, rawkafka.metadata_body(["t"], version=8))
        assert [(b.host, b.port) for b in metadata.brokers] == [("127.0.0.1", answerer.port)]

        frame = rawkafka.produce_request("t", 1, batch, acks=1)
        cids = conn.send_frames([(protocol.PRODUCE, 8, frame)] * 20)
        assert conn.inflight == 20
        base_offsets = []
        for cid in cids:
            got, api_key, version, body = conn.recv_response()
            assert (got, api_key, version) == (cid, protocol.PRODUCE, 8)
            response = rawkafka.decode_response(protocol.PRODUCE, 8, body)
            (partition,) = response.responses[0].partition_responses
            assert partition.error_code == 0
            base_offsets.append(partition.base_offset)
        assert base_offsets == list(range(0, 200, 10))
        conn.send(protocol.PRODUCE, 8, rawkafka.produce_body({"t": {0: batch}}, acks=0), expect_response=False)

        offsets = {0: 0, 1: 0}
        records = {0: 0, 1: 0}
        for _ in range(50):
            if records == {0: 10, 1: 200}:
                break
            body = conn.request(protocol.FETCH, 11, rawkafka.fetch_body({"t": offsets}, max_wait_ms=20,
                                                                          partition_max_bytes=4096))
            result = rawkafka.parse_fetch_response(11, body)
            for p in result.partitions:
                assert p.error_code == 0
                records[p.partition] += p.record_count
                if p.next_offset is not None:
                    offsets[p.partition] = p.next_offset
        assert records == {0: 10, 1: 200}
        assert offsets == {0: 10, 1: 200}


def test_rawkafka_reads_a_response_larger_than_one_receive(answerer: ProtocolAnswerer) -> None:
    batch = rawkafka.make_batch(1000, 100)  # about 110 KB
    batches = 30  # about 3.3 MB in one fetch response, over several 1 MiB receives
    with rawkafka.RawConnection("127.0.0.1", answerer.port, timeout_s=CLIENT_DEADLINE_S) as conn:
        frame = rawkafka.produce_request("t", 0, batch, acks=1)
        for _ in conn.send_frames([(protocol.PRODUCE, 8, frame)] * batches):
            conn.recv_response()
        # Pipeline a large fetch and a small request behind it: both must come back intact.
        conn.send(protocol.FETCH, 11, rawkafka.fetch_body({"t": {0: 0}}, max_wait_ms=0))
        conn.send(protocol.API_VERSIONS, 2, rawkafka.api_versions_body(2))
        _, api_key, _, body = conn.recv_response()
        assert api_key == protocol.FETCH and len(body) > 3 * rawkafka._RECV_CHUNK
        (partition,) = rawkafka.parse_fetch_response(11, body).partitions
        assert (partition.record_count, partition.batch_count, partition.next_offset) == (
            1000 * batches, batches, 1000 * batches)
        # kio decodes it too (its compiled reader takes only read-only buffers: make_class_archive's fetch)
        decoded = rawkafka.decode_response(api_key, 11, body)
        assert len(decoded.responses[0].partitions[0].records) == len(batch) * batches
        _, api_key, version, body = conn.recv_response()
        assert rawkafka.decode_response(api_key, version, body).error_code == 0
