"""A process's view of the node's partitions: the catalog, plus the partition logs it has opened.

Invariants:
- Every process (worker, timer, supervisor) has its own instance; logs are opened lazily, on
  first use, and closed when their topic leaves the catalog.
- A row is only used together with the (topic, partition) the catalog gives it, so a row reused
  after a deletion is never mistaken for the old partition: `reload()` closes the logs whose
  row now belongs to someone else.
"""

from __future__ import annotations

from node.storage.catalog import Catalog
from node.storage.log import LogConfig, PartitionLog, partition_directory
from shm.table import PartitionTable


class Partitions:
    def __init__(self, data_dir: str, table: PartitionTable, log_config: LogConfig, max_partitions: int) -> None:
        self.data_dir = data_dir
        self.table = table
        self.log_config = log_config
        self.catalog = Catalog.load(data_dir, max_partitions)
        self._logs: dict[int, tuple[str, int, PartitionLog]] = {}
        self._owners: dict[int, tuple[str, int]] = {}
        self._index_owners()

    def _index_owners(self) -> None:
        self._owners = {row: (t.name, p) for t in self.catalog.topics.values() for p, row in enumerate(t.rows)}

    @property
    def version(self) -> int:
        return self.catalog.version

    def reload(self) -> bool:
        """Re-read the catalog; close logs of partitions that are gone. True if it changed."""
        if not self.catalog.reload():
            return False
        self._index_owners()
        for row, (topic, partition, log) in list(self._logs.items()):
            if self._owners.get(row) != (topic, partition):
                del self._logs[row]
                log.close()
        return True

    def row(self, topic: str, partition: int) -> int | None:
        return self.catalog.partition_row(topic, partition)

    def owner(self, row: int) -> tuple[str, int] | None:
        return self._owners.get(row)

    def topic_partitions(self, topic: str) -> int | None:
        entry = self.catalog.topics.get(topic)
        return None if entry is None else entry.partitions

    def log(self, row: int) -> PartitionLog:
        entry = self._logs.get(row)
        if entry is not None:
            return entry[2]
        topic, partition = self._owners[row]
        log = PartitionLog(partition_directory(self.data_dir, topic, partition), self.table, row, self.log_config)
        self._logs[row] = (topic, partition, log)
        return log

    def open_logs(self) -> list[tuple[int, PartitionLog]]:
        return [(row, entry[2]) for row, entry in self._logs.items()]

    def all_rows(self) -> list[int]:
        return sorted(self._owners)

    def forget(self, row: int) -> None:
        entry = self._logs.pop(row, None)
        if entry is not None:
            entry[2].close()

    def close(self) -> None:
        for row in list(self._logs):
            self.forget(row)
