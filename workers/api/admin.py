"""Request handlers of topic administration: CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords,
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs (of topics, groups and the broker).

Changes go to the timer process's controller (node.timer.controller), the node's one authority over the catalog,
as document messages answered by a REPLY (shm.messages); DescribeConfigs is answered here from the catalog and
the node's config. What this module decides itself is what a request says on its face, with Kafka's codes:
topic names, duplicates, partition counts, replication factors and replica assignments (this node is broker
`server.node_id`, holding the only replica), resource types and names.

Timeouts: a request's own timeout is its deadline; the controller refuses REQUEST_TIMED_OUT, with nothing done,
what it could not start before it, and the worker waits for that answer (node.timer.controller). A timeout of 0
or less ("do not wait", as librdkafka's operation_timeout 0) means the node answers once it has done the work,
within `timer.control_timeout_ms`.

Authorization (with the authorizer on, as Kafka's KafkaApis): CreateTopics needs CREATE on the cluster or the topic
(and DESCRIBE_CONFIGS on the topic to see its configs, v5+); DeleteTopics DELETE on the topic (DESCRIBE for one named
by id, else its name is withheld); CreatePartitions ALTER and DeleteRecords DELETE on the topic; DescribeConfigs and
(Incremental)AlterConfigs DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic or group, or on the cluster for the broker. A
refused topic is TOPIC_AUTHORIZATION_FAILED, a refused group GROUP_AUTHORIZATION_FAILED, a refused broker resource
CLUSTER_AUTHORIZATION_FAILED, checked before the topic's existence is looked at and never sent to the controller.

Invariants:
- Every request gets one response, with one result per topic, partition or resource it named, in its order.
- If the timer process never answers (it died and its successor lost the request), every result is
  REQUEST_TIMED_OUT; the deadline the controller checks is the one this worker gave up at, so what a client
  heard as timed out was not done.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any, Callable

from kio.static.primitive import i8, i16, i32, i64

from shmbroker.node.config import NodeConfig
from shmbroker.node.storage import group_config, topic_config as TC
from shmbroker.node.storage.catalog import valid_topic_name
from shmbroker.node.storage.store import BROKER_RESOURCE, GROUP_RESOURCE, TOPIC_RESOURCE, PartitionStore
from shmbroker.shm import messages as M
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.delayed import DelayedRequests, DocumentTooLarge, monotonic_ms
from shmbroker.workers.timer_client.outcome import Outcome
from shmbroker.workers.api.responses import ZERO_THROTTLE, code, entity, reply
from shmbroker.workers.api.authorizer import RequestAuthorizer
from shmbroker.workers.api.family import HandlerFamily
from shmbroker.node.storage.acls import CLUSTER_NAME, Operation, ResourceType

log = logging.getLogger("shmbroker.admin")

Results = dict[str, tuple[E.ErrorCode, str | None]]
BROKER_LOGGER_RESOURCE = 8  # Kafka's ConfigResource.Type.BROKER_LOGGER (authorized as the broker)
_REFUSAL_MESSAGES = {E.TOPIC_AUTHORIZATION_FAILED: "Topic authorization failed.",
                     E.CLUSTER_AUTHORIZATION_FAILED: "Cluster authorization failed.",
                     E.GROUP_AUTHORIZATION_FAILED: "Group authorization failed."}
EMPTY_GROUP_NAME = "Group name must not be empty"


def _any_topic(name: str) -> bool:
    return True
TIMED_OUT = (E.REQUEST_TIMED_OUT, "the node did not answer within the request's timeout")


def millis(delta: Any) -> int:
    return int(delta.total_seconds() * 1000) if isinstance(delta, datetime.timedelta) else int(delta)


# The node's settings a broker resource shows as they are, by Kafka's names: (name, section of the node's
# config (dotted: a nested one), setting, Kafka's type); one the file sets (not its default) is
# STATIC_BROKER_CONFIG.
NODE_SETTINGS = (
    ("broker.id", "server", "node_id", "INT"),
    ("node.id", "server", "node_id", "INT"),
    ("socket.request.max.bytes", "server", "request_max_bytes", "INT"),
    ("socket.send.buffer.bytes", "server", "socket_send_buffer_bytes", "INT"),
    ("socket.receive.buffer.bytes", "server", "socket_receive_buffer_bytes", "INT"),
    ("socket.listen.backlog.size", "server", "listen_backlog", "INT"),
    ("max.incremental.fetch.session.cache.slots", "server", "max_incremental_fetch_session_cache_slots", "INT"),
    ("queued.max.request.bytes", "server", "queued_max_request_bytes", "LONG"),
    ("max.connections", "server", "max_connections", "INT"),
    ("max.connections.per.ip", "server", "max_connections_per_ip", "INT"),
    ("connections.max.idle.ms", "server", "connections_max_idle_ms", "LONG"),
    ("log.retention.check.interval.ms", "flush", "retention_check_interval_ms", "LONG"),
    ("producer.id.expiration.ms", "log", "producer_id_expiration_ms", "INT"),
    ("fetch.purgatory.purge.interval.requests", "timer.purgatory", "purge_interval", "INT"),
    ("producer.purgatory.purge.interval.requests", "timer.purgatory", "purge_interval", "INT"),
    ("log.cleaner.enable", "cleaner", "enabled", "BOOLEAN"),
    ("log.cleaner.threads", "cleaner", "processes", "INT"),
    ("log.cleaner.backoff.ms", "cleaner", "backoff_ms", "LONG"),
    ("log.cleaner.dedupe.buffer.size", "cleaner", "dedupe_buffer_bytes", "LONG"),
    ("log.cleaner.io.buffer.size", "cleaner", "io_buffer_bytes", "INT"),
    ("log.cleaner.io.max.bytes.per.second", "cleaner", "io_max_bytes_per_second", "DOUBLE"),
    ("quota.window.num", "quotas", "window_samples", "INT"),
    ("offsets.topic.segment.bytes", "groups", "offsets_segment_bytes", "INT"),
    ("group.consumer.assignors", "groups", "consumer_assignors", "LIST"),
    ("num.partitions", "topics", "num_partitions", "INT"),
    ("auto.create.topics.enable", "topics", "auto_create_topics", "BOOLEAN"),
    ("offsets.retention.check.interval.ms", "groups", "offsets_retention_check_interval_ms", "LONG"),
    ("offsets.commit.timeout.ms", "groups", "offsets_commit_timeout_ms", "INT"),
    ("offset.metadata.max.bytes", "groups", "offset_metadata_max_bytes", "INT"),
    ("group.initial.rebalance.delay.ms", "groups", "initial_rebalance_delay_ms", "INT"),
    ("group.min.session.timeout.ms", "groups", "min_session_timeout_ms", "INT"),
    ("group.max.session.timeout.ms", "groups", "max_session_timeout_ms", "INT"),
    ("group.consumer.session.timeout.ms", "groups", "consumer_session_timeout_ms", "INT"),
    ("group.consumer.min.session.timeout.ms", "groups", "consumer_min_session_timeout_ms", "INT"),
    ("group.consumer.max.session.timeout.ms", "groups", "consumer_max_session_timeout_ms", "INT"),
    ("group.consumer.heartbeat.interval.ms", "groups", "consumer_heartbeat_interval_ms", "INT"),
    ("group.consumer.min.heartbeat.interval.ms", "groups", "consumer_min_heartbeat_interval_ms", "INT"),
    ("group.consumer.max.heartbeat.interval.ms", "groups", "consumer_max_heartbeat_interval_ms", "INT"),
    ("group.streams.session.timeout.ms", "groups", "streams_session_timeout_ms", "INT"),
    ("group.streams.heartbeat.interval.ms", "groups", "streams_heartbeat_interval_ms", "INT"),
    ("group.streams.min.session.timeout.ms", "groups", "streams_min_session_timeout_ms", "INT"),
    ("group.streams.max.session.timeout.ms", "groups", "streams_max_session_timeout_ms", "INT"),
    ("group.streams.min.heartbeat.interval.ms", "groups", "streams_min_heartbeat_interval_ms", "INT"),
    ("group.streams.max.heartbeat.interval.ms", "groups", "streams_max_heartbeat_interval_ms", "INT"),
    ("group.streams.num.standby.replicas", "groups", "streams_num_standby_replicas", "INT"),
    ("group.streams.max.standby.replicas", "groups", "streams_max_standby_replicas", "INT"),
    ("group.streams.initial.rebalance.delay.ms", "groups", "streams_initial_rebalance_delay_ms", "INT"),
    ("connections.max.reauth.ms", "sasl", "connections_max_reauth_ms", "LONG"),
    ("sasl.server.max.receive.size", "sasl", "server_max_receive_size", "INT"),
    ("transaction.max.timeout.ms", "transactions", "transaction_max_timeout_ms", "INT"),
    ("transactional.id.expiration.ms", "transactions", "transactional_id_expiration_ms", "INT"),
    ("transaction.state.log.segment.bytes", "transactions", "state_segment_bytes", "INT"),
    ("transaction.remove.expired.transaction.cleanup.interval.ms", "transactions", "remove_expired_interval_ms",
     "INT"),
)


def _setting(config: NodeConfig, section: str, setting: str) -> Any:
    """A setting of a section of the node's config (a dotted section: a nested one)."""
    for part in section.split("."):
        config = getattr(config, part)
    return getattr(config, setting)


