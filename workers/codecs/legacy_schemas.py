"""Message schemas for old API versions that kio no longer ships, declared as data.

kio is generated from current Kafka schemas, which dropped CreateTopics v0-1,
DeleteTopics v0, DescribeConfigs v0 and the ACL APIs' v0 (KIP-896). Clients we
serve may still send them (CreateTopics 0-4, DeleteTopics 0-3, DescribeConfigs
0-3 and Create/Describe/DeleteAcls 0-3 are advertised), so they are declared
here in kio's own dataclass form and read/written by kio's one codec, exactly
like the generated versions. Field lists are Kafka's request and response JSON
schemas of those APIs at those versions (the ACL APIs' v0 is v1 without the
pattern type: LITERAL, their JSON's default for it).

Invariants:
- Each class carries kio's class attributes (``__type__``, ``__version__``,
  ``__flexible__``, ``__api_key__``, ``__header_schema__``), set by its
  schema's decorator (``_Schema``), so kio's ``entity_reader``/``entity_writer``
  treat it like a generated entity.
- ``LEGACY_SCHEMAS`` maps (api_key, version) to a namespace holding the
  request and response classes with kio's names, so handlers build responses
  the same way for every version.
"""

# No "from __future__ import annotations": kio introspects real field types.

import datetime
from dataclasses import dataclass, field
from types import SimpleNamespace

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.schema.types import BrokerId, TopicName
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i32Timedelta

_CREATE_TOPICS = i16(19)
_DELETE_TOPICS = i16(20)
_DESCRIBE_CONFIGS = i16(32)
_DESCRIBE_ACLS = i16(29)
_CREATE_ACLS = i16(30)
_DELETE_ACLS = i16(31)
_DEFAULT_TIMEOUT = i32Timedelta.parse(datetime.timedelta(milliseconds=60000))


class _Schema:
    """One API version's schema: its decorators make a class one of kio's frozen entity dataclasses of that API
    and version, with kio's class attributes set here; `request` and `response` for the top-level messages,
    `request_part` and `response_part` for the structures nested in them. `namespace()` holds what was declared."""

    def __init__(self, api_key: i16, version: int) -> None:
        self.api_key = api_key
        self.version = i16(version)
        self.classes: dict[str, type] = {}

    def _entity(self, cls: type, kind: EntityType, header: type) -> type:
        cls.__type__ = kind
        cls.__version__ = self.version
        cls.__flexible__ = False
        cls.__api_key__ = self.api_key
        cls.__header_schema__ = header
        entity = dataclass(frozen=True, slots=True, kw_only=True)(cls)
        self.classes[cls.__name__] = entity
        if kind != EntityType.nested:
            self.classes[kind.name] = entity  # `request` and `response`
        return entity

    def namespace(self) -> SimpleNamespace:
        """Every class declared, by its name, and the two messages as `request` and `response`."""
        return SimpleNamespace(**self.classes)

    def request(self, cls: type) -> type:
        return self._entity(cls, EntityType.request, RequestHeader)

    def response(self, cls: type) -> type:
        return self._entity(cls, EntityType.response, ResponseHeader)

    def request_part(self, cls: type) -> type:
        return self._entity(cls, EntityType.nested, RequestHeader)

    def response_part(self, cls: type) -> type:
        return self._entity(cls, EntityType.nested, ResponseHeader)


