"""Incremental fetch sessions (Kafka's KIP-227), kept by each network worker for the connections it serves.

A consumer that fetches the same partitions over and over opens a session with a full fetch (session id 0,
epoch 0); the node keeps the partitions, their fetch positions and what it last told the client about each
(high watermark, last stable offset, log start). Each later fetch names the session and the next epoch and
carries only the partitions whose position or limit changed, and those to forget; its answer carries only the
partitions with records, an error, or a changed watermark. An idle consumer's long poll is then an empty
request and an empty answer whatever the number of partitions it reads.

The request's (session id, epoch) pair says what to do, as in Kafka's FetchManager:
- (0, -1): no session; a full fetch and a full answer.
- (0, 0): a full fetch that opens a session if the cache has room or can evict one (its id in the answer;
  0 if not). (id, 0) closes session `id` first; (id, -1) closes it and asks for no new one.
- (id, epoch > 0): an incremental fetch of session `id`: FETCH_SESSION_ID_NOT_FOUND if this worker does not
  hold it (evicted, or opened on another worker before the connection moved: the client falls back to a full
  fetch), INVALID_FETCH_SESSION_EPOCH unless epoch is the session's next one, FETCH_SESSION_TOPIC_ID_ERROR
  if it names topics by id (v13+) where the session's full fetch named them by name, or the other way (the Java
  client drops to v12 when a topic of its fetch has no id in its metadata: the session keeps its partitions
  keyed one way, and a partition named the other way would be a second entry, read at its stale offset too).
  A session left without partitions is closed and the fetch answered as a sessionless one.

Eviction follows Kafka's FetchSessionCache: a new session takes a free slot; without one it evicts the least
recently used session if that one was idle for `min_incremental_fetch_session_eviction_ms`, else the smallest
session (fewest partitions, then lowest id) created at least that long ago if the new one is larger;
otherwise no session is opened. The node's `max_incremental_fetch_session_cache_slots` is shared evenly by the
workers. A session id names its worker (id % workers == worker index), so no two workers hand out the same id.

Invariants:
- A session's epoch advances once per accepted fetch, before the fetch is read; its answer (now or after a
  long poll) is built against the same session object, so a delayed answer updates what the next one compares to.
- A partition enters an incremental answer when it has records or an error, or its high watermark, last stable
  offset or log start changed since the last answer that carried it; a partition with records moves to the end
  of the session's order, so a max_bytes-limited answer serves the others first next time.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs.fetch import FetchTopicResult

NO_SESSION = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
_MAX_SESSION_ID = 2**31 - 1
_MAX_EPOCH = 2**31 - 1
FETCH_BY_TOPIC_ID = 13  # the first Fetch version naming topics by id (KIP-516)


@dataclass(slots=True)
class SessionPartition:
    """A partition of a session: what the client asked last, and what it was last told."""

    partition: int
    fetch_offset: int
    partition_max_bytes: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1


@dataclass(slots=True)
class SessionTopic:
    """The shape the fetch reader takes (a request's topic as the handler names it): a topic (None: a topic id
    no live topic has), the id it was asked by (Fetch v13+; b"" before), its partitions to read."""

    topic: str | None
    partitions: list[SessionPartition]
    id_bytes: bytes = b""


class ForgottenTopic(NamedTuple):
    """Partitions a request asks its session to forget, its topic named as the request's topics are."""

    topic: str | None
    id_bytes: bytes
    partitions: Any


