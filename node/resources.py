"""The node's shared resources, as the supervisor creates them and the children find them.

Invariants:
- The instance id is derived from the data directory and port, so a restart of the same node
  finds (and removes) what a crashed run left in /dev/shm before creating anything.
- The watches table (each worker's own delayed fetches per partition row) is written by each worker for
  its own row only.
- Per worker i: request ring i (worker -> timer), completion ring i (timer -> worker) and
  eventfd doorbell i (inherited by the timer and every worker: the others ring it when they append to a
  row worker i watches). Per log cleaner c: the rings of index workers + c and an eventfd doorbell of its
  own (inherited by the timer and that cleaner). One semaphore doorbell for the timer.
- One heartbeat row per child (slot 0 the timer, slot 1 + i worker i, then the cleaners'), and the
  connection counts of every worker (the node-wide connection limits); a child's rows are reset before it
  starts and after it exits (`child_starting`, `child_exited`), never while it runs.
- The partition table row of every catalogued partition is filled by recovery before any child
  starts; new partitions are added only by the timer process (topic creation). Recovery on a full
  (or failing) disk still opens the node: it says so in one line, the node serves reads, and appends
  answer KAFKA_STORAGE_ERROR until there is room again, when they resume by themselves.
- `unlink()` removes every shared object of the instance; children's mappings stay valid until
  they exit.
"""

from __future__ import annotations

import logging
import os

from shmbroker.node.config import NodeConfig
from shmbroker.node.storage.store import PartitionStore
from shmbroker.shm import instance as shm_instance
from shmbroker.shm.connections import ConnectionCounts
from shmbroker.shm.doorbell import EventfdDoorbell
from shmbroker.shm.handoff import Inbox
from shmbroker.shm.heartbeat import HeartbeatTable
from shmbroker.shm.generations import ChangeCounters
from shmbroker.shm.interest import WorkerWatches
from shmbroker.shm.stats import StatsSegment, stats_rows
from shmbroker.shm.table import PartitionTable

log = logging.getLogger("shmbroker.resources")


def _report_disk(data_dir: str, faults: dict[str, str], room_bytes: int) -> None:
    """One clear line when the node starts on a disk that takes no writes."""
    try:
        stats = os.statvfs(data_dir)
        free = stats.f_bavail * stats.f_frsize
    except OSError:
        free = -1
    if not faults and free >= room_bytes:
        return
    examples = "; ".join(f"{name}: {fault}" for name, fault in list(faults.items())[:3])
    log.warning("data directory %s is full or failing (%d bytes free%s): the node opens READ-ONLY: it "
                "serves reads and metadata, appends answer KAFKA_STORAGE_ERROR (56), and they resume by "
                "themselves once there is room", data_dir, free,
                f"; recovery met disk faults in {len(faults)} partitions: {examples}" if faults else "")


class NodeResources:
    def __init__(self, instance: shm_instance.Instance, table: PartitionTable, worker_bells: list[EventfdDoorbell],
                 heartbeats: HeartbeatTable, connections: ConnectionCounts, config: NodeConfig, data_dir: str,
                 stats: StatsSegment, inboxes: list[Inbox] | None = None,
                 cleaner_bells: list[EventfdDoorbell] | None = None) -> None:
        self.instance = instance
        self.stats = stats  # one row per process: supervisor, timer, workers (shm.stats)
        self.heartbeats = heartbeats  # one slot per child: timer 0, worker i at 1 + i (shm.heartbeat)
        self.table = table
        self.worker_bells = worker_bells
        self.cleaner_bells = cleaner_bells or []
        # Each worker's handoff inbox (shm.handoff), held here for the node's life: a connection passed to a
        # worker that died waits in it for the worker that replaces it.
        self.inboxes = inboxes or []
        self.connections = connections
        self.config = config
        self.data_dir = data_dir

    @classmethod
    def create(cls, instance_id: str, config: NodeConfig, data_dir: str) -> "NodeResources":
        instance = shm_instance.Instance.start(instance_id)  # removes a crashed run's leftovers first
        try:
            table = PartitionTable.create(shm_instance.table_name(instance_id), config.topics.max_partitions)
            store = PartitionStore(data_dir, table, config.log, config.topics.max_partitions)
            try:
                log.info("recovered %d partitions", store.recover_all())
                _report_disk(data_dir, store.recovery_faults, config.log.max_message_bytes)
            finally:
                store.close()
            workers = config.server.worker_count()
            cleaners = config.cleaner_count()
            WorkerWatches.create(shm_instance.watches_name(instance_id), workers, config.topics.max_partitions).close()
            ChangeCounters.create(shm_instance.generations_name(instance_id)).close()
            stats = StatsSegment.create(shm_instance.stats_name(instance_id), stats_rows(workers, cleaners),
                                        config.stats.committed_offsets_bytes, config.stats.transactions_bytes)
            for i in range(workers + cleaners):
                instance.create_ring(shm_instance.request_ring_name(instance_id, i), config.rings)
                instance.create_ring(shm_instance.completion_ring_name(instance_id, i), config.rings)
            instance.create_semaphore_doorbell(shm_instance.timer_doorbell_name(instance_id)).close()
            bells = [EventfdDoorbell() for _ in range(workers)]
            cleaner_bells = [EventfdDoorbell() for _ in range(cleaners)]
            inboxes = [Inbox.create() for _ in range(workers)] if workers > 1 else []
            heartbeats = HeartbeatTable.create(shm_instance.heartbeat_name(instance_id), 1 + workers + cleaners)
            connections = ConnectionCounts.create(shm_instance.connections_name(instance_id), workers,
                                                  config.server.connection_ip_buckets)
        except BaseException:
            instance.shutdown()
            raise
        return cls(instance, table, bells, heartbeats, connections, config, data_dir, stats, inboxes, cleaner_bells)

    def child_starting(self, slot: int) -> None:
        self.heartbeats.claim(slot)

    def child_exited(self, role: str, index: int, slot: int) -> None:
        """A child is gone: its heartbeat row is free and a worker's connections are closed."""
        self.heartbeats.claim(slot)
        if role == "worker":
            self.connections.reset(index)

    def flush_all(self) -> None:
        """fsync every partition (the last step of a clean stop; a partition that fails logs why)."""
        store = PartitionStore(self.data_dir, self.table, self.config.log, self.config.topics.max_partitions)
        try:
            store.flush_all()
        finally:
            store.close()

    def unlink(self) -> None:
        for bell in self.worker_bells + self.cleaner_bells:
            bell.close()
        for inbox in self.inboxes:
            inbox.close()
        self.heartbeats.close()
        self.connections.close()
        self.table.close()
        self.stats.close()
        self.instance.shutdown()
