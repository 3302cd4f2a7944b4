"""Options of the shmbroker data source: the names, meanings and defaults of Spark's Kafka source and
sink, checked in full before anything runs.

``SourceOptions.parse`` and ``SinkOptions.parse`` take the options Spark passes (keys compared without
case, as Spark does) and return frozen, picklable dataclasses, or raise ``OptionError`` whose message
names the option at fault. They never contact the node: offsets are resolved when the query is planned.

Invariants:
- An option the connector does not know fails; so does a Kafka client option (``kafka.*``) it does not
  honour, with Spark's own advice where Spark has one (e.g. ``kafka.auto.offset.reset``: use
  startingOffsets). Nothing is silently ignored except what Spark's Kafka source ignores too: the
  options listed in ``ACCEPTED_AND_IGNORED`` with the reason, and the streaming-only ones
  (maxOffsetsPerTrigger, minOffsetsPerTrigger, maxTriggerDelay) in a batch query.
- Exactly one of subscribe, subscribePattern, assign; at most one way of giving the starting offsets
  and at most one of giving the ending offsets (Spark lets one silently take precedence; here a
  conflict is an error naming both options).
- Offsets given as JSON use Spark's layout: {"topic": {"partition": offset}} with -2 for earliest and
  -1 for latest; assign uses {"topic": [partitions]}.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from pyspark_shmbroker import dependencies  # noqa: F401  (first: without them, an error saying what to do)
from shmbroker.clients.wire import ISOLATION_LEVELS, TopicPartition, parse_servers

EARLIEST = -2
LATEST = -1
BOOTSTRAP = "kafka.bootstrap.servers"


class OptionError(ValueError):
    """An option that is unknown, malformed or in conflict with another; the message names it."""


# Options as Spark spells them; lookups are case-insensitive.
SOURCE_OPTIONS = (
    BOOTSTRAP, "subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets",
    "startingTimestamp", "endingTimestamp", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "minPartitions", "maxRecordsPerPartition", "includeHeaders", "failOnDataLoss", "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries", "fetchOffset.retryIntervalMs", "useArrow",
)
SINK_OPTIONS = (BOOTSTRAP, "topic", "useArrow")
# Kafka client options (after "kafka.") the connector honours, as consumer and as producer.
CONSUMER_CLIENT_OPTIONS = ("client.id", "request.timeout.ms", "fetch.max.bytes", "max.partition.fetch.bytes",
                           "fetch.max.wait.ms", "isolation.level", "check.crcs", "retry.backoff.ms",
                           "security.protocol")
PRODUCER_CLIENT_OPTIONS = ("client.id", "request.timeout.ms", "acks", "enable.idempotence", "compression.type",
                           "batch.size", "max.in.flight.requests.per.connection", "delivery.timeout.ms",
                           "retry.backoff.ms", "max.request.size", "security.protocol")
# Accepted and not used, as in Spark's Kafka source: the connector joins no consumer group and, like Spark's
# Kafka source, commits no offsets to the node's consumer groups.
ACCEPTED_AND_IGNORED = {
    "groupidprefix": "consumer group names are not used: offsets live in Spark's checkpoint",
    "kafka.group.id": "consumer group names are not used: offsets live in Spark's checkpoint",
    # Spark itself passes a streaming query's checkpoint location to its source and sink.
    "checkpointlocation": "Spark's own: the checkpoint is Spark's business",
}
# Kafka client options Spark's Kafka source refuses, with its advice.
REFUSED_CLIENT_OPTIONS = {
    "kafka.auto.offset.reset": "Use startingOffsets instead.",
    "kafka.key.deserializer": "Keys are always read as bytes; deserialize them with DataFrame operations.",
    "kafka.value.deserializer": "Values are always read as bytes; deserialize them with DataFrame operations.",
    "kafka.key.serializer": "Keys are always written as bytes; serialize them with DataFrame operations.",
    "kafka.value.serializer": "Values are always written as bytes; serialize them with DataFrame operations.",
    "kafka.enable.auto.commit": "Offsets are tracked in Spark's checkpoint, never committed to the node.",
    "kafka.interceptor.classes": "Interceptors are a Java client feature.",
}
_DURATION_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                      "d": 86_400_000}


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _check_known(options: dict[str, str], known: tuple[str, ...], client_options: tuple[str, ...], what: str) -> None:
    allowed = {k.lower() for k in known} | set(ACCEPTED_AND_IGNORED)
    allowed |= {f"kafka.{k}" for k in client_options}
    for key in sorted(options):
        if key in REFUSED_CLIENT_OPTIONS:
            raise OptionError(f"Kafka option '{key[len('kafka.'):]}' is not supported. {REFUSED_CLIENT_OPTIONS[key]}")
        if key in allowed:
            continue
        if key.startswith("kafka."):
            raise OptionError(f"unsupported Kafka client option '{key}' for the shmbroker {what}; supported: "
                              + ", ".join(f"kafka.{k}" for k in client_options))
        raise OptionError(f"unknown option '{key}' for the shmbroker {what}; known options: " + ", ".join(known))


def _bool(options: dict[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise OptionError(f"option '{name}' must be true or false, got {raw!r}")


def _int(options: dict[str, str], name: str, default: int | None, minimum: int | None = None) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option '{name}' must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise OptionError(f"option '{name}' must be at least {minimum}, got {value}")
    return value


def parse_duration_ms(name: str, raw: str) -> int:
    """Spark's time strings: '15m', '10s', '500ms', '1h'; a bare number is milliseconds."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    if not match or match.group(2) not in _DURATION_UNITS_MS and match.group(2):
        raise OptionError(f"option '{name}' must be a duration such as 15m, 30s or 500ms, got {raw!r}")
    return int(int(match.group(1)) * _DURATION_UNITS_MS.get(match.group(2) or "ms", 1))


