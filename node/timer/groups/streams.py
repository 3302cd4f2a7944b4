"""The Streams rebalance protocol (KIP-1071) of the group coordinator: StreamsGroupHeartbeat and
StreamsGroupDescribe, beside the classic and consumer protocols, in the timer process.

A Kafka Streams application with group.protocol=streams joins (member epoch 0) with its topology; the first
member's topology becomes the group's (node.timer.groups.streams_topology). The coordinator configures it
against the catalog: how many tasks each subtopology has, and the internal topics it needs. Missing internal
topics (changelogs, repartition topics) are created here, by the node, with the partition counts and topic
configs the topology implies, as Kafka's broker creates them on a heartbeat (for a principal that may create
them: the worker says). Once configured, the group epoch moves, the target assignment of active tasks is
computed (sticky, balanced per subtopology: node.timer.groups.streams_assignor), and each member reconciles
towards it one heartbeat at a time (node.timer.groups.reconciliation: a task is given only once its previous
owner reported it revoked). The answer carries the member's epoch and, when they changed or the member joined,
its tasks; and the group's statuses (missing topics, a stale topology, a shutdown request). A refused join
leaves nothing behind (Kafka writes none of a refused heartbeat's records).

Rules as Kafka's GroupMetadataManager.streamsGroupHeartbeat:
- Invalid requests (INVALID_REQUEST): empty group or member id, a join without rebalance timeout or topology or
  with owned tasks, a topology outside a join, source topic regexes (Kafka 4.4 does not support them either), a
  topology that differs from the group's at the same or a newer epoch ("Topology updates are not supported
  yet."), owned tasks outside the configured topology. A topology that can never work: STREAMS_INVALID_TOPOLOGY.
- An older topology epoch joins but is told STALE_TOPOLOGY in its status.
- Unknown member (or group) with epoch != 0: UNKNOWN_MEMBER_ID (the member rejoins); a newer epoch than the
  member's, or an older one that is not its previous epoch with tasks within its assignment: FENCED_MEMBER_EPOCH.
- A group id held by a classic group with members or by a consumer group with members: GROUP_ID_NOT_FOUND; an
  empty one of either becomes a streams group (its offsets stay).
- Static members (an instance id) leave with epoch -2 and keep their tasks until they come back under a new
  member id (taking the tasks over without a new group epoch) or their session ends; an instance held by a member
  that did not leave so: UNRELEASED_INSTANCE_ID; a member naming another instance: FENCED_INSTANCE_ID.
- Standby tasks: the group's streams.num.standby.replicas (its group config, else the node's
  streams_num_standby_replicas) standby replicas of each stateful task, placed by the assignor on other processes
  than the active task's. They reconcile as Kafka's CurrentAssignmentBuilder does, beside the active tasks: a
  member is given an active task only once no other member owns it and no other member of its process holds it
  as standby; a standby task only once no other member of its process holds it (active or standby); tasks it
  must give up (active or standby) are revoked first. No warm-up tasks are given (docs/compatibility.md).
- Settings per group (node.storage.group_config, the GROUP config resource): session timeout, heartbeat interval,
  standby replicas and initial rebalance delay are read at each heartbeat, so an altered group config applies
  from the next one; a new number of standby replicas moves the group epoch (a new target), as Kafka's
  lastAssignmentConfigs check does.
- A member joining an empty group starts the initial rebalance delay (the group's
  streams.initial.rebalance.delay.ms, else streams_initial_rebalance_delay_ms): until it ends every member is
  told ASSIGNMENT_DELAYED and given no tasks, so instances starting together get their shares at once; the
  first heartbeat after it moves the group epoch and computes the target.

Timers, joins, epoch checks, leaves, reconciliation steps and offset checks are those both families share
(node.timer.groups.reconciling): a member's session ends with the member fenced (its tasks free); a member asked
to revoke tasks that has not within its rebalance timeout is fenced too.

Persistence: after a request that changed a group, its snapshot (node.timer.groups.streams_group) is written to
the offsets log (node.timer.groups.offsets' group states), not waited for; at load the groups come back with
their members, epochs and assignments, each member's session starting anew. A change lost in a crash before its
fsync only makes members rejoin (UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH), never two owners of a task.

Invariants:
- Every request gets exactly one REPLY.
- A task is never owned by two members at once (reconciliation's invariant, over `group.owners`).
- A fenced or departed member's tasks are free at once and its timers stop.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from kio.schema.errors import ErrorCode

from shmbroker.node.config import GroupConfig, WheelConfig
from shmbroker.node.storage import group_config
from shmbroker.node.storage.group_config import StreamsSettings
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.groups.reconciliation import LEAVE_EPOCH, STATIC_LEAVE_EPOCH, Partitions, reconcile
from shmbroker.node.timer.groups.reconciling import HeartbeatError, ReconcilingGroups, as_owned, as_records
from shmbroker.node.timer.groups.streams_assignor import TASK_ASSIGNOR
from shmbroker.node.timer.groups.streams_group import StreamsGroup, StreamsMember
from shmbroker.node.timer.groups.streams_topology import (ASSIGNMENT_DELAYED, SHUTDOWN_APPLICATION, STALE_TOPOLOGY,
                                                          InvalidTopology, Topology, configure)
from shmbroker.node.timer.outbox import Outbox
from shmbroker.shm import messages as M

log = logging.getLogger("shmbroker.groups")
E = ErrorCode
HeartbeatAnswer = M.reply_class(M.Kind.STREAMS_GROUP_HEARTBEAT)
DescribeAnswer = M.reply_class(M.Kind.STREAMS_GROUP_DESCRIBE)
STANDBY = "standby"  # reconcile()'s key of a standby task's subtopology: (STANDBY, subtopology id)
NO_TOPOLOGY = -1


def with_standbys(active: Partitions, standby: Partitions) -> dict:
    """Active and standby tasks in one map for reconcile(): a standby's subtopology as (STANDBY, id)."""
    return {**active, **{(STANDBY, sub): set(parts) for sub, parts in standby.items()}}


