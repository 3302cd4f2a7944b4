"""Message schemas for old API versions that kio no longer ships.

kio is generated from current Kafka schemas, which dropped CreateTopics v0-1,
DeleteTopics v0, DescribeConfigs v0 and the ACL APIs' v0 (KIP-896). Clients we
serve may still send them (CreateTopics 0-4, DeleteTopics 0-3, DescribeConfigs
0-3 and Create/Describe/DeleteAcls 0-3 are advertised), so they are made here
in kio's own dataclass form and read/written by kio's one codec, exactly like
the generated versions. Where an old version is a newer one without the fields
Kafka added since (CreateTopics v0-1: v2 without validate_only, the per-topic
error_message and the throttle time; DeleteTopics v0: v1 without the throttle
time; the ACL APIs' v0: v1 without the pattern type, LITERAL, their JSON's
default for it), it is made from kio's classes of that version without them
(``_Older``); DescribeConfigs v0 (is_default where later versions have
config_source) is declared field by field from Kafka's JSON schema (``_Schema``).

Invariants:
- Each class carries kio's class attributes (``__type__``, ``__version__``,
  ``__flexible__``, ``__api_key__``, ``__header_schema__``), so kio's
  ``entity_reader``/``entity_writer`` treat it like a generated entity.
- ``legacy_schema(api_key, version)`` is a namespace holding the request and
  response classes with kio's names, so handlers build responses the same way
  for every version; made at its first use, once.
"""
# No "from __future__ import annotations": kio introspects real field types.

import dataclasses
import functools
import importlib
import typing
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Iterable

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32Timedelta

_DESCRIBE_CONFIGS = i16(32)
_KIO_CLASS_ATTRIBUTES = ("__type__", "__flexible__", "__api_key__", "__header_schema__")  # and __version__


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


class _Older:
    """An older version of an API as kio's oldest shipped one without the fields Kafka added since: every entity
    class of kio's request and response modules of version `newer` made again, as version `version`, with the
    fields named in `dropped` left out (in any class) and its nested entities made so too; the rest (field order,
    Kafka types, defaults, kio's class attributes but the version) is kio's."""

    def __init__(self, api: str, newer: int, version: int, dropped: Iterable[str]) -> None:
        self.modules = [f"kio.schema.{api}.v{newer}.{part}" for part in ("request", "response")]  # imported when made
        self.version = i16(version)
        self.dropped = frozenset(dropped)
        self.made: dict[type, type] = {}  # kio's class -> its older version

    def namespace(self) -> SimpleNamespace:
        """Every class by its name, and the two messages as `request` and `response` (as _Schema.namespace)."""
        classes: dict[str, type] = {}
        for module in map(importlib.import_module, self.modules):
            for value in vars(module).values():
                if isinstance(value, type) and hasattr(value, "__type__") and value.__module__ == module.__name__:
                    older = classes[value.__name__] = self._older(value)
                    if value.__type__ != EntityType.nested:
                        classes[value.__type__.name] = older
        return SimpleNamespace(**classes)

    def _older(self, cls: type) -> type:
        if cls not in self.made:
            fields = [(f.name, self._older_type(f.type), _same_field(f)) for f in dataclasses.fields(cls)
                      if f.name not in self.dropped]
            attributes = {name: getattr(cls, name) for name in _KIO_CLASS_ATTRIBUTES}
            attributes["__version__"] = self.version
            self.made[cls] = dataclasses.make_dataclass(cls.__name__, fields, namespace=attributes, frozen=True,
                                                        slots=True, kw_only=True)
        return self.made[cls]

    def _older_type(self, kind: Any) -> Any:
        """A field's type, with a nested entity (alone, or in a tuple of them) made older too."""
        if typing.get_origin(kind) is tuple:
            element, *rest = typing.get_args(kind)
            if rest == [Ellipsis] and hasattr(element, "__type__"):
                return tuple[self._older(element), ...]
        return self._older(kind) if hasattr(kind, "__type__") else kind


def _same_field(original: dataclasses.Field) -> dataclasses.Field:
    """A field declared as `original` is: its metadata (the Kafka type) and its default."""
    if original.default is not dataclasses.MISSING:
        return field(metadata=original.metadata, default=original.default)
    if original.default_factory is not dataclasses.MISSING:
        return field(metadata=original.metadata, default_factory=original.default_factory)
    return field(metadata=original.metadata)


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


# The ACL APIs' v0 is their v1 without the pattern type (LITERAL, v1's default for it).
_ACL_PATTERN_TYPES = frozenset({"pattern_type_filter", "pattern_type", "resource_pattern_type"})

# (api_key, version) -> how its schema is made: at the first request of that version, as kio's own modules are
# imported (a worker's start imports none).
_LEGACY_SCHEMAS: dict[tuple[int, int], Callable[[], SimpleNamespace]] = {
    (19, 0): _Older("create_topics", 2, 0, {"validate_only", "error_message", "throttle_time"}).namespace,
    (19, 1): _Older("create_topics", 2, 1, {"throttle_time"}).namespace,  # v1 added validate_only, error_message
    (20, 0): _Older("delete_topics", 1, 0, {"throttle_time"}).namespace,
    (32, 0): _describe_configs_v0,
    (29, 0): _Older("describe_acls", 1, 0, _ACL_PATTERN_TYPES).namespace,
    (30, 0): _Older("create_acls", 1, 0, _ACL_PATTERN_TYPES).namespace,
    (31, 0): _Older("delete_acls", 1, 0, _ACL_PATTERN_TYPES).namespace,
}


@functools.cache
def legacy_schema(api_key: int, version: int) -> SimpleNamespace | None:
    """The namespace of an old version kio no longer ships (None for any other), made once."""
    make = _LEGACY_SCHEMAS.get((api_key, version))
    return None if make is None else make()
