"""Node configuration: one dataclass tree, read from a TOML file, then overridden by the command line.

Invariants:
- Every tunable number of the node lives here (or in a nested config it owns, such as the log's);
  modules take their numbers from a config object, never from literals.
- A config is immutable once loaded; processes receive it as JSON on their command line, so a
  restarted child runs with exactly the configuration its siblings have.
- Unknown keys in the TOML file are an error (a typo must not silently fall back to a default).
- A table in the file overrides only the keys it names: the rest keep the node's defaults (which may
  differ from a nested config class's own defaults, e.g. the rings' capacity).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

import orjson

from node.storage.log import LogConfig
from node.timer.purgatory import PurgatoryConfig
from node.timer.wheel import WheelConfig
from shm.ring import RingConfig


class ConfigError(ValueError):
    """A config file or override that cannot be used."""


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 9092
    # Host and port written into Metadata responses; default: the listen address.
    advertised_host: str = ""
    advertised_port: int = 0
    data_dir: str = "./data"
    # Network worker processes; 0 means one per CPU.
    workers: int = 0
    node_id: int = 0
    # A length prefix above this closes the connection (Kafka's socket.request.max.bytes).
    request_max_bytes: int = 100 * 1024 * 1024
    listen_backlog: int = 1024
    # Accepts per readiness event, so a connection storm cannot starve established clients.
    accepts_per_turn: int = 64
    socket_send_buffer_bytes: int = 1024 * 1024
    socket_receive_buffer_bytes: int = 1024 * 1024
    # Most bytes a worker takes from one socket per read (a large request arrives over several reads).
    recv_bytes: int = 256 * 1024
    # On SIGTERM, in-flight responses get this long to finish.
    shutdown_grace_ms: int = 5000
    # Backoff between restarts of a child that keeps dying: doubles up to the maximum.
    restart_backoff_min_ms: int = 100
    restart_backoff_max_ms: int = 5000
    # A child that lived this long resets its backoff.
    restart_backoff_reset_ms: int = 10000
    # A child that exits this soon after starting, this many times in a row, cannot boot (a bad install,
    # a broken config): the node stops with exit code 1 instead of restarting it forever.
    child_boot_window_ms: int = 5000
    child_boot_failures_max: int = 5
    # The supervisor looks at its children at least this often (a SIGCHLD can be merged with another).
    supervisor_poll_ms: int = 1000

    def worker_count(self) -> int:
        return self.workers if self.workers > 0 else (os.cpu_count() or 1)


@dataclass(frozen=True)
class TopicDefaults:
    auto_create_topics: bool = True
    num_partitions: int = 1
    # Upper bound of partitions on the node (rows of the shared partition table).
    max_partitions: int = 4096


@dataclass(frozen=True)
class TimerConfig:
    wheel: WheelConfig = field(default_factory=WheelConfig)
    purgatory: PurgatoryConfig = field(default_factory=PurgatoryConfig)
    # A worker answers by itself a delayed request this long past its deadline (timer gone).
    delayed_grace_ms: int = 2000
    # How often a worker looks for delayed requests the timer failed to answer.
    self_check_interval_ms: int = 100
    # Topic creation and deletion requests wait this long for the timer process.
    control_timeout_ms: int = 10000
    # The timer process sleeps at most this long even with nothing due (liveness checks).
    max_sleep_ms: int = 500
    # Frames drained per ring per loop turn, so one busy worker cannot starve the others.
    drain_batch: int = 4096
    # Frames that did not fit a full ring are retried this soon (a worker's requests, the timer's completions).
    ring_full_retry_ms: int = 1


@dataclass(frozen=True)
class FlushConfig:
    # Group commit: a waiting acks=all produce or offset commit starts an fsync round at once when none is in
    # flight (those arriving meanwhile share the next). Appends nobody waits on (acks=0/1) are fsync'd at
    # least this often: the upper bound of background flushing, never a delay of a waiting request.
    flush_interval_ms: int = 1000
    # A round's fdatasyncs are issued by up to this many threads at once (the journal commits them together).
    sync_threads: int = 16
    # Producer-state snapshots bound the catch-up scan a worker does on its first idempotent batch.
    producer_snapshot_interval_ms: int = 30_000
    retention_check_interval_ms: int = 300_000

    def __post_init__(self):
        if self.flush_interval_ms <= 0 or self.sync_threads <= 0:
            raise ValueError("flush_interval_ms and sync_threads must be positive")


@dataclass(frozen=True)
class GroupConfig:
    """The group coordinator; defaults and names are Kafka's where Kafka has the setting."""

    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    max_size: int = 0  # group.max.size; 0: no limit
    offsets_retention_minutes: float = 7 * 24 * 60.0  # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600_000  # offsets.retention.check.interval.ms
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    offsets_commit_timeout_ms: int = 5000  # offsets.commit.timeout.ms
    # Loading the offsets log at start: bytes read per timer loop turn, so the timer keeps serving meanwhile.
    offsets_load_bytes_per_turn: int = 1 << 20
    # ... and at most one slice per this interval (0: every turn), to bound the timer's CPU on a huge log.
    offsets_load_interval_ms: int = 0
    # The offsets log is compacted (its live set rewritten) once it holds this many records and twice the live.
    offsets_compaction_min_records: int = 50_000
    # A worker waits this long for a JoinGroup or SyncGroup answer beyond the request's own rebalance timeout
    # (the coordinator always answers within it; the margin only matters if the timer process is gone).
    join_answer_margin_ms: int = 5000
    # A SyncGroup waits at most this long (Kafka bounds it by the rebalance timeout, which a worker cannot see).
    sync_wait_max_ms: int = 300_000
    # Largest encoded group request a worker hands the timer (member metadata, assignments), within the rings'
    # largest frame; a larger one is refused with INVALID_REQUEST.
    max_request_document_bytes: int = 1 << 20


