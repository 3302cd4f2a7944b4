"""The group coordinator's delayed operations, each a timer in its purgatory's wheel (Kafka's DelayedJoin and
InitialDelayedJoin, plus the wait for a generation's SyncGroups; sessions are node.timer.groups.sessions).

- DelayedJoin: a join phase; completes once every known member has rejoined (checked on the group's key
  after each join or leave) or when the longest rebalance timeout of the members passes.
- InitialDelayedJoin: the first join phase of an empty group waits `initial_rebalance_delay_ms` to batch the
  first joins, and again (never past the rebalance timeout) while new members keep arriving.
- PendingSync: a generation's wait for SyncGroups; completes once the group has left CompletingRebalance for
  that generation (the leader's assignment arrived, or a rebalance or the last member's leave came first: checked
  on the group's sync key at every state change); expiring (after the rebalance timeout) removes the members
  that never synced and starts a new join phase.

Invariants: the coordinator is the only caller; every callback goes back to it and it re-checks the group's
state there (an operation may outlive the state it was made for).
"""

from __future__ import annotations

from typing import Protocol

from shmbroker.node.timer.groups.group import Group, GroupState
from shmbroker.node.timer.purgatory import DelayedOperation


class GroupCoordinator(Protocol):
    """What these operations call back into (node.timer.groups.coordinator.GroupCoordinator)."""

    def complete_join(self, group: Group, op: "DelayedJoin") -> None: ...

    def complete_initial_join(self, group: Group, op: "InitialDelayedJoin") -> None: ...

    def sync_expired(self, group: Group, generation: int) -> None: ...


def join_key(group_id: str) -> tuple[str, str]:
    return ("join", group_id)


def sync_key(group_id: str) -> tuple[str, str]:
    return ("sync", group_id)


class DelayedJoin(DelayedOperation):
    __slots__ = ("coordinator", "group")

    def __init__(self, coordinator: GroupCoordinator, group: Group) -> None:
        self.coordinator = coordinator
        self.group = group

    def try_complete(self) -> bool:
        if self.group.all_members_joined():
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.coordinator.complete_join(self.group, self)


class InitialDelayedJoin(DelayedJoin):
    __slots__ = ("delay_ms", "remaining_ms")

    def __init__(self, coordinator: GroupCoordinator, group: Group, delay_ms: int, remaining_ms: int) -> None:
        super().__init__(coordinator, group)
        self.delay_ms = delay_ms
        self.remaining_ms = remaining_ms

    def try_complete(self) -> bool:
        return False  # the whole delay runs: it exists to wait for more members

    def on_complete(self) -> None:
        self.coordinator.complete_initial_join(self.group, self)


class PendingSync(DelayedOperation):
    __slots__ = ("coordinator", "group", "generation")

    def __init__(self, coordinator: GroupCoordinator, group: Group, generation: int) -> None:
        self.coordinator = coordinator
        self.group = group
        self.generation = generation

    def try_complete(self) -> bool:
        if self.group.is_(GroupState.COMPLETING_REBALANCE) and self.group.generation == self.generation:
            return False
        return self.force_complete()

    def on_expiration(self) -> None:
        self.coordinator.sync_expired(self.group, self.generation)
