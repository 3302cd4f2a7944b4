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
from typing import Callable, Mapping

Partitions = dict[str, set[int]]  # topic -> partitions


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
