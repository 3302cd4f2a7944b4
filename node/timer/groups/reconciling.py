"""What the coordinators of the two group families whose members reconcile towards a target share: KIP-848's
consumer groups (node.timer.groups.consumer) and KIP-1071's streams groups (node.timer.groups.streams).

Each family holds its groups (a MemberBook each: node.timer.groups.reconciliation) and two timers per member, both
node.timer.groups.sessions wheels keyed by (group id, member id): its session, whose end fences the member, and its
revocation deadline, set when it is asked to give up partitions (or tasks) and whose end fences it if it still
holds them. A heartbeat with member epoch 0 joins (`_join`: a new member, a member starting over, or a static
member back under a new member id taking its instance's place), any other epoch is checked against the member's
(`_known`), -1 leaves and -2 leaves for now (`_depart`: a static member keeps what it owns until it is back or its
session ends). Each heartbeat moves the member one reconciliation step (`_reconcile`). A group id is in at most one
family (or the classic coordinator's groups): a heartbeat for a group id another protocol's group holds with
members is GROUP_ID_NOT_FOUND; an empty group of another protocol becomes one of this family, its offsets kept.

A heartbeat is first checked as Kafka checks both families' (`_validate_common`: empty ids, a join's rebalance
timeout, a static leave's instance id, the member epoch's range), then by the family's own rules. Each family
says what differs: its name in logs and messages (FAMILY), what its members own (UNITS), its INVALID_REQUEST
and FENCED_MEMBER_EPOCH messages (EPOCH_INVALID, EPOCH_FENCED: Kafka words each family's its own way), its
member and group classes, its members' session timeout and size bound, the other family, its join checks
(`_validate_join`), and whether a change is persisted (`persist`).

Invariants:
- A member's two timers run only while it is in its group: every removal (fenced, left, replaced by its static
  instance's return) stops both.
- A removed member's partitions are free at once (MemberBook.remove) and the group epoch moves, so the target is
  computed again without it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from kio.schema.errors import ErrorCode

from shmbroker.node.config import GroupConfig, WheelConfig
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.groups.reconciliation import LEAVE_EPOCH, STATIC_LEAVE_EPOCH, MemberState, reconcile
from shmbroker.node.timer.groups.family import GroupFamily
from shmbroker.node.timer.groups.sessions import Sessions
from shmbroker.node.timer.outbox import Outbox

log = logging.getLogger("shmbroker.groups")
E = ErrorCode
NULLABLE_IDS = ("instance", "rack")  # a heartbeat's ids that may be null (not empty)


class HeartbeatError(Exception):
    """A heartbeat refused with `error` (and its message): its answer carries them alone."""

    def __init__(self, error: E, message: str) -> None:
        super().__init__(message)
        self.error = error


def as_owned(records: list | None) -> dict[str, set[int]] | None:
    """A heartbeat's [(topic or subtopology, [partitions])] as {name: {partitions}} (None stays None)."""
    return None if records is None else {str(name): set(partitions) for name, partitions in records}


def as_records(owned: dict[str, set[int]]) -> list:
    """{name: {partitions}} as an answer's [(name, [partitions])], sorted, without empty entries."""
    return [(name, sorted(parts)) for name, parts in sorted(owned.items()) if parts]


def describe_rows(group_ids: list[str], groups: dict[str, Any], loading: bool, family: str,
                  other_kind: Callable[[str], bool], missing_state: str, row: Callable[[Any], tuple]) -> list[tuple]:
    """The rows of ConsumerGroupDescribe's and ShareGroupDescribe's answers (one layout): each id's
    COORDINATOR_LOAD_IN_PROGRESS while the offsets log loads, GROUP_ID_NOT_FOUND for an unknown id (its message
    says whether the id is a group of another kind), else `row(group)`."""
    rows = []
    for group_id in group_ids:
        group = groups.get(group_id)
        if loading:
            rows.append((int(E.coordinator_load_in_progress), None, group_id, "", -1, -1, "", []))
        elif group is None:
            message = f"Group {group_id} is not a {family} group." if other_kind(group_id) \
                else f"Group {group_id} not found."
            rows.append((int(E.group_id_not_found), message, group_id, missing_state, -1, -1, "", []))
        else:
            rows.append(row(group))
    return rows


