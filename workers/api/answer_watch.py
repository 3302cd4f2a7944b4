"""The answer watch: every Fetch and ListOffsets answer a worker sends, checked against Kafka's rules.

On only where `checks.watch_answers` is (the test harness turns it on for every node it starts); a node without it
never builds this class, and its request path has no check to skip (workers.worker wraps its methods only then).

What a client is owed, per connection and partition, in the order the client reads the answers:
- Fetch, a partition answered without an error (record batches v2; an older message set is not checked):
  - its batches' offsets increase; on a log that is not compacted, each batch follows the last with no gap;
  - the first batch holds the fetch offset (base <= offset <= last), or, on a compacted log only, starts after it
    (the cleaner removed what lay between, as Kafka's reader skips it too);
  - no batch ends at or past the high watermark (read_uncommitted) or the last stable offset (read_committed);
  - the high watermark, last stable offset and log start offset never go back.
- ListOffsets, a partition answered without an error: the latest offset (-1) is at least the high watermark
  (read_uncommitted) or last stable offset (read_committed) this connection saw, the earliest (-2) at least the log
  start; each then binds the Fetch answers after it as one of theirs would.

How: the answer is decoded from the bytes the client gets (kio's reader; record batches read from the segment
files with pread) when its slot is filled, while its file ranges are open. The checks that depend on order run
when every earlier request of the connection is answered, as the client reads them. A Fetch's offsets come from
its request, or for a partition an incremental request leaves out (KIP-227), from the watch's own copy of the
session: the node's session cache is what it checks, not what it trusts. A session the watch did not see open (a
connection that moved here from another worker) leaves those partitions' first batch unchecked.

A breach logs one line starting with node.config.ANSWER_WATCH_BREACH, naming the request; the harness fails the
test whose node logged it.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from typing import Any, Callable

from shmbroker.node.config import ANSWER_WATCH_BREACH
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.codecs.fetch import materialize
from shmbroker.workers.connection import Connection, Request

log = logging.getLogger("shmbroker.answer_watch")

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
READ_COMMITTED = 1
FULL_FETCH_EPOCHS = (0, -1)  # a request with either names every partition of its fetch
# Record batch v2 header (KIP-98): baseOffset int64, batchLength int32, leaderEpoch int32, magic int8, crc int32,
# attributes int16, lastOffsetDelta int32, ...; older message sets: offset int64, size int32, ... (their offset is
# the last one's: a wrapper's inner messages end there).
_BATCH_START = struct.Struct(">qiibIhi")
_V2 = 2
_PRUNE_EVERY = 1024  # dispatches between sweeps of closed connections' views

Key = tuple[bytes, int]  # (topic id bytes, partition)


class ConnectionView:
    """What one connection's client has been told, and its requests not yet answered in order."""

    __slots__ = ("pending", "sessions", "high_watermark", "last_stable", "log_start")

    def __init__(self) -> None:
        self.pending: deque[list] = deque()  # [request, decoded request or None, checks or None] per request
        self.sessions: dict[int, dict[tuple[Any, int], int]] = {}  # session id -> {(topic, partition): offset}
        self.high_watermark: dict[Key, int] = {}
        self.last_stable: dict[Key, int] = {}
        self.log_start: dict[Key, int] = {}


