"""Request handlers of the group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete.

The node is the coordinator of every group, and the coordinator lives in the timer process
(node.timer.groups): each handler here turns its request into the kind's typed message (shm.messages: texts,
bytes as bytes, lists of records), waits for the coordinator's REPLY through DelayedRequests, and builds the
response of the request's API version from the answer's fields. FindCoordinator is answered here.

Invariants:
- Every request gets its response: the coordinator's, or, if the timer process never answers (it died and
  its successor lost the request), an error the client retries on (COORDINATOR_NOT_AVAILABLE, or
  REQUEST_TIMED_OUT for offset commits).
- A request too large for the rings (enormous member metadata or assignments) is answered INVALID_REQUEST
  here and never reaches the timer.
- How long a worker waits: a JoinGroup the request's rebalance timeout plus the initial rebalance delay and
  a margin; a SyncGroup up to groups.sync_wait_max_ms; the rest the control timeout.
- With the authorizer on, each API checks what Kafka's broker checks before the coordinator sees the request
  (FindCoordinator: DESCRIBE on each group or transactional id; JoinGroup, SyncGroup, Heartbeat, LeaveGroup:
  READ on the group; OffsetCommit: READ on the group and on each topic; OffsetFetch: DESCRIBE on the group and
  on each topic; ListGroups: DESCRIBE on the cluster, else only the groups it may DESCRIBE; DescribeGroups:
  DESCRIBE, DeleteGroups: DELETE on each group; OffsetDelete: DELETE on the group, READ on each topic). A refused
  group answers GROUP_AUTHORIZATION_FAILED, a refused topic's partitions TOPIC_AUTHORIZATION_FAILED, and what is
  refused never reaches the coordinator. Topics are checked once per request, not per partition.
"""

from __future__ import annotations

import datetime
from typing import Any, Callable

from kio.static.primitive import i32, i64

from shmbroker.node.storage.acls import CLUSTER_NAME, Operation, ResourceType
from shmbroker.shm import messages as M
from shmbroker.workers.api.responses import ZERO_THROTTLE, code, entity, reply
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.outcome import Outcome
from shmbroker.workers.api.family import HandlerFamily

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
SHARE_KEY_TYPE = 2  # v6 (KIP-932): a share-partition's coordinator, "group:topic id:partition"
JoinAnswer = M.reply_class(M.Kind.JOIN_GROUP)
SyncAnswer = M.reply_class(M.Kind.SYNC_GROUP)
HeartbeatAnswer = M.reply_class(M.Kind.HEARTBEAT)
LeaveAnswer = M.reply_class(M.Kind.LEAVE_GROUP)
CommitAnswer = M.reply_class(M.Kind.COMMIT_OFFSETS)
FetchOffsetsAnswer = M.reply_class(M.Kind.FETCH_OFFSETS)
ListAnswer = M.reply_class(M.Kind.LIST_GROUPS)
DescribeAnswer = M.reply_class(M.Kind.DESCRIBE_GROUPS)
DEAD_STATE = "Dead"  # the state DescribeGroups before v6 gives a group that is not there
DeleteGroupsAnswer = M.reply_class(M.Kind.DELETE_GROUPS)
DeleteOffsetsAnswer = M.reply_class(M.Kind.DELETE_OFFSETS)


def millis(delta: Any) -> int:
    return int(delta.total_seconds() * 1000) if isinstance(delta, datetime.timedelta) else int(delta)


FIRST_BATCHED_OFFSET_FETCH = 8  # OffsetFetch v8+: several groups per request (KIP-709)


