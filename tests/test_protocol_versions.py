"""Every API at every advertised version, flexible ones included (KIP-482), through a node and through the codecs.

- A live node answers a plausible request of each API at each version it advertises with a response that kio
  decodes whole (a handler that cannot fill some version's fields closes the connection instead).
- Property tests: a request of every version with tagged fields a newer client might add (unknown tags, in the
  header and at every depth of the body) decodes as the same request without them; the hot codecs read and
  write the flexible forms as kio does.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import Records, i8, i16, i32, i64, i64Timedelta

from scripts.harness import rawkafka as R
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.codecs.tagged_fields import uvarint

ALL_VERSIONS = [(key, v) for key, (low, high) in sorted(P.SUPPORTED_APIS.items()) for v in range(low, high + 1)]
FLEXIBLE = [(key, v) for key, v in ALL_VERSIONS if v >= P.FIRST_FLEXIBLE.get(key, 1 << 15)]
TOPIC = "versions"


def ms(value: int):
    return R.millis(value)


def build(api_key: int, version: int, class_name: str, /, **fields):
    """The request class of that name at that version (the node's schemas: old ones kio dropped included); None
    when the version has no such class (nor the field holding it, which build_entity then drops)."""
    cls = getattr(P.request_schema(api_key, version), class_name, None)
    return None if cls is None else P.build_entity(cls, **fields)


def request_for(api_key: int, version: int, tag: str):
    """A plausible request of `api_key` at `version`; `tag` keeps names apart between versions."""
    b = lambda class_name, /, **fields: build(api_key, version, class_name, **fields)  # noqa: E731
    group = f"g-{api_key}-{version}"
    if api_key == P.PRODUCE:
        return None  # the hot path: sent as rawkafka bodies below
    if api_key == P.FETCH:
        return None
    if api_key == P.LIST_OFFSETS:
        return b("ListOffsetsRequest", replica_id=i32(-1), isolation_level=i8(0), timeout=ms(10_000), topics=(b(
            "ListOffsetsTopic", name=TOPIC, partitions=(b("ListOffsetsPartition", partition_index=i32(0),
                                                          timestamp=i64(-2)),)),))
    if api_key == P.METADATA:
        return b("MetadataRequest", topics=(b("MetadataRequestTopic", name=TOPIC, topic_id=None),),
                 allow_auto_topic_creation=False,
                 include_cluster_authorized_operations=False, include_topic_authorized_operations=True)
    if api_key == P.API_VERSIONS:
        return b("ApiVersionsRequest", client_software_name="versions-test", client_software_version="1.0")
    if api_key == P.CREATE_TOPICS:
        return b("CreateTopicsRequest", timeout=ms(10_000), validate_only=False, topics=(b(
            "CreatableTopic", name=f"created-{tag}", num_partitions=i32(2), replication_factor=i16(1), assignments=(),
            configs=(b("CreatableTopicConfig", name="retention.ms", value="3600000"),)),))
    if api_key == P.DELETE_TOPICS:
        return b("DeleteTopicsRequest", topic_names=(f"absent-{tag}",), timeout=ms(10_000),
                 topics=(b("DeleteTopicState", name=f"absent-{tag}", topic_id=None),))
    if api_key == P.INIT_PRODUCER_ID:
        return b("InitProducerIdRequest", transactional_id=None, transaction_timeout=ms(60_000))
    if api_key == P.CREATE_PARTITIONS:
        return b("CreatePartitionsRequest", timeout=ms(10_000), validate_only=True, topics=(b(
            "CreatePartitionsTopic", name=TOPIC, count=i32(3), assignments=None),))
    if api_key == P.DELETE_RECORDS:
        return b("DeleteRecordsRequest", timeout=ms(10_000), topics=(b(
            "DeleteRecordsTopic", name=TOPIC, partitions=(b("DeleteRecordsPartition", partition_index=i32(0),
                                                            offset=i64(0)),)),))
    if api_key == P.DESCRIBE_CONFIGS:
        return b("DescribeConfigsRequest", include_synonyms=True, include_documentation=True, resources=(b(
            "DescribeConfigsResource", resource_type=i8(2), resource_name=TOPIC, configuration_keys=None),))
    if api_key == P.ALTER_CONFIGS:
        return b("AlterConfigsRequest", validate_only=True, resources=(b(
            "AlterConfigsResource", resource_type=i8(2), resource_name=TOPIC,
            configs=(b("AlterableConfig", name="retention.ms", value="7200000"),)),))
    if api_key == P.INCREMENTAL_ALTER_CONFIGS:
        return b("IncrementalAlterConfigsRequest", validate_only=True, resources=(b(
            "AlterConfigsResource", resource_type=i8(2), resource_name=TOPIC,
            configs=(b("AlterableConfig", name="retention.ms", config_operation=i8(0), value="7200000"),)),))
    if api_key == P.FIND_COORDINATOR:
        return b("FindCoordinatorRequest", key=group, key_type=i8(0), coordinator_keys=(group, f"{group}-b"))
    if api_key == P.JOIN_GROUP:
        return b("JoinGroupRequest", group_id=group, session_timeout=ms(10_000), rebalance_timeout=ms(10_000),
                 member_id="", group_instance_id=None, protocol_type="consumer", reason="test",
                 protocols=(b("JoinGroupRequestProtocol", name="range", metadata=b"\x00\x01"),))
    if api_key == P.SYNC_GROUP:
        return b("SyncGroupRequest", group_id=group, generation_id=i32(1), member_id="nobody", group_instance_id=None,
                 protocol_type="consumer", protocol_name="range", assignments=())
    if api_key == P.HEARTBEAT:
        return b("HeartbeatRequest", group_id=group, generation_id=i32(1), member_id="nobody", group_instance_id=None)
    if api_key == P.LEAVE_GROUP:
        return b("LeaveGroupRequest", group_id=group, member_id="nobody",
                 members=(b("MemberIdentity", member_id="nobody", group_instance_id=None, reason="test"),))
    if api_key == P.OFFSET_COMMIT:
        return b("OffsetCommitRequest", group_id=group, generation_id_or_member_epoch=i32(-1), member_id="",
                 group_instance_id=None, retention_time=i64Timedelta.parse(datetime.timedelta(milliseconds=-1)),
                 topics=(b("OffsetCommitRequestTopic", name=TOPIC, partitions=(b(
                     "OffsetCommitRequestPartition", partition_index=i32(0), committed_offset=i64(0),
                     committed_leader_epoch=i32(-1), committed_metadata=""),)),))
    if api_key == P.OFFSET_FETCH:
        if version >= 8:  # several groups (KIP-709)
            return b("OffsetFetchRequest", groups=(b("OffsetFetchRequestGroup", group_id=group, topics=(b(
                "OffsetFetchRequestTopics", name=TOPIC, partition_indexes=(i32(0),)),)),))
        return b("OffsetFetchRequest", group_id=group, topics=(b("OffsetFetchRequestTopic", name=TOPIC,
                                                                 partition_indexes=(i32(0),)),))
    if api_key == P.LIST_GROUPS:
        return b("ListGroupsRequest")
    if api_key == P.DESCRIBE_GROUPS:
        return b("DescribeGroupsRequest", groups=(group,), include_authorized_operations=True)
    if api_key == P.DELETE_GROUPS:
        return b("DeleteGroupsRequest", groups_names=(f"absent-{group}",))
    if api_key == P.OFFSET_DELETE:
        return b("OffsetDeleteRequest", group_id=group, topics=(b("OffsetDeleteRequestTopic", name=TOPIC, partitions=(
            b("OffsetDeleteRequestPartition", partition_index=i32(0)),)),))
    if api_key == P.ADD_PARTITIONS_TO_TXN:
        return b("AddPartitionsToTxnRequest", v3_and_below_transactional_id=f"t-{tag}",
                 v3_and_below_producer_id=i64(1), v3_and_below_producer_epoch=i16(0), v3_and_below_topics=(b(
                     "AddPartitionsToTxnTopic", name=TOPIC, partitions=(i32(0),)),))
    if api_key == P.ADD_OFFSETS_TO_TXN:
        return b("AddOffsetsToTxnRequest", transactional_id=f"t-{tag}", producer_id=i64(1), producer_epoch=i16(0),
                 group_id=group)
    if api_key == P.END_TXN:
        return b("EndTxnRequest", transactional_id=f"t-{tag}", producer_id=i64(1), producer_epoch=i16(0),
                 committed=True)
    if api_key == P.TXN_OFFSET_COMMIT:
        return b("TxnOffsetCommitRequest", transactional_id=f"t-{tag}", group_id=group, producer_id=i64(1),
                 producer_epoch=i16(0), generation_id=i32(-1), member_id="", group_instance_id=None, topics=(b(
                     "TxnOffsetCommitRequestTopic", name=TOPIC, partitions=(b(
                         "TxnOffsetCommitRequestPartition", partition_index=i32(0), committed_offset=i64(0),
                         committed_leader_epoch=i32(-1), committed_metadata=""),)),))
    if api_key == P.WRITE_TXN_MARKERS:  # a producer that never wrote there: the marker is written, closes nothing
        return b("WriteTxnMarkersRequest", markers=(b(
            "WritableTxnMarker", producer_id=i64(7000 + version), producer_epoch=i16(0), transaction_result=False,
            topics=(b("WritableTxnMarkerTopic", name=TOPIC, partition_indexes=(i32(1),)),), coordinator_epoch=i32(0),
            transaction_version=i8(0)),))
    if api_key == P.CONSUMER_GROUP_HEARTBEAT:
        return b("ConsumerGroupHeartbeatRequest", group_id=group, member_id=f"m-{tag}", member_epoch=i32(0),
                 instance_id=None, rack_id=None, rebalance_timeout=ms(10_000), subscribed_topic_names=(TOPIC,),
                 server_assignor=None, topic_partitions=())
    if api_key == P.CONSUMER_GROUP_DESCRIBE:
        return b("ConsumerGroupDescribeRequest", group_ids=(group,), include_authorized_operations=True)
    if api_key == P.STREAMS_GROUP_HEARTBEAT:  # a topology of one subtopology reading the topic, no state
        return b("StreamsGroupHeartbeatRequest", group_id=group, member_id=f"m-{tag}", member_epoch=i32(0),
                 endpoint_information_epoch=i32(0), instance_id=None, rack_id=None, rebalance_timeout=ms(10_000),
                 topology=b("Topology", epoch=i32(0), subtopologies=(b(
                     "Subtopology", subtopology_id="0", source_topics=(TOPIC,), source_topic_regex=(),
                     state_changelog_topics=(), repartition_sink_topics=(), repartition_source_topics=(),
                     copartition_groups=()),)),
                 active_tasks=(), standby_tasks=(), warmup_tasks=(), process_id="p", user_endpoint=None,
                 client_tags=(), task_offsets=(), task_end_offsets=(), shutdown_application=False)
    if api_key == P.STREAMS_GROUP_DESCRIBE:
        return b("StreamsGroupDescribeRequest", group_ids=(group,), include_authorized_operations=True)
    if api_key == P.SHARE_GROUP_HEARTBEAT:
        return b("ShareGroupHeartbeatRequest", group_id=f"share-{group}", member_id=f"m-{tag}", member_epoch=i32(0),
                 rack_id=None, subscribed_topic_names=(TOPIC,))
    if api_key == P.SHARE_GROUP_DESCRIBE:
        return b("ShareGroupDescribeRequest", group_ids=(f"share-{group}",), include_authorized_operations=True)
    if api_key == P.SHARE_FETCH:  # a session opened on a topic id no topic has: UNKNOWN_TOPIC_ID, no wait
        return b("ShareFetchRequest", group_id=f"share-{group}", member_id=f"m-{tag}", share_session_epoch=i32(0),
                 max_wait=ms(0), min_bytes=i32(1), max_bytes=i32(1 << 20), max_records=i32(10), batch_size=i32(10),
                 topics=(b("FetchTopic", topic_id=uuid.UUID(int=7), partitions=(b(
                     "FetchPartition", partition_index=i32(0), acknowledgement_batches=()),)),),
                 forgotten_topics_data=())
    if api_key == P.SHARE_ACKNOWLEDGE:  # no share session: SHARE_SESSION_NOT_FOUND
        return b("ShareAcknowledgeRequest", group_id=f"share-{group}", member_id=f"m-{tag}",
                 share_session_epoch=i32(1), topics=())
    if api_key == P.DESCRIBE_SHARE_GROUP_OFFSETS:  # a share group the node does not know: GROUP_ID_NOT_FOUND
        return b("DescribeShareGroupOffsetsRequest", groups=(b(
            "DescribeShareGroupOffsetsRequestGroup", group_id=f"share-{group}", topics=None),))
    if api_key == P.ALTER_SHARE_GROUP_OFFSETS:  # a share group the node does not know: GROUP_ID_NOT_FOUND
        return b("AlterShareGroupOffsetsRequest", group_id=f"share-{group}", topics=(b(
            "AlterShareGroupOffsetsRequestTopic", topic_name=TOPIC, partitions=(b(
                "AlterShareGroupOffsetsRequestPartition", partition_index=i32(0), start_offset=i64(0)),)),))
    if api_key == P.DELETE_SHARE_GROUP_OFFSETS:
        return b("DeleteShareGroupOffsetsRequest", group_id=f"share-{group}", topics=(b(
            "DeleteShareGroupOffsetsRequestTopic", topic_name=TOPIC),))
    if api_key == P.SASL_HANDSHAKE:  # on a PLAINTEXT listener: answered ILLEGAL_SASL_STATE, as Kafka does
        return b("SaslHandshakeRequest", mechanism="PLAIN")
    if api_key == P.SASL_AUTHENTICATE:
        return b("SaslAuthenticateRequest", auth_bytes=b"\0user\0password")
    if api_key == P.DESCRIBE_CLUSTER:
        return b("DescribeClusterRequest", include_cluster_authorized_operations=True, include_fenced_brokers=True)
    if api_key == P.DESCRIBE_CLIENT_QUOTAS:
        return b("DescribeClientQuotasRequest", components=(), strict=False)
    if api_key == P.DESCRIBE_QUORUM:
        return b("DescribeQuorumRequest", topics=(b("TopicData", topic_name="__cluster_metadata", partitions=(
            b("PartitionData", partition_index=i32(0)),)),))
    if api_key == P.DESCRIBE_PRODUCERS:
        return b("DescribeProducersRequest", topics=(b("TopicRequest", name=TOPIC, partition_indexes=(i32(0),)),))
    if api_key == P.LIST_TRANSACTIONS:
        return b("ListTransactionsRequest", state_filters=("Ongoing",), producer_id_filters=(), transactional_id_pattern="tx-.*")
    if api_key == P.DESCRIBE_TRANSACTIONS:
        return b("DescribeTransactionsRequest", transactional_ids=(f"t-{tag}",))
    if api_key == P.CREATE_ACLS:
        return b("CreateAclsRequest", creations=(b(
            "AclCreation", resource_type=i8(2), resource_name=f"acl-{tag}", resource_pattern_type=i8(3),
            principal="User:versions", host="*", operation=i8(3), permission_type=i8(3)),))
    if api_key == P.DESCRIBE_ACLS:
        return b("DescribeAclsRequest", resource_type_filter=i8(1), resource_name_filter=None, pattern_type_filter=i8(1),
                 principal_filter=None, host_filter=None, operation=i8(1), permission_type=i8(1))
    if api_key == P.DELETE_ACLS:
        return b("DeleteAclsRequest", filters=(b(
            "DeleteAclsFilter", resource_type_filter=i8(2), resource_name_filter=f"absent-{tag}",
            pattern_type_filter=i8(3), principal_filter=None, host_filter=None, operation=i8(1),
            permission_type=i8(1)),))
    if api_key == P.DESCRIBE_USER_SCRAM_CREDENTIALS:
        return b("DescribeUserScramCredentialsRequest", users=(b("UserName", name=f"absent-{tag}"),))
    if api_key == P.ALTER_USER_SCRAM_CREDENTIALS:
        return b("AlterUserScramCredentialsRequest", upsertions=(), deletions=(b(
            "ScramCredentialDeletion", name=f"absent-{tag}", mechanism=i8(1)),))
    raise AssertionError(f"no request for api {api_key}: add one")


def decode_response(api_key: int, version: int, frame) -> object:
    """The response body after the correlation id (and header v1's tags), whole, by the node's schemas."""
    cls = P.response_class(api_key, version)
    at = 1 if cls.__header_schema__.__version__ == 1 else 0
    assert at == 0 or frame[0] == 0
    response, used = entity_reader(cls)(frame, at)
    assert used == len(frame) - at, (api_key, version)
    return response


def test_every_api_at_every_advertised_version_is_answered(node_factory) -> None:
    node = node_factory(workers=1, config="[groups]\ninitial_rebalance_delay_ms = 0\n")
    batch = R.make_batch(3, 20)
    with R.RawConnection("127.0.0.1", node.port, timeout_s=20) as conn:
        created = conn.call(19, 4, R.create_topics_body({TOPIC: 2}))
        assert created.topics[0].error_code == 0
        topic_ids = R.topic_ids("127.0.0.1", node.port, [TOPIC])
        for api_key, version in ALL_VERSIONS:
            if api_key == P.PRODUCE:
                body = R.produce_body({TOPIC: {0: batch}}, acks=1, version=version)
            elif api_key == P.FETCH:
                body = R.fetch_body({TOPIC: {0: 0}}, max_wait_ms=0, version=version, topic_ids=topic_ids)
            else:
                body = kio_bytes(request_for(api_key, version, f"{api_key}-{version}"))
            try:
                frame = conn.request(api_key, version, body)
            except R.RawProtocolError as exc:
                log = node.log_path.read_text(errors="replace")[-3000:]
                raise AssertionError(f"api {api_key} v{version}: {exc}\n{log}") from None
            if api_key == P.FETCH:
                result = R.parse_fetch_response(version, frame, {topic_ids[TOPIC].bytes: TOPIC})
                assert result.partitions[0].topic == TOPIC
                assert result.partitions[0].record_count >= 3, (api_key, version)
                continue
            response = decode_response(api_key, version, frame)
            if api_key == P.PRODUCE:
                assert response.responses[0].partition_responses[0].error_code == 0, version
            if api_key == P.FIND_COORDINATOR and version >= 4:
                assert [c.key for c in response.coordinators] == [f"g-10-{version}", f"g-10-{version}-b"]
                assert all(c.port == node.port for c in response.coordinators)
            if api_key == P.WRITE_TXN_MARKERS:
                assert [(m.producer_id, [[int(p.error_code) for p in t.partitions] for t in m.topics])
                        for m in response.markers] == [(7000 + version, [[0]])], version
            if api_key == P.SYNC_GROUP and version >= 5:
                assert response.error_code != 0  # nobody is no member


# --------------------------------------------------------------------------- codecs: unknown tagged fields

st.register_type_strategy(Records, st.binary(max_size=32))
st.register_type_strategy(i64Timedelta, st.integers(-(2**40), 2**40).map(
    lambda value: i64Timedelta.parse(datetime.timedelta(milliseconds=value))))
PROPERTY = settings(max_examples=15, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
UNKNOWN_TAG = 999  # no schema of Kafka 4 declares a tag this high


def kio_bytes(value: object) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(value))(buffer, value)
    return buffer.getvalue()


def unknown(extra: bytes) -> bytes:
    """A tagged-field section holding one field no schema declares: what a newer client may send."""
    return uvarint(1) + uvarint(UNKNOWN_TAG) + uvarint(len(extra)) + extra


def carries_top_level_tags(request: object) -> bool:
    """A known tagged field at the top level is written (a tagged struct may end in its own empty section)."""
    return any(f.metadata.get("tag") is not None and getattr(request, f.name) != f.default
               for f in dataclasses.fields(request))


def _append_top_level(body: bytes, extra: bytes) -> bytes:
    assert body[-1] == 0  # kio wrote no tags at the top level
    return body[:-1] + unknown(extra)


@pytest.mark.parametrize(("api_key", "version"), [(k, v) for k, v in FLEXIBLE if k != P.PRODUCE])
def test_unknown_tagged_fields_from_a_newer_client_are_skipped(api_key: int, version: int) -> None:
    cls = P._payload_class(P.request_schema(api_key, version), EntityType.request)

    @PROPERTY
    @given(st.from_type(cls), st.binary(max_size=8))
    def check(request: object, extra: bytes) -> None:
        body = kio_bytes(request)
        if not body.endswith(b"\x00") or carries_top_level_tags(request):
            return  # the request carries a known tag of its own at the top: covered by the round trip test
        newer = _append_top_level(body, extra)
        assert P.decode_request(api_key, version, memoryview(newer)) == request

    check()


def compact(raw: bytes) -> bytes:
    return uvarint(len(raw) + 1) + raw


@pytest.mark.parametrize("version", range(P.FIRST_FLEXIBLE[P.PRODUCE], P.SUPPORTED_APIS[P.PRODUCE][1] + 1))
def test_produce_skips_unknown_tags_at_every_depth(version: int) -> None:
    batch = R.make_batch(2, 10)
    tags = unknown(b"new")
    # transactional_id null, acks, timeout; one topic with a batch and a null record set; a section at each level
    body = (b"\x00" + (-1).to_bytes(2, "big", signed=True) + (500).to_bytes(4, "big") + uvarint(2)
            + compact(b"a") + uvarint(3)
            + (0).to_bytes(4, "big") + compact(batch) + tags
            + (1).to_bytes(4, "big") + b"\x00" + tags
            + tags + tags)
    request = P.decode_request(P.PRODUCE, version, memoryview(body))
    assert (request.transactional_id, request.acks, request.timeout_ms) == (None, -1, 500)
    assert [(t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partitions])
            for t in request.topics] == [("a", [(0, batch), (1, None)])]


def test_nested_unknown_tags_are_skipped_in_kio_decoded_requests() -> None:
    # Metadata v9: topics (a compact array of {name, tags}), allow_auto_topic_creation and the two
    # include_* booleans, then the request's tags; each section with an unknown field.
    tags = unknown(b"\x07\x07")
    body = uvarint(3) + compact(b"x") + tags + compact(b"y") + tags + b"\x01\x00\x01" + tags
    request = P.decode_request(P.METADATA, 9, memoryview(body))
    assert [t.name for t in request.topics] == ["x", "y"]
    assert (request.allow_auto_topic_creation, request.include_topic_authorized_operations) == (True, True)
    # Fetch v12 with a known tag (cluster_id, tag 0) beside an unknown one at the top level: the known one kept.
    plain = R.fetch_body({"t": {0: 5}}, version=12)
    assert plain.endswith(b"\x00")
    cluster = compact(b"cid")
    both = plain[:-1] + uvarint(2) + uvarint(0) + uvarint(len(cluster)) + cluster + uvarint(UNKNOWN_TAG) + b"\x01z"
    fetch = P.decode_request(P.FETCH, 12, memoryview(both))
    assert fetch.cluster_id == "cid"
    assert [(p.partition, p.fetch_offset) for p in fetch.topics[0].partitions] == [(0, 5)]


@pytest.mark.parametrize(("api_key", "version"), FLEXIBLE)
def test_request_header_v2_with_unknown_tags_parses(api_key: int, version: int) -> None:
    frame = R.encode_request(api_key, version, 77, b"")[4:]
    assert frame.endswith(b"\x00")  # header v2's empty tagged-field section
    newer = frame[:-1] + uvarint(1) + uvarint(UNKNOWN_TAG) + uvarint(2) + b"hi"
    header = P.parse_request_header(memoryview(newer))
    assert (header.api_key, header.api_version, header.correlation_id, header.flexible) == (api_key, version, 77, True)
    assert header.body_offset == len(newer)


def test_a_huge_compact_count_is_a_protocol_error_not_an_abort() -> None:
    # DeleteGroups v2: groups_names, a compact array of compact strings, claiming 2**35 names in a few bytes
    # (kio's reader would try to allocate them all and abort the process).
    body = uvarint(2**35) + b"\x00"
    with pytest.raises(P.ProtocolError):
        P.decode_request(P.DELETE_GROUPS, 2, memoryview(body))


def test_librdkafkas_all_topics_metadata_request_decodes() -> None:
    # librdkafka 2.x at Metadata v9+ for all topics: its 4-byte count slot left zero, then allow_auto_topic_creation
    # true, the two include flags false, no tags (the bytes confluent-kafka 2.16's list_topics() sends).
    request = P.decode_request(P.METADATA, 9, memoryview(bytes.fromhex("0000000001000000")))
    assert request.topics is None and request.allow_auto_topic_creation
    with pytest.raises(P.ProtocolError):
        P.decode_request(P.METADATA, 9, memoryview(bytes.fromhex("000000000100000000")))