class AnswerWatch:
    """Checks the Fetch and ListOffsets answers of one worker (see the module's docstring)."""

    def __init__(self, partitions: Any) -> None:
        self.partitions = partitions  # node.storage.store.PartitionStore: topic ids and names, cleanup policies
        self.views: dict[Connection, ConnectionView] = {}
        self.breaches = 0
        self._dispatched = 0

    # -- hooks (workers.worker installs them) --------------------------------------------------

    def watch_dispatch(self, dispatch: Callable[[Request, Any], Any]) -> Callable[[Request, Any], Any]:
        def watched(req: Request, request: Any) -> Any:
            self._guarded(self.dispatched, req, request)
            return dispatch(req, request)
        return watched

    def watch_settle(self, settle: Callable[[Request, Any], None]) -> Callable[[Request, Any], None]:
        def watched(req: Request, outcome: Any) -> None:
            settle(req, outcome)
            self._guarded(self.settled, req)
        return watched

    def _guarded(self, hook: Callable, *args: Any) -> None:
        """A fault of the watch costs its check (one logged traceback, which the harness fails on), never the worker."""
        try:
            hook(*args)
        except Exception:
            log.exception("the answer watch failed")

    def dispatched(self, req: Request, request: Any) -> None:
        """A request, in the order its connection sent it."""
        view = self.views.get(req.conn)
        if view is None:
            view = self.views[req.conn] = ConnectionView()
        api = req.header.api_key
        entry = [req, None, None]
        if api == P.FETCH:
            entry[1] = (request, self._fetch_offsets(view, request))
        elif api == P.LIST_OFFSETS:
            entry[1] = (request, None)
        view.pending.append(entry)
        self._dispatched += 1
        if self._dispatched % _PRUNE_EVERY == 0:
            self.views = {conn: v for conn, v in self.views.items() if not conn.closed}

    def settled(self, req: Request) -> None:
        """A request's slot was filled: decode a watched answer now (its file ranges are open), then check, in
        order, every answer its client can read."""
        view = self.views.get(req.conn)
        if view is None:
            return
        for entry in view.pending:
            if entry[0] is req:
                if entry[1] is not None and req.slot.ready:
                    entry[2] = self._decode(req, entry[1])
                break
        while view.pending and view.pending[0][0].slot.ready:
            request, asked, checks = view.pending.popleft()
            if checks is not None:
                checks(view)

    # -- fetch ----------------------------------------------------------------------------------

    def _fetch_offsets(self, view: ConnectionView, request: Any) -> dict[tuple[Any, int], int] | None:
        """The fetch offset of each partition this request reads: its own, and for an incremental request the
        session's (None: a session the watch did not see open)."""
        asked = {(_topic_of(topic), part.partition): part.fetch_offset
                 for topic in request.topics for part in topic.partitions}
        session_id = getattr(request, "session_id", 0)
        epoch = getattr(request, "session_epoch", -1)
        if epoch in FULL_FETCH_EPOCHS or session_id == 0:
            return asked
        session = view.sessions.get(session_id)
        if session is None:
            return None
        for topic in getattr(request, "forgotten_topics_data", ()):
            for partition in topic.partitions:
                session.pop((_topic_of(topic), partition), None)
        session.update(asked)
        return dict(session)

    def _decode(self, req: Request, asked: tuple[Any, Any]) -> Callable[[ConnectionView], None] | None:
        header = req.header
        try:
            wire = materialize(req.slot.pieces)
            reader = P.codec(header.api_key, header.api_version)
            body = 9 if reader.response_class.__header_schema__.__version__ >= 1 else 8
            answer, _ = reader_of(reader)(wire, body)
        except Exception as exc:  # an answer a client cannot decode is a breach too
            self._breach(req, f"the answer does not decode: {type(exc).__name__}: {exc}")
            return None
        request, offsets = asked
        if header.api_key == P.FETCH:
            return lambda view: self._check_fetch(view, req, request, offsets, answer)
        return lambda view: self._check_list_offsets(view, req, request, answer)

    def _check_fetch(self, view: ConnectionView, req: Request, request: Any,
                     offsets: dict[tuple[Any, int], int] | None, answer: Any) -> None:
        committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
        asked_session = getattr(request, "session_id", 0)
        session_id = getattr(answer, "session_id", 0)
        if int(getattr(answer, "error_code", 0)) or session_id != asked_session:
            view.sessions.pop(asked_session, None)  # a session closed, refused or replaced
        if session_id and getattr(request, "session_epoch", -1) == 0 and offsets is not None:
            view.sessions[session_id] = dict(offsets)  # a new session: the offsets of its full request
        for topic in answer.responses:
            name, key_bytes = self._names(topic)
            for part in topic.partitions:
                if int(part.error_code):
                    continue
                where = f"{name}-{part.partition_index}"
                fetch_offset = None if offsets is None else offsets.get((_topic_of(topic), part.partition_index))
                self._check_batches(req, where, name, part, fetch_offset, committed,
                                    lambda t=topic, p=part.partition_index: _asked(request, t, p))
                if key_bytes is not None:
                    key = (key_bytes, part.partition_index)
                    lso = part.last_stable_offset
                    self._never_back(req, where, "high watermark", view.high_watermark, key, part.high_watermark)
                    self._never_back(req, where, "last stable offset", view.last_stable, key, lso)
                    start = getattr(part, "log_start_offset", -1)
                    if start >= 0:
                        self._never_back(req, where, "log start offset", view.log_start, key, start)

    def _check_batches(self, req: Request, where: str, name: str | None, part: Any, fetch_offset: int | None,
                       committed: bool, asked: Callable[[], str] = lambda: "") -> None:
        batches = _batches(part.records or b"")
        if not batches:
            return
        compacted = name is None or "compact" in self.partitions.config_of(name).cleanup_policy
        end = part.last_stable_offset if committed else part.high_watermark
        first_base, first_last = batches[0]
        if fetch_offset is not None:
            if first_last < fetch_offset:
                self._breach(req, f"{where}: fetched from {fetch_offset}, the first batch ends before it "
                                  f"({first_base}..{first_last}): {asked()}")
            elif first_base > fetch_offset and not compacted:
                self._breach(req, f"{where}: fetched from {fetch_offset}, the first batch starts after it "
                                  f"({first_base}..{first_last}) on a log that is not compacted")
        previous = None
        for base, last in batches:
            if previous is not None and (base <= previous or (not compacted and base != previous + 1)):
                self._breach(req, f"{where}: a batch {base}..{last} after one ending at {previous}")
                return
            if last >= end:
                self._breach(req, f"{where}: a batch {base}..{last} at or past the "
                                  f"{'last stable offset' if committed else 'high watermark'} {end}")
                return
            previous = last

    # -- list offsets -------------------------------------------------------------------------

    def _check_list_offsets(self, view: ConnectionView, req: Request, request: Any, answer: Any) -> None:
        committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
        asked = {(topic.name, part.partition_index): part.timestamp
                 for topic in request.topics for part in topic.partitions}
        for topic in answer.topics:
            topic_id = self.partitions.topic_id(topic.name)
            for part in topic.partitions:
                if int(part.error_code) or topic_id is None:
                    continue
                key = (topic_id.bytes, part.partition_index)
                where = f"{topic.name}-{part.partition_index}"
                timestamp = asked.get((topic.name, part.partition_index))
                if timestamp == LATEST_TIMESTAMP:
                    seen = view.last_stable if committed else view.high_watermark
                    self._never_back(req, where, "latest offset", seen, key, part.offset)
                elif timestamp == EARLIEST_TIMESTAMP:
                    self._never_back(req, where, "earliest offset", view.log_start, key, part.offset)

    # -- shared -------------------------------------------------------------------------------

    def _names(self, topic: Any) -> tuple[str | None, bytes | None]:
        """(name, topic id bytes) of an answered topic, named by name (Fetch up to v12) or by id (v13+)."""
        topic_id = getattr(topic, "topic_id", None)
        if topic_id is not None:
            return self.partitions.topic_by_id(topic_id), topic_id.bytes
        name = topic.topic
        found = self.partitions.topic_id(name)
        return name, None if found is None else found.bytes

    def _never_back(self, req: Request, where: str, what: str, seen: dict[Key, int], key: Key, value: int) -> None:
        before = seen.get(key)
        if before is not None and value < before:
            self._breach(req, f"{where}: {what} {value} after {before} on this connection")
            return
        seen[key] = value

    def _breach(self, req: Request, what: str) -> None:
        self.breaches += 1
        h = req.header
        log.error("%s: %s (api %d v%d, correlation id %d, client %r, connection from %s)", ANSWER_WATCH_BREACH,
                  what, h.api_key, h.api_version, h.correlation_id, h.client_id, req.conn.peer)


