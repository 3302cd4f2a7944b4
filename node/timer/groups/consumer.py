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

Timers, joins, epoch checks, leaves, reconciliation steps and offset checks are those both families share
(node.timer.groups.reconciling): a member's session ends with the member fenced; a member asked to revoke
partitions that has not done so within its rebalance timeout is fenced too. Every answer but an error
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
from shmbroker.node.timer.groups.consumer_group import ConsumerGroup, ConsumerMember
from shmbroker.node.timer.groups.reconciliation import LEAVE_EPOCH, STATIC_LEAVE_EPOCH, MemberState
from shmbroker.node.timer.groups.reconciling import (HeartbeatError, ReconcilingGroups, as_owned, as_records,
                                                      describe_rows)
from shmbroker.node.timer.outbox import Outbox
from shmbroker.shm import messages as M

log = logging.getLogger("shmbroker.groups")
E = ErrorCode
HeartbeatAnswer = M.reply_class(M.Kind.CONSUMER_GROUP_HEARTBEAT)
DescribeAnswer = M.reply_class(M.Kind.CONSUMER_GROUP_DESCRIBE)


class ConsumerGroups(ReconcilingGroups):
    FAMILY = "consumer"
    UNITS = "partitions"
    EPOCH_FENCED = "The consumer group member has a {relation} member epoch ({received}) than the one known ({known})."
    EPOCH_INVALID = "MemberEpoch {epoch} is invalid."

    def __init__(self, config: GroupConfig, outbox: Outbox, store: PartitionStore, wheel: WheelConfig, now_ms: int,
                 clock: Callable[[], int], classic: Any) -> None:
        super().__init__(config, outbox, store, wheel, now_ms, clock, classic)
        self.groups: dict[str, ConsumerGroup] = {}
        self.assignors = [name.strip() for name in config.consumer_assignors.split(",") if name.strip()]
        self.target_computations = 0  # for the stats segment
        # Groups whose regexes wait to be resolved, at the timer's next turn from `resolution_due_ms`.
        self.unresolved: set[str] = set()
        self.resolution_due_ms = 0

    def new_group(self, group_id: str) -> ConsumerGroup:
        return ConsumerGroup(group_id, empty_since_ms=self.clock())

    def new_member(self, member_id: str, instance_id: str | None) -> ConsumerMember:
        return ConsumerMember(member_id, instance_id)

    def session_timeout_ms(self, group_id: str) -> int:
        return self.settings(group_id).session_timeout_ms

    def max_size(self) -> int:
        return self.config.consumer_max_size

    def other_family(self) -> ReconcilingGroups:
        return self.classic.streams

    # -- timers -------------------------------------------------------------------------------

    def advance(self, now_ms: int) -> None:
        super().advance(now_ms)
        if self.unresolved and now_ms >= self.resolution_due_ms:
            self.resolve_regexes()

    def next_expiration(self) -> int | None:
        due = super().next_expiration()
        if self.unresolved:
            due = self.resolution_due_ms if due is None else min(due, self.resolution_due_ms)
        return due

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
            moved = self._reconcile(group, member, as_owned(d.owned))
        except HeartbeatError as exc:
            return self._answer(waiter, exc.error, str(exc), d.member, d.member_epoch)
        settings = self.settings(group.group_id)
        self._renew_session(group.group_id, member.member_id, settings.session_timeout_ms)
        self._answer(waiter, E.none, None, member.member_id, member.epoch,
                     as_records(member.assigned) if full or moved else None,
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
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid (a member id from v1 on: v0 members get theirs)."""
        self._validate_common(d, ("group", "member", "instance", "rack") if d.api_version >= 1
                              else ("group", "instance", "rack"))
        if d.assignor is not None and d.assignor not in self.assignors:
            raise HeartbeatError(E.unsupported_assignor, f"ServerAssignor {d.assignor} is not supported. "
                                                         f"Supported assignors: {', '.join(self.assignors)}.")
        if d.subscribed_regex is not None:
            try:
                re.compile(d.subscribed_regex)
            except re.error as exc:
                raise HeartbeatError(E.invalid_regular_expression, f"SubscribedTopicRegex is invalid: {exc}")

    @staticmethod
    def _validate_join(d: Any) -> None:
        if d.owned is None or d.owned:
            raise HeartbeatError(E.invalid_request, "TopicPartitions must be empty when (re-)joining.")
        if d.subscribed_topics is None and d.subscribed_regex is None:
            raise HeartbeatError(E.invalid_request,
                                 "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")

    def _join_or_find(self, d: Any) -> tuple[ConsumerGroup, ConsumerMember, bool, bool]:
        """The group and member the heartbeat is for, whether the request is a full one (a join), and whether it is
        a static member's return under a new member id."""
        group = self._group(d.group, create=d.member_epoch == 0)
        if d.member_epoch == 0:
            member, replaced = self._join(group, d)
            return group, member, True, replaced
        member = self._known(group, d, as_owned(d.owned))
        full = d.rebalance_timeout_ms != -1 and (d.subscribed_topics is not None or d.subscribed_regex is not None) \
            and d.owned is not None
        return group, member, full, False

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
        if member_id not in group.members:
            raise HeartbeatError(E.unknown_member_id, f"Member {member_id} is not a member of group {d.group}.")
        return self._depart(group, member_id, d)

    # -- offsets (the classic coordinator asks) -----------------------------------------------

    def commit_error(self, group: ConsumerGroup, member_id: str, epoch: int, api_version: int) -> E:
        """As both families' (ReconcilingGroups.commit_error); a member's accepted commit renews its session."""
        error = super().commit_error(group, member_id, epoch, api_version)
        if error is E.none and member_id in group.members:
            self._renew_session(group.group_id, member_id, self.session_timeout_ms(group.group_id))
        return error

    # -- ConsumerGroupDescribe ----------------------------------------------------------------

    def describe(self, worker: int, d: Any) -> None:
        def row(group: ConsumerGroup) -> tuple:
            return (int(E.none), None, group.group_id, group.state, group.epoch, group.assignment_epoch,
                    group.assignor_name or self._assignor_of(group), [
                        (m.member_id, m.instance_id, m.rack_id, m.epoch, m.client_id, m.client_host,
                         list(m.subscribed_topics), m.subscribed_regex, as_records(m.assigned),
                         as_records(group.target.get(m.member_id, {})))
                        for m in group.members.values()])

        described = describe_rows(d.groups, self.groups, self.classic.offsets.loading, self.FAMILY,
                                  lambda group_id: group_id in self.classic.groups
                                  or group_id in self.classic.streams.groups, "Dead", row)
        self.outbox.send(worker, M.encode_reply(d.request_id, d.kind, DescribeAnswer(described)))
