"""Group configs (KIP-848, KIP-932): per-group overrides of the consumer group protocol's session timeout and
heartbeat interval and of a share group's record lock duration, start offset and isolation level, Kafka's GROUP
config resource (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs).

Two layers make a group's settings, as in Kafka: the node's TOML file (`[groups] consumer_session_timeout_ms`,
`consumer_heartbeat_interval_ms`: Kafka's `group.consumer.*` broker configs, with Kafka's defaults), then the
group's own overrides in the catalog (`consumer.session.timeout.ms`, `consumer.heartbeat.interval.ms`,
`share.record.lock.duration.ms`, `share.auto.offset.reset`, `share.isolation.level`). Overrides name a group id,
not a group: they may be set before the group exists and stay when it is deleted. `share.auto.offset.reset` takes
`latest` and `earliest` (Kafka's `by_duration:` is refused), `share.isolation.level` `read_uncommitted` and
`read_committed`.

Invariants: stored overrides are canonical, and were valid when stored: within the node's bounds
(`consumer_min_*` and `consumer_max_*`, Kafka's `group.consumer.min/max.*`) and with the session timeout above
the heartbeat interval once stacked on the node's defaults (a later change of the TOML file does not re-check
them, as in Kafka); `effective()` never raises on stored overrides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kio.schema.errors import ErrorCode

from shmbroker.node.storage.topic_config import (SOURCE_DEFAULT, SOURCE_STATIC_BROKER, DescribedConfig, TopicConfigDef,
                                                 TopicConfigError, at_least, one_of)

SOURCE_GROUP = 8  # Kafka's ConfigSource.GROUP_CONFIG

SESSION_TIMEOUT = "consumer.session.timeout.ms"
HEARTBEAT_INTERVAL = "consumer.heartbeat.interval.ms"
SHARE_LOCK_DURATION = "share.record.lock.duration.ms"
SHARE_AUTO_OFFSET_RESET = "share.auto.offset.reset"
SHARE_ISOLATION_LEVEL = "share.isolation.level"


@dataclass(frozen=True)
class GroupSetting:
    definition: TopicConfigDef  # name, type, broker synonym and documentation; `field` is GroupConfig's
    low: str | None  # the GroupConfig fields that bound it (None: a text setting, checked by its definition)
    high: str | None


SETTINGS: tuple[GroupSetting, ...] = (
    GroupSetting(TopicConfigDef(
        SESSION_TIMEOUT, "INT", "group.consumer.session.timeout.ms", "consumer_session_timeout_ms", "45000",
        "How long a consumer-protocol member may go without a heartbeat before it is fenced and its partitions "
        "move.", at_least(1)), "consumer_min_session_timeout_ms", "consumer_max_session_timeout_ms"),
    GroupSetting(TopicConfigDef(
        HEARTBEAT_INTERVAL, "INT", "group.consumer.heartbeat.interval.ms", "consumer_heartbeat_interval_ms",
        "5000", "The heartbeat interval the coordinator gives the members of a consumer-protocol group.",
        at_least(1)), "consumer_min_heartbeat_interval_ms", "consumer_max_heartbeat_interval_ms"),
    GroupSetting(TopicConfigDef(
        SHARE_LOCK_DURATION, "INT", "group.share.record.lock.duration.ms", "share_record_lock_duration_ms", "30000",
        "How long a share group's acquired records stay locked to the consumer that acquired them.", at_least(1)),
        "share_min_record_lock_duration_ms", "share_max_record_lock_duration_ms"),
    GroupSetting(TopicConfigDef(
        SHARE_AUTO_OFFSET_RESET, "STRING", None, "share_auto_offset_reset", "latest",
        "Where a share group's share-partition starts when it has no state: latest or earliest.",
        one_of("latest", "earliest")), None, None),
    GroupSetting(TopicConfigDef(
        SHARE_ISOLATION_LEVEL, "STRING", None, "share_isolation_level", "read_uncommitted",
        "What a share group reads: read_uncommitted, or read_committed (records of committed transactions only).",
        one_of("read_uncommitted", "read_committed")), None, None),
)
BY_NAME: dict[str, TopicConfigDef] = {s.definition.name: s.definition for s in SETTINGS}


class NodeGroupSettings(Protocol):
    """The node's own group settings and their bounds (node.config.GroupConfig, which this layer cannot import)."""

    consumer_session_timeout_ms: int
    consumer_heartbeat_interval_ms: int
    consumer_min_session_timeout_ms: int
    consumer_max_session_timeout_ms: int
    consumer_min_heartbeat_interval_ms: int
    consumer_max_heartbeat_interval_ms: int
    share_record_lock_duration_ms: int
    share_min_record_lock_duration_ms: int
    share_max_record_lock_duration_ms: int
    share_auto_offset_reset: str
    share_isolation_level: str


