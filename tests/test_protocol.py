"""workers.codecs.protocol: framing, request headers, and kio round trips for every supported API version."""

from __future__ import annotations

import datetime
import io
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.request_header.v1.header import RequestHeader as KioHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as KioHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import Records, i8, i16, i32, i32Timedelta, i64Timedelta

from shmbroker.workers.codecs import protocol
from shmbroker.workers.codecs.errors import NONE, UNSUPPORTED_VERSION, ErrorCode, ProtocolError
from shmbroker.workers.codecs.protocol import (API_VERSIONS, CREATE_ACLS, CREATE_TOPICS, DELETE_ACLS, DELETE_TOPICS,
                                               DESCRIBE_ACLS, DESCRIBE_CONFIGS, OFFSET_COMMIT, PRODUCE,
                                               SUPPORTED_APIS, api_versions_response, decode_request,
                                               encode_api_versions_unsupported, encode_response, frame_size,
                                               parse_request_header, response_class, split_frames)

# kio's phantom types carry their own hypothesis strategies; record sets are opaque bytes.
st.register_type_strategy(Records, st.binary(max_size=64))
# kio's native decoder refuses a millisecond duration beyond about 280,000 years either way (measured: it
# decodes up to 9,211,330,572,706,434 and down to -8,882,410,996,584,021 ms), as malformed: the node closes the
# connection (test_durations_beyond_the_codec_are_refused), though kio's own strategy draws such values.
# Durations are drawn within +-2**52 ms (142,000 years).
DECODABLE_MS = 2**52
UNDECODABLE_MS = 2**62
st.register_type_strategy(i64Timedelta, st.integers(-DECODABLE_MS, DECODABLE_MS).map(
    lambda ms: i64Timedelta.parse(datetime.timedelta(milliseconds=ms))))

ALL_VERSIONS = [(key, v) for key, (low, high) in sorted(SUPPORTED_APIS.items()) for v in range(low, high + 1)]
NON_PRODUCE_VERSIONS = [(k, v) for k, v in ALL_VERSIONS if k != PRODUCE]
# data_too_large: StreamsGroupDescribe's deeply nested response (groups > members > assignments > tasks) often
# draws more than hypothesis' entropy budget; the examples that fit are still checked.
ROUNDTRIP = settings(
    max_examples=12, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
)


def kio_bytes(entity: object) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def request_class(api_key: int, version: int) -> type:
    ns = protocol.request_schema(api_key, version)
    return protocol._payload_class(ns, EntityType.request)


