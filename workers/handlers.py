"""Request handlers of a network worker: one method per Kafka API.

Invariants:
- A handler returns an Outcome (workers.outcome): the response when it can answer at once (none for
  Produce with acks=0), or DEFERRED when it must wait (acks=all produce, fetch below min_bytes, topic
  creation or deletion): it hands the wait to the timer process through DelayedRequests
  (workers.delayed), its only view of the timer, and the continuation it registers builds the
  outcome later, exactly once.
- Appends happen here, in the worker, before any wait: the timer only decides *when* to answer.
- Every error a client causes is answered with Kafka's error code for it; exceptions other than
  ProtocolError never escape to the event loop from bad input (StorageError becomes its code).
- One handler serves every supported version of its API: it builds the newest field set and
  `build_entity` keeps what the requested version has.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any, Callable

from kio.static.primitive import i16, i32, i32Timedelta

from node.config import NodeConfig
from node.storage import producer_ids
from node.storage.catalog import valid_topic_name
from node.storage.faults import storage_faults
from node.storage.store import PartitionStore
from node.storage.records import StorageError
from shm import messages as M
from workers import errors as E
from workers import protocol as P
from workers.connection import FileRange, Request
from workers.delayed import Completed, DelayedRequests
from workers.fetch_codec import FetchPartitionResult, FetchTopicResult, encode_fetch_response
from workers.outcome import Outcome
from workers.produce_codec import ProducePartitionResult, ProduceTopicResult, encode_produce_response

log = logging.getLogger("shmbroker.handlers")

_ZERO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))
_ACKS_ALL = -1
_LATEST = -1
_EARLIEST = -2
# zstd batches (codec 4) need Produce v7+ (KIP-110); older requests get UNSUPPORTED_COMPRESSION_TYPE.
_ZSTD = 4
_ZSTD_MIN_PRODUCE_VERSION = 7
_ATTRIBUTES_LOW_BYTE = 22  # offset of the low byte of a v2 batch's attributes
_COMPRESSION_MASK = 0x07


def _code(value: int) -> E.ErrorCode:
    try:
        return E.ErrorCode(value)
    except ValueError:
        return E.UNKNOWN_SERVER_ERROR


def _topic_outcomes(outcome: dict | None, names: list[str]) -> dict[str, tuple[int, str | None]]:
    """The timer's per-topic outcome; None (it never answered): every topic timed out."""
    if outcome is None:
        return {name: (int(E.REQUEST_TIMED_OUT), "timed out") for name in names}
    return {name: (int(code), message) for name, (code, message) in outcome.items()}


