"""Request handlers of the Streams rebalance protocol (KIP-1071): StreamsGroupHeartbeat and StreamsGroupDescribe.

Each turns its request into the kind's typed message (shm.messages) for the group coordinator in the timer
process (node.timer.groups.streams), waits for its REPLY and builds the response. Topics travel by name both
ways (the Streams messages name them so).

Invariants:
- Every request gets its response: the coordinator's, or COORDINATOR_NOT_AVAILABLE if the timer never answers.
- With the authorizer on, as Kafka's broker: a heartbeat needs READ on the group (GROUP_AUTHORIZATION_FAILED)
  and, when it carries a topology, DESCRIBE on each of its topics (TOPIC_AUTHORIZATION_FAILED); a describe needs
  DESCRIBE on each group. Refused requests never reach the coordinator. The coordinator creates missing internal
  topics only for a principal with CREATE on the cluster or on each of them (else the group's status says so).
"""

from __future__ import annotations

import datetime
from typing import Any, Callable

from kio.static.primitive import i8, i16, i32, i32Timedelta, u16

from shmbroker.node.config import NodeConfig
from shmbroker.node.storage.acls import CLUSTER_NAME, Operation, ResourceType
from shmbroker.shm import messages as M
from shmbroker.workers.api.authorizer import RequestAuthorizer
from shmbroker.workers.api.responses import ZERO_THROTTLE, code, entity, reply
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.delayed import DelayedRequests, DocumentTooLarge
from shmbroker.workers.timer_client.outcome import Outcome

HeartbeatAnswer = M.reply_class(M.Kind.STREAMS_GROUP_HEARTBEAT)
DescribeAnswer = M.reply_class(M.Kind.STREAMS_GROUP_DESCRIBE)
NO_TOPOLOGY = -1


