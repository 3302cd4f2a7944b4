"""Group configs (KIP-848, KIP-1071, KIP-932): per-group overrides of the consumer, streams and share group
protocols' session timeout and heartbeat interval, of a streams group's standby replicas and initial rebalance
delay, and of a share group's record lock duration, delivery-count limit, in-flight records per share-partition,
start offset and isolation level: Kafka's GROUP config resource (DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs).

Two layers make a group's settings, as in Kafka: the node's TOML file (`[groups] consumer_session_timeout_ms`,
`consumer_heartbeat_interval_ms`, `streams_session_timeout_ms`, `streams_heartbeat_interval_ms`,
`streams_num_standby_replicas`, `streams_initial_rebalance_delay_ms`: Kafka's `group.consumer.*` and
`group.streams.*` broker configs, with Kafka's defaults), then the group's own overrides in the catalog
(`consumer.session.timeout.ms`, `consumer.heartbeat.interval.ms`, `streams.session.timeout.ms`,
`streams.heartbeat.interval.ms`, `streams.num.standby.replicas`, `streams.initial.rebalance.delay.ms`).
Overrides name a group id, not a group: they may be set before the group exists and stay when it is deleted; the
coordinators read them at each heartbeat, so a change applies from the group's next heartbeat on. A share group's
`share.session.timeout.ms` and `share.heartbeat.interval.ms` (within `share_min/max_*`, as the consumer ones) apply
at its members' next heartbeats; `share.record.lock.duration.ms` (within `share_min/max_record_lock_duration_ms`),
`share.delivery.count.limit` (within `share_min/max_delivery_count_limit`), `share.partition.max.record.locks`
(within `share_min/max_partition_max_record_locks`), `share.auto.offset.reset` (`latest`, `earliest`; Kafka's
`by_duration:` is refused) and `share.isolation.level` (`read_uncommitted`, `read_committed`) apply to its next
acquisition and acknowledgement. Kafka 4.4's other share group configs (`share.renew.acknowledge.enable`,
`share.assignment.interval.ms`, `share.assignor.offload.enable`, the dead-letter queue's `errors.deadletterqueue.*`)
are refused, and so are its other `streams.*` group configs (warm-up replicas, rack-aware tags, the assignor's
name, the recovery lag and task offset interval, ...), which the node does not take per group
(docs/compatibility.md).

Invariants: stored overrides are canonical, and were valid when stored: within the node's bounds
(`consumer_min_*`/`consumer_max_*`, `streams_min_*`/`streams_max_*` and `share_min_*`/`share_max_*`, Kafka's
`group.consumer.min/max.*`, `group.streams.min/max.*` and `group.share.min/max.*`) and with each protocol's session
timeout above its heartbeat interval once stacked on the node's defaults (a later change of the TOML file does not
re-check them, as in Kafka); `effective()`, `effective_streams()` and `share_settings()` never raise on stored
overrides.
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
STREAMS_SESSION_TIMEOUT = "streams.session.timeout.ms"
STREAMS_HEARTBEAT_INTERVAL = "streams.heartbeat.interval.ms"
STREAMS_STANDBY_REPLICAS = "streams.num.standby.replicas"
STREAMS_INITIAL_DELAY = "streams.initial.rebalance.delay.ms"
SHARE_SESSION_TIMEOUT = "share.session.timeout.ms"
SHARE_HEARTBEAT_INTERVAL = "share.heartbeat.interval.ms"
SHARE_LOCK_DURATION = "share.record.lock.duration.ms"
SHARE_DELIVERY_COUNT_LIMIT = "share.delivery.count.limit"
SHARE_PARTITION_MAX_RECORD_LOCKS = "share.partition.max.record.locks"
SHARE_AUTO_OFFSET_RESET = "share.auto.offset.reset"
SHARE_ISOLATION_LEVEL = "share.isolation.level"


@dataclass(frozen=True)
class GroupSetting:
    definition: TopicConfigDef  # name, type, broker synonym and documentation; `field` is GroupConfig's
    low: str | None  # the GroupConfig fields that bound it (None: only the definition's own check)
    high: str | None
    # How a value out of bounds is told: Kafka 4.4 words the consumer settings' bounds one by one
    # ("... must be greater than or equal to group.consumer.min...") and the streams and share settings' as a range.
    as_range: bool = False

    def out_of_bounds(self, value: int, low: int | None, high: int) -> str | None:
        name = self.definition.name
        if self.as_range and low is not None and not low <= value <= high:
            return f"{name} must be in the range {low} to {high} inclusive."
        if low is not None and value < low:
            return f"{name} must be greater than or equal to group.{_kafka_name(self.low)}"
        if high is not None and value > high:
            return f"{name} must be less than or equal to " + (str(high) if self.as_range
                                                              else f"group.{_kafka_name(self.high)}")
        return None


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
        STREAMS_SESSION_TIMEOUT, "INT", "group.streams.session.timeout.ms", "streams_session_timeout_ms", "45000",
        "How long a streams-protocol member may go without a heartbeat before it is fenced and its tasks move.",
        at_least(1)), "streams_min_session_timeout_ms", "streams_max_session_timeout_ms", as_range=True),
    GroupSetting(TopicConfigDef(
        STREAMS_HEARTBEAT_INTERVAL, "INT", "group.streams.heartbeat.interval.ms", "streams_heartbeat_interval_ms",
        "5000", "The heartbeat interval the coordinator gives the members of a streams-protocol group.",
        at_least(1)), "streams_min_heartbeat_interval_ms", "streams_max_heartbeat_interval_ms", as_range=True),
    GroupSetting(TopicConfigDef(
        STREAMS_STANDBY_REPLICAS, "INT", "group.streams.num.standby.replicas", "streams_num_standby_replicas", "0",
        "How many standby replicas of each stateful task the streams group's assignor places, each on another "
        "process than the task's active one (fewer while the group has too few processes).", at_least(0)),
        None, "streams_max_standby_replicas", as_range=True),
    GroupSetting(TopicConfigDef(
        STREAMS_INITIAL_DELAY, "INT", "group.streams.initial.rebalance.delay.ms",
        "streams_initial_rebalance_delay_ms", "3000", "How long a member joining the empty streams group waits "
        "for others before the tasks are assigned (ASSIGNMENT_DELAYED meanwhile).", at_least(0)), None, None),
    GroupSetting(TopicConfigDef(
        SHARE_SESSION_TIMEOUT, "INT", "group.share.session.timeout.ms", "share_session_timeout_ms", "45000",
        "How long a share group member may go without a heartbeat before it is removed and the records it holds "
        "are released.", at_least(1)), "share_min_session_timeout_ms", "share_max_session_timeout_ms",
        as_range=True),
    GroupSetting(TopicConfigDef(
        SHARE_HEARTBEAT_INTERVAL, "INT", "group.share.heartbeat.interval.ms", "share_heartbeat_interval_ms", "5000",
        "The heartbeat interval the coordinator gives the members of a share group.", at_least(1)),
        "share_min_heartbeat_interval_ms", "share_max_heartbeat_interval_ms", as_range=True),
    GroupSetting(TopicConfigDef(
        SHARE_LOCK_DURATION, "INT", "group.share.record.lock.duration.ms", "share_record_lock_duration_ms", "30000",
        "How long a share group's acquired records stay locked to the consumer that acquired them.",
        at_least(1000)), "share_min_record_lock_duration_ms", "share_max_record_lock_duration_ms", as_range=True),
    GroupSetting(TopicConfigDef(
        SHARE_DELIVERY_COUNT_LIMIT, "INT", "group.share.delivery.count.limit", "share_delivery_count_limit", "5",
        "How many times a share group delivers a record at most: a record released or expired at this count is "
        "archived.", at_least(2)), "share_min_delivery_count_limit", "share_max_delivery_count_limit",
        as_range=True),
    GroupSetting(TopicConfigDef(
        SHARE_PARTITION_MAX_RECORD_LOCKS, "INT", "group.share.partition.max.record.locks",
        "share_partition_max_record_locks", "2000", "How many records of a share-partition may be in flight "
        "(acquired, or waiting to be again) at once.", at_least(100)), "share_min_partition_max_record_locks",
        "share_max_partition_max_record_locks", as_range=True),
    GroupSetting(TopicConfigDef(
        SHARE_AUTO_OFFSET_RESET, "STRING", None, "share_auto_offset_reset", "latest",
        "Where a share group's share-partition starts when it has no state: latest or earliest.",
        one_of("latest", "earliest")), None, None),
    GroupSetting(TopicConfigDef(
        SHARE_ISOLATION_LEVEL, "STRING", None, "share_isolation_level", "read_uncommitted",
        "What a share group reads: read_uncommitted, or read_committed (records of committed transactions only).",
        one_of("read_uncommitted", "read_committed")), None, None),
)
TEXT_SETTINGS = frozenset((SHARE_AUTO_OFFSET_RESET, SHARE_ISOLATION_LEVEL))  # not numbers: no bounds
# The pairs whose session timeout must stay above their heartbeat interval.
SESSION_ABOVE_HEARTBEAT = ((SESSION_TIMEOUT, HEARTBEAT_INTERVAL), (STREAMS_SESSION_TIMEOUT, STREAMS_HEARTBEAT_INTERVAL),
                           (SHARE_SESSION_TIMEOUT, SHARE_HEARTBEAT_INTERVAL))
BY_NAME: dict[str, TopicConfigDef] = {s.definition.name: s.definition for s in SETTINGS}


class NodeGroupSettings(Protocol):
    """The node's own group settings and their bounds (node.config.GroupConfig, which this layer cannot import)."""

    consumer_session_timeout_ms: int
    consumer_heartbeat_interval_ms: int
    consumer_min_session_timeout_ms: int
    consumer_max_session_timeout_ms: int
    consumer_min_heartbeat_interval_ms: int
    consumer_max_heartbeat_interval_ms: int
    streams_session_timeout_ms: int
    streams_heartbeat_interval_ms: int
    streams_num_standby_replicas: int
    streams_min_session_timeout_ms: int
    streams_max_session_timeout_ms: int
    streams_min_heartbeat_interval_ms: int
    streams_max_heartbeat_interval_ms: int
    streams_max_standby_replicas: int
    streams_initial_rebalance_delay_ms: int
    share_session_timeout_ms: int
    share_heartbeat_interval_ms: int
    share_min_session_timeout_ms: int
    share_max_session_timeout_ms: int
    share_min_heartbeat_interval_ms: int
    share_max_heartbeat_interval_ms: int
    share_record_lock_duration_ms: int
    share_min_record_lock_duration_ms: int
    share_max_record_lock_duration_ms: int
    share_delivery_count_limit: int
    share_min_delivery_count_limit: int
    share_max_delivery_count_limit: int
    share_partition_max_record_locks: int
    share_min_partition_max_record_locks: int
    share_max_partition_max_record_locks: int
    share_auto_offset_reset: str
    share_isolation_level: str