def split_standbys(tasks: dict) -> tuple[Partitions, Partitions]:
    """with_standbys' inverse: (active, standby)."""
    active = {sub: parts for sub, parts in tasks.items() if not isinstance(sub, tuple) and parts}
    standby = {sub[1]: parts for sub, parts in tasks.items() if isinstance(sub, tuple) and parts}
    return active, standby


class StreamsGroups(ReconcilingGroups):
    FAMILY = "streams"
    UNITS = "tasks"
    EPOCH_FENCED = ("The streams group member has a {relation} member epoch ({received}) than the one known by the "
                    "group coordinator ({known}). The member must abandon all its partitions and rejoin.")
    EPOCH_INVALID = "MemberEpoch is {epoch}, but must be greater than or equal to -2."

    def __init__(self, config: GroupConfig, outbox: Outbox, store: PartitionStore, wheel: WheelConfig, now_ms: int,
                 clock: Callable[[], int], classic: Any) -> None:
        super().__init__(config, outbox, store, wheel, now_ms, clock, classic)
        self.groups: dict[str, StreamsGroup] = {}
        self.written: dict[str, bytes] = {}  # group -> its snapshot as last written to the offsets log
        # After the timer created internal topics: the workers and the flusher hear of the new catalog (set by the
        # timer process to the controller's catalog_changed).
        self.catalog_changed: Callable[[], None] = lambda: None

    def new_group(self, group_id: str) -> StreamsGroup:
        return StreamsGroup(group_id, empty_since_ms=self.clock())

    def new_member(self, member_id: str, instance_id: str | None) -> StreamsMember:
        return StreamsMember(member_id, instance_id)

    def session_timeout_ms(self, group_id: str) -> int:
        return self.settings(group_id).session_timeout_ms

    def max_size(self) -> int:
        return self.config.streams_max_size

    def other_family(self) -> ReconcilingGroups:
        return self.classic.consumer

    # -- persistence --------------------------------------------------------------------------

    def persist(self, group: StreamsGroup) -> None:
        """Write the group's snapshot to the offsets log if it changed since the last one written."""
        snapshot = group.snapshot()
        encoded = repr(snapshot).encode()
        if self.written.get(group.group_id) == encoded:
            return
        self.written[group.group_id] = encoded
        self.classic.offsets.write_group_state(group.group_id, snapshot, self.clock())

    def restore(self, states: dict[str, Any]) -> None:
        """The groups the offsets log kept (at the end of its load); members' sessions start now."""
        now = self.clock()
        for group_id, snapshot in states.items():
            try:
                group = StreamsGroup.restore(group_id, snapshot, now)
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                log.warning("streams group %s: its state in the offsets log is unreadable (%s): forgotten",
                            group_id, exc)
                continue
            self.groups[group_id] = group
            self.written[group_id] = repr(group.snapshot()).encode()
            session_ms = self.settings(group_id).session_timeout_ms
            for member_id in group.members:
                self._renew_session(group_id, member_id, session_ms)
        if states:
            log.info("restored %d streams groups from the offsets log", len(self.groups))

    def settings(self, group_id: str) -> StreamsSettings:
        """The group's session timeout, heartbeat interval and standby replicas: its group configs on the node's
        defaults."""
        return group_config.effective_streams(self.config, self.store.catalog.group_configs.get(group_id))

    def forget(self, group_id: str) -> None:
        """Drop an empty group (DeleteGroups, expiry, a conversion): a tombstone in the offsets log."""
        self.groups.pop(group_id, None)
        if self.written.pop(group_id, None) is not None:
            self.classic.offsets.write_group_state(group_id, None, self.clock())

    # -- StreamsGroupHeartbeat ----------------------------------------------------------------

    def heartbeat(self, worker: int, d: Any) -> None:
        waiter = (worker, d.request_id, d.kind)
        if self.classic.offsets.loading:
            return self._error(waiter, E.coordinator_load_in_progress, "The coordinator is loading.")
        group, joined, replaced = None, False, False
        known = self.groups.get(d.group)
        was_member = known is not None and d.member in known.members
        try:
            self._validate(d)
            if d.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                return self._leave(waiter, d)
            topology = self._topology(d)
            group, member, joined, replaced = self._join_or_find(d)
            statuses = []
            # A join changes the membership, but a static member taking its instance's place back does not.
            changed = self._update_member(member, d) or (joined and not replaced)
            changed = self._set_topology(group, member, topology) or changed
            if group.topology is not None and member.topology_epoch < group.topology.epoch:
                statuses.append((STALE_TOPOLOGY, f"The member's topology epoch {member.topology_epoch} is behind "
                                                 f"the group's topology epoch {group.topology.epoch}."))
            changed = self._configure(group, d.may_create) or changed
            self._check_owned(group, d)
            settings = self.settings(group.group_id)
            if group.standby_replicas is not None and group.standby_replicas != settings.num_standby_replicas:
                changed = True  # the group config changed: a new target with as many standbys as it says
            if changed:
                group.epoch += 1
            self._refresh_target(group, settings.num_standby_replicas)
            if group.assign_after_ms is not None:
                statuses.append((ASSIGNMENT_DELAYED, "Assignment delayed due to the configured initial rebalance "
                                                     "delay."))
            before = (member.assigned, member.standby)
            owned = None if d.active is None else with_standbys(as_owned(d.active), as_owned(d.standby) or {})
            self._reconcile(group, member, owned)
        except HeartbeatError as exc:
            if group is not None and joined and not was_member and not replaced:
                self._undo_join(group, d.member, created=known is None)
            elif group is not None:
                self.persist(group)
            return self._error(waiter, exc.error, str(exc))
        if d.shutdown:
            group.shutdown_requested_by = member.member_id
        if group.configured is not None and group.configured.status is not None:
            statuses.append(group.configured.status)
        if group.shutdown_requested_by is not None:
            statuses.append((SHUTDOWN_APPLICATION, f"Streams group member {group.shutdown_requested_by} "
                                                   "encountered a fatal error and requested a shutdown for the "
                                                   "entire application."))
        self._renew_session(group.group_id, member.member_id, settings.session_timeout_ms)
        tasks_changed = joined or (member.assigned, member.standby) != before
        if tasks_changed and member.endpoint is not None:
            group.endpoint_epoch += 1
        endpoints = self._endpoints(group) if group.endpoint_epoch != d.endpoint_epoch else None
        self.persist(group)
        tasks = as_records(member.assigned) if tasks_changed else None
        self._reply(waiter, HeartbeatAnswer(
            0, None, member.member_id, member.epoch, settings.heartbeat_interval_ms,
            self.config.streams_acceptable_recovery_lag, self.config.streams_task_offset_interval_ms,
            statuses or None, tasks, as_records(member.standby) if tasks is not None else None,
            [] if tasks is not None else None, group.endpoint_epoch, endpoints))

    def _reply(self, waiter: tuple, answer: Any) -> None:
        worker, request_id, kind = waiter
        self.outbox.send(worker, M.encode_reply(request_id, kind, answer))

    def _error(self, waiter: tuple, error: E, message: str) -> None:
        """As Kafka's: an error answer carries the code and message alone."""
        self._reply(waiter, HeartbeatAnswer(int(error), message, "", 0, 0, 0, 0, None, None, None, None, 0, None))

    def _validate(self, d: Any) -> None:
        """Kafka's throwIfStreamsGroupHeartbeatRequestIsInvalid and ...IsUsingUnsupportedFeatures."""
        if d.subtopologies is not None and any(sub[2] for sub in d.subtopologies):
            raise HeartbeatError(E.invalid_request, "Regular expressions for source topics are not supported yet.")
        self._validate_common(d, ("member", "group", "instance", "rack"))
        given = [tasks is not None for tasks in (d.active, d.standby, d.warmup)]
        if any(given) and not all(given):
            raise HeartbeatError(E.invalid_request, "If one task-type is non-null, all must be non-null.")
        if d.member_epoch != 0 and d.subtopologies is not None:
            raise HeartbeatError(E.invalid_request, "Topology can only be provided when (re-)joining.")

    @staticmethod
    def _validate_join(d: Any) -> None:
        for tasks, name in ((d.active, "ActiveTasks"), (d.standby, "StandbyTasks"), (d.warmup, "WarmupTasks")):
            if tasks:
                raise HeartbeatError(E.invalid_request, f"{name} must be empty when (re-)joining.")
        if d.subtopologies is None:
            raise HeartbeatError(E.invalid_request, "Topology must be non-null when (re-)joining.")

    def _join_or_find(self, d: Any) -> tuple[StreamsGroup, StreamsMember, bool, bool]:
        """The group and member the heartbeat is for, whether it joins, and whether it is a static member's return
        under a new member id. A join to an empty group starts the initial rebalance delay."""
        group = self._group(d.group, create=d.member_epoch == 0)
        if d.member_epoch == 0:
            delay_ms = self.settings(group.group_id).initial_rebalance_delay_ms
            if not group.members and delay_ms > 0:
                group.assign_after_ms = self.clock() + delay_ms
            member, replaced = self._join(group, d)
            return group, member, True, replaced
        return group, self._known(group, d, as_owned(d.active)), False, False

    def _join(self, group: StreamsGroup, d: Any) -> tuple[StreamsMember, bool]:
        """The families' join; a member that rejoins starts over without standby tasks too."""
        member, replaced = super()._join(group, d)
        if not replaced:
            member.standby, member.standby_pending_revocation = {}, {}
        return member, replaced

    def _known(self, group: StreamsGroup, d: Any, owned: dict | None) -> StreamsMember:
        """The families' check, and a member at its previous epoch may own no standby task beyond its current
        ones either."""
        member = super()._known(group, d, owned)
        standby = as_owned(d.standby) or {}
        if d.member_epoch < member.epoch and any(not parts <= member.standby.get(t, set())
                                                 for t, parts in standby.items()):
            raise HeartbeatError(E.fenced_member_epoch, self.EPOCH_FENCED.format(
                relation="smaller", received=d.member_epoch, known=member.epoch))
        return member

    @staticmethod
    def _update_member(member: StreamsMember, d: Any) -> bool:
        """Take the heartbeat's changed fields; True if the assignment may depend on what changed (the process,
        the rack, the client tags: Kafka bumps the group epoch for any change of the member's metadata)."""
        before = (member.process_id, member.rack_id, member.client_tags)
        if d.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = d.rebalance_timeout_ms
        if d.rack is not None:
            member.rack_id = d.rack
        if d.process_id is not None:
            member.process_id = d.process_id
        if d.endpoint_host is not None:
            member.endpoint = (d.endpoint_host, d.endpoint_port)
        if d.client_tags is not None:
            member.client_tags = tuple(sorted((str(k), str(v)) for k, v in d.client_tags))
        member.client_id, member.client_host = d.client_id, d.client_host
        return before != (member.process_id, member.rack_id, member.client_tags)

    def _undo_join(self, group: StreamsGroup, member_id: str, created: bool) -> None:
        """A join refused after its member was added (as Kafka writes none of a refused heartbeat's records): the
        member goes, and the group too if this join made it."""
        group.remove(member_id, self.clock())
        self._stop_timers(group.group_id, member_id)
        if created and not group.members:
            self.groups.pop(group.group_id, None)

    @staticmethod
    def _topology(d: Any) -> Topology | None:
        """The heartbeat's topology (None without one); STREAMS_INVALID_TOPOLOGY before anything else is touched."""
        if d.subtopologies is None:
            return None
        try:
            return Topology.from_message(d.topology_epoch, d.subtopologies)
        except InvalidTopology as exc:
            raise HeartbeatError(E.streams_invalid_topology, str(exc))

    def _set_topology(self, group: StreamsGroup, member: StreamsMember, topology: Topology | None) -> bool:
        """Kafka's maybeUpdateTopology; True if the group's topology was set."""
        if topology is None:
            return False
        member.topology_epoch = topology.epoch
        if group.topology is None:
            log.info("streams group %s: member %s initialized the topology with epoch %d", group.group_id,
                     member.member_id, topology.epoch)
            group.topology, group.configured = topology, None
            return True
        if group.topology.epoch > topology.epoch:
            return False  # a stale topology: the member is told so in its status
        if group.topology != topology:
            raise HeartbeatError(E.invalid_request, "Topology updates are not supported yet.")
        return False

    def _configure(self, group: StreamsGroup, may_create: bool) -> bool:
        """Configure the topology against the catalog when either changed, creating missing internal topics if
        the member's principal may (else they stay missing, as the status says); True if the tasks per
        subtopology (what the assignment depends on) changed."""
        catalog = self.store.catalog
        unconfigured = group.configured is None or group.catalog_version != catalog.version
        # Topics left missing for want of CREATE are created for the first member that may; topics the node
        # refused (a bad name, too many partitions) are tried again only once the catalog changes.
        now_allowed = group.configured is not None and group.configured.unauthorized and may_create
        if group.topology is None or not (unconfigured or now_allowed):
            return False
        before = group.configured.tasks if group.configured is not None and group.configured.ready else None
        topics = {name: entry.partitions for name, entry in catalog.topics.items()}
        configured = configure(group.topology, topics)
        if configured.to_create and not may_create:
            configured.unauthorized = True
            code, detail = configured.status
            configured.status = (code, f"{detail}; Unauthorized to CREATE on topics "
                                       f"{', '.join(sorted(configured.to_create))}.")
        elif configured.to_create:
            created = self.store.create_topics([(name, count, configs) for name, (count, configs)
                                                in configured.to_create.items()])
            self.catalog_changed()
            refused = {name: message for name, (code, message) in created.items() if code}
            for name, message in refused.items():
                log.warning("streams group %s: cannot create internal topic %s: %s", group.group_id, name, message)
            if not refused:
                log.info("streams group %s: created internal topics %s", group.group_id,
                         ", ".join(sorted(configured.to_create)))
            catalog = self.store.catalog
            configured = configure(group.topology, {name: entry.partitions for name, entry in catalog.topics.items()})
            if refused and configured.status is not None:
                code, detail = configured.status
                configured.status = (code, detail + "; " + "; ".join(f"{n}: {m}" for n, m in sorted(refused.items())))
        group.configured, group.catalog_version = configured, catalog.version
        return (configured.tasks if configured.ready else None) != before

    def _check_owned(self, group: StreamsGroup, d: Any) -> None:
        """Kafka's throwIfRequestContainsInvalidTasks, once the topology is configured."""
        if group.configured is None or not group.configured.ready:
            return
        tasks = group.configured.tasks
        for records in (d.active, d.standby, d.warmup):
            for sub, partitions in records or ():
                if sub not in tasks:
                    raise HeartbeatError(E.invalid_request, f"Subtopology {sub} does not exist in the topology.")
                for partition in partitions:
                    if not 0 <= partition < tasks[sub]:
                        raise HeartbeatError(E.invalid_request, f"Task {partition} for subtopology {sub} is invalid. "
                                                                f"Number of tasks for this subtopology: {tasks[sub]}")

    def _refresh_target(self, group: StreamsGroup, standby_replicas: int) -> None:
        """The target assignment at the group epoch; while the initial rebalance delay lasts, an empty one (the
        members settle at the group epoch with no tasks), and when it ends a new group epoch with the real one."""
        if group.assign_after_ms is not None and self.clock() >= group.assign_after_ms:
            group.assign_after_ms = None
            group.epoch += 1
        if group.assignment_epoch == group.epoch:
            return
        if group.assign_after_ms is not None:
            group.target = {member_id: {} for member_id in group.members}
            group.standby_target = {}
            group.assignment_epoch = group.epoch
            return
        ready = group.configured is not None and group.configured.ready
        tasks = group.configured.tasks if ready else {}
        group.target = TASK_ASSIGNOR.assign(group.members, tasks, group.target, group.standby_target)
        stateful = {sub.subtopology_id for sub in group.topology.subtopologies
                    if sub.changelog_topics} if group.topology is not None else set()
        group.standby_target = TASK_ASSIGNOR.assign_standbys(
            {m.member_id: m.process_id for m in group.members.values()}, tasks, stateful, standby_replicas,
            group.target, group.standby_target)
        group.standby_replicas = standby_replicas
        group.assignment_epoch = group.epoch

    def _step(self, group: StreamsGroup, member: StreamsMember, owned: dict | None) -> None:
        """reconcile() once over the member's active and standby tasks together (a standby's subtopology keyed
        apart: with_standbys), so standbys are revoked before anything new is given, as active tasks are."""
        outcome = reconcile(member.state, member.epoch, member.previous_epoch,
                            with_standbys(member.assigned, member.standby),
                            with_standbys(member.pending_revocation, member.standby_pending_revocation),
                            group.assignment_epoch,
                            with_standbys(group.target.get(member.member_id, {}),
                                          group.standby_target.get(member.member_id, {})),
                            owned, self._holder_epoch(group, member))
        outcome.assigned, member.standby = split_standbys(outcome.assigned)
        outcome.pending_revocation, member.standby_pending_revocation = split_standbys(outcome.pending_revocation)
        group.apply(member, outcome)  # its active tasks, whose owners the group tracks

    @staticmethod
    def _holder_epoch(group: StreamsGroup, member: StreamsMember) -> Callable[[Any, int], int]:
        """reconcile()'s owner_epoch for `member`, over active and standby tasks (Kafka's isUnreleasedTask): an
        active task is held while another member owns it, or another member of its process has it as standby; a
        standby task while a member of its process other than itself has it (active or standby). -1: free."""
        active_owner = group.owner_epoch(member.member_id)
        neighbours = [m for m in group.members.values()
                      if m.member_id != member.member_id and m.process_id == member.process_id]

        def epoch_of(sub: Any, partition: int) -> int:
            if isinstance(sub, tuple):
                sub = sub[1]
                holders = [m for m in neighbours if partition in m.owned().get(sub, ())]
            else:
                epoch = active_owner(sub, partition)
                if epoch != -1:
                    return epoch
                holders = []
            holders += [m for m in neighbours if partition in m.owned_standby().get(sub, ())]
            return holders[0].epoch if holders else -1
        return epoch_of

    def _endpoints(self, group: StreamsGroup) -> list:
        """PartitionsByUserEndpoint: per member with an endpoint, the source partitions of its active tasks."""
        if group.topology is None:
            return []
        counts = group.configured.partitions if group.configured is not None else {}
        sources = {sub.subtopology_id: (*sub.source_topics, *(r.name for r in sub.repartition_source_topics))
                   for sub in group.topology.subtopologies}
        answer = []
        for member in group.members.values():
            if member.endpoint is None:
                continue
            partitions_of = []
            for tasks in (member.assigned, member.standby):
                by_topic: dict[str, set[int]] = {}
                for sub, partitions in tasks.items():
                    for topic in sources.get(sub, ()):
                        by_topic.setdefault(topic, set()).update(p for p in partitions if p < counts.get(topic, 0))
                partitions_of.append([(t, sorted(p)) for t, p in sorted(by_topic.items()) if p])
            answer.append((member.endpoint[0], member.endpoint[1], *partitions_of))
        return answer

    def _leave(self, waiter: tuple, d: Any) -> None:
        group = self.groups.get(d.group)
        member = group.members.get(d.member) if group is not None else None
        if member is None:
            return self._error(waiter, E.unknown_member_id, f"Member {d.member} is not a member of group {d.group}.")
        if d.instance is not None and group.static_members.get(d.instance) != d.member:
            return self._error(waiter, E.fenced_instance_id, f"Instance {d.instance} is held by another member.")
        epoch = self._depart(group, d.member, d)
        self.persist(group)
        self._reply(waiter, HeartbeatAnswer(0, None, d.member, epoch, self.settings(d.group).heartbeat_interval_ms,
                                            self.config.streams_acceptable_recovery_lag,
                                            self.config.streams_task_offset_interval_ms, None, None, None, None,
                                            group.endpoint_epoch, None))

    # -- StreamsGroupDescribe -----------------------------------------------------------------

    def describe(self, worker: int, d: Any) -> None:
        described = []
        for group_id in d.groups:
            group = self.groups.get(group_id)
            if self.classic.offsets.loading:
                described.append((int(E.coordinator_load_in_progress), None, group_id, "", -1, -1, -1, None, []))
            elif group is None:
                other = group_id in self.classic.groups or group_id in self.classic.consumer.groups
                message = f"Group {group_id} is not a streams group." if other else f"Group {group_id} not found."
                described.append((int(E.group_id_not_found), message, group_id, "", 0, 0, -1, None, []))
            else:
                topology = group.topology
                described.append((
                    int(E.none), None, group_id, group.state, group.epoch, group.assignment_epoch,
                    topology.epoch if topology is not None else NO_TOPOLOGY,
                    [self._subtopology_record(s) for s in topology.subtopologies] if topology is not None else None,
                    [(m.member_id, m.epoch, m.instance_id, m.rack_id, m.client_id, m.client_host, m.topology_epoch,
                      m.process_id, m.endpoint[0] if m.endpoint else None, m.endpoint[1] if m.endpoint else -1,
                      list(m.client_tags), as_records(m.assigned), as_records(group.target.get(m.member_id, {})),
                      as_records(m.standby), as_records(group.standby_target.get(m.member_id, {})))
                     for m in group.members.values()]))
        self.outbox.send(worker, M.encode_reply(d.request_id, d.kind, DescribeAnswer(described)))

    @staticmethod
    def _subtopology_record(sub: Any) -> tuple:
        def topic(t: Any) -> tuple:
            return (t.name, t.partitions, t.replication_factor, [list(kv) for kv in t.configs])
        return (sub.subtopology_id, list(sub.source_topics), [], [topic(t) for t in sub.changelog_topics],
                list(sub.repartition_sink_topics), [topic(t) for t in sub.repartition_source_topics],
                [(list(a), [], list(b)) for a, b in sub.copartition_groups])
