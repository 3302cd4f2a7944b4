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
- Every topic has a topic id (KIP-516): a random UUID made with the topic and kept in the file, never changed
  while the topic lives, unique among live topics; a topic deleted and created again gets a new one (122
  random bits: an id is never handed out twice in practice). Like Kafka's, an id is never the zero UUID and
  its base64 form never starts with "-". A catalog written before topic ids gets them from its writer
  (`assign_missing_ids`, the supervisor at start), once: saved, they stay.
"""

from __future__ import annotations

import base64
import os
import re
import uuid
from dataclasses import dataclass, field

import orjson
from kio.schema.errors import ErrorCode

from shmbroker.node.storage import formats

CATALOG_FILE = "catalog.json"
_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


class CatalogError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = int(code)


def valid_topic_name(name: str) -> bool:
    return bool(_LEGAL_NAME.match(name)) and name not in (".", "..")


def new_topic_id(taken: "set[uuid.UUID] | dict[uuid.UUID, object]" = frozenset()) -> uuid.UUID:
    """A fresh topic id: random, not zero, not starting with "-" in base64 (Kafka's rules), not in `taken`."""
    while True:
        topic_id = uuid.uuid4()
        if topic_id.int and topic_id not in taken and not topic_id_text(topic_id).startswith("-"):
            return topic_id


def topic_id_text(topic_id: uuid.UUID) -> str:
    """Kafka's text form of a topic id: URL-safe base64 of its 16 bytes, unpadded (what kafka-topics shows)."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


@dataclass
class TopicEntry:
    name: str
    rows: list[int]
    internal: bool = False  # the node's own (__consumer_offsets): clients may read it, not write or delete it
    configs: dict[str, str] = field(default_factory=dict)  # the topic's overrides (Kafka's topic config names)
    topic_id: uuid.UUID | None = None  # None only in a catalog written before topic ids, until assign_missing_ids

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
    # Per-group overrides of the consumer group protocol's settings (the GROUP config resource), by group id.
    group_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    by_id: dict[uuid.UUID, TopicEntry] = field(default_factory=dict)  # the live topics by topic id

    @property
    def path(self) -> str:
        return os.path.join(self.data_dir, CATALOG_FILE)

    @classmethod
    def load(cls, data_dir: str, max_partitions: int) -> "Catalog":
        catalog = cls(data_dir, max_partitions)
        catalog.reload()
        return catalog

    def reload_from_disk(self) -> None:
        """Forget unsaved changes: the file's catalog again."""
        self.version = 0
        self.topics = {}
        self.reload()

    def reload(self) -> bool:
        """Re-read the file; True if it changed the version."""
        try:
            with open(self.path, "rb") as f:
                raw = orjson.loads(f.read())
        except FileNotFoundError:
            return False
        formats.version_of(raw, self.path, "format", formats.CATALOG_FORMAT)
        if raw["version"] == self.version and self.topics:
            return False
        self.version = raw["version"]
        self.topics = {name: TopicEntry(name, list(t["rows"]), bool(t.get("internal", False)),
                                        dict(t.get("configs", {})), uuid.UUID(t["id"]) if "id" in t else None)
                       for name, t in raw["topics"].items()}
        self.broker_configs = dict(raw.get("broker_configs", {}))
        self.group_configs = {group: dict(configs) for group, configs in raw.get("group_configs", {}).items()}
        self._index_ids()
        return True

    def _index_ids(self) -> None:
        self.by_id = {t.topic_id: t for t in self.topics.values() if t.topic_id is not None}

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicEntry | None:
        return self.by_id.get(topic_id)

    def assign_missing_ids(self) -> int:
        """Give a topic id to every topic without one (not saved); returns how many got one."""
        missing = [t for t in self.topics.values() if t.topic_id is None]
        for entry in missing:
            entry.topic_id = new_topic_id(self.by_id)
            self.by_id[entry.topic_id] = entry
        return len(missing)

    def save(self) -> None:
        """Write the catalog with the next version; on failure (a full disk) nothing changes, not even
        the version, and no temporary file stays."""
        version = self.version + 1
        body = orjson.dumps({
            "format": formats.CATALOG_FORMAT,
            "version": version,
            "topics": {t.name: {"rows": t.rows, **({"id": str(t.topic_id)} if t.topic_id is not None else {}),
                                **({"internal": True} if t.internal else {}),
                                **({"configs": t.configs} if t.configs else {})}
                       for t in self.topics.values()},
            **({"broker_configs": self.broker_configs} if self.broker_configs else {}),
            **({"group_configs": self.group_configs} if self.group_configs else {}),
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
        entry = TopicEntry(name, (rows or self.rows_allocator()).take(partitions), internal, dict(configs or {}),
                           new_topic_id(self.by_id))
        self.topics[name] = entry
        self.by_id[entry.topic_id] = entry
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
        self.by_id.pop(entry.topic_id, None)
        return entry

    def restore_topic(self, entry: TopicEntry) -> None:
        """Put back a topic taken out by remove_topic (a deletion whose catalog write failed)."""
        self.topics[entry.name] = entry
        if entry.topic_id is not None:
            self.by_id[entry.topic_id] = entry


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
