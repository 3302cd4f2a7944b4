"""Topic configs: every per-topic setting of Kafka 3.7, what this node does with each, and the one place that
parses, checks and applies them (catalog overrides -> a partition's LogConfig).

Three layers make a partition's settings, as in Kafka: the node's TOML file (`[log]`, static broker config),
then the node-wide dynamic overrides in the catalog (AlterConfigs on the broker resource: Kafka's dynamic
broker configs, by their broker names such as `log.retention.ms`), then the topic's own overrides (by the
topic names such as `retention.ms`). `effective()` stacks them into the LogConfig the partition's log uses.

What the node does with a setting (`TopicConfigDef.field`):
- applied: it sets a LogConfig field, which the log honours (retention, segments, message size, timestamp
  type and bounds, compression, flush policy, index settings);
- accepted, no effect (`field` None): the setting only matters for a feature this node's topics cannot have,
  so Kafka's behaviour in the same situation is to ignore it too: replication throttles and unclean leader
  election (one replica), down-conversion
  (no old fetch versions are served), the deprecated message.format.version (ignored by Kafka 3.x),
  local retention (only with tiered storage, which is never enabled), preallocate (a hint). Their
  documentation says so in DescribeConfigs.
- refused values: min.insync.replicas other than 1, remote.storage.enable true: INVALID_CONFIG with a message,
  as any bad value. Unknown keys are INVALID_CONFIG too.

Invariants: stored overrides are always valid and canonical (what `check_overrides` returns); `effective()`
never raises on stored overrides; a value's canonical text is what DescribeConfigs reports.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from kio.schema.errors import ErrorCode

from shmbroker.node.storage.log import COMPRESSION_TYPES, LONG_MAX, TIMESTAMP_TYPES, LogConfig

INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
LONG_MIN = -(2**63)
MIN_SEGMENT_BYTES = 14  # Kafka's floor (the smallest legacy record)

# DescribeConfigs config sources (Kafka's ConfigSource) and types (ConfigType).
SOURCE_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
TYPE_CODES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "SHORT": 4, "LONG": 5, "DOUBLE": 6, "LIST": 7, "CLASS": 8,
              "PASSWORD": 9}


class TopicConfigError(Exception):
    """A config the node refuses: `code` is Kafka's error code (INVALID_CONFIG, INVALID_REQUEST)."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.invalid_config) -> None:
        super().__init__(message)
        self.code = int(code)


Check = Callable[[Any], "str | None"]  # a parsed value -> why it is refused, or None


def at_least(low: int | float) -> Check:
    return lambda value: None if value >= low else f"must be at least {low}"


def between(low: int | float, high: int | float) -> Check:
    return lambda value: None if low <= value <= high else f"must be between {low} and {high}"


def one_of(*allowed: str) -> Check:
    return lambda value: None if value in allowed else f"must be one of {', '.join(allowed)}"


def anything(value: Any) -> None:
    return None


@dataclass(frozen=True)
class TopicConfigDef:
    name: str  # Kafka's topic config name
    type: str  # Kafka's config type: LONG, INT, DOUBLE, BOOLEAN, STRING, LIST
    broker: str | None  # the node-wide synonym (Kafka's broker config), alterable on the broker resource
    field: str | None  # the LogConfig field it sets; None: accepted, no effect on this node
    default: str | None  # Kafka's default (None: null; for a setting with a field, the node's comes from LogConfig)
    doc: str
    check: Check = anything

    def parse(self, text: str) -> Any:
        """The value of `text` (raises TopicConfigError if it is not of the type or the check refuses it)."""
        try:
            value = _PARSERS[self.type](text)
        except (ValueError, TypeError):
            raise TopicConfigError(f"Invalid value {text} for configuration {self.name}: "
                                   f"not a valid {self.type.lower()}") from None
        problem = self.check(value)
        if problem:
            raise TopicConfigError(f"Invalid value {text} for configuration {self.name}: {problem}")
        return value

    def canonical(self, text: str) -> str:
        return render(self.parse(text))


def _parse_int(text: str, low: int, high: int) -> int:
    value = int(text.strip())
    if not low <= value <= high:
        raise ValueError(text)
    return value


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(text)
    return lowered == "true"