class AdminHandlers(HandlerFamily):
    def __init__(self, partitions: PartitionStore, config: NodeConfig, delayed: DelayedRequests,
                 authorizer: RequestAuthorizer | None = None) -> None:
        super().__init__(config, delayed, authorizer)
        self.partitions = partitions
        self.node_id = config.server.node_id

    def table(self) -> dict[int, Callable[[Request, Any], Outcome]]:
        return {
            P.CREATE_TOPICS: self.create_topics,
            P.DELETE_TOPICS: self.delete_topics,
            P.CREATE_PARTITIONS: self.create_partitions,
            P.DELETE_RECORDS: self.delete_records,
            P.DESCRIBE_CONFIGS: self.describe_configs,
            P.ALTER_CONFIGS: self.alter_configs,
            P.INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
        }

    def _topic_access(self, req: Request, operation: Operation, cluster_wide: bool = True) -> Callable[[str], bool]:
        """May the principal do `operation` on a topic (by name)? With cluster_wide, the operation on the cluster
        (asked once, quietly, as Kafka) grants it on every topic."""
        authorizer = self.authorizer
        if not authorizer.enabled or (cluster_wide and authorizer.allows(req, operation, ResourceType.CLUSTER,
                                                                         CLUSTER_NAME, count_denial=False)):
            return _any_topic
        return lambda name: authorizer.allows(req, operation, ResourceType.TOPIC, name)

    def _config_refusal(self, req: Request, kind: int, name: str, operation: Operation) -> E.ErrorCode:
        """NONE, or the error of a config resource the principal may not describe or alter: a topic's needs the
        operation on the topic (TOPIC_AUTHORIZATION_FAILED), a group's on the group (GROUP_AUTHORIZATION_FAILED), the
        broker's on the cluster (CLUSTER_AUTHORIZATION_FAILED). Other types are left to the request's own checks."""
        if not self.authorizer.enabled:
            return E.NONE
        if kind == TOPIC_RESOURCE:
            allowed = self.authorizer.allows(req, operation, ResourceType.TOPIC, name)
            return E.NONE if allowed else E.TOPIC_AUTHORIZATION_FAILED
        if kind == GROUP_RESOURCE:
            allowed = self.authorizer.allows(req, operation, ResourceType.GROUP, name)
            return E.NONE if allowed else E.GROUP_AUTHORIZATION_FAILED
        if kind in (BROKER_RESOURCE, BROKER_LOGGER_RESOURCE):
            allowed = self.authorizer.allows(req, operation, ResourceType.CLUSTER, CLUSTER_NAME)
            return E.NONE if allowed else E.CLUSTER_AUTHORIZATION_FAILED
        return E.NONE

    def _wait_ms(self, timeout_ms: int) -> int:
        return timeout_ms if timeout_ms > 0 else self.config.timer.control_timeout_ms

    def _ask(self, req: Request, kind: M.Kind, document: Any, wait_ms: int, answer: Callable[[Any], Outcome],
             *body: Any) -> Outcome:
        """Send the controller `kind` with `body` and `document`; `answer` gets the REPLY's document (None if the
        timer never gave one, or the request is too large for the rings)."""
        try:
            frame = M.encode(kind, 0, *body, document=document)
            return self.delayed.ask(req, frame, wait_ms, lambda reply_: answer(None if reply_ is None
                                                                               else reply_.answer))
        except DocumentTooLarge:
            return answer(None)

    # -- CreateTopics / DeleteTopics -----------------------------------------------------------

    def create_topics(self, req: Request, request: Any) -> Outcome:
        results: Results = {}
        wanted: list[list[Any]] = []
        names = [topic.name for topic in request.topics]
        may_create = self._topic_access(req, Operation.CREATE)
        for topic in request.topics:
            name = topic.name
            if names.count(name) > 1:
                results[name] = (E.INVALID_REQUEST, f"Topic {name} is named more than once in the request.")
            elif not may_create(name):
                results[name] = (E.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
            elif not valid_topic_name(name):
                results[name] = (E.INVALID_TOPIC_EXCEPTION, f"Topic name {name!r} is illegal: it must be 1 to 249 "
                                                            "characters of [a-zA-Z0-9._-], not '.' or '..'")
            else:
                partitions, problem = self._new_topic_partitions(topic)
                if problem is not None:
                    results[name] = problem
                else:
                    wanted.append([name, partitions, {c.name: c.value for c in topic.configs}])
        timeout_ms = millis(request.timeout)
        validate_only = bool(getattr(request, "validate_only", False))
        counts = {name: partitions for name, partitions, _ in wanted}
        requested = {name: configs for name, _, configs in wanted}

        # Replication factors above 1 taken with one copy (topics.accept_replication_factor_above_one): a line for
        # each topic made, none for one that exists (Connect asks for its topics again at every start).
        above_one = {topic.name: topic.replication_factor for topic in request.topics if topic.replication_factor > 1}

        def answer(outcome: dict | None) -> Outcome:
            if outcome is not None:
                self.partitions.reload()
            for name, _, _ in wanted:
                number, message = (outcome or {}).get(name, TIMED_OUT)
                results[name] = (code(number), message)
                if name in above_one and results[name][0] == E.NONE and not validate_only:
                    log.warning("topic %s: replication factor %d asked, one copy kept "
                                "(topics.accept_replication_factor_above_one)", name, above_one[name])
            return reply(req, entity(req, "CreateTopicsResponse", throttle_time=ZERO_THROTTLE, topics=tuple(
                self._created(req, t.name, results[t.name], counts.get(t.name), requested.get(t.name, {}), validate_only)
                for t in request.topics)))

        if not wanted:
            return answer({})
        wait_ms = self._wait_ms(timeout_ms)
        document = {"topics": wanted, "validate_only": validate_only, "explicit": True}
        return self._ask(req, M.Kind.CREATE_TOPICS, document, wait_ms, answer, monotonic_ms() + wait_ms)

    def _created(self, req: Request, name: str, result: tuple[E.ErrorCode, str | None], partitions: int | None,
                 requested: dict[str, str], validate_only: bool) -> Any:
        """A CreatableTopicResult; from v5 a created (or validated) topic's partition count, replication factor
        and every config as DescribeConfigs shows it (KIP-525), -1s and no configs for an error; the configs only
        to a principal that may DESCRIBE_CONFIGS the topic (else topic_config_error_code says so, as Kafka)."""
        error, message = result
        store = self.partitions
        fields: dict[str, Any] = {"num_partitions": i32(-1), "replication_factor": i16(-1), "configs": ()}
        if (error == E.NONE and partitions is not None and self.authorizer.enabled
                and not self.authorizer.allows(req, Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, name)):
            fields = {"num_partitions": i32(partitions), "replication_factor": i16(1), "configs": (),
                      "topic_config_error_code": E.TOPIC_AUTHORIZATION_FAILED}
        elif error == E.NONE and partitions is not None:
            overrides = store.topic_configs(name)
            described = TC.describe_topic(store.log_config, store.catalog.broker_configs,
                                          requested if overrides is None else overrides)
            fields = {"num_partitions": i32(partitions), "replication_factor": i16(1), "configs": tuple(entity(
                req, "CreatableTopicConfigs", name=d.name, value=d.value, read_only=d.read_only,
                config_source=i8(d.source), is_sensitive=False) for d in described)}
        created = error == E.NONE and not validate_only
        return entity(req, "CreatableTopicResult", name=name, topic_id=store.topic_id(name) if created else None,
                      error_code=error, error_message=message, **fields)

    def _new_topic_partitions(self, topic: Any) -> tuple[int, tuple[E.ErrorCode, str] | None]:
        """(partition count, None) or (0, the error) of a CreatableTopic, as Kafka's controller checks it."""
        if topic.assignments:
            if topic.num_partitions != -1 or topic.replication_factor != -1:
                return 0, (E.INVALID_REQUEST, "A manual partition assignment was specified, but numPartitions or "
                                              "replicationFactor was not set to -1.")
            indexes = sorted(a.partition_index for a in topic.assignments)
            if indexes != list(range(len(indexes))):
                return 0, (E.ErrorCode.invalid_replica_assignment,
                           "Partitions should be numbered sequentially starting at 0.")
            problem = self._replica_problem([list(a.broker_ids) for a in topic.assignments])
            return (0, problem) if problem else (len(indexes), None)
        if topic.num_partitions == 0 or topic.num_partitions < -1:
            return 0, (E.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value.")
        if topic.replication_factor == 0 or topic.replication_factor < -1:
            return 0, (E.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0, or -1 to use the "
                                                     "default value.")
        if topic.replication_factor > 1 and not self.config.topics.accept_replication_factor_above_one:
            return 0, (E.INVALID_REPLICATION_FACTOR,
                       f"Unable to replicate the partition {topic.replication_factor} time(s): The target replication "
                       f"factor of {topic.replication_factor} cannot be reached because only 1 broker(s) are "
                       "registered.")
        count = topic.num_partitions if topic.num_partitions != -1 else self.config.topics.num_partitions
        return count, None

    def _replica_problem(self, replica_lists: list[list[int]]) -> tuple[E.ErrorCode, str] | None:
        """Kafka's checks of manual replica assignments, with this node as the one live broker."""
        for replicas in replica_lists:
            if not replicas:
                return E.ErrorCode.invalid_replica_assignment, "An empty replica list was given for a partition."
            if len(set(replicas)) != len(replicas):
                return E.ErrorCode.invalid_replica_assignment, f"Duplicate brokers in the replica list {replicas}."
            for broker in replicas:
                if broker != self.node_id:
                    return (E.ErrorCode.invalid_replica_assignment,
                            f"The manual partition assignment includes broker {broker}, but no such broker is "
                            f"registered (this node is broker {self.node_id}).")
        if len({len(replicas) for replicas in replica_lists}) > 1:
            return (E.ErrorCode.invalid_replica_assignment,
                    "All partitions in the manual partition assignment must have the same number of replicas.")
        return None

    def delete_topics(self, req: Request, request: Any) -> Outcome:
        """By name (v0-5) or, from v6, by name or topic id (a deletion by id deletes that topic, not a newer one
        of the same name: the timer checks the id)."""
        asked = DeletionList.of(request, self.partitions)
        if self.authorizer.enabled:
            asked.refuse_unauthorized(lambda name: self.authorizer.allows(req, Operation.DESCRIBE, ResourceType.TOPIC,
                                                                          name),
                                      lambda name: self.authorizer.allows(req, Operation.DELETE, ResourceType.TOPIC,
                                                                          name))

        def answer(outcome: dict | None) -> Outcome:
            if outcome is not None:
                self.partitions.reload()
            return reply(req, entity(req, "DeleteTopicsResponse", throttle_time=ZERO_THROTTLE, responses=tuple(
                entity(req, "DeletableTopicResult", name=name, topic_id=topic_id, error_code=code(number),
                       error_message=message)
                for name, topic_id, (number, message) in asked.results(outcome))))

        if not asked.document:
            return answer({})
        return self._ask(req, M.Kind.DELETE_TOPICS, asked.document, self._wait_ms(millis(request.timeout)), answer)

    # -- CreatePartitions -----------------------------------------------------------------------

    def create_partitions(self, req: Request, request: Any) -> Outcome:
        results: Results = {}
        wanted: list[list[Any]] = []
        names = [topic.name for topic in request.topics]
        may_alter = self._topic_access(req, Operation.ALTER, cluster_wide=False)
        for topic in request.topics:
            name = topic.name
            current = self.partitions.topic_partitions(name)
            if names.count(name) > 1:
                results[name] = (E.INVALID_REQUEST, f"Duplicate topic {name} in the request.")
            elif not may_alter(name):
                results[name] = (E.TOPIC_AUTHORIZATION_FAILED, "The topic authorization is failed.")
            elif current is None:
                results[name] = (E.UNKNOWN_TOPIC_OR_PARTITION, f"The topic {name} does not exist.")
            elif topic.assignments is not None and topic.count > current and len(topic.assignments) != topic.count - current:
                results[name] = (E.ErrorCode.invalid_replica_assignment,
                                 f"Increasing the number of partitions by {topic.count - current} but "
                                 f"{len(topic.assignments)} assignments provided.")
            else:
                problem = (self._replica_problem([list(a.broker_ids) for a in topic.assignments])
                           if topic.assignments else None)
                if problem:
                    results[name] = problem
                else:
                    wanted.append([name, int(topic.count)])

        def answer(outcome: dict | None) -> Outcome:
            if outcome is not None:
                self.partitions.reload()
            for name, _ in wanted:
                number, message = (outcome or {}).get(name, TIMED_OUT)
                results[name] = (code(number), message)
            return reply(req, entity(req, "CreatePartitionsResponse", throttle_time=ZERO_THROTTLE, results=tuple(
                entity(req, "CreatePartitionsTopicResult", name=t.name, error_code=results[t.name][0],
                       error_message=results[t.name][1]) for t in request.topics)))

        if not wanted:
            return answer({})
        wait_ms = self._wait_ms(millis(request.timeout))
        document = {"topics": wanted, "validate_only": bool(request.validate_only)}
        return self._ask(req, M.Kind.CREATE_PARTITIONS, document, wait_ms, answer, monotonic_ms() + wait_ms)

    # -- DeleteRecords --------------------------------------------------------------------------

    def delete_records(self, req: Request, request: Any) -> Outcome:
        may_delete = self._topic_access(req, Operation.DELETE, cluster_wide=False)
        refused = {t.name for t in request.topics if not may_delete(t.name)}
        wanted = [[t.name, int(p.partition_index), int(p.offset)] for t in request.topics for p in t.partitions
                  if t.name not in refused]

        def answer(outcome: list | None) -> Outcome:
            results = iter(outcome if outcome is not None else [[int(TIMED_OUT[0]), -1]] * len(wanted))
            topics = []
            for topic in request.topics:
                partitions = []
                for p in topic.partitions:
                    error, low_watermark = ((int(E.TOPIC_AUTHORIZATION_FAILED), -1) if topic.name in refused
                                            else next(results))
                    partitions.append(entity(req, "DeleteRecordsPartitionResult", partition_index=p.partition_index,
                                             low_watermark=i64(low_watermark), error_code=code(error)))
                topics.append(entity(req, "DeleteRecordsTopicResult", name=topic.name, partitions=tuple(partitions)))
            return reply(req, entity(req, "DeleteRecordsResponse", throttle_time=ZERO_THROTTLE, topics=tuple(topics)))

        if not wanted:
            return answer([])
        wait_ms = self._wait_ms(millis(request.timeout))
        return self._ask(req, M.Kind.DELETE_RECORDS, wanted, wait_ms, answer, monotonic_ms() + wait_ms)

    # -- DescribeConfigs ------------------------------------------------------------------------

    def describe_configs(self, req: Request, request: Any) -> Outcome:
        synonyms_wanted = bool(getattr(request, "include_synonyms", False))
        documentation_wanted = bool(getattr(request, "include_documentation", False))
        store = self.partitions
        results = []
        for resource in request.resources:
            error, message, described = E.NONE, None, []
            refusal = self._config_refusal(req, resource.resource_type, resource.resource_name,
                                           Operation.DESCRIBE_CONFIGS)
            if refusal:
                error, message = refusal, _REFUSAL_MESSAGES[refusal]
            elif resource.resource_type == TOPIC_RESOURCE:
                overrides = store.topic_configs(resource.resource_name)
                if not valid_topic_name(resource.resource_name):
                    error, message = E.INVALID_TOPIC_EXCEPTION, f"Topic name {resource.resource_name!r} is illegal"
                elif overrides is None:
                    error, message = E.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {resource.resource_name} does not exist"
                else:
                    described = TC.describe_topic(store.log_config, store.catalog.broker_configs, overrides)
            elif resource.resource_type == BROKER_RESOURCE:
                problem = self._broker_name_problem(resource.resource_name)
                if problem:
                    error, message = E.INVALID_REQUEST, problem
                else:
                    described = self._describe_node()
            elif resource.resource_type == GROUP_RESOURCE:
                if not resource.resource_name:
                    error, message = E.INVALID_REQUEST, EMPTY_GROUP_NAME
                else:
                    described = group_config.describe_group(
                        self.config.groups, store.catalog.group_configs.get(resource.resource_name))
            else:
                error, message = E.INVALID_REQUEST, f"Unsupported resource type {resource.resource_type}"
            keys = resource.configuration_keys
            if keys:
                described = [d for d in described if d.name in keys]
            configs = tuple(entity(
                req, "DescribeConfigsResourceResult", name=d.name, value=d.value, read_only=d.read_only,
                is_default=d.is_default, config_source=i8(d.source), is_sensitive=False,
                synonyms=tuple(entity(req, "DescribeConfigsSynonym", name=n, value=v, source=i8(s))
                               for n, v, s in (d.synonyms if synonyms_wanted else ())),
                config_type=i8(TC.TYPE_CODES.get(d.type, 0)), documentation=d.doc if documentation_wanted else None)
                for d in described)
            results.append(entity(req, "DescribeConfigsResult", error_code=error, error_message=message,
                                  resource_type=i8(resource.resource_type), resource_name=resource.resource_name,
                                  configs=configs))
        return reply(req, entity(req, "DescribeConfigsResponse", throttle_time=ZERO_THROTTLE, results=tuple(results)))

    def _broker_name_problem(self, name: str) -> str | None:
        if name in ("", str(self.node_id)):
            return None
        return f"Unexpected broker id, expected {self.node_id} or empty string, but received {name}"

    def _describe_node(self) -> list[TC.DescribedConfig]:
        """The broker resource: the node-wide topic settings (alterable), then the node's own settings (read-only,
        from its TOML file), by Kafka's broker config names."""
        store = self.partitions
        described = TC.describe_node(store.log_config, store.catalog.broker_configs)
        defaults = NodeConfig()
        config = self.config
        server = config.server
        groups = config.groups
        host = server.advertised_host or server.host
        port = server.advertised_port or server.port
        static = [
            ("listeners", ",".join(f"{item.name}://{item.address}" for item in config.listener_list()), True,
             "LIST"),
            ("advertised.listeners", ",".join(
                f"{item.name}://{item.advertised_address or (f'{host}:{port}' if index == 0 else item.address)}"
                for index, item in enumerate(config.listener_list())), True, "LIST"),
            ("listener.security.protocol.map", ",".join(
                f"{item.name}:{item.security_protocol}" for item in config.listener_list()), True, "STRING"),
            ("log.dirs", server.data_dir, True, "LIST"),
            ("num.network.threads", str(server.worker_count()), server.workers != defaults.server.workers, "INT"),
            ("default.replication.factor", "1", False, "INT"),
            ("offsets.topic.num.partitions", "1", False, "INT"),
            ("offsets.topic.replication.factor", "1", False, "SHORT"),
            ("offsets.retention.minutes", str(int(groups.offsets_retention_minutes)),
             groups.offsets_retention_minutes != defaults.groups.offsets_retention_minutes, "INT"),
            ("group.max.size", str(groups.max_size or 2**31 - 1), groups.max_size != defaults.groups.max_size, "INT"),
            ("group.consumer.max.size", str(groups.consumer_max_size or 2**31 - 1),
             groups.consumer_max_size != defaults.groups.consumer_max_size, "INT"),
            ("group.streams.max.size", str(groups.streams_max_size or 2**31 - 1),
             groups.streams_max_size != defaults.groups.streams_max_size, "INT"),
            ("sasl.enabled.mechanisms", ",".join(config.sasl.mechanisms),
             config.sasl.mechanisms != defaults.sasl.mechanisms, "LIST"),
        ]
        for name, section, setting, kind in NODE_SETTINGS:
            value, default = (_setting(c, section, setting) for c in (config, defaults))
            static.append((name, TC.render(value), value != default, kind))
        for name, value, from_file, kind in static:
            source = TC.SOURCE_STATIC_BROKER if from_file else TC.SOURCE_DEFAULT
            described.append(TC.DescribedConfig(name, value, source, ((name, value, source),), kind,
                                                "A setting of the node's TOML file (read-only at run time).",
                                                read_only=True))
        return sorted(described, key=lambda d: d.name)

    # -- AlterConfigs / IncrementalAlterConfigs -------------------------------------------------

    def alter_configs(self, req: Request, request: Any) -> Outcome:
        return self._alter(req, request, "replace",
                           lambda resource: {c.name: c.value for c in resource.configs})

    def incremental_alter_configs(self, req: Request, request: Any) -> Outcome:
        return self._alter(req, request, "incremental",
                           lambda resource: [[int(c.config_operation), c.name, c.value] for c in resource.configs])

    def _alter(self, req: Request, request: Any, how: str, changes_of: Callable[[Any], Any]) -> Outcome:
        results: list[tuple[E.ErrorCode, str | None] | None] = []
        sent: list[list[Any]] = []
        seen = [(r.resource_type, r.resource_name) for r in request.resources]
        for resource in request.resources:
            kind, name = resource.resource_type, resource.resource_name
            refusal = self._config_refusal(req, kind, name, Operation.ALTER_CONFIGS)
            keys = [c.name for c in resource.configs]
            if seen.count((kind, name)) > 1:
                results.append((E.INVALID_REQUEST, f"Error due to duplicate resource {name!r} of type {kind}"))
            elif len(set(keys)) < len(keys):  # as Kafka: a key given twice is refused, not the last one taken
                twice = sorted({key for key in keys if keys.count(key) > 1})
                results.append((E.INVALID_REQUEST, f"Error due to duplicate config keys: {', '.join(twice)}"))
            elif refusal:
                results.append((refusal, None))
            elif kind == TOPIC_RESOURCE and not valid_topic_name(name):
                results.append((E.INVALID_TOPIC_EXCEPTION, f"Topic name {name!r} is illegal"))
            elif kind == BROKER_RESOURCE and self._broker_name_problem(name):
                results.append((E.INVALID_REQUEST, self._broker_name_problem(name)))
            elif kind == GROUP_RESOURCE and not name:
                results.append((E.INVALID_REQUEST, EMPTY_GROUP_NAME))
            elif kind not in (TOPIC_RESOURCE, BROKER_RESOURCE, GROUP_RESOURCE):
                results.append((E.INVALID_REQUEST, f"Unsupported resource type {kind}: this node alters the configs "
                                                   "of topics, groups and the broker"))
            else:
                results.append(None)
                sent.append([int(kind), name, how, changes_of(resource)])

        def answer(outcome: list | None) -> Outcome:
            if outcome is not None:
                self.partitions.reload()
            answers = iter(outcome if outcome is not None else [[int(TIMED_OUT[0]), TIMED_OUT[1]]] * len(sent))
            filled = [result if result is not None else (lambda a: (code(a[0]), a[1]))(next(answers))
                      for result in results]
            return reply(req, entity(req, type_name, throttle_time=ZERO_THROTTLE, responses=tuple(
                entity(req, "AlterConfigsResourceResponse", error_code=error, error_message=message,
                       resource_type=i8(r.resource_type), resource_name=r.resource_name)
                for r, (error, message) in zip(request.resources, filled))))

        type_name = "AlterConfigsResponse" if how == "replace" else "IncrementalAlterConfigsResponse"
        if not sent:
            return answer([])
        document = {"resources": sent, "validate_only": bool(request.validate_only)}
        return self._ask(req, M.Kind.ALTER_CONFIGS, document, self.config.timer.control_timeout_ms, answer)



class DeletionList:
    """The topics a DeleteTopics names, in its order: by name, or (v6+) by topic id, resolved in this worker's
    catalog. `document` is what the timer deletes: names, and [name, id] pairs for those named by id."""

    def __init__(self) -> None:
        self.asked: list[tuple[str | None, Any, tuple[int, str | None] | None]] = []  # name, id, early answer
        self.document: list[Any] = []
        self.by_id: set[int] = set()  # the indexes in `asked` of topics named by id

    @classmethod
    def of(cls, request: Any, store: PartitionStore) -> "DeletionList":
        deletions = cls()
        topics = getattr(request, "topics", None)
        if topics is None:  # v0-5
            for name in request.topic_names:
                deletions.asked.append((name, None, None))
                deletions.document.append(name)
            return deletions
        for topic in topics:
            if topic.name is not None and topic.topic_id is not None:
                deletions.asked.append((topic.name, topic.topic_id, (
                    int(E.INVALID_REQUEST), "You may not specify both topic name and topic id.")))
            elif topic.topic_id is not None:
                name = store.topic_by_id(topic.topic_id)
                if name is None:
                    deletions.asked.append((None, topic.topic_id, (int(E.UNKNOWN_TOPIC_ID),
                                                                   "This server does not host this topic ID.")))
                else:
                    deletions.by_id.add(len(deletions.asked))
                    deletions.asked.append((name, topic.topic_id, None))
                    deletions.document.append([name, str(topic.topic_id)])
            elif topic.name is not None:
                deletions.asked.append((topic.name, store.topic_id(topic.name), None))
                deletions.document.append(topic.name)
            else:
                deletions.asked.append((None, None, (int(E.INVALID_REQUEST), "A topic needs a name or a topic id.")))
        return deletions

    def refuse_unauthorized(self, may_describe: Callable[[str], bool], may_delete: Callable[[str], bool]) -> None:
        """Refuse, and take out of the document, the topics the principal may not DELETE (TOPIC_AUTHORIZATION_FAILED,
        before looking whether they exist); one named by id it may not even DESCRIBE is answered without its name."""
        refused: set[str] = set()
        for index, (name, topic_id, early) in enumerate(self.asked):
            if early is not None or name is None:
                continue
            if index in self.by_id and not may_describe(name):
                self.asked[index] = (None, topic_id, (int(E.TOPIC_AUTHORIZATION_FAILED), None))
                refused.add(name)
            elif not may_delete(name):  # its id (when named) kept back: it would tell the topic exists
                self.asked[index] = (name, topic_id if index in self.by_id else None,
                                     (int(E.TOPIC_AUTHORIZATION_FAILED), None))
                refused.add(name)
        if refused:
            self.document = [entry for entry in self.document
                             if (entry if isinstance(entry, str) else entry[0]) not in refused]

    def results(self, outcome: dict | None) -> list[tuple[str | None, Any, tuple[int, str | None]]]:
        """(name, id, (error code, message)) per topic asked for; outcome None: the timer did not answer."""
        answered = []
        for name, topic_id, early in self.asked:
            if early is None:
                early = (int(TIMED_OUT[0]), None) if outcome is None else tuple(outcome.get(name, (0, None)))
            answered.append((name, topic_id, early))
        return answered