@dataclass(slots=True, eq=False)
class FetchSession:
    id: int
    created_ms: int
    last_used_ms: int
    epoch: int = 1  # the epoch the next incremental fetch must carry
    uses_topic_ids: bool = False  # opened by a Fetch v13+ (topics by id): its incremental fetches must be too
    # (topic, topic id bytes, partition) -> SessionPartition
    partitions: OrderedDict = field(default_factory=OrderedDict)

    def update(self, topics: Iterable[Any], forgotten: Iterable[ForgottenTopic]) -> None:
        """Add or update the partitions a request names; drop the ones it forgets."""
        for topic in topics:
            id_bytes = getattr(topic, "id_bytes", b"")
            for part in topic.partitions:
                key = (topic.topic, id_bytes, part.partition)
                cached = self.partitions.get(key)
                if cached is None:
                    self.partitions[key] = SessionPartition(part.partition, part.fetch_offset,
                                                            part.partition_max_bytes)
                else:
                    cached.fetch_offset = part.fetch_offset
                    cached.partition_max_bytes = part.partition_max_bytes
        for topic in forgotten:
            for index in topic.partitions:
                self.partitions.pop((topic.topic, topic.id_bytes, index), None)

    def to_read(self) -> list[SessionTopic]:
        """Every partition of the session, grouped by topic in session order."""
        topics: list[SessionTopic] = []
        for (name, id_bytes, _), part in self.partitions.items():
            if not topics or (topics[-1].topic, topics[-1].id_bytes) != (name, id_bytes):
                topics.append(SessionTopic(name, [], id_bytes))
            topics[-1].partitions.append(part)
        return topics


class FetchContext:
    """What one Fetch request reads and how its answer is cut: the base is sessionless (every partition the
    request names, all of them answered, session id 0)."""

    error_code = 0
    session_id = NO_SESSION
    incremental = False

    def __init__(self, request: Any, asked: list[Any]) -> None:
        self.request = request
        self.asked = asked  # the request's topics, named by the handler

    def topics(self) -> list[Any]:
        return self.asked

    def answer(self, results: list[FetchTopicResult]) -> list[FetchTopicResult]:
        return results


class SessionErrorContext(FetchContext):
    """A session the worker does not hold, or the wrong epoch: the error, no partitions."""

    def __init__(self, request: Any, error_code: int) -> None:
        super().__init__(request, [])
        self.error_code = error_code

    def topics(self) -> list[Any]:
        return []


class FullContext(FetchContext):
    """A full fetch that may open a session: it is cached with the state of the answer it gets."""

    def __init__(self, request: Any, asked: list[Any], cache: "FetchSessionCache", uses_topic_ids: bool) -> None:
        super().__init__(request, asked)
        self.cache = cache
        self.uses_topic_ids = uses_topic_ids

    def answer(self, results: list[FetchTopicResult]) -> list[FetchTopicResult]:
        session = self.cache.open(self.asked, self.uses_topic_ids)
        if session is not None:
            self.session_id = session.id
            remember(session, results)
        return results


class IncrementalContext(FetchContext):
    incremental = True

    def __init__(self, request: Any, session: FetchSession) -> None:
        super().__init__(request, [])
        self.session = session
        self.session_id = session.id

    def topics(self) -> list[Any]:
        return self.session.to_read()

    def answer(self, results: list[FetchTopicResult]) -> list[FetchTopicResult]:
        return remember(self.session, results, changed_only=True)


def remember(session: FetchSession, results: list[FetchTopicResult],
             changed_only: bool = False) -> list[FetchTopicResult]:
    """Note what `results` tell the client in the session; with changed_only, keep only the partitions it
    must hear about (see the module's invariants)."""
    answered: list[FetchTopicResult] = []
    moved = []
    for topic in results:
        kept = []
        for result in topic.partitions:
            key = (topic.name, topic.topic_id, result.partition_index)
            cached = session.partitions.get(key)
            if cached is None:  # forgotten by now
                continue
            has_records = bool(result.records)
            must = (has_records or result.error_code != 0 or cached.high_watermark != result.high_watermark
                    or cached.last_stable_offset != result.last_stable_offset
                    or cached.log_start_offset != result.log_start_offset)
            if result.error_code != 0:  # so the partition is answered again once it recovers
                cached.high_watermark = cached.last_stable_offset = cached.log_start_offset = -1
            else:
                cached.high_watermark = result.high_watermark
                cached.last_stable_offset = result.last_stable_offset
                cached.log_start_offset = result.log_start_offset
            if has_records:
                moved.append(key)
            if must or not changed_only:
                kept.append(result)
        if kept or not changed_only:
            answered.append(FetchTopicResult(topic.name, kept, topic.topic_id) if changed_only else topic)
    for key in moved:
        session.partitions.move_to_end(key)
    return answered


