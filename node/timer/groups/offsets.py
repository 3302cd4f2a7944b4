"""Committed offsets: the coordinator's table, made durable in an internal log, `__consumer_offsets`.

The log is an ordinary partition log of the node (one partition, flagged internal in the catalog, compacted
by the log cleaner: cleanup.policy compact, segments of groups.offsets_segment_bytes), written only by the
timer process and fsync'd by the flusher's group commit, as acks=all produces are. Each record:

    key    orjson [group, topic, partition]
    value  orjson [version, offset, leader_epoch, metadata, commit_ms]    a commit
           null (a tombstone)                                           a deletion (DeleteGroups, OffsetDelete,
                                                                        expiry)

Beside commits, the log keeps the state of groups that have one to keep (streams groups, KIP-1071:
node.timer.groups.streams), one record per group, versioned like commits:

    key    orjson ["streams-group", group]         (two elements: an older node skips it as unreadable)
    value  orjson [version, state]                  the group's latest snapshot (its own format version inside)
           null (a tombstone)                       the group is gone

Share groups (KIP-932: node.timer.groups.share) keep their membership alike, one record per group:

    key    orjson ["share-group", group]          (two elements: an older node skips it as unreadable)
    value  orjson [version, state]                  the group's latest snapshot (its epoch and members)
           null (a tombstone)                       the group is gone

And the state of each share-partition, versioned alike (its format: node.storage.share_records):

    key    orjson ["share-partition", group, topic, partition]   (four elements: an older node skips it)
    value  orjson [version, state]                               its latest state (own format version inside)
           null (a tombstone)                                    the share group was deleted

`version` is a logical clock: one more than the highest seen, per record written; load keeps, per key, the
record of the highest version (logs written before the log cleaner held rewrites out of order), and a
tombstone deletes its key.

Lifecycle:
- load (at start, a bounded slice per loop turn, so the timer keeps serving): the table is rebuilt from the
  log; meanwhile `loading` is True and the coordinator answers COORDINATOR_LOAD_IN_PROGRESS;
- commit: one batch appended per request; the table changes only once the batch is fsync'd (then the
  coordinator answers), so nothing is ever visible that a crash could take back;
- compaction: the log cleaner's, as of every compacted topic (node.storage.cleaner): the latest record of
  each key stays, tombstones go after delete.retention.ms;
- expiry (a chore): offsets of a group empty for `offsets_retention_minutes`, or, for a group that never had
  members, committed longer ago than that, are deleted (Kafka's KIP-211).

Invariants: the table holds exactly the durable, undeleted entries of the highest version per key; every
acknowledged commit is in an fsync'd batch; versions never repeat.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from shmbroker.node.storage.records import (BATCH_HEADER_SIZE, LENGTH_FIELDS_SIZE, OFFSET_AND_LENGTH, ErrorCode,
                                            StorageError, build_batch, iter_records, parse_header)
from shmbroker.node.storage.share_records import SHARE_STATE, ShareKey, apply_versioned, share_state_key
from shmbroker.node.storage.store import TOPIC_RESOURCE, PartitionStore

log = logging.getLogger("shmbroker.offsets")

OFFSETS_TOPIC = "__consumer_offsets"
# Records per batch the node writes: well below the log's max.message.bytes for any sane metadata string.
RECORDS_PER_BATCH = 500

Key = tuple[str, str, int]  # group, topic, partition
GROUP_STATE = "streams-group"  # the first element of a group state record's key
SHARE_GROUP_STATE = "share-group"  # the first element of a share group's state record's key


@dataclass(frozen=True)
class OffsetEntry:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_ms: int
    version: int


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class OffsetStore:
    def __init__(self, store: PartitionStore, wait_flushed: Callable, submit_io: Callable, *,
                 load_bytes_per_turn: int, load_interval_ms: int, segment_bytes: int, commit_timeout_ms: int) -> None:
        self.store = store
        self._wait_flushed = wait_flushed  # (rows, offsets, deadline_ms, callback(flushed, fault)) -> None
        self._submit_io = submit_io  # (name, job(store)) -> None: runs on the flusher thread
        self.load_bytes_per_turn = load_bytes_per_turn
        self.load_interval_ms = load_interval_ms
        self._next_load_ms = 0
        self.live = 0  # entries in the table
        self.commit_timeout_ms = commit_timeout_ms
        self.table: dict[str, dict[tuple[str, int], OffsetEntry]] = {}
        self.version = 0
        self.loading = True
        self.records = 0  # records read by the load
        self._load_offset = 0
        self._versions: dict[Key, int] = {}  # during load: highest version per key, deletions included
        self.group_states: dict[str, Any] = {}  # group -> its latest state (streams groups)
        self._state_versions: dict[str, int] = {}  # during load: highest version per group state, deletions included
        self.share_group_states: dict[str, Any] = {}  # group -> its latest state (share groups' membership)
        self._share_group_versions: dict[str, int] = {}  # during load: highest version per share group state
        self.share_states: dict[ShareKey, Any] = {}  # share-partition -> its latest state (share groups)
        self._share_versions: dict[ShareKey, int] = {}  # during load: highest version per share state
        settings = {"cleanup.policy": "compact", "segment.bytes": str(segment_bytes)}
        created = store.create_topics([(OFFSETS_TOPIC, 1, settings)], internal=True)
        code, message = created[OFFSETS_TOPIC]
        if code:
            raise RuntimeError(f"cannot create {OFFSETS_TOPIC}: {message}")
        if store.topic_configs(OFFSETS_TOPIC) != settings:  # a data directory from before, or another setting
            (code, message), = store.alter_configs([(TOPIC_RESOURCE, OFFSETS_TOPIC, "replace", settings)],
                                                   internal=True)
            if code:
                raise RuntimeError(f"cannot set the configs of {OFFSETS_TOPIC}: {message}")
        self.row = store.row(OFFSETS_TOPIC, 0)
        self._load_offset = store.log(self.row).state().log_start_offset

    # -- load ---------------------------------------------------------------------------------

    def load_step(self, now_ms: int) -> bool:
        """Load the next slice of the log (at most one per load_interval_ms); True once everything is loaded
        (then the table is complete)."""
        if not self.loading:
            return True
        if now_ms < self._next_load_ms:
            return False
        self._next_load_ms = now_ms + self.load_interval_ms
        plog = self.store.log(self.row)
        state = plog.state()
        if self._load_offset >= state.log_end_offset:
            self._finish_load()
            return True
        piece = plog.read(self._load_offset, self.load_bytes_per_turn)
        for fd, position, length in piece.ranges:
            data = os.pread(fd, length, position)
            self._apply_batches(data)
        if not piece.ranges:  # the read found nothing although the end is further: skip a gap
            self._load_offset = state.log_end_offset
        return False

    def _apply_batches(self, data: bytes) -> None:
        position = 0
        while position + BATCH_HEADER_SIZE <= len(data):
            base, length = OFFSET_AND_LENGTH.unpack_from(data, position)
            end = position + LENGTH_FIELDS_SIZE + length
            batch = data[position:end]
            header = parse_header(batch)
            for offset, key, value in iter_records(batch, header):
                self.records += 1
                self._apply_record(key, value)
                self._load_offset = offset + 1
            position = end

    def _apply_record(self, key: bytes | None, value: bytes | None) -> None:
        try:
            decoded_key = orjson.loads(key)
            if isinstance(decoded_key, list) and len(decoded_key) == 2 and decoded_key[0] == GROUP_STATE:
                return self._apply_versioned(str(decoded_key[1]), value, self.group_states, self._state_versions)
            if isinstance(decoded_key, list) and len(decoded_key) == 2 and decoded_key[0] == SHARE_GROUP_STATE:
                return self._apply_versioned(str(decoded_key[1]), value, self.share_group_states,
                                             self._share_group_versions)
            share_key = share_state_key(decoded_key)
            if share_key is not None:
                return self._apply_versioned(share_key, value, self.share_states, self._share_versions)
            group, topic, partition = decoded_key
            full_key = (str(group), str(topic), int(partition))
            if value is None:  # a tombstone: the key is gone, whatever came before it
                self._versions.pop(full_key, None)
                self.table.get(full_key[0], {}).pop(full_key[1:], None)
                return
            fields = orjson.loads(value)
            version = int(fields[0])
        except (orjson.JSONDecodeError, TypeError, ValueError, IndexError):
            log.warning("skipping an unreadable record in %s", OFFSETS_TOPIC)
            return
        self.version = max(self.version, version)
        if version <= self._versions.get(full_key, -1):
            return
        self._versions[full_key] = version
        offsets = self.table.setdefault(full_key[0], {})
        if len(fields) == 1:
            offsets.pop(full_key[1:], None)
        else:
            offsets[full_key[1:]] = OffsetEntry(int(fields[1]), int(fields[2]), fields[3], int(fields[4]), version)

    def _apply_versioned(self, key: Any, value: bytes | None, states: dict, versions: dict) -> None:
        """A group's or a share-partition's state record into `states` (apply_versioned), the log's version
        clock past its version."""
        version = apply_versioned(key, value, states, versions)
        if version is not None:
            self.version = max(self.version, version)

    def _finish_load(self) -> None:
        self.loading = False
        self._versions = {}
        self._state_versions = {}
        self._share_group_versions = {}
        self._share_versions = {}
        self.table = {group: offsets for group, offsets in self.table.items() if offsets}
        self.live = sum(len(offsets) for offsets in self.table.values())
        log.info("loaded %d committed offsets of %d groups from %d records", self.live_entries(), len(self.table),
                 self.records)

    # -- reads --------------------------------------------------------------------------------

    def live_entries(self) -> int:
        return self.live

    def next_load_ms(self) -> int | None:
        return self._next_load_ms if self.loading else None

    def groups(self) -> list[str]:
        return list(self.table)

    def fetch(self, group: str, partitions: list[tuple[str, int]] | None) -> dict[tuple[str, int], OffsetEntry | None]:
        """Committed entries of `group` (None for a partition with none); partitions None: all it has."""
        offsets = self.table.get(group, {})
        if partitions is None:
            return dict(offsets)
        return {tp: offsets.get(tp) for tp in partitions}

    # -- writes -------------------------------------------------------------------------------

    def commit(self, group: str, entries: dict[tuple[str, int], tuple[int, int, str | None]], now_ms: int,
               done: Callable[[bool, bool], None]) -> None:
        """Append the commits of one request; `done(True, False)` once fsync'd and visible, `done(False, fault)`
        if the append or fsync met a storage fault (fault True) or the fsync did not come within
        commit_timeout_ms (then nothing changed)."""
        commit_ms = wall_ms()
        written: dict[tuple[str, int], OffsetEntry] = {}
        records = []
        for (topic, partition), (offset, leader_epoch, metadata) in entries.items():
            self.version += 1
            entry = OffsetEntry(offset, leader_epoch, metadata, commit_ms, self.version)
            written[(topic, partition)] = entry
            records.append((orjson.dumps([group, topic, partition]),
                            orjson.dumps([entry.version, offset, leader_epoch, metadata, commit_ms])))

        def durable(flushed: bool, fault: bool = False) -> None:
            if flushed:
                offsets = self.table.setdefault(group, {})
                self.live += sum(1 for tp in written if tp not in offsets)
                offsets.update(written)
            done(flushed, fault)

        self._append(records, now_ms, durable)

    def delete(self, group: str, partitions: list[tuple[str, int]] | None, now_ms: int,
               done: Callable[..., None] | None = None) -> list[tuple[str, int]]:
        """Delete `group`'s offsets of `partitions` (None: all); returns those that existed. They vanish from the
        table at once (deletion only ever hides data); `done` hears when the tombstones are fsync'd."""
        offsets = self.table.get(group, {})
        doomed = [tp for tp in (list(offsets) if partitions is None else partitions) if tp in offsets]
        records = []
        self.live -= len(doomed)
        for topic, partition in doomed:
            del offsets[(topic, partition)]
            self.version += 1
            records.append((orjson.dumps([group, topic, partition]), None))
        if not offsets:
            self.table.pop(group, None)
        if records:
            self._append(records, now_ms, done or (lambda flushed, fault=False: None))
        elif done is not None:
            done(True)
        return doomed

    def write_group_state(self, group: str, state: Any, now_ms: int, kind: str = GROUP_STATE) -> None:
        """Append `group`'s state (None: a tombstone) as a streams group's (kind GROUP_STATE) or a share group's
        (SHARE_GROUP_STATE); it is fsync'd with the log's next flush, and a storage fault is logged: the group's
        members rejoin after a restart that lost it."""
        states = self.group_states if kind == GROUP_STATE else self.share_group_states
        self.version += 1
        if state is None:
            states.pop(group, None)
            record = (orjson.dumps([kind, group]), None)
        else:
            states[group] = state
            record = (orjson.dumps([kind, group]), orjson.dumps([self.version, state]))
        self._append([record], now_ms, lambda flushed, fault=False: None)

    def when_durable(self, now_ms: int, done: Callable[[bool], None]) -> None:
        """done(True) once every record appended to the log so far is fsync'd, done(False) at the commit timeout or
        on a disk fault: through the flusher's group commit, as a commit's."""
        end = self.store.table.read(self.row).log_end_offset
        self._wait_flushed([self.row], [end], now_ms + self.commit_timeout_ms,
                           lambda flushed, fault=False: done(flushed and not fault))

    def write_share_states(self, states: list[tuple[ShareKey, Any]], now_ms: int,
                           done: Callable[[bool], None] | None = None) -> None:
        """Append share-partitions' states (None: a tombstone) in one batch, each under its own version, as
        write_group_state does a group's; done(True), if given, once they are fsync'd, done(False) at the commit
        timeout or on a disk fault."""
        records = []
        for key, state in states:
            self.version += 1
            record_key = orjson.dumps([SHARE_STATE, *key])
            if state is None:
                self.share_states.pop(key, None)
                records.append((record_key, None))
            else:
                self.share_states[key] = state
                records.append((record_key, orjson.dumps([self.version, state])))
        self._append(records, now_ms, (lambda flushed, fault=False: None) if done is None
                     else (lambda flushed, fault=False: done(flushed and not fault)))

    def _append(self, records: list[tuple[bytes, bytes | None]], now_ms: int, done: Callable[..., None]) -> None:
        plog = self.store.log(self.row)
        last = None
        try:
            for start in range(0, len(records), RECORDS_PER_BATCH):
                appended = plog.append(build_batch(records[start:start + RECORDS_PER_BATCH], wall_ms()))
                last = appended.last_offset
        except StorageError as exc:
            if exc.error_code != ErrorCode.KAFKA_STORAGE_ERROR:  # a disk fault was logged by the partition
                log.error("cannot append to %s: %s", OFFSETS_TOPIC, exc)
            done(False, exc.error_code == ErrorCode.KAFKA_STORAGE_ERROR)
            return
        self._wait_flushed([self.row], [last + 1], now_ms + self.commit_timeout_ms, done)

    # -- expiry -------------------------------------------------------------------------------

    def expire(self, now_wall_ms: int, retention_ms: int, empty_since_wall_ms: Callable[[str], Any], now_ms: int) -> int:
        """Delete expired offsets; `empty_since_wall_ms(group)` is when the group became empty (wall ms), None
        while it has members, or -1 if it never had any (then each offset expires by its commit time)."""
        expired = 0
        for group in list(self.table):
            since = empty_since_wall_ms(group)
            if since is None:
                continue
            offsets = self.table[group]
            if since >= 0:
                doomed = list(offsets) if now_wall_ms - since >= retention_ms else []
            else:
                doomed = [tp for tp, e in offsets.items() if now_wall_ms - e.commit_ms >= retention_ms]
            expired += len(self.delete(group, doomed, now_ms)) if doomed else 0
        return expired
