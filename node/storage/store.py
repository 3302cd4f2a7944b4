"""The partition store: one process's view of the node's partitions, and the one API every process uses
to create, recover, delete, flush and iterate them (the catalog plus the partition logs it has opened).

Who calls what:
- the supervisor, alone, before any child starts: `recover_all()`; after the children stopped: `flush_all()`;
- the timer process's controller: `create_topics()`, `delete_topics()` (the node's only catalog writer);
- the flusher: `dirty_rows()`, `log(row).flush()`; the chores: `each_log()`;
- workers: `row()`, `log()`, `topic_partitions()`, `reload()` when the layout changes.

Invariants:
- Every process has its own store; logs are opened lazily, on first use, and closed when their topic
  leaves the catalog.
- A row is only used together with the (topic, partition) the catalog gives it, so a row reused after a
  deletion is never mistaken for the old partition: `reload()` closes the logs whose row now belongs to
  someone else.
- Topic creation: partition directories and table rows first (recovered, so online), then the catalog
  file, atomically; deletion: the catalog first (a crash never leaves a catalogued topic half deleted),
  then the rows go offline and the directories are removed.
- Disk faults (node.storage.faults) never escape as OSError: a topic that cannot be created or deleted
  gets KAFKA_STORAGE_ERROR in its outcome (and a creation leaves nothing behind: not in the catalog,
  its directories removed); recovery, flushes and chores carry on with the other partitions (the
  partition logs the fault itself, rate-limited); a partition that cannot be recovered at all stays
  offline and is named in `recovery_faults`.
"""

from __future__ import annotations

import logging
import shutil
from typing import Callable

import numpy as np
from kio.schema.errors import ErrorCode

from node.storage.catalog import Catalog, CatalogError
from node.storage.faults import is_storage_fault, storage_faults
from node.storage.log import LogConfig, PartitionLog, partition_directory
from node.storage.records import StorageError
from shm.table import PartitionTable

log = logging.getLogger("shmbroker.store")

# Per topic: (Kafka error code, message or None).
TopicOutcomes = dict[str, tuple[int, str | None]]


