"""The topic catalog: which topics exist, their partition count, each partition's row in the shared
partition table, each topic's config overrides, and the node-wide dynamic config overrides.

Invariants:
- One writer: the timer process (the node's single authority for topic creation and deletion),
  or the supervisor before any child runs. Every other process only reads.
- The file `<data_dir>/catalog.json` is replaced atomically (write temp, fsync, rename, fsync the
  directory), so a reader or a crash sees the old catalog or the new one, never a mix.
- `version` grows by one with every change; workers reload when a layout message names a newer
  version than theirs.
- A partition's table row is unique among live partitions; rows of deleted topics are reused.
- Topic names follow Kafka's rule: 1-249 characters of [a-zA-Z0-9._-], neither "." nor "..".
- Config overrides are stored as node.storage.topic_config checked them (canonical texts by Kafka name);
  a topic's partitions only grow (CreatePartitions appends rows).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import orjson
from kio.schema.errors import ErrorCode

CATALOG_FILE = "catalog.json"
_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


class CatalogError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = int(code)


def valid_topic_name(name: str) -> bool:
    return bool(_LEGAL_NAME.match(name)) and name not in (".", "..")


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


@dataclass
class TopicEntry:
    name: str
    rows: list[int]
    internal: bool = False  # the node's own (__consumer_offsets): clients may read it, not write or delete it
    configs: dict[str, str] = field(default_factory=dict)  # the topic's overrides (Kafka's topic config names)

    @property
    def partitions(self) -> int:
        return len(self.rows)


@dataclass
class Catalog:
    data_dir: str
    max_partitions: int
    version: int = 0
    topics: dict[str, TopicEntry] = field(default_factory=dict)
    # Node-wide dynamic overrides of topic settings (AlterConfigs on the broker resource; Kafka's broker names).
    broker_configs: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return os.path.join(self.data_dir, CATALOG_FILE)

    @classmethod
    def load(cls, data_dir: str, max_partitions: int) -> "Catalog":
        catalog = cls(data_dir, max_partitions)
        catalog.reload()
        return catalog

    def reload(self) -> bool:
        """Re-read the file; True if it changed the version."""
        try:
            with open(self.path, "rb") as f:
                raw = orjson.loads(f.read())
        except FileNotFoundError:
            return False
        if raw["version"] == self.version and self.topics:
            return False
        self.version = raw["version"]
        self.topics = {name: TopicEntry(name, list(t["rows"]), bool(t.get("internal", False)),
                                        dict(t.get("configs", {})))
                       for name, t in raw["topics"].items()}
        self.broker_configs = dict(raw.get("broker_configs", {}))
        return True

    def save(self) -> None:
        """Write the catalog with the next version; on failure (a full disk) nothing changes, not even
        the version, and no temporary file stays."""
        version = self.version + 1
        body = orjson.dumps({
            "version": version,
            "topics": {t.name: {"rows": t.rows, **({"internal": True} if t.internal else {}),
                                **({"configs": t.configs} if t.configs else {})}
                       for t in self.topics.values()},
            **({"broker_configs": self.broker_configs} if self.broker_configs else {}),
        })
        os.makedirs(self.data_dir, exist_ok=True)
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self.version = version
        dir_fd = os.open(self.data_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def used_rows(self) -> set[int]:
        return {row for t in self.topics.values() for row in t.rows}

    def partition_row(self, topic: str, partition: int) -> int | None:
        entry = self.topics.get(topic)
        if entry is None or not 0 <= partition < len(entry.rows):
            return None
        return entry.rows[partition]

    def rows_allocator(self) -> "RowAllocator":
        """Free rows for a batch of creations (one scan of the rows in use for the whole batch)."""
        return RowAllocator(self.used_rows(), self.max_partitions)

    def add_topic(self, name: str, partitions: int, internal: bool = False,
                  configs: dict[str, str] | None = None, rows: "RowAllocator | None" = None) -> TopicEntry:
        """Assign rows for a new topic (not saved). Raises CatalogError with Kafka's codes."""
        if not valid_topic_name(name):
            raise CatalogError(ErrorCode.invalid_topic_exception, f"illegal topic name {name!r}")
        if name in self.topics:
            raise CatalogError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        if partitions <= 0:
            raise CatalogError(ErrorCode.invalid_partitions, f"partitions must be positive, got {partitions}")
        entry = TopicEntry(name, (rows or self.rows_allocator()).take(partitions), internal, dict(configs or {}))
        self.topics[name] = entry
        return entry

    def add_partitions(self, name: str, total: int, rows: "RowAllocator | None" = None) -> list[int]:
        """Grow a topic to `total` partitions (not saved); returns the new partitions' rows."""
        entry = self.topics.get(name)
        if entry is None:
            raise CatalogError(ErrorCode.unknown_topic_or_partition, f"unknown topic {name!r}")
        if total < entry.partitions:
            raise CatalogError(ErrorCode.invalid_partitions, f"Topic currently has {entry.partitions} partitions, "
                                                             f"which is higher than the requested {total}.")
        if total == entry.partitions:
            raise CatalogError(ErrorCode.invalid_partitions, f"Topic already has {entry.partitions} partitions.")
        added = (rows or self.rows_allocator()).take(total - entry.partitions)
        entry.rows.extend(added)
        return added

    def remove_topic(self, name: str) -> TopicEntry:
        entry = self.topics.pop(name, None)
        if entry is None:
            raise CatalogError(ErrorCode.unknown_topic_or_partition, f"unknown topic {name!r}")
        return entry


class RowAllocator:
    """Hands out free table rows, lowest first; every row below the cursor is in use (or handed out)."""

    def __init__(self, used: set[int], max_partitions: int) -> None:
        self.used = used
        self.max_partitions = max_partitions
        self.cursor = 0

    def take(self, count: int) -> list[int]:
        """`count` free rows, or CatalogError (nothing taken) if the node does not have that many."""
        rows = []
        row = self.cursor
        while len(rows) < count and row < self.max_partitions:
            if row not in self.used:
                rows.append(row)
            row += 1
        if len(rows) < count:
            raise CatalogError(ErrorCode.invalid_partitions, f"the node holds at most {self.max_partitions} "
                                                             f"partitions ({len(self.used)} exist)")
        self.used.update(rows)
        self.cursor = row
        return rows
