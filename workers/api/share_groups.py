"""Request handlers of share groups (KIP-932): ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch and
ShareAcknowledge.

Each turns its request into the kind's typed message (shm.messages) for the share groups of the group
coordinator in the timer process (node.timer.groups.share), waits for its REPLY and builds the response. Topics
cross the rings by name; the Kafka messages name them by topic id (consumer_groups.TopicIds maps them).

ShareFetch: the coordinator applies the request's acknowledgements and acquires records for the member; this
worker then reads the batches that hold the acquired offsets from the log and answers them with the acquired
ranges (the client keeps the records of those ranges only). When nothing was acquired and the request may
wait, it waits as a Fetch's long poll does (the timer's purgatory, on the partitions' appends past what the
acquisition saw), then asks the coordinator once more to acquire (no acknowledgements again) and answers that.

Invariants:
- Every request gets its response: the coordinator's, or COORDINATOR_NOT_AVAILABLE if the timer never answers.
- A ShareFetch's acquired records are all in its response: the batches are read whole, up to the last acquired
  offset, whatever max_bytes says (max_records bounds them).
- With the authorizer on: READ on the group for every request (GROUP_AUTHORIZATION_FAILED), DESCRIBE on each
  subscribed topic for a heartbeat, READ on each topic fetched (TOPIC_AUTHORIZATION_FAILED), DESCRIBE on each
  group described. Refused requests never reach the coordinator.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Callable

from kio.static.primitive import i16, i32, i32Timedelta, i64

from shmbroker.node.storage.acls import Operation, ResourceType
from shmbroker.node.storage.records import BATCH_HEADER_SIZE, StorageError, parse_header
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.config import NodeConfig
from shmbroker.shm import messages as M
from shmbroker.workers.api.authorizer import RequestAuthorizer
from shmbroker.workers.api.consumer_groups import TopicIds
from shmbroker.workers.api.family import HandlerFamily
from shmbroker.workers.api.responses import ZERO_THROTTLE, code, entity, reply
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.delayed import DelayedRequests, DocumentTooLarge
from shmbroker.workers.timer_client.outcome import Outcome

HeartbeatAnswer = M.reply_class(M.Kind.SHARE_GROUP_HEARTBEAT)
DescribeAnswer = M.reply_class(M.Kind.SHARE_GROUP_DESCRIBE)
FetchAnswer = M.reply_class(M.Kind.SHARE_FETCH)
OffsetsAnswer = M.reply_class(M.Kind.SHARE_GROUP_OFFSETS)
AlterAnswer = M.reply_class(M.Kind.ALTER_SHARE_OFFSETS)
MAX_READS_PER_RANGE = 1024  # log reads for one acquired range (each returns at least one whole batch)
READ_CHUNK_BYTES = 1 << 20


def _ms(value: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


def _millis(delta: Any) -> int:
    return int(delta.total_seconds() * 1000)


class ShareGroupHandlers(HandlerFamily):
    def __init__(self, partitions: PartitionStore, config: NodeConfig, delayed: DelayedRequests,
                 authorizer: RequestAuthorizer | None = None) -> None:
        super().__init__(config, delayed, authorizer)
        self.partitions = partitions
        self.topic_ids = TopicIds(partitions)

    def table(self) -> dict[int, Callable[[Request, Any], Outcome]]:
        return {P.SHARE_GROUP_HEARTBEAT: self.heartbeat, P.SHARE_GROUP_DESCRIBE: self.describe,
                P.SHARE_FETCH: self.fetch, P.SHARE_ACKNOWLEDGE: self.acknowledge,
                P.DESCRIBE_SHARE_GROUP_OFFSETS: self.offsets, P.ALTER_SHARE_GROUP_OFFSETS: self.alter_offsets,
                P.DELETE_SHARE_GROUP_OFFSETS: self.delete_offsets}

    def _ask(self, req: Request, kind: M.Kind, body: tuple, fields: tuple, answer: Callable[[Any], Outcome],
             refusal: Callable[[E.ErrorCode], Any]) -> Outcome:
        try:
            frame = M.encode(kind, 0, req.header.api_version, *body, *fields)
            return self.delayed.ask(req, frame, self.config.timer.control_timeout_ms,
                                    lambda got: answer(None if got is None else got.answer))
        except DocumentTooLarge:
            return answer(refusal(E.INVALID_REQUEST))

    def _topic_partitions(self, req: Request, class_name: str, topics: list, with_names: bool = False) -> tuple:
        return tuple(entity(req, class_name, topic_id=self.topic_ids.id_of(name), partitions=tuple(map(i32, parts)),
                            **({"topic_name": name} if with_names else {})) for name, parts in topics)

    # -- ShareGroupHeartbeat ------------------------------------------------------------------

    def heartbeat(self, req: Request, request: Any) -> Outcome:
        peer = req.conn.peer
        fields = (request.group_id, request.member_id, request.rack_id,
                  None if request.subscribed_topic_names is None else list(request.subscribed_topic_names),
                  req.header.client_id or "", peer[0] if isinstance(peer, tuple) else str(peer))

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            assignment = None if outcome.assignment is None else entity(
                req, "Assignment", topic_partitions=self._topic_partitions(req, "TopicPartitions", outcome.assignment))
            return reply(req, entity(
                req, "ShareGroupHeartbeatResponse", throttle_time=ZERO_THROTTLE, error_code=code(outcome.error),
                error_message=outcome.error_message, member_id=outcome.member or None,
                member_epoch=i32(outcome.member_epoch), heartbeat_interval=_ms(outcome.heartbeat_interval_ms),
                assignment=assignment))

        def refusal(error: E.ErrorCode) -> Any:
            return HeartbeatAnswer(int(error), None, request.member_id, int(request.member_epoch), 0, None)

        if self.authorizer.enabled:
            if not self.authorizer.allows(req, Operation.READ, ResourceType.GROUP, request.group_id):
                return answer(refusal(E.GROUP_AUTHORIZATION_FAILED))
            for topic in set(request.subscribed_topic_names or ()):
                if not self.authorizer.allows(req, Operation.DESCRIBE, ResourceType.TOPIC, topic):
                    return answer(refusal(E.TOPIC_AUTHORIZATION_FAILED))
        return self._ask(req, M.Kind.SHARE_GROUP_HEARTBEAT, (int(request.member_epoch),), fields, answer, refusal)

    # -- ShareGroupDescribe -------------------------------------------------------------------

    def describe(self, req: Request, request: Any) -> Outcome:
        names, refused = self.authorizer.split(req, Operation.DESCRIBE, ResourceType.GROUP, list(request.group_ids))
        operations = self.authorizer.group_operations(req, request)

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            groups = list(outcome.groups) + [(int(E.GROUP_AUTHORIZATION_FAILED), None, g, "", -1, -1, "", [])
                                             for g in refused]
            return reply(req, entity(req, "ShareGroupDescribeResponse", throttle_time=ZERO_THROTTLE, groups=tuple(
                entity(req, "DescribedGroup", error_code=code(error), error_message=message, group_id=group,
                       group_state=state, group_epoch=i32(epoch), assignment_epoch=i32(assignment_epoch),
                       assignor_name=assignor, authorized_operations=i32(operations(error, group)), members=tuple(
                           entity(req, "Member", member_id=member, rack_id=rack, member_epoch=i32(member_epoch),
                                  client_id=client_id, client_host=client_host, subscribed_topic_names=tuple(topics),
                                  assignment=entity(req, "Assignment", topic_partitions=self._topic_partitions(
                                      req, "TopicPartitions", assigned, True)))
                           for member, rack, member_epoch, client_id, client_host, topics, assigned in members))
                for error, message, group, state, epoch, assignment_epoch, assignor, members in groups)))

        def refusal(error: E.ErrorCode) -> Any:
            return DescribeAnswer([(int(error), None, g, "", -1, -1, "", []) for g in names])

        if refused and not names:
            return answer(DescribeAnswer([]))
        return self._ask(req, M.Kind.SHARE_GROUP_DESCRIBE, (), (names,), answer, refusal)

    # -- DescribeShareGroupOffsets -----------------------------------------------------------

    def offsets(self, req: Request, request: Any) -> Outcome:
        """Needs DESCRIBE on the group and on each topic (Kafka's); a refused group is answered
        GROUP_AUTHORIZATION_FAILED, a refused topic's partitions TOPIC_AUTHORIZATION_FAILED."""
        asked, refused = [], []
        for group in request.groups:
            if not self.authorizer.allows(req, Operation.DESCRIBE, ResourceType.GROUP, group.group_id):
                refused.append(group.group_id)
            else:
                asked.append((group.group_id, None if group.topics is None else [
                    (t.topic_name, [int(p) for p in t.partitions]) for t in group.topics]))

        def partition(p: tuple) -> Any:
            _topic, index, start, lag, error = p
            return entity(req, "DescribeShareGroupOffsetsResponsePartition", partition_index=i32(index),
                          start_offset=i64(start), leader_epoch=i32(0 if start >= 0 else -1), lag=i64(lag),
                          error_code=code(error), error_message=None)

        def topics(parts: list) -> tuple:
            by_topic: dict[str, list] = {}
            for p in parts:
                if self.authorizer.permits(req, Operation.DESCRIBE, ResourceType.TOPIC, p[0]):
                    by_topic.setdefault(p[0], []).append(partition(p))
                else:
                    by_topic.setdefault(p[0], []).append(partition((p[0], p[1], -1, -1,
                                                                    int(E.TOPIC_AUTHORIZATION_FAILED))))
            return tuple(entity(req, "DescribeShareGroupOffsetsResponseTopic", topic_name=name,
                                topic_id=self.topic_ids.id_of(name), partitions=tuple(found))
                         for name, found in by_topic.items())

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            groups = list(outcome.groups) + [(g, int(E.GROUP_AUTHORIZATION_FAILED), None, []) for g in refused]
            return reply(req, entity(req, "DescribeShareGroupOffsetsResponse", throttle_time=ZERO_THROTTLE,
                                     groups=tuple(entity(req, "DescribeShareGroupOffsetsResponseGroup",
                                                         group_id=group, topics=topics(parts), error_code=code(error),
                                                         error_message=message)
                                                  for group, error, message, parts in groups)))

        def refusal(error: E.ErrorCode) -> Any:
            return OffsetsAnswer([(g, int(error), None, []) for g, _ in asked])

        if not asked:
            return answer(OffsetsAnswer([]))
        return self._ask(req, M.Kind.SHARE_GROUP_OFFSETS, (), (asked,), answer, refusal)

    # -- AlterShareGroupOffsets, DeleteShareGroupOffsets -------------------------------------

    def alter_offsets(self, req: Request, request: Any) -> Outcome:
        changes = [(t.topic_name, int(p.partition_index), int(p.start_offset))
                   for t in request.topics for p in t.partitions]

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = AlterAnswer(int(E.ErrorCode.coordinator_not_available), None, [])
            by_topic: dict[str, list] = {}
            for topic, partition, error in outcome.results:
                by_topic.setdefault(topic, []).append(entity(
                    req, "AlterShareGroupOffsetsResponsePartition", partition_index=i32(partition),
                    error_code=code(error), error_message=None))
            return reply(req, entity(req, "AlterShareGroupOffsetsResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=code(outcome.error), error_message=outcome.error_message,
                                     responses=tuple(entity(req, "AlterShareGroupOffsetsResponseTopic",
                                                            topic_name=topic, topic_id=self.topic_ids.id_of(topic),
                                                            partitions=tuple(parts))
                                                     for topic, parts in by_topic.items())))

        return self._alter(req, request.group_id, changes, False, answer)

    def delete_offsets(self, req: Request, request: Any) -> Outcome:
        changes = [(t.topic_name, -1, -1) for t in request.topics]

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = AlterAnswer(int(E.ErrorCode.coordinator_not_available), None, [])
            return reply(req, entity(req, "DeleteShareGroupOffsetsResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=code(outcome.error), error_message=outcome.error_message,
                                     responses=tuple(entity(req, "DeleteShareGroupOffsetsResponseTopic",
                                                            topic_name=topic, topic_id=self.topic_ids.id_of(topic),
                                                            error_code=code(error), error_message=None)
                                                     for topic, _partition, error in outcome.results)))

        return self._alter(req, request.group_id, changes, True, answer)

    def _alter(self, req: Request, group: str, changes: list, delete: bool,
               answer: Callable[[Any], Outcome]) -> Outcome:
        """Kafka's checks: DELETE on the group to delete (READ to alter), READ on each topic."""
        operation = Operation.DELETE if delete else Operation.READ
        if self.authorizer.enabled:
            if not self.authorizer.allows(req, operation, ResourceType.GROUP, group):
                return answer(AlterAnswer(int(E.GROUP_AUTHORIZATION_FAILED), None, []))
            if any(not self.authorizer.allows(req, Operation.READ, ResourceType.TOPIC, topic)
                   for topic, _, _ in changes):
                return answer(AlterAnswer(int(E.TOPIC_AUTHORIZATION_FAILED), None, []))
        return self._ask(req, M.Kind.ALTER_SHARE_OFFSETS, (delete,), (group, changes), answer,
                         lambda error: AlterAnswer(int(error), None, []))

    # -- ShareFetch, ShareAcknowledge ---------------------------------------------------------

    def _named(self, req: Request, topics: Any) -> tuple[list, list, dict]:
        """The request's partitions by topic name with their acknowledgements: (partitions for the coordinator,
        those of unknown topic ids (answered UNKNOWN_TOPIC_ID), those refused READ (TOPIC_AUTHORIZATION_FAILED)).
        The last two as {topic id: [partition]}."""
        named, unknown, refused = [], {}, {}
        for topic in topics:
            name = self.topic_ids.name_of(topic.topic_id) if topic.topic_id is not None else None
            parts = [int(p.partition_index) for p in topic.partitions]
            if name is None:
                unknown.setdefault(topic.topic_id, []).extend(parts)
            elif not self.authorizer.allows(req, Operation.READ, ResourceType.TOPIC, name):
                refused.setdefault(topic.topic_id, []).extend(parts)
            else:
                named.extend((name, int(p.partition_index),
                              [(int(b.first_offset), int(b.last_offset), [int(t) for t in b.acknowledge_types])
                               for b in p.acknowledgement_batches]) for p in topic.partitions)
        return named, unknown, refused

    def fetch(self, req: Request, request: Any) -> Outcome:
        return self._share(req, request, acquire=not getattr(request, "is_renew_ack", False))

    def acknowledge(self, req: Request, request: Any) -> Outcome:
        return self._share(req, request, acquire=False)

    def _share(self, req: Request, request: Any, acquire: bool) -> Outcome:
        fetching = req.header.api_key == P.SHARE_FETCH
        group, member = request.group_id or "", request.member_id or ""
        if self.authorizer.enabled and not self.authorizer.allows(req, Operation.READ, ResourceType.GROUP, group):
            return self._response(req, FetchAnswer(int(E.GROUP_AUTHORIZATION_FAILED), None, 0, [], []), {}, {})
        named, unknown, refused = self._named(req, request.topics)
        forgotten = []
        for topic in getattr(request, "forgotten_topics_data", ()):
            name = self.topic_ids.name_of(topic.topic_id) if topic.topic_id is not None else None
            if name is not None:
                forgotten.append((name, [int(p) for p in topic.partitions]))
        max_records = int(request.max_records) if fetching else 0
        max_wait_ms = _millis(request.max_wait) if fetching else 0
        epoch = int(request.share_session_epoch)

        def refusal(error: E.ErrorCode) -> Any:
            return FetchAnswer(int(error), None, 0, [], [])

        def answer(outcome: Any) -> Outcome:
            if outcome is None:
                outcome = refusal(E.ErrorCode.coordinator_not_available)
            if acquire and not outcome.error and outcome.watch and max_wait_ms > 0 \
                    and not any(p[4] for p in outcome.partitions):
                watch = [(row, end_bytes, -1) for row, end_bytes in outcome.watch]
                return self.delayed.delay_fetch(req, watch, 1, max_wait_ms,
                                                lambda _status: again(outcome))
            return self._response(req, outcome, unknown, refused)

        def again(first: Any) -> Outcome:
            def merged(outcome: Any) -> Outcome:  # the first answer's acknowledgement results stay
                if outcome is None or outcome.error:
                    return self._response(req, first, unknown, refused)
                parts = {(p[0], p[1]): list(p) for p in first.partitions}
                for p in outcome.partitions:
                    entry = parts.setdefault((p[0], p[1]), list(p))
                    entry[2], entry[4] = p[2], p[4]
                return self._response(req, outcome._replace(partitions=[tuple(p) for p in parts.values()]),
                                      unknown, refused)

            return self._ask(req, M.Kind.SHARE_FETCH, (epoch, max_records, True, True), (group, member, [], []),
                             merged, refusal)

        return self._ask(req, M.Kind.SHARE_FETCH, (epoch, max_records, acquire, False),
                         (group, member, named, forgotten), answer, refusal)

    def _response(self, req: Request, outcome: Any, unknown: dict, refused: dict) -> Outcome:
        fetching = req.header.api_key == P.SHARE_FETCH
        by_topic: dict[Any, list] = {}
        leader = entity(req, "LeaderIdAndEpoch", leader_id=i32(self.config.server.node_id), leader_epoch=i32(0))
        for topic, partition, error, ack_error, acquired in outcome.partitions:
            topic_id = self.topic_ids.id_of(topic)
            if fetching:
                records = self._read_acquired(topic, partition, acquired) if acquired else b""
                part = entity(req, "PartitionData", partition_index=i32(partition), error_code=code(error),
                              error_message=None, acknowledge_error_code=i16(ack_error),
                              acknowledge_error_message=None, current_leader=leader, records=records,
                              acquired_records=tuple(entity(req, "AcquiredRecords", first_offset=i64(first),
                                                            last_offset=i64(last), delivery_count=i16(count))
                                                     for first, last, count in acquired))
            else:
                part = entity(req, "PartitionData", partition_index=i32(partition), error_code=code(ack_error or error),
                              error_message=None, current_leader=leader)
            by_topic.setdefault(topic_id, []).append(part)
        for failed, error in ((unknown, E.UNKNOWN_TOPIC_ID), (refused, E.TOPIC_AUTHORIZATION_FAILED)):
            for topic_id, parts in failed.items():
                for partition in parts:
                    if fetching:
                        part = entity(req, "PartitionData", partition_index=i32(partition), error_code=error,
                                      error_message=None, acknowledge_error_code=i16(int(error)),
                                      acknowledge_error_message=None, current_leader=leader, records=b"",
                                      acquired_records=())
                    else:
                        part = entity(req, "PartitionData", partition_index=i32(partition), error_code=error,
                                      error_message=None, current_leader=leader)
                    by_topic.setdefault(topic_id, []).append(part)
        topic_class = "ShareFetchableTopicResponse" if fetching else "ShareAcknowledgeTopicResponse"
        response_class = "ShareFetchResponse" if fetching else "ShareAcknowledgeResponse"
        return reply(req, entity(
            req, response_class, throttle_time=ZERO_THROTTLE, error_code=code(outcome.error),
            error_message=outcome.error_message, acquisition_lock_timeout=_ms(outcome.lock_ms),
            responses=tuple(entity(req, topic_class, topic_id=topic_id, partitions=tuple(parts))
                            for topic_id, parts in by_topic.items()),
            node_endpoints=()))

    def _read_acquired(self, topic: str, partition: int, acquired: list) -> bytes:
        """The whole batches that hold the acquired offsets, each once, in offset order."""
        row = self.partitions.row(topic, partition)
        if row is None:
            return b""
        plog = self.partitions.log(row)
        batches: dict[int, bytes] = {}
        for first, last, _count in acquired:
            offset = first
            for _ in range(MAX_READS_PER_RANGE):
                if offset > last:
                    break
                try:
                    piece = plog.read(offset, READ_CHUNK_BYTES, min_one_batch=True)
                except StorageError:
                    break
                if not piece.ranges:
                    break
                before = offset
                for fd, position, length in piece.ranges:
                    data = os.pread(fd, length, position)
                    at = 0
                    while at + BATCH_HEADER_SIZE <= len(data):
                        header = parse_header(data, at)
                        end = at + 12 + header.batch_length
                        batch_last = header.base_offset + header.last_offset_delta
                        if end > len(data):
                            break
                        if batch_last >= offset and header.base_offset <= last:
                            batches.setdefault(header.base_offset, data[at:end])
                        offset = max(offset, batch_last + 1)
                        at = end
                        if offset > last:
                            break
                if offset == before:
                    break
        return b"".join(batches[base] for base in sorted(batches))