@dataclass(frozen=True)
class GroupSettings:
    session_timeout_ms: int
    heartbeat_interval_ms: int


@dataclass(frozen=True)
class StreamsSettings:
    session_timeout_ms: int
    heartbeat_interval_ms: int
    num_standby_replicas: int
    initial_rebalance_delay_ms: int


@dataclass(frozen=True)
class ShareSettings:
    session_timeout_ms: int
    heartbeat_interval_ms: int
    record_lock_duration_ms: int
    delivery_count_limit: int
    partition_max_record_locks: int
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
        if name in canonical and name not in TEXT_SETTINGS:
            low = getattr(config, setting.low) if setting.low is not None else None
            high = getattr(config, setting.high) if setting.high is not None else None
            problem = setting.out_of_bounds(int(canonical[name]), low, high)
            if problem is not None:
                raise TopicConfigError(problem)
    for session, heartbeat in SESSION_ABOVE_HEARTBEAT:
        if _value(config, canonical, session) <= _value(config, canonical, heartbeat):
            raise TopicConfigError(f"{session} must be greater than {heartbeat}")
    return canonical


def _value(config: NodeGroupSettings, overrides: dict[str, str], name: str) -> int:
    """A setting's value: the group's override, else the node's."""
    return int(overrides[name]) if name in overrides else getattr(config, BY_NAME[name].field)