class PartitionStore:
    def __init__(self, data_dir: str, table: PartitionTable, log_config: LogConfig, max_partitions: int) -> None:
        self.data_dir = data_dir
        self.table = table
        self.log_config = log_config
        self.catalog = Catalog.load(data_dir, max_partitions)
        self._logs: dict[int, tuple[str, int, PartitionLog]] = {}
        self._owners: dict[int, tuple[str, int]] = {}
        # After recover_all: partitions recovered despite disk faults (or not at all), with the first fault.
        self.recovery_faults: dict[str, str] = {}
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
        self._reindex()
        return True

    def _reindex(self) -> None:
        self._index_owners()
        for row, (topic, partition, plog) in list(self._logs.items()):
            if self._owners.get(row) != (topic, partition):
                del self._logs[row]
                plog.close()

    # -- lookups ------------------------------------------------------------------------------

    def row(self, topic: str, partition: int) -> int | None:
        return self.catalog.partition_row(topic, partition)

    def topic_partitions(self, topic: str) -> int | None:
        entry = self.catalog.topics.get(topic)
        return None if entry is None else entry.partitions

    def rows(self) -> list[int]:
        """Every catalogued partition's row, ascending."""
        return sorted(self._owners)

    def log(self, row: int) -> PartitionLog:
        entry = self._logs.get(row)
        if entry is not None:
            return entry[2]
        topic, partition = self._owners[row]
        plog = PartitionLog(self._directory(topic, partition), self.table, row, self.log_config)
        self._logs[row] = (topic, partition, plog)
        return plog

    def each_log(self, action: Callable[[PartitionLog], object], what: str) -> int:
        """Run `action` on every partition's log; a failure is logged and the others go on. Returns failures.
        A storage fault was logged (rate-limited) by the partition already; anything else is a bug."""
        failures = 0
        for row in self.rows():
            try:
                action(self.log(row))
            except StorageError as exc:
                failures += 1
                if exc.error_code != ErrorCode.kafka_storage_error:
                    log.warning("%s of partition row %d failed: %s", what, row, exc)
            except Exception:
                failures += 1
                log.exception("%s of partition row %d failed", what, row)
        return failures

    def dirty_rows(self) -> list[int]:
        """Rows with appends not yet fsync'd (end_bytes > flushed_bytes in the table), in one vectorised read."""
        rows = self.rows()
        if not rows:
            return []
        state = self.table.read_rows(np.asarray(rows, dtype=np.int64))
        return [rows[i] for i in np.flatnonzero(state["end_bytes"] > state["flushed_bytes"])]

    def _directory(self, topic: str, partition: int) -> str:
        return partition_directory(self.data_dir, topic, partition)

    # -- lifecycle ----------------------------------------------------------------------------

    def recover_all(self) -> int:
        """Recover every catalogued partition and fill its table row (the supervisor, before any child runs).
        Returns how many partitions are online; `recovery_faults` names those that met disk faults."""
        self.recovery_faults = {}
        online = 0
        for row in self.rows():
            online += self._recover(row)
        return online

    def _recover(self, row: int) -> bool:
        topic, partition = self._owners[row]
        name = f"{topic}-{partition}"
        stale = self._logs.pop(row, None)
        if stale is not None:
            stale[2].close()
        try:
            plog = PartitionLog.recover(self._directory(topic, partition), self.table, row, self.log_config)
        except OSError as exc:
            if not is_storage_fault(exc):
                raise
            self.recovery_faults[name] = f"not recovered, stays offline: {exc}"
            return False
        if plog.faults:
            self.recovery_faults[name] = str(plog.faults[0])
        self._logs[row] = (topic, partition, plog)
        return True

    def flush_all(self) -> int:
        """fsync every partition (the last step of a clean stop). Returns the partitions that failed."""
        return self.each_log(lambda plog: plog.flush(), "flush")

    def create_topics(self, topics: list[tuple[str, int]]) -> TopicOutcomes:
        """Create topics of the given partition counts; an existing topic succeeds (two workers auto-creating
        the same topic both get it). One catalog write for the whole batch."""
        self.reload()
        outcome: TopicOutcomes = {}
        created = []
        for name, count in topics:
            if name in self.catalog.topics:
                outcome[name] = (0, None)
                continue
            try:
                entry = self.catalog.add_topic(name, count)
            except CatalogError as exc:
                outcome[name] = (exc.code, str(exc))
                continue
            try:
                with storage_faults(f"creation of topic {name}"):
                    for partition, row in enumerate(entry.rows):
                        PartitionLog.recover(self._directory(name, partition), self.table, row,
                                             self.log_config).close()
            except StorageError as exc:
                self.catalog.remove_topic(name)
                self._discard_directories(entry)
                outcome[name] = self._storage_outcome(exc)
                continue
            created.append(name)
            outcome[name] = (0, None)
        if created:
            try:
                with storage_faults("save of the topic catalog"):
                    self.catalog.save()
            except StorageError as exc:
                for name in created:
                    self._discard_directories(self.catalog.remove_topic(name))
                    outcome[name] = self._storage_outcome(exc)
                return outcome
            self._reindex()
            log.info("created topics %s", created)
        return outcome

    def _discard_directories(self, entry) -> None:
        for partition in range(entry.partitions):
            shutil.rmtree(self._directory(entry.name, partition), ignore_errors=True)

    def _storage_outcome(self, exc: StorageError) -> tuple[int, str]:
        log.warning("%s: answering KAFKA_STORAGE_ERROR (56)", exc)
        return (int(ErrorCode.kafka_storage_error), str(exc))

    def delete_topics(self, names: list[str]) -> TopicOutcomes:
        self.reload()
        outcome: TopicOutcomes = {}
        doomed = []
        for name in names:
            try:
                doomed.append(self.catalog.remove_topic(name))
            except CatalogError as exc:
                outcome[name] = (int(ErrorCode.unknown_topic_or_partition), str(exc))
                continue
            outcome[name] = (0, None)
        if doomed:
            try:
                with storage_faults("save of the topic catalog"):
                    # First forget the topic, so a crash never leaves a catalogued topic half deleted.
                    self.catalog.save()
            except StorageError as exc:
                for entry in doomed:
                    self.catalog.topics[entry.name] = entry
                    outcome[entry.name] = self._storage_outcome(exc)
                return outcome
            for entry in doomed:
                for partition, row in enumerate(entry.rows):
                    stale = self._logs.pop(row, None)
                    if stale is not None:
                        stale[2].close()
                    PartitionLog(self._directory(entry.name, partition), self.table, row, self.log_config).delete()
            self._reindex()
            log.info("deleted topics %s", [e.name for e in doomed])
        return outcome

    def close(self) -> None:
        for _, _, plog in self._logs.values():
            plog.close()
        self._logs.clear()
