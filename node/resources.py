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

import hashlib
import logging
import os

from node.storage.catalog import Catalog
from node.config import NodeConfig
from node.storage.log import PartitionLog, partition_directory
from shm import instance as shm_instance
from shm.doorbell import EventfdDoorbell
from shm.interest import InterestTable
from shm.ring import RingConfig
from shm.table import PartitionTable

log = logging.getLogger("shmbroker.resources")


def instance_id_for(data_dir: str, port: int) -> str:
    digest = hashlib.sha1(f"{os.path.realpath(data_dir)}:{port}".encode()).hexdigest()
    return digest[:16]


def table_name(instance: str) -> str:
    return shm_instance.object_name(instance, "partitions")


def interest_name(instance: str) -> str:
    return shm_instance.object_name(instance, "interest")


def ring_config(config: NodeConfig) -> RingConfig:
    return RingConfig(capacity=config.timer.ring_bytes)


def recover_partitions(data_dir: str, table: PartitionTable, config: NodeConfig) -> int:
    """Recover every catalogued partition and fill its table row; returns how many."""
    catalog = Catalog.load(data_dir, config.topics.max_partitions)
    count = 0
    for topic in catalog.topics.values():
        for partition, row in enumerate(topic.rows):
            PartitionLog.recover(partition_directory(data_dir, topic.name, partition), table, row, config.log).close()
            count += 1
    return count


class NodeResources:
    def __init__(self, instance: shm_instance.Instance, table: PartitionTable, worker_bells: list[EventfdDoorbell],
                 config: NodeConfig, data_dir: str) -> None:
        self.instance = instance
        self.table = table
        self.worker_bells = worker_bells
        self.config = config
        self.data_dir = data_dir

    @classmethod
    def create(cls, instance_id: str, config: NodeConfig, data_dir: str) -> "NodeResources":
        instance = shm_instance.Instance.start(instance_id)  # removes a crashed run's leftovers first
        try:
            table = PartitionTable.create(table_name(instance_id), config.topics.max_partitions)
            InterestTable.create(interest_name(instance_id), config.topics.max_partitions).close()
            recovered = recover_partitions(data_dir, table, config)
            log.info("recovered %d partitions", recovered)
            workers = config.server.worker_count()
            for i in range(workers):
                instance.create_ring(shm_instance.request_ring_name(instance_id, i), ring_config(config))
                instance.create_ring(shm_instance.completion_ring_name(instance_id, i), ring_config(config))
            instance.create_semaphore_doorbell(shm_instance.timer_doorbell_name(instance_id)).close()
            bells = [EventfdDoorbell() for _ in range(workers)]
        except BaseException:
            instance.shutdown()
            raise
        return cls(instance, table, bells, config, data_dir)

    def child_args(self, role: str, index: int) -> tuple[list[str], list[int]]:
        """(extra command-line args, fds to pass) for a child."""
        if role == "timer":
            fds = [bell.fileno() for bell in self.worker_bells]
            return ["--worker-bell-fds", ",".join(map(str, fds))], fds
        fd = self.worker_bells[index].fileno()
        return ["--bell-fd", str(fd)], [fd]

    def flush_all(self) -> None:
        """fsync every partition (the last step of a clean stop)."""
        catalog = Catalog.load(self.data_dir, self.config.topics.max_partitions)
        for topic in catalog.topics.values():
            for partition, row in enumerate(topic.rows):
                plog = PartitionLog(partition_directory(self.data_dir, topic.name, partition), self.table, row,
                                    self.config.log)
                try:
                    plog.flush()
                finally:
                    plog.close()

    def unlink(self) -> None:
        for bell in self.worker_bells:
            bell.close()
        self.table.close()
        self.instance.shutdown()