def _json(name: str, raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option '{name}' is not valid JSON ({exc.msg}): {raw!r}") from None


def _partition_map(name: str, raw: str, allowed: tuple[int, ...] = ()) -> dict[TopicPartition, int]:
    """{"topic": {"0": 23, "1": -1}} as {TopicPartition: value}; values >= 0 or one of `allowed`."""
    parsed = _json(name, raw)
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"option '{name}' must be a JSON object like {{\"topic\":{{\"0\":23}}}}, got {raw!r}")
    found = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict) or not partitions:
            raise OptionError(f"option '{name}': topic {topic!r} must map partitions to values, got {partitions!r}")
        for partition, value in partitions.items():
            if not str(partition).lstrip("-").isdigit() or int(partition) < 0:
                raise OptionError(f"option '{name}': {partition!r} of topic {topic!r} is not a partition number")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0 and value not in allowed:
                hint = f" (or {' / '.join(map(str, allowed))})" if allowed else ""
                raise OptionError(f"option '{name}': {topic}-{partition} must be a number >= 0{hint}, got {value!r}")
            found[TopicPartition(topic, int(partition))] = value
    return found


@dataclass(frozen=True)
class Subscription:
    """Which partitions a query reads: a topic list, a pattern or fixed partitions."""

    kind: str  # "subscribe", "subscribePattern" or "assign"
    topics: tuple[str, ...] = ()
    pattern: str = ""
    partitions: tuple[TopicPartition, ...] = ()

    def describe(self) -> str:
        if self.kind == "subscribe":
            return "subscribe=" + ",".join(self.topics)
        if self.kind == "subscribePattern":
            return f"subscribePattern={self.pattern}"
        return "assign=" + ",".join(map(str, self.partitions))

    def select(self, available: Mapping[str, int]) -> list[TopicPartition]:
        """The partitions to read, given {topic: partition count} of the node's topics. A subscribed
        topic that does not exist (yet) has no partitions; an assigned partition that does not exist is
        returned anyway (reading it fails with a clear error)."""
        if self.kind == "subscribe":
            return [TopicPartition(t, p) for t in self.topics for p in range(available.get(t, 0))]
        if self.kind == "subscribePattern":
            regex = re.compile(self.pattern)
            return [TopicPartition(t, p) for t in sorted(available) if regex.fullmatch(t) for p in range(available[t])]
        return list(self.partitions)

    def topics_to_ask(self) -> list[str] | None:
        """Topics to ask Metadata about (None: every topic, for a pattern)."""
        if self.kind == "subscribe":
            return list(self.topics)
        if self.kind == "assign":
            return sorted({tp.topic for tp in self.partitions})
        return None