def _asked(request: Any, topic: Any, partition: int) -> str:
    """Where a breach's fetch offset came from: the request's own partition, or the session the request is in."""
    name = _topic_of(topic)
    for asked_topic in request.topics:
        if _topic_of(asked_topic) == name:
            for part in asked_topic.partitions:
                if part.partition == partition:
                    return f"the request asked {part.fetch_offset}, session {getattr(request, 'session_id', 0)} " \
                           f"epoch {getattr(request, 'session_epoch', -1)}"
    return f"from the session {getattr(request, 'session_id', 0)} epoch {getattr(request, 'session_epoch', -1)}"


def reader_of(codec: P.Codec) -> Callable:
    """kio's reader of the codec's response class (cached on first use)."""
    reader = _READERS.get(codec.response_class)
    if reader is None:
        from kio.serial import entity_reader
        reader = _READERS[codec.response_class] = entity_reader(codec.response_class)
    return reader


_READERS: dict[type, Callable] = {}


def _topic_of(topic: Any) -> Any:
    """How a request or answer names a topic: its name up to Fetch v12, its id from v13."""
    topic_id = getattr(topic, "topic_id", None)
    return topic_id if topic_id is not None else topic.topic


def _batches(records: bytes) -> list[tuple[int, int]]:
    """(base offset, last offset) of each whole batch of a records field (a partial last one is left out)."""
    found = []
    position, size = 0, len(records)
    while position + _BATCH_START.size <= size:
        base, length, _, magic, _, _, last_delta = _BATCH_START.unpack_from(records, position)
        if position + 12 + length > size or length <= 0:
            break
        if magic != _V2:
            return []  # an older message set, unchecked (its offset field is a wrapper's last offset)
        found.append((base, base + last_delta))
        position += 12 + length
    return found
