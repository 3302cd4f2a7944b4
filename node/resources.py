"""The node's shared resources, as the supervisor creates them and the children find them.

Invariants:
- The instance id is derived from the data directory and port, so a restart of the same node
  finds (and removes) what a crashed run left in /dev/shm before creating anything.
- The interest table (delayed fetches per partition row) is written by the timer only.
- Per worker i: request ring i (worker -> timer), completion ring i (timer -> worker) and
  eventfd doorbell i (inherited by worker i and by the timer). One semaphore doorbell for the timer.
- The partition table row of every catalogued partition is filled by recovery before any child
  starts; new partitions are added only by the timer process (topic creation).
- `unlink()` removes every shared object of the instance; children's mappings stay valid until
  they exit.
"""

from __future__ import annotations

import logging

from node.config import NodeConfig
from node.storage.store import PartitionStore
from shm import instance as shm_instance
from shm.doorbell import EventfdDoorbell
from shm.heartbeat import HeartbeatTable
from shm.interest import InterestTable
from shm.stats import StatsSegment, stats_rows
from shm.table import PartitionTable

log = logging.getLogger("shmbroker.resources")


class NodeResources:
    def __init__(self, instance: shm_instance.Instance, table: PartitionTable, worker_bells: list[EventfdDoorbell],
                 config: NodeConfig, data_dir: str, stats: StatsSegment, heartbeats: HeartbeatTable) -> None:
        self.instance = instance
        self.stats = stats  # one row per process: supervisor, timer, workers (shm.stats)
        self.heartbeats = heartbeats  # one slot per child: timer 0, worker i at 1 + i (shm.heartbeat)
        self.table = table
        self.worker_bells = worker_bells
        self.config = config
        self.data_dir = data_dir

    @classmethod
    def create(cls, instance_id: str, config: NodeConfig, data_dir: str) -> "NodeResources":
        instance = shm_instance.Instance.start(instance_id)  # removes a crashed run's leftovers first
        try:
            table = PartitionTable.create(shm_instance.table_name(instance_id), config.topics.max_partitions)
            InterestTable.create(shm_instance.interest_name(instance_id), config.topics.max_partitions).close()
            store = PartitionStore(data_dir, table, config.log, config.topics.max_partitions)
            try:
                log.info("recovered %d partitions", store.recover_all())
            finally:
                store.close()
            workers = config.server.worker_count()
            stats = StatsSegment.create(shm_instance.stats_name(instance_id), stats_rows(workers))
            heartbeats = HeartbeatTable.create(shm_instance.heartbeat_name(instance_id), 1 + workers)
            for i in range(workers):
                instance.create_ring(shm_instance.request_ring_name(instance_id, i), config.rings)
                instance.create_ring(shm_instance.completion_ring_name(instance_id, i), config.rings)
            instance.create_semaphore_doorbell(shm_instance.timer_doorbell_name(instance_id)).close()
            bells = [EventfdDoorbell() for _ in range(workers)]
        except BaseException:
            instance.shutdown()
            raise
        return cls(instance, table, bells, config, data_dir, stats, heartbeats)

    def flush_all(self) -> None:
        """fsync every partition (the last step of a clean stop)."""
        store = PartitionStore(self.data_dir, self.table, self.config.log, self.config.topics.max_partitions)
        try:
            store.flush_all()
        finally:
            store.close()

    def unlink(self) -> None:
        for bell in self.worker_bells:
            bell.close()
        self.table.close()
        self.stats.close()
        self.heartbeats.close()
        self.instance.shutdown()