@dataclass(frozen=True)
class NodeConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    topics: TopicDefaults = field(default_factory=TopicDefaults)
    timer: TimerConfig = field(default_factory=TimerConfig)
    flush: FlushConfig = field(default_factory=FlushConfig)
    log: LogConfig = field(default_factory=LogConfig)
    groups: GroupConfig = field(default_factory=GroupConfig)
    # The rings between each worker and the timer process (one each way).
    rings: RingConfig = field(default_factory=lambda: RingConfig(capacity=4 * 1024 * 1024))

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "NodeConfig":
        return from_mapping(orjson.loads(raw))


def _build(defaults: Any, values: dict[str, Any], where: str) -> Any:
    """`defaults` (a config instance) with the keys of `values` replaced, recursively and type-checked."""
    known = {f.name for f in dataclasses.fields(defaults)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown setting {where}{key}")
        default = getattr(defaults, key)
        if dataclasses.is_dataclass(default):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}{key} must be a table")
            kwargs[key] = _build(default, value, f"{where}{key}.")
        else:
            expected = type(default)
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if expected is int and isinstance(value, bool) or not isinstance(value, expected):
                raise ConfigError(f"{where}{key} must be {expected.__name__}, got {value!r}")
            kwargs[key] = value
    try:
        return dataclasses.replace(defaults, **kwargs)
    except ValueError as exc:  # a nested config's own check (__post_init__)
        raise ConfigError(f"{where.rstrip('.') or 'config'}: {exc}") from None


def from_mapping(values: dict[str, Any]) -> NodeConfig:
    return _build(NodeConfig(), values, "")


def load(path: str | None = None, overrides: dict[str, Any] | None = None) -> NodeConfig:
    """Read `path` (TOML) if given, then apply `overrides` ({"server.port": 9093, ...})."""
    values: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:
                values = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        values.setdefault(section, {})[key] = value
    return from_mapping(values)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"--listen wants HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)
