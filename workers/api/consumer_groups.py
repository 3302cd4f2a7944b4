"""Request handlers of the consumer group protocol (KIP-848): ConsumerGroupHeartbeat and ConsumerGroupDescribe.

Each turns its request into the kind's typed message (shm.messages) for the group coordinator in the timer
process (node.timer.groups.consumer), waits for its REPLY and builds the response of the request's version.

Topics cross the rings by name; the Kafka messages name them by topic id (KIP-516). `TopicIds` maps between
the two from the worker's catalog.

Invariants:
- Every request gets its response: the coordinator's, or COORDINATOR_NOT_AVAILABLE if the timer never answers.
- An owned partition of a topic id the node does not know is left out (the topic is gone: nothing to revoke).
- With the authorizer on, as Kafka's broker: a heartbeat needs READ on the group (GROUP_AUTHORIZATION_FAILED)
  and DESCRIBE on every subscribed topic name (TOPIC_AUTHORIZATION_FAILED); a describe needs DESCRIBE on each
  group, and a group whose members name a topic the principal may not describe is answered
  TOPIC_AUTHORIZATION_FAILED without its members. Refused requests never reach the coordinator.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any, Callable

from kio.static.primitive import i32, i32Timedelta

from shmbroker.node.config import NodeConfig
from shmbroker.node.storage.acls import Operation, ResourceType
from shmbroker.node.storage.store import PartitionStore
from shmbroker.shm import messages as M
from shmbroker.workers.api.responses import ZERO_THROTTLE, code, entity, reply
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.codecs.consumer_group_heartbeat import encode_response_without_assignment
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.delayed import DelayedRequests
from shmbroker.workers.timer_client.outcome import Outcome
from shmbroker.workers.api.authorizer import RequestAuthorizer
from shmbroker.workers.api.family import HandlerFamily

HeartbeatAnswer = M.reply_class(M.Kind.CONSUMER_GROUP_HEARTBEAT)
DescribeAnswer = M.reply_class(M.Kind.CONSUMER_GROUP_DESCRIBE)


class TopicIds:
    """Topic name <-> topic id, from the worker's catalog (every topic has its id there)."""

    def __init__(self, partitions: PartitionStore) -> None:
        self.partitions = partitions

    def id_of(self, name: str) -> uuid.UUID:
        entry = self.partitions.catalog.topics.get(name)
        return entry.topic_id if entry is not None and entry.topic_id is not None else uuid.UUID(int=0)

    def name_of(self, topic_id: uuid.UUID) -> str | None:
        return self.partitions.topic_by_id(topic_id)


