"""Share groups (KIP-932, "queues") in the group coordinator: ShareGroupHeartbeat, ShareGroupDescribe, and the
records side of ShareFetch and ShareAcknowledge, in the timer process.

Membership (as Kafka's GroupMetadataManager.shareGroupHeartbeat): a member joins with epoch 0 and its
subscription, heartbeats with its epoch, leaves with -1. Every member is assigned every partition of its
subscribed topics (node.timer.groups.share_group); the answer always carries the member's assignment.
Sessions end in the timer's wheel (node.timer.groups.sessions): a member whose session runs out is removed,
and its acquired records are released, as when it leaves.

Membership is kept in the offsets log (node.timer.groups.offsets' share group states, as Kafka keeps
ShareGroupMetadata and ShareGroupMemberMetadata in __consumer_offsets): after a heartbeat that changed the group
(a join, a leave, a new epoch, subscription or client) and after a member's removal, the group's snapshot
(node.timer.groups.share_group) is appended, not waited for. At load the groups come back with their members,
epochs and assignments, each member's session starting anew, so members heartbeat on with their member id and
epoch across a node restart or a kill -9 of the timer; their share sessions are not kept (Kafka's are not
either): the next ShareFetch gets SHARE_SESSION_NOT_FOUND and the client opens a new one. A data directory from
before the share group records loads as it did: its share groups come back, empty, from their share-partitions.
A change lost in a crash of the machine before its fsync only makes members rejoin (UNKNOWN_MEMBER_ID).

Records (node.timer.groups.share_partition): a ShareFetch comes here with its share session epoch, its
acknowledgements per partition and its partitions; the coordinator keeps each member's share session (its
partitions, its next epoch), applies the acknowledgements, then acquires up to max_records from the session's
partitions for the member, under one lock per partition whose deadline is armed in a wheel (`locks`). A lock
that runs out makes its still-acquired records available again. The worker reads the acquired records from
the log and answers; when nothing was acquired it waits on the partitions' appends as a Fetch's long poll does,
then asks again (`again`: acquisition only).

Share sessions (Kafka's ShareSessionCache, one per member): epoch 0 opens one (replacing the member's old one),
-1 closes it (its acknowledgements applied, then the member's acquired records released), any other must be
the session's next epoch (INVALID_SHARE_SESSION_EPOCH), and a session must exist (SHARE_SESSION_NOT_FOUND).

Durability: every share-partition's state is written, at each change (once per ShareFetch or ShareAcknowledge
however many of its steps changed it, the request's share-partitions in one batch), to the offsets log as one
record per share-partition (node.timer.groups.offsets' share states, versioned), and restored when the log loads: the
start offset and the in-flight records with their states and delivery counts. An acquired record comes back
AVAILABLE with its delivery count (its lock died with the process that held it). A request that carries
acknowledgements is answered once the log is fsync'd past its records (the flusher's group commit, as an offset
commit), so an acknowledged record never comes back, even after a crash of the machine; an acquisition alone is
answered at once (lost, it only costs a delivery count).

Invariants:
- Every request gets exactly one REPLY.
- A record is acquired by at most one member at a time (share_partition's invariant), and a lock deadline is
  armed for every acquisition that holds records.
- A group id is a share group or one of the other kinds, never two at once.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from kio.schema.errors import ErrorCode

from shmbroker.node.config import GroupConfig, WheelConfig
from shmbroker.node.storage import group_config
from shmbroker.node.storage.group_config import ShareSettings
from shmbroker.node.storage.share_records import decoded, encoded_state
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.groups.offsets import SHARE_GROUP_STATE
from shmbroker.node.timer.groups.reconciling import HeartbeatError, describe_rows
from shmbroker.node.timer.groups.family import GroupFamily
from shmbroker.node.timer.groups.sessions import Sessions
from shmbroker.node.timer.groups.share_group import ShareGroup, ShareMember
from shmbroker.node.timer.groups.share_log import committed_exclusions
from shmbroker.node.timer.groups.share_partition import AckType, InFlight, RecordState, SharePartition
from shmbroker.node.timer.outbox import Outbox
from shmbroker.shm import messages as M

log = logging.getLogger("shmbroker.groups")
E = ErrorCode
HeartbeatAnswer = M.reply_class(M.Kind.SHARE_GROUP_HEARTBEAT)
DescribeAnswer = M.reply_class(M.Kind.SHARE_GROUP_DESCRIBE)
FetchAnswer = M.reply_class(M.Kind.SHARE_FETCH)
OffsetsAnswer = M.reply_class(M.Kind.SHARE_GROUP_OFFSETS)
AlterAnswer = M.reply_class(M.Kind.ALTER_SHARE_OFFSETS)
LEAVE_EPOCH = -1
OPEN_SESSION, CLOSE_SESSION = 0, -1
SHARE_ASSIGNOR = "simple"  # Kafka's name for its share group assignor


@dataclass
class ShareSession:
    next_epoch: int
    partitions: dict[tuple[str, int], None] = field(default_factory=dict)  # ordered: the fetch order


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= 2**31 - 1 else epoch + 1


class ShareGroups(GroupFamily):
    def __init__(self, config: GroupConfig, outbox: Outbox, store: PartitionStore, wheel: WheelConfig, now_ms: int,
                 clock: Callable[[], int], classic: Any) -> None:
        super().__init__(config, outbox, store, wheel, now_ms, clock, classic)
        self.groups: dict[str, ShareGroup] = {}
        self.partitions: dict[tuple[str, str, int], SharePartition] = {}  # (group, topic, partition) -> state
        self.share_sessions: dict[tuple[str, str], ShareSession] = {}  # (group, member) -> its share session
        self.locks = Sessions(wheel, now_ms, self.lock_expired)  # (group, topic, partition, lock id) deadlines
        self._lock_ids = itertools.count(1)
        self.lock_expiries = 0  # records released by locks that ran out (stats)
        self.joins = 0  # heartbeats of member epoch 0 accepted: members that joined or rejoined (stats)
        self.acknowledged = [0] * len(AckType)  # records acknowledged, per type (stats)
        self.retired: dict[str, int] = {"acquired": 0, "redelivered": 0, "archived": 0}  # of forgotten partitions
        self.written: dict[tuple[str, str, int], Any] = {}  # the state last written per share-partition
        self.groups_written: dict[str, list] = {}  # the snapshot last written per share group
        self._pending: dict[tuple[str, str, int], None] | None = None  # to write when the ShareFetch is applied

    # -- timers -------------------------------------------------------------------------------

    def timer_wheels(self) -> tuple[Sessions, ...]:
        return self.sessions, self.locks

    def session_expired(self, key: tuple[str, str]) -> None:
        group = self.groups.get(key[0])
        if group is not None and key[1] in group.members:
            log.info("share group %s: member %s removed: session expired", key[0], key[1])
            self._remove(group, key[1])

    def lock_expired(self, key: tuple[str, str, int, int]) -> None:
        group_id, topic, partition, lock = key
        share_partition = self.partitions.get((group_id, topic, partition))
        if share_partition is not None:
            released = share_partition.expire(lock)
            if released:
                self.lock_expiries += released
                self._write(group_id, topic, partition)

    def _remove(self, group: ShareGroup, member_id: str) -> None:
        group.members.pop(member_id, None)
        group.epoch += 1
        self.sessions.forget((group.group_id, member_id))
        self._close_session(group.group_id, member_id)
        self.persist(group)

    def _close_session(self, group_id: str, member_id: str) -> None:
        """Drop the member's share session and release what it holds in the group's share-partitions."""
        self.share_sessions.pop((group_id, member_id), None)
        for (group, topic, partition), share_partition in self.partitions.items():
            if group == group_id and share_partition.release_member(member_id):
                self._write(group, topic, partition)

    # -- ShareGroupHeartbeat ------------------------------------------------------------------

    def heartbeat(self, worker: int, d: Any) -> None:
        waiter = (worker, d.request_id, d.kind)
        if self.classic.offsets.loading:
            return self._answer(waiter, E.coordinator_load_in_progress, "The coordinator is loading.", d.member, 0)
        try:
            self._validate(d)
            if d.member_epoch == LEAVE_EPOCH:
                group = self.groups.get(d.group)
                if group is not None and d.member in group.members:
                    self._remove(group, d.member)
                return self._answer(waiter, E.none, None, d.member, LEAVE_EPOCH)
            group = self._group(d.group, create=d.member_epoch == 0)
            known = group.members.get(d.member)
            before = (group.epoch, known.snapshot() if known is not None else None)
            member = self._member(group, d)
        except HeartbeatError as exc:
            return self._answer(waiter, exc.error, str(exc), d.member, d.member_epoch)
        settings = self.settings(group.group_id)
        assignment = self._assignment(member.subscribed_topics)
        if member.epoch == 0 or assignment != member.assignment:
            if member.epoch != 0:  # a subscribed topic's partitions changed
                group.epoch += 1
            member.assignment = assignment
            member.previous_epoch, member.epoch = member.epoch, group.epoch
        if (group.epoch, member.snapshot()) != before:
            self.persist(group)
        self.sessions.renew((group.group_id, member.member_id), self.clock() + settings.session_timeout_ms)
        self._answer(waiter, E.none, None, member.member_id, member.epoch,
                     [(topic, parts) for topic, parts in sorted(member.assignment.items())],
                     settings.heartbeat_interval_ms)

    @staticmethod
    def _validate(d: Any) -> None:
        if not d.group:
            raise HeartbeatError(E.invalid_request, "GroupId can't be empty.")
        if not d.member:
            raise HeartbeatError(E.invalid_request, "MemberId can't be empty.")
        if d.rack is not None and not d.rack:
            raise HeartbeatError(E.invalid_request, "RackId can't be empty.")
        if d.member_epoch == 0 and not d.subscribed_topics:
            raise HeartbeatError(E.invalid_request, "SubscribedTopicNames must be set in first request.")
        if d.member_epoch < LEAVE_EPOCH:
            raise HeartbeatError(E.invalid_request, f"MemberEpoch {d.member_epoch} is invalid.")

    def _group(self, group_id: str, create: bool) -> ShareGroup:
        group = self.groups.get(group_id)
        if group is not None:
            return group
        if self.other_kind(group_id):
            raise HeartbeatError(E.group_id_not_found, f"Group {group_id} is not a share group.")
        if not create:
            raise HeartbeatError(E.unknown_member_id, f"Share group {group_id} not found.")
        group = self.groups[group_id] = ShareGroup(group_id)
        return group

    def other_kind(self, group_id: str) -> bool:
        """Whether the id is a group of another kind (classic, consumer, streams)."""
        classic = self.classic
        return group_id in classic.groups or group_id in classic.consumer.groups or group_id in classic.streams.groups

    def _member(self, group: ShareGroup, d: Any) -> ShareMember:
        member = group.members.get(d.member)
        if d.member_epoch == 0:
            if member is None:
                if self.config.share_max_size and len(group.members) >= self.config.share_max_size:
                    raise HeartbeatError(E.group_max_size_reached, f"The group {group.group_id} is full.")
                member = group.members[d.member] = ShareMember(d.member)
                group.epoch += 1
            member.epoch = 0
            self.joins += 1
        elif member is None:
            raise HeartbeatError(E.unknown_member_id, f"Member {d.member} is not a member of group {d.group}.")
        elif d.member_epoch > member.epoch or (d.member_epoch < member.epoch
                                               and d.member_epoch != member.previous_epoch):
            raise HeartbeatError(E.fenced_member_epoch, f"The share group member's epoch {d.member_epoch} is not "
                                                        f"its current one ({member.epoch}).")
        member.rack_id = d.rack if d.rack is not None else member.rack_id
        member.client_id, member.client_host = d.client_id, d.client_host
        if d.subscribed_topics is not None and tuple(sorted(d.subscribed_topics)) != member.subscribed_topics:
            member.subscribed_topics = tuple(sorted(d.subscribed_topics))
            group.epoch += 1
        return member

    def _assignment(self, topics: tuple[str, ...]) -> dict[str, list[int]]:
        """The share assignor: every partition of each subscribed topic that exists (internal ones excepted)."""
        assignment = {}
        for topic in topics:
            count = self.store.topic_partitions(topic)
            if count and not self.store.is_internal(topic):
                assignment[topic] = list(range(count))
        return assignment

    def _answer(self, waiter: tuple, error: E, message: str | None, member_id: str, epoch: int,
                assignment: list | None = None, interval_ms: int = 0) -> None:
        worker, request_id, kind = waiter
        answer = HeartbeatAnswer(int(error), message if error else None, member_id, epoch,
                                 0 if error else interval_ms, None if error else assignment)
        self.outbox.send(worker, M.encode_reply(request_id, kind, answer))

    # -- ShareGroupDescribe -------------------------------------------------------------------

    def describe(self, worker: int, d: Any) -> None:
        def row(group: ShareGroup) -> tuple:
            return (int(E.none), None, group.group_id, group.state, group.epoch, group.epoch, SHARE_ASSIGNOR,
                    [(m.member_id, m.rack_id, m.epoch, m.client_id, m.client_host, list(m.subscribed_topics),
                      sorted(m.assignment.items())) for m in group.members.values()])

        described = describe_rows(d.groups, self.groups, self.classic.offsets.loading, "share", self.other_kind, "",
                                  row)
        self.outbox.send(worker, M.encode_reply(d.request_id, d.kind, DescribeAnswer(described)))

    def forget(self, group_id: str) -> None:
        """Drop an empty share group and its share-partitions' state (DeleteGroups)."""
        self.groups.pop(group_id, None)
        if self.groups_written.pop(group_id, None) is not None:
            self.classic.offsets.write_group_state(group_id, None, self.clock(), SHARE_GROUP_STATE)
        for key in [k for k in self.partitions if k[0] == group_id]:
            gone = self.partitions.pop(key)
            for name in self.retired:
                self.retired[name] += getattr(gone, name)
            self._write(*key)

    # -- DescribeShareGroupOffsets -----------------------------------------------------------

    def offsets(self, worker: int, d: Any) -> None:
        """Each share-partition's start offset and lag (records not yet delivered and acknowledged: from the start
        offset to the high watermark, less those in flight that are done); -1 for a partition without state."""
        described = []
        for group_id, topics in d.groups:
            if self.classic.offsets.loading:
                described.append((group_id, int(E.coordinator_load_in_progress), "The coordinator is loading.", []))
                continue
            if group_id not in self.groups:
                message = f"Group {group_id} is not a share group." if self.other_kind(group_id) \
                    else f"Group {group_id} not found."
                described.append((group_id, int(E.group_id_not_found), message, []))
                continue
            if topics is None:
                wanted = sorted((t, p) for g, t, p in self.partitions if g == group_id)
            else:
                wanted = [(topic, partition) for topic, parts in topics for partition in parts]
            described.append((group_id, 0, None, [self._offset(group_id, t, p) for t, p in wanted]))
        self.outbox.send(worker, M.encode_reply(d.request_id, d.kind, OffsetsAnswer(described)))

    def _offset(self, group_id: str, topic: str, partition: int) -> tuple:
        row = self.store.row(topic, partition)
        if row is None:
            return (topic, partition, -1, -1, int(E.unknown_topic_or_partition))
        share_partition = self.partitions.get((group_id, topic, partition))
        if share_partition is None:
            return (topic, partition, -1, -1, 0)
        high_watermark = self.store.table.read(row).high_watermark
        done = share_partition.next_offset - share_partition.start_offset - share_partition.in_flight()
        lag = max(0, high_watermark - share_partition.start_offset - done)
        return (topic, partition, share_partition.start_offset, lag, 0)

    def alter_offsets(self, worker: int, d: Any) -> None:
        """AlterShareGroupOffsets (a share-partition starts anew at the given offset, its records in flight
        forgotten) and DeleteShareGroupOffsets (the topics' share-partitions forgotten: share.auto.offset.reset
        decides again), on a share group without members only (NON_EMPTY_GROUP), as Kafka's."""
        def answer(error: E, message: str | None, results: list) -> None:
            self.outbox.send(worker, M.encode_reply(d.request_id, d.kind, AlterAnswer(int(error), message, results)))

        if self.classic.offsets.loading:
            return answer(E.coordinator_load_in_progress, "The coordinator is loading.", [])
        group = self.groups.get(d.group)
        if group is None:
            message = f"Group {d.group} is not a share group." if self.other_kind(d.group) \
                else f"Group {d.group} not found."
            return answer(E.group_id_not_found, message, [])
        if group.members:
            return answer(E.non_empty_group, f"The group {d.group} has members: its offsets cannot change.", [])
        results = []
        for topic, partition, start in d.changes:
            if d.delete:
                for key in [k for k in self.partitions if k[0] == d.group and k[1] == topic]:
                    del self.partitions[key]
                    self._write(*key)
                known = self.store.topic_partitions(topic) is not None
                results.append((topic, -1, 0 if known else int(E.unknown_topic_or_partition)))
                continue
            row = self.store.row(topic, partition)
            if row is None:
                results.append((topic, partition, int(E.unknown_topic_or_partition)))
                continue
            state = self.store.table.read(row)
            if not state.log_start_offset <= start <= state.high_watermark:
                results.append((topic, partition, int(E.offset_out_of_range)))
                continue
            settings = self.settings(d.group)
            self.partitions[(d.group, topic, partition)] = SharePartition(
                start, settings.delivery_count_limit, settings.partition_max_record_locks,
                topic_id=str(self.store.topic_id(topic) or ""))
            self._write(d.group, topic, partition)
            results.append((topic, partition, 0))
        answer(E.none, None, results)

    # -- ShareFetch, ShareAcknowledge ---------------------------------------------------------

    def fetch(self, worker: int, d: Any) -> None:
        """ShareFetch and ShareAcknowledge. The share-partitions the request changed (acknowledged, acquired,
        released) are written once each, at its end, as one batch; a request with acknowledgements is answered
        once that batch (or, if it changed nothing, everything written so far) is fsync'd."""
        self._pending = {}
        try:
            outcome = self._fetch(worker, d)
        except BaseException:  # what it changed is written all the same
            pending, self._pending = self._pending, None
            self._write_now(list(pending))
            raise
        pending, self._pending = self._pending, None
        if outcome is None:
            self._write_now(list(pending))
            return
        reply, acknowledged = outcome
        if not acknowledged:
            self._write_now(list(pending))
            return self.outbox.send(worker, reply)

        def durable(flushed: bool) -> None:  # acknowledgements are answered once their state is fsync'd
            if not flushed:
                log.warning("share group %s: acknowledgements answered without their state fsync'd", d.group)
            self.outbox.send(worker, reply)

        if not self._write_now(list(pending), durable):
            self.classic.offsets.when_durable(self.clock(), durable)

    def _fetch(self, worker: int, d: Any) -> tuple[bytes, bool] | None:
        """The request applied: (its reply, whether it carried acknowledgements), or None if it was answered
        already (refused)."""
        waiter = (worker, d.request_id, d.kind)
        if self.classic.offsets.loading:
            return self._fetch_answer(waiter, E.coordinator_load_in_progress, "The coordinator is loading.")
        if not d.group or not d.member:
            return self._fetch_answer(waiter, E.invalid_request, "GroupId and MemberId can't be empty.")
        key = (d.group, d.member)
        session = self.share_sessions.get(key)
        epoch = d.session_epoch
        if d.again:
            if session is None:
                return self._fetch_answer(waiter, E.none)
        elif epoch == OPEN_SESSION:
            if not d.acquire:
                return self._fetch_answer(waiter, E.invalid_share_session_epoch,
                                          "ShareAcknowledge cannot open a share session.")
            session = self.share_sessions[key] = ShareSession(1)
        elif session is None:
            return self._fetch_answer(waiter, E.share_session_not_found, f"No share session for member {d.member}.")
        elif epoch != CLOSE_SESSION:
            if epoch != session.next_epoch:
                return self._fetch_answer(waiter, E.invalid_share_session_epoch,
                                          f"Share session epoch {epoch}, expected {session.next_epoch}.")
            session.next_epoch = next_epoch(epoch)
        answered: dict[tuple[str, int], list] = {}
        watch: list[tuple[int, int]] = []
        if not d.again:
            for topic, partition in ((t, p) for t, parts in d.forgotten for p in parts):
                session.partitions.pop((topic, partition), None)
            for topic, partition, acks in d.partitions:
                if d.acquire and epoch != CLOSE_SESSION:
                    session.partitions[(topic, partition)] = None
                if acks:
                    answered[(topic, partition)] = [topic, partition, int(E.none),
                                                    int(self._acknowledge(d.group, d.member, topic, partition, acks)),
                                                    []]
        if epoch == CLOSE_SESSION and not d.again:
            self._close_session(d.group, d.member)
        elif d.acquire:
            self._acquire(d.group, d.member, session, max(d.max_records, 1), answered, watch)
        reply = M.encode_reply(d.request_id, d.kind, FetchAnswer(
            int(E.none), None, self.settings(d.group).record_lock_duration_ms,
            [tuple(p) for p in answered.values()], watch))
        return reply, not d.again and any(acks for _, _, acks in d.partitions)

    def _fetch_answer(self, waiter: tuple, error: E, message: str | None = None) -> None:
        worker, request_id, kind = waiter
        self.outbox.send(worker, M.encode_reply(request_id, kind, FetchAnswer(
            int(error), message, self.config.share_record_lock_duration_ms, [], [])))

    def settings(self, group_id: str) -> ShareSettings:
        """The group's share settings: its group configs on the node's [groups] share_* defaults."""
        return group_config.share_settings(self.config, self.store.catalog.group_configs.get(group_id))

    def _share_partition(self, group_id: str, topic: str, partition: int,
                         settings: ShareSettings) -> SharePartition | None:
        """The share-partition, made at first use where share.auto.offset.reset says (and made anew when its topic
        was deleted and made again under its name: another topic id), with the group's current limits; None if
        there is no such partition."""
        key = (group_id, topic, partition)
        share_partition = self.partitions.get(key)
        row = self.store.row(topic, partition)
        topic_id = str(self.store.topic_id(topic) or "")
        if share_partition is not None and (row is None or share_partition.topic_id in ("", topic_id)):
            return share_partition
        if row is None:
            return None
        state = self.store.table.read(row)
        start = state.high_watermark if settings.auto_offset_reset == "latest" else state.log_start_offset
        share_partition = self.partitions[key] = SharePartition(start, settings.delivery_count_limit,
                                                                settings.partition_max_record_locks,
                                                                topic_id=topic_id)
        self._write(group_id, topic, partition)
        return share_partition

    def _acknowledge(self, group_id: str, member_id: str, topic: str, partition: int, acks: list) -> E:
        share_partition = self.partitions.get((group_id, topic, partition))
        if share_partition is None:
            return E.invalid_record_state if self.store.row(topic, partition) is not None \
                else E.unknown_topic_or_partition
        settings = self.settings(group_id)
        share_partition.configure(settings.delivery_count_limit, settings.partition_max_record_locks)
        renew_lock, error = 0, E.none
        for first, last, types in acks:
            if 4 in types and not renew_lock:  # RENEW: a fresh lock for the renewed records
                renew_lock = next(self._lock_ids)
            outcome = share_partition.acknowledge(member_id, first, last, list(types), renew_lock)
            if outcome == E.none:
                for kind in (types if len(types) > 1 else [types[0]] * (last - first + 1)):
                    self.acknowledged[kind] += 1
            error = error or outcome
        if renew_lock and share_partition.locked(renew_lock):
            self.locks.renew((group_id, topic, partition, renew_lock),
                             self.clock() + settings.record_lock_duration_ms)
        self._write(group_id, topic, partition)
        return error

    def _acquire(self, group_id: str, member_id: str, session: ShareSession, max_records: int,
                 answered: dict[tuple[str, int], list], watch: list[tuple[int, int]]) -> None:
        """Acquire up to max_records over the session's partitions, from the first in the session's order; the
        partitions that gave records go to the end of that order, so the next fetch starts with the others.
        `watch` gets the (row, end bytes) of each partition that had nothing, as this acquisition saw it."""
        left = max_records
        settings = self.settings(group_id)
        deadline = self.clock() + settings.record_lock_duration_ms
        committed = settings.isolation_level == "read_committed"
        served = []
        for topic, partition in list(session.partitions):
            if left <= 0:
                break
            share_partition = self._share_partition(group_id, topic, partition, settings)
            if share_partition is None:
                entry = answered.setdefault((topic, partition), [topic, partition, 0, 0, []])
                entry[2] = int(E.unknown_topic_or_partition)
                continue
            row = self.store.row(topic, partition)
            state = self.store.table.read(row)
            lock = next(self._lock_ids)
            bound, excluded = state.high_watermark, ()
            if committed:  # up to the LSO, without control batches and aborted transactions' batches
                bound, excluded = committed_exclusions(self.store.log(row), share_partition.next_offset,
                                                       state.last_stable_offset)
            before = (share_partition.start_offset, share_partition.next_offset, share_partition.archived)
            share_partition.configure(settings.delivery_count_limit, settings.partition_max_record_locks)
            ranges = share_partition.acquire(member_id, left, bound, state.log_start_offset, lock, excluded)
            if not ranges:
                watch.append((row, state.end_bytes))
                if (share_partition.start_offset, share_partition.next_offset, share_partition.archived) != before:
                    self._write(group_id, topic, partition)  # archived at a lowered limit, or the log start moved
                continue
            left -= sum(last - first + 1 for first, last, _ in ranges)
            self.locks.renew((group_id, topic, partition, lock), deadline)
            entry = answered.setdefault((topic, partition), [topic, partition, 0, 0, []])
            entry[4] = ranges
            served.append((topic, partition))
            self._write(group_id, topic, partition)
        for key in served:
            session.partitions.pop(key, None)
            session.partitions[key] = None

    # -- durability ---------------------------------------------------------------------------

    def _write(self, group_id: str, topic: str, partition: int) -> None:
        """Write the share-partition's state (a tombstone once it is gone) to the offsets log if it changed since
        it was last written: at once, or at the end of the ShareFetch being applied (`_pending`)."""
        key = (group_id, topic, partition)
        if self._pending is not None:
            self._pending[key] = None
        else:
            self._write_now([key])

    def _write_now(self, keys: list[tuple[str, str, int]], done: Callable[[bool], None] | None = None) -> bool:
        """Append the states of `keys` that changed since last written, as one batch, and call done(flushed) once
        it is fsync'd; False (and done never called) if none changed."""
        states = []
        for key in keys:
            share_partition = self.partitions.get(key)
            state = None if share_partition is None else snapshot(share_partition)
            if state == self.written.get(key):
                continue
            if state is None:
                self.written.pop(key, None)
            else:
                self.written[key] = state
            states.append((key, state))
        if not states:
            return False
        self.classic.offsets.write_share_states(states, self.clock(), done)
        return True

    def persist(self, group: ShareGroup) -> None:
        """Write the group's snapshot to the offsets log if it differs from the last one written."""
        snapshot_now = group.snapshot()
        if self.groups_written.get(group.group_id) == snapshot_now:
            return
        self.groups_written[group.group_id] = snapshot_now
        self.classic.offsets.write_group_state(group.group_id, snapshot_now, self.clock(), SHARE_GROUP_STATE)

    def restore(self, group_states: dict[str, Any], states: dict[tuple[str, str, int], Any]) -> None:
        """The share groups and share-partitions the offsets log kept (at the end of its load): members come back
        with their ids, epochs and assignments, their sessions starting now; acquired records come back
        available, with their delivery counts (archived at the group's limit), and a share-partition that changed
        so is written again: the latest record of every share-partition is its state in memory. A group with
        share-partitions and no group record (a data directory from before those records) comes back empty."""
        now = self.clock()
        for group_id, group_state in group_states.items():
            try:
                group = ShareGroup.restore(group_id, group_state)
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                log.warning("share group %s: its state in the offsets log is unreadable (%s): forgotten", group_id,
                            exc)
                continue
            self.groups[group_id] = group
            self.groups_written[group_id] = group.snapshot()
            session_ms = self.settings(group_id).session_timeout_ms
            for member_id in group.members:
                self.sessions.renew((group_id, member_id), now + session_ms)
        if group_states:
            log.info("restored %d share groups from the offsets log", len(self.groups))
        for key, state in states.items():
            try:
                settings = self.settings(key[0])
                self.partitions[key] = restored(state, settings.delivery_count_limit,
                                                settings.partition_max_record_locks)
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                log.warning("share group %s: the state of %s-%d in the offsets log is unreadable (%s): forgotten",
                            key[0], key[1], key[2], exc)
                continue
            self.written[key] = state
            self.groups.setdefault(key[0], ShareGroup(key[0]))
            self._write(*key)

    def counted(self, name: str) -> int:
        """A share-partition counter (acquired, redelivered, archived) summed over the node's, since the timer
        started."""
        return self.retired[name] + sum(getattr(p, name) for p in self.partitions.values())


def snapshot(share_partition: SharePartition) -> list:
    """[format, start offset, next offset, [[first, last, state, delivery count], ...], topic id]: runs of
    in-flight records of one state and count (an acquired one written as acquired: it comes back available)."""
    return encoded_state(share_partition.start_offset, share_partition.next_offset, share_partition.runs(),
                         share_partition.topic_id)


def restored(state: list, delivery_limit: int, max_in_flight: int) -> SharePartition:
    """The share-partition of a state record, under the group's current limits: an acquired record is released
    (its lock died with the process), a waiting one that reached the delivery-count limit archived."""
    start, next_offset, runs, topic_id = decoded(state)
    share_partition = SharePartition(start, delivery_limit, max_in_flight, next_offset, topic_id)
    for first, last, record_state, count in runs:
        for offset in range(first, last + 1):
            record = InFlight(record_state, count)
            if record_state is RecordState.ACQUIRED or (record_state is RecordState.AVAILABLE
                                                        and count >= delivery_limit):
                share_partition._release(record)
            share_partition.records[offset] = record
    share_partition._advance_start()
    return share_partition