class ReconcilingGroups(GroupFamily):
    FAMILY = ""  # "consumer" or "streams"
    UNITS = ""  # what its members own: "partitions" or "tasks"
    # FENCED_MEMBER_EPOCH's message; {relation} is "greater" or "smaller", {received} and {known} the epochs.
    EPOCH_FENCED = ""
    EPOCH_INVALID = ""  # INVALID_REQUEST's message for a member epoch below -2 ({epoch})
    ID_NAMES = {"group": "GroupId", "member": "MemberId", "instance": "InstanceId", "rack": "RackId"}

    def __init__(self, config: GroupConfig, outbox: Outbox, store: PartitionStore, wheel: WheelConfig, now_ms: int,
                 clock: Callable[[], int], classic: Any) -> None:
        super().__init__(config, outbox, store, wheel, now_ms, clock, classic)
        self.revocations = Sessions(wheel, now_ms, self.revocation_expired)

    # -- what each family says ----------------------------------------------------------------

    def new_group(self, group_id: str) -> Any:
        raise NotImplementedError

    def new_member(self, member_id: str, instance_id: str | None) -> Any:
        raise NotImplementedError

    def session_timeout_ms(self, group_id: str) -> int:
        raise NotImplementedError

    def max_size(self) -> int:
        """Members a group may hold (0: no bound)."""
        raise NotImplementedError

    def other_family(self) -> ReconcilingGroups:
        raise NotImplementedError

    def persist(self, group: Any) -> None:
        """After a change of the group outside a heartbeat's answer (a member fenced): nothing unless the family
        keeps its groups."""

    def forget(self, group_id: str) -> None:
        """Drop an empty group (DeleteGroups, expiry, a conversion to another protocol)."""
        self.groups.pop(group_id, None)

    # -- timers -------------------------------------------------------------------------------

    def timer_wheels(self) -> tuple[Sessions, ...]:
        return self.sessions, self.revocations

    def session_expired(self, key: tuple[str, str]) -> None:
        self._fence(key[0], key[1], "session expired")

    def revocation_expired(self, key: tuple[str, str]) -> None:
        group = self.groups.get(key[0])
        member = group.members.get(key[1]) if group is not None else None
        if member is not None and member.state is MemberState.UNREVOKED_PARTITIONS:
            self._fence(key[0], key[1], f"did not revoke its {self.UNITS} within its rebalance timeout")

    def _renew_session(self, group_id: str, member_id: str, timeout_ms: int) -> None:
        self.sessions.renew((group_id, member_id), self.clock() + timeout_ms)

    def _stop_timers(self, group_id: str, member_id: str) -> None:
        self.sessions.forget((group_id, member_id))
        self.revocations.forget((group_id, member_id))

    def _fence(self, group_id: str, member_id: str, reason: str) -> None:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return
        log.info("%s group %s: member %s fenced: %s", self.FAMILY, group_id, member_id, reason)
        self._remove(group, member_id)
        self.persist(group)

    def _remove(self, group: Any, member_id: str) -> None:
        group.remove(member_id, self.clock())
        self._stop_timers(group.group_id, member_id)
        group.epoch += 1

    # -- heartbeats ---------------------------------------------------------------------------

    def _validate_common(self, d: Any, ids: tuple[str, ...]) -> None:
        """What Kafka's throwIf...GroupHeartbeatRequestIsInvalid checks in both families: INVALID_REQUEST for an
        empty id of `ids` (in the family's order; the instance and rack ids may be null), a join without its
        rebalance timeout or with what `_validate_join` refuses, a static leave without its instance id, and a
        member epoch below -2."""
        for name in ids:
            value = getattr(d, name)
            if not value and (value is not None or name not in NULLABLE_IDS):
                raise HeartbeatError(E.invalid_request, f"{self.ID_NAMES[name]} can't be empty.")
        if d.member_epoch == 0:
            if d.rebalance_timeout_ms == -1:
                raise HeartbeatError(E.invalid_request, "RebalanceTimeoutMs must be provided in first request.")
            self._validate_join(d)
        elif d.member_epoch == STATIC_LEAVE_EPOCH and d.instance is None:
            raise HeartbeatError(E.invalid_request, "InstanceId can't be null.")
        elif d.member_epoch < STATIC_LEAVE_EPOCH:
            raise HeartbeatError(E.invalid_request, self.EPOCH_INVALID.format(epoch=d.member_epoch))

    def _validate_join(self, d: Any) -> None:
        """The family's own checks of a join (member epoch 0)."""

    def _group(self, group_id: str, create: bool) -> Any:
        """The family's group `group_id`; made (create) from nothing or from an empty group of another protocol."""
        group = self.groups.get(group_id)
        if group is not None:
            return group
        classic = self.classic.groups.get(group_id)
        family = self.other_family()
        other = family.groups.get(group_id)
        if (classic is not None and (classic.members or classic.pending)) or (other is not None and other.members) \
                or group_id in self.classic.share.groups:  # a share group stays one (its share-partitions' state)
            raise HeartbeatError(E.group_id_not_found, f"Group {group_id} is not a {self.FAMILY} group.")
        if not create:
            raise HeartbeatError(E.unknown_member_id, f"{self.FAMILY.capitalize()} group {group_id} not found.")
        if classic is not None:  # an empty group of another protocol becomes one of this family; its offsets stay
            self.classic.forget_empty_group(group_id)
            log.info("group %s: empty classic group converted to a %s group", group_id, self.FAMILY)
        if other is not None:
            family.forget(group_id)
            log.info("group %s: empty %s group converted to a %s group", group_id, family.FAMILY, self.FAMILY)
        group = self.groups[group_id] = self.new_group(group_id)
        return group

    def _join(self, group: Any, d: Any) -> tuple[Any, bool]:
        """A join (member epoch 0): the member, and whether it is a static member back under a new member id
        (it takes its instance's place and what it owned, with no new group epoch)."""
        holder = group.static_members.get(d.instance) if d.instance is not None else None
        if holder is not None and holder != d.member:
            if group.members[holder].epoch != STATIC_LEAVE_EPOCH:
                raise HeartbeatError(E.unreleased_instance_id,
                                     f"Static member {d.instance} was not released by {holder}.")
            member = self.new_member(d.member, d.instance)
            self._stop_timers(group.group_id, holder)
            group.replace_static(holder, member)
            return member, True
        member = group.members.get(d.member)
        if member is None:
            limit = self.max_size()
            if limit and len(group.members) >= limit:
                raise HeartbeatError(E.group_max_size_reached, f"The {self.FAMILY} group has reached its maximum "
                                                               f"capacity of {limit} members.")
            member = self.new_member(d.member, d.instance)
            group.add(member)
        else:  # the member rejoins (it was fenced, or lost its state): it starts over with nothing
            group.release(member)
            member.assigned, member.pending_revocation = {}, {}
            member.state, member.epoch, member.previous_epoch = MemberState.STABLE, 0, -1
            self.revocations.forget((group.group_id, member.member_id))
        return member, False

    def _known(self, group: Any, d: Any, owned: dict | None) -> Any:
        """The member a heartbeat of a member epoch other than 0 is for: it must be one of the group's, as its
        instance, at its epoch (Kafka's throwIfMemberEpochIsInvalid: an older epoch only if it is the member's
        previous one and it owns nothing beyond its current assignment: it missed the answer that moved it on)."""
        member = group.members.get(d.member)
        if member is None:
            raise HeartbeatError(E.unknown_member_id, f"Member {d.member} is not a member of group {d.group}.")
        if member.instance_id is not None and d.instance is not None and d.instance != member.instance_id:
            raise HeartbeatError(E.fenced_instance_id, f"Member {d.member} is not instance {d.instance}.")
        received = d.member_epoch
        if received > member.epoch:
            raise HeartbeatError(E.fenced_member_epoch, self.EPOCH_FENCED.format(
                relation="greater", received=received, known=member.epoch))
        if received < member.epoch:
            within = owned is not None and all(parts <= member.assigned.get(t, set()) for t, parts in owned.items())
            if received != member.previous_epoch or not within:
                raise HeartbeatError(E.fenced_member_epoch, self.EPOCH_FENCED.format(
                    relation="smaller", received=received, known=member.epoch))
        return member

    def _reconcile(self, group: Any, member: Any, owned: dict | None) -> bool:
        """One reconciliation step; True if the member's assigned partitions changed. Its revocation deadline starts
        when it is first asked to revoke, and stops once it has."""
        if (member.state is MemberState.STABLE and member.epoch == group.assignment_epoch
                and not member.pending_revocation):
            return False  # the common heartbeat: at its target already
        was, before = member.state, member.assigned
        self._step(group, member, owned)
        key = (group.group_id, member.member_id)
        if member.state is MemberState.UNREVOKED_PARTITIONS and was is not MemberState.UNREVOKED_PARTITIONS:
            self.revocations.renew(key, self.clock() + max(member.rebalance_timeout_ms, 0))
        elif member.state is not MemberState.UNREVOKED_PARTITIONS:
            self.revocations.forget(key)
        return member.assigned != before

    def _step(self, group: Any, member: Any, owned: dict | None) -> None:
        """reconcile() once for the member, toward its target: its state, epochs, assigned and pending revocation."""
        outcome = reconcile(member.state, member.epoch, member.previous_epoch, member.assigned,
                            member.pending_revocation, group.assignment_epoch, group.target.get(member.member_id, {}),
                            owned, group.owner_epoch(member.member_id))
        group.apply(member, outcome)

    def _depart(self, group: Any, member_id: str, d: Any) -> int:
        """A member's leave (its request checked): the epoch its answer carries. A static member leaving for now
        (-2) keeps what it owns until it is back (under a new member id) or its session ends."""
        if d.member_epoch == STATIC_LEAVE_EPOCH:
            group.members[member_id].epoch = STATIC_LEAVE_EPOCH
            self.revocations.forget((group.group_id, member_id))
            self._renew_session(group.group_id, member_id, self.session_timeout_ms(group.group_id))
            log.info("%s group %s: static member %s (%s) left for now", self.FAMILY, group.group_id, member_id,
                     d.instance)
            return STATIC_LEAVE_EPOCH
        log.info("%s group %s: member %s left", self.FAMILY, group.group_id, member_id)
        self._remove(group, member_id)
        return LEAVE_EPOCH

    # -- offsets (the classic coordinator asks) -----------------------------------------------

    def commit_error(self, group: Any, member_id: str, epoch: int, api_version: int) -> E:
        """Kafka's validateOffsetCommit of both families: a commit without a member epoch only to an empty group
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
        return E.none

    @staticmethod
    def fetch_error(group: Any, member_id: str, epoch: int) -> E:
        """Kafka's validateOffsetFetch, for an OffsetFetch that names a member (v9): it must be one of the
        group's, at its current epoch."""
        member = group.members.get(member_id)
        if member is None:
            return E.unknown_member_id
        if epoch != member.epoch:
            return E.stale_member_epoch
        return E.none

    def forget_if_unused(self, group_id: str, has_offsets: bool) -> None:
        group = self.groups.get(group_id)
        if group is not None and not group.members and not has_offsets:
            self.forget(group_id)