@dataclass(frozen=True)
class OffsetSpec:
    """Where a query starts or ends: "earliest"/"latest", per-partition offsets, or timestamps."""

    option: str  # the option it came from, for messages
    kind: str  # "earliest", "latest", "offsets", "timestamp" (one for all), "timestamps" (per partition)
    offsets: tuple[tuple[TopicPartition, int], ...] = ()  # kind "offsets" or "timestamps"
    timestamp: int = 0  # kind "timestamp"

    def as_dict(self) -> dict[TopicPartition, int]:
        return dict(self.offsets)


@dataclass(frozen=True)
class ConsumerSettings:
    servers: tuple[tuple[str, int], ...]
    client_id: str = "pyspark-shmbroker"
    request_timeout_ms: int = 30_000
    fetch_max_bytes: int = 50 * 1024 * 1024
    max_partition_fetch_bytes: int = 4 * 1024 * 1024
    fetch_max_wait_ms: int = 500
    isolation_level: int = 0
    check_crcs: bool = True
    retry_backoff_ms: int = 100  # between fetches of a partition that answered a retriable error
    poll_timeout_ms: int = 120_000  # kafkaConsumer.pollTimeoutMs: how long a read waits for records it was promised
    offset_retries: int = 3  # fetchOffset.numRetries
    offset_retry_interval_ms: int = 10  # fetchOffset.retryIntervalMs


@dataclass(frozen=True)
class SourceOptions:
    consumer: ConsumerSettings
    subscription: Subscription
    starting: OffsetSpec | None  # None: the default (earliest for batch, latest for streaming)
    ending: OffsetSpec | None  # None: latest
    timestamp_strategy: str = "error"  # startingOffsetsByTimestampStrategy
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    use_arrow: bool = True
    ignored: tuple[str, ...] = field(default=())

    @classmethod
    def parse(cls, raw_options: Mapping[str, str]) -> SourceOptions:
        options = _lower(raw_options)
        _check_known(options, SOURCE_OPTIONS, CONSUMER_CLIENT_OPTIONS, "source")
        consumer = _consumer_settings(options)
        subscription = _subscription(options)
        starting = _offset_spec(options, "starting")
        ending = _offset_spec(options, "ending")
        strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise OptionError(f"option 'startingOffsetsByTimestampStrategy' must be error or latest, got {strategy!r}")
        max_per_trigger = _int(options, "maxOffsetsPerTrigger", None, 1)
        min_per_trigger = _int(options, "minOffsetsPerTrigger", None, 1)
        if max_per_trigger is not None and min_per_trigger is not None and min_per_trigger > max_per_trigger:
            raise OptionError(f"option 'minOffsetsPerTrigger' ({min_per_trigger}) is larger than "
                              f"'maxOffsetsPerTrigger' ({max_per_trigger})")
        if "maxtriggerdelay" in options and min_per_trigger is None:
            raise OptionError("option 'maxTriggerDelay' only applies with 'minOffsetsPerTrigger'")
        delay = parse_duration_ms("maxTriggerDelay", options.get("maxtriggerdelay", "15m"))
        return cls(
            consumer=consumer, subscription=subscription, starting=starting, ending=ending,
            timestamp_strategy=strategy, max_offsets_per_trigger=max_per_trigger,
            min_offsets_per_trigger=min_per_trigger, max_trigger_delay_ms=delay,
            min_partitions=_int(options, "minPartitions", None, 1),
            max_records_per_partition=_int(options, "maxRecordsPerPartition", None, 1),
            include_headers=_bool(options, "includeHeaders", False),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            use_arrow=_bool(options, "useArrow", True),
            ignored=tuple(sorted(k for k in options if k in ACCEPTED_AND_IGNORED)))

    def check_batch(self) -> None:
        """What a batch query cannot take (Spark's Kafka source refuses the same)."""
        for spec, option, refused, offset_refused in ((self.starting, "startingOffsets", "latest", LATEST),
                                                      (self.ending, "endingOffsets", "earliest", EARLIEST)):
            if spec is None:
                continue
            if spec.kind == refused:
                raise OptionError(f"option '{option}' can't be {refused} for batch queries")
            for tp, offset in spec.offsets if spec.kind == "offsets" else ():
                if offset == offset_refused:
                    raise OptionError(f"option '{option}': {tp} can't be {refused} ({offset}) for batch queries")

    def check_streaming(self) -> None:
        if self.ending is not None:
            raise OptionError(f"option '{self.ending.option}' is not valid in streaming queries "
                              "(a stream has no end; use a batch query to read a fixed range)")