def _ms(value: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


def _tasks(records: Any) -> list | None:
    return None if records is None else [(t.subtopology_id, [int(p) for p in t.partitions]) for t in records]


def _topic_record(topic: Any) -> tuple:
    return (topic.name, int(topic.partitions), int(topic.replication_factor),
            [(kv.key, kv.value) for kv in topic.topic_configs])


def _subtopology_record(sub: Any) -> tuple:
    return (sub.subtopology_id, list(sub.source_topics), list(sub.source_topic_regex),
            [_topic_record(t) for t in sub.state_changelog_topics], list(sub.repartition_sink_topics),
            [_topic_record(t) for t in sub.repartition_source_topics],
            [([int(i) for i in g.source_topics], [int(i) for i in g.source_topic_regex],
              [int(i) for i in g.repartition_source_topics]) for g in sub.copartition_groups])


class StreamsGroupHandlers:
    def __init__(self, config: NodeConfig, delayed: DelayedRequests,
                 authorizer: RequestAuthorizer | None = None) -> None:
        self.config = config
        self.delayed = delayed
        self.authorizer = authorizer or RequestAuthorizer.open_to_all()

    def table(self) -> dict[int, Callable[[Request, Any], Outcome]]:
        return {P.STREAMS_GROUP_HEARTBEAT: self.heartbeat, P.STREAMS_GROUP_DESCRIBE: self.describe}

    def _ask(self, req: Request, kind: M.Kind, body: tuple, fields: tuple, answer: Callable[[Any], Outcome],
             refusal: Callable[[E.ErrorCode], Any]) -> Outcome:
        try:
            frame = M.encode(kind, 0, req.header.api_version, *body, *fields)
            return self.delayed.ask(req, frame, self.config.timer.control_timeout_ms,
                                    lambda got: answer(None if got is None else got.answer))
        except DocumentTooLarge:
            return answer(refusal(E.INVALID_REQUEST))

    def heartbeat(self, req: Request, request: Any) -> Outcome:
        peer = req.conn.peer
        topology = request.topology
        endpoint = request.user_endpoint
        body = (int(request.member_epoch), round(request.rebalance_timeout.total_seconds() * 1000),
                int(topology.epoch) if topology is not None else NO_TOPOLOGY, int(request.endpoint_information_epoch),
                int(endpoint.port) if endpoint is not None else -1, bool(request.shutdown_application),
                self._may_create(req, topology))
        fields = (request.group_id, request.member_id, request.instance_id, request.rack_id,
                  [_subtopology_record(s) for s in topology.subtopologies] if topology is not None else None,
                  _tasks(request.active_tasks), _tasks(request.standby_tasks), _tasks(request.warmup_tasks),
                  request.process_id, endpoint.host if endpoint is not None else None,
                  None if request.client_tags is None else [(kv.key, kv.value) for kv in request.client_tags],
                  req.header.client_id or "", peer[0] if isinstance(peer, tuple) else str(peer))

        def task_ids(records: list | None) -> tuple | None:
            if records is None:
                return None
            return tuple(entity(req, "TaskIds", subtopology_id=sub, partitions=tuple(map(i32, parts)))
                         for sub, parts in records)

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            endpoints = None if outcome.endpoints is None else tuple(entity(
                req, "EndpointToPartitions", user_endpoint=entity(req, "Endpoint", host=host, port=u16(port)),
                active_partitions=tuple(entity(req, "TopicPartition", topic=t, partitions=tuple(map(i32, parts)))
                                        for t, parts in active),
                standby_partitions=tuple(entity(req, "TopicPartition", topic=t, partitions=tuple(map(i32, parts)))
                                         for t, parts in standby))
                for host, port, active, standby in outcome.endpoints)
            status = None if outcome.status is None else tuple(
                entity(req, "Status", status_code=i8(status_code), status_detail=detail)
                for status_code, detail in outcome.status)
            return reply(req, entity(
                req, "StreamsGroupHeartbeatResponse", throttle_time=ZERO_THROTTLE, error_code=code(outcome.error),
                error_message=outcome.error_message, member_id=outcome.member, member_epoch=i32(outcome.member_epoch),
                heartbeat_interval=_ms(outcome.heartbeat_interval_ms),
                acceptable_recovery_lag=i32(outcome.acceptable_recovery_lag),
                task_offset_interval=_ms(outcome.task_offset_interval_ms), status=status,
                active_tasks=task_ids(outcome.active), standby_tasks=task_ids(outcome.standby),
                warmup_tasks=task_ids(outcome.warmup), endpoint_information_epoch=i32(outcome.endpoint_epoch),
                partitions_by_user_endpoint=endpoints))

        def refusal(error: E.ErrorCode) -> Any:
            return HeartbeatAnswer(int(error), None, "", 0, 0, 0, 0, None, None, None, None, 0, None)

        if self.authorizer.enabled:
            error = self._heartbeat_refusal(req, request)
            if error is not None:
                return answer(refusal(error))
        return self._ask(req, M.Kind.STREAMS_GROUP_HEARTBEAT, body, fields, answer, refusal)

    def _may_create(self, req: Request, topology: Any) -> bool:
        """Whether the node may create the group's missing internal topics for this principal: CREATE on the
        cluster, or (when the heartbeat carries the topology, so its internal topics are known) on each of them."""
        if not self.authorizer.enabled:
            return True
        if self.authorizer.allows(req, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME, count_denial=False):
            return True
        internal = [t.name for sub in (topology.subtopologies if topology is not None else ())
                    for t in (*sub.state_changelog_topics, *sub.repartition_source_topics)]
        return bool(internal) and all(self.authorizer.allows(req, Operation.CREATE, ResourceType.TOPIC, name)
                                      for name in internal)

    def _heartbeat_refusal(self, req: Request, request: Any) -> E.ErrorCode | None:
        if not self.authorizer.allows(req, Operation.READ, ResourceType.GROUP, request.group_id):
            return E.GROUP_AUTHORIZATION_FAILED
        topics = set()
        for sub in (request.topology.subtopologies if request.topology is not None else ()):
            topics.update(sub.source_topics)
            topics.update(sub.repartition_sink_topics)
            topics.update(t.name for t in (*sub.state_changelog_topics, *sub.repartition_source_topics))
        for topic in sorted(topics):
            if not self.authorizer.allows(req, Operation.DESCRIBE, ResourceType.TOPIC, topic):
                return E.TOPIC_AUTHORIZATION_FAILED
        return None

    def describe(self, req: Request, request: Any) -> Outcome:
        names, refused = self.authorizer.split(req, Operation.DESCRIBE, ResourceType.GROUP, list(request.group_ids))
        operations = self.authorizer.group_operations(req, request)

        def task_ids(records: list) -> tuple:
            return tuple(entity(req, "TaskIds", subtopology_id=sub, partitions=tuple(map(i32, parts)))
                         for sub, parts in records)

        def assignment(active: list, standby: list) -> Any:
            return entity(req, "Assignment", active_tasks=task_ids(active), standby_tasks=task_ids(standby),
                          warmup_tasks=())

        def topic_info(topic: Any) -> Any:
            name, partitions, replication_factor, configs = topic
            return entity(req, "TopicInfo", name=name, partitions=i32(partitions),
                          replication_factor=i16(replication_factor),
                          topic_configs=tuple(entity(req, "KeyValue", key=k, value=v) for k, v in configs))

        def topology(epoch: int, subtopologies: list | None) -> Any:
            if subtopologies is None:
                return None
            return entity(req, "Topology", epoch=i32(epoch), subtopologies=tuple(entity(
                req, "Subtopology", subtopology_id=sub, source_topics=tuple(sources),
                repartition_sink_topics=tuple(sinks), state_changelog_topics=tuple(map(topic_info, changelogs)),
                repartition_source_topics=tuple(map(topic_info, repartitions)))
                for sub, sources, _regex, changelogs, sinks, repartitions, _copartition in subtopologies))

        def member(m: tuple) -> Any:
            (member_id, member_epoch, instance, rack, client_id, client_host, topology_epoch, process_id,
             endpoint_host, endpoint_port, tags, active, target, standby, target_standby) = m
            return entity(
                req, "Member", member_id=member_id, member_epoch=i32(member_epoch), instance_id=instance,
                rack_id=rack, client_id=client_id, client_host=client_host, topology_epoch=i32(topology_epoch),
                process_id=process_id,
                user_endpoint=None if endpoint_host is None else entity(req, "Endpoint", host=endpoint_host,
                                                                        port=u16(endpoint_port)),
                client_tags=tuple(entity(req, "KeyValue", key=k, value=v) for k, v in tags), task_offsets=(),
                task_end_offsets=(), assignment=assignment(active, standby),
                target_assignment=assignment(target, target_standby),
                is_classic=False)

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            groups = list(outcome.groups) + [(int(E.GROUP_AUTHORIZATION_FAILED), None, g, "", -1, -1, -1, None, [])
                                             for g in refused]
            return reply(req, entity(req, "StreamsGroupDescribeResponse", throttle_time=ZERO_THROTTLE, groups=tuple(
                entity(req, "DescribedGroup", error_code=code(error), error_message=message, group_id=group,
                       group_state=state, group_epoch=i32(epoch), assignment_epoch=i32(assignment_epoch),
                       topology=topology(topology_epoch, subtopologies), members=tuple(map(member, members)),
                       authorized_operations=i32(operations(error, group)))
                for error, message, group, state, epoch, assignment_epoch, topology_epoch, subtopologies, members
                in groups)))

        def refusal(error: E.ErrorCode) -> Any:
            return DescribeAnswer([(int(error), None, g, "", -1, -1, -1, None, []) for g in names])

        if refused and not names:
            return answer(DescribeAnswer([]))
        return self._ask(req, M.Kind.STREAMS_GROUP_DESCRIBE, (), (names,), answer, refusal)