def _create_topics(version: int) -> SimpleNamespace:
    """CreateTopics v0 (and v1, which adds validate_only and error_message)."""
    schema = _Schema(_CREATE_TOPICS, version)

    @schema.request_part
    class CreatableReplicaAssignment:
        partition_index: i32 = field(metadata={"kafka_type": "int32"})
        broker_ids: tuple[BrokerId, ...] = field(metadata={"kafka_type": "int32"}, default=())

    @schema.request_part
    class CreatableTopicConfig:
        name: str = field(metadata={"kafka_type": "string"})
        value: str | None = field(metadata={"kafka_type": "string"})

    @schema.request_part
    class CreatableTopic:
        name: TopicName = field(metadata={"kafka_type": "string"})
        num_partitions: i32 = field(metadata={"kafka_type": "int32"})
        replication_factor: i16 = field(metadata={"kafka_type": "int16"})
        assignments: tuple[CreatableReplicaAssignment, ...]
        configs: tuple[CreatableTopicConfig, ...]

    if version == 0:

        @schema.request
        class CreateTopicsRequest:
            topics: tuple[CreatableTopic, ...]
            timeout: i32Timedelta = field(
                metadata={"kafka_type": "timedelta_i32"}, default=_DEFAULT_TIMEOUT
            )

        @schema.response_part
        class CreatableTopicResult:
            name: TopicName = field(metadata={"kafka_type": "string"})
            error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})

    else:

        @schema.request
        class CreateTopicsRequest:  # type: ignore[no-redef]
            topics: tuple[CreatableTopic, ...]
            timeout: i32Timedelta = field(
                metadata={"kafka_type": "timedelta_i32"}, default=_DEFAULT_TIMEOUT
            )
            validate_only: bool = field(metadata={"kafka_type": "bool"}, default=False)

        @schema.response_part
        class CreatableTopicResult:  # type: ignore[no-redef]
            name: TopicName = field(metadata={"kafka_type": "string"})
            error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
            error_message: str | None = field(metadata={"kafka_type": "string"}, default=None)

    @schema.response
    class CreateTopicsResponse:
        topics: tuple[CreatableTopicResult, ...]

    return schema.namespace()


def _delete_topics_v0() -> SimpleNamespace:
    schema = _Schema(_DELETE_TOPICS, 0)

    @schema.request
    class DeleteTopicsRequest:
        topic_names: tuple[TopicName, ...] = field(metadata={"kafka_type": "string"}, default=())
        timeout: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})

    @schema.response_part
    class DeletableTopicResult:
        name: TopicName = field(metadata={"kafka_type": "string"})
        error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})

    @schema.response
    class DeleteTopicsResponse:
        responses: tuple[DeletableTopicResult, ...]

    return schema.namespace()


def _describe_configs_v0() -> SimpleNamespace:
    """DescribeConfigs v0: no synonyms; is_default where later versions have config_source."""
    schema = _Schema(_DESCRIBE_CONFIGS, 0)

    @schema.request_part
    class DescribeConfigsResource:
        resource_type: i8 = field(metadata={"kafka_type": "int8"})
        resource_name: str = field(metadata={"kafka_type": "string"})
        configuration_keys: tuple[str, ...] | None = field(metadata={"kafka_type": "string"}, default=())

    @schema.request
    class DescribeConfigsRequest:
        resources: tuple[DescribeConfigsResource, ...]

    @schema.response_part
    class DescribeConfigsResourceResult:
        name: str = field(metadata={"kafka_type": "string"})
        value: str | None = field(metadata={"kafka_type": "string"})
        read_only: bool = field(metadata={"kafka_type": "bool"})
        is_default: bool = field(metadata={"kafka_type": "bool"})
        is_sensitive: bool = field(metadata={"kafka_type": "bool"})

    @schema.response_part
    class DescribeConfigsResult:
        error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
        error_message: str | None = field(metadata={"kafka_type": "string"})
        resource_type: i8 = field(metadata={"kafka_type": "int8"})
        resource_name: str = field(metadata={"kafka_type": "string"})
        configs: tuple[DescribeConfigsResourceResult, ...]

    @schema.response
    class DescribeConfigsResponse:
        throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
        results: tuple[DescribeConfigsResult, ...]

    return schema.namespace()