@dataclass(frozen=True)
class ProducerSettings:
    servers: tuple[tuple[str, int], ...]
    client_id: str = "pyspark-shmbroker"
    request_timeout_ms: int = 30_000
    acks: int = -1  # all: required by the idempotent producer
    compression: str = "none"
    batch_bytes: int = 512 * 1024
    max_in_flight: int = 5  # the node remembers the last 5 batches of a producer, so retries dedupe
    delivery_timeout_ms: int = 120_000
    retry_backoff_ms: int = 100
    max_request_bytes: int = 1024 * 1024


@dataclass(frozen=True)
class SinkOptions:
    producer: ProducerSettings
    topic: str | None
    use_arrow: bool = True

    @classmethod
    def parse(cls, raw_options: Mapping[str, str]) -> SinkOptions:
        options = _lower(raw_options)
        _check_known(options, SINK_OPTIONS, PRODUCER_CLIENT_OPTIONS, "sink")
        servers = _servers(options)
        _plaintext_only(options)
        acks = options.get("kafka.acks", "all").strip().lower()
        if acks not in ("all", "-1"):
            raise OptionError(f"option 'kafka.acks' must be all (-1): the idempotent producer needs every "
                              f"write acknowledged once durable, got {acks!r}")
        if not _bool(options, "kafka.enable.idempotence", True):
            raise OptionError("option 'kafka.enable.idempotence' cannot be false: writes always use the "
                              "idempotent producer, so a retry never writes a batch twice")
        compression = options.get("kafka.compression.type", "none").strip().lower()
        if compression not in ("none", "gzip", "snappy", "lz4", "zstd"):
            raise OptionError(f"option 'kafka.compression.type' must be none, gzip, snappy, lz4 or zstd, "
                              f"got {compression!r}")
        in_flight = _int(options, "kafka.max.in.flight.requests.per.connection", 5, 1)
        if in_flight > 5:
            raise OptionError(f"option 'kafka.max.in.flight.requests.per.connection' must be at most 5 with the "
                              f"idempotent producer, got {in_flight}")
        max_request = _int(options, "kafka.max.request.size", 1024 * 1024, 1024)
        batch_bytes = _int(options, "kafka.batch.size", min(512 * 1024, max_request), 1024)
        if batch_bytes > max_request:
            raise OptionError(f"option 'kafka.batch.size' ({batch_bytes}) is larger than 'kafka.max.request.size' "
                              f"({max_request})")
        producer = ProducerSettings(
            servers=servers, client_id=options.get("kafka.client.id", "pyspark-shmbroker"),
            request_timeout_ms=_int(options, "kafka.request.timeout.ms", 30_000, 1), acks=-1,
            compression=compression, batch_bytes=batch_bytes, max_in_flight=in_flight,
            delivery_timeout_ms=_int(options, "kafka.delivery.timeout.ms", 120_000, 1),
            retry_backoff_ms=_int(options, "kafka.retry.backoff.ms", 100, 0), max_request_bytes=max_request)
        topic = options.get("topic")
        if topic is not None and not topic.strip():
            raise OptionError("option 'topic' is empty")
        return cls(producer=producer, topic=topic.strip() if topic else None, use_arrow=_bool(options, "useArrow", True))


# --------------------------------------------------------------------------- pieces


def _servers(options: dict[str, str]) -> tuple[tuple[str, int], ...]:
    raw = options.get(BOOTSTRAP)
    if raw is None:
        raise OptionError(f"option '{BOOTSTRAP}' must be specified (HOST:PORT of the node)")
    try:
        return tuple(parse_servers(raw))
    except ValueError as exc:
        raise OptionError(f"option '{BOOTSTRAP}': {exc}") from None


def _plaintext_only(options: dict[str, str]) -> None:
    protocol = options.get("kafka.security.protocol", "PLAINTEXT").strip().upper()
    if protocol != "PLAINTEXT":
        raise OptionError(f"option 'kafka.security.protocol' must be PLAINTEXT (the node has no TLS or SASL), "
                          f"got {protocol!r}")