def _millis(delta: Any) -> int:
    return int(delta.total_seconds() * 1000) if isinstance(delta, datetime.timedelta) else int(delta)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Handlers:
    def __init__(self, partitions: PartitionStore, config: NodeConfig, delayed: DelayedRequests, cluster_id: str) -> None:
        self.partitions = partitions
        self.config = config
        self.delayed = delayed
        self.cluster_id = cluster_id
        self.dispatch_table: dict[int, Callable[[Any, Any], Any]] = {
            P.PRODUCE: self.produce,
            P.FETCH: self.fetch,
            P.LIST_OFFSETS: self.list_offsets,
            P.METADATA: self.metadata,
            P.API_VERSIONS: self.api_versions,
            P.CREATE_TOPICS: self.create_topics,
            P.DELETE_TOPICS: self.delete_topics,
            P.INIT_PRODUCER_ID: self.init_producer_id,
            P.FIND_COORDINATOR: self.find_coordinator,
        }

    def dispatch(self, req: Request, request: Any) -> Outcome:
        return self.dispatch_table[req.header.api_key](req, request)

    def _frame(self, req: Request, response: Any) -> Outcome:
        h = req.header
        return Outcome.reply([P.encode_response(h.api_key, h.api_version, h.correlation_id, response)])

    def _create_then(self, req: Request, topics: list[tuple[str, int]], rerun: Callable[[], Outcome]) -> Outcome:
        """Auto-create `topics`, then run the request again; `rerun` must not auto-create again (a creation
        that failed, e.g. the node is full, then answers UNKNOWN_TOPIC_OR_PARTITION)."""

        def after(outcome: Any) -> Outcome:
            self.partitions.reload()
            return rerun()

        return self.delayed.topics(req, M.Kind.CREATE_TOPICS, topics, self.config.timer.control_timeout_ms, after)

    def _entity(self, req: Request, class_name: str, /, **values: Any) -> Any:
        schema = P.response_schema(req.header.api_key, req.header.api_version)
        return P.build_entity(getattr(schema, class_name), **values)

    # -- ApiVersions, FindCoordinator, InitProducerId ------------------------------------------

    def api_versions(self, req: Request, request: Any) -> Outcome:
        return self._frame(req, P.api_versions_response(req.header.api_version))

    def find_coordinator(self, req: Request, request: Any) -> Outcome:
        # Groups come with the group coordinator; until then clients are told to retry. librdkafka
        # needs the API advertised at all to enable LZ4 (see workers/protocol.py).
        return self._frame(req, self._entity(
            req, "FindCoordinatorResponse", throttle_time=_ZERO_THROTTLE, error_code=E.ErrorCode.coordinator_not_available,
            error_message="no group coordinator on this node", node_id=i32(-1), host="", port=i32(-1)))

    def init_producer_id(self, req: Request, request: Any) -> Outcome:
        if request.transactional_id is not None:
            code, producer_id = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1
        else:
            try:
                with storage_faults("producer id allocation"):
                    code, producer_id = E.NONE, producer_ids.allocate(self.partitions.data_dir)
            except StorageError as exc:
                log.warning("%s: answering InitProducerId with KAFKA_STORAGE_ERROR (56)", exc)
                code, producer_id = _code(exc.error_code), -1
        return self._frame(req, self._entity(req, "InitProducerIdResponse", throttle_time=_ZERO_THROTTLE,
                                             error_code=code, producer_id=producer_id, producer_epoch=i16(0)))

    # -- Metadata ----------------------------------------------------------------------------

    def metadata(self, req: Request, request: Any, auto_create: bool = True) -> Outcome:
        version = req.header.api_version
        if request.topics is None or (version == 0 and not request.topics):
            names = sorted(self.partitions.catalog.topics)
        else:
            names = [t.name for t in request.topics]
        allow_create = (auto_create and self.config.topics.auto_create_topics
                        and getattr(request, "allow_auto_topic_creation", True))
        missing = [n for n in names if self.partitions.topic_partitions(n) is None and valid_topic_name(n)]
        if missing and allow_create:
            return self._create_then(req, [(n, self.config.topics.num_partitions) for n in missing],
                                     lambda: self.metadata(req, request, auto_create=False))
        server = self.config.server
        node_id = server.node_id
        topics = []
        for name in names:
            count = self.partitions.topic_partitions(name)
            if count is None:
                code = E.UNKNOWN_TOPIC_OR_PARTITION if valid_topic_name(name) else E.INVALID_TOPIC_EXCEPTION
                topics.append(self._entity(req, "MetadataResponseTopic", error_code=code, name=name, partitions=()))
                continue
            partitions = tuple(self._entity(req, "MetadataResponsePartition", error_code=E.NONE, partition_index=i32(p),
                                            leader_id=i32(node_id), leader_epoch=i32(0), replica_nodes=(i32(node_id),),
                                            isr_nodes=(i32(node_id),), offline_replicas=())
                               for p in range(count))
            topics.append(self._entity(req, "MetadataResponseTopic", error_code=E.NONE, name=name,
                                       is_internal=False, partitions=partitions))
        broker = self._entity(req, "MetadataResponseBroker", node_id=i32(node_id),
                              host=server.advertised_host or server.host,
                              port=i32(server.advertised_port or server.port), rack=None)
        return self._frame(req, self._entity(req, "MetadataResponse", throttle_time=_ZERO_THROTTLE, brokers=(broker,),
                                             cluster_id=self.cluster_id,
                                             controller_id=i32(node_id), topics=tuple(topics)))

    # -- CreateTopics / DeleteTopics ---------------------------------------------------------

    def create_topics(self, req: Request, request: Any) -> Outcome:
        results: dict[str, tuple[E.ErrorCode, str | None]] = {}
        wanted: list[tuple[str, int]] = []
        seen: set[str] = set()
        for topic in request.topics:
            name = topic.name
            if name in seen:
                results[name] = (E.INVALID_REQUEST, "topic named twice")
                continue
            seen.add(name)
            partitions = topic.num_partitions if topic.num_partitions != -1 else self.config.topics.num_partitions
            if not valid_topic_name(name):
                results[name] = (E.INVALID_TOPIC_EXCEPTION, f"illegal topic name {name!r}")
            elif topic.replication_factor not in (-1, 1) or topic.assignments:
                results[name] = (E.INVALID_REPLICATION_FACTOR, "this node holds one replica of each partition")
            elif partitions <= 0:
                results[name] = (E.INVALID_PARTITIONS, "partitions must be positive")
            elif self.partitions.topic_partitions(name) is not None:
                results[name] = (E.TOPIC_ALREADY_EXISTS, f"topic {name!r} exists")
            elif request.validate_only:
                results[name] = (E.NONE, None)
            else:
                wanted.append((name, partitions))

        def answer(outcome: dict[str, tuple[int, str | None]] | None) -> Outcome:
            self.partitions.reload()
            for name, (code, message) in _topic_outcomes(outcome, [n for n, _ in wanted]).items():
                results[name] = (_code(code), message)
            return self._frame(req, self._entity(req, "CreateTopicsResponse", throttle_time=_ZERO_THROTTLE, topics=tuple(
                self._entity(req, "CreatableTopicResult", name=t.name, error_code=results[t.name][0],
                             error_message=results[t.name][1])
                for t in request.topics)))

        if not wanted:
            return answer({})
        return self.delayed.topics(req, M.Kind.CREATE_TOPICS, wanted, self.config.timer.control_timeout_ms, answer)

    def delete_topics(self, req: Request, request: Any) -> Outcome:
        names = list(request.topic_names)

        def answer(outcome: dict[str, tuple[int, str | None]] | None) -> Outcome:
            self.partitions.reload()
            outcome = _topic_outcomes(outcome, names)
            return self._frame(req, self._entity(req, "DeleteTopicsResponse", throttle_time=_ZERO_THROTTLE, responses=tuple(
                self._entity(req, "DeletableTopicResult", name=n, error_code=_code(outcome.get(n, (0, None))[0]))
                for n in names)))

        return self.delayed.topics(req, M.Kind.DELETE_TOPICS, names, self.config.timer.control_timeout_ms, answer)

    # -- ListOffsets -------------------------------------------------------------------------

    def list_offsets(self, req: Request, request: Any) -> Outcome:
        topics = []
        for topic in request.topics:
            results = []
            for part in topic.partitions:
                values = {"partition_index": part.partition_index, "error_code": E.NONE, "timestamp": -1, "offset": -1}
                row = self.partitions.row(topic.name, part.partition_index)
                if row is None:
                    values["error_code"] = E.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    try:
                        if part.timestamp == _LATEST:
                            values["offset"] = self.partitions.log(row).state().log_end_offset
                        elif part.timestamp == _EARLIEST:
                            values["offset"] = self.partitions.log(row).state().log_start_offset
                        elif part.timestamp < 0:
                            values["error_code"] = E.INVALID_REQUEST
                        else:
                            found = self.partitions.log(row).offset_for_timestamp(part.timestamp)
                            if found is not None:
                                values["offset"], values["timestamp"] = found
                    except StorageError as exc:
                        values["error_code"] = _code(exc.error_code)
                results.append(self._entity(req, "ListOffsetsPartitionResponse", **values))
            topics.append(self._entity(req, "ListOffsetsTopicResponse", name=topic.name, partitions=tuple(results)))
        return self._frame(req, self._entity(req, "ListOffsetsResponse", throttle_time=_ZERO_THROTTLE, topics=tuple(topics)))

    # -- Produce -----------------------------------------------------------------------------

    def produce(self, req: Request, request: P.ProduceRequestView, auto_create: bool = True) -> Outcome:
        acks = request.acks
        if auto_create and self.config.topics.auto_create_topics:
            missing = sorted({t.name for t in request.topics
                              if self.partitions.topic_partitions(t.name) is None and valid_topic_name(t.name)})
            if missing:
                return self._create_then(req, [(n, self.config.topics.num_partitions) for n in missing],
                                         lambda: self.produce(req, request, auto_create=False))
        now_ms = wall_ms()
        topics: list[ProduceTopicResult] = []
        waits: list[tuple[int, int]] = []  # (row, offset that must be flushed) for acks=all
        for topic in request.topics:
            results = []
            for part in topic.partitions:
                result = ProducePartitionResult(part.index)
                results.append(result)
                if acks not in (0, 1, _ACKS_ALL):
                    result.error_code = E.INVALID_REQUIRED_ACKS
                    continue
                if request.transactional_id is not None:
                    result.error_code = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                    continue
                row = self.partitions.row(topic.name, part.index)
                if row is None:
                    result.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if part.records is None or len(part.records) == 0:
                    result.error_code = E.INVALID_RECORD
                    continue
                if (request.version < _ZSTD_MIN_PRODUCE_VERSION and len(part.records) > _ATTRIBUTES_LOW_BYTE
                        and part.records[_ATTRIBUTES_LOW_BYTE] & _COMPRESSION_MASK == _ZSTD):
                    result.error_code = E.ErrorCode.unsupported_compression_type
                    continue
                try:
                    appended = self.partitions.log(row).append(part.records, now_ms)
                except StorageError as exc:
                    result.error_code = exc.error_code
                    result.error_message = str(exc)
                    continue
                result.base_offset = appended.base_offset
                result.log_start_offset = appended.log_start_offset
                if not appended.duplicate:
                    self.delayed.appended(row)
                if acks == _ACKS_ALL:
                    waits.append((row, appended.last_offset + 1))
            topics.append(ProduceTopicResult(topic.name, results))
        if acks == 0:
            return Outcome.NO_RESPONSE
        h = req.header

        def answer(result: Completed | None = None) -> Outcome:
            if waits:
                failed = result is not None and result.status == M.Status.FAILED
                self._mark_unflushed(topics, waits, result.error_code if failed else E.REQUEST_TIMED_OUT)
            return Outcome.reply([encode_produce_response(h.api_version, h.correlation_id, topics)])

        if not waits or self._all_flushed(waits):
            return answer()
        return self.delayed.delay_produce(req, waits, request.timeout_ms, answer)

    def _all_flushed(self, waits: list[tuple[int, int]]) -> bool:
        table = self.partitions.table
        return all(table.read(row).flushed_offset >= required for row, required in waits)

    def _mark_unflushed(self, topics: list[ProduceTopicResult], waits: list[tuple[int, int]], code: int) -> None:
        """After the wait: partitions whose batch is still not on disk answer `code`: REQUEST_TIMED_OUT, or
        KAFKA_STORAGE_ERROR when the timer says their fsync failed."""
        table = self.partitions.table
        late = {row for row, required in waits if table.read(row).flushed_offset < required}
        if not late:
            return
        for topic in topics:
            for result in topic.partitions:
                if result.error_code == 0 and self.partitions.row(topic.name, result.index) in late:
                    result.error_code = code

    # -- Fetch -------------------------------------------------------------------------------

    def fetch(self, req: Request, request: Any) -> Outcome:
        topics, total, has_error, watch = self._read_fetch(request)
        max_wait_ms = _millis(request.max_wait)
        if total >= request.min_bytes or max_wait_ms <= 0 or has_error or not watch:
            return self._fetch_response(req, topics)
        return self.delayed.delay_fetch(req, watch, request.min_bytes, max_wait_ms,
                                        lambda status: self._fetch_response(req, self._read_fetch(request)[0]))

    def _fetch_response(self, req: Request, topics: list[FetchTopicResult]) -> Outcome:
        h = req.header
        return Outcome.reply(encode_fetch_response(h.api_version, h.correlation_id, topics).pieces)

    def _read_fetch(self, request: Any) -> tuple[list[FetchTopicResult], int, bool, list[tuple[int, int]]]:
        """Read every requested partition: (results, total bytes, any error, [(row, end_bytes)] to watch)."""
        remaining = request.max_bytes if request.max_bytes > 0 else self.config.server.request_max_bytes
        total = 0
        has_error = False
        watch: list[tuple[int, int]] = []
        topics = []
        for topic in request.topics:
            results = []
            for part in topic.partitions:
                row = self.partitions.row(topic.topic, part.partition)
                if row is None:
                    results.append(FetchPartitionResult(part.partition, error_code=E.UNKNOWN_TOPIC_OR_PARTITION))
                    has_error = True
                    continue
                try:
                    log = self.partitions.log(row)
                    limit = min(part.partition_max_bytes, remaining) if part.partition_max_bytes > 0 else remaining
                    piece = log.read(part.fetch_offset, limit, min_one_batch=(total == 0))
                except StorageError as exc:
                    state = self.partitions.table.read(row)
                    results.append(FetchPartitionResult(part.partition, error_code=exc.error_code,
                                                        high_watermark=state.high_watermark,
                                                        log_start_offset=state.log_start_offset))
                    has_error = True
                    continue
                results.append(FetchPartitionResult(
                    part.partition, high_watermark=piece.high_watermark, log_start_offset=piece.log_start_offset,
                    records=[FileRange(fd, position, length) for fd, position, length in piece.ranges]))
                total += piece.size
                remaining = max(0, remaining - piece.size)
                # A delayed fetch counts the bytes appended after the state this read saw: its own end_bytes,
                # not a later look at the table, which could already include an append that raced the read.
                watch.append((row, piece.end_bytes - piece.size))
            topics.append(FetchTopicResult(topic.topic, results))
        return topics, total, has_error, watch