def test_advertised_versions_are_the_supported_ones() -> None:
    assert SUPPORTED_APIS == {
        18: (0, 4),  # ApiVersions (4: as 3; KAFKA-17011 let a feature's min version be 0, and the node lists none)
        10: (0, 6),  # FindCoordinator (5: TRANSACTION_ABORTABLE allowed; 6: share-partition keys)
        3: (0, 13),  # Metadata (10+: topic ids; 13: KIP-1102's top-level error code)
        0: (3, 11),  # Produce (12: transactions v2)
        1: (4, 17),  # Fetch (13+: topic ids; 18: KIP-1166)
        2: (1, 10),  # ListOffsets (7: max timestamp; 8-9: tiered storage's, answered without it; 10: timeout)
        22: (0, 4),  # InitProducerId: v3 names the producer bumping its epoch (KIP-360), v4 may be PRODUCER_FENCED
        19: (0, 7),  # CreateTopics (7: topic ids)
        20: (0, 6),  # DeleteTopics (6: by topic id)
        # The group coordinator's (KIP-848's versions excluded):
        11: (0, 8),  # JoinGroup
        14: (0, 5),  # SyncGroup
        12: (0, 4),  # Heartbeat
        13: (0, 5),  # LeaveGroup
        8: (2, 9),  # OffsetCommit (9: KIP-848's member epochs)
        9: (1, 9),  # OffsetFetch (v7: require_stable; v8: several groups; v9: KIP-848 members)
        16: (0, 5),  # ListGroups (4-5: state and type filters)
        15: (0, 6),  # DescribeGroups
        42: (0, 2),  # DeleteGroups
        47: (0, 0),  # OffsetDelete
        # Topic administration:
        37: (0, 3),  # CreatePartitions
        21: (0, 2),  # DeleteRecords
        32: (0, 4),  # DescribeConfigs
        33: (0, 2),  # AlterConfigs
        44: (0, 1),  # IncrementalAlterConfigs
        # The transaction coordinator's:
        24: (0, 3),  # AddPartitionsToTxn
        25: (0, 3),  # AddOffsetsToTxn
        26: (0, 3),  # EndTxn
        28: (0, 3),  # TxnOffsetCommit: v3 with KIP-447's member checks
        27: (1, 2),  # WriteTxnMarkers: an operator's marker (Admin.abortTransaction); 2: KIP-1228's version
        17: (0, 1),  # SaslHandshake: v0-1, the versions librdkafka, kafka-python, aiokafka and KafkaJS use
        36: (0, 2),  # SaslAuthenticate: v1 carries the session lifetime (KIP-368), v2 is flexible
        66: (0, 2),  # ListTransactions (2: KIP-1152's id pattern)
        29: (0, 3),  # DescribeAcls (v0: no pattern type, LITERAL)
        30: (0, 3),  # CreateAcls
        31: (0, 3),  # DeleteAcls
        50: (0, 0),  # DescribeUserScramCredentials
        51: (0, 0),  # AlterUserScramCredentials
        65: (0, 0),  # DescribeTransactions
        # The cluster and the partitions' producers:
        60: (0, 2),  # DescribeCluster (2: fenced brokers: never)
        61: (0, 0),  # DescribeProducers
        55: (0, 2),  # DescribeQuorum (the metadata quorum as one node is it; 2: the voters' endpoints)
        48: (0, 1),  # DescribeClientQuotas (the [quotas] config's client ids)
        # The consumer group protocol (KIP-848):
        68: (0, 1),  # ConsumerGroupHeartbeat
        69: (0, 1),  # ConsumerGroupDescribe
        88: (0, 0),  # StreamsGroupHeartbeat (1: KIP-1331's topology descriptions)
        89: (0, 0),  # StreamsGroupDescribe
        76: (1, 1),  # ShareGroupHeartbeat (KIP-932; v0 was the early access's)
        77: (1, 1),  # ShareGroupDescribe
        78: (1, 2),  # ShareFetch (2: KIP-1222's record-limit acquire mode and RENEW)
        79: (1, 2),  # ShareAcknowledge
        90: (0, 1),  # DescribeShareGroupOffsets (1: each share-partition's lag)
        91: (0, 0),  # AlterShareGroupOffsets
        92: (0, 0),  # DeleteShareGroupOffsets
    }


def test_flexible_versions_use_header_v1_except_api_versions() -> None:
    for key, version in ALL_VERSIONS:
        flexible = request_class(key, version).__flexible__
        assert flexible == (version >= protocol.FIRST_FLEXIBLE.get(key, 1 << 15))
        header = response_class(key, version).__header_schema__.__version__
        # ApiVersions' response header is v0 at every version, by Kafka's rule.
        assert header == (1 if flexible and key != API_VERSIONS else 0)
        # Every API but OffsetDelete and SaslHandshake (never flexible) has flexible versions.
    assert {k for k, v in ALL_VERSIONS if request_class(k, v).__flexible__} == set(SUPPORTED_APIS) - {47, 17}


ALTER_USER_SCRAM_CREDENTIALS = 51


@pytest.mark.parametrize(("api_key", "version"), NON_PRODUCE_VERSIONS)
def test_request_decodes_like_kio(api_key: int, version: int) -> None:
    cls = request_class(api_key, version)

    @ROUNDTRIP
    @given(st.from_type(cls))
    def check(request: object) -> None:
        body = kio_bytes(request)
        assert decode_request(api_key, version, memoryview(body)) == request
        if body:
            if api_key != ALTER_USER_SCRAM_CREDENTIALS:  # librdkafka's doubled empty tag section is tolerated
                with pytest.raises(ProtocolError):
                    decode_request(api_key, version, body + b"\x00")
            with pytest.raises(ProtocolError):
                decode_request(api_key, version, body + b"\x01")
            with pytest.raises(ProtocolError):
                decode_request(api_key, version, body[:-1])

    check()


