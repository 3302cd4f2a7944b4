"""One streams group (KIP-1071) as the coordinator holds it: its topology, members with their member epochs and
active and standby tasks, the group epoch and the target assignment (Kafka's StreamsGroup).

A task is (subtopology id, partition); tasks are held as {subtopology id: {partitions}}, the shape of a consumer
group's {topic: {partitions}}, so node.timer.groups.reconciliation reconciles them unchanged (revocation before
assignment).

Invariants:
- `epoch` (the group epoch) grows whenever what the target depends on changes: a member joins, leaves or is
  fenced, the topology is set, or its configuration (the tasks per subtopology) changes. `assignment_epoch` is
  the group epoch the target was computed at.
- `owners` maps every active task some member holds (assigned or pending revocation) to that member and its
  epoch; a task has at most one active owner. Standby tasks are not in `owners` (a task may have several standby
  replicas): node.timer.groups.streams asks the members for them.
- `standby_replicas` is the streams.num.standby.replicas the target was computed with (None: not computed yet);
  a group config that changes it moves the group epoch.
- A static member's instance id maps to exactly one member id (`static_members`); member epoch -2 means the static
  member left for a while and keeps its tasks until it comes back (under a new member id) or its session ends.
- State (StreamsGroupDescribe, ListGroups): Empty without members, NotReady while the topology is not configured
  (missing source or internal topics, wrong partition counts), Assigning while the target is behind the group
  epoch, Reconciling while a member has not reached it, else Stable.
- `snapshot`/`restore` round-trip everything but sessions (snapshots of format 1, from before standby tasks,
  restore with none); the configuration comes back as its tasks per
  subtopology, and is computed again from the catalog (catalog_version -1) at the group's next heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shmbroker.node.timer.groups.reconciliation import MemberBook, MemberState, Partitions
from shmbroker.node.timer.groups.streams_topology import Configured, Topology

SNAPSHOT_FORMAT = 2  # the version of `snapshot`'s layout in the offsets log; `restore` reads this one and 1


@dataclass
class StreamsMember:
    member_id: str
    instance_id: str | None = None
    process_id: str = ""
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 0
    topology_epoch: int = -1
    endpoint: tuple[str, int] | None = None
    client_tags: tuple[tuple[str, str], ...] = ()
    epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)
    standby: Partitions = field(default_factory=dict)
    standby_pending_revocation: Partitions = field(default_factory=dict)

    def owned_standby(self) -> Partitions:
        return {t: self.standby.get(t, set()) | self.standby_pending_revocation.get(t, set())
                for t in set(self.standby) | set(self.standby_pending_revocation)}

    def owned(self) -> Partitions:
        return {t: self.assigned.get(t, set()) | self.pending_revocation.get(t, set())
                for t in set(self.assigned) | set(self.pending_revocation)}

    def snapshot(self) -> list:
        return [self.member_id, self.instance_id, self.process_id, self.rack_id, self.client_id, self.client_host,
                self.rebalance_timeout_ms, self.topology_epoch, list(self.endpoint) if self.endpoint else None,
                [list(kv) for kv in self.client_tags], self.epoch, self.previous_epoch, self.state.value,
                _tasks_json(self.assigned), _tasks_json(self.pending_revocation), _tasks_json(self.standby),
                _tasks_json(self.standby_pending_revocation)]

    @staticmethod
    def restore(data: list) -> StreamsMember:
        (member_id, instance_id, process_id, rack_id, client_id, client_host, rebalance_timeout_ms, topology_epoch,
         endpoint, tags, epoch, previous_epoch, state, assigned, pending, *standbys) = data
        standby, standby_pending = standbys if standbys else ([], [])  # format 1: no standby tasks
        return StreamsMember(member_id, instance_id, process_id, rack_id, client_id, client_host,
                             int(rebalance_timeout_ms), int(topology_epoch),
                             (endpoint[0], int(endpoint[1])) if endpoint else None,
                             tuple((k, v) for k, v in tags), int(epoch), int(previous_epoch), MemberState(state),
                             _tasks_from_json(assigned), _tasks_from_json(pending), _tasks_from_json(standby),
                             _tasks_from_json(standby_pending))


def _tasks_json(tasks: Partitions) -> list:
    return [[sub, sorted(parts)] for sub, parts in sorted(tasks.items()) if parts]


def _tasks_from_json(data: list) -> Partitions:
    return {str(sub): {int(p) for p in parts} for sub, parts in data}


@dataclass
class StreamsGroup(MemberBook):
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    topology: Topology | None = None
    members: dict[str, StreamsMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    target: dict[str, Partitions] = field(default_factory=dict)  # member id -> its target active tasks
    standby_target: dict[str, Partitions] = field(default_factory=dict)  # member id -> its target standby tasks
    standby_replicas: int | None = None
    owners: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)  # task -> (member, its epoch)
    configured: Configured | None = None  # the topology against the catalog of `catalog_version`
    catalog_version: int = -1
    endpoint_epoch: int = 0
    shutdown_requested_by: str | None = None
    empty_since_ms: int | None = None
    assign_after_ms: int | None = None  # the initial rebalance delay's end, while the group waits for it

    @property
    def state(self) -> str:
        if not self.members:
            return "Empty"
        if self.configured is None or not self.configured.ready:
            return "NotReady"
        if self.assignment_epoch != self.epoch:
            return "Assigning"
        if any(m.epoch != self.assignment_epoch or m.state is not MemberState.STABLE for m in self.members.values()):
            return "Reconciling"
        return "Stable"

    def removed(self, member: StreamsMember) -> None:
        self.standby_target.pop(member.member_id, None)
        if self.shutdown_requested_by == member.member_id:
            self.shutdown_requested_by = None

    def replace_static(self, old_id: str, member: StreamsMember) -> None:
        """A static member back under a new member id takes over its instance's tasks and metadata (as Kafka
        copies the member under its new id): the group epoch stays and no other member reconciles."""
        old = self.members.pop(old_id)
        self.release(old)
        for name in ("process_id", "rack_id", "rebalance_timeout_ms", "topology_epoch", "endpoint", "client_tags",
                     "assigned", "pending_revocation", "standby", "standby_pending_revocation", "state",
                     "previous_epoch"):
            setattr(member, name, getattr(old, name))
        member.epoch = 0
        if old_id in self.target:
            self.target[member.member_id] = self.target.pop(old_id)
        if old_id in self.standby_target:
            self.standby_target[member.member_id] = self.standby_target.pop(old_id)
        self.add(member)
        self.hold(member)

    def subscribed_topics(self) -> set[str]:
        """The topics the group reads (its offsets there may not be deleted while it has members)."""
        if self.topology is None:
            return set()
        return {t for sub in self.topology.subtopologies
                for t in (*sub.source_topics, *(r.name for r in sub.repartition_source_topics))}

    def snapshot(self) -> list:
        """The group as the offsets log keeps it (SNAPSHOT_FORMAT)."""
        return [SNAPSHOT_FORMAT, self.epoch, self.assignment_epoch,
                self.topology.to_json() if self.topology is not None else None,
                [m.snapshot() for m in self.members.values()],
                [[member, _tasks_json(tasks)] for member, tasks in sorted(self.target.items())], self.endpoint_epoch,
                self.configured.tasks if self.configured is not None and self.configured.ready else None,
                [[member, _tasks_json(tasks)] for member, tasks in sorted(self.standby_target.items())],
                self.standby_replicas]

    @staticmethod
    def restore(group_id: str, data: list, now_ms: int) -> StreamsGroup:
        """ValueError if `data` is not a snapshot of SNAPSHOT_FORMAT."""
        if not isinstance(data, list) or not data or data[0] not in (1, SNAPSHOT_FORMAT):
            raise ValueError(f"not a streams group snapshot of format 1 or {SNAPSHOT_FORMAT}")
        _, epoch, assignment_epoch, topology, members, target, endpoint_epoch, tasks, *standbys = data
        standby_target, standby_replicas = standbys if data[0] == SNAPSHOT_FORMAT else ([], 0)  # 1: none
        group = StreamsGroup(group_id, int(epoch), int(assignment_epoch),
                             Topology.from_json(topology) if topology is not None else None)
        for member_data in members:
            member = StreamsMember.restore(member_data)
            group.add(member)
            group.hold(member)
        group.target = {str(m): _tasks_from_json(tasks) for m, tasks in target}
        group.standby_target = {str(m): _tasks_from_json(tasks) for m, tasks in standby_target}
        group.standby_replicas = int(standby_replicas) if standby_replicas is not None else None
        group.endpoint_epoch = int(endpoint_epoch)
        if tasks is not None:  # configured again against the catalog at the next heartbeat; the same tasks move none
            group.configured = Configured(None, {str(sub): int(count) for sub, count in tasks.items()})
        if not group.members:
            group.empty_since_ms = now_ms
        return group
