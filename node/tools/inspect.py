"""Reading a running node from the outside, without a request to it: `shmbroker stats`, the dashboard, /metrics.

A node is found by its data directory: every running node keeps its children's config file in its instance's
shared memory (shm.instance.config_path), which names the data directory and the port; data directory and
port give the instance id (shm.instance.instance_id_for) and so the names of its shared segments. Everything
is mapped read-only.

Invariants: a reader never writes to the node's memory or files; a node that is gone (no live lease, no
segment) raises NodeNotRunning, whatever state the files are in; a snapshot is one consistent copy per row
(shm.stats), taken at one moment per row, not across rows.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import posix_ipc
from kio.schema.errors import ErrorCode

from shmbroker.node import config as node_config
from shmbroker.node.storage.catalog import Catalog
from shmbroker.shm import instance as shm_instance
from shmbroker.shm import stats as S
from shmbroker.shm.table import PartitionTable

# Kafka API keys the node serves, by name (for tables and metric labels).
API_NAMES = {
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit", 9: "OffsetFetch",
    10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat", 13: "LeaveGroup", 14: "SyncGroup",
    15: "DescribeGroups", 16: "ListGroups", 18: "ApiVersions", 19: "CreateTopics", 20: "DeleteTopics",
    21: "DeleteRecords", 22: "InitProducerId", 24: "AddPartitionsToTxn", 25: "AddOffsetsToTxn", 26: "EndTxn",
    27: "WriteTxnMarkers",
    28: "TxnOffsetCommit", 32: "DescribeConfigs", 33: "AlterConfigs", 37: "CreatePartitions", 42: "DeleteGroups",
    44: "IncrementalAlterConfigs", 47: "OffsetDelete", 17: "SaslHandshake", 29: "DescribeAcls", 30: "CreateAcls",
    31: "DeleteAcls", 36: "SaslAuthenticate", 60: "DescribeCluster", 61: "DescribeProducers",
    65: "DescribeTransactions", 66: "ListTransactions", 68: "ConsumerGroupHeartbeat", 69: "ConsumerGroupDescribe",
    50: "DescribeUserScramCredentials", 51: "AlterUserScramCredentials", 48: "DescribeClientQuotas",
    55: "DescribeQuorum", 76: "ShareGroupHeartbeat", 77: "ShareGroupDescribe", 78: "ShareFetch", 79: "ShareAcknowledge",
    88: "StreamsGroupHeartbeat", 89: "StreamsGroupDescribe", 90: "DescribeShareGroupOffsets",
    91: "AlterShareGroupOffsets", 92: "DeleteShareGroupOffsets",
}


def api_name(key: int) -> str:
    return API_NAMES.get(key, f"api{key}")


def named_counts(row: Any, field_name: str, name_of: Callable[[int], str]) -> Iterator[tuple[str, int]]:
    """(name, value) of every non-zero entry of a row's per-key array (per API, per error code)."""
    for key, value in enumerate(row.array(field_name).tolist()):
        if value:
            yield name_of(key), value


def error_name(code: int) -> str:
    """Kafka's name of an error code (UNKNOWN_TOPIC_OR_PARTITION); the stats' last slot gathers the rest."""
    if code >= S.MAX_ERROR_CODES - 1:
        return f"CODE_{S.MAX_ERROR_CODES - 1}_OR_ABOVE"
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"CODE_{code}"


# The states of a transaction open or completing, as the timer publishes them (TxnState's values).
OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort")
PER_API_FIELDS = ("requests", "request_errors", "error_responses", "bytes_in", "bytes_out", "authorization_denials")


class NodeNotRunning(RuntimeError):
    """No node runs with this data directory (or its stats are disabled)."""


@dataclass
class NodeLocation:
    data_dir: str
    host: str
    port: int
    instance: str
    supervisor_pid: int


def locate(data_dir: str) -> NodeLocation:
    """The live node serving `data_dir`, found by the config file each running node keeps in its instance's
    shared memory (shm.instance.config_path)."""
    data_dir = os.path.abspath(data_dir)
    for path in shm_instance.config_paths():
        try:
            config = node_config.read_runtime(path)
        except (OSError, ValueError):
            continue  # a node stopping meanwhile, or another version's file
        if os.path.abspath(config.server.data_dir) != data_dir:
            continue
        instance = shm_instance.instance_id_for(data_dir, config.server.port)
        lease = shm_instance.read_lease(instance)
        if lease is not None and shm_instance.instance_is_live(instance):
            return NodeLocation(data_dir, config.server.host, config.server.port, instance, lease[0])
    raise NodeNotRunning(f"no node is running with data directory {data_dir}")