class ConsumerGroupHandlers(HandlerFamily):
    def __init__(self, partitions: PartitionStore, config: NodeConfig, delayed: DelayedRequests,
                 authorizer: RequestAuthorizer | None = None) -> None:
        super().__init__(config, delayed, authorizer)
        self.topic_ids = TopicIds(partitions)

    def table(self) -> dict[int, Callable[[Request, Any], Outcome]]:
        return {P.CONSUMER_GROUP_HEARTBEAT: self.heartbeat, P.CONSUMER_GROUP_DESCRIBE: self.describe}

    def _by_name(self, topics: Any) -> list | None:
        if topics is None:
            return None
        named = []
        for topic in topics:
            name = self.topic_ids.name_of(topic.topic_id)
            if name is not None:
                named.append((name, [int(p) for p in topic.partitions]))
        return named

    def _by_id(self, req: Request, class_name: str, topics: list, with_names: bool = False) -> tuple:
        extra = {}
        return tuple(entity(req, class_name, topic_id=self.topic_ids.id_of(name), partitions=tuple(map(i32, parts)),
                            **({"topic_name": name} if with_names else extra)) for name, parts in topics)

    def heartbeat(self, req: Request, request: Any) -> Outcome:
        peer = req.conn.peer
        rebalance_ms = int(request.rebalance_timeout.total_seconds() * 1000)
        fields = (request.group_id, request.member_id, request.instance_id, request.rack_id,
                  None if request.subscribed_topic_names is None else list(request.subscribed_topic_names),
                  getattr(request, "subscribed_topic_regex", None), request.server_assignor,
                  self._by_name(request.topic_partitions), req.header.client_id or "",
                  peer[0] if isinstance(peer, tuple) else str(peer))

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            if outcome.error:  # as Kafka's: an error answer carries the code and message alone
                outcome = HeartbeatAnswer(outcome.error, outcome.error_message, "", 0, 0, None)
            if outcome.assignment is None:  # a settled member's answer: the hot path (our own encoder)
                error = int(code(outcome.error))
                return Outcome.reply([encode_response_without_assignment(
                    req.header.correlation_id, 0, error, outcome.error_message, outcome.member or None,
                    outcome.member_epoch, outcome.heartbeat_interval_ms)], (lambda: (error,)) if error else None)
            assignment = entity(req, "Assignment", topic_partitions=self._by_id(req, "TopicPartitions",
                                                                                outcome.assignment))
            return reply(req, entity(
                req, "ConsumerGroupHeartbeatResponse", throttle_time=ZERO_THROTTLE, error_code=code(outcome.error),
                error_message=outcome.error_message, member_id=outcome.member or None,
                member_epoch=i32(outcome.member_epoch), heartbeat_interval=i32Timedelta.parse(
                    datetime.timedelta(milliseconds=outcome.heartbeat_interval_ms)),
                assignment=assignment))

        def refusal(error: E.ErrorCode) -> Any:
            return HeartbeatAnswer(int(error), None, request.member_id, int(request.member_epoch), 0, None)

        if self.authorizer.enabled:
            error = self._heartbeat_refusal(req, request)
            if error is not None:  # Kafka's error response: the code alone
                return answer(HeartbeatAnswer(int(error), None, "", 0, 0, None))
        return self.ask_coordinator(req, M.Kind.CONSUMER_GROUP_HEARTBEAT, (int(request.member_epoch), rebalance_ms),
                                    fields, answer, refusal)

    def _heartbeat_refusal(self, req: Request, request: Any) -> E.ErrorCode | None:
        if not self.authorizer.allows(req, Operation.READ, ResourceType.GROUP, request.group_id):
            return E.GROUP_AUTHORIZATION_FAILED
        for topic in set(request.subscribed_topic_names or ()):
            if not self.authorizer.allows(req, Operation.DESCRIBE, ResourceType.TOPIC, topic):
                return E.TOPIC_AUTHORIZATION_FAILED
        return None

    def _describable(self, req: Request, members: list) -> bool:
        """Whether the principal may describe every topic the group's members subscribe to or are assigned."""
        topics = set()
        for member in members:
            topics.update(member[6])
            topics.update(name for name, _ in member[8])
            topics.update(name for name, _ in member[9])
        return all(self.authorizer.permits(req, Operation.DESCRIBE, ResourceType.TOPIC, topic) for topic in topics)

    def describe(self, req: Request, request: Any) -> Outcome:
        names, refused = self.authorizer.split(req, Operation.DESCRIBE, ResourceType.GROUP, list(request.group_ids))
        operations = self.authorizer.group_operations(req, request)

        def visible(group: tuple) -> tuple:
            if not self.authorizer.enabled or group[0] != E.NONE or self._describable(req, group[7]):
                return group
            return (int(E.TOPIC_AUTHORIZATION_FAILED), "The group has described topic(s) that the client is not "
                    "authorized to describe.", group[2], "", -1, -1, "", [])

        def assignment(topics: list) -> Any:
            return entity(req, "Assignment", topic_partitions=self._by_id(req, "TopicPartitions", topics, True))

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            groups = [visible(group) for group in outcome.groups]
            groups += [(int(E.GROUP_AUTHORIZATION_FAILED), None, g, "", -1, -1, "", []) for g in refused]
            return reply(req, entity(req, "ConsumerGroupDescribeResponse", throttle_time=ZERO_THROTTLE, groups=tuple(
                entity(req, "DescribedGroup", error_code=code(error), error_message=message, group_id=group,
                       group_state=state, group_epoch=i32(epoch), assignment_epoch=i32(assignment_epoch),
                       assignor_name=assignor, authorized_operations=i32(operations(error, group)), members=tuple(
                           entity(req, "Member", member_id=member, instance_id=instance, rack_id=rack,
                                  member_epoch=i32(member_epoch), client_id=client_id, client_host=client_host,
                                  subscribed_topic_names=tuple(topics), subscribed_topic_regex=regex,
                                  assignment=assignment(assigned), target_assignment=assignment(target))
                           for member, instance, rack, member_epoch, client_id, client_host, topics, regex, assigned,
                           target in members))
                for error, message, group, state, epoch, assignment_epoch, assignor, members in groups)))

        def refusal(error: E.ErrorCode) -> Any:
            return DescribeAnswer([(int(error), None, g, "", -1, -1, "", []) for g in names])

        if refused and not names:
            return answer(DescribeAnswer([]))
        return self.ask_coordinator(req, M.Kind.CONSUMER_GROUP_DESCRIBE, (), (names,), answer, refusal)
