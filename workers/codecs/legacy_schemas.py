"""Message schemas for old API versions that kio no longer ships, declared as data.

kio is generated from current Kafka schemas, which dropped CreateTopics v0-1,
DeleteTopics v0 and DescribeConfigs v0 (KIP-896). Clients we serve may still
send them (CreateTopics 0-4, DeleteTopics 0-3 and DescribeConfigs 0-3 are
advertised), so they are declared here in kio's own dataclass form and
read/written by kio's one codec, exactly like the generated versions. Field
lists are Kafka's CreateTopicsRequest.json, CreateTopicsResponse.json,
DeleteTopicsRequest.json, DeleteTopicsResponse.json, DescribeConfigsRequest.json
and DescribeConfigsResponse.json at those versions.

Invariants:
- Each class carries kio's class attributes (``__type__``, ``__version__``,
  ``__flexible__``, ``__api_key__``, ``__header_schema__``) so kio's
  ``entity_reader``/``entity_writer`` treat it like a generated entity.
- ``LEGACY_SCHEMAS`` maps (api_key, version) to a namespace holding the
  request and response classes with kio's names, so handlers build responses
  the same way for every version.
"""

# No "from __future__ import annotations": kio introspects real field types.

import datetime
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.schema.types import BrokerId, TopicName
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i32Timedelta

_CREATE_TOPICS = i16(19)
_DELETE_TOPICS = i16(20)
_DESCRIBE_CONFIGS = i16(32)
_DEFAULT_TIMEOUT = i32Timedelta.parse(datetime.timedelta(milliseconds=60000))


def _create_topics(version: int) -> SimpleNamespace:
    """CreateTopics v0 (and v1, which adds validate_only and error_message)."""
    v = i16(version)

    @dataclass(frozen=True, slots=True, kw_only=True)
    class CreatableReplicaAssignment:
        __type__: ClassVar = EntityType.nested
        __version__: ClassVar[i16] = v
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = _CREATE_TOPICS
        __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
        partition_index: i32 = field(metadata={"kafka_type": "int32"})
        broker_ids: tuple[BrokerId, ...] = field(metadata={"kafka_type": "int32"}, default=())

    @dataclass(frozen=True, slots=True, kw_only=True)
    class CreatableTopicConfig:
        __type__: ClassVar = EntityType.nested
        __version__: ClassVar[i16] = v
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = _CREATE_TOPICS
        __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
        name: str = field(metadata={"kafka_type": "string"})
        value: str | None = field(metadata={"kafka_type": "string"})

    @dataclass(frozen=True, slots=True, kw_only=True)
    class CreatableTopic:
        __type__: ClassVar = EntityType.nested
        __version__: ClassVar[i16] = v
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = _CREATE_TOPICS
        __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
        name: TopicName = field(metadata={"kafka_type": "string"})
        num_partitions: i32 = field(metadata={"kafka_type": "int32"})
        replication_factor: i16 = field(metadata={"kafka_type": "int16"})
        assignments: tuple[CreatableReplicaAssignment, ...]
        configs: tuple[CreatableTopicConfig, ...]

    if version == 0:

        @dataclass(frozen=True, slots=True, kw_only=True)
        class CreateTopicsRequest:
            __type__: ClassVar = EntityType.request
            __version__: ClassVar[i16] = v
            __flexible__: ClassVar[bool] = False
            __api_key__: ClassVar[i16] = _CREATE_TOPICS
            __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
            topics: tuple[CreatableTopic, ...]
            timeout: i32Timedelta = field(
                metadata={"kafka_type": "timedelta_i32"}, default=_DEFAULT_TIMEOUT
            )

        @dataclass(frozen=True, slots=True, kw_only=True)
        class CreatableTopicResult:
            __type__: ClassVar = EntityType.nested
            __version__: ClassVar[i16] = v
            __flexible__: ClassVar[bool] = False
            __api_key__: ClassVar[i16] = _CREATE_TOPICS
            __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
            name: TopicName = field(metadata={"kafka_type": "string"})
            error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})

    else:

        @dataclass(frozen=True, slots=True, kw_only=True)
        class CreateTopicsRequest:  # type: ignore[no-redef]
            __type__: ClassVar = EntityType.request
            __version__: ClassVar[i16] = v
            __flexible__: ClassVar[bool] = False
            __api_key__: ClassVar[i16] = _CREATE_TOPICS
            __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
            topics: tuple[CreatableTopic, ...]
            timeout: i32Timedelta = field(
                metadata={"kafka_type": "timedelta_i32"}, default=_DEFAULT_TIMEOUT
            )
            validate_only: bool = field(metadata={"kafka_type": "bool"}, default=False)

        @dataclass(frozen=True, slots=True, kw_only=True)
        class CreatableTopicResult:  # type: ignore[no-redef]
            __type__: ClassVar = EntityType.nested
            __version__: ClassVar[i16] = v
            __flexible__: ClassVar[bool] = False
            __api_key__: ClassVar[i16] = _CREATE_TOPICS
            __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
            name: TopicName = field(metadata={"kafka_type": "string"})
            error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
            error_message: str | None = field(metadata={"kafka_type": "string"}, default=None)

    @dataclass(frozen=True, slots=True, kw_only=True)
    class CreateTopicsResponse:
        __type__: ClassVar = EntityType.response
        __version__: ClassVar[i16] = v
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = _CREATE_TOPICS
        __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
        topics: tuple[CreatableTopicResult, ...]

    return SimpleNamespace(
        CreatableReplicaAssignment=CreatableReplicaAssignment,
        CreatableTopicConfig=CreatableTopicConfig,
        CreatableTopic=CreatableTopic,
        CreateTopicsRequest=CreateTopicsRequest,
        CreatableTopicResult=CreatableTopicResult,
        CreateTopicsResponse=CreateTopicsResponse,
        request=CreateTopicsRequest,
        response=CreateTopicsResponse,
    )


