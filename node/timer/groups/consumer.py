"""The consumer group protocol (KIP-848) of the group coordinator: ConsumerGroupHeartbeat and
ConsumerGroupDescribe, beside the classic protocol (node.timer.groups.coordinator), in the timer process.

A heartbeat joins (member epoch 0), stays (the member's epoch) or leaves (-1; -2 for a static member that comes
back) and carries what changed: subscription (topic names or a regex), server assignor, rebalance timeout, and
the partitions the member owns. The coordinator bumps the group epoch when what the assignment depends on
changed, computes the target assignment with the group's assignor (node.timer.groups.assignors) when it is
behind, and moves the member one reconciliation step towards its target (node.timer.groups.reconciliation):
revocation first, new partitions only once their previous owner gave them up. The answer carries the member's
epoch and, when it changed or the request was full, its assignment.

Rules as Kafka's GroupMetadataManager:
- A group is classic or consumer. A consumer heartbeat to an empty classic group converts it (its offsets stay);
  to a classic group with members it is GROUP_ID_NOT_FOUND; a classic JoinGroup to a consumer group with
  members is INCONSISTENT_GROUP_PROTOCOL, to an empty one converts it.
- Unknown member with epoch != 0: UNKNOWN_MEMBER_ID (also when the group is unknown, as after a restart: the
  member rejoins). Epoch newer than the member's, or older and not its previous epoch with owned partitions
  within its assignment: FENCED_MEMBER_EPOCH. A static instance id held by a member that did not leave with
  -2: UNRELEASED_INSTANCE_ID; one held by another member id on a later heartbeat: FENCED_INSTANCE_ID.
- Regexes are Python `re` patterns matched against the whole topic name (`fullmatch`), where Kafka uses RE2/J:
  the common syntax is the same; RE2-only or `re`-only constructs differ, and internal topics never match.
- Regexes are resolved apart from heartbeats, as Kafka does: a heartbeat that brings a regex new to the group
  (or finds the catalog changed since its resolution) is answered from what is resolved already (a new regex:
  nothing, so a member subscribing to topics and a regex gets the topics first); the regex is resolved at the
  timer's next turn, and its topics reach the member at its next heartbeat. A resolution no member uses is
  dropped, so a regex subscribed again is resolved anew.

Timers (each a node.timer.groups.sessions wheel): a member's session ends with the member fenced; a member asked
to revoke partitions that has not done so within its rebalance timeout is fenced too. Every answer but an error
(which carries the error alone, as Kafka's) carries the group's heartbeat interval, except to a member waiting
for partitions another member has yet to release: it is
told consumer_unreleased_heartbeat_interval_ms, since it gets them only at its next heartbeat after their
owner's (clients take each answer's interval); so is a member whose regex waits to be resolved. Membership is
not persisted: after a timer restart members rejoin (UNKNOWN_MEMBER_ID).

Session timeout and heartbeat interval are the group's configs (node.storage.group_config: the GROUP config
resource over the node's group.consumer.* settings), read from the catalog at each heartbeat: a change reaches
each member at its next heartbeat (its new interval, its session renewed with the new timeout).

Invariants:
- Every request gets exactly one REPLY.
- A partition is never owned by two members at once (reconciliation's invariant, over `group.owners`).
- A fenced or departed member's partitions are free at once and its session and rebalance timers stop.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

from kio.schema.errors import ErrorCode

from shmbroker.node.config import GroupConfig, WheelConfig
from shmbroker.node.storage import group_config
from shmbroker.node.storage.group_config import GroupSettings
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.groups.assignors import ASSIGNORS
from shmbroker.node.timer.groups.consumer_group import LEAVE_EPOCH, STATIC_LEAVE_EPOCH, ConsumerGroup, ConsumerMember
from shmbroker.node.timer.groups.reconciliation import MemberState, reconcile
from shmbroker.node.timer.groups.sessions import Sessions
from shmbroker.node.timer.outbox import Outbox
from shmbroker.shm import messages as M

log = logging.getLogger("shmbroker.groups")
E = ErrorCode
HeartbeatAnswer = M.reply_class(M.Kind.CONSUMER_GROUP_HEARTBEAT)
DescribeAnswer = M.reply_class(M.Kind.CONSUMER_GROUP_DESCRIBE)


class HeartbeatError(Exception):
    def __init__(self, error: E, message: str) -> None:
        super().__init__(message)
        self.error = error


def as_partitions(topics: list | None) -> dict[str, set[int]] | None:
    return None if topics is None else {name: set(partitions) for name, partitions in topics}


def as_topics(partitions: dict[str, set[int]]) -> list:
    return [(topic, sorted(parts)) for topic, parts in sorted(partitions.items()) if parts]


class ConsumerGroups:
    def __init__(self, config: GroupConfig, outbox: Outbox, store: PartitionStore, wheel: WheelConfig, now_ms: int,
                 clock: Callable[[], int], classic: Any) -> None:
        self.config = config
        self.outbox = outbox
        self.store = store
        self.clock = clock
        self.classic = classic  # the classic coordinator: its groups, for conversions both ways
        self.groups: dict[str, ConsumerGroup] = {}
        self.sessions = Sessions(wheel, now_ms, self.session_expired)
        self.revocations = Sessions(wheel, now_ms, self.revocation_expired)
        self.assignors = [name.strip() for name in config.consumer_assignors.split(",") if name.strip()]
        self.target_computations = 0  # for the stats segment
        # Groups whose regexes wait to be resolved, at the timer's next turn from `resolution_due_ms`.
        self.unresolved: set[str] = set()
        self.resolution_due_ms = 0

    # -- timers -------------------------------------------------------------------------------

    def advance(self, now_ms: int) -> None:
        self.sessions.advance(now_ms)
        self.revocations.advance(now_ms)
        if self.unresolved and now_ms >= self.resolution_due_ms:
            self.resolve_regexes()

    def next_expiration(self) -> int | None:
        due = [d for s in (self.sessions, self.revocations) if (d := s.next_expiration()) is not None]
        if self.unresolved:
            due.append(self.resolution_due_ms)
        return min(due) if due else None

    def resolve_regexes(self) -> None:
        """Resolve the waiting groups' regexes against the catalog; each group reads its subscribed partitions
        again at its next heartbeat (a new group epoch if they changed)."""
        catalog = self.store.catalog
        topics = [name for name, entry in catalog.topics.items() if not entry.internal]
        for group_id in self.unresolved:
            group = self.groups.get(group_id)
            if group is not None:
                group.resolve(topics, catalog.version)
                group.catalog_version = -1
        self.unresolved.clear()

    def session_expired(self, key: tuple[str, str]) -> None:
        self._fence(key[0], key[1], "session expired")

    def revocation_expired(self, key: tuple[str, str]) -> None:
        group = self.groups.get(key[0])
        member = group.members.get(key[1]) if group is not None else None
        if member is not None and member.state is MemberState.UNREVOKED_PARTITIONS:
            self._fence(key[0], key[1], "did not revoke its partitions within its rebalance timeout")

    def _fence(self, group_id: str, member_id: str, reason: str) -> None:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return
        log.info("consumer group %s: member %s fenced: %s", group_id, member_id, reason)
        self._remove(group, member_id)

    def _remove(self, group: ConsumerGroup, member_id: str) -> None:
        group.remove(member_id, self.clock())
        self.sessions.forget((group.group_id, member_id))
        self.revocations.forget((group.group_id, member_id))
        group.epoch += 1
        group.catalog_version = -1  # its subscription may have been the only one to a topic: read them again

    # -- ConsumerGroupHeartbeat ---------------------------------------------------------------

    def heartbeat(self, worker: int, d: Any) -> None:
        waiter = (worker, d.request_id, d.api_version, d.kind)
        if self.classic.offsets.loading:
            return self._answer(waiter, E.coordinator_load_in_progress, "", d.member, d.member_epoch)
        try:
            self._validate(d)
            if d.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                epoch = self._leave(d)
                return self._answer(waiter, E.none, None, d.member, epoch,
                                    interval_ms=self.settings(d.group).heartbeat_interval_ms)
            group, member, full, replaced = self._join_or_find(d)
            # A join changes the membership, but a static member taking its instance's place back does not.
            changed = self._update_member(group, member, d) or full and d.member_epoch == 0 and not replaced
            self._refresh_target(group, changed)
            moved = self._reconcile(group, member, as_partitions(d.owned))
        except HeartbeatError as exc:
            return self._answer(waiter, exc.error, str(exc), d.member, d.member_epoch)
        settings = self.settings(group.group_id)
        self.sessions.renew((group.group_id, member.member_id), self.clock() + settings.session_timeout_ms)
        self._answer(waiter, E.none, None, member.member_id, member.epoch,
                     as_topics(member.assigned) if full or moved else None,
                     self._interval_for(group, member, settings.heartbeat_interval_ms))

    def settings(self, group_id: str) -> GroupSettings:
        """The group's session timeout and heartbeat interval: its group configs on the node's defaults."""
        return group_config.effective(self.config, self.store.catalog.group_configs.get(group_id))

    def _interval_for(self, group: ConsumerGroup, member: ConsumerMember, interval: int) -> int:
        """The heartbeat interval a member is told: shorter while it waits for partitions to be released or for
        its regex to be resolved."""
        waiting = self.config.consumer_unreleased_heartbeat_interval_ms
        unresolved = member.subscribed_regex is not None and member.subscribed_regex not in group.resolved
        if (member.state is MemberState.UNRELEASED_PARTITIONS or unresolved) and 0 < waiting < interval:
            return waiting
        return interval

    def _answer(self, waiter: tuple, error: E, message: str | None, member_id: str, epoch: int,
                assignment: list | None = None, interval_ms: int | None = None) -> None:
        worker, request_id, _, kind = waiter
        if error or interval_ms is None:
            interval_ms = 0
        answer = HeartbeatAnswer(int(error), message if error else None, member_id, epoch, interval_ms, assignment)
        self.outbox.send(worker, M.encode_reply(request_id, kind, answer))

    def _validate(self, d: Any) -> None:
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
        if not d.group:
            raise HeartbeatError(E.invalid_request, "GroupId can't be empty.")
        if d.api_version >= 1 and not d.member:
            raise HeartbeatError(E.invalid_request, "MemberId can't be empty.")
        if d.instance is not None and not d.instance:
            raise HeartbeatError(E.invalid_request, "InstanceId can't be empty.")
        if d.rack is not None and not d.rack:
            raise HeartbeatError(E.invalid_request, "RackId can't be empty.")
        if d.member_epoch == 0:
            if d.rebalance_timeout_ms == -1:
                raise HeartbeatError(E.invalid_request, "RebalanceTimeoutMs must be provided in first request.")
            if d.owned is None or d.owned:
                raise HeartbeatError(E.invalid_request, "TopicPartitions must be empty when (re-)joining.")
            if d.subscribed_topics is None and d.subscribed_regex is None:
                raise HeartbeatError(E.invalid_request,
                                     "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
        elif d.member_epoch == STATIC_LEAVE_EPOCH and d.instance is None:
            raise HeartbeatError(E.invalid_request, "InstanceId can't be null.")
        elif d.member_epoch < STATIC_LEAVE_EPOCH:
            raise HeartbeatError(E.invalid_request, f"MemberEpoch {d.member_epoch} is invalid.")
        if d.assignor is not None and d.assignor not in self.assignors:
            raise HeartbeatError(E.unsupported_assignor, f"ServerAssignor {d.assignor} is not supported. "
                                                         f"Supported assignors: {', '.join(self.assignors)}.")
        if d.subscribed_regex is not None:
            try:
                re.compile(d.subscribed_regex)
            except re.error as exc:
                raise HeartbeatError(E.invalid_regular_expression, f"SubscribedTopicRegex is invalid: {exc}")

    def _group(self, group_id: str, create: bool) -> ConsumerGroup:
        group = self.groups.get(group_id)
        if group is not None:
            return group
        classic = self.classic.groups.get(group_id)
        if classic is not None and (classic.members or classic.pending):
            raise HeartbeatError(E.group_id_not_found, f"Group {group_id} is not a consumer group.")
        streams = self.classic.streams.groups.get(group_id)
        if streams is not None and streams.members:
            raise HeartbeatError(E.group_id_not_found, f"Group {group_id} is not a consumer group.")
        if group_id in self.classic.share.groups:
            raise HeartbeatError(E.group_id_not_found, f"Group {group_id} is not a consumer group.")
        if not create:
            raise HeartbeatError(E.unknown_member_id, f"Consumer group {group_id} not found.")
        if classic is not None:  # an empty classic group becomes a consumer group; its offsets stay
            self.classic.forget_empty_group(group_id)
            log.info("group %s: empty classic group converted to a consumer group", group_id)
        if streams is not None:  # so does an empty streams group
            self.classic.streams.forget(group_id)
        group = self.groups[group_id] = ConsumerGroup(group_id, empty_since_ms=self.clock())
        return group

    def _join_or_find(self, d: Any) -> tuple[ConsumerGroup, ConsumerMember, bool, bool]:
        """The group and member the heartbeat is for, whether the request is a full one (a join), and whether it is
        a static member's return under a new member id."""
        group = self._group(d.group, create=d.member_epoch == 0)
        member = group.members.get(d.member)
        if d.member_epoch == 0:
            if d.instance is not None:
                holder = group.static_members.get(d.instance)
                if holder is not None and holder != d.member:
                    if group.members[holder].epoch != STATIC_LEAVE_EPOCH:
                        raise HeartbeatError(E.unreleased_instance_id,
                                             f"Static member {d.instance} was not released by {holder}.")
                    member = ConsumerMember(d.member, d.instance)
                    self.sessions.forget((group.group_id, holder))
                    self.revocations.forget((group.group_id, holder))
                    group.replace_static(holder, member)
                    return group, member, True, True
            if member is None:
                if self.config.consumer_max_size and len(group.members) >= self.config.consumer_max_size:
                    raise HeartbeatError(E.group_max_size_reached, f"The group {group.group_id} is full.")
                member = ConsumerMember(d.member, d.instance)
                group.add(member)
            else:  # the member rejoins (it was fenced, or lost its state): it starts over with nothing
                group.release(member)
                member.assigned, member.pending_revocation = {}, {}
                member.state, member.epoch, member.previous_epoch = MemberState.STABLE, 0, -1
                self.revocations.forget((group.group_id, member.member_id))
            return group, member, True, False
        if member is None:
            raise HeartbeatError(E.unknown_member_id, f"Member {d.member} is not a member of group {d.group}.")
        if member.instance_id is not None and d.instance is not None and d.instance != member.instance_id:
            raise HeartbeatError(E.fenced_instance_id, f"Member {d.member} is not instance {d.instance}.")
        self._check_epoch(member, d.member_epoch, as_partitions(d.owned))
        full = d.rebalance_timeout_ms != -1 and (d.subscribed_topics is not None or d.subscribed_regex is not None) \
            and d.owned is not None
        return group, member, full, False

    @staticmethod
    def _check_epoch(member: ConsumerMember, received: int, owned: dict | None) -> None:
        """Kafka's throwIfMemberEpochIsInvalid: an older epoch is accepted only if it is the member's previous one
        and it owns nothing beyond its current assignment (it missed the answer that moved it on)."""
        if received > member.epoch:
            raise HeartbeatError(E.fenced_member_epoch, f"The consumer group member has a greater member epoch "
                                                        f"({received}) than the one known ({member.epoch}).")
        if received < member.epoch:
            within = owned is not None and all(parts <= member.assigned.get(t, set()) for t, parts in owned.items())
            if received != member.previous_epoch or not within:
                raise HeartbeatError(E.fenced_member_epoch, f"The consumer group member has a smaller member "
                                                            f"epoch ({received}) than the one known ({member.epoch}).")

    def _update_member(self, group: ConsumerGroup, member: ConsumerMember, d: Any) -> bool:
        """Take the heartbeat's changed fields; True if the subscription or assignor changed."""
        changed = False
        if d.subscribed_topics is not None and tuple(sorted(d.subscribed_topics)) != member.subscribed_topics:
            member.subscribed_topics, changed = tuple(sorted(d.subscribed_topics)), True
        if d.subscribed_regex is not None:
            regex = d.subscribed_regex or None  # an empty regex clears it
            if regex != member.subscribed_regex:
                member.subscribed_regex, changed = regex, True
                group.forget_unused_regexes()
        if d.assignor is not None and d.assignor != member.assignor:
            member.assignor, changed = d.assignor, True
        if d.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = d.rebalance_timeout_ms
        if d.rack is not None:
            member.rack_id = d.rack
        member.client_id, member.client_host = d.client_id, d.client_host
        return changed

    def _refresh_target(self, group: ConsumerGroup, changed: bool) -> None:
        """One new group epoch if the membership or a subscription changed or the subscribed topics' partitions
        differ (read again when the catalog, a subscription or the regexes' resolution changed); then the target
        assignment, if it is behind the group epoch. A regex new to the group, or resolved against an older
        catalog, is resolved at the timer's next turn, as Kafka resolves regexes apart from heartbeats: until then
        it matches what it matched before (a new one nothing)."""
        catalog = self.store.catalog
        if changed or group.catalog_version != catalog.version:
            group.catalog_version = catalog.version
            if group.regexes_stale(catalog.version) and group.group_id not in self.unresolved:
                if not self.unresolved:
                    self.resolution_due_ms = self.clock()
                self.unresolved.add(group.group_id)
            topics = {name: entry.partitions for name, entry in catalog.topics.items() if not entry.internal}
            wanted = set().union(*group.subscriptions(topics).values()) if group.members else set()
            partitions = {name: topics[name] for name in sorted(wanted)}
            if partitions != group.subscribed_partitions:
                group.subscribed_partitions = partitions
                changed = True
        if changed:
            group.epoch += 1
        if group.assignment_epoch == group.epoch:
            return
        group.assignor_name = self._assignor_of(group)
        subscriptions = group.subscriptions(group.subscribed_partitions)
        group.target = ASSIGNORS[group.assignor_name].assign(subscriptions, group.subscribed_partitions, group.target)
        group.assignment_epoch = group.epoch
        self.target_computations += 1

    def _assignor_of(self, group: ConsumerGroup) -> str:
        """The assignor most members name, else the first configured one (Kafka's defaultAssignor rule)."""
        votes: dict[str, int] = {}
        for member in group.members.values():
            if member.assignor is not None:
                votes[member.assignor] = votes.get(member.assignor, 0) + 1
        return max(sorted(votes), key=lambda name: votes[name]) if votes else self.assignors[0]

    def _reconcile(self, group: ConsumerGroup, member: ConsumerMember, owned: dict | None) -> bool:
        """One reconciliation step; True if the member's assigned partitions changed."""
        if (member.state is MemberState.STABLE and member.epoch == group.assignment_epoch
                and not member.pending_revocation):
            return False  # the common heartbeat: at its target already
        was, before = member.state, member.assigned
        outcome = reconcile(member.state, member.epoch, member.previous_epoch, member.assigned,
                            member.pending_revocation, group.assignment_epoch, group.target.get(member.member_id, {}),
                            owned, group.owner_epoch(member.member_id))
        group.apply(member, outcome)
        key = (group.group_id, member.member_id)
        if member.state is MemberState.UNREVOKED_PARTITIONS and was is not MemberState.UNREVOKED_PARTITIONS:
            self.revocations.renew(key, self.clock() + max(member.rebalance_timeout_ms, 0))
        elif member.state is not MemberState.UNREVOKED_PARTITIONS:
            self.revocations.forget(key)
        return member.assigned != before

    def _leave(self, d: Any) -> int:
        group = self.groups.get(d.group)
        if group is None:
            raise HeartbeatError(E.unknown_member_id, f"Consumer group {d.group} not found.")
        member_id = d.member
        if d.instance is not None:
            holder = group.static_members.get(d.instance)
            if holder is None:
                raise HeartbeatError(E.unknown_member_id, f"Instance {d.instance} is not a member.")
            if holder != d.member:
                raise HeartbeatError(E.fenced_instance_id, f"Instance {d.instance} is held by another member.")
        member = group.members.get(member_id)
        if member is None:
            raise HeartbeatError(E.unknown_member_id, f"Member {member_id} is not a member of group {d.group}.")
        if d.member_epoch == STATIC_LEAVE_EPOCH:
            # It keeps its partitions until it is back (under a new member id) or its session ends.
            member.epoch = STATIC_LEAVE_EPOCH
            self.revocations.forget((group.group_id, member_id))
            self.sessions.renew((group.group_id, member_id),
                                self.clock() + self.settings(group.group_id).session_timeout_ms)
            log.info("consumer group %s: static member %s (%s) left for now", group.group_id, member_id, d.instance)
            return STATIC_LEAVE_EPOCH
        log.info("consumer group %s: member %s left", group.group_id, member_id)
        self._remove(group, member_id)
        return LEAVE_EPOCH

    # -- offsets (the classic coordinator asks) -----------------------------------------------

    def commit_error(self, group: ConsumerGroup, member_id: str, epoch: int, api_version: int) -> E:
        """Kafka's ConsumerGroup.validateOffsetCommit: a commit without a member epoch only to an empty group
        (admin tools, assign() consumers); a member's only at its current epoch, with OffsetCommit v9+."""
        if epoch < 0 and not group.members:
            return E.none
        member = group.members.get(member_id)
        if member is None:
            return E.unknown_member_id
        if api_version < 9:
            return E.unsupported_version
        if epoch != member.epoch:
            return E.stale_member_epoch
        self.sessions.renew((group.group_id, member_id),
                            self.clock() + self.settings(group.group_id).session_timeout_ms)
        return E.none

    @staticmethod
    def fetch_error(group: ConsumerGroup, member_id: str, epoch: int) -> E:
        """Kafka's ConsumerGroup.validateOffsetFetch, for an OffsetFetch that names a member (v9): it must be one
        of the group's, at its current epoch."""
        member = group.members.get(member_id)
        if member is None:
            return E.unknown_member_id
        if epoch != member.epoch:
            return E.stale_member_epoch
        return E.none

    def forget_if_unused(self, group_id: str, has_offsets: bool) -> None:
        group = self.groups.get(group_id)
        if group is not None and not group.members and not has_offsets:
            del self.groups[group_id]

    # -- ConsumerGroupDescribe ----------------------------------------------------------------

    def describe(self, worker: int, d: Any) -> None:
        described = []
        for group_id in d.groups:
            group = self.groups.get(group_id)
            if self.classic.offsets.loading:
                described.append((int(E.coordinator_load_in_progress), None, group_id, "", -1, -1, "", []))
            elif group is None:
                other = group_id in self.classic.groups or group_id in self.classic.streams.groups
                message = f"Group {group_id} is not a consumer group." if other else f"Group {group_id} not found."
                described.append((int(E.group_id_not_found), message, group_id, "Dead", -1, -1, "", []))
            else:
                described.append((int(E.none), None, group_id, group.state, group.epoch, group.assignment_epoch,
                                  group.assignor_name or self._assignor_of(group), [
                                      (m.member_id, m.instance_id, m.rack_id, m.epoch, m.client_id, m.client_host,
                                       list(m.subscribed_topics), m.subscribed_regex, as_topics(m.assigned),
                                       as_topics(group.target.get(m.member_id, {})))
                                      for m in group.members.values()]))
        self.outbox.send(worker, M.encode_reply(d.request_id, d.kind, DescribeAnswer(described)))