def test_durations_beyond_the_codec_are_refused() -> None:
    """OffsetCommit v2's retention_time beyond what the codec decodes: a ProtocolError (one log line and a
    closed connection in the worker), never another exception; within it, decoded."""
    cls = request_class(OFFSET_COMMIT, 2)
    request = cls(group_id="g", generation_id_or_member_epoch=i32(-1), member_id="",
                  retention_time=i64Timedelta.parse(datetime.timedelta(milliseconds=DECODABLE_MS)), topics=())
    body = kio_bytes(request)
    assert decode_request(OFFSET_COMMIT, 2, memoryview(body)) == request
    # The same bytes with a larger retention (kio cannot even encode it): group "g" (2 + 1 bytes), generation
    # (4), member "" (2), then the int64 milliseconds.
    at = 2 + 1 + 4 + 2
    assert struct.unpack_from(">q", body, at) == (DECODABLE_MS,)
    far = body[:at] + struct.pack(">q", UNDECODABLE_MS) + body[at + 8:]
    with pytest.raises(ProtocolError):
        decode_request(OFFSET_COMMIT, 2, memoryview(far))


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS)
def test_response_frame_decodes_with_kio(api_key: int, version: int) -> None:
    cls = response_class(api_key, version)
    reader = entity_reader(cls)

    @ROUNDTRIP
    @given(st.from_type(cls), st.integers(-(2**31), 2**31 - 1))
    def check(response: object, correlation_id: int) -> None:
        frame = encode_response(api_key, version, correlation_id, response)
        size, got_correlation_id = struct.unpack_from(">ii", frame)
        assert size == len(frame) - 4
        assert got_correlation_id == correlation_id
        body_at = 8
        if cls.__header_schema__.__version__ == 1:
            assert frame[8] == 0  # header v1's empty tagged-field section
            body_at = 9
        decoded, used = reader(frame, body_at)
        assert used == len(frame) - body_at
        assert decoded == response

    check()