def _delete_topics_v0() -> SimpleNamespace:
    v = i16(0)

    @dataclass(frozen=True, slots=True, kw_only=True)
    class DeleteTopicsRequest:
        __type__: ClassVar = EntityType.request
        __version__: ClassVar[i16] = v
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = _DELETE_TOPICS
        __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
        topic_names: tuple[TopicName, ...] = field(metadata={"kafka_type": "string"}, default=())
        timeout: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})

    @dataclass(frozen=True, slots=True, kw_only=True)
    class DeletableTopicResult:
        __type__: ClassVar = EntityType.nested
        __version__: ClassVar[i16] = v
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = _DELETE_TOPICS
        __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
        name: TopicName = field(metadata={"kafka_type": "string"})
        error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})

    @dataclass(frozen=True, slots=True, kw_only=True)
    class DeleteTopicsResponse:
        __type__: ClassVar = EntityType.response
        __version__: ClassVar[i16] = v
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = _DELETE_TOPICS
        __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
        responses: tuple[DeletableTopicResult, ...]

    return SimpleNamespace(
        DeleteTopicsRequest=DeleteTopicsRequest,
        DeletableTopicResult=DeletableTopicResult,
        DeleteTopicsResponse=DeleteTopicsResponse,
        request=DeleteTopicsRequest,
        response=DeleteTopicsResponse,
    )


def _describe_configs_v0() -> SimpleNamespace:
    """DescribeConfigs v0: no synonyms; is_default where later versions have config_source."""
    v = i16(0)

    @dataclass(frozen=True, slots=True, kw_only=True)
    class DescribeConfigsResource:
        __type__: ClassVar = EntityType.nested
        __version__: ClassVar[i16] = v
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = _DESCRIBE_CONFIGS
        __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
        resource_type: i8 = field(metadata={"kafka_type": "int8"})
        resource_name: str = field(metadata={"kafka_type": "string"})
        configuration_keys: tuple[str, ...] | None = field(metadata={"kafka_type": "string"}, default=())

    @dataclass(frozen=True, slots=True, kw_only=True)
    class DescribeConfigsRequest:
        __type__: ClassVar = EntityType.request
        __version__: ClassVar[i16] = v
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = _DESCRIBE_CONFIGS
        __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
        resources: tuple[DescribeConfigsResource, ...]

    @dataclass(frozen=True, slots=True, kw_only=True)
    class DescribeConfigsResourceResult:
        __type__: ClassVar = EntityType.nested
        __version__: ClassVar[i16] = v
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = _DESCRIBE_CONFIGS
        __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
        name: str = field(metadata={"kafka_type": "string"})
        value: str | None = field(metadata={"kafka_type": "string"})
        read_only: bool = field(metadata={"kafka_type": "bool"})
        is_default: bool = field(metadata={"kafka_type": "bool"})
        is_sensitive: bool = field(metadata={"kafka_type": "bool"})

    @dataclass(frozen=True, slots=True, kw_only=True)
    class DescribeConfigsResult:
        __type__: ClassVar = EntityType.nested
        __version__: ClassVar[i16] = v
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = _DESCRIBE_CONFIGS
        __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
        error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
        error_message: str | None = field(metadata={"kafka_type": "string"})
        resource_type: i8 = field(metadata={"kafka_type": "int8"})
        resource_name: str = field(metadata={"kafka_type": "string"})
        configs: tuple[DescribeConfigsResourceResult, ...]

    @dataclass(frozen=True, slots=True, kw_only=True)
    class DescribeConfigsResponse:
        __type__: ClassVar = EntityType.response
        __version__: ClassVar[i16] = v
        __flexible__: ClassVar[bool] = False
        __api_key__: ClassVar[i16] = _DESCRIBE_CONFIGS
        __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
        throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
        results: tuple[DescribeConfigsResult, ...]

    return SimpleNamespace(
        DescribeConfigsResource=DescribeConfigsResource,
        DescribeConfigsRequest=DescribeConfigsRequest,
        DescribeConfigsResourceResult=DescribeConfigsResourceResult,
        DescribeConfigsResult=DescribeConfigsResult,
        DescribeConfigsResponse=DescribeConfigsResponse,
        request=DescribeConfigsRequest,
        response=DescribeConfigsResponse,
    )


LEGACY_SCHEMAS: dict[tuple[int, int], SimpleNamespace] = {
    (19, 0): _create_topics(0),
    (19, 1): _create_topics(1),
    (20, 0): _delete_topics_v0(),
    (32, 0): _describe_configs_v0(),
}
