"""The node's stats segment: one row of counters per process, written without locks, read as consistent snapshots.

Every process of the node (row 0 the supervisor, row 1 the timer, row 2 + i network worker i, then the log
cleaners' rows after the workers') owns one row.
It counts in plain Python ints of its own (`StatsWriter.counts`, a list indexed by the field offsets below: an
increment on the hot path is one list store, no shared-memory traffic), and *publishes* the whole list into its
row every `stats.publish_interval_ms` from its loop. Readers (`shmbroker stats`, the dashboard, the Prometheus
endpoint) map the segment read-only and never send a request to the node.

After the 64-byte header (shm.segment: magic, version, rows, row bytes, the two documents' slot bytes), the rows.
Row layout (little-endian int64 words):

    word 0        version   incremented once per publish; its low bit names the slot holding the current counters
    word 1        pid       the owner's pid (0: the row was never used)
    word 2        role      ROLES index (supervisor, timer, worker, cleaner)
    word 3        index     the worker's or cleaner's index (0 otherwise)
    word 4        started   the owner's start, wall-clock ms
    words 5-7     padding   keeps the version on its own cache line
    slot 0, slot 1          SLOT_WORDS counters each (FIELDS)

After the rows, two *document areas*, each written by the timer process alone, so that readers need no request
to the node:
- committed offsets (the group coordinator's): {group: [[topic, partition, offset], ...]}, for lag (high
  watermark - committed);
- transactions (the transaction coordinator's): {transactional_id: {state, producer_id, producer_epoch,
  timeout_ms, start_ms, last_update_ms, partitions, groups}}, open transactions first.
Then one more area per row, written by the row's owner: a worker's authorization denials per principal,
{principal: {api key: count}} (principals are unbounded names, which fixed-size counters cannot hold).
Each area (DocumentArea) holds one orjson document:

    word 0        version   as a row's: its low bit names the slot holding the current document
    words 1-2     lengths   the document's bytes in slot 0 and slot 1
    words 3-7     padding
    slot 0, slot 1          the area's slot bytes each (a larger document is cut at a whole key, marked so)

Invariants (the double-buffered seqlock of shm/table.py, for the same reason: an owner killed mid-publish must not
leave readers spinning; the document areas follow the same protocol with the timer as their one writer):
- A row has one writer, its owner; the supervisor zeroes a row only before it starts the row's owner.
- Publishing writes the counters into slot (version + 1) & 1, then stores version + 1 (one aligned 8-byte store).
  A reader loads version v, copies slot v & 1, loads version again, and keeps the copy iff it is still v.
- Counters (monotonic) and gauges (current values such as connections, set at publish time) are both int64;
  FIELDS says which is which, so rates are only computed for counters.
- Relies on x86-64 total store order, like the rest of shm/.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import orjson

from shmbroker.shm.segment import HEADER_BYTES, Layout, Segment

DOCUMENT_HEAD_BYTES = 64
CUT_MARK = b'"":[]'  # first key of a document that was cut to fit
ROW_HEAD_WORDS = 8
ROLES = ("supervisor", "timer", "worker", "cleaner")
SUPERVISOR_ROW = 0
TIMER_ROW = 1
MAX_APIS = 96  # Kafka API keys 0..95 (Kafka 4.4's reach 94; the node serves up to 89)
MAX_RINGS = 64  # rings described per row (one per worker)
MAX_LISTENERS = 16  # listeners whose logins are counted one by one (the config's first ones)
SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")  # the order of the per-listener login counts
MAX_ERROR_CODES = 128  # Kafka error codes 0..127 (3.7 defines up to 119); higher ones count in the last
MAX_WHEEL_LEVELS = 16  # wheel levels described (20-slot wheels of 1 ms reach 16 levels past 10**12 years)
PURGATORIES = ("fetch", "produce", "throttle", "join", "session", "sync")
MAX_READ_ATTEMPTS = 10_000


@dataclass(frozen=True)
class Field:
    name: str
    width: int = 1  # >1: an array (per API key, per ring)
    counter: bool = True  # False: a gauge (a current value)
    help: str = ""


def _purgatory_fields() -> list[Field]:
    fields = []
    for kind in PURGATORIES:
        fields += [Field(f"purgatory_{kind}_pending", counter=False, help=f"{kind} operations waiting"),
                   Field(f"purgatory_{kind}_watched", counter=False, help=f"{kind} watcher-list entries"),
                   Field(f"purgatory_{kind}_completed", help=f"{kind} operations completed"),
                   Field(f"purgatory_{kind}_expired", help=f"{kind} operations expired")]
    return fields


# The schema, as data: every process writes the fields of its role, readers sum or show them.
FIELDS: tuple[Field, ...] = (
    Field("published_ms", counter=False, help="wall-clock ms of this publish"),
    Field("loop_turns", help="turns of the process's loop"),
    # every process (node.child.GarbageCollectorStats)
    Field("gc_collections", 3, help="garbage collections, per generation (0: the youngest)"),
    Field("gc_collected", help="objects garbage collections freed: garbage in reference cycles, which reference "
                               "counting alone never frees"),
    Field("gc_pause_us_total", help="time spent in garbage collections, us"),
    Field("gc_pause_us_max", counter=False, help="longest garbage collection since the process started, us"),
    # network workers
    Field("requests", MAX_APIS, help="requests read, per API key"),
    Field("request_errors", MAX_APIS, help="requests that closed their connection (bad input or a bug), per API key"),
    Field("error_responses", MAX_APIS, help="responses carrying a non-zero error code, per API key"),
    Field("error_codes", MAX_ERROR_CODES,
          help="error codes in responses (top-level and per partition, each occurrence), per Kafka error code"),
    Field("authorization_denials", MAX_APIS, help="operations the authorizer refused, per API key"),
    Field("bytes_in", MAX_APIS, help="request bytes read, per API key"),
    Field("bytes_out", MAX_APIS, help="response bytes queued (sendfile ranges included), per API key"),
    Field("bytes_sendfile", help="response bytes sent by sendfile straight from segment files (zero copy)"),
    Field("connections", counter=False, help="open client connections"),
    Field("connections_accepted", help="client connections accepted"),
    Field("connections_closed_on_error", help="connections closed for bad input or a bug"),
    Field("connections_moved_out", help="connections a worker passed to the worker whose appends answer their long polls"),
    Field("connections_moved_in", help="connections a worker took over from another worker (server.connection_affinity_*)"),
    Field("connections_balanced_out",
          help="new connections a worker passed to the worker holding the fewest (server.balance_connections)"),
    Field("connections_balanced_in", help="new connections a worker took from another, holding the fewest"),
    Field("delayed_waiting", counter=False,
          help="delayed requests a worker holds: waiting on the timer, or long polls not yet handed to it"),
    Field("fetches_answered_on_append",
          help="delayed fetches a worker answered on an append (its own or, by doorbell, another worker's): no timer hop"),
    Field("fetches_handed_off",
          help="long polls a worker handed to the timer, having waited timer.fetch_handoff_ms (or with a shorter max wait)"),
    Field("fetches_answered_from_first_read",
          help="long polls that expired with every partition as their first read saw it, answered with that read"),
    Field("fetches_repeated",
          help="fetches whose body their connection had sent before and kept: its decoded form reused"),
    Field("fetches_repeated_idle",
          help="sessionless long polls that waited on the empty first read of the same request before, its partitions unchanged"),
    Field("fetch_sessions", counter=False, help="incremental fetch sessions a worker holds"),
    Field("fetch_sessions_opened", help="incremental fetch sessions opened"),
    Field("fetch_sessions_evicted", help="incremental fetch sessions evicted for a new one (cache full)"),
    Field("fetches_incremental", help="fetches answered from an incremental fetch session"),
    Field("fetch_session_errors",
          help="fetches naming a session the worker does not hold or the wrong epoch (the client starts a new one)"),
    Field("throttled_connections", counter=False, help="connections muted by a quota throttle"),
    # security (workers.tls, workers.api.sasl)
    Field("tls_handshake_failures", help="TLS handshakes refused or broken off (a plaintext client, garbage, a bad certificate)"),
    *(Field(f"sasl_{what}_{mechanism}", help=f"SASL {mechanism.upper().replace('_', '-')} logins {text}")
      for mechanism in ("scram_sha_256", "scram_sha_512", "plain")
      for what, text in (("logins", "that succeeded"), ("login_failures", "refused (SASL_AUTHENTICATION_FAILED)"))),
    Field("sasl_logins_by_listener", MAX_LISTENERS * len(SASL_MECHANISMS),
          help="SASL logins that succeeded, per listener (the config's order) and mechanism: listener * 3 + mechanism"),
    Field("sasl_login_failures_by_listener", MAX_LISTENERS * len(SASL_MECHANISMS),
          help="SASL logins refused, per listener and mechanism (as sasl_logins_by_listener)"),
    # rings: a worker describes its request ring at position 0; the timer describes every completion ring
    Field("ring_frames_sent", MAX_RINGS, help="frames written into the ring"),
    Field("ring_frames_received", MAX_RINGS, help="frames read from the ring"),
    Field("ring_used_bytes", MAX_RINGS, counter=False, help="bytes in the ring not yet consumed"),
    Field("ring_capacity_bytes", MAX_RINGS, counter=False, help="ring capacity"),
    # timer process
    *_purgatory_fields(),
    Field("wheel_entries", counter=False, help="pending entries in the timing wheels"),
    Field("wheel_levels", counter=False, help="levels of the delayed-operation wheels (1 + overflow levels)"),
    Field("wheel_entries_by_level", MAX_WHEEL_LEVELS, counter=False,
          help="pending entries held at each wheel level (0: the finest), all wheels summed"),
    Field("wheel_slots", counter=False, help="entry slots in use (pending + cancelled not yet reclaimed)"),
    Field("timer_lateness_p50_us", counter=False, help="timer wake-up lateness past a deadline, p50 over the last interval"),
    Field("timer_lateness_p99_us", counter=False, help="timer wake-up lateness past a deadline, p99 over the last interval"),
    Field("timer_wakeups_late", help="wake-ups measured for lateness"),
    Field("flushes", help="flush rounds of the group commit"),
    Field("fsyncs", help="partition fsyncs"),
    Field("urgent_fsyncs", help="fsyncs made at once beside the group commit (the transaction coordinator's decisions)"),
    Field("flush_errors", help="failed partition flushes"),
    Field("fsync_us_total", help="time spent in partition fsyncs, us"),
    Field("fsync_us_max", counter=False, help="slowest fsync over the last interval, us"),
    Field("bytes_flushed", help="bytes made durable by fsync"),
    Field("throttles", help="throttle timers started"),
    Field("throttle_ms_total", help="throttle time handed out, ms"),
    Field("throttled_clients", counter=False, help="clients over their quota now"),
    Field("quota_clients", counter=False, help="client ids the quota manager measures now"),
    Field("quota_clients_expired", help="client ids forgotten after idle_client_expiry_ms without use"),
    Field("groups", counter=False, help="consumer groups known to the coordinator"),
    Field("group_members", counter=False, help="members of all groups"),
    Field("rebalances", help="completed join phases"),
    Field("consumer_groups", counter=False, help="groups of the consumer protocol (KIP-848); `groups` counts classic ones"),
    Field("consumer_group_members", counter=False, help="members of all consumer-protocol groups"),
    Field("target_assignments", help="target assignments computed for consumer-protocol groups"),
    Field("streams_groups", counter=False, help="groups of the Streams rebalance protocol (KIP-1071)"),
    Field("share_groups", counter=False, help="share groups (KIP-932)"),
    Field("share_group_members", counter=False, help="members of all share groups"),
    Field("share_member_joins", help="share group members that joined or rejoined (a heartbeat of member epoch 0)"),
    Field("share_partitions", counter=False, help="share-partitions (a share group's state of one partition)"),
    Field("share_records_in_flight", counter=False, help="share-partitions' records acquired or waiting to be again"),
    Field("share_records_acquired", help="records acquired by share consumers (each delivery counts)"),
    Field("share_redeliveries", help="records acquired again after a release or an expired lock"),
    Field("share_records_archived", help="records archived: rejected, or past the delivery-count limit"),
    Field("share_lock_expiries", help="acquired records whose lock ran out (made available again)"),
    Field("share_acknowledged_accept", help="records share consumers accepted (ACCEPT)"),
    Field("share_acknowledged_release", help="records share consumers released for redelivery (RELEASE)"),
    Field("share_acknowledged_reject", help="records share consumers rejected (REJECT: archived)"),
    Field("share_acknowledged_gap", help="offsets acknowledged as gaps (no record there)"),
    Field("share_acknowledged_renew", help="records whose lock share consumers renewed (RENEW)"),
    Field("streams_group_members", counter=False, help="members of all streams groups"),
    Field("transactions_open", counter=False, help="transactions open or completing (the transaction coordinator)"),
    Field("transactions_committed", help="transactions committed"),
    Field("transactions_aborted", help="transactions aborted (by their producer, a new epoch or a timeout)"),
    Field("transactions_timed_out", help="transactions the node aborted past their transaction.timeout.ms"),
    Field("transaction_markers", help="COMMIT and ABORT markers written to partitions"),
    Field("transaction_partitions_reconciled",
          help="partitions given back at start to the transaction whose AddPartitionsToTxn record a crash lost"),
    Field("transaction_requests_held",
          help="requests of a transactional id held while its previous transaction completed"),
    Field("transaction_requests_refused",
          help="requests of a completing transactional id answered CONCURRENT_TRANSACTIONS (past the hold bounds)"),
    # log cleaners
    Field("cleanings", help="partition cleanings finished (a swap or nothing to do)"),
    Field("cleaner_errors", help="partition cleanings that failed (the log stays as it was)"),
    Field("cleaner_bytes_read", help="log bytes the cleaner read"),
    Field("cleaner_bytes_written", help="bytes of cleaned segments written"),
    Field("cleaner_bytes_reclaimed", help="log bytes cleaning freed (replaced segments minus their replacements)"),
    Field("cleaner_records_read", help="records the cleaner read"),
    Field("cleaner_records_kept", help="records cleaned segments kept"),
    Field("cleaner_tombstones_dropped", help="tombstones dropped past delete.retention.ms"),
    Field("cleaner_io_sleep_ms", help="time the cleaner slept to keep to cleaner.io_max_bytes_per_second, ms"),
    Field("cleaner_busy", counter=False, help="1 while the cleaner cleans a partition"),
    Field("cleaner_last_run_ms", counter=False, help="wall-clock ms the cleaner's last cleaning ended"),
    # supervisor
    Field("child_restarts", help="children restarted"),
    Field("children_alive", counter=False, help="children running"),
)

OFFSETS: dict[str, int] = {}
_offset = 0
for _field in FIELDS:
    OFFSETS[_field.name] = _offset
    _offset += _field.width
SLOT_WORDS = _offset
ROW_WORDS = ROW_HEAD_WORDS + 2 * SLOT_WORDS
ROW_BYTES = ROW_WORDS * 8
FIELD_BY_NAME = {f.name: f for f in FIELDS}
VERSION = struct.Struct("<q")
# A row's area of denials per principal: about 300 principals of 40-byte names denied on two APIs each.
PRINCIPALS_BYTES = 32 << 10
# The header's sizes: rows, a row's bytes, the document areas' slot bytes; rows come first, then the areas.
LAYOUT = Layout("a stats segment", magic=0x5354_4154_5342_4D54, version=5,  # "SMBSTATT"; 5: 96 APIs, share
                sizes=("rows", "row_bytes", "committed_bytes", "transactions_bytes", "principals_bytes"),
                fixed={"row_bytes": ROW_BYTES},
                bytes_for=lambda rows, row_bytes, committed_bytes, transactions_bytes, principals_bytes:
                    HEADER_BYTES + rows * row_bytes + 2 * DOCUMENT_HEAD_BYTES + 2 * committed_bytes
                    + 2 * transactions_bytes + rows * (DOCUMENT_HEAD_BYTES + 2 * principals_bytes))


class TornReadError(RuntimeError):
    """A row kept changing under a reader for MAX_READ_ATTEMPTS copies."""


class DocumentArea:
    """One document area of the segment: a JSON object {key: value}, double-buffered, one writer."""

    def __init__(self, memory, at: int, slot_bytes: int, writable: bool, what: str) -> None:
        self._memory = memory
        self._slots_at = at + DOCUMENT_HEAD_BYTES
        self.slot_bytes = slot_bytes
        self.what = what
        self._head = np.ndarray(3, dtype="<i8", buffer=memory, offset=at)
        if not writable:
            self._head.flags.writeable = False

    @staticmethod
    def bytes_for(slot_bytes: int) -> int:
        return DOCUMENT_HEAD_BYTES + 2 * slot_bytes

    def publish(self, document: dict) -> bool:
        """Make `document` the current one. Keys that do not fit the slot are left out, in the order given;
        returns False if any was."""
        parts = [orjson.dumps(key) + b":" + orjson.dumps(value) for key, value in document.items()]
        room = self.slot_bytes - len(CUT_MARK) - 3  # braces, and the comma after the mark
        kept, used = 0, 0
        for part in parts:
            if used + len(part) + (1 if kept else 0) > room:
                break
            used += len(part) + (1 if kept else 0)
            kept += 1
        complete = kept == len(parts)
        # Cut at a whole key (a reader never sees half a value); the "" key tells readers it was cut.
        data = b"{" + b",".join(parts if complete else [CUT_MARK, *parts[:kept]]) + b"}"
        head = self._head
        version = int(head[0]) + 1
        slot = version & 1
        start = self._slots_at + slot * self.slot_bytes
        self._memory[start:start + len(data)] = data
        head[1 + slot] = len(data)
        head[0] = version
        return complete

    def read(self) -> tuple[dict, bool]:
        """A consistent copy: (document, complete); ({}, True) before the first publish."""
        head = self._head
        for _ in range(MAX_READ_ATTEMPTS):
            version = int(head[0])
            if version == 0:
                return {}, True
            slot = version & 1
            length = min(int(head[1 + slot]), self.slot_bytes)
            start = self._slots_at + slot * self.slot_bytes
            data = bytes(self._memory[start:start + length])
            if int(head[0]) == version:
                document = orjson.loads(data)
                complete = "" not in document
                document.pop("", None)
                return document, complete
        raise TornReadError(f"the {self.what} changed during {MAX_READ_ATTEMPTS} reads")

    def clear(self) -> None:
        """Before the area's new writer starts (the supervisor, as for a row): readers see no document."""
        self._head[0] = 0

    def close(self) -> None:
        self._head = None


