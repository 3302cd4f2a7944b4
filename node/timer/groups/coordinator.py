"""The group coordinator of the node (every group's): Kafka's classic-protocol GroupCoordinator, in the timer
process, driven by the group messages of the worker-timer contract (shm.messages) and by its timers.

Each request handler takes (worker, message): the message carries the Kafka request's fields (shm.messages'
typed group kinds), and the answer goes back as a REPLY in the kind's reply layout, at once or when a delayed
operation completes (a join phase, a pending sync, an offset commit's fsync). The worker turns it into the
response of the request's API version. Error codes are Kafka's, chosen as Kafka's GroupCoordinator chooses
them.

Timers: join phases (`joins`) and pending syncs (`syncs`) are operations (node.timer.groups.delayed) in
purgatories of their own on the timer's wheel; member sessions (`sessions`, node.timer.groups.sessions) are
wheel timers renewed lazily. Durable commits wait on the flusher through the delayed-operation service
(node.timer.groups.offsets).

Invariants:
- Every request gets exactly one REPLY, unless the timer process dies first (then the worker answers it).
- Group state changes only here, in the timer loop's thread; operations re-check the group when they fire.
- While the offsets log loads, every request answers COORDINATOR_LOAD_IN_PROGRESS (clients retry).
- Groups with committed offsets exist (Empty) even without members, as in Kafka; a group with neither
  members nor offsets is forgotten by the periodic offset expiry (until then it shows as Empty).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Callable

from kio.schema.errors import ErrorCode

from shmbroker.node.config import GroupConfig, PurgatoryConfig, WheelConfig
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.groups.consumer import ConsumerGroups
from shmbroker.node.timer.groups.delayed import DelayedJoin, InitialDelayedJoin, PendingSync, join_key, sync_key
from shmbroker.node.timer.groups.group import Group, GroupState, Member, Waiter
from shmbroker.node.timer.groups.offsets import OffsetStore
from shmbroker.node.timer.groups.reconciling import ReconcilingGroups
from shmbroker.node.timer.groups.sessions import Sessions
from shmbroker.node.timer.groups.share import ShareGroups
from shmbroker.node.timer.groups.streams import StreamsGroups
from shmbroker.node.timer.outbox import Outbox
from shmbroker.node.timer.purgatory import Purgatory
from shmbroker.shm import messages as M

log = logging.getLogger("shmbroker.groups")
# ListGroups v5's group types: the classic protocol's groups, the consumer protocol's (KIP-848), the Streams
# rebalance protocol's (KIP-1071) and share groups (KIP-932).
CLASSIC, CONSUMER, STREAMS, SHARE = "classic", "consumer", "streams", "share"
JoinAnswer = M.reply_class(M.Kind.JOIN_GROUP)
SyncAnswer = M.reply_class(M.Kind.SYNC_GROUP)
FetchOffsetsAnswer = M.reply_class(M.Kind.FETCH_OFFSETS)

E = ErrorCode
NO_GENERATION = -1
# JoinGroup v4+ answers a member without an id MEMBER_ID_REQUIRED (KIP-394); older versions may not get it.
REQUIRE_MEMBER_ID_VERSION = 4
EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (GroupState.EMPTY, GroupState.PREPARING_REBALANCE,
                                             GroupState.COMPLETING_REBALANCE, GroupState.STABLE, GroupState.DEAD)


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class GroupCoordinator:
    def __init__(self, config: GroupConfig, outbox: Outbox, offsets: OffsetStore, store: PartitionStore,
                 wheel: WheelConfig, purgatory: PurgatoryConfig, now_ms: int,
                 clock: Callable[[], int] = monotonic_ms) -> None:
        self.config = config
        self.outbox = outbox
        self.offsets = offsets
        self.store = store
        self.clock = clock
        self.groups: dict[str, Group] = {}
        self.joins = Purgatory.configured("rebalance", purgatory, wheel, now_ms)
        self.sessions = Sessions(wheel, now_ms, self.session_expired)
        self.syncs = Purgatory.configured("sync", purgatory, wheel, now_ms)
        self.rebalances = 0  # completed join phases (the stats segment counts them)
        # The (topic, partition)s of a group whose offsets an open or completing transaction holds: the transaction
        # coordinator's, set once it exists (the timer process builds it after this one).
        self.pending_transactional_offsets: Callable[[str], set[tuple[str, int]]] = lambda group: set()
        # Consumer-protocol groups (KIP-848): a group id is in exactly one of self.groups and self.consumer.groups.
        self.consumer = ConsumerGroups(config, outbox, store, wheel, now_ms, clock, classic=self)
        # Streams groups (KIP-1071): a group id is in exactly one of self.groups, consumer.groups, streams.groups.
        self.streams = StreamsGroups(config, outbox, store, wheel, now_ms, clock, classic=self)
        self.reconciling: tuple[ReconcilingGroups, ...] = (self.consumer, self.streams)
        # Share groups (KIP-932): a group id is in one of the above or in share.groups.
        self.share = ShareGroups(config, outbox, store, wheel, now_ms, clock, classic=self)
        self.handlers: dict[M.Kind, Callable[[int, Any], None]] = {
            M.Kind.JOIN_GROUP: self.join_group,
            M.Kind.SYNC_GROUP: self.sync_group,
            M.Kind.HEARTBEAT: self.heartbeat,
            M.Kind.LEAVE_GROUP: self.leave_group,
            M.Kind.COMMIT_OFFSETS: self.commit_offsets,
            M.Kind.FETCH_OFFSETS: self.fetch_offsets,
            M.Kind.LIST_GROUPS: self.list_groups,
            M.Kind.DESCRIBE_GROUPS: self.describe_groups,
            M.Kind.DELETE_GROUPS: self.delete_groups,
            M.Kind.DELETE_OFFSETS: self.delete_offsets,
            M.Kind.CONSUMER_GROUP_HEARTBEAT: self.consumer.heartbeat,
            M.Kind.CONSUMER_GROUP_DESCRIBE: self.consumer.describe,
            M.Kind.STREAMS_GROUP_HEARTBEAT: self.streams.heartbeat,
            M.Kind.STREAMS_GROUP_DESCRIBE: self.streams.describe,
            M.Kind.SHARE_GROUP_HEARTBEAT: self.share.heartbeat,
            M.Kind.SHARE_GROUP_DESCRIBE: self.share.describe,
            M.Kind.SHARE_FETCH: self.share.fetch,
            M.Kind.SHARE_GROUP_OFFSETS: self.share.offsets,
            M.Kind.ALTER_SHARE_OFFSETS: self.share.alter_offsets,
        }

    # -- the timer loop's calls ---------------------------------------------------------------

    def turn(self) -> None:
        """Once per loop turn: load a slice of the offsets log while it loads."""
        if self.offsets.loading and self.offsets.load_step(self.clock()):
            self.streams.restore(self.offsets.group_states)
            self.share.restore(self.offsets.share_group_states, self.offsets.share_states)
            for group_id in self.offsets.groups():
                if group_id not in self.consumer.groups and group_id not in self.streams.groups \
                        and group_id not in self.share.groups:
                    self.groups.setdefault(group_id, Group(group_id))

    def advance(self, now_ms: int) -> None:
        for timers in (self.joins, self.sessions, self.syncs, self.consumer, self.streams, self.share):
            timers.advance(now_ms)

    def next_expiration(self) -> int | None:
        """The earliest deadline of a group timer, or of the next slice of the offsets log while it loads."""
        due = [d for p in (self.joins, self.sessions, self.syncs, self.consumer, self.streams, self.share)
               if (d := p.next_expiration()) is not None]
        if self.offsets.loading:
            due.append(self.offsets.next_load_ms())
        return min(due) if due else None

    @property
    def loading(self) -> bool:
        return self.offsets.loading

    # -- answers ------------------------------------------------------------------------------

    def _reply(self, waiter: Waiter, answer: tuple) -> None:
        worker, request_id, _, kind = waiter
        self.outbox.send(worker, M.encode_reply(request_id, kind, answer))

    def _join_reply(self, waiter: Waiter, error: E, member_id: str = "", group: Group | None = None,
                    members: list | None = None, leader: str | None = None) -> None:
        ok = group is not None and not error
        self._reply(waiter, JoinAnswer(int(error), group.generation if ok else NO_GENERATION,
                                       group.protocol_type if ok else None, group.protocol if ok else None,
                                       (leader or group.leader or "") if ok else "", member_id, members or ()))

    def _sync_reply(self, waiter: Waiter, error: E, assignment: bytes = b"") -> None:
        self._reply(waiter, SyncAnswer(int(error), assignment))

    def _error_only(self, waiter: Waiter, error: E) -> None:
        """The answer of the waiter's kind with this error and nothing else."""
        self._reply(waiter, M.reply_class(waiter[3])(int(error)))

    @staticmethod
    def _waiter(worker: int, message: Any) -> Waiter:
        return (worker, message.request_id, message.api_version, message.kind)

    def _unavailable(self, waiter: Waiter) -> bool:
        """Answer COORDINATOR_LOAD_IN_PROGRESS while the offsets load; True if it did."""
        if self.offsets.loading:
            self._error_only(waiter, E.coordinator_load_in_progress)
            return True
        return False

    # -- JoinGroup ----------------------------------------------------------------------------

    def join_group(self, worker: int, message: Any) -> None:
        d, waiter = message, self._waiter(worker, message)
        group_id, member_id, instance_id = d.group, d.member, d.instance
        protocols = list(d.protocols)  # (name, metadata) pairs
        if self.offsets.loading:
            return self._join_reply(waiter, E.coordinator_load_in_progress, member_id)
        if not group_id:
            return self._join_reply(waiter, E.invalid_group_id, member_id)
        if not self.config.min_session_timeout_ms <= d.session_timeout_ms <= self.config.max_session_timeout_ms:
            return self._join_reply(waiter, E.invalid_session_timeout, member_id)
        family, other = self._reconciling(group_id)
        if other is not None:
            if other.members:  # a group is one protocol's
                return self._join_reply(waiter, E.inconsistent_group_protocol, member_id)
            family.forget(group_id)  # an empty consumer or streams group becomes a classic one; offsets stay
        if group_id in self.share.groups:  # a share group stays one (its share-partitions have state)
            return self._join_reply(waiter, E.inconsistent_group_protocol, member_id)
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return self._join_reply(waiter, E.unknown_member_id, member_id)
            group = self.groups[group_id] = Group(group_id)
            self._transition(group, EMPTY, self.clock())
        if group.is_(DEAD):
            return self._join_reply(waiter, E.coordinator_not_available, member_id)
        joining_anew = not member_id or (member_id not in group.members and member_id not in group.pending)
        if self.config.max_size and joining_anew and len(group.members) + len(group.pending) >= self.config.max_size:
            return self._join_reply(waiter, E.group_max_size_reached, member_id)
        if not group.supports(d.protocol_type, protocols):
            return self._join_reply(waiter, E.inconsistent_group_protocol, member_id)
        if not member_id:
            self._join_new(group, d, protocols, waiter)
        else:
            self._join_known(group, member_id, instance_id, d, protocols, waiter)
        if group.is_(PREPARING):
            self.joins.check_and_complete(join_key(group.group_id))

    def _new_member(self, member_id: str, d: M.JoinGroup, protocols: list, waiter: Waiter | None) -> Member:
        return Member(member_id, d.instance, d.client_id or "", d.client_host or "",
                      int(d.session_timeout_ms), int(d.rebalance_timeout_ms), d.protocol_type, protocols,
                      awaiting_join=waiter)

    def _join_new(self, group: Group, d: M.JoinGroup, protocols: list, waiter: Waiter) -> None:
        instance_id = d.instance
        new_id = f"{instance_id or d.client_id or 'member'}-{uuid.uuid4()}"
        if instance_id is not None and group.current_static_member(instance_id) is not None:
            self._rejoin_static(group, group.current_static_member(instance_id), new_id, d, protocols, waiter)
        elif instance_id is None and waiter[2] >= REQUIRE_MEMBER_ID_VERSION:
            # KIP-394: the member must rejoin with this id; until then it is pending, with a session of its own.
            group.pending[new_id] = True
            self.sessions.renew((group.group_id, new_id), self.clock() + int(d.session_timeout_ms))
            self._join_reply(waiter, E.member_id_required, new_id)
        else:
            self._add_member_and_rebalance(group, self._new_member(new_id, d, protocols, waiter))

    def _join_known(self, group: Group, member_id: str, instance_id: str | None, d: M.JoinGroup, protocols: list,
                    waiter: Waiter) -> None:
        if member_id in group.pending:
            del group.pending[member_id]
            self._add_member_and_rebalance(group, self._new_member(member_id, d, protocols, waiter))
            return
        if instance_id is not None and group.current_static_member(instance_id) not in (None, member_id):
            return self._join_reply(waiter, E.fenced_instance_id, member_id)
        member = group.members.get(member_id)
        unknown_instance = instance_id is not None and group.current_static_member(instance_id) is None
        if member is None or unknown_instance or group.is_(EMPTY) or group.is_(DEAD):
            return self._join_reply(waiter, E.unknown_member_id, member_id)
        if group.is_(PREPARING):
            self._update_member_and_rebalance(group, member, d, protocols, waiter)
        elif group.is_(COMPLETING):
            if member.same_protocols(protocols):  # it missed the answer: repeat this generation's
                self._renew_session(group, member)
                self._answer_join(group, member, waiter)
            else:
                self._update_member_and_rebalance(group, member, d, protocols, waiter)
        elif member_id == group.leader or not member.same_protocols(protocols):  # Stable
            self._update_member_and_rebalance(group, member, d, protocols, waiter)
        else:
            self._renew_session(group, member)
            self._answer_join(group, member, waiter)

    def _rejoin_static(self, group: Group, old_id: str, new_id: str, d: M.JoinGroup, protocols: list,
                       waiter: Waiter) -> None:
        """KIP-345: a static member back with no member id takes over its instance's membership under a new id;
        if nothing changed and the group is Stable, it gets the current generation (and its assignment at
        SyncGroup) without a rebalance: as Kafka, the answer names the leader as it was (the old id, if this
        member led) and no members, so a returning leader does not assign again (a stable group would not pass
        that assignment on). The old id is fenced from now on."""
        old_member = group.members[old_id]
        if old_member.awaiting_join is not None:
            self._join_reply(old_member.awaiting_join, E.fenced_instance_id, old_id)
            old_member.awaiting_join = None
        if old_member.awaiting_sync is not None:
            self._sync_reply(old_member.awaiting_sync, E.fenced_instance_id)
            old_member.awaiting_sync = None
        self.sessions.forget((group.group_id, old_id))
        leader_before = group.leader
        member = group.replace_static_member(d.instance, old_id, new_id)
        member.protocols = protocols
        member.session_timeout_ms = int(d.session_timeout_ms)
        member.rebalance_timeout_ms = int(d.rebalance_timeout_ms)
        self._renew_session(group, member)
        if group.is_(STABLE) and group.select_protocol() == group.protocol:
            self._join_reply(waiter, E.none, member.member_id, group, None, leader=leader_before)
        elif group.is_(PREPARING):
            member.awaiting_join = waiter
        else:  # the leader may be assigning with the old id, or the protocol would change: a new generation
            member.awaiting_join = waiter
            self._prepare_rebalance(group, f"static member {d['instance']} rejoined as {new_id}")

    def _add_member_and_rebalance(self, group: Group, member: Member) -> None:
        group.add(member)
        if group.is_(PREPARING) and isinstance(group.join, InitialDelayedJoin):
            group.new_member_added = True
        self._renew_session(group, member)
        self._maybe_prepare_rebalance(group, f"member {member.member_id} joined")

    def _update_member_and_rebalance(self, group: Group, member: Member, d: M.JoinGroup, protocols: list,
                                     waiter: Waiter) -> None:
        member.protocols = protocols
        member.session_timeout_ms = int(d.session_timeout_ms)
        member.rebalance_timeout_ms = int(d.rebalance_timeout_ms)
        if member.awaiting_join is not None and member.awaiting_join != waiter:
            self._join_reply(member.awaiting_join, E.rebalance_in_progress, member.member_id)
        member.awaiting_join = waiter
        self._renew_session(group, member)
        self._maybe_prepare_rebalance(group, f"member {member.member_id} rejoined")

    def _answer_join(self, group: Group, member: Member, waiter: Waiter) -> None:
        members = None
        if member.member_id == group.leader:
            members = [(m.member_id, m.instance_id, m.metadata(group.protocol)) for m in group.members.values()]
        self._join_reply(waiter, E.none, member.member_id, group, members)

    def _transition(self, group: Group, state: GroupState, now_ms: int) -> None:
        """Every state change of a group: a generation's pending sync ends once the group leaves it."""
        group.transition(state, now_ms)
        if state is not COMPLETING:
            self.syncs.check_and_complete(sync_key(group.group_id))

    def _maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state in (STABLE, COMPLETING, EMPTY):
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.is_(COMPLETING):  # members waiting for this generation's assignment must rejoin instead
            for member in group.members.values():
                member.assignment = b""
                if member.awaiting_sync is not None:
                    self._sync_reply(member.awaiting_sync, E.rebalance_in_progress)
                    member.awaiting_sync = None
        now = self.clock()
        if group.is_(EMPTY):
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.max_rebalance_timeout_ms() - delay, 0)
            op: DelayedJoin = InitialDelayedJoin(self, group, delay, remaining)
            deadline = now + delay
        else:
            op = DelayedJoin(self, group)
            deadline = now + group.max_rebalance_timeout_ms()
        self._transition(group, PREPARING, now)
        group.join = op
        log.info("group %s: preparing rebalance (generation %d): %s", group.group_id, group.generation, reason)
        self.joins.try_complete_else_watch(op, [join_key(group.group_id)], deadline)

    def complete_initial_join(self, group: Group, op: InitialDelayedJoin) -> None:
        if group.join is not op:
            return
        if group.new_member_added and op.remaining_ms > 0:  # members keep coming: wait some more
            group.new_member_added = False
            delay = min(op.delay_ms, op.remaining_ms)
            follow = InitialDelayedJoin(self, group, op.delay_ms, op.remaining_ms - delay)
            group.join = follow
            self.joins.try_complete_else_watch(follow, [join_key(group.group_id)], self.clock() + delay)
        else:
            self.complete_join(group, op)

    def complete_join(self, group: Group, op: DelayedJoin) -> None:
        """The join phase ended: drop who did not rejoin, then the next generation (or Empty)."""
        if group.join is not op or not group.is_(PREPARING):
            return
        group.join = None
        group.new_member_added = False
        now = self.clock()
        # Dynamic members that did not rejoin are gone; static ones keep their place until their session ends.
        for member in [m for m in group.members.values() if m.awaiting_join is None and m.instance_id is None]:
            log.info("group %s: member %s did not rejoin in time: removed", group.group_id, member.member_id)
            self._forget(group, member)
        # Pending members (given an id, not yet back with it) stay pending under their own session: back in
        # time, they join a next generation, as in Kafka.
        joined = [m.member_id for m in group.members.values() if m.awaiting_join is not None]
        if group.members and not joined:  # only absent static members: wait for their sessions to end
            log.warning("group %s: no member rejoined; waiting again", group.group_id)
            group.join = DelayedJoin(self, group)
            self.joins.try_complete_else_watch(group.join, [join_key(group.group_id)],
                                               now + group.max_rebalance_timeout_ms())
            return
        if group.leader not in joined:
            group.leader = joined[0] if joined else None
        if not group.members:
            group.generation += 1
            group.protocol = None
            self._transition(group, EMPTY, now)
            return
        group.complete_join_phase(now)
        self.rebalances += 1
        log.info("group %s: generation %d with %d members, protocol %s, leader %s", group.group_id,
                 group.generation, len(group.members), group.protocol, group.leader)
        for member in group.members.values():
            waiter, member.awaiting_join = member.awaiting_join, None
            if waiter is not None:
                self._renew_session(group, member)
                self._answer_join(group, member, waiter)
        pending = PendingSync(self, group, group.generation)
        self.syncs.try_complete_else_watch(pending, [sync_key(group.group_id)],
                                           now + group.max_rebalance_timeout_ms())

    # -- SyncGroup ----------------------------------------------------------------------------

    def _check_member(self, group: Group | None, member_id: str, instance_id: str | None,
                      generation: int | None) -> E:
        """Kafka's validateCurrentMember plus the generation check, for SyncGroup, Heartbeat and commits."""
        if group is None or not group.has(member_id):
            if group is not None and instance_id is not None and group.current_static_member(instance_id):
                return E.fenced_instance_id
            return E.unknown_member_id
        if group.is_(DEAD):
            return E.coordinator_not_available
        if instance_id is not None and group.current_static_member(instance_id) != member_id:
            return E.fenced_instance_id
        if generation is not None and generation != group.generation:
            return E.illegal_generation
        return E.none

    def _live_member(self, d: Any) -> tuple[Group | None, Member | None, E]:
        """The group and member a SyncGroup or Heartbeat names, or (member None) the error to answer: the
        member's checks (_check_member), and an Empty group's UNKNOWN_MEMBER_ID."""
        group = self.groups.get(d.group)
        error = self._check_member(group, d.member, d.instance, d.generation)
        if not error and group.is_(EMPTY):
            error = E.unknown_member_id
        return group, None if error else group.members[d.member], error

    def sync_group(self, worker: int, message: Any) -> None:
        d, waiter = message, self._waiter(worker, message)
        if self.offsets.loading:
            return self._sync_reply(waiter, E.coordinator_load_in_progress)
        group, member, error = self._live_member(d)
        if error:
            return self._sync_reply(waiter, error)
        if group.is_(PREPARING):
            return self._sync_reply(waiter, E.rebalance_in_progress)
        self._renew_session(group, member)
        if group.is_(STABLE):
            return self._sync_reply(waiter, E.none, member.assignment)
        member.awaiting_sync = waiter  # CompletingRebalance: the leader's assignment decides
        if member.member_id == group.leader:
            assignments = dict(d.assignments)  # member id -> its assignment
            for other in group.members.values():
                other.assignment = assignments.get(other.member_id, b"")
            self._transition(group, STABLE, self.clock())
            for other in group.members.values():
                if other.awaiting_sync is not None:
                    self._sync_reply(other.awaiting_sync, E.none, other.assignment)
                    other.awaiting_sync = None

    def sync_expired(self, group: Group, generation: int) -> None:
        """The rebalance timeout passed with the generation still waiting for SyncGroups: members that never
        sent one are gone; the rest rejoin."""
        if not group.is_(COMPLETING) or group.generation != generation:
            return
        missing = [m for m in group.members.values() if m.awaiting_sync is None]
        for member in missing:
            log.info("group %s: member %s never synced generation %d: removed", group.group_id, member.member_id,
                     generation)
            self._forget(group, member)
        self._after_removal(group, "members never synced")

    # -- Heartbeat ----------------------------------------------------------------------------

    def heartbeat(self, worker: int, message: Any) -> None:
        d, waiter = message, self._waiter(worker, message)
        if self._unavailable(waiter):
            return
        group, member, error = self._live_member(d)
        if error:
            return self._error_only(waiter, error)
        self._renew_session(group, member)
        self._error_only(waiter, E.rebalance_in_progress if group.is_(PREPARING) else E.none)

    def _renew_session(self, group: Group, member: Member) -> None:
        """Kafka's completeAndScheduleNextHeartbeatExpiration: the session runs session_timeout_ms from now."""
        self.sessions.renew((group.group_id, member.member_id), self.clock() + member.session_timeout_ms)

    def session_expired(self, key: tuple[str, str]) -> None:
        group_id, member_id = key
        group = self.groups.get(group_id)
        if group is None:
            return
        if group.pending.pop(member_id, None) is not None:
            if group.is_(PREPARING):
                self.joins.check_and_complete(join_key(group.group_id))
            return
        member = group.members.get(member_id)
        if member is None:
            return
        if member.awaiting_join is not None or member.awaiting_sync is not None:
            self._renew_session(group, member)  # Kafka keeps members waiting for an answer alive
            return
        log.info("group %s: member %s session expired", group.group_id, member_id)
        self._forget(group, member)
        self._after_removal(group, f"member {member_id} session expired")

    # -- LeaveGroup ---------------------------------------------------------------------------

    def leave_group(self, worker: int, message: Any) -> None:
        d, waiter = message, self._waiter(worker, message)
        if self._unavailable(waiter):
            return
        group = self.groups.get(d.group)
        results = []
        for member_id, instance_id in d.members:
            if group is None:
                results.append((member_id, instance_id, int(E.unknown_member_id)))
                continue
            if not member_id and instance_id is not None:
                member_id = group.current_static_member(instance_id) or ""
            if member_id in group.pending:
                del group.pending[member_id]
                self.sessions.forget((group.group_id, member_id))
                results.append((member_id, instance_id, int(E.none)))
                if group.is_(PREPARING):
                    self.joins.check_and_complete(join_key(group.group_id))
                continue
            error = self._check_member(group, member_id, instance_id, None)
            if not error:
                self._forget(group, group.members[member_id])
                self._after_removal(group, f"member {member_id} left")
            results.append((member_id, instance_id, int(error)))
        self._reply(waiter, M.reply_class(M.Kind.LEAVE_GROUP)(int(E.none), results))

    def _forget(self, group: Group, member: Member) -> None:
        """Drop a member: answer what it waits on, stop its session."""
        if member.awaiting_join is not None:
            self._join_reply(member.awaiting_join, E.unknown_member_id, member.member_id)
            member.awaiting_join = None
        if member.awaiting_sync is not None:
            self._sync_reply(member.awaiting_sync, E.unknown_member_id)
            member.awaiting_sync = None
        self.sessions.forget((group.group_id, member.member_id))
        group.remove(member.member_id)

    def _after_removal(self, group: Group, reason: str) -> None:
        if group.state in (STABLE, COMPLETING):
            self._prepare_rebalance(group, reason)
        elif group.is_(PREPARING):
            self.joins.check_and_complete(join_key(group.group_id))

    def forget_empty_group(self, group_id: str) -> None:
        """An empty classic group becomes a consumer group: the classic one goes (its offsets stay)."""
        group = self.groups.pop(group_id, None)
        if group is not None:
            self._transition(group, DEAD, self.clock())

    def _reconciling(self, group_id: str) -> tuple[ReconcilingGroups | None, Any]:
        """The consumer or streams family holding a group `group_id`, and that group; (None, None) if neither does
        (a group id is in one family at most)."""
        for family in self.reconciling:
            group = family.groups.get(group_id)
            if group is not None:
                return family, group
        return None, None

    def _forget_if_unused(self, group: Group) -> None:
        """An empty group with no offsets goes, unless a member given its id (KIP-394) is yet to come back with
        it: forgotten between its two JoinGroups, that member would be refused (UNKNOWN_MEMBER_ID) and join
        again from the start. Its session bounds the wait."""
        if (group.is_(EMPTY) and not group.members and not group.pending
                and not self.offsets.fetch(group.group_id, None)):
            self._transition(group, DEAD, self.clock())
            self.groups.pop(group.group_id, None)

    # -- offsets ------------------------------------------------------------------------------

    def commit_offsets(self, worker: int, message: Any) -> None:
        d, waiter = message, self._waiter(worker, message)
        topics = d.topics

        def answer(error_of: Callable[[str, int], E]) -> None:
            self._reply(waiter, M.reply_class(M.Kind.COMMIT_OFFSETS)(
                [(topic, [(p[0], int(error_of(topic, p[0]))) for p in partitions]) for topic, partitions in topics]))

        if self.offsets.loading:
            return answer(lambda t, p: E.coordinator_load_in_progress)
        group_id, member_id, generation = d.group, d.member, d.generation
        if not group_id:
            return answer(lambda t, p: E.invalid_group_id)
        group = self.groups.get(group_id)
        family, other = self._reconciling(group_id)
        if other is not None:
            error = family.commit_error(other, member_id, generation, waiter[2])
        elif group is None:  # a group only storing offsets (assign() consumers), or a commit of a gone generation
            error = E.none if generation < 0 else E.illegal_generation
        elif group.is_(DEAD):
            error = E.coordinator_not_available
        elif member_id in group.pending:
            error = E.unknown_member_id
        elif generation < 0 and group.is_(EMPTY):
            error = E.none
        elif group.is_(COMPLETING):
            error = E.rebalance_in_progress
        else:
            error = self._check_member(group, member_id, d.instance, generation)
        if error:
            return answer(lambda t, p: error)
        entries, refused = {}, {}
        for topic, partitions in topics:
            for partition, offset, leader_epoch, metadata in partitions:
                if self.store.row(topic, partition) is None:
                    refused[(topic, partition)] = E.unknown_topic_or_partition
                elif metadata is not None and len(metadata.encode()) > self.config.offset_metadata_max_bytes:
                    refused[(topic, partition)] = E.offset_metadata_too_large
                else:
                    entries[(topic, partition)] = (int(offset), int(leader_epoch), metadata)
        if not entries:
            return answer(lambda t, p: refused.get((t, p), E.none))
        if group is None and other is None:
            group = self.groups[group_id] = Group(group_id)
            self._transition(group, EMPTY, self.clock())
        if group is not None and group.members.get(member_id) is not None:
            self._renew_session(group, group.members[member_id])

        def durable(flushed: bool, fault: bool = False) -> None:
            # As Kafka: a storage fault is NOT_COORDINATOR (the client looks the coordinator up and retries).
            error = E.none if flushed else E.not_coordinator if fault else E.request_timed_out
            answer(lambda t, p: refused.get((t, p), error))

        self.offsets.commit(group_id, entries, self.clock(), durable)

    def transactional_commit_error(self, group_id: str, member_id: str, instance_id: str | None,
                                   generation: int) -> E:
        """KIP-447's checks of a TxnOffsetCommit v3+ (Kafka's doTxnCommitOffsets and, for a consumer-protocol group,
        validateTransactionalOffsetCommit): a member named must be in the group, a static instance its own, a
        generation (or member epoch) given the group's; without a member and a generation (a producer that has no
        consumer group metadata, v0-2) nothing is checked."""
        consumer_group = self.consumer.groups.get(group_id) or self.streams.groups.get(group_id)
        if consumer_group is not None:
            if not member_id and generation < 0:
                return E.none
            member = consumer_group.members.get(member_id)
            if member is None:
                return E.unknown_member_id
            return E.none if generation < 0 or generation == member.epoch else E.illegal_generation
        group = self.groups.get(group_id)
        if group is None:
            return E.none if not member_id and generation < 0 else (
                E.unknown_member_id if member_id else E.illegal_generation)
        if group.is_(DEAD):
            return E.coordinator_not_available
        if instance_id is not None and group.current_static_member(instance_id) not in (None, member_id):
            return E.fenced_instance_id
        if member_id and not group.has(member_id):
            return E.unknown_member_id
        if generation >= 0 and generation != group.generation:
            return E.illegal_generation
        return E.none

    def commit_transaction_offsets(self, group_id: str, entries: dict, done: Callable[..., None]) -> None:
        """The offsets of a committed transaction (the transaction coordinator's): durable, then visible to
        OffsetFetch; `done(flushed, fault)`. The group exists from then on, as after any commit."""
        if group_id not in self.groups and group_id not in self.consumer.groups and group_id not in self.streams.groups:
            group = self.groups[group_id] = Group(group_id)
            self._transition(group, EMPTY, self.clock())
        self.offsets.commit(group_id, entries, self.clock(), done)

    def fetch_offsets(self, worker: int, message: Any) -> None:
        d, waiter = message, self._waiter(worker, message)
        if self.offsets.loading:  # v0-1 have no top-level error: each partition carries it
            loading = int(E.coordinator_load_in_progress)
            return self._reply(waiter, FetchOffsetsAnswer(loading, [
                (t, [(p, -1, -1, "", loading) for p in partitions]) for t, partitions in (d.topics or [])]))
        family, other = self._reconciling(d.group)
        if other is not None and (d.member is not None or d.member_epoch >= 0):
            error = family.fetch_error(other, d.member or "", d.member_epoch)
            if error != E.none:
                return self._error_only(waiter, error)
        wanted = None if d.topics is None else [(t, p) for t, partitions in d.topics for p in partitions]
        found = self.offsets.fetch(d.group, wanted)
        # OffsetFetch v7+ require_stable (KIP-447): a partition whose offset an open or completing transaction will
        # commit answers UNSTABLE_OFFSET_COMMIT (the consumer asks again) rather than the offset it would replace.
        unstable = self.pending_transactional_offsets(d.group) if d.require_stable else set()
        if unstable and d.topics is None:
            found.update({key: None for key in unstable if key not in found})
        by_topic: dict[str, list] = {}
        for (topic, partition), entry in found.items():
            if (topic, partition) in unstable:
                row = (partition, -1, -1, "", int(E.unstable_offset_commit))
            elif entry is None:
                row = (partition, -1, -1, "", int(E.none))
            else:
                row = (partition, entry.offset, entry.leader_epoch, entry.metadata, int(E.none))
            by_topic.setdefault(topic, []).append(row)
        self._reply(waiter, FetchOffsetsAnswer(int(E.none), list(by_topic.items())))

    def delete_offsets(self, worker: int, message: Any) -> None:
        d, waiter = message, self._waiter(worker, message)
        if self._unavailable(waiter):
            return
        group = self.groups.get(d.group) or self.consumer.groups.get(d.group) or self.streams.groups.get(d.group)
        if group is None or (isinstance(group, Group) and group.is_(DEAD)):
            return self._error_only(waiter, E.group_id_not_found)
        if isinstance(group, Group) and group.members and group.protocol_type != "consumer":
            return self._error_only(waiter, E.non_empty_group)
        subscribed = group.subscribed_topics() if group.members else set()
        deletable, results = [], []
        for topic, partitions in d.topics:
            rows = []
            for partition in partitions:
                if subscribed is None or topic in subscribed:
                    rows.append((partition, int(E.group_subscribed_to_topic)))
                else:
                    deletable.append((topic, partition))
                    rows.append((partition, int(E.none)))
            results.append((topic, rows))

        def durable(flushed: bool, fault: bool = False) -> None:
            self._reply(waiter, M.reply_class(M.Kind.DELETE_OFFSETS)(int(E.none), results))

        self.offsets.delete(group.group_id, deletable, self.clock(), durable)

    # -- groups -------------------------------------------------------------------------------

    def list_groups(self, worker: int, message: Any) -> None:
        waiter = self._waiter(worker, message)
        if self._unavailable(waiter):
            return
        self._reply(waiter, M.reply_class(M.Kind.LIST_GROUPS)(
            int(E.none), [(g.group_id, g.protocol_type or "", g.state.value, CLASSIC) for g in self.groups.values()
                          if not g.is_(DEAD)]
            + [(group_id, "consumer", group.state, CONSUMER) for group_id, group in self.consumer.groups.items()]
            + [(group_id, "streams", group.state, STREAMS) for group_id, group in self.streams.groups.items()]
            + [(group_id, "share", group.state, SHARE) for group_id, group in self.share.groups.items()]))

    def describe_groups(self, worker: int, message: Any) -> None:
        waiter = self._waiter(worker, message)
        described = []
        for group_id in message.groups:
            if self.offsets.loading:
                described.append((int(E.coordinator_load_in_progress), group_id, "", "", "", ()))
                continue
            group = self.groups.get(group_id)
            if group_id in self.consumer.groups or group_id in self.streams.groups \
                    or group_id in self.share.groups:  # as Kafka: classic groups only
                described.append((int(E.group_id_not_found), group_id, DEAD.value, "", "", ()))
                continue
            if group is None:
                described.append((int(E.none), group_id, DEAD.value, "", "", ()))
                continue
            stable = group.is_(STABLE)
            members = [(m.member_id, m.instance_id, m.client_id, m.client_host,
                        m.metadata(group.protocol) if group.protocol and stable else b"",
                        m.assignment if stable else b"") for m in group.members.values()]
            described.append((int(E.none), group_id, group.state.value, group.protocol_type or "",
                              (group.protocol or "") if stable else "", members))
        self._reply(waiter, M.reply_class(M.Kind.DESCRIBE_GROUPS)(described))

    def delete_groups(self, worker: int, message: Any) -> None:
        waiter = self._waiter(worker, message)
        results, now = [], self.clock()
        for group_id in message.groups:
            group = self.groups.get(group_id)
            family, other = self._reconciling(group_id)
            if self.offsets.loading:
                results.append((group_id, int(E.coordinator_load_in_progress)))
            elif other is not None:
                if other.members:
                    results.append((group_id, int(E.non_empty_group)))
                else:
                    family.forget(group_id)
                    self.offsets.delete(group_id, None, now)
                    results.append((group_id, int(E.none)))
            elif group_id in self.share.groups:
                if self.share.groups[group_id].members:
                    results.append((group_id, int(E.non_empty_group)))
                else:
                    self.share.forget(group_id)
                    results.append((group_id, int(E.none)))
            elif group is None or group.is_(DEAD):
                results.append((group_id, int(E.group_id_not_found)))
            elif not group.is_(EMPTY):
                results.append((group_id, int(E.non_empty_group)))
            else:
                self._transition(group, DEAD, now)
                del self.groups[group_id]
                self.offsets.delete(group_id, None, now)
                results.append((group_id, int(E.none)))
        self._reply(waiter, M.reply_class(M.Kind.DELETE_GROUPS)(results))

    # -- chores -------------------------------------------------------------------------------

    def expire_offsets(self) -> int:
        """Delete the offsets of groups empty for offsets_retention_minutes (KIP-211); forget such groups."""
        if self.offsets.loading:
            return 0
        now, wall = self.clock(), time.time_ns() // 1_000_000

        def empty_since_wall_ms(group_id: str) -> int | None:
            consumer_group = self.consumer.groups.get(group_id) or self.streams.groups.get(group_id)
            if consumer_group is not None:
                if consumer_group.members or consumer_group.empty_since_ms is None:
                    return None
                return wall - (now - consumer_group.empty_since_ms)
            group = self.groups.get(group_id)
            if group is None or group.generation == 0:
                return -1  # never had members (since this process started): each offset by its commit time
            if group.members or group.empty_since_ms is None:
                return None
            return wall - (now - group.empty_since_ms)

        expired = self.offsets.expire(wall, self.config.offsets_retention_minutes * 60_000, empty_since_wall_ms, now)
        for group in list(self.groups.values()):
            self._forget_if_unused(group)
        for family in self.reconciling:
            for group_id in list(family.groups):
                family.forget_if_unused(group_id, bool(self.offsets.fetch(group_id, None)))
        if expired:
            log.info("expired %d committed offsets", expired)
        return expired
