"""Request handlers of a network worker: one method per Kafka API.

Invariants:
- A handler returns an Outcome (workers.timer_client.outcome): the response when it can answer at once (none for
  Produce with acks=0), or DEFERRED when it must wait (acks=all produce, fetch below min_bytes, topic
  creation or deletion): it hands the wait to the timer process through DelayedRequests
  (workers.timer_client.delayed), its only view of the timer, and the continuation it registers builds the
  outcome later, exactly once.
- Appends happen here, in the worker, before any wait: the timer only decides *when* to answer.
- Every error a client causes is answered with Kafka's error code for it; exceptions other than
  ProtocolError never escape to the event loop from bad input (StorageError becomes its code).
- One handler serves every supported version of its API: it builds the newest field set and
  `build_entity` keeps what the requested version has.
- With the authorizer on, each request is checked as Kafka's KafkaApis checks it, once per topic (the
  connection's cache answers repeats); off, the check is one attribute test per request. Produce: WRITE on the
  transactional id first (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for all), then WRITE per topic; Fetch: READ per
  topic (a follower's: CLUSTER_ACTION on the cluster); ListOffsets: DESCRIBE; Metadata: DESCRIBE (a listing
  leaves the others out, a named topic is refused before its existence is looked at), auto-creation CREATE on
  the cluster or the topic; InitProducerId without a transactional id: IDEMPOTENT_WRITE on the cluster or WRITE
  on some topic (CLUSTER_AUTHORIZATION_FAILED). A refused topic is TOPIC_AUTHORIZATION_FAILED and is not
  created, read or written; KIP-430's authorized operations are the principal's.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any, Callable

from kio.static.primitive import i16, i32

from shmbroker.node.config import NodeConfig
from shmbroker.node.storage import producer_ids
from shmbroker.node.storage.acls import CLUSTER_NAME, Operation, ResourceType
from shmbroker.node.storage.catalog import valid_topic_name
from shmbroker.node.storage.faults import storage_faults
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.storage.records import TRANSACTIONAL_BIT, StorageError
from shmbroker.shm import messages as M
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import FileRange, Request
from shmbroker.workers.timer_client.delayed import Completed, DelayedRequests, monotonic_ms
from shmbroker.workers.api.acls import AclHandlers
from shmbroker.workers.api.admin import AdminHandlers
from shmbroker.workers.api.authorizer import NOTHING_DENIED, RequestAuthorizer
from shmbroker.workers.api.scram_credentials import ScramCredentialHandlers
from shmbroker.workers.api.fetch_sessions import (FETCH_BY_TOPIC_ID, NO_SESSION, FINAL_EPOCH, FetchContext,
                                                  FetchSessionCache, ForgottenTopic)
from shmbroker.workers.api.repeated_fetch import IdleRead, RepeatedFetch
from shmbroker.workers.api.consumer_groups import ConsumerGroupHandlers
from shmbroker.workers.api.share_groups import ShareGroupHandlers
from shmbroker.workers.api.streams_groups import StreamsGroupHandlers
from shmbroker.workers.api.cluster import ClusterHandlers
from shmbroker.workers.api.client_quotas import ClientQuotaHandlers
from shmbroker.workers.api.groups import GroupHandlers
from shmbroker.workers.api.transactions import TransactionHandlers, expected_producer
from shmbroker.workers.api.txn_markers import TxnMarkerHandlers
from shmbroker.workers.codecs.fetch import FetchPartitionResult, FetchTopicResult, encode_fetch_response
from shmbroker.workers.api import priority
from shmbroker.workers.timer_client.outcome import Outcome
from shmbroker.workers.codecs.produce import ProducePartitionResult, ProduceTopicResult, encode_produce_response
from shmbroker.workers.api.quotas import FETCH, PRODUCE, Throttler
from shmbroker.workers.api.responses import NOT_REQUESTED, ZERO_THROTTLE, code, entity, reply

log = logging.getLogger("shmbroker.handlers")

_ACKS_ALL = -1
# KIP-219: from these versions a client backs off by itself on throttle_time_ms: answer at once, mute the
# connection; older ones get their response held back for the throttle time.
_SELF_THROTTLING_PRODUCE_VERSION = 6
_SELF_THROTTLING_FETCH_VERSION = 8
LEADER_EPOCH = 0  # a single node leads every partition from its creation on: epoch 0, as a fresh Kafka partition
_LATEST = -1
_READ_COMMITTED = 1  # isolation_level of Fetch v4+ and ListOffsets v2+
_EARLIEST = -2
# ListOffsets' other special timestamps and the version that brought each: the record of the largest timestamp
# (KIP-734), and tiered storage's (KIP-1005), which a node without it answers as Kafka does without it: the
# local log is the whole log, and nothing is tiered (offset -1).
_MAX_TIMESTAMP, _EARLIEST_LOCAL, _LATEST_TIERED = -3, -4, -5
_SPECIAL_TIMESTAMP_SINCE = {_MAX_TIMESTAMP: 7, _EARLIEST_LOCAL: 8, _LATEST_TIERED: 9}
# zstd batches (codec 4) need Produce v7+ (KIP-110); older requests get UNSUPPORTED_COMPRESSION_TYPE.
_ZSTD = 4
_ZSTD_MIN_PRODUCE_VERSION = 7
_ATTRIBUTES_LOW_BYTE = 22  # offset of the low byte of a v2 batch's attributes
_COMPRESSION_MASK = 0x07
# The per-topic check of Fetch names these; module names, as an Enum member's lookup costs 50 ns.
_READ, _TOPIC = Operation.READ, ResourceType.TOPIC
_CLUSTER_OPERATIONS_IN_METADATA = (8, 10)  # the versions of Metadata with cluster_authorized_operations



def _millis(delta: Any) -> int:
    return int(delta.total_seconds() * 1000) if isinstance(delta, datetime.timedelta) else int(delta)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Handlers:
    def __init__(self, partitions: PartitionStore, config: NodeConfig, delayed: DelayedRequests, cluster_id: str,
                 throttler: Throttler, fetch_sessions: FetchSessionCache,
                 authorizer: RequestAuthorizer | None = None) -> None:
        self.partitions = partitions
        self.authorizer = authorizer = authorizer or RequestAuthorizer.open_to_all()
        self.fetch_sessions = fetch_sessions
        self.config = config
        self.delayed = delayed
        self.cluster_id = cluster_id
        self.throttler = throttler
        self.quotas = throttler.quotas
        self.level_names = priority.LevelNames(config.priority.max_levels, config.topics.max_partitions)
        self.transactions = TransactionHandlers(config, delayed, authorizer)
        # Called once a Produce's appends are done, before its response is built: the worker answers the long
        # polls they satisfied first (their clients are the ones waiting; the producer's ack can wait a moment).
        self.after_appends: Callable[[], None] | None = None
        self.fetches_answered_from_first_read = 0  # expired long polls answered without a read again (stats)
        self.idle_fetches_repeated = 0  # long polls that waited on the kept empty first read of their request (stats)
        self.dispatch_table: dict[int, Callable[[Any, Any], Any]] = {
            P.PRODUCE: self.produce,
            P.FETCH: self.fetch,
            P.LIST_OFFSETS: self.list_offsets,
            P.METADATA: self.metadata,
            P.API_VERSIONS: self.api_versions,
            P.INIT_PRODUCER_ID: self.init_producer_id,
            **GroupHandlers(config, delayed, authorizer).table(),
            **ConsumerGroupHandlers(partitions, config, delayed, authorizer).table(),
            **StreamsGroupHandlers(config, delayed, authorizer).table(),
            **ShareGroupHandlers(partitions, config, delayed, authorizer).table(),
            **self.transactions.table(),
            **TxnMarkerHandlers(partitions, config, delayed, authorizer).table(),
            **AdminHandlers(partitions, config, delayed, authorizer).table(),
            **ClusterHandlers(partitions, config, cluster_id, authorizer).table(),
            **ClientQuotaHandlers(lambda: self.config, authorizer).table(),
            **AclHandlers(partitions, authorizer).table(),
            **ScramCredentialHandlers(partitions.data_dir, authorizer).table(),
        }

    def dispatch(self, req: Request, request: Any) -> Outcome:
        return self.dispatch_table[req.header.api_key](req, request)


    def _create_then(self, req: Request, topics: list[tuple[str, int]], rerun: Callable[[], Outcome]) -> Outcome:
        """Auto-create `topics`, then run the request again; `rerun` must not auto-create again (a creation
        that failed, e.g. the node is full, then answers UNKNOWN_TOPIC_OR_PARTITION)."""

        def after(outcome: Any) -> Outcome:
            self.partitions.reload()
            return rerun()

        wait_ms = self.config.timer.control_timeout_ms
        document = {"topics": [[name, count, {}] for name, count in topics], "validate_only": False, "explicit": False}
        frame = M.encode(M.Kind.CREATE_TOPICS, 0, monotonic_ms() + wait_ms, document=document)
        return self.delayed.ask(req, frame, wait_ms, after)

    # -- ApiVersions, FindCoordinator, InitProducerId ------------------------------------------

    def api_versions(self, req: Request, request: Any) -> Outcome:
        return reply(req, P.api_versions_response(req.header.api_version))

    def init_producer_id(self, req: Request, request: Any) -> Outcome:
        if request.transactional_id is not None:  # the transaction coordinator's (in the timer process)
            return self.transactions.init_producer_id(req, request)
        # v3+: only one of producer id and epoch is INVALID_REQUEST; an idempotent producer naming both (an epoch
        # bump, KIP-360) gets a new producer id below, as Kafka answers it.
        if expected_producer(request) is None:
            return reply(req, entity(req, "InitProducerIdResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=E.INVALID_REQUEST, producer_id=-1, producer_epoch=i16(-1)))
        if self.authorizer.enabled and not self._may_be_idempotent(req):
            return reply(req, entity(req, "InitProducerIdResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=E.CLUSTER_AUTHORIZATION_FAILED, producer_id=-1,
                                     producer_epoch=i16(-1)))
        try:
            with storage_faults("producer id allocation"):
                error_code, producer_id = E.NONE, producer_ids.allocate(self.partitions.data_dir)
        except StorageError as exc:
            log.warning("%s: answering InitProducerId with KAFKA_STORAGE_ERROR (56)", exc)
            error_code, producer_id = code(exc.error_code), -1
        return reply(req, entity(req, "InitProducerIdResponse", throttle_time=ZERO_THROTTLE,
                                 error_code=error_code, producer_id=producer_id, producer_epoch=i16(0)))

    def _may_be_idempotent(self, req: Request) -> bool:
        """IDEMPOTENT_WRITE on the cluster (asked quietly, as Kafka), or WRITE on some topic (KIP-679)."""
        authorizer = self.authorizer
        return (authorizer.allows(req, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME,
                                  count_denial=False)
                or authorizer.allows_any(req, Operation.WRITE, ResourceType.TOPIC))

    # -- Metadata ----------------------------------------------------------------------------

    def metadata(self, req: Request, request: Any, auto_create: bool = True) -> Outcome:
        version = req.header.api_version
        unknown_ids: list[Any] = []  # v10+: topics asked for by an id no live topic has
        asked_by_id: dict[str, Any] = {}  # names of the topics asked for by id, to their ids
        listing = request.topics is None or (version == 0 and not request.topics)
        if listing:
            names = sorted(self.partitions.catalog.topics)
        else:
            names = []
            for t in request.topics:
                topic_id = getattr(t, "topic_id", None)
                if topic_id is None or t.name is not None:
                    names.append(t.name)
                    continue
                name = self.partitions.topic_by_id(topic_id)
                if name is None:
                    unknown_ids.append(topic_id)
                else:
                    names.append(name)
                    asked_by_id[name] = topic_id
        may_create = self.config.topics.auto_create_topics and getattr(request, "allow_auto_topic_creation", True)
        refused: dict[str, Any] = {}  # name -> the TOPIC_AUTHORIZATION_FAILED entry answered for it
        if self.authorizer.enabled:
            names = self._describable_topics(req, names, listing, asked_by_id, refused)
            if may_create:
                self._refuse_creations(req, names, refused)
                names = [n for n in names if n not in refused]
        missing = [n for n in names if self.partitions.topic_partitions(n) is None and valid_topic_name(n)]
        if missing and may_create and auto_create:
            return self._create_then(req, [(n, self.config.topics.num_partitions) for n in missing],
                                     lambda: self.metadata(req, request, auto_create=False))
        server = self.config.server
        node_id = server.node_id
        include_operations = getattr(request, "include_topic_authorized_operations", False)
        topics = [entity(req, "MetadataResponseTopic", error_code=E.UNKNOWN_TOPIC_ID, name=None, topic_id=topic_id,
                         partitions=()) for topic_id in unknown_ids]
        topics.extend(refused.values())
        for name in names:
            count = self.partitions.topic_partitions(name)
            if count is None:
                code = E.UNKNOWN_TOPIC_OR_PARTITION if valid_topic_name(name) else E.INVALID_TOPIC_EXCEPTION
                topics.append(entity(req, "MetadataResponseTopic", error_code=code, name=name, topic_id=None,
                                     partitions=()))
                continue
            partitions = tuple(entity(req, "MetadataResponsePartition", error_code=E.NONE, partition_index=i32(p),
                                            leader_id=i32(node_id), leader_epoch=i32(LEADER_EPOCH), replica_nodes=(i32(node_id),),
                                            isr_nodes=(i32(node_id),), offline_replicas=())
                               for p in range(count))
            operations = (self.authorizer.operations(req, ResourceType.TOPIC, name) if include_operations
                          else NOT_REQUESTED)
            topics.append(entity(req, "MetadataResponseTopic", error_code=E.NONE, name=name,
                                 topic_id=self.partitions.topic_id(name),
                                 is_internal=self.partitions.is_internal(name), partitions=partitions,
                                 topic_authorized_operations=i32(operations)))
        host, port = req.conn.advertised or (server.advertised_host or server.host,
                                             server.advertised_port or server.port)
        broker = entity(req, "MetadataResponseBroker", node_id=i32(node_id), host=host, port=i32(port), rack=None)
        cluster_operations = self.authorizer.cluster_operations(
            req, _CLUSTER_OPERATIONS_IN_METADATA[0] <= version <= _CLUSTER_OPERATIONS_IN_METADATA[1]
            and getattr(request, "include_cluster_authorized_operations", False))
        return reply(req, entity(req, "MetadataResponse", throttle_time=ZERO_THROTTLE, brokers=(broker,),
                                             cluster_id=self.cluster_id,
                                             controller_id=i32(node_id), topics=tuple(topics),
                                             cluster_authorized_operations=i32(cluster_operations),
                                             error_code=E.NONE))  # v13 (KIP-1102): never REBOOTSTRAP_REQUIRED here

    def _describable_topics(self, req: Request, names: list[str], listing: bool, asked_by_id: dict[str, Any],
                            refused: dict[str, Any]) -> list[str]:
        """The topics of a Metadata the principal may DESCRIBE. A listing leaves the others out unsaid; a topic
        asked for by name is refused without saying whether it exists, one asked for by id with its id only
        (ids are not secret, names are)."""
        allows = self.authorizer.allows
        if listing:
            return [n for n in names if allows(req, Operation.DESCRIBE, ResourceType.TOPIC, n, count_denial=False)]
        described = []
        for name in names:
            if allows(req, Operation.DESCRIBE, ResourceType.TOPIC, name):
                described.append(name)
            elif name in asked_by_id:
                refused[name] = entity(req, "MetadataResponseTopic", error_code=E.TOPIC_AUTHORIZATION_FAILED,
                                       name=None, topic_id=asked_by_id[name], partitions=())
            else:
                refused[name] = entity(req, "MetadataResponseTopic", error_code=E.TOPIC_AUTHORIZATION_FAILED,
                                       name=name, topic_id=None, partitions=())
        return described

    def _refuse_creations(self, req: Request, names: list[str], refused: dict[str, Any]) -> None:
        """Auto-creation needs CREATE on the cluster or on the topic: the missing topics the principal may not
        create are refused (TOPIC_AUTHORIZATION_FAILED), as Kafka answers them."""
        missing = [n for n in names if self.partitions.topic_partitions(n) is None and valid_topic_name(n)]
        if not missing or self._may_create_topics(req):
            return
        for name in missing:
            if not self.authorizer.allows(req, Operation.CREATE, ResourceType.TOPIC, name):
                refused[name] = entity(req, "MetadataResponseTopic", error_code=E.TOPIC_AUTHORIZATION_FAILED,
                                       name=name, topic_id=None, partitions=())

    def _may_create_topics(self, req: Request) -> bool:
        """CREATE on the cluster: any topic (Kafka asks it quietly, then CREATE on each topic)."""
        return self.authorizer.allows(req, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME, count_denial=False)

    # -- ListOffsets -------------------------------------------------------------------------

    def list_offsets(self, req: Request, request: Any) -> Outcome:
        committed = getattr(request, "isolation_level", 0) == _READ_COMMITTED  # latest: the LSO (v2+)
        version = req.header.api_version  # v10's timeout_ms waits for tiered offsets: nothing here waits
        topics = []
        checking = self.authorizer.enabled
        for topic in request.topics:
            results = []
            refused = checking and not self.authorizer.allows(req, Operation.DESCRIBE, ResourceType.TOPIC, topic.name)
            for part in topic.partitions:
                values = {"partition_index": part.partition_index, "error_code": E.NONE, "timestamp": -1, "offset": -1}
                row = None if refused else self.partitions.row(topic.name, part.partition_index)
                if refused:
                    values["error_code"] = E.TOPIC_AUTHORIZATION_FAILED
                elif row is None:
                    values["error_code"] = E.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    try:
                        timestamp = part.timestamp
                        if _SPECIAL_TIMESTAMP_SINCE.get(timestamp, 0) > version:
                            values["error_code"] = E.INVALID_REQUEST
                        elif timestamp == _LATEST:
                            state = self.partitions.log(row).state()
                            values["offset"] = state.last_stable_offset if committed else state.log_end_offset
                        elif timestamp in (_EARLIEST, _EARLIEST_LOCAL):
                            values["offset"] = self.partitions.log(row).state().log_start_offset
                        elif timestamp == _MAX_TIMESTAMP:
                            found = self.partitions.log(row).offset_of_max_timestamp()
                            if found is not None:
                                values["offset"], values["timestamp"] = found
                        elif timestamp == _LATEST_TIERED:
                            pass  # offset -1: nothing is in tiered storage
                        elif timestamp < 0:
                            values["error_code"] = E.INVALID_REQUEST
                        else:
                            found = self.partitions.log(row).offset_for_timestamp(timestamp)
                            if found is not None:
                                values["offset"], values["timestamp"] = found
                    except StorageError as exc:
                        values["error_code"] = code(exc.error_code)
                if values["offset"] >= 0:  # as Kafka: the epoch of the offset found (the node's is always 0)
                    values["leader_epoch"] = LEADER_EPOCH
                results.append(entity(req, "ListOffsetsPartitionResponse", **values))
            topics.append(entity(req, "ListOffsetsTopicResponse", name=topic.name, partitions=tuple(results)))
        return reply(req, entity(req, "ListOffsetsResponse", throttle_time=ZERO_THROTTLE, topics=tuple(topics)))

    # -- Produce -----------------------------------------------------------------------------

    def produce(self, req: Request, request: P.ProduceRequestView, auto_create: bool = True) -> Outcome:
        acks = request.acks
        refusal, denied = (self._produce_refusals(req, request) if self.authorizer.enabled
                           else (E.NONE, NOTHING_DENIED))
        if auto_create and self.config.topics.auto_create_topics and not refusal:
            missing = sorted({t.name for t in request.topics
                              if self.partitions.topic_partitions(t.name) is None and valid_topic_name(t.name)
                              and t.name not in denied})
            if missing and self.authorizer.enabled and not self._may_create_topics(req):
                missing = [n for n in missing if self.authorizer.allows(req, Operation.CREATE, ResourceType.TOPIC, n)]
            if missing:
                return self._create_then(req, [(n, self.config.topics.num_partitions) for n in missing],
                                         lambda: self.produce(req, request, auto_create=False))
        now_ms = wall_ms()
        topics: list[ProduceTopicResult] = []
        waits: list[tuple[int, int]] = []  # (row, offset that must be flushed) for acks=all
        record_bytes = 0
        partitions = appended_partitions = 0  # equal: no partition answers an error (yet: see answer)
        for topic in request.topics:
            results = []
            refused = refusal or (E.TOPIC_AUTHORIZATION_FAILED if topic.name in denied else E.NONE)
            for part in topic.partitions:
                if part.records is not None:
                    record_bytes += len(part.records)
                result = ProducePartitionResult(part.index)
                results.append(result)
                if acks not in (0, 1, _ACKS_ALL):
                    result.error_code = E.INVALID_REQUIRED_ACKS
                    continue
                if refused:
                    result.error_code = refused
                    continue
                row = self.partitions.row(topic.name, part.index)
                if row is None:
                    result.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if self.partitions.is_internal(topic.name):  # as Kafka: only the node writes __consumer_offsets
                    result.error_code = E.INVALID_TOPIC_EXCEPTION
                    result.error_message = f"{topic.name} is internal to the node"
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
                    result.record_errors = exc.record_errors
                    continue
                result.base_offset = appended.base_offset
                result.log_start_offset = appended.log_start_offset
                result.log_append_time_ms = appended.log_append_time
                appended_partitions += 1
                if not appended.duplicate:
                    self.delayed.appended(row)
                if appended.wants_flush:
                    self.delayed.wants_flush(row)
                if acks == _ACKS_ALL:
                    if part.records[_ATTRIBUTES_LOW_BYTE] & TRANSACTIONAL_BIT:
                        # A transaction's records are made durable by its commit (EndTxn fsyncs every partition
                        # of the transaction before its decision), so they are answered once appended, as
                        # acks=1 is (the page cache outlives any process). A group-commit round starts now, so
                        # that little is left for the commit to wait on.
                        self.delayed.wants_flush(row)
                    else:
                        waits.append((row, appended.last_offset + 1))
            topics.append(ProduceTopicResult(topic.name, results))
            partitions += len(results)
        all_appended = appended_partitions == partitions
        if self.after_appends is not None:
            self.after_appends()
        h = req.header
        client = h.client_id
        self.quotas.charge(client, PRODUCE, record_bytes)
        throttle_ms = self.quotas.throttle_ms(client, PRODUCE)
        if acks == 0:
            if not all_appended:  # as Kafka: the client has no other way to learn of it
                return Outcome.closing(_acks0_refusal(topics), lambda: _error_codes(topics))
            return self.throttler.apply(req, Outcome.NO_RESPONSE, client, PRODUCE, throttle_ms, mutes=True)
        mutes = h.api_version >= _SELF_THROTTLING_PRODUCE_VERSION

        def answer(result: Completed | None = None) -> Outcome:
            clean = all_appended
            if waits:
                failed = result is not None and result.status == M.Status.FAILED
                clean &= not self._mark_unflushed(topics, waits, result.error_code if failed else E.REQUEST_TIMED_OUT)
            outcome = Outcome.reply([encode_produce_response(h.api_version, h.correlation_id, topics, throttle_ms)],
                                    None if clean else
                                    lambda: _error_codes(topics))
            return outcome if mutes else self.throttler.apply(req, outcome, client, PRODUCE, throttle_ms, False)

        if not waits or self._all_flushed(waits):
            return self.throttler.apply(req, answer(), client, PRODUCE, throttle_ms, mutes) if mutes else answer()
        if mutes:  # answered later (after the fsync), muted from now on
            self.throttler.apply(req, Outcome.NO_RESPONSE, client, PRODUCE, throttle_ms, True)
        return self.delayed.delay_produce(req, waits, request.timeout_ms, answer)

    def _produce_refusals(self, req: Request, request: P.ProduceRequestView) -> tuple[E.ErrorCode, frozenset[str]]:
        """(the error of every partition, or NONE; the topics the principal may not WRITE). A transactional
        producer needs WRITE on its transactional id first (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for all)."""
        if request.transactional_id is not None and not self.authorizer.allows(
                req, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
            return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, NOTHING_DENIED
        return E.NONE, self.authorizer.topics_not_writable(req, request.topics)

    def _all_flushed(self, waits: list[tuple[int, int]]) -> bool:
        table = self.partitions.table
        return all(table.read(row).flushed_offset >= required for row, required in waits)

    def _mark_unflushed(self, topics: list[ProduceTopicResult], waits: list[tuple[int, int]], code: int) -> bool:
        """After the wait: partitions whose batch is still not on disk answer `code`: REQUEST_TIMED_OUT, or
        KAFKA_STORAGE_ERROR when the timer says their fsync failed. True if there were any."""
        table = self.partitions.table
        late = {row for row, required in waits if table.read(row).flushed_offset < required}
        if not late:
            return False
        for topic in topics:
            for result in topic.partitions:
                if result.error_code == 0 and self.partitions.row(topic.name, result.index) in late:
                    result.error_code = code
        return True

    # -- Fetch -------------------------------------------------------------------------------

    def fetch(self, req: Request, request: Any) -> Outcome:
        last = req.conn.last_fetch
        if last is not None and last.request is request:
            if last.idle is not None:
                outcome = self._repeat_idle_fetch(req, request, last)
                if outcome is not None:
                    return outcome
                last.idle = None
        else:
            last = None
        context = self.fetch_sessions.context(request, req.header.api_version, self._fetch_topics(request),
                                              self._forgotten_topics(request))
        if context.error_code:
            return self._fetch_response(req, context, [])
        client = req.header.client_id
        throttle_ms = self.quotas.throttle_ms(client, FETCH)
        if throttle_ms:  # over its quota: no records (and no charge), the client waits out the throttle
            mutes = req.header.api_version >= _SELF_THROTTLING_FETCH_VERSION
            held = [] if context.incremental else self._empty_fetch(req, request)
            return self.throttler.apply(req, self._fetch_response(req, context, held, throttle_ms), client,
                                        FETCH, throttle_ms, mutes)
        topics, read = self._read_fetch(req, request, context.topics())
        max_wait_ms = _millis(request.max_wait)
        # As Kafka, a partition refused its READ does not answer a long poll at once: the others may wait.
        if read.total >= request.min_bytes or max_wait_ms <= 0 or read.has_error or not read.watch:
            return self._charged_fetch_response(req, context, topics, read.has_error or read.refused)
        # An idle long poll read nothing: if it expires with every partition as this read left it, this read is
        # its answer (the ACL checks of a read again are skipped only with the authorizer off).
        first = None
        if read.total == 0 and not self.authorizer.enabled:
            first = (topics, read.watch, self.partitions.catalog.version)
        if first is None or type(context) is not FetchContext or not _sessionless(request):
            last = None  # nothing of this read is kept for a repeat
        return self.delayed.delay_fetch(req, read.watch, request.min_bytes, max_wait_ms,
                                        lambda status: self._fetch_again(req, context, status, first, last))

    def _repeat_idle_fetch(self, req: Request, request: Any, last: RepeatedFetch) -> Outcome | None:
        """The same sessionless long poll again, its first read's partitions unchanged: it waits on that read's
        watch items without reading. None: it must be served in full (the authorizer on since, a throttle, or
        something changed)."""
        idle = last.idle
        if self.authorizer.enabled or self.quotas.throttle_ms(req.header.client_id, FETCH) \
                or not idle.unchanged(self.partitions.table, self.partitions.catalog.version):
            return None
        self.idle_fetches_repeated += 1
        first = (idle.topics, idle.watch, idle.catalog_version)
        return self.delayed.delay_fetch(req, idle.watch, request.min_bytes, _millis(request.max_wait),
                                        lambda status: self._fetch_again(req, idle.context, status, first, last, idle))

    def _fetch_again(self, req: Request, context: FetchContext, status: Completed | None,
                     first: tuple[list[FetchTopicResult], list[tuple[int, int, int]], int] | None,
                     last: RepeatedFetch | None = None, idle: IdleRead | None = None) -> Outcome:
        """A delayed fetch's answer: the first read's, when it expired and nothing it read has changed since (the
        common idle long poll: the same bytes a read again would give); else its partitions read again, now.
        `idle`: the repeat's IdleRead, whose encoded answer serves while its rows keep their versions. `last`:
        the connection's RepeatedFetch of a sessionless request, which keeps an IdleRead of a first read that
        served (workers.api.repeated_fetch)."""
        if status is not None and status.status == M.Status.EXPIRED:
            if idle is not None and idle.unchanged(self.partitions.table, self.partitions.catalog.version):
                return self._idle_answer(req, idle)
            row_versions = self._versions_as_read(first[0], first[1]) \
                if first is not None and self.partitions.catalog.version == first[2] else None
            if row_versions is not None:
                if last is None:
                    self.fetches_answered_from_first_read += 1
                    return self._charged_fetch_response(req, context, first[0], False)
                last.idle = IdleRead(context, *first, row_versions)
                return self._idle_answer(req, last.idle)
        topics, read = self._read_fetch(req, context.request, context.topics())
        return self._charged_fetch_response(req, context, topics, read.has_error or read.refused)

    def _idle_answer(self, req: Request, idle: IdleRead) -> Outcome:
        self.fetches_answered_from_first_read += 1
        h = req.header
        return Outcome.reply([idle.answer(h.api_version, h.correlation_id)], None)

    def _versions_as_read(self, topics: list[FetchTopicResult],
                          watch: list[tuple[int, int, int]]) -> list[tuple[int, int]] | None:
        """(row, version) of every partition of an empty read, if each row now holds what that read answered:
        online, no byte appended past the read, the same high watermark, last stable offset and log start.
        None if one does not."""
        start_bytes = {row: start for row, start, _ in watch}
        row_of, table = self.partitions.row, self.partitions.table
        versions = []
        for topic in topics:
            for result in topic.partitions:
                row = row_of(topic.name, result.partition_index)
                start = start_bytes.get(row) if row is not None else None
                if start is None:
                    return None
                version, state = table.read_versioned(row)
                if (not state.online or state.end_bytes != start or state.high_watermark != result.high_watermark
                        or state.last_stable_offset != result.last_stable_offset
                        or state.log_start_offset != result.log_start_offset):
                    return None
                versions.append((row, version))
        return versions

    def _charged_fetch_response(self, req: Request, context: FetchContext, topics: list[FetchTopicResult],
                                has_error: bool) -> Outcome:
        self.quotas.charge(req.header.client_id, FETCH,
                           sum(piece.length for t in topics for p in t.partitions for piece in p.records))
        return self._fetch_response(req, context, context.answer(topics), has_error=has_error)

    def _fetch_response(self, req: Request, context: FetchContext, topics: list[FetchTopicResult],
                        throttle_ms: int = 0, has_error: bool = True) -> Outcome:
        """has_error False: no partition carries an error code (the reads said so), none to look for."""
        h = req.header
        return Outcome.reply(encode_fetch_response(h.api_version, h.correlation_id, topics,
                                                   throttle_time_ms=throttle_ms, error_code=context.error_code,
                                                   session_id=context.session_id).pieces,
                             lambda: (((context.error_code,) if context.error_code else ())
                                      + tuple(p.error_code for t in topics for p in t.partitions if p.error_code))
                             if has_error or context.error_code else None)

    def _empty_fetch(self, req: Request, request: Any) -> list[FetchTopicResult]:
        """The answer of a throttled fetch: every partition, no records."""
        topics = []
        asked = self._fetch_topics(request)
        refused = self._fetch_refusals(req, request, asked) if self.authorizer.enabled else _NOTHING_REFUSED
        for index, topic in enumerate(asked):
            results = []
            for part in topic.partitions:
                if index in refused:
                    results.append(FetchPartitionResult(part.partition, error_code=E.TOPIC_AUTHORIZATION_FAILED))
                    continue
                row = self.partitions.row(topic.topic, part.partition)
                if row is None:
                    results.append(FetchPartitionResult(part.partition, error_code=_unknown(topic.topic)))
                    continue
                state = self.partitions.table.read(row)
                results.append(FetchPartitionResult(part.partition, high_watermark=state.high_watermark,
                                                    last_stable_offset=state.last_stable_offset,
                                                    log_start_offset=state.log_start_offset))
            topics.append(FetchTopicResult(topic.topic, results, getattr(topic, "id_bytes", _ZERO_ID)))
        return topics

    def _fetch_topics(self, request: Any) -> Any:
        """The request's topics, each with its name as `.topic`: as they come up to v12; from v13 (topic ids,
        KIP-516) each looked up in this worker's catalog (a dict; None for an id no live topic has)."""
        if request.__version__ < FETCH_BY_TOPIC_ID:
            return request.topics
        by_id = self.partitions.topic_by_id
        return [_TopicById(by_id(topic.topic_id) if topic.topic_id is not None else None, topic.topic_id,
                           topic.partitions) for topic in request.topics]

    def _forgotten_topics(self, request: Any) -> list[ForgottenTopic]:
        """The partitions a Fetch v7+ asks its session to forget, named as _fetch_topics names topics."""
        forgotten = getattr(request, "forgotten_topics_data", ())
        if request.__version__ < FETCH_BY_TOPIC_ID:
            return [ForgottenTopic(topic.topic, b"", topic.partitions) for topic in forgotten]
        by_id = self.partitions.topic_by_id
        return [ForgottenTopic(by_id(topic.topic_id) if topic.topic_id is not None else None,
                               _ZERO_ID if topic.topic_id is None else topic.topic_id.bytes, topic.partitions)
                for topic in forgotten]

    def _read_fetch(self, req: Request, request: Any, topics: list[Any]) -> tuple[list[FetchTopicResult], "_FetchRead"]:
        """Read every partition of `topics` (the request's own as _fetch_topics names them, or its fetch
        session's) under the request's limits: (results, the reads: total bytes, errors, refusals, the items to
        watch (shm.fetch_condition)). A topic the principal may not READ answers TOPIC_AUTHORIZATION_FAILED and
        is not read (checked on every read, so a session's partitions follow ACL changes).

        The levels of a priority topic share the budget as workers.api.priority says, when the node splits it."""
        read = _FetchRead(request.max_bytes if request.max_bytes > 0 else self.config.server.request_max_bytes,
                          request.isolation_level == _READ_COMMITTED)
        refused = self._fetch_refusals(req, request, topics) if self.authorizer.enabled else _NOTHING_REFUSED
        families = self.level_names.families(topics) if self.config.priority.fetch_split else None
        in_family = {index: family for family, indices in (families or {}).items() for index in indices}
        if refused:
            read.refused = True
            families = {family: [i for i in indices if i not in refused] for family, indices in families.items()} \
                if families else families
        results: list[list[FetchPartitionResult] | None] = [None] * len(topics)
        for index, topic in enumerate(topics):
            family = in_family.get(index)
            if index in refused:
                results[index] = [FetchPartitionResult(part.partition, error_code=E.TOPIC_AUTHORIZATION_FAILED)
                                  for part in topic.partitions]
            elif family is None:
                results[index] = [self._read_partition(read, topic.topic, part) for part in topic.partitions]
            elif results[index] is None:  # the family's first topic: all its levels now
                self._read_family(read, topics, families[family], results)
        if request.__version__ >= FETCH_BY_TOPIC_ID:
            answered = [FetchTopicResult(topic.topic, parts, topic.id_bytes) for topic, parts in zip(topics, results)]
        else:
            answered = [FetchTopicResult(topic.topic, parts) for topic, parts in zip(topics, results)]
        return answered, read

    def _fetch_refusals(self, req: Request, request: Any, topics: list[Any]) -> frozenset[int]:
        """The indexes in `topics` the principal may not fetch: a consumer needs READ on each topic; a
        follower (replica id >= 0) CLUSTER_ACTION on the cluster, which covers them all."""
        allows = self.authorizer.allows
        if _replica_id(request) >= 0:
            if allows(req, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
                return _NOTHING_REFUSED
            return frozenset(range(len(topics)))
        # A topic id no live topic has (topic None) answers UNKNOWN_TOPIC_ID, unchecked.
        return frozenset(index for index, topic in enumerate(topics) if topic.topic is not None
                         and not allows(req, _READ, _TOPIC, topic.topic))

    def _read_partition(self, read: "_FetchRead", topic: str, part: Any) -> FetchPartitionResult:
        result, row, piece = self._read_piece(topic, part, read.limit(part), (read.total == 0), read.committed)
        return read.add(result, row, piece)

    def _read_piece(self, topic: str, part: Any, limit: int, min_one_batch: bool, committed: bool) -> tuple:
        """(result, row, the log's FetchSlice or None on an error) of one partition read up to `limit`;
        `committed` (read_committed): below the LSO, with the aborted transactions of the range."""
        row = self.partitions.row(topic, part.partition)
        if row is None:
            return FetchPartitionResult(part.partition, error_code=_unknown(topic)), None, None
        try:
            plog = self.partitions.log(row)
            piece = plog.read(part.fetch_offset, limit, min_one_batch=min_one_batch, committed=committed)
            aborted = ()
            if committed and piece.size:
                aborted = [(entry.producer_id, entry.first_offset)
                           for entry in plog.aborted_transactions(part.fetch_offset, piece.last_stable_offset)]
        except StorageError as exc:  # as Kafka: an error answer's offsets are all -1 (unknown)
            return FetchPartitionResult(part.partition, error_code=exc.error_code), row, None
        return FetchPartitionResult(part.partition, high_watermark=piece.high_watermark,
                                    last_stable_offset=piece.last_stable_offset,
                                    log_start_offset=piece.log_start_offset, aborted_transactions=aborted), row, piece

    def _read_family(self, read: "_FetchRead", topics: list, indices: list[int],
                     results: list[list[FetchPartitionResult] | None]) -> None:
        """The levels of one priority topic: read what each partition has, grant the budget across levels,
        read again the partitions granted less than they have."""
        budget = read.remaining
        reads = []  # (topic index, level, part, result, row, piece)
        available: dict[int, int] = {}
        for index in indices:
            topic = topics[index]
            level = self.level_names.of(topic.topic)[1]
            for part in topic.partitions:
                limit = min(part.partition_max_bytes, budget) if part.partition_max_bytes > 0 else budget
                result, row, piece = self._read_piece(topic.topic, part, limit, True, read.committed)
                reads.append((index, level, part, result, row, piece))
                available[level] = available.get(level, 0) + (piece.size if piece is not None else 0)
        left = priority.grant(budget, available)
        for index in indices:
            results[index] = []
        for index, level, part, result, row, piece in reads:
            if piece is not None and piece.size > left[level]:  # at least one whole batch (KIP-74)
                piece = self.partitions.log(row).read(part.fetch_offset, left[level], min_one_batch=True,
                                                      committed=read.committed)
            if piece is not None:
                left[level] = max(0, left[level] - piece.size)
            results[index].append(read.add(result, row, piece))


_NOTHING_REFUSED: frozenset[int] = frozenset()


def _sessionless(request: Any) -> bool:
    """A Fetch that neither names nor opens a session (all of them before v7)."""
    return request.__version__ < 7 or (request.session_id == NO_SESSION and request.session_epoch == FINAL_EPOCH)


def _replica_id(request: Any) -> int:
    """The fetching replica's id (-1: a consumer): a field up to Fetch v14, in replica_state from v15."""
    state = getattr(request, "replica_state", None)
    return int(state.replica_id) if state is not None else int(getattr(request, "replica_id", -1))
_ZERO_ID = bytes(16)


class _TopicById:
    """A Fetch v13+ topic with its name looked up (None: no live topic has the id)."""

    __slots__ = ("topic", "id_bytes", "partitions")

    def __init__(self, topic: str | None, topic_id: Any, partitions: Any) -> None:
        self.topic = topic
        self.id_bytes = _ZERO_ID if topic_id is None else topic_id.bytes  # echoed in the answer
        self.partitions = partitions


def _unknown(topic: str | None) -> E.ErrorCode:
    """The error of a partition not found: its topic id unknown (v13+), or its topic or partition."""
    return E.UNKNOWN_TOPIC_ID if topic is None else E.UNKNOWN_TOPIC_OR_PARTITION


class _FetchRead:
    """A Fetch's reads so far: the budget left, the bytes taken, errors, and what a delayed fetch watches."""

    __slots__ = ("remaining", "total", "has_error", "refused", "watch", "committed")

    def __init__(self, budget: int, committed: bool = False) -> None:
        self.committed = committed  # read_committed: below the LSO
        self.remaining = budget
        self.total = 0
        self.has_error = False
        self.refused = False  # a topic answered TOPIC_AUTHORIZATION_FAILED
        self.watch: list[tuple[int, int, int]] = []  # shm.fetch_condition's items

    def limit(self, part: Any) -> int:
        return min(part.partition_max_bytes, self.remaining) if part.partition_max_bytes > 0 else self.remaining

    def add(self, result: FetchPartitionResult, row: int | None, piece: Any) -> FetchPartitionResult:
        if piece is None:
            self.has_error = True
            return result
        result.records = [FileRange(fd, position, length) for fd, position, length in piece.ranges]
        self.total += piece.size
        self.remaining = max(0, self.remaining - piece.size)
        # A delayed fetch counts the bytes appended after the state this read saw: its own end_bytes,
        # not a later look at the table, which could already include an append that raced the read.
        self.watch.append((row, piece.end_bytes - piece.size, piece.last_stable_offset if self.committed else -1))
        return result


ACKS0_PARTITIONS_LOGGED = 5  # partitions named in the log line of a refused acks=0 Produce


def _error_codes(topics: list[ProduceTopicResult]) -> tuple[int, ...]:
    return tuple(r.error_code for t in topics for r in t.partitions if r.error_code)


def _acks0_refusal(topics: list[ProduceTopicResult]) -> str:
    """Why a Produce with acks=0 closes its connection: its failed partitions and their errors (the first few)."""
    failed = [f"{t.name}-{r.index}: {E.ErrorCode(r.error_code).name.upper()}" for t in topics for r in t.partitions
              if r.error_code]
    more = len(failed) - ACKS0_PARTITIONS_LOGGED
    return ("Produce with acks=0 failed (" + ", ".join(failed[:ACKS0_PARTITIONS_LOGGED])
            + (f" and {more} more" if more > 0 else "") + ")")