def _describe_acls_v0() -> SimpleNamespace:
    schema = _Schema(_DESCRIBE_ACLS, 0)

    @schema.request
    class DescribeAclsRequest:
        resource_type_filter: i8 = field(metadata={"kafka_type": "int8"})
        resource_name_filter: str | None = field(metadata={"kafka_type": "string"})
        principal_filter: str | None = field(metadata={"kafka_type": "string"})
        host_filter: str | None = field(metadata={"kafka_type": "string"})
        operation: i8 = field(metadata={"kafka_type": "int8"})
        permission_type: i8 = field(metadata={"kafka_type": "int8"})

    @schema.response_part
    class AclDescription:
        principal: str = field(metadata={"kafka_type": "string"})
        host: str = field(metadata={"kafka_type": "string"})
        operation: i8 = field(metadata={"kafka_type": "int8"})
        permission_type: i8 = field(metadata={"kafka_type": "int8"})

    @schema.response_part
    class DescribeAclsResource:
        resource_type: i8 = field(metadata={"kafka_type": "int8"})
        resource_name: str = field(metadata={"kafka_type": "string"})
        acls: tuple[AclDescription, ...]

    @schema.response
    class DescribeAclsResponse:
        throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
        error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
        error_message: str | None = field(metadata={"kafka_type": "string"})
        resources: tuple[DescribeAclsResource, ...]

    return schema.namespace()


def _create_acls_v0() -> SimpleNamespace:
    schema = _Schema(_CREATE_ACLS, 0)

    @schema.request_part
    class AclCreation:
        resource_type: i8 = field(metadata={"kafka_type": "int8"})
        resource_name: str = field(metadata={"kafka_type": "string"})
        principal: str = field(metadata={"kafka_type": "string"})
        host: str = field(metadata={"kafka_type": "string"})
        operation: i8 = field(metadata={"kafka_type": "int8"})
        permission_type: i8 = field(metadata={"kafka_type": "int8"})

    @schema.request
    class CreateAclsRequest:
        creations: tuple[AclCreation, ...]

    @schema.response_part
    class AclCreationResult:
        error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
        error_message: str | None = field(metadata={"kafka_type": "string"})

    @schema.response
    class CreateAclsResponse:
        throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
        results: tuple[AclCreationResult, ...]

    return schema.namespace()


def _delete_acls_v0() -> SimpleNamespace:
    schema = _Schema(_DELETE_ACLS, 0)

    @schema.request_part
    class DeleteAclsFilter:
        resource_type_filter: i8 = field(metadata={"kafka_type": "int8"})
        resource_name_filter: str | None = field(metadata={"kafka_type": "string"})
        principal_filter: str | None = field(metadata={"kafka_type": "string"})
        host_filter: str | None = field(metadata={"kafka_type": "string"})
        operation: i8 = field(metadata={"kafka_type": "int8"})
        permission_type: i8 = field(metadata={"kafka_type": "int8"})

    @schema.request
    class DeleteAclsRequest:
        filters: tuple[DeleteAclsFilter, ...]

    @schema.response_part
    class DeleteAclsMatchingAcl:
        error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
        error_message: str | None = field(metadata={"kafka_type": "string"})
        resource_type: i8 = field(metadata={"kafka_type": "int8"})
        resource_name: str = field(metadata={"kafka_type": "string"})
        principal: str = field(metadata={"kafka_type": "string"})
        host: str = field(metadata={"kafka_type": "string"})
        operation: i8 = field(metadata={"kafka_type": "int8"})
        permission_type: i8 = field(metadata={"kafka_type": "int8"})

    @schema.response_part
    class DeleteAclsFilterResult:
        error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
        error_message: str | None = field(metadata={"kafka_type": "string"})
        matching_acls: tuple[DeleteAclsMatchingAcl, ...]

    @schema.response
    class DeleteAclsResponse:
        throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
        filter_results: tuple[DeleteAclsFilterResult, ...]

    return schema.namespace()


LEGACY_SCHEMAS: dict[tuple[int, int], SimpleNamespace] = {
    (19, 0): _create_topics(0),
    (19, 1): _create_topics(1),
    (20, 0): _delete_topics_v0(),
    (32, 0): _describe_configs_v0(),
    (29, 0): _describe_acls_v0(),
    (30, 0): _create_acls_v0(),
    (31, 0): _delete_acls_v0(),
}