@dataclass(frozen=True)
class GroupSettings:
    session_timeout_ms: int
    heartbeat_interval_ms: int


@dataclass(frozen=True)
class ShareSettings:
    record_lock_duration_ms: int
    auto_offset_reset: str  # latest, earliest
    isolation_level: str  # read_uncommitted, read_committed


def check_overrides(config: NodeGroupSettings, values: dict[str, str | None]) -> dict[str, str]:
    """Validate a group's overrides against the node's bounds; returns their canonical texts. Raises
    TopicConfigError: INVALID_CONFIG for an unknown key or a value out of bounds, INVALID_REQUEST for a null
    value (as Kafka)."""
    canonical = {}
    for key, text in values.items():
        definition = BY_NAME.get(key)
        if definition is None:
            raise TopicConfigError(f"Unknown group config name: {key}")
        if text is None:
            raise TopicConfigError(f"Null value not supported for configuration {key}", ErrorCode.invalid_request)
        canonical[key] = definition.canonical(text)
    for setting in SETTINGS:
        name = setting.definition.name
        if name in canonical and setting.low is not None:
            value = int(canonical[name])
            low, high = getattr(config, setting.low), getattr(config, setting.high)
            if value < low:
                raise TopicConfigError(f"{name} must be greater than or equal to group.{_kafka_name(setting.low)}")
            if value > high:
                raise TopicConfigError(f"{name} must be less than or equal to group.{_kafka_name(setting.high)}")
    settings = effective(config, canonical)
    if settings.session_timeout_ms <= settings.heartbeat_interval_ms:
        raise TopicConfigError(f"{SESSION_TIMEOUT} must be greater than {HEARTBEAT_INTERVAL}")
    return canonical


def _kafka_name(field: str) -> str:
    """consumer_min_session_timeout_ms -> consumer.min.session.timeout.ms"""
    return field.replace("_", ".")


def effective(config: NodeGroupSettings, overrides: dict[str, str] | None) -> GroupSettings:
    """A group's settings: its overrides on the node's defaults."""
    overrides = overrides or {}
    return GroupSettings(int(overrides.get(SESSION_TIMEOUT, config.consumer_session_timeout_ms)),
                         int(overrides.get(HEARTBEAT_INTERVAL, config.consumer_heartbeat_interval_ms)))


def share_settings(config: NodeGroupSettings, overrides: dict[str, str] | None) -> ShareSettings:
    """A share group's settings: its overrides on the node's defaults."""
    overrides = overrides or {}
    return ShareSettings(int(overrides.get(SHARE_LOCK_DURATION, config.share_record_lock_duration_ms)),
                         overrides.get(SHARE_AUTO_OFFSET_RESET, config.share_auto_offset_reset),
                         overrides.get(SHARE_ISOLATION_LEVEL, config.share_isolation_level))


def describe_group(config: NodeGroupSettings, overrides: dict[str, str] | None) -> list[DescribedConfig]:
    """Every group config of a group id, as Kafka's DescribeConfigs reports it: the override (GROUP_CONFIG)
    first, then the node's setting by its broker name (static when the TOML file sets it, else default)."""
    overrides = overrides or {}
    described = []
    for setting in SETTINGS:
        definition = setting.definition
        node_value = getattr(config, definition.field)
        node_source = SOURCE_DEFAULT if str(node_value) == definition.default else SOURCE_STATIC_BROKER
        synonyms = [(definition.broker or definition.name, str(node_value), node_source)]
        if definition.name in overrides:
            synonyms.insert(0, (definition.name, overrides[definition.name], SOURCE_GROUP))
        described.append(DescribedConfig.of(definition.name, synonyms, definition))
    return described