@settings(max_examples=50, deadline=None, database=None)
@given(
    api_key=st.integers(-(2**15), 2**15 - 1),
    version=st.integers(-(2**15), 2**15 - 1),
    correlation_id=st.integers(-(2**31), 2**31 - 1),
    client_id=st.none() | st.text(max_size=20),
    body=st.binary(max_size=16),
)
def test_request_header_matches_kio(api_key, version, correlation_id, client_id, body) -> None:
    flexible = version >= protocol.FIRST_FLEXIBLE.get(api_key, 1 << 15)
    header_cls = KioHeaderV2 if flexible else KioHeaderV1
    header = header_cls(
        request_api_key=i16(api_key),
        request_api_version=i16(version),
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    encoded = kio_bytes(header)
    parsed = parse_request_header(memoryview(encoded + body))
    assert parsed.api_key == api_key
    assert parsed.api_version == version
    assert parsed.correlation_id == correlation_id
    assert parsed.client_id == client_id
    assert parsed.body_offset == len(encoded)
    assert parsed.flexible == flexible


def test_api_versions_v3_request_with_header_v2_decodes() -> None:
    schema = protocol.request_schema(API_VERSIONS, 3)
    request = schema.ApiVersionsRequest(client_software_name="librdkafka", client_software_version="2.3.0")
    header = KioHeaderV2(
        request_api_key=i16(18), request_api_version=i16(3), correlation_id=i32(5), client_id="rdkafka"
    )
    frame = memoryview(kio_bytes(header) + kio_bytes(request))
    parsed = parse_request_header(frame)
    assert decode_request(parsed.api_key, parsed.api_version, frame[parsed.body_offset :]) == request


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_api_versions_response_lists_supported_apis(version: int) -> None:
    frame = encode_response(API_VERSIONS, version, 99, api_versions_response(version))
    decoded, _ = entity_reader(response_class(API_VERSIONS, version))(frame, 8)
    assert decoded.error_code == NONE
    assert {a.api_key: (a.min_version, a.max_version) for a in decoded.api_keys} == SUPPORTED_APIS


def test_unsupported_api_versions_gets_error_35_in_a_v0_body() -> None:
    frame = encode_api_versions_unsupported(1234)
    size, correlation_id = struct.unpack_from(">ii", frame)
    assert (size, correlation_id) == (len(frame) - 4, 1234)
    decoded, used = entity_reader(ApiVersionsResponseV0)(frame, 8)
    assert used == len(frame) - 8
    assert decoded.error_code == UNSUPPORTED_VERSION == 35
    assert {a.api_key: (a.min_version, a.max_version) for a in decoded.api_keys} == SUPPORTED_APIS


def test_unsupported_api_version_headers_still_parse() -> None:
    # A client opening with ApiVersions v5 (header v2) must get its correlation id back.
    header = KioHeaderV2(request_api_key=i16(18), request_api_version=i16(5), correlation_id=i32(77), client_id="x")
    parsed = parse_request_header(kio_bytes(header) + b"\x00\x00\x00")
    assert (parsed.api_key, parsed.api_version, parsed.correlation_id) == (18, 5, 77)
    assert not protocol.is_supported(18, 5)
    with pytest.raises(ProtocolError):
        decode_request(18, 5, b"")
    for api_key, version in [(0, 2), (0, 12), (1, 3), (1, 18), (3, 14), (50, 0), (-1, 0)]:
        with pytest.raises(ProtocolError):
            decode_request(api_key, version, b"\x00" * 32)


def test_encode_response_refuses_wrong_class_or_version() -> None:
    response = api_versions_response(2)
    with pytest.raises(ProtocolError):
        encode_response(API_VERSIONS, 3, 1, response)
    with pytest.raises(ProtocolError):
        encode_response(API_VERSIONS, 9, 1, response)
    with pytest.raises(ProtocolError):
        encode_response(3, 1, 1, response)


def test_encode_response_reports_bad_values_as_protocol_error() -> None:
    schema = protocol.response_schema(API_VERSIONS, 2)
    bad = schema.ApiVersionsResponse(error_code=0, api_keys=(), throttle_time=None)  # error_code must be ErrorCode
    with pytest.raises(ProtocolError):
        encode_response(API_VERSIONS, 2, 1, bad)


@pytest.mark.parametrize(("api_key", "version"), [(CREATE_TOPICS, 0), (CREATE_TOPICS, 1), (DELETE_TOPICS, 0)])
def test_legacy_versions_kio_no_longer_ships_match_kafka_bytes(api_key: int, version: int) -> None:
    """CreateTopics v0/v1 and DeleteTopics v0 are made in workers/codecs/legacy_schemas.py (from kio's v2 and v1);
    check them against kafka-python's independent definitions of the same versions."""
    from kafka.protocol.old.admin import (
        CreateTopicsRequest_v0,
        CreateTopicsRequest_v1,
        CreateTopicsResponse_v0,
        CreateTopicsResponse_v1,
        DeleteTopicsRequest_v0,
        DeleteTopicsResponse_v0,
    )

    if api_key == CREATE_TOPICS:
        topic = ("orders", 3, 1, [(0, [1])], [("retention.ms", "1000"), ("x", None)])
        if version == 0:
            wire = CreateTopicsRequest_v0(create_topic_requests=[topic], timeout=5000).encode()
        else:
            wire = CreateTopicsRequest_v1(create_topic_requests=[topic], timeout=5000, validate_only=True).encode()
        request = decode_request(api_key, version, wire)
        (created,) = request.topics
        assert (created.name, created.num_partitions, created.replication_factor) == ("orders", 3, 1)
        assert [(a.partition_index, a.broker_ids) for a in created.assignments] == [(0, (1,))]
        assert [(c.name, c.value) for c in created.configs] == [("retention.ms", "1000"), ("x", None)]
        assert request.timeout.total_seconds() == 5
        schema = protocol.response_schema(api_key, version)
        if version == 0:
            response = schema.CreateTopicsResponse(
                topics=(schema.CreatableTopicResult(name="orders", error_code=ErrorCode.topic_already_exists),)
            )
            expected = CreateTopicsResponse_v0(topic_errors=[("orders", 36)]).encode()
        else:
            response = schema.CreateTopicsResponse(
                topics=(
                    schema.CreatableTopicResult(
                        name="orders", error_code=ErrorCode.invalid_partitions, error_message="no"
                    ),
                )
            )
            expected = CreateTopicsResponse_v1(topic_errors=[("orders", 37, "no")]).encode()
    else:
        wire = DeleteTopicsRequest_v0(topics=["a", "b"], timeout=100).encode()
        request = decode_request(api_key, version, wire)
        assert request.topic_names == ("a", "b")
        schema = protocol.response_schema(api_key, version)
        response = schema.DeleteTopicsResponse(
            responses=(schema.DeletableTopicResult(name="a", error_code=ErrorCode.unknown_topic_or_partition),)
        )
        expected = DeleteTopicsResponse_v0(topic_error_codes=[("a", 3)]).encode()
    assert encode_response(api_key, version, 1, response)[8:] == expected


def _acl_v0_cases() -> list[tuple]:
    """(api key, kafka-python's request, its fields as the node decodes them, the node's response, kafka-python's)
    of DescribeConfigs v0 and the ACL APIs' v0, whose schemas legacy_schemas makes from kio's v1."""
    from kafka.protocol.old import admin as kp

    zero = i32Timedelta.parse(datetime.timedelta(0))
    binding = (2, "t", "User:alice", "*", 3, 3)  # topic t, the principal and host, READ, ALLOW

    def ours(api_key: int) -> Any:
        return protocol.response_schema(api_key, 0)

    def describe_configs(schema: Any) -> Any:
        result = schema.DescribeConfigsResourceResult(name="retention.ms", value="1000", read_only=False,
                                                      is_default=True, is_sensitive=False)
        return schema.DescribeConfigsResponse(throttle_time=zero, results=(schema.DescribeConfigsResult(
            error_code=ErrorCode.none, error_message=None, resource_type=i8(2), resource_name="t",
            configs=(result,)),))

    def describe_acls(schema: Any) -> Any:
        acl = schema.AclDescription(principal="User:alice", host="*", operation=i8(3), permission_type=i8(3))
        return schema.DescribeAclsResponse(throttle_time=zero, error_code=ErrorCode.none, error_message=None,
                                           resources=(schema.DescribeAclsResource(
                                               resource_type=i8(2), resource_name="t", acls=(acl,)),))

    def create_acls(schema: Any) -> Any:
        return schema.CreateAclsResponse(throttle_time=zero, results=(schema.AclCreationResult(
            error_code=ErrorCode.none, error_message=None),))

    def delete_acls(schema: Any) -> Any:
        matching = schema.DeleteAclsMatchingAcl(error_code=ErrorCode.none, error_message=None, resource_type=i8(2),
                                                resource_name="t", principal="User:alice", host="*",
                                                operation=i8(3), permission_type=i8(3))
        return schema.DeleteAclsResponse(throttle_time=zero, filter_results=(schema.DeleteAclsFilterResult(
            error_code=ErrorCode.none, error_message=None, matching_acls=(matching,)),))

    return [
        (DESCRIBE_CONFIGS, kp.DescribeConfigsRequest_v0([(2, "t", ["retention.ms"])]),
         lambda r: [(x.resource_type, x.resource_name, x.configuration_keys) for x in r.resources],
         [(2, "t", ("retention.ms",))], describe_configs,
         kp.DescribeConfigsResponse_v0(0, [(0, None, 2, "t", [("retention.ms", "1000", False, True, False)])])),
        (DESCRIBE_ACLS, kp.DescribeAclsRequest_v0(*binding),
         lambda r: [(r.resource_type_filter, r.resource_name_filter, r.principal_filter, r.host_filter,
                     r.operation, r.permission_type)], [binding], describe_acls,
         kp.DescribeAclsResponse_v0(0, 0, None, [(2, "t", [("User:alice", "*", 3, 3)])])),
        (CREATE_ACLS, kp.CreateAclsRequest_v0([binding]),
         lambda r: [(c.resource_type, c.resource_name, c.principal, c.host, c.operation, c.permission_type)
                    for c in r.creations], [binding], create_acls, kp.CreateAclsResponse_v0(0, [(0, None)])),
        (DELETE_ACLS, kp.DeleteAclsRequest_v0([binding]),
         lambda r: [(f.resource_type_filter, f.resource_name_filter, f.principal_filter, f.host_filter, f.operation,
                     f.permission_type) for f in r.filters], [binding], delete_acls,
         kp.DeleteAclsResponse_v0(0, [(0, None, [(0, None) + binding])])),
    ]


def test_describe_configs_and_acl_v0_kio_no_longer_ships_match_kafka_bytes() -> None:
    """DescribeConfigs v0 and the ACL APIs' v0, made in workers/codecs/legacy_schemas.py from kio's v1 (without the
    synonyms and the pattern types): requests as kafka-python encodes them decode to their fields, and responses
    encode to kafka-python's bytes."""
    for api_key, request, fields_of, fields, response, expected in _acl_v0_cases():
        assert fields_of(decode_request(api_key, 0, request.encode())) == fields, api_key
        assert encode_response(api_key, 0, 1, response(protocol.response_schema(api_key, 0)))[8:] \
            == expected.encode(), api_key


# ------------------------------------------------------------------------------ framing


def test_frame_size_and_split_frames() -> None:
    frames = [b"abc", b"", b"x" * 300]
    stream = b"".join(struct.pack(">i", len(f)) + f for f in frames)
    for cut in range(len(stream) + 1):
        got, used = split_frames(stream[:cut])
        # Exactly the frames wholly inside the prefix, and the bytes they use.
        whole, pos = [], 0
        for f in frames:
            if pos + 4 + len(f) <= cut:
                whole.append(f)
                pos += 4 + len(f)
            else:
                break
        assert [bytes(g) for g in got] == whole
        assert used == pos
    assert frame_size(b"\x00\x00") is None
    assert frame_size(b"\x00\x00\x00\x05") == 5


@pytest.mark.parametrize("size", [-1, -(2**31), 101 * 1024 * 1024, 2**31 - 1])
def test_frame_size_out_of_bounds_is_a_protocol_error(size: int) -> None:
    with pytest.raises(ProtocolError):
        frame_size(struct.pack(">i", size))
    with pytest.raises(ProtocolError):
        split_frames(struct.pack(">i", 0) + struct.pack(">i", size))
    assert frame_size(struct.pack(">i", 1000), max_request_size=1000) == 1000
    with pytest.raises(ProtocolError):
        frame_size(struct.pack(">i", 1001), max_request_size=1000)


def test_a_worker_starts_without_the_schemas_of_the_versions_it_serves_and_loads_one_at_its_first_use() -> None:
    """kio's schema modules of every served version took most of a worker's start: each is imported when a
    request of its version first comes."""
    import json
    import subprocess
    import sys

    probe = (
        "import json, sys, workers.worker\n"
        "from workers.codecs import protocol\n"
        "def loaded(): return {m for m in sys.modules if m.startswith('kio.schema.') and m.count('.') >= 4}\n"
        "before = loaded()\n"
        "protocol.decode_request(protocol.METADATA, 12, bytes.fromhex('00010000'))\n"
        "print(json.dumps([sorted(before), sorted(loaded() - before)]))\n"
    )
    at_start, first_use = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                                    check=True).stdout)
    assert all(m.split(".")[2] in ("api_versions", "request_header", "response_header") for m in at_start), at_start
    assert first_use == ["kio.schema.metadata.v12.request", "kio.schema.metadata.v12.response"]


def test_every_served_api_has_its_own_stats_counters_and_name() -> None:
    """The stats segment counts requests per API key up to MAX_APIS; a key past it would count in another API's
    counters (the worker indexes the row's arrays by key)."""
    from shmbroker.node.tools.inspect import API_NAMES
    from shmbroker.shm import stats
    assert max(SUPPORTED_APIS) < stats.MAX_APIS
    assert set(SUPPORTED_APIS) <= set(API_NAMES), sorted(set(SUPPORTED_APIS) - set(API_NAMES))