class NodeReader:
    """Read-only mappings of one running node's stats segment and partition table."""

    def __init__(self, location: NodeLocation) -> None:
        self.location = location
        try:
            self.stats = S.StatsSegment.attach(shm_instance.stats_name(location.instance), writable=False)
        except posix_ipc.ExistentialError:
            raise NodeNotRunning(f"the node with data directory {location.data_dir} has no stats segment "
                                 "(stopping, or an older version)") from None
        try:
            self.table: PartitionTable | None = PartitionTable.attach(shm_instance.table_name(location.instance))
        except (posix_ipc.ExistentialError, ValueError):
            self.table = None
        self.catalog = Catalog(location.data_dir, self.table.rows if self.table is not None else 0)

    @classmethod
    def open(cls, data_dir: str) -> "NodeReader":
        return cls(locate(data_dir))

    def rows(self) -> list[S.RowSnapshot]:
        return self.stats.snapshot()

    def listener_names(self) -> list[str]:
        """The node's listeners in its config's order (the order of the per-listener counts); [] if unreadable."""
        try:
            config = node_config.read_runtime(shm_instance.config_path(self.location.instance))
        except (OSError, ValueError):
            return []
        return [listener.name for listener in config.listener_list()]

    def sasl_logins(self, rows: list[S.RowSnapshot] | None = None) -> list[dict]:
        """Per listener and mechanism with any: logins and failures, summed over the workers."""
        names = self.listener_names()
        totals: dict[tuple[str, str], list[int]] = {}
        for row in rows if rows is not None else self.rows():
            if row.role != "worker":
                continue
            for slot, (logins, failures) in enumerate(zip(row.array("sasl_logins_by_listener").tolist(),
                                                          row.array("sasl_login_failures_by_listener").tolist())):
                if logins or failures:
                    listener, mechanism = divmod(slot, len(S.SASL_MECHANISMS))
                    key = (names[listener] if listener < len(names) else str(listener), S.SASL_MECHANISMS[mechanism])
                    counts = totals.setdefault(key, [0, 0])
                    counts[0] += logins
                    counts[1] += failures
        return [{"listener": listener, "mechanism": mechanism, "logins": counts[0], "failures": counts[1]}
                for (listener, mechanism), counts in sorted(totals.items())]

    def denials_by_principal(self, rows: list[S.RowSnapshot] | None = None) -> list[dict]:
        """Per principal and API with any: the authorizer's refusals, summed over the workers (their rows' areas)."""
        totals: dict[tuple[str, int], int] = {}
        for row in rows if rows is not None else self.rows():
            if row.role != "worker":
                continue
            document, _ = self.stats.denials_by_principal[row.row].read()
            for principal, apis in document.items():
                for api, count in apis.items():
                    totals[(principal, int(api))] = totals.get((principal, int(api)), 0) + count
        return [{"principal": principal, "api": api_name(api), "denials": count}
                for (principal, api), count in sorted(totals.items())]

    def partitions(self) -> list[dict]:
        """Per partition: log start and end, high watermark, bytes not yet fsync'd (from the partition table); for a
        compacted one, its cleaning (the table's cleaning words: dirty ratio, lag, last run, bytes cleaned and
        reclaimed, errors)."""
        if self.table is None:
            return []
        self.catalog.reload()
        out = []
        for topic in sorted(self.catalog.topics.values(), key=lambda t: t.name):
            for partition, row in enumerate(topic.rows):
                if not 0 <= row < self.table.rows:
                    continue
                state = self.table.read(row)
                entry = {"topic": topic.name, "partition": partition, "log_start_offset": state.log_start_offset,
                         "log_end_offset": state.log_end_offset, "high_watermark": state.high_watermark,
                         "last_stable_offset": state.last_stable_offset,
                         "unflushed_bytes": state.end_bytes - state.flushed_bytes}
                cleaning = self.table.cleaning(row)
                if "compact" in topic.configs.get("cleanup.policy", "") or any(cleaning):
                    entry["cleaning"] = {"dirty_ratio": cleaning.dirty_ratio_ppm / 1_000_000,
                                         "lag_ms": cleaning.lag_ms, "last_run_ms": cleaning.last_run_ms,
                                         "bytes_cleaned": cleaning.bytes_cleaned,
                                         "bytes_reclaimed": cleaning.bytes_reclaimed, "errors": cleaning.errors}
                out.append(entry)
        return out

    def group_lag(self) -> tuple[dict[str, list[dict]], bool]:
        """Per group, per partition it committed: the committed offset (from the stats segment, written by the
        timer), the high watermark (the partition table) and the lag; and whether every group fit the segment."""
        committed, complete = self.stats.read_committed()
        if self.table is None:
            return {}, complete
        self.catalog.reload()
        out: dict[str, list[dict]] = {}
        for group, entries in sorted(committed.items()):
            rows = []
            for topic, partition, offset in sorted(entries):
                entry = self.catalog.topics.get(topic)
                high = None
                if entry is not None and partition < len(entry.rows) and 0 <= entry.rows[partition] < self.table.rows:
                    high = self.table.read(entry.rows[partition]).high_watermark
                rows.append({"topic": topic, "partition": partition, "committed_offset": offset,
                             "high_watermark": high, "lag": None if high is None else max(0, high - offset)})
            out[group] = rows
        return out, complete

    def transactions(self) -> tuple[list[dict], bool]:
        """Every transactional id the transaction coordinator knows, as the timer published it (shm.stats: state,
        producer id and epoch, timeout, the open transaction's start and partitions), open transactions first;
        and whether every id fit the segment. An open transaction gets its duration so far."""
        document, complete = self.stats.transactions.read()
        now = time.time_ns() // 1_000_000
        out = []
        for transactional_id, entry in document.items():
            partitions = [{"topic": topic, "partition": partition} for topic, partition in entry["partitions"]]
            entry = {"transactional_id": transactional_id, **entry, "partitions": partitions}
            entry["duration_ms"] = max(0, now - entry["start_ms"]) if entry["start_ms"] >= 0 else None
            out.append(entry)
        return out, complete

    def close(self) -> None:
        self.stats.close()
        if self.table is not None:
            self.table.close()


