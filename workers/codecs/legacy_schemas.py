"""Message schemas for old API versions that kio no longer ships.

kio is generated from current Kafka schemas, which dropped CreateTopics v0-1,
DeleteTopics v0, DescribeConfigs v0 and the ACL APIs' v0 (KIP-896). Clients we
serve may still send them (CreateTopics 0-4, DeleteTopics 0-3, DescribeConfigs
0-3 and Create/Describe/DeleteAcls 0-3 are advertised), so they are made here
in kio's own dataclass form and read/written by kio's one codec, exactly like
the generated versions. Each is what Kafka's JSON schemas say it is: kio's
oldest shipped version without the fields Kafka added since (``_Older``):
CreateTopics v0-1 are v2 without validate_only, the per-topic error_message and
the throttle time (v1 has the first two); DeleteTopics v0 is v1 without the
throttle time; DescribeConfigs v0 is v1 without the synonyms, with is_default
where v1 has config_source; the ACL APIs' v0 is v1 without the pattern type
(LITERAL, their JSON's default for it).

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
from dataclasses import field
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Mapping

from kio.static.constants import EntityType
from kio.static.primitive import i16

_KIO_CLASS_ATTRIBUTES = ("__type__", "__flexible__", "__api_key__", "__header_schema__")  # and __version__


class _Older:
    """An older version of an API as kio's oldest shipped one without the fields Kafka added since: kio's request
    and response classes of version `newer`, and the nested ones they hold, made again as version `version` with
    the fields named in `dropped` left out (in any class) and those named in `swapped` (newer name -> older name,
    type, Kafka type) in the place of the field the older version had there; the rest (field order, Kafka types,
    defaults, kio's class attributes but the version) is kio's."""

    def __init__(self, api: str, newer: int, version: int, dropped: Iterable[str],
                 swapped: Mapping[str, tuple[str, type, str]] | None = None) -> None:
        self.modules = [f"kio.schema.{api}.v{newer}.{part}" for part in ("request", "response")]  # imported when made
        self.version = i16(version)
        self.dropped = frozenset(dropped)
        self.swapped = dict(swapped or {})
        self.made: dict[type, type] = {}  # kio's class -> its older version

    def namespace(self) -> SimpleNamespace:
        """Every class made, by its name, and the two messages as `request` and `response`."""
        messages = {}
        for module in map(importlib.import_module, self.modules):
            for value in vars(module).values():
                if isinstance(value, type) and getattr(value, "__type__", None) in (EntityType.request,
                                                                                     EntityType.response):
                    messages[value.__type__.name] = self._older(value)
        return SimpleNamespace(**{older.__name__: older for older in self.made.values()}, **messages)

    def _older(self, cls: type) -> type:
        if cls not in self.made:
            fields = [self._older_field(f) for f in dataclasses.fields(cls) if f.name not in self.dropped]
            attributes = {name: getattr(cls, name) for name in _KIO_CLASS_ATTRIBUTES}
            attributes["__version__"] = self.version
            self.made[cls] = dataclasses.make_dataclass(cls.__name__, fields, namespace=attributes, frozen=True,
                                                        slots=True, kw_only=True)
        return self.made[cls]

    def _older_field(self, newer: dataclasses.Field) -> tuple[str, Any, dataclasses.Field]:
        if newer.name in self.swapped:
            name, kind, kafka_type = self.swapped[newer.name]
            return name, kind, field(metadata={"kafka_type": kafka_type})
        return newer.name, self._older_type(newer.type), _same_field(newer)

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


# The ACL APIs' v0 is their v1 without the pattern type (LITERAL, v1's default for it).
_ACL_PATTERN_TYPES = frozenset({"pattern_type_filter", "pattern_type", "resource_pattern_type"})

# (api_key, version) -> how its schema is made: at the first request of that version, as kio's own modules are
# imported (a worker's start imports none).
_LEGACY_SCHEMAS: dict[tuple[int, int], Callable[[], SimpleNamespace]] = {
    (19, 0): _Older("create_topics", 2, 0, {"validate_only", "error_message", "throttle_time"}).namespace,
    (19, 1): _Older("create_topics", 2, 1, {"throttle_time"}).namespace,  # v1 added validate_only, error_message
    (20, 0): _Older("delete_topics", 1, 0, {"throttle_time"}).namespace,
    # DescribeConfigs v1 added the synonyms, and the config's source where v0 says whether it is a default.
    (32, 0): _Older("describe_configs", 1, 0, {"include_synonyms", "synonyms"},
                    {"config_source": ("is_default", bool, "bool")}).namespace,
    (29, 0): _Older("describe_acls", 1, 0, _ACL_PATTERN_TYPES).namespace,
    (30, 0): _Older("create_acls", 1, 0, _ACL_PATTERN_TYPES).namespace,
    (31, 0): _Older("delete_acls", 1, 0, _ACL_PATTERN_TYPES).namespace,
}


@functools.cache
def legacy_schema(api_key: int, version: int) -> SimpleNamespace | None:
    """The namespace of an old version kio no longer ships (None for any other), made once."""
    make = _LEGACY_SCHEMAS.get((api_key, version))
    return None if make is None else make()
