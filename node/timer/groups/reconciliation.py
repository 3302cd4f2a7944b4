"""Reconciliation of one consumer-protocol member towards the group's target assignment (KIP-848; Kafka's
CurrentAssignmentBuilder).

A member moves through these states:

    STABLE                 it owns its target assignment at the target's epoch
    UNREVOKED_PARTITIONS   it must first give up partitions no longer its own; it keeps its epoch meanwhile
    UNRELEASED_PARTITIONS  it has the target epoch, but some of its new partitions are still owned by others

Invariants:
- Revocation before assignment: a member is given a partition only when no other member owns it (neither as
  assigned nor as pending revocation: `partition_epochs` has no entry for it), so no partition ever has two
  owners.
- While a member has partitions pending revocation it gets nothing new, and its epoch does not move; it moves
  on once its heartbeat reports (`owned`) that it no longer holds them.
- `owned` None means the member did not say what it owns (a heartbeat with unchanged fields): it is taken to
  still own everything it was asked to revoke.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

Partitions = dict[str, set[int]]  # topic -> partitions
LEAVE_EPOCH = -1  # a heartbeat's member epoch that leaves the group
STATIC_LEAVE_EPOCH = -2  # ... that leaves it for now: a static member, which keeps what it owns until it is back


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass
class Reconciled:
    """What a member becomes after one reconciliation step."""

    state: MemberState
    epoch: int
    previous_epoch: int
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)


def owns_any(owned: Mapping[str, set[int]] | None, partitions: Mapping[str, set[int]]) -> bool:
    if owned is None:
        return any(partitions.values())
    return any(owned.get(topic, set()) & parts for topic, parts in partitions.items())


def reconcile(state: MemberState, epoch: int, previous_epoch: int, assigned: Partitions,
              pending_revocation: Partitions, target_epoch: int, target: Mapping[str, set[int]],
              owned: Mapping[str, set[int]] | None, owner_epoch: Callable[[str, int], int]) -> Reconciled:
    """The member's next state. `owner_epoch(topic, partition)` is the epoch of the member owning the partition
    now, or -1 if it is free; the member's own partitions count as its own."""
    if state is MemberState.UNREVOKED_PARTITIONS and owns_any(owned, pending_revocation):
        return Reconciled(state, epoch, previous_epoch, assigned, pending_revocation)
    if state is MemberState.STABLE and epoch == target_epoch:
        return Reconciled(state, epoch, previous_epoch, assigned, {})
    return _next_assignment(epoch, previous_epoch, assigned, target_epoch, target, owned, owner_epoch)


def _next_assignment(epoch: int, previous_epoch: int, assigned: Partitions, target_epoch: int,
                     target: Mapping[str, set[int]], owned: Mapping[str, set[int]] | None,
                     owner_epoch: Callable[[str, int], int]) -> Reconciled:
    kept: Partitions = {}
    revoke: Partitions = {}
    gained: Partitions = {}
    unreleased = False
    for topic in set(target) | set(assigned):
        wanted, current = set(target.get(topic, ())), set(assigned.get(topic, ()))
        if wanted & current:
            kept[topic] = wanted & current
        if current - wanted:
            revoke[topic] = current - wanted
        free = {p for p in wanted - current if owner_epoch(topic, p) == -1}
        if len(free) < len(wanted - current):
            unreleased = True
        if free:
            gained[topic] = free
    if revoke and owns_any(owned, revoke):
        # Revocation first: the member keeps its epoch and only the partitions it keeps.
        return Reconciled(MemberState.UNREVOKED_PARTITIONS, epoch, previous_epoch, kept, revoke)
    new_assigned = {t: kept.get(t, set()) | gained.get(t, set()) for t in set(kept) | set(gained)}
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    # The epoch the member held before, which a heartbeat that missed its answer may still carry.
    previous = epoch if target_epoch != epoch else previous_epoch
    return Reconciled(state, target_epoch, previous, new_assigned, {})


@dataclass
class ReconcilingMember:
    """What a member of either family that reconciles (KIP-848's consumer groups, KIP-1071's streams groups) is:
    its ids and client, its rebalance timeout, and its reconciliation state (`assigned` and `pending_revocation`
    never share a partition). The families' members extend it with what they subscribe to."""

    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 0
    epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)

    def owned(self) -> Partitions:
        """What the member holds: assigned, or not yet given up."""
        return {t: self.assigned.get(t, set()) | self.pending_revocation.get(t, set())
                for t in set(self.assigned) | set(self.pending_revocation)}


@dataclass
class MemberBook:
    """A group whose members reconcile to a target (KIP-848's consumer groups, KIP-1071's streams groups): its
    group epoch and the epoch its target was computed at, its members by member id, the static ones by instance id,
    the target, and the owner of each partition (or task) with the member epoch it was given at, which reconcile()
    asks through owner_epoch.

    Invariants: `owners` holds exactly the partitions the members own (assigned, or pending revocation), each at
    its member's epoch. `empty_since_ms` is set exactly while the group has no members. The families' groups are
    dataclasses that extend it with what their targets depend on."""

    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, Any] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    target: dict[str, Partitions] = field(default_factory=dict)  # member id -> its target assignment
    owners: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)  # partition -> (member, epoch)
    empty_since_ms: int | None = None

    @property
    def state(self) -> str:
        """As the families' describes and ListGroups say it: Empty without members, NotReady while the group cannot
        compute a target (`ready`), Assigning while the target is behind the group epoch, Reconciling while a
        member has not reached it, else Stable."""
        if not self.members:
            return "Empty"
        if not self.ready():
            return "NotReady"
        if self.epoch != self.assignment_epoch:
            return "Assigning"
        if any(m.epoch != self.assignment_epoch or m.state is not MemberState.STABLE for m in self.members.values()):
            return "Reconciling"
        return "Stable"

    def ready(self) -> bool:
        return True

    def owner_epoch(self, member_id: str):
        """owner_epoch(topic, partition) for reconciling `member_id`: -1 if the partition is free or its own."""
        def epoch_of(topic: str, partition: int) -> int:
            owner = self.owners.get((topic, partition))
            return -1 if owner is None or owner[0] == member_id else owner[1]
        return epoch_of

    def apply(self, member: Any, outcome: Reconciled) -> None:
        """The member after reconciliation: its partitions in `owners` follow."""
        self.release(member)
        member.state, member.epoch, member.previous_epoch = outcome.state, outcome.epoch, outcome.previous_epoch
        member.assigned, member.pending_revocation = outcome.assigned, outcome.pending_revocation
        self.hold(member)

    def hold(self, member: Any) -> None:
        for topic, partitions in member.owned().items():
            for partition in partitions:
                self.owners[(topic, partition)] = (member.member_id, member.epoch)

    def release(self, member: Any) -> None:
        for topic, partitions in member.owned().items():
            for partition in partitions:
                if self.owners.get((topic, partition), ("",))[0] == member.member_id:
                    del self.owners[(topic, partition)]

    def add(self, member: Any) -> None:
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id
        self.empty_since_ms = None

    def remove(self, member_id: str, now_ms: int) -> Any | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        self.release(member)
        self.target.pop(member_id, None)
        if member.instance_id is not None and self.static_members.get(member.instance_id) == member_id:
            del self.static_members[member.instance_id]
        self.removed(member)
        if not self.members:
            self.empty_since_ms = now_ms
        return member

    def removed(self, member: Any) -> None:
        """What a group forgets with a member that left (called before the group may become empty)."""