def stats_rows(workers: int, cleaners: int = 0) -> int:
    return 2 + workers + cleaners


def worker_row(index: int) -> int:
    return 2 + index


def cleaner_row(workers: int, index: int) -> int:
    return 2 + workers + index


@dataclass(frozen=True)
class RowSnapshot:
    row: int
    pid: int
    role: str
    index: int
    started_ms: int
    values: np.ndarray  # SLOT_WORDS int64

    def get(self, name: str) -> int:
        return int(self.values[OFFSETS[name]])

    def array(self, name: str) -> np.ndarray:
        start = OFFSETS[name]
        return self.values[start:start + FIELD_BY_NAME[name].width]

    @property
    def label(self) -> str:
        return f"{self.role} {self.index}" if self.role in ("worker", "cleaner") else self.role


class StatsSegment:
    """A mapping of the stats segment: `create` in the supervisor, `attach` in the children and readers."""

    def __init__(self, segment: Segment, writable: bool) -> None:
        self.name = segment.name
        self.rows = rows = segment.sizes["rows"]
        self._segment = segment
        memory = segment.memory
        self._words = np.ndarray((rows, ROW_WORDS), dtype="<i8", buffer=memory, offset=HEADER_BYTES)
        if not writable:
            self._words.flags.writeable = False
        at = HEADER_BYTES + rows * ROW_BYTES
        self.committed = DocumentArea(memory, at, segment.sizes["committed_bytes"], writable,
                                      f"committed offsets of {self.name}")
        at += DocumentArea.bytes_for(self.committed.slot_bytes)
        self.transactions = DocumentArea(memory, at, segment.sizes["transactions_bytes"], writable,
                                         f"transactions of {self.name}")
        at += DocumentArea.bytes_for(self.transactions.slot_bytes)
        principals_bytes = segment.sizes["principals_bytes"]
        self.denials_by_principal = [
            DocumentArea(memory, at + row * DocumentArea.bytes_for(principals_bytes), principals_bytes, writable,
                         f"denials by principal of row {row} of {self.name}") for row in range(rows)]

    @property
    def committed_bytes(self) -> int:
        return self.committed.slot_bytes

    @classmethod
    def create(cls, name: str, rows: int, committed_bytes: int = 1 << 20,
               transactions_bytes: int = 1 << 20, principals_bytes: int = PRINCIPALS_BYTES) -> "StatsSegment":
        return cls(Segment.create(name, LAYOUT, rows=rows, committed_bytes=committed_bytes,
                                  transactions_bytes=transactions_bytes, principals_bytes=principals_bytes), True)

    def publish_committed(self, committed: dict[str, list[tuple[str, int, int]]]) -> bool:
        """The timer process (the area's one writer): make `committed` the current document. Groups that do not
        fit the slot are left out, in the order given; returns False if any was."""
        return self.committed.publish(committed)

    def read_committed(self) -> tuple[dict[str, list[list]], bool]:
        """A consistent copy of the committed offsets: ({group: [[topic, partition, offset], ...]}, complete)."""
        return self.committed.read()

    @classmethod
    def attach(cls, name: str, writable: bool = True) -> "StatsSegment":
        return cls(Segment.attach(name, LAYOUT, writable), writable)

    def reset(self, row: int) -> None:
        """Supervisor, before starting the row's owner: a new process starts from zero."""
        self._words[row, :] = 0
        self.denials_by_principal[row].clear()

    def writer(self, row: int, role: str, index: int, pid: int) -> "StatsWriter":
        words = self._words[row]
        words[1] = pid
        words[2] = ROLES.index(role)
        words[3] = index
        words[4] = time.time_ns() // 1_000_000
        return StatsWriter(words)

    def read(self, row: int) -> RowSnapshot:
        words = self._words[row]
        for _ in range(MAX_READ_ATTEMPTS):
            version = int(words[0])
            start = ROW_HEAD_WORDS + (version & 1) * SLOT_WORDS
            values = words[start:start + SLOT_WORDS].copy()
            head = words[1:5].copy()
            if int(words[0]) == version:
                return RowSnapshot(row, int(head[0]), ROLES[int(head[1])] if 0 <= head[1] < len(ROLES) else "?",
                                   int(head[2]), int(head[3]), values)
        raise TornReadError(f"row {row} of {self.name} changed during {MAX_READ_ATTEMPTS} reads")

    def snapshot(self) -> list[RowSnapshot]:
        """Consistent copies of every row in use (pid set)."""
        return [snap for snap in (self.read(row) for row in range(self.rows)) if snap.pid]

    def close(self) -> None:
        self._words = None
        self.committed.close()
        self.transactions.close()
        for area in self.denials_by_principal:
            area.close()
        self._segment.close()

    def unlink(self) -> None:
        self._segment.unlink()