class GroupHandlers(HandlerFamily):
    """Made with the node's config, the delayed requests' client and the authorizer (HandlerFamily)."""

    def table(self) -> dict[int, Callable[[Request, Any], Outcome]]:
        return {
            P.FIND_COORDINATOR: self.find_coordinator,
            P.JOIN_GROUP: self.join_group,
            P.SYNC_GROUP: self.sync_group,
            P.HEARTBEAT: self.heartbeat,
            P.LEAVE_GROUP: self.leave_group,
            P.OFFSET_COMMIT: self.offset_commit,
            P.OFFSET_FETCH: self.offset_fetch,
            P.LIST_GROUPS: self.list_groups,
            P.DESCRIBE_GROUPS: self.describe_groups,
            P.DELETE_GROUPS: self.delete_groups,
            P.OFFSET_DELETE: self.offset_delete,
        }

    def _group_allows(self, req: Request, operation: Operation, group: str) -> bool:
        return self.authorizer.allows(req, operation, ResourceType.GROUP, group)

    def _split_topics(self, req: Request, operation: Operation, topics: list) -> tuple[list, list]:
        """(allowed, refused) of `topics`, pairs whose first item is a topic name; one decision per name."""
        if not self.authorizer.enabled:
            return topics, []
        allowed, refused = [], []
        for topic in topics:
            (allowed if self.authorizer.allows(req, operation, ResourceType.TOPIC, topic[0]) else refused).append(topic)
        return allowed, refused

    def _split_groups(self, req: Request, operation: Operation, groups: list[str]) -> tuple[list[str], list[str]]:
        """(allowed, refused) of the named groups."""
        return self.authorizer.split(req, operation, ResourceType.GROUP, groups)

    def _ask(self, req: Request, kind: M.Kind, fields: tuple, timeout_ms: int,
             answer: Callable[[Any], Outcome], refusal: Callable[[E.ErrorCode], Any], *body: Any) -> Outcome:
        """HandlerFamily.ask_coordinator, with the message's body (its fixed-size fields) last."""
        return self.ask_coordinator(req, kind, body, fields, answer, refusal, timeout_ms)

    # -- FindCoordinator ----------------------------------------------------------------------

    def find_coordinator(self, req: Request, request: Any) -> Outcome:
        key_type = getattr(request, "key_type", GROUP_KEY_TYPE)
        server = self.config.server
        host, port = req.conn.advertised or (server.advertised_host or server.host,
                                             server.advertised_port or server.port)

        def where(key: str) -> dict:
            if key_type == GROUP_KEY_TYPE and not self._group_allows(req, Operation.DESCRIBE, key):
                error, message, node = E.GROUP_AUTHORIZATION_FAILED, "Not authorized to access group", -1
            elif key_type == TRANSACTION_KEY_TYPE and not self.authorizer.allows(
                    req, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
                error, message, node = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "Not authorized to access " \
                                                                               "transactional id", -1
            elif key_type in (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE, SHARE_KEY_TYPE):  # all the node's (timer)
                error, message, node = E.NONE, None, server.node_id
            else:
                error, message, node = E.INVALID_REQUEST, f"unknown key type {key_type}", -1
            return dict(error_code=error, error_message=message, node_id=i32(node),
                        host=host if node >= 0 else "", port=i32(port) if node >= 0 else i32(-1))

        # v4+ asks for a batch of keys and answers one coordinator per key (KIP-699); older versions one key.
        keys = getattr(request, "coordinator_keys", None)
        if keys is None:
            return reply(req, entity(req, "FindCoordinatorResponse", throttle_time=ZERO_THROTTLE,
                                     **where(request.key)))
        return reply(req, entity(req, "FindCoordinatorResponse", throttle_time=ZERO_THROTTLE, coordinators=tuple(
            entity(req, "Coordinator", key=key, **where(key)) for key in keys)))

    # -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup ------------------------------------------

    def join_group(self, req: Request, request: Any) -> Outcome:
        session_ms = millis(request.session_timeout)
        rebalance_ms = millis(request.rebalance_timeout) if hasattr(request, "rebalance_timeout") else session_ms
        peer = req.conn.peer
        fields = (request.group_id, request.member_id, getattr(request, "group_instance_id", None),
                  request.protocol_type, [(p.name, p.metadata) for p in request.protocols],
                  req.header.client_id or "", peer[0] if isinstance(peer, tuple) else str(peer))
        groups = self.config.groups
        timeout_ms = max(rebalance_ms, session_ms) + groups.initial_rebalance_delay_ms + groups.join_answer_margin_ms

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            members = tuple(entity(req, "JoinGroupResponseMember", member_id=member, group_instance_id=instance,
                                   metadata=metadata) for member, instance, metadata in outcome.members)
            # protocol_name: nullable from v7 (null in an error answer, as Kafka's); "" before.
            protocol_name = outcome.protocol or ("" if req.header.api_version < 7 else None)
            return reply(req, entity(
                req, "JoinGroupResponse", throttle_time=ZERO_THROTTLE, error_code=code(outcome.error),
                generation_id=i32(outcome.generation), protocol_type=outcome.protocol_type,
                protocol_name=protocol_name, leader=outcome.leader, member_id=outcome.member,
                members=members))

        def refusal(error: E.ErrorCode) -> Any:
            return JoinAnswer(int(error), -1, None, None, "", request.member_id, [])

        if not self._group_allows(req, Operation.READ, request.group_id):
            return answer(JoinAnswer(int(E.GROUP_AUTHORIZATION_FAILED), -1, None, None, "", "", []))
        return self._ask(req, M.Kind.JOIN_GROUP, fields, timeout_ms, answer, refusal, session_ms, rebalance_ms)

    def sync_group(self, req: Request, request: Any) -> Outcome:
        fields = (request.group_id, request.member_id, getattr(request, "group_instance_id", None),
                  [(a.member_id, a.assignment) for a in request.assignments])

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            # v5+ names the group's protocol type and assignor; the request's, which the client checks against
            # its own (the coordinator answered, so the member joined with them); none in an error answer, as
            # Kafka's.
            ok = not outcome.error
            return reply(req, entity(req, "SyncGroupResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=code(outcome.error), assignment=outcome.assignment,
                                     protocol_type=getattr(request, "protocol_type", None) if ok else None,
                                     protocol_name=getattr(request, "protocol_name", None) if ok else None))

        def refusal(error: E.ErrorCode) -> Any:
            return SyncAnswer(int(error), b"")

        if not self._group_allows(req, Operation.READ, request.group_id):
            return answer(refusal(E.GROUP_AUTHORIZATION_FAILED))
        return self._ask(req, M.Kind.SYNC_GROUP, fields, self.config.groups.sync_wait_max_ms, answer, refusal,
                         int(request.generation_id))

    def heartbeat(self, req: Request, request: Any) -> Outcome:
        fields = (request.group_id, request.member_id, getattr(request, "group_instance_id", None))

        def answer(outcome: Any) -> Outcome:
            error = E.ErrorCode.coordinator_not_available if outcome is None else code(outcome.error)
            return reply(req, entity(req, "HeartbeatResponse", throttle_time=ZERO_THROTTLE, error_code=error))

        if not self._group_allows(req, Operation.READ, request.group_id):
            return answer(HeartbeatAnswer(int(E.GROUP_AUTHORIZATION_FAILED)))
        return self._ask(req, M.Kind.HEARTBEAT, fields, self.config.timer.control_timeout_ms, answer,
                         lambda error: HeartbeatAnswer(int(error)), int(request.generation_id))

    def leave_group(self, req: Request, request: Any) -> Outcome:
        if hasattr(request, "members"):  # v3+: a batch of members
            leaving = [(m.member_id, m.group_instance_id) for m in request.members]
        else:
            leaving = [(request.member_id, None)]

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = LeaveAnswer(int(E.ErrorCode.coordinator_not_available), [])
            error = code(outcome.error)
            if not hasattr(request, "members") and outcome.members and not error:  # v0-2: the one member's error
                error = code(outcome.members[0][2])
            return reply(req, entity(
                req, "LeaveGroupResponse", throttle_time=ZERO_THROTTLE, error_code=error,
                members=tuple(entity(req, "MemberResponse", member_id=member, group_instance_id=instance,
                                     error_code=code(member_error)) for member, instance, member_error in outcome.members)))

        if not self._group_allows(req, Operation.READ, request.group_id):
            return answer(LeaveAnswer(int(E.GROUP_AUTHORIZATION_FAILED), []))
        return self._ask(req, M.Kind.LEAVE_GROUP, (request.group_id, leaving), self.config.timer.control_timeout_ms,
                         answer, lambda error: LeaveAnswer(int(error), []))

    # -- offsets ------------------------------------------------------------------------------

    def offset_commit(self, req: Request, request: Any) -> Outcome:
        topics = [(t.name, [(p.partition_index, int(p.committed_offset), int(getattr(p, "committed_leader_epoch", -1)),
                             p.committed_metadata) for p in t.partitions]) for t in request.topics]
        refused: list = []

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.REQUEST_TIMED_OUT)
            answered = [*outcome.topics, *failed(refused, E.TOPIC_AUTHORIZATION_FAILED)]
            return reply(req, entity(req, "OffsetCommitResponse", throttle_time=ZERO_THROTTLE, topics=tuple(
                entity(req, "OffsetCommitResponseTopic", name=name, partitions=tuple(
                    entity(req, "OffsetCommitResponsePartition", partition_index=i32(partition),
                           error_code=code(error)) for partition, error in partitions))
                for name, partitions in answered)))

        def refusal(error: E.ErrorCode) -> Any:
            return CommitAnswer(failed(topics, error))

        if not self._group_allows(req, Operation.READ, request.group_id):
            return answer(refusal(E.GROUP_AUTHORIZATION_FAILED))
        topics, refused = self._split_topics(req, Operation.READ, topics)
        if refused and not topics:
            return answer(CommitAnswer([]))
        fields = (request.group_id, request.member_id, getattr(request, "group_instance_id", None), topics)
        return self._ask(req, M.Kind.COMMIT_OFFSETS, fields, self.config.timer.control_timeout_ms, answer, refusal,
                         int(request.generation_id_or_member_epoch))

    def offset_fetch(self, req: Request, request: Any) -> Outcome:
        """v0-7 ask for one group; v8+ for several (KIP-709), each answered on its own, asked of the coordinator
        one after another (GroupsInTurn); v9 names the asking member of a consumer group (KIP-848)."""
        require_stable = bool(getattr(request, "require_stable", False))
        if req.header.api_version < FIRST_BATCHED_OFFSET_FETCH:
            return self._group_offsets(req, request.group_id, None, -1, request.topics, require_stable,
                                       lambda error, topics: reply(
                req, entity(req, "OffsetFetchResponse", throttle_time=ZERO_THROTTLE, error_code=code(error),
                            topics=self._offset_topics(req, "OffsetFetchResponseTopic", "OffsetFetchResponsePartition",
                                                       topics))))

        def one_group(group: Any, done: Callable[[Any], Outcome]) -> Outcome:
            return self._group_offsets(req, group.group_id, getattr(group, "member_id", None),
                                       getattr(group, "member_epoch", -1), group.topics, require_stable,
                                       lambda error, topics: done(
                entity(req, "OffsetFetchResponseGroup", group_id=group.group_id, error_code=code(error),
                       topics=self._offset_topics(req, "OffsetFetchResponseTopics", "OffsetFetchResponsePartitions",
                                                  topics))))

        return GroupsInTurn(list(request.groups), one_group, lambda answers: reply(req, entity(
            req, "OffsetFetchResponse", throttle_time=ZERO_THROTTLE, groups=tuple(answers)))).run()

    @staticmethod
    def _offset_topics(req: Request, topic_class: str, partition_class: str, topics: list) -> tuple:
        return tuple(entity(req, topic_class, name=name, partitions=tuple(
            entity(req, partition_class, partition_index=i32(partition), committed_offset=i64(offset),
                   committed_leader_epoch=i32(epoch), metadata=metadata, error_code=code(error))
            for partition, offset, epoch, metadata, error in partitions))
            for name, partitions in topics)

    def _group_offsets(self, req: Request, group_id: str, member: str | None, member_epoch: int,
                       request_topics: Any, require_stable: bool, done: Callable[[int, list], Outcome]) -> Outcome:
        """One group's committed offsets: `done(error, topics)` with topics as (name, [(partition, offset,
        leader epoch, metadata, error)]), what the principal may see of them. A member id or epoch (v9, KIP-848)
        is checked by the coordinator against the consumer group's members."""
        wanted = None if request_topics is None else [(t.name, list(t.partition_indexes)) for t in request_topics]
        refused: list = []

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            topics = outcome.topics
            if self.authorizer.enabled and outcome.error == E.NONE:
                if wanted is None:  # every topic of the group: those it may not describe are left out
                    topics = [topic for topic in topics if self.authorizer.permits(
                        req, Operation.DESCRIBE, ResourceType.TOPIC, topic[0])]
                else:
                    topics = [*topics, *refused_offsets(int(E.TOPIC_AUTHORIZATION_FAILED), refused).topics]
            return done(outcome.error, topics)

        def refusal(error: E.ErrorCode) -> Any:
            return refused_offsets(int(error), wanted)

        if not self._group_allows(req, Operation.DESCRIBE, group_id):
            # v2+ carry the group's error at the top and no partitions; v1 has only the partitions' errors.
            return answer(refusal(E.GROUP_AUTHORIZATION_FAILED)) if req.header.api_version < 2 else \
                answer(FetchOffsetsAnswer(int(E.GROUP_AUTHORIZATION_FAILED), []))
        asked = wanted
        if wanted is not None:
            asked, refused = self._split_topics(req, Operation.DESCRIBE, wanted)
        return self._ask(req, M.Kind.FETCH_OFFSETS, (group_id, member, asked), self.config.timer.control_timeout_ms,
                         answer, refusal, require_stable, member_epoch)

    def offset_delete(self, req: Request, request: Any) -> Outcome:
        wanted = [(t.name, [p.partition_index for p in t.partitions]) for t in request.topics]
        refused: list = []

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = DeleteOffsetsAnswer(int(E.ErrorCode.coordinator_not_available), [])
            topics = outcome.topics
            if refused and outcome.error == E.NONE:
                topics = [*topics, *[(name, [(p, int(E.TOPIC_AUTHORIZATION_FAILED)) for p in parts])
                                   for name, parts in refused]]
            return reply(req, entity(
                req, "OffsetDeleteResponse", throttle_time=ZERO_THROTTLE, error_code=code(outcome.error),
                topics=tuple(entity(req, "OffsetDeleteResponseTopic", name=name, partitions=tuple(
                    entity(req, "OffsetDeleteResponsePartition", partition_index=i32(partition),
                           error_code=code(error)) for partition, error in partitions))
                    for name, partitions in topics)))

        if not self._group_allows(req, Operation.DELETE, request.group_id):
            return answer(DeleteOffsetsAnswer(int(E.GROUP_AUTHORIZATION_FAILED), []))
        wanted, refused = self._split_topics(req, Operation.READ, wanted)
        return self._ask(req, M.Kind.DELETE_OFFSETS, (request.group_id, wanted), self.config.timer.control_timeout_ms,
                         answer, lambda error: DeleteOffsetsAnswer(int(error), []))

    # -- ListGroups, DescribeGroups, DeleteGroups ---------------------------------------------

    def list_groups(self, req: Request, request: Any) -> Outcome:
        """v4+ filter by state and v5+ by type (Kafka compares both case-insensitively): classic or consumer."""
        states = {state.lower() for state in getattr(request, "states_filter", ())}
        types = {kind.lower() for kind in getattr(request, "types_filter", ())}

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = ListAnswer(int(E.ErrorCode.coordinator_not_available), [])
            listed = [(group, protocol_type, state, group_type)
                      for group, protocol_type, state, group_type in outcome.groups
                      if (not states or state.lower() in states) and (not types or group_type in types)]
            if self.authorizer.enabled and not self.authorizer.permits(req, Operation.DESCRIBE, ResourceType.CLUSTER,
                                                                       CLUSTER_NAME):
                listed = [group for group in listed
                          if self.authorizer.permits(req, Operation.DESCRIBE, ResourceType.GROUP, group[0])]
            return reply(req, entity(req, "ListGroupsResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=code(outcome.error), groups=tuple(
                                         entity(req, "ListedGroup", group_id=group, protocol_type=protocol_type,
                                                group_state=state, group_type=group_type)
                                         for group, protocol_type, state, group_type in listed)))

        return self._ask(req, M.Kind.LIST_GROUPS, (), self.config.timer.control_timeout_ms, answer,
                         lambda error: ListAnswer(int(error), []))

    def describe_groups(self, req: Request, request: Any) -> Outcome:
        names, refused = self._split_groups(req, Operation.DESCRIBE, list(request.groups))
        operations = self.authorizer.group_operations(req, request)

        def not_found(error: int, group: str, state: str, members: Any) -> str | None:
            """KIP-1043 (v6+): why a group the timer did not describe is GROUP_ID_NOT_FOUND (it is not there, or
            not a classic group), as Kafka says it; None for the others."""
            if req.header.api_version < 6:
                return None
            if error == E.GROUP_ID_NOT_FOUND:
                return f"Group {group} is not a classic group."
            if error == E.NONE and state == DEAD_STATE and not members:
                return f"Group {group} not found."
            return None

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            groups = [*outcome.groups, *[(int(E.GROUP_AUTHORIZATION_FAILED), g, "", "", "", ()) for g in refused]]
            groups = [(error, group, state, protocol_type, protocol, members, not_found(error, group, state, members))
                      for error, group, state, protocol_type, protocol, members in groups]
            return reply(req, entity(req, "DescribeGroupsResponse", throttle_time=ZERO_THROTTLE, groups=tuple(
                entity(req, "DescribedGroup", error_code=code(E.GROUP_ID_NOT_FOUND if missing else error),
                       error_message=missing, group_id=group, group_state="" if missing else state,
                       protocol_type=protocol_type, protocol_data=protocol,
                       authorized_operations=i32(operations(error, group)),
                       members=tuple(entity(req, "DescribedGroupMember", member_id=member, group_instance_id=instance,
                                            client_id=client_id, client_host=client_host, member_metadata=metadata,
                                            member_assignment=assignment)
                                     for member, instance, client_id, client_host, metadata, assignment in members))
                for error, group, state, protocol_type, protocol, members, missing in groups)))

        def refusal(error: E.ErrorCode) -> Any:
            return DescribeAnswer([(int(error), g, "", "", "", ()) for g in names])

        if refused and not names:
            return answer(DescribeAnswer([]))
        return self._ask(req, M.Kind.DESCRIBE_GROUPS, (names,), self.config.timer.control_timeout_ms, answer, refusal)

    def delete_groups(self, req: Request, request: Any) -> Outcome:
        names, refused = self._split_groups(req, Operation.DELETE, list(request.groups_names))

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            results = [*outcome.results, *[(g, int(E.GROUP_AUTHORIZATION_FAILED)) for g in refused]]
            return reply(req, entity(req, "DeleteGroupsResponse", throttle_time=ZERO_THROTTLE, results=tuple(
                entity(req, "DeletableGroupResult", group_id=group, error_code=code(error))
                for group, error in results)))

        def refusal(error: E.ErrorCode) -> Any:
            return DeleteGroupsAnswer([(g, int(error)) for g in names])

        if refused and not names:
            return answer(DeleteGroupsAnswer([]))
        return self._ask(req, M.Kind.DELETE_GROUPS, (names,), self.config.timer.control_timeout_ms, answer, refusal)