def _kafka_name(field: str) -> str:
    """consumer_min_session_timeout_ms -> consumer.min.session.timeout.ms"""
    return field.replace("_", ".")


def effective(config: NodeGroupSettings, overrides: dict[str, str] | None) -> GroupSettings:
    """A group's settings: its overrides on the node's defaults."""
    overrides = overrides or {}
    return GroupSettings(int(overrides.get(SESSION_TIMEOUT, config.consumer_session_timeout_ms)),
                         int(overrides.get(HEARTBEAT_INTERVAL, config.consumer_heartbeat_interval_ms)))


def effective_streams(config: NodeGroupSettings, overrides: dict[str, str] | None) -> StreamsSettings:
    """A streams group's settings: its overrides on the node's defaults."""
    overrides = overrides or {}
    return StreamsSettings(*(_value(config, overrides, name) for name in (
        STREAMS_SESSION_TIMEOUT, STREAMS_HEARTBEAT_INTERVAL, STREAMS_STANDBY_REPLICAS, STREAMS_INITIAL_DELAY)))


def share_settings(config: NodeGroupSettings, overrides: dict[str, str] | None) -> ShareSettings:
    """A share group's settings: its overrides on the node's defaults."""
    overrides = overrides or {}
    return ShareSettings(*(_value(config, overrides, name) for name in (
        SHARE_SESSION_TIMEOUT, SHARE_HEARTBEAT_INTERVAL, SHARE_LOCK_DURATION, SHARE_DELIVERY_COUNT_LIMIT,
        SHARE_PARTITION_MAX_RECORD_LOCKS)), overrides.get(SHARE_AUTO_OFFSET_RESET, config.share_auto_offset_reset),
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