class StatsWriter:
    """A process's own row. Count into `counts` (a plain list, indexed with OFFSETS), then `publish()`."""

    __slots__ = ("counts", "_words")

    def __init__(self, words: np.ndarray) -> None:
        self._words = words
        self.counts = [0] * SLOT_WORDS

    def publish(self) -> None:
        counts = self.counts
        counts[OFFSETS["published_ms"]] = time.time_ns() // 1_000_000
        words = self._words
        version = int(words[0]) + 1
        start = ROW_HEAD_WORDS + (version & 1) * SLOT_WORDS
        words[start:start + SLOT_WORDS] = counts
        words[0] = version

    def set(self, name: str, value: int, position: int = 0) -> None:
        self.counts[OFFSETS[name] + position] = int(value)

    def add(self, name: str, value: int = 1, position: int = 0) -> None:
        self.counts[OFFSETS[name] + position] += int(value)


def percentile(sorted_values: list[int], fraction: float) -> int:
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def totals(rows: list[RowSnapshot]) -> dict[str, int]:
    """Node-wide sums of the scalar fields (gauges sum too: connections of all workers)."""
    result = {}
    for field in FIELDS:
        if field.width == 1 and field.name != "published_ms":
            result[field.name] = sum(row.get(field.name) for row in rows)
    return result


def iter_scalar(rows: list[RowSnapshot]) -> Iterator[tuple[RowSnapshot, Field, int]]:
    for row in rows:
        for field in FIELDS:
            if field.width == 1:
                yield row, field, row.get(field.name)