def failed(topics: list, error: int) -> list:
    """Every partition of `topics` (name, [(partition, ...)]) answered `error`."""
    return [(name, [(p[0], int(error)) for p in parts]) for name, parts in topics]


class GroupsInTurn:
    """The groups of one request asked of the coordinator one after another: `ask(group, done)` returns the
    group's outcome, DEFERRED while the coordinator has it, and calls `done(answer)` once it has the group's
    answer; `finish(answers)` builds the response once every group has one. A group answered at once (refused
    here) does not nest a call per group: the loop goes on."""

    def __init__(self, groups: list, ask: Callable[[Any, Callable[[Any], Outcome]], Outcome],
                 finish: Callable[[list], Outcome]) -> None:
        self.groups = groups
        self.ask = ask
        self.finish = finish
        self.answers: list = []
        self.next = 0
        self.in_loop = False

    def run(self) -> Outcome:
        self.in_loop = True
        try:
            while self.next < len(self.groups):
                group = self.groups[self.next]
                self.next += 1
                if self.ask(group, self._done).deferred:
                    return Outcome.DEFERRED
        finally:
            self.in_loop = False
        return self.finish(self.answers)

    def _done(self, answer: Any) -> Outcome:
        self.answers.append(answer)
        return Outcome.NO_RESPONSE if self.in_loop else self.run()  # at once: the loop goes on


def refused_offsets(error: int, wanted: list | None) -> Any:
    """An OffsetFetch answer that refuses every partition asked for (v0-1 have no top-level error: each partition
    carries it)."""
    return FetchOffsetsAnswer(error, [(name, [(p, -1, -1, "", error) for p in parts]) for name, parts in (wanted or [])])