def _parse_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


_PARSERS: dict[str, Callable[[str], Any]] = {
    "LONG": lambda text: _parse_int(text, LONG_MIN, LONG_MAX),
    "INT": lambda text: _parse_int(text, INT_MIN, INT_MAX),
    "DOUBLE": lambda text: float(text.strip()),
    "BOOLEAN": _parse_bool,
    "STRING": lambda text: text.strip(),
    "LIST": _parse_list,
}


def render(value: Any) -> str:
    """A value as Kafka writes it in DescribeConfigs."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def _cleanup_policy(value: tuple[str, ...]) -> str | None:
    unknown = [item for item in value if item not in ("delete", "compact")]
    if unknown:
        return f"must be a list of delete and compact, not {','.join(unknown)}"
    if not value:
        return "must name a policy (delete, compact or both)"
    return None


def _policy_text(value: tuple[str, ...]) -> str:
    """A cleanup.policy as LogConfig holds it: its policies once each, compact first (Kafka's order)."""
    return ",".join(policy for policy in ("compact", "delete") if policy in value)

_ONE_REPLICA = " No effect on this node: it holds one replica of each partition."

DEFINITIONS: tuple[TopicConfigDef, ...] = (
    TopicConfigDef("cleanup.policy", "LIST", "log.cleanup.policy", "cleanup_policy", "delete",
                   "What happens to old log segments: delete (time and size retention), compact (the log cleaner "
                   "keeps the latest record of each key), or compact,delete (both).", _cleanup_policy),
    TopicConfigDef("compression.type", "STRING", "compression.type", "compression_type", "producer",
                   "The codec of the batches the log stores: producer keeps the producer's; uncompressed, gzip, "
                   "snappy, lz4 or zstd recompress every batch on append.", one_of(*COMPRESSION_TYPES)),
    TopicConfigDef("delete.retention.ms", "LONG", "log.cleaner.delete.retention.ms", "delete_retention_ms",
                   "86400000", "How long a tombstone (a record with a null value) stays in a compacted topic: it "
                   "goes once the newest record of its segment is older than this.", at_least(0)),
    TopicConfigDef("file.delete.delay.ms", "LONG", "log.segment.delete.delay.ms", None, "60000",
                   "How long a deleted segment's files stay before they go. No effect on this node: files go at "
                   "once, readers keep their open descriptors for log.retired_segment_close_delay_s.", at_least(0)),
    TopicConfigDef("flush.messages", "LONG", "log.flush.interval.messages", "flush_messages", str(LONG_MAX),
                   "An fsync of the partition is started once this many appended records wait for one.",
                   at_least(1)),
    TopicConfigDef("flush.ms", "LONG", "log.flush.interval.ms", "flush_ms", str(LONG_MAX),
                   "Appends to the topic are fsync'd at least this often (the node's flush.flush_interval_ms "
                   "bounds it too).", at_least(0)),
    TopicConfigDef("follower.replication.throttled.replicas", "LIST", None, None, "",
                   "Replicas whose follower replication is throttled." + _ONE_REPLICA),
    TopicConfigDef("index.interval.bytes", "INT", "log.index.interval.bytes", "index_interval_bytes", "4096",
                   "How many bytes of batches come between two entries of the offset index.", at_least(0)),
    TopicConfigDef("leader.replication.throttled.replicas", "LIST", None, None, "",
                   "Replicas whose leader replication is throttled." + _ONE_REPLICA),
    TopicConfigDef("local.retention.bytes", "LONG", "log.local.retention.bytes", None, "-2",
                   "Local retention with tiered storage. No effect on this node: it has no tiered storage.",
                   at_least(-2)),
    TopicConfigDef("local.retention.ms", "LONG", "log.local.retention.ms", None, "-2",
                   "Local retention with tiered storage. No effect on this node: it has no tiered storage.",
                   at_least(-2)),
    TopicConfigDef("max.compaction.lag.ms", "LONG", "log.cleaner.max.compaction.lag.ms", "max_compaction_lag_ms",
                   str(LONG_MAX), "The longest a record stays uncompacted: a log whose oldest uncleaned record is "
                   "older is cleaned whatever its dirty ratio.", at_least(1)),
    TopicConfigDef("max.message.bytes", "INT", "message.max.bytes", "max_message_bytes", "1048588",
                   "The largest record batch the topic accepts.", at_least(1)),
    TopicConfigDef("message.downconversion.enable", "BOOLEAN", "log.message.downconversion.enable", None, "true",
                   "Whether old fetch versions get down-converted batches. No effect on this node: it serves only "
                   "fetch versions of the current batch format."),
    TopicConfigDef("message.format.version", "STRING", "log.message.format.version", None, "3.0-IV1",
                   "Deprecated; ignored as by Kafka 3.x (every batch is of the current format)."),
    TopicConfigDef("message.timestamp.after.max.ms", "LONG", "log.message.timestamp.after.max.ms",
                   "message_timestamp_after_max_ms", "3600000",
                   "How far in the future of the node's clock a CreateTime timestamp may be (INVALID_TIMESTAMP "
                   "beyond).", at_least(0)),
    TopicConfigDef("message.timestamp.before.max.ms", "LONG", "log.message.timestamp.before.max.ms",
                   "message_timestamp_before_max_ms", str(LONG_MAX),
                   "How far in the past of the node's clock a CreateTime timestamp may be (INVALID_TIMESTAMP "
                   "beyond).", at_least(0)),
    TopicConfigDef("message.timestamp.difference.max.ms", "LONG", "log.message.timestamp.difference.max.ms",
                   "message_timestamp_difference_max_ms", str(LONG_MAX),
                   "Deprecated: bounds both directions at once (the smaller of it and the before/after bounds "
                   "applies).", at_least(0)),
    TopicConfigDef("message.timestamp.type", "STRING", "log.message.timestamp.type", "message_timestamp_type",
                   "CreateTime", "CreateTime keeps the producer's timestamps; LogAppendTime writes the node's "
                   "clock into every batch on append.", one_of(*TIMESTAMP_TYPES)),
    TopicConfigDef("min.cleanable.dirty.ratio", "DOUBLE", "log.cleaner.min.cleanable.ratio",
                   "min_cleanable_dirty_ratio", "0.5", "The share of a compacted log not yet cleaned (its dirty "
                   "bytes over all its cleanable bytes) at which the cleaner takes it.", between(0, 1)),
    TopicConfigDef("min.compaction.lag.ms", "LONG", "log.cleaner.min.compaction.lag.ms", "min_compaction_lag_ms",
                   "0", "The least a record stays uncompacted: segments with newer records are not cleaned.",
                   at_least(0)),
    TopicConfigDef("min.insync.replicas", "INT", "min.insync.replicas", "min_insync_replicas", "1",
                   "Replicas that must have an acks=all batch: 1, the one this node holds.", between(1, 1)),
    TopicConfigDef("preallocate", "BOOLEAN", "log.preallocate", None, "false",
                   "Preallocate segment files. A hint; no effect on this node (index files are always "
                   "preallocated, sparse)."),
    TopicConfigDef("remote.storage.enable", "BOOLEAN", None, None, "false",
                   "Tiered storage: only false, this node has none.",
                   lambda value: "tiered storage is not supported by this node" if value else None),
    TopicConfigDef("retention.bytes", "LONG", "log.retention.bytes", "retention_bytes", "-1",
                   "The most bytes a partition keeps before its oldest segments are deleted; -1: no limit."),
    TopicConfigDef("retention.ms", "LONG", "log.retention.ms", "retention_ms", "604800000",
                   "How long a segment is kept after its newest record; -1: forever.", at_least(-1)),
    TopicConfigDef("segment.bytes", "INT", "log.segment.bytes", "segment_bytes", "1073741824",
                   "The size at which a partition's active segment is rolled.", at_least(MIN_SEGMENT_BYTES)),
    TopicConfigDef("segment.index.bytes", "INT", "log.index.size.max.bytes", "index_max_bytes", "10485760",
                   "The size of a segment's offset index (its time index is twice as large).", at_least(64)),
    TopicConfigDef("segment.jitter.ms", "LONG", "log.roll.jitter.ms", "segment_jitter_ms", "0",
                   "A segment's age roll comes up to this much earlier (a fixed draw per segment).", at_least(0)),
    TopicConfigDef("segment.ms", "LONG", "log.roll.ms", "segment_ms", "604800000",
                   "The age of its first append at which a partition's active segment is rolled.", at_least(1)),
    TopicConfigDef("unclean.leader.election.enable", "BOOLEAN", "unclean.leader.election.enable", None, "false",
                   "Whether an out-of-sync replica may become leader." + _ONE_REPLICA),
)
_NO_KERBEROS = " Kept and described as Kafka's per-broker setting; no effect: the node offers no GSSAPI."
# Kafka's per-broker SASL/Kerberos settings, alterable on the broker resource (Kafka takes them whether or not
# a listener uses GSSAPI, and so does the node; admin tools and librdkafka's own tests set them).
NODE_ONLY_DEFINITIONS: tuple[TopicConfigDef, ...] = tuple(
    TopicConfigDef(name, kind, name, None, default, doc + _NO_KERBEROS, check)
    for name, kind, default, doc, check in (
        ("sasl.kerberos.kinit.cmd", "STRING", "/usr/bin/kinit", "Kerberos kinit command path.", anything),
        ("sasl.kerberos.min.time.before.relogin", "LONG", "60000",
         "Login thread sleep time between refresh attempts.", at_least(0)),
        ("sasl.kerberos.principal.to.local.rules", "LIST", "DEFAULT",
         "Rules that map a principal name to a short name.", anything),
        ("sasl.kerberos.service.name", "STRING", None, "The Kerberos principal name the broker runs as.", anything),
        ("sasl.kerberos.ticket.renew.jitter", "DOUBLE", "0.05", "Random jitter added to the renewal time.",
         between(0, 1)),
        ("sasl.kerberos.ticket.renew.window.factor", "DOUBLE", "0.8",
         "Share of a ticket's lifetime after which the login thread renews it.", between(0, 1)),
    ))
BY_NAME: dict[str, TopicConfigDef] = {d.name: d for d in DEFINITIONS}
# Every node-wide name is alterable, as Kafka's dynamic broker defaults: one with no effect on this node is
# accepted and kept, as at the topic level.
BY_BROKER_NAME: dict[str, TopicConfigDef] = {**{d.broker: d for d in DEFINITIONS if d.broker},
                                             **{d.broker: d for d in NODE_ONLY_DEFINITIONS}}


def check_overrides(values: dict[str, str | None], broker: bool = False,
                    null_code: ErrorCode = ErrorCode.invalid_request) -> dict[str, str]:
    """Validate overrides (topic names, or with `broker` the node-wide names of the applied settings); returns
    their canonical texts. Raises TopicConfigError: INVALID_CONFIG for an unknown key or a bad value,
    `null_code` for a null value (as Kafka: INVALID_REQUEST in AlterConfigs, INVALID_CONFIG in CreateTopics)."""
    table = BY_BROKER_NAME if broker else BY_NAME
    canonical = {}
    for key, text in values.items():
        definition = table.get(key)
        if definition is None:
            if broker:
                raise TopicConfigError(f"Cannot update {key} at run time: the node-wide settings that can change "
                                       "are the topic defaults (log.retention.ms, log.segment.bytes, ...)")
            raise TopicConfigError(f"Unknown topic config name: {key}")
        if text is None:
            raise TopicConfigError(f"Null value not supported for configuration {key}", null_code)
        canonical[key] = definition.canonical(text)
    return canonical


def _apply(config: LogConfig, values: dict[str, str], table: dict[str, TopicConfigDef]) -> LogConfig:
    changes = {}
    for key, text in values.items():
        definition = table.get(key)
        if definition is not None and definition.field is not None:
            value = definition.parse(text)
            if definition.name == "cleanup.policy":
                value = _policy_text(value)
            changes[definition.field] = render(value) if definition.type == "LIST" else value
    if not changes:
        return config
    try:
        return dataclasses.replace(config, **changes)
    except ValueError as exc:  # a LogConfig check the per-key checks do not cover
        raise TopicConfigError(str(exc)) from None


def node_defaults(static: LogConfig, broker_overrides: dict[str, str]) -> LogConfig:
    """The node-wide settings: the TOML file's, with the dynamic broker overrides on top."""
    return _apply(static, broker_overrides, BY_BROKER_NAME)


def effective(static: LogConfig, broker_overrides: dict[str, str], topic_overrides: dict[str, str]) -> LogConfig:
    """The LogConfig of a topic's partitions."""
    return _apply(node_defaults(static, broker_overrides), topic_overrides, BY_NAME)


def validate_topic(static: LogConfig, broker_overrides: dict[str, str], values: dict[str, str | None],
                   null_code: ErrorCode = ErrorCode.invalid_request) -> dict[str, str]:
    """check_overrides, then the combination (a LogConfig it would make) too; returns the canonical overrides."""
    canonical = check_overrides(values, null_code=null_code)
    effective(static, broker_overrides, canonical)
    return canonical


@dataclass(frozen=True)
class DescribedConfig:
    name: str
    value: str | None
    source: int  # SOURCE_*
    synonyms: tuple[tuple[str, str, int], ...]  # (name, value, source), most specific first
    type: str
    doc: str
    read_only: bool = False

    @property
    def is_default(self) -> bool:
        return self.source == SOURCE_DEFAULT

    @classmethod
    def of(cls, name: str, synonyms: list[tuple[str, str, int]], definition: "TopicConfigDef",
           read_only: bool = False) -> "DescribedConfig":
        """`name` as its most specific synonym (the first) gives it."""
        _, value, source = synonyms[0]
        return cls(name, value, source, tuple(synonyms), definition.type, definition.doc, read_only)


def _node_value(definition: TopicConfigDef, config: LogConfig) -> str:
    return render(getattr(config, definition.field)) if definition.field else definition.default


def _broker_synonyms(definition: TopicConfigDef, static: LogConfig,
                     broker_overrides: dict[str, str]) -> list[tuple[str, str, int]]:
    """The node-wide synonyms of a setting, most specific first (Kafka lists those that have a value)."""
    if definition.broker is None:
        return []
    synonyms = []
    if definition.broker in broker_overrides:
        synonyms.append((definition.broker, broker_overrides[definition.broker], SOURCE_DYNAMIC_DEFAULT_BROKER))
    value = _node_value(definition, static)
    untouched = definition.field is None or getattr(static, definition.field) == getattr(LogConfig(), definition.field)
    synonyms.append((definition.broker, value, SOURCE_DEFAULT if untouched else SOURCE_STATIC_BROKER))
    return synonyms


def describe_topic(static: LogConfig, broker_overrides: dict[str, str],
                   topic_overrides: dict[str, str]) -> list[DescribedConfig]:
    """Every topic config of a topic, as Kafka's DescribeConfigs reports it: value, source, synonyms."""
    described = []
    for definition in DEFINITIONS:
        synonyms = _broker_synonyms(definition, static, broker_overrides)
        if definition.name in topic_overrides:
            synonyms.insert(0, (definition.name, topic_overrides[definition.name], SOURCE_TOPIC))
        if not synonyms:
            synonyms = [(definition.name, definition.default, SOURCE_DEFAULT)]
        described.append(DescribedConfig.of(definition.name, synonyms, definition))
    return described


def describe_node(static: LogConfig, broker_overrides: dict[str, str]) -> list[DescribedConfig]:
    """The node-wide (broker) names of the topic settings, with their sources: dynamic, static or default."""
    described = []
    for definition in DEFINITIONS:
        if definition.broker is None:
            continue
        synonyms = _broker_synonyms(definition, static, broker_overrides)
        described.append(DescribedConfig.of(definition.broker, synonyms, definition))
    for definition in NODE_ONLY_DEFINITIONS:
        synonyms = [(definition.broker, definition.default, SOURCE_DEFAULT)]
        if definition.broker in broker_overrides:
            synonyms.insert(0, (definition.broker, broker_overrides[definition.broker], SOURCE_DYNAMIC_DEFAULT_BROKER))
        described.append(DescribedConfig.of(definition.broker, synonyms, definition))
    return described