class FetchSessionCache:
    """The sessions one worker holds (see the module's docstring for the rules)."""

    def __init__(self, slots: int, eviction_ms: int, worker_index: int, workers: int, clock_ms) -> None:
        self.slots = max(0, slots)
        self.eviction_ms = eviction_ms
        self.worker_index = worker_index
        self.workers = max(1, workers)
        self.clock_ms = clock_ms
        self.sessions: dict[int, FetchSession] = {}
        self.opened = 0
        self.evicted = 0
        self.incremental_fetches = 0
        self.session_errors = 0
        self._random = random.Random()

    def __len__(self) -> int:
        return len(self.sessions)

    def context(self, request: Any, version: int, asked: list[Any], forgotten: list[ForgottenTopic]) -> FetchContext:
        """The context of a Fetch of `version` (sessions exist from v7) asking for `asked` (its topics as the
        handler names them) and forgetting `forgotten`."""
        if version < 7:
            return FetchContext(request, asked)
        session_id, epoch = request.session_id, request.session_epoch
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != NO_SESSION:
                self.sessions.pop(session_id, None)
            if epoch == FINAL_EPOCH or self.slots == 0:
                return FetchContext(request, asked)
            return FullContext(request, asked, self, version >= FETCH_BY_TOPIC_ID)
        session = self.sessions.get(session_id)
        if session is None:
            self.session_errors += 1
            return SessionErrorContext(request, E.FETCH_SESSION_ID_NOT_FOUND)
        if epoch != session.epoch:
            self.session_errors += 1
            return SessionErrorContext(request, E.INVALID_FETCH_SESSION_EPOCH)
        if session.uses_topic_ids != (version >= FETCH_BY_TOPIC_ID):
            self.session_errors += 1
            return SessionErrorContext(request, E.FETCH_SESSION_TOPIC_ID_ERROR)
        session.update(asked, forgotten)
        if not session.partitions:
            del self.sessions[session_id]
            return FetchContext(request, asked)
        session.epoch = session.epoch + 1 if session.epoch < _MAX_EPOCH else 1
        session.last_used_ms = self.clock_ms()
        self.incremental_fetches += 1
        return IncrementalContext(request, session)

    def open(self, asked: list[Any], uses_topic_ids: bool = False) -> FetchSession | None:
        """A new session for a full fetch's partitions (named by id: `uses_topic_ids`), or None when no slot is
        free or can be freed."""
        size = sum(len(topic.partitions) for topic in asked)
        now = self.clock_ms()
        if len(self.sessions) >= self.slots and not self._evict_for(size, now):
            return None
        session = FetchSession(self._new_id(), now, now, uses_topic_ids=uses_topic_ids)
        session.update(asked, ())
        self.sessions[session.id] = session
        self.opened += 1
        return session

    def _evict_for(self, size: int, now: int) -> bool:
        if not self.sessions:
            return False
        stale = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now - stale.last_used_ms > self.eviction_ms:
            victim = stale
        else:
            settled = [s for s in self.sessions.values() if now - s.created_ms > self.eviction_ms]
            if not settled:
                return False
            victim = min(settled, key=lambda s: (len(s.partitions), s.id))
            if size <= len(victim.partitions):  # Kafka's (size, id) order: the newcomer's id counts as 0
                return False
        del self.sessions[victim.id]
        self.evicted += 1
        return True

    def _new_id(self) -> int:
        for _ in range(1000):  # ids are sparse in 2**31: a clash is rare
            session_id = self._random.randrange(1, _MAX_SESSION_ID // self.workers) * self.workers + self.worker_index
            if session_id != NO_SESSION and session_id not in self.sessions:
                return session_id
        raise RuntimeError("no free fetch session id")
