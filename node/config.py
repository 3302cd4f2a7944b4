"""Node configuration: one dataclass tree, read from a TOML file, then overridden by the command line.

Invariants:
- Every tunable number of the node lives here (or in a nested config it owns, such as the log's);
  modules take their numbers from a config object, never from literals.
- It nests the configs of the layers below it (node.storage's LogConfig, shm's RingConfig) and imports nothing
  of node.timer or node.tools: the timer's wheel and purgatory tunables are declared here.
- A config is immutable once loaded. The supervisor writes the node's config to a file in the instance's shared
  memory (`write_runtime`; not the data directory, which may be full), which its children read at start
  (`read_runtime`), so a restarted child runs with exactly
  the configuration its siblings have; on SIGHUP the supervisor rewrites it with the reloadable settings
  changed (`RELOADABLE`) and the children re-read it.
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

from shmbroker.node.storage.cleaner import CleanerConfig
from shmbroker.node.storage.log import LogConfig
from shmbroker.shm.ring import RingConfig


class ConfigError(ValueError):
    """A config file or override that cannot be used; `key` is the dotted setting at fault, when one is."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"  # where the default PLAINTEXT listener listens (no [[listeners]]; --listen)
    port: int = 9092  # ... and its port
    # Host and port written into Metadata responses; default: the listen address.
    advertised_host: str = ""
    advertised_port: int = 0  # 0: the listen port
    data_dir: str = "./data"  # the logs, the catalog, the offsets and transaction logs (--data-dir)
    # Network worker processes; 0 means one per CPU.
    workers: int = 0
    node_id: int = 0  # the broker id Metadata, FindCoordinator and DescribeCluster answer
    # A length prefix above this closes the connection (Kafka's socket.request.max.bytes).
    request_max_bytes: int = 100 * 1024 * 1024
    listen_backlog: int = 1024  # listen(2) backlog of each listening socket (Kafka's socket.listen.backlog.size)
    # Accepts per readiness event, so a connection storm cannot starve established clients.
    accepts_per_turn: int = 64
    socket_send_buffer_bytes: int = 1024 * 1024  # SO_SNDBUF of client sockets (Kafka's socket.send.buffer.bytes)
    socket_receive_buffer_bytes: int = 1024 * 1024  # SO_RCVBUF (Kafka's socket.receive.buffer.bytes)
    # Most bytes a worker takes from one socket per read (a large request arrives over several reads).
    recv_bytes: int = 256 * 1024
    # On SIGTERM, in-flight responses get this long to finish.
    shutdown_grace_ms: int = 5000
    # Backoff between restarts of a child that keeps dying: doubles up to the maximum.
    restart_backoff_min_ms: int = 100
    restart_backoff_max_ms: int = 5000  # ... the maximum
    # A child that lived this long resets its backoff.
    restart_backoff_reset_ms: int = 10000
    # A child that exits this soon after starting, this many times in a row, cannot boot (a bad install,
    # a broken config): the node stops with exit code 1 instead of restarting it forever.
    child_boot_window_ms: int = 5000
    child_boot_failures_max: int = 5  # ... this many times
    # The supervisor looks at its children at least this often (a SIGCHLD can be merged with another).
    supervisor_poll_ms: int = 1000
    # Allocations between two young-generation collections of the garbage collector in every child (Python's
    # default is 700). Each long poll allocates a few dozen objects that live for its max_wait: at the default,
    # collections ran ~100 times a second per worker, promoted the waiting requests and rescanned them, ~16%
    # of a busy worker's CPU and ~20% of the timer's. Objects built before a child serves are frozen (never
    # scanned). 0 keeps Python's default.
    gc_young_threshold: int = 50_000
    # Incremental fetch sessions (Kafka's max.incremental.fetch.session.cache.slots), shared evenly by the
    # workers; 0: none (every fetch is answered in full).
    max_incremental_fetch_session_cache_slots: int = 1000
    # A session unused this long may be evicted for a new one; one opened this long ago, for a larger one
    # (Kafka's min.incremental.fetch.session.eviction.ms).
    min_incremental_fetch_session_eviction_ms: int = 120_000
    # A connection keeps up to this many Fetch requests it sent again (a body seen among its last this many):
    # the same request again (an idle consumer's long poll, every max_wait) is then a look-up instead of a
    # decode, and an empty read it made is reused while its partitions stay unchanged. 0: every Fetch is
    # decoded and read. A Fetch body over repeated_fetch_max_bytes is never kept.
    repeated_fetches_per_connection: int = 8
    repeated_fetch_max_bytes: int = 4096  # ... the largest body kept

    # -- bounds on memory (-1: no bound) --
    # Bytes held for requests that are incomplete or not yet served, and for unsent responses, across the
    # node (Kafka's queued.max.request.bytes), split evenly over the workers. Past its share a worker stops
    # reading from the connections that hold the most (backpressure), and resumes as memory frees.
    queued_max_request_bytes: int = 256 * 1024 * 1024
    # A connection whose queued responses (sendfile ranges counted at their length) pass this many bytes is
    # not served new requests until its client reads them.
    connection_max_queued_response_bytes: int = 16 * 1024 * 1024

    # -- connection limits and timeouts --
    # Kafka's max.connections and max.connections.per.ip, node-wide (Kafka's defaults: no limit): over
    # them a new connection is closed at accept.
    max_connections: int = 2**31 - 1
    max_connections_per_ip: int = 2**31 - 1  # ... per client address
    # Client addresses are counted in this many shared buckets (a collision only makes the per-IP limit stricter).
    connection_ip_buckets: int = 65536
    # Kafka's connections.max.idle.ms: a connection with no request in flight and no byte read or written for
    # this long is closed (-1: never).
    connections_max_idle_ms: int = 10 * 60 * 1000
    # A request that stays incomplete this long, while its worker reads from it, closes its connection (-1: never).
    request_timeout_ms: int = 30_000
    # Refused connections and timeout closes are logged once per cause per interval (the line counts the rest).
    limit_log_interval_ms: int = 60_000
    # After accept fails for lack of file descriptors (EMFILE, ENFILE) the listener rests this long.
    accept_retry_ms: int = 100

    # -- connection affinity (workers.affinity; more than one worker only) --
    # A connection whose last this-many long polls were all answered by one other worker's appends moves to
    # that worker, which then answers them right after its appends (0: connections never move).
    connection_affinity_waits: int = 4
    # ... unless the move leaves that worker with more than this many connections over the mover's.
    connection_affinity_slack: int = 16
    # A connection moves at most once per this long.
    connection_affinity_cooldown_ms: int = 30_000
    # A new connection goes to the live worker holding the fewest, when that leaves it fewer than the
    # accepting worker's (Kafka's acceptor deals connections round robin; the kernel's hash does not balance).
    balance_connections: bool = True

    # -- hung children --
    # Every child's loop turns (and beats) at least this often, even when idle.
    heartbeat_interval_ms: int = 1000
    # A child whose heartbeat has not moved for this long is killed (SIGKILL) and restarted (0: never).
    child_hang_timeout_ms: int = 10_000
    # ... or, before its loop's first turn, for this long (a child stuck while starting).
    child_start_timeout_ms: int = 60_000

    def __post_init__(self):
        if self.child_hang_timeout_ms and self.child_hang_timeout_ms < 2 * self.heartbeat_interval_ms:
            raise ValueError("child_hang_timeout_ms must be 0 (off) or at least twice heartbeat_interval_ms")
        if self.heartbeat_interval_ms <= 0 or self.connection_ip_buckets <= 0:
            raise ValueError("heartbeat_interval_ms and connection_ip_buckets must be positive")
        if min(self.connection_affinity_waits, self.connection_affinity_slack,
               self.connection_affinity_cooldown_ms) < 0:
            raise ValueError("connection_affinity_waits, _slack and _cooldown_ms must be 0 or more")
        if min(self.repeated_fetches_per_connection, self.repeated_fetch_max_bytes) < 0:
            raise ValueError("repeated_fetches_per_connection and repeated_fetch_max_bytes must be 0 or more")

    def worker_count(self) -> int:
        return self.workers if self.workers > 0 else (os.cpu_count() or 1)

    def worker_request_bytes(self) -> int:
        """Each worker's share of queued_max_request_bytes (-1: no bound)."""
        if self.queued_max_request_bytes < 0:
            return -1
        return max(1, self.queued_max_request_bytes // self.worker_count())


@dataclass(frozen=True)
class TopicDefaults:
    auto_create_topics: bool = True  # auto.create.topics.enable: Metadata and Produce create unknown topics
    num_partitions: int = 1  # num.partitions: of a topic created on demand or with the default count (-1)
    # Upper bound of partitions on the node (rows of the shared partition table).
    max_partitions: int = 4096
    # Partitions whose directories and files one CreateTopics / CreatePartitions makes at once (threads).
    create_threads: int = 16
    # A single node keeps one copy of a partition. Kafka's answer to a replication factor above 1 on one broker is
    # INVALID_REPLICATION_FACTOR (the default here too); true takes such a topic with one copy and logs a line, so
    # Kafka Connect and MirrorMaker 2, whose internal topics ask for 3, run with their own defaults.
    accept_replication_factor_above_one: bool = False

    def __post_init__(self) -> None:
        if self.num_partitions <= 0 or self.max_partitions <= 0 or self.create_threads <= 0:
            raise ValueError("num_partitions, max_partitions and create_threads must be positive")


@dataclass(frozen=True)
class WheelConfig:
    """Tunables of a TimingWheel (node.timer.wheel; the timer process builds its wheels from this)."""

    tick_ms: int = 1  # the first level's slot width: the timers' resolution
    wheel_size: int = 20  # slots per level (each level's slot spans the level below)
    initial_capacity: int = 1024  # entry slots allocated up front; doubles when full
    bucket_initial_capacity: int = 64  # references per bucket member array; doubles when full
    # The constant C in slots_in_use <= 2 * pending + C. Large enough that a steady load whose cancels are
    # reclaimed by draining buckets rarely compacts (measured: 1024 costs ~10% more CPU at 100k timers/s).
    compaction_slack: int = 16384


@dataclass(frozen=True)
class PurgatoryConfig:
    """Tunables of a Purgatory (node.timer.purgatory)."""

    purge_interval: int = 1000  # Kafka's default for produce and fetch purgatories


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
    # A run of at least this many consecutive one-partition DELAY_FETCH frames in a drain takes the array path
    # (node.timer.fetch_waits: decoded, checked, put in the wheel and expired as arrays); shorter runs, where
    # numpy's fixed costs would dominate, take the per-operation path. 0: never the array path.
    fetch_batch_min: int = 8
    # The same for runs of DELAY_PRODUCE frames (acks=all produces, node.timer.produce_waits: their arrival, the
    # check after each flush round and their deadlines as arrays). 0: never the array path.
    produce_batch_min: int = 8
    # Frames that did not fit a full ring are retried this soon (a worker's requests, the timer's completions).
    ring_full_retry_ms: int = 1
    # Completions go out (and responses are written) in chunks of this many when one turn makes more: the
    # workers start on a long-poll fan-out while the timer still completes the rest, and the clients start
    # reading while the workers still encode the rest.
    completion_chunk: int = 512
    # A long-poll fetch waits this long in its worker before the worker hands it to the timer (one DELAY_FETCH
    # frame, and a CANCEL when an append answers it later): on a busy topic the next append answers most
    # long polls first, with no frame and no wake of the timer. Fetches with a shorter max wait go at once;
    # 0 hands every one over at once.
    fetch_handoff_ms: int = 50
    # The timer process's GIL switch interval (sys.setswitchinterval). Its loop shares the process with the
    # flusher's threads (rounds, urgent syncs, chores): a thread that holds the GIL keeps it until it blocks or
    # this long passes after the loop asked for it, so the interval bounds what a busy thread adds to a reply's
    # path. CPython's default, 5,000 us, put 5 ms tails on EndTxn (scripts/bench_transactions).
    gil_switch_interval_us: int = 500

    def __post_init__(self) -> None:
        if self.fetch_handoff_ms < 0:
            raise ValueError("fetch_handoff_ms must be 0 (hand over at once) or more")
        if self.fetch_batch_min < 0 or self.produce_batch_min < 0:
            raise ValueError("fetch_batch_min and produce_batch_min must be 0 (never the array path) or more")
        if self.gil_switch_interval_us <= 0:
            raise ValueError("gil_switch_interval_us must be positive")


@dataclass(frozen=True)
class FlushConfig:
    # Group commit: a waiting acks=all produce or offset commit starts an fsync round at once when none is in
    # flight (those arriving meanwhile share the next). Appends nobody waits on (acks=0/1) are fsync'd at
    # least this often: the upper bound of background flushing, never a delay of a waiting request.
    flush_interval_ms: int = 1000
    # A round's fdatasyncs are issued by up to this many threads at once (the journal commits them together).
    sync_threads: int = 16
    # Producer-state snapshots bound the catch-up scan a worker does on its first idempotent batch. A round
    # writes one only for a partition with batches since its last (an idle node writes nothing).
    producer_snapshot_interval_ms: int = 30_000
    retention_check_interval_ms: int = 300_000  # log.retention.check.interval.ms: time and size retention

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
    # offsets.topic.segment.bytes: the offsets log's segments; the log cleaner compacts the sealed ones.
    offsets_segment_bytes: int = 100 << 20
    # A worker waits this long for a JoinGroup or SyncGroup answer beyond the request's own rebalance timeout
    # (the coordinator always answers within it; the margin only matters if the timer process is gone).
    join_answer_margin_ms: int = 5000
    # A SyncGroup waits at most this long (Kafka bounds it by the rebalance timeout, which a worker cannot see).
    sync_wait_max_ms: int = 300_000
    # Largest encoded group request a worker hands the timer (member metadata, assignments), within the rings'
    # largest frame; a larger one is refused with INVALID_REQUEST.
    max_request_document_bytes: int = 1 << 20
    # Consumer-protocol groups (KIP-848):
    consumer_session_timeout_ms: int = 45_000  # group.consumer.session.timeout.ms
    consumer_heartbeat_interval_ms: int = 5000  # group.consumer.heartbeat.interval.ms
    # The bounds of the two above, for the node's own values and for a group's overrides (group configs).
    consumer_min_session_timeout_ms: int = 45_000  # group.consumer.min.session.timeout.ms
    consumer_max_session_timeout_ms: int = 60_000  # group.consumer.max.session.timeout.ms
    consumer_min_heartbeat_interval_ms: int = 5000  # group.consumer.min.heartbeat.interval.ms
    consumer_max_heartbeat_interval_ms: int = 15_000  # group.consumer.max.heartbeat.interval.ms
    # The interval answered instead to a member waiting for partitions another member has yet to give up
    # (at most consumer_heartbeat_interval_ms; 0: always that one, as Kafka). Such a member gets them only at its
    # next heartbeat after their owner's, so a rebalance takes up to two full intervals; clients take the
    # interval of every answer (librdkafka, the Java client), so the second one shrinks to this.
    consumer_unreleased_heartbeat_interval_ms: int = 500
    consumer_max_size: int = 0  # group.consumer.max.size; 0: no limit
    # group.consumer.assignors: the server-side assignors, comma-separated; the first is the default.
    consumer_assignors: str = "uniform,range"
    # Streams groups (KIP-1071's rebalance protocol, node.timer.groups.streams):
    streams_session_timeout_ms: int = 45_000  # group.streams.session.timeout.ms
    streams_heartbeat_interval_ms: int = 5000  # group.streams.heartbeat.interval.ms
    # The bounds of the two above, for the node's own values and for a group's overrides (group configs).
    streams_min_session_timeout_ms: int = 45_000  # group.streams.min.session.timeout.ms
    streams_max_session_timeout_ms: int = 60_000  # group.streams.max.session.timeout.ms
    streams_min_heartbeat_interval_ms: int = 5000  # group.streams.min.heartbeat.interval.ms
    streams_max_heartbeat_interval_ms: int = 15_000  # group.streams.max.heartbeat.interval.ms
    # group.streams.num.standby.replicas: standby replicas of each stateful task, each on another application
    # instance than the task's active one (a group's streams.num.standby.replicas overrides it).
    streams_num_standby_replicas: int = 0
    streams_max_standby_replicas: int = 2  # group.streams.max.standby.replicas: the most a group may ask for
    streams_max_size: int = 0  # group.streams.max.size; 0: no limit
    # group.streams.initial.rebalance.delay.ms: a member joining an empty group gets no tasks for this long (its
    # answers say ASSIGNMENT_DELAYED), so instances starting together share the tasks at once (none moves).
    streams_initial_rebalance_delay_ms: int = 3000
    # Answered to every member, as Kafka's group configs streams.* (the node assigns no warm-up tasks: see
    # docs/compatibility.md, so the lag only informs the client).
    streams_acceptable_recovery_lag: int = 10_000  # streams.acceptable.recovery.lag
    streams_task_offset_interval_ms: int = 60_000  # streams.task.offset.interval.ms
    # Share groups (KIP-932's queues, node.timer.groups.share and share_partition):
    share_session_timeout_ms: int = 45_000  # group.share.session.timeout.ms
    share_heartbeat_interval_ms: int = 5000  # group.share.heartbeat.interval.ms
    # The bounds of the two above, for the node's own values and for a group's share.session.timeout.ms and
    # share.heartbeat.interval.ms (group configs).
    share_min_session_timeout_ms: int = 45_000  # group.share.min.session.timeout.ms
    share_max_session_timeout_ms: int = 60_000  # group.share.max.session.timeout.ms
    share_min_heartbeat_interval_ms: int = 5000  # group.share.min.heartbeat.interval.ms
    share_max_heartbeat_interval_ms: int = 15_000  # group.share.max.heartbeat.interval.ms
    share_max_size: int = 0  # group.share.max.size; 0: no limit
    # group.share.record.lock.duration.ms: how long a ShareFetch's acquired records stay locked to their member;
    # a lock that runs out makes its records available again (a redelivery).
    share_record_lock_duration_ms: int = 30_000
    # The bounds of a group's share.record.lock.duration.ms, and of the one above:
    share_min_record_lock_duration_ms: int = 15_000  # group.share.min.record.lock.duration.ms
    share_max_record_lock_duration_ms: int = 60_000  # group.share.max.record.lock.duration.ms
    share_delivery_count_limit: int = 5  # group.share.delivery.count.limit: past it a record is archived
    # The bounds of the one above, and of a group's share.delivery.count.limit:
    share_min_delivery_count_limit: int = 2  # group.share.min.delivery.count.limit
    share_max_delivery_count_limit: int = 10  # group.share.max.delivery.count.limit
    # group.share.partition.max.record.locks: in-flight records (acquired or waiting) per share-partition.
    share_partition_max_record_locks: int = 2000
    # The bounds of the one above, and of a group's share.partition.max.record.locks:
    share_min_partition_max_record_locks: int = 100  # group.share.min.partition.max.record.locks
    share_max_partition_max_record_locks: int = 4000  # group.share.max.partition.max.record.locks
    # share.auto.offset.reset's default: where a share-partition starts ("latest" or "earliest").
    share_auto_offset_reset: str = "latest"
    # share.isolation.level's default: "read_uncommitted", or "read_committed" (committed transactions' records).
    share_isolation_level: str = "read_uncommitted"

    def __post_init__(self):
        for low, value, high in (("consumer_min_session_timeout_ms", "consumer_session_timeout_ms",
                                  "consumer_max_session_timeout_ms"),
                                 ("consumer_min_heartbeat_interval_ms", "consumer_heartbeat_interval_ms",
                                  "consumer_max_heartbeat_interval_ms")):
            if not 1 <= getattr(self, low) <= getattr(self, value) <= getattr(self, high):
                raise ValueError(f"[groups] 1 <= {low} <= {value} <= {high} must hold (as Kafka's "
                                 "group.consumer.* settings)")
        if self.consumer_session_timeout_ms <= self.consumer_heartbeat_interval_ms:
            raise ValueError("[groups] consumer_session_timeout_ms must be greater than consumer_heartbeat_interval_ms")
        if not 1 <= self.streams_heartbeat_interval_ms < self.streams_session_timeout_ms:
            raise ValueError("[groups] 1 <= streams_heartbeat_interval_ms < streams_session_timeout_ms must hold")
        for low, value, high in (("streams_min_session_timeout_ms", "streams_session_timeout_ms",
                                  "streams_max_session_timeout_ms"),
                                 ("streams_min_heartbeat_interval_ms", "streams_heartbeat_interval_ms",
                                  "streams_max_heartbeat_interval_ms"),
                                 (None, "streams_num_standby_replicas", "streams_max_standby_replicas")):
            floor = getattr(self, low) if low is not None else 0
            if not (1 if low is not None else 0) <= floor <= getattr(self, value) <= getattr(self, high):
                raise ValueError(f"[groups] {low or 0} <= {value} <= {high} must hold (as Kafka's group.streams.* "
                                 "settings)")
        if min(self.streams_initial_rebalance_delay_ms, self.streams_max_size) < 0:
            raise ValueError("[groups] streams_initial_rebalance_delay_ms and streams_max_size must be >= 0")
        if not 1 <= self.share_heartbeat_interval_ms < self.share_session_timeout_ms:
            raise ValueError("[groups] 1 <= share_heartbeat_interval_ms < share_session_timeout_ms must hold")
        for low, value, high in (("share_min_session_timeout_ms", "share_session_timeout_ms",
                                  "share_max_session_timeout_ms"),
                                 ("share_min_heartbeat_interval_ms", "share_heartbeat_interval_ms",
                                  "share_max_heartbeat_interval_ms"),
                                 ("share_min_delivery_count_limit", "share_delivery_count_limit",
                                  "share_max_delivery_count_limit"),
                                 ("share_min_partition_max_record_locks", "share_partition_max_record_locks",
                                  "share_max_partition_max_record_locks")):
            if not 1 <= getattr(self, low) <= getattr(self, value) <= getattr(self, high):
                raise ValueError(f"[groups] 1 <= {low} <= {value} <= {high} must hold (as Kafka's "
                                 "group.share.* settings)")
        if not 1 <= self.share_min_record_lock_duration_ms <= self.share_record_lock_duration_ms \
                <= self.share_max_record_lock_duration_ms:
            raise ValueError("[groups] 1 <= share_min_record_lock_duration_ms <= share_record_lock_duration_ms <= "
                             "share_max_record_lock_duration_ms must hold (as Kafka's group.share.* settings)")
        if self.share_isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError("[groups] share_isolation_level must be 'read_uncommitted' or 'read_committed'")
        if self.share_record_lock_duration_ms < 1 or self.share_delivery_count_limit < 1 \
                or self.share_partition_max_record_locks < 1 or self.share_max_size < 0:
            raise ValueError("[groups] share_record_lock_duration_ms, share_delivery_count_limit and "
                             "share_partition_max_record_locks must be >= 1, share_max_size >= 0")
        if self.share_auto_offset_reset not in ("latest", "earliest"):
            raise ValueError("[groups] share_auto_offset_reset must be 'latest' or 'earliest'")


@dataclass(frozen=True)
class TransactionConfig:
    """The transaction coordinator (node.timer.transactions); names and defaults are Kafka's where Kafka has the
    setting."""

    transaction_max_timeout_ms: int = 900_000  # transaction.max.timeout.ms: the longest transaction.timeout.ms
    # transaction.state.log.segment.bytes: the __transaction_state log's segments (compacted by the log cleaner).
    state_segment_bytes: int = 100 << 20
    # Loading __transaction_state at start: bytes read per timer loop turn, so the timer keeps serving meanwhile.
    state_load_bytes_per_turn: int = 1 << 20
    # How long a state write (and a completion's markers) may wait for its fsync before the request is refused
    # (the client retries) or the completion is tried again.
    state_write_timeout_ms: int = 5000
    # A completion whose markers could not be written (a storage fault) is tried again after this long.
    marker_retry_ms: int = 1000
    # How often partitions are swept for hanging transactions: open there, but in no transaction of the coordinator
    # (a client that wrote without AddPartitionsToTxn); one open for longer than transaction_max_timeout_ms plus
    # this is aborted by the node, so nothing blocks read_committed readers for good.
    hanging_check_interval_ms: int = 60_000
    # transactional.id.expiration.ms: an id without a transaction for this long is forgotten (Dead, a tombstone).
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    # transaction.remove.expired.transaction.cleanup.interval.ms: how often expired ids are looked for.
    remove_expired_interval_ms: int = 3600 * 1000
    # A request of a transactional id whose previous transaction is still completing (its markers' fsync) waits for
    # it, rather than being answered CONCURRENT_TRANSACTIONS (which clients retry after a backoff): at most this
    # many requests per id (0: none, every such request is refused, as Kafka does) ...
    held_requests_per_id: int = 4
    # ... each for at most this long; beyond either bound the request is answered CONCURRENT_TRANSACTIONS.
    held_request_max_ms: int = 1000

    def __post_init__(self) -> None:
        if min(self.transaction_max_timeout_ms, self.state_segment_bytes, self.state_load_bytes_per_turn,
               self.state_write_timeout_ms, self.marker_retry_ms, self.transactional_id_expiration_ms,
               self.remove_expired_interval_ms, self.hanging_check_interval_ms, self.held_request_max_ms) <= 0:
            raise ValueError("the [transactions] settings must be positive")
        if self.held_requests_per_id < 0:
            raise ValueError("transactions.held_requests_per_id must be 0 or more")


@dataclass(frozen=True)
class QuotaLimits:
    """Byte-rate quotas of one client id (0: unlimited), Kafka's producer_byte_rate and consumer_byte_rate."""

    producer_byte_rate: int = 0  # bytes per second the client id may produce
    consumer_byte_rate: int = 0  # bytes per second the client id may fetch

    def __post_init__(self) -> None:
        for key in ("producer_byte_rate", "consumer_byte_rate"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}: must be 0 (unlimited) or a positive byte rate, got {getattr(self, key)}")


@dataclass(frozen=True)
class QuotaConfig:
    """Client quotas (KIP-13, KIP-219): rates measured node-wide over sampled windows, as Kafka's."""

    window_samples: int = 11  # quota.window.num
    window_ms: int = 1000  # quota.window.size.seconds, in ms
    default: QuotaLimits = field(default_factory=QuotaLimits)  # every client id not listed
    clients: dict = field(default_factory=dict, metadata={"entries": QuotaLimits})  # client id -> QuotaLimits
    # Workers report the bytes of quota'd clients to the timer's quota manager this often while one of them is
    # above half its quota (the others' bytes then matter within a report) ...
    report_interval_ms: int = 10
    # ... and this often while none is: a client far under its quota needs no fresh node-wide rate, and the
    # timer's work per report (measured: 1.8% of the node's CPU per record at 10 ms) becomes rarer.
    far_report_interval_ms: int = 100
    # A client id the timer measured nothing of for this long is forgotten (Kafka's quota sensors expire
    # after an hour idle): clients that come and go must not grow the timer's memory without bound.
    idle_client_expiry_ms: int = 3_600_000

    def __post_init__(self) -> None:
        for key, least in (("window_samples", 2), ("window_ms", 1), ("report_interval_ms", 1),
                           ("far_report_interval_ms", self.report_interval_ms), ("idle_client_expiry_ms", 1)):
            if getattr(self, key) < least:
                raise ValueError(f"{key}: must be at least {least}, got {getattr(self, key)}")

    def limits(self, client_id: str | None) -> QuotaLimits:
        return self.clients.get(client_id or "", self.default)

    @property
    def enabled(self) -> bool:
        limits = [self.default, *self.clients.values()]
        return any(q.producer_byte_rate or q.consumer_byte_rate for q in limits)


@dataclass(frozen=True)
class PriorityConfig:
    """Priority topics: T.p0 ... T.p{L-1} (the highest level last) are the levels of priority topic T."""

    # A Fetch covering two or more levels of one priority topic splits its max_bytes across them
    # exponentially (each level twice the one below), lending what a level cannot use to the levels that
    # can; off: the levels are ordinary topics, read in request order as Kafka does.
    fetch_split: bool = True
    max_levels: int = 16  # a name T.pN with N at or above this is an ordinary topic

    def __post_init__(self) -> None:
        if not 2 <= self.max_levels <= 30:
            raise ValueError(f"max_levels: must be in 2..30 (2^levels weights), got {self.max_levels}")


@dataclass(frozen=True)
class StatsConfig:
    # The shared-memory stats segment (shm.stats): every process publishes its counters this often. The
    # systemd watchdog reads the children's heartbeats (server.heartbeat_interval_ms, child_hang_timeout_ms).
    enabled: bool = True  # false: no stats segment (`shmbroker stats`, the dashboard and /metrics see nothing)
    publish_interval_ms: int = 500  # how often every process publishes
    # Room for the groups' committed offsets in the segment (twice: double-buffered), about 40 bytes per
    # group and partition; groups beyond it are left out of the segment (the Kafka API still has them).
    committed_offsets_bytes: int = 1 << 20
    # Room for the transactional ids' state (`shmbroker transactions`), about 200 bytes per id plus 30 per
    # partition of its transaction; ids beyond it are left out, the idle ones first.
    transactions_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.publish_interval_ms <= 0 or min(self.committed_offsets_bytes, self.transactions_bytes) < 64:
            raise ValueError("publish_interval_ms must be positive, committed_offsets_bytes and transactions_bytes "
                             "at least 64")


# The environment variable that turns checks.watch_answers on for `shmbroker serve` (the test harness sets it),
# and how a breach's log line starts (the harness looks for it in a node's log).
WATCH_ANSWERS_ENV = "SHMBROKER_WATCH_ANSWERS"
ANSWER_WATCH_BREACH = "answer watch breach"


@dataclass(frozen=True)
class ChecksConfig:
    # Tests only: each worker checks every Fetch and ListOffsets answer against Kafka's rules
    # (workers.api.answer_watch), the timer every OffsetFetch answer against the commits it acknowledged
    # (node.timer.groups.offsets_watch); a breach logs one line. Off, the answer paths carry no check at all.
    # Also on when `shmbroker serve` runs with SHMBROKER_WATCH_ANSWERS=1 in its environment.
    watch_answers: bool = False


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
# The listener --listen makes (and the one a config without [[listeners]] gets from server.host and server.port).
DEFAULT_LISTENER_NAME = "PLAINTEXT"


def split_address(text: str) -> tuple[str, int]:
    """HOST:PORT -> (host, port); an empty host is 127.0.0.1."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"wants HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


@dataclass(frozen=True)
class ListenerConfig:
    """One `[[listeners]]` table: where the node accepts connections and what a client must do there."""

    name: str = DEFAULT_LISTENER_NAME  # unique; the one of --listen is PLAINTEXT
    address: str = "127.0.0.1:9092"  # HOST:PORT it listens on (unique)
    security_protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    # HOST:PORT written into Metadata and FindCoordinator for clients that connected here; default: `address`,
    # or, for a wildcard host (0.0.0.0), the address the client connected to.
    advertised_address: str = ""

    def __post_init__(self) -> None:
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"security_protocol: {self.security_protocol!r} is none of {', '.join(SECURITY_PROTOCOLS)}")
        if not self.name:
            raise ValueError("name: must not be empty")
        for key in ("address", "advertised_address"):
            if getattr(self, key):
                try:
                    split_address(getattr(self, key))
                except ValueError as exc:
                    raise ValueError(f"{key}: {exc}") from None

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True)
class TlsConfig:
    """The certificate of the SSL and SASL_SSL listeners (Python's ssl; TLS 1.2 and newer)."""

    certfile: str = ""  # PEM chain
    keyfile: str = ""  # PEM private key of certfile
    # Set: clients must present a certificate this CA file verifies (mTLS); their principal is the subject.
    cafile: str = ""
    minimum_version: str = "TLSv1.2"  # TLSv1.2 | TLSv1.3

    def __post_init__(self) -> None:
        if self.minimum_version not in ("TLSv1.2", "TLSv1.3"):
            raise ValueError(f"minimum_version: must be TLSv1.2 or TLSv1.3, got {self.minimum_version!r}")


@dataclass(frozen=True)
class SaslConfig:
    """Authentication on the SASL_PLAINTEXT and SASL_SSL listeners, against the users store (node.security.users)."""

    mechanisms: list = field(default_factory=lambda: list(SASL_MECHANISMS))  # those offered to clients
    # Kafka's connections.max.reauth.ms (KIP-368): a session lasts this long, then the client re-authenticates on
    # the same connection or it is closed at its next request (0: sessions never end).
    connections_max_reauth_ms: int = 0
    # Kafka's sasl.server.max.receive.size: before its login a client's requests may be at most this large (a larger
    # size prefix closes the connection); after it, server.request_max_bytes.
    server_max_receive_size: int = 524_288
    # A worker looks at the users store's file (node.storage.users) at most this often: `shmbroker users` changes
    # reach a running node that soon.
    users_check_interval_ms: int = 100

    def __post_init__(self) -> None:
        unknown = [m for m in self.mechanisms if m not in SASL_MECHANISMS]
        if unknown or not self.mechanisms:
            raise ValueError(f"mechanisms: must be some of {', '.join(SASL_MECHANISMS)}, got {self.mechanisms!r}")
        if self.connections_max_reauth_ms < 0 or self.users_check_interval_ms < 0 or self.server_max_receive_size <= 0:
            raise ValueError("connections_max_reauth_ms and users_check_interval_ms must be 0 or more, "
                             "server_max_receive_size positive")


@dataclass(frozen=True)
class AuthorizerConfig:
    """ACLs on every request (node.storage.acls: Kafka's AclAuthorizer), managed with CreateAcls/DeleteAcls."""

    enabled: bool = False  # off: every principal may do everything, as a Kafka broker without an authorizer
    super_users: list = field(default_factory=list)  # principals allowed everything ("User:admin")
    # Kafka's allow.everyone.if.no.acl.found: a resource no ACL matches is open to all (else to super users only).
    allow_everyone_if_no_acl_found: bool = False
    # Decisions a worker keeps per connection (cleared when full, and whenever the ACLs change).
    cache_entries_per_connection: int = 1024

    def __post_init__(self) -> None:
        bad = [p for p in self.super_users if not isinstance(p, str) or ":" not in p]
        if bad:
            raise ValueError(f"super_users: principals are TYPE:NAME (e.g. User:admin), got {bad!r}")
        if self.cache_entries_per_connection <= 0:
            raise ValueError("cache_entries_per_connection must be positive")


@dataclass(frozen=True)
class NodeConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    topics: TopicDefaults = field(default_factory=TopicDefaults)
    timer: TimerConfig = field(default_factory=TimerConfig)
    flush: FlushConfig = field(default_factory=FlushConfig)
    log: LogConfig = field(default_factory=LogConfig)
    groups: GroupConfig = field(default_factory=GroupConfig)
    transactions: TransactionConfig = field(default_factory=TransactionConfig)
    quotas: QuotaConfig = field(default_factory=QuotaConfig)
    priority: PriorityConfig = field(default_factory=PriorityConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    cleaner: CleanerConfig = field(default_factory=CleanerConfig)  # the log cleaner (node.cleaner)
    # The rings between each worker and the timer process (one each way).
    rings: RingConfig = field(default_factory=lambda: RingConfig(capacity=4 * 1024 * 1024))
    # Where clients connect ([[listeners]]); once loaded never empty, the first one at server.host:server.port.
    listeners: list = field(default_factory=list, metadata={"items": ListenerConfig})
    tls: TlsConfig = field(default_factory=TlsConfig)
    sasl: SaslConfig = field(default_factory=SaslConfig)
    authorizer: AuthorizerConfig = field(default_factory=AuthorizerConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)

    def listener_list(self) -> list[ListenerConfig]:
        """The listeners, or the one PLAINTEXT listener at server.host:server.port when none are set."""
        if self.listeners:
            return list(self.listeners)
        return [ListenerConfig(DEFAULT_LISTENER_NAME, f"{self.server.host}:{self.server.port}", "PLAINTEXT")]

    def cleaner_count(self) -> int:
        """Log cleaner processes: none with the cleaner off."""
        return self.cleaner.processes if self.cleaner.enabled else 0

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "NodeConfig":
        return from_mapping(orjson.loads(raw))


def _build(defaults: Any, values: dict[str, Any], where: str) -> Any:
    """`defaults` (a config instance) with the keys of `values` replaced, recursively and type-checked."""
    known = {f.name: f for f in dataclasses.fields(defaults)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown setting {where}{key}", f"{where}{key}")
        default = getattr(defaults, key)
        entries = known[key].metadata.get("entries")
        items = known[key].metadata.get("items")
        if items is not None:  # an array of tables of one config class ([[listeners]])
            if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
                raise ConfigError(f"{where}{key} must be an array of tables ([[{key}]])", f"{where}{key}")
            kwargs[key] = [_build(items(), item, f"{where}{key}.") for item in value]
        elif entries is not None:  # a table of named entries of one config class (quotas.clients)
            if not isinstance(value, dict):
                raise ConfigError(f"{where}{key} must be a table", f"{where}{key}")
            for name, entry in value.items():
                if not isinstance(entry, dict):
                    raise ConfigError(f"{where}{key}.{name} must be a table", f"{where}{key}.{name}")
            kwargs[key] = {name: _build(entries(), entry, f"{where}{key}.{name}.") for name, entry in value.items()}
        elif dataclasses.is_dataclass(default):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}{key} must be a table", f"{where}{key}")
            kwargs[key] = _build(default, value, f"{where}{key}.")
        else:
            expected = type(default)
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if expected is int and isinstance(value, bool) or not isinstance(value, expected):
                raise ConfigError(f"{where}{key} must be {expected.__name__}, got {value!r}", f"{where}{key}")
            kwargs[key] = value
    try:
        return dataclasses.replace(defaults, **kwargs)
    except ValueError as exc:  # a nested config's own check (__post_init__): "key: reason" names the key
        key, sep, reason = str(exc).partition(": ")
        if sep and key in known:
            raise ConfigError(f"{where}{key}: {reason}", f"{where}{key}") from None
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
    try:
        return settle_listeners(from_mapping(values), listen_given="server.host" in (overrides or {}))
    except ConfigError as exc:
        if not path:
            raise
        line = _line_of(path, exc.key) if exc.key else None
        raise ConfigError(f"{path}:{line}: {exc}" if line else f"{path}: {exc}", exc.key) from None


def settle_listeners(config: NodeConfig, listen_given: bool = False) -> NodeConfig:
    """`config` with its listeners set: without [[listeners]], or with `--listen` (`listen_given`), a PLAINTEXT
    listener at server.host:server.port comes first (replacing a listener of the file with its name or address);
    server.host and server.port are then the first listener's (the instance's name is made from them). Names and
    addresses must be unique."""
    listeners = list(config.listeners)
    if listen_given or not listeners:
        plain = ListenerConfig(DEFAULT_LISTENER_NAME, f"{config.server.host}:{config.server.port}", "PLAINTEXT")
        listeners = [plain] + [item for item in listeners
                               if item.name != plain.name and split_address(item.address) != (config.server.host,
                                                                                             config.server.port)]
    for attribute in ("name", "address"):
        values = [getattr(item, attribute) for item in listeners]
        if len(set(values)) != len(values):
            raise ConfigError(f"listeners: two listeners with one {attribute}", "listeners")
    if any(item.tls for item in listeners) and not (config.tls.certfile and config.tls.keyfile):
        raise ConfigError("tls: an SSL or SASL_SSL listener needs tls.certfile and tls.keyfile", "tls")
    host, port = split_address(listeners[0].address)
    server = dataclasses.replace(config.server, host=host, port=port)
    return dataclasses.replace(config, listeners=listeners, server=server)


def _line_of(path: str, dotted: str) -> int | None:
    """The line of `path` that sets the dotted key (its table header for a table), for error messages."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    table = ""
    for number, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].strip()
        if text.startswith("["):
            table = ".".join(part.strip().strip('"') for part in text.strip("[]").split("."))
            if table == dotted:
                return number
            continue
        key, sep, _ = text.partition("=")
        if sep and ".".join(filter(None, (table, key.strip().strip('"')))) == dotted:
            return number
    return None


# Sections a running node takes on SIGHUP; a change anywhere else needs a restart.
RELOADABLE = ("quotas", "authorizer")
def write_runtime(config: NodeConfig, path: str) -> str:
    """Replace the children's config file atomically (readers see the old file or the new one)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(config.to_json())
    os.replace(tmp, path)
    return path


def read_runtime(path: str) -> NodeConfig:
    with open(path, "rb") as f:
        return NodeConfig.from_json(f.read())


def reloaded(current: NodeConfig, new: NodeConfig) -> tuple[NodeConfig, list[str]]:
    """`current` with the reloadable sections of `new`, and the names of the other sections that differ."""
    ignored = [f.name for f in dataclasses.fields(NodeConfig)
               if f.name not in RELOADABLE and getattr(current, f.name) != getattr(new, f.name)]
    return dataclasses.replace(current, **{name: getattr(new, name) for name in RELOADABLE}), ignored


def reload_runtime(current: NodeConfig, path: str, log: Any) -> NodeConfig | None:
    """A child's SIGHUP: `current` with the reloadable settings of the file the supervisor rewrote, or None
    (logged) when it cannot be read."""
    try:
        new = read_runtime(path)
    except (OSError, ValueError) as exc:
        log.error("SIGHUP: cannot read %s: %s", path, exc)
        return None
    return reloaded(current, new)[0]


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"--listen wants HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)