def _consumer_settings(options: dict[str, str]) -> ConsumerSettings:
    servers = _servers(options)
    _plaintext_only(options)
    isolation = options.get("kafka.isolation.level", "read_uncommitted").strip().lower()
    if isolation not in ISOLATION_LEVELS:
        raise OptionError(f"option 'kafka.isolation.level' must be read_uncommitted or read_committed, "
                          f"got {isolation!r}")
    return ConsumerSettings(
        servers=servers, client_id=options.get("kafka.client.id", "pyspark-shmbroker"),
        request_timeout_ms=_int(options, "kafka.request.timeout.ms", 30_000, 1),
        fetch_max_bytes=_int(options, "kafka.fetch.max.bytes", 50 * 1024 * 1024, 1),
        max_partition_fetch_bytes=_int(options, "kafka.max.partition.fetch.bytes", 4 * 1024 * 1024, 1),
        fetch_max_wait_ms=_int(options, "kafka.fetch.max.wait.ms", 500, 0),
        isolation_level=ISOLATION_LEVELS[isolation],
        check_crcs=_bool(options, "kafka.check.crcs", True),
        retry_backoff_ms=_int(options, "kafka.retry.backoff.ms", 100, 0),
        poll_timeout_ms=_int(options, "kafkaConsumer.pollTimeoutMs", 120_000, 1),
        offset_retries=_int(options, "fetchOffset.numRetries", 3, 0),
        offset_retry_interval_ms=_int(options, "fetchOffset.retryIntervalMs", 10, 0))


def _subscription(options: dict[str, str]) -> Subscription:
    given = [name for name in ("subscribe", "subscribePattern", "assign") if name.lower() in options]
    if len(given) != 1:
        if not given:
            raise OptionError("one of the options 'subscribe', 'subscribePattern' or 'assign' must be specified")
        raise OptionError("only one of the options 'subscribe', 'subscribePattern' or 'assign' may be specified; "
                          "got " + " and ".join(f"'{g}'" for g in given))
    kind = given[0]
    raw = options[kind.lower()]
    if kind == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise OptionError(f"option 'subscribe' names no topic: {raw!r}")
        return Subscription(kind, topics=topics)
    if kind == "subscribePattern":
        if not raw.strip():
            raise OptionError("option 'subscribePattern' is empty")
        try:
            re.compile(raw)
        except re.error as exc:
            raise OptionError(f"option 'subscribePattern' is not a valid pattern ({exc}): {raw!r}") from None
        return Subscription(kind, pattern=raw)
    parsed = _json("assign", raw)
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"option 'assign' must be a JSON object like {{\"topicA\":[0,1]}}, got {raw!r}")
    partitions = []
    for topic, numbers in parsed.items():
        if not isinstance(numbers, list) or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                                                    for p in numbers):
            raise OptionError(f"option 'assign': topic {topic!r} must map to a list of partition numbers, "
                              f"got {numbers!r}")
        partitions.extend(TopicPartition(topic, p) for p in numbers)
    if not partitions:
        raise OptionError(f"option 'assign' names no partition: {raw!r}")
    return Subscription(kind, partitions=tuple(sorted(set(partitions))))


def _offset_spec(options: dict[str, str], side: str) -> OffsetSpec | None:
    """The one starting (or ending) offset option given, if any."""
    names = {"offsets": f"{side}Offsets", "timestamp": f"{side}Timestamp", "timestamps": f"{side}OffsetsByTimestamp"}
    given = [name for name in names.values() if name.lower() in options]
    if len(given) > 1:
        raise OptionError("options " + " and ".join(f"'{g}'" for g in given) + f" conflict: give the {side} "
                          "offsets one way")
    if not given:
        return None
    name = given[0]
    raw = options[name.lower()].strip()
    if name == names["timestamp"]:
        if not raw.isdigit():
            raise OptionError(f"option '{name}' must be a timestamp in milliseconds since the epoch, got {raw!r}")
        return OffsetSpec(name, "timestamp", timestamp=int(raw))
    if name == names["timestamps"]:
        return OffsetSpec(name, "timestamps", offsets=tuple(sorted(_partition_map(name, raw).items())))
    if raw.lower() in ("earliest", "latest"):
        return OffsetSpec(name, raw.lower())
    if not raw.startswith("{"):
        raise OptionError(f"option '{name}' must be earliest, latest or JSON like {{\"topic\":{{\"0\":23}}}}, "
                          f"got {raw!r}")
    return OffsetSpec(name, "offsets", offsets=tuple(sorted(_partition_map(name, raw, (EARLIEST, LATEST)).items())))