def snapshot_document(reader: NodeReader) -> dict:
    """One snapshot as a JSON-ready document (`shmbroker stats --json`)."""
    rows = reader.rows()
    location = reader.location
    processes = []
    for row in rows:
        entry = {"role": row.role, "index": row.index, "pid": row.pid, "started_ms": row.started_ms}
        for field in S.FIELDS:
            if field.width == 1:
                value = row.get(field.name)
                if value or field.name in ("published_ms", "loop_turns"):
                    entry[field.name] = value
        entry["gc_collections"] = row.array("gc_collections").tolist()
        processes.append(entry)
    apis: dict[str, dict[str, int]] = {}
    for row in rows:
        if row.role != "worker":
            continue
        for name in PER_API_FIELDS:
            for api, value in named_counts(row, name, api_name):
                apis.setdefault(api, dict.fromkeys(PER_API_FIELDS, 0))[name] += value
    errors: dict[str, int] = {}
    for row in rows:
        if row.role == "worker":
            for error, value in named_counts(row, "error_codes", error_name):
                errors[error] = errors.get(error, 0) + value
    rings = []
    timer = next((row for row in rows if row.role == "timer"), None)
    for row in rows:
        if row.role != "worker":
            continue
        ring = {"worker": row.index,
                "request": {"frames_sent": int(row.array("ring_frames_sent")[0]),
                            "used_bytes": int(row.array("ring_used_bytes")[0]),
                            "capacity_bytes": int(row.array("ring_capacity_bytes")[0])}}
        if timer is not None and row.index < S.MAX_RINGS:
            ring["request"]["frames_received"] = int(timer.array("ring_frames_received")[row.index])
            ring["completion"] = {"frames_sent": int(timer.array("ring_frames_sent")[row.index]),
                                  "frames_received": int(row.array("ring_frames_received")[0]),
                                  "used_bytes": int(timer.array("ring_used_bytes")[row.index]),
                                  "capacity_bytes": int(timer.array("ring_capacity_bytes")[row.index])}
        rings.append(ring)
    groups, groups_complete = reader.group_lag()
    transactions, transactions_complete = reader.transactions()
    totals = S.totals(rows)
    if timer is not None:
        levels = timer.get("wheel_levels")
        totals["wheel_entries_by_level"] = timer.array("wheel_entries_by_level")[:max(1, levels)].tolist()
    return {"node": {"data_dir": location.data_dir, "listen": f"{location.host}:{location.port}",
                     "instance": location.instance, "supervisor_pid": location.supervisor_pid,
                     "read_at_ms": time.time_ns() // 1_000_000},
            "totals": totals, "apis": apis, "errors": errors, "rings": rings, "processes": processes,
            "partitions": reader.partitions(), "sasl_logins": reader.sasl_logins(rows),
            "authorization_denials_by_principal": reader.denials_by_principal(rows),
            "groups": {group: {"total_lag": sum(p["lag"] or 0 for p in partitions), "partitions": partitions}
                       for group, partitions in groups.items()},
            "groups_complete": groups_complete,
            "open_transactions": [t for t in transactions if t["state"] in OPEN_STATES],
            "transactions_complete": transactions_complete}
