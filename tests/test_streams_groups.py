"""Streams groups (KIP-1071) without a node: the task assignor's balance and stickiness, and a topology's
configuration against partition counts (node.timer.groups.streams_assignor, node.timer.groups.streams_topology)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from shmbroker.node.timer.groups.streams_assignor import TASK_ASSIGNOR
from shmbroker.node.timer.groups.streams_topology import (INCORRECTLY_PARTITIONED_TOPICS, MISSING_INTERNAL_TOPICS,
                                                          MISSING_SOURCE_TOPICS, InvalidTopology, Subtopology,
                                                          TopicInfo, Topology, configure)


def tasks_of(assignment: dict) -> list:
    return sorted((s, p) for parts in assignment.values() for s, ps in parts.items() for p in ps)


@settings(max_examples=60, deadline=None, database=None)
@given(members=st.sets(st.sampled_from("abcdefg"), min_size=1), joined=st.sets(st.sampled_from("abcdefgh")),
       tasks=st.dictionaries(st.sampled_from(["0", "1", "2"]), st.integers(1, 9), min_size=1))
def test_every_task_once_balanced_per_subtopology_and_sticky(members, joined, tasks):
    first = TASK_ASSIGNOR.assign(members, tasks, {})
    assert tasks_of(first) == sorted((s, p) for s, n in tasks.items() for p in range(n))
    for subtopology in tasks:
        counts = [len(first[m].get(subtopology, ())) for m in members]
        assert max(counts) - min(counts) <= 1
    totals = [len(tasks_of({m: first[m]})) for m in members]
    assert max(totals) - min(totals) <= len(tasks)
    assert TASK_ASSIGNOR.assign(members, tasks, first) == first  # nothing changed: nothing moves
    after = TASK_ASSIGNOR.assign(members | joined, tasks, first)
    assert tasks_of(after) == tasks_of(first)
    for member in members:  # a member keeps at least its new share of what it had, per subtopology
        for subtopology, count in tasks.items():
            kept = first[member].get(subtopology, set()) & after[member].get(subtopology, set())
            assert len(kept) >= min(len(first[member].get(subtopology, ())), count // len(members | joined))


def test_a_member_that_joins_takes_a_share_of_every_subtopology():
    alone = TASK_ASSIGNOR.assign(["a"], {"0": 4, "1": 4}, {})
    both = TASK_ASSIGNOR.assign(["a", "b"], {"0": 4, "1": 4}, alone)
    assert both == {"a": {"0": {0, 1}, "1": {0, 1}}, "b": {"0": {2, 3}, "1": {2, 3}}}
    assert TASK_ASSIGNOR.assign([], {"0": 4}, both) == {}


@settings(max_examples=60, deadline=None, database=None)
@given(processes=st.dictionaries(st.sampled_from("abcdefg"), st.sampled_from("PQRS"), min_size=1),
       tasks=st.dictionaries(st.sampled_from(["0", "1", "2"]), st.integers(1, 6), min_size=1),
       stateful=st.sets(st.sampled_from(["0", "1", "2"])), replicas=st.integers(0, 3))
def test_standbys_never_beside_their_active_task_and_sticky(processes, tasks, stateful, replicas):
    active = TASK_ASSIGNOR.assign(processes, tasks, {})
    standby = TASK_ASSIGNOR.assign_standbys(processes, tasks, stateful, replicas, active, {})
    holders: dict = {}
    for member, assigned in active.items():
        for sub, parts in assigned.items():
            for p in parts:
                holders.setdefault((sub, p), []).append(processes[member])
    for member, assigned in standby.items():
        for sub, parts in assigned.items():
            assert sub in stateful
            for p in parts:
                holders.setdefault((sub, p), []).append(processes[member])
    distinct = len(set(processes.values()))
    for (sub, p), where in holders.items():
        assert len(where) == len(set(where)), "two replicas of a task on one process"
        if sub in stateful:  # as many standbys as asked, or one per other process
            assert len(where) - 1 == min(replicas, distinct - 1)
        else:
            assert len(where) == 1
    again = TASK_ASSIGNOR.assign_standbys(processes, tasks, stateful, replicas, active, standby)
    assert again == standby  # nothing changed: no standby moves


def test_two_instances_hold_each_others_standbys():
    """Two application instances of one thread each (KIP-1071's processes), one standby replica: each instance
    holds, as standby, exactly the stateful tasks the other runs; a stateless subtopology gets none."""
    processes = {"m1": "instance-1", "m2": "instance-2"}
    active = TASK_ASSIGNOR.assign(processes, {"0": 4, "1": 4}, {})
    standby = TASK_ASSIGNOR.assign_standbys(processes, {"0": 4, "1": 4}, {"1"}, 1, active, {})
    assert standby == {"m1": {"1": active["m2"]["1"]}, "m2": {"1": active["m1"]["1"]}}
    alone = TASK_ASSIGNOR.assign_standbys({"m1": "instance-1", "m2": "instance-1"}, {"1": 4}, {"1"}, 1,
                                          TASK_ASSIGNOR.assign(["m1", "m2"], {"1": 4}, {}), {})
    assert alone == {"m1": {}, "m2": {}}  # two threads of one instance: no other process for a standby


def test_a_leaving_members_tasks_go_to_their_standbys():
    """Three instances, one standby replica: when one leaves, each of its active tasks goes to the member that had
    it as standby (its state restored) wherever the balance leaves a choice."""
    active = {"m1": {"0": {0, 1}}, "m2": {"0": {2, 3}}, "m3": {"0": {4, 5}}}
    standby = {"m1": {"0": {2, 5}}, "m2": {"0": {0, 4}}, "m3": {"0": {1, 3}}}
    after = TASK_ASSIGNOR.assign(["m1", "m2"], {"0": 6}, active, standby)
    assert after == {"m1": {"0": {0, 1, 5}}, "m2": {"0": {2, 3, 4}}}  # by ids alone m1 would get 4


def test_a_snapshot_of_format_1_restores_without_standbys():
    """A group kept before standby tasks (format 1: members without standby fields, no standby target) comes back
    with none, at the number of standbys it had (0), so its first heartbeat moves nothing."""
    from shmbroker.node.timer.groups.streams_group import StreamsGroup, StreamsMember

    group = StreamsGroup("g", epoch=3, assignment_epoch=3, topology=word_count())
    member = StreamsMember("m", process_id="p", epoch=3, assigned={"0": {0, 1}})
    group.add(member)
    group.hold(member)
    group.target = {"m": {"0": {0, 1}}}
    snapshot = group.snapshot()
    old = [1, *snapshot[1:4], [m[:15] for m in snapshot[4]], *snapshot[5:8]]
    restored = StreamsGroup.restore("g", old, now_ms=0)
    assert restored.members["m"].assigned == {"0": {0, 1}} and restored.members["m"].standby == {}
    assert restored.standby_target == {} and restored.standby_replicas == 0 and restored.owners == group.owners
    again = StreamsGroup.restore("g", snapshot, now_ms=0)
    assert again.snapshot() == snapshot


def topic(name: str, partitions: int = 0) -> TopicInfo:
    return TopicInfo(name, partitions, 0, ())


def word_count(copartitioned: bool = False, fixed: int = 0) -> Topology:
    return Topology(0, (
        Subtopology("0", ("in",), (), ("rep",), (), ()),
        Subtopology("1", ("other",) if copartitioned else (), (topic("store-changelog"),), (),
                    (topic("rep", fixed),), (((0,), (0,)),) if copartitioned else ())))


def test_configuration_decides_the_internal_topics_partitions():
    configured = configure(word_count(), {"in": 3})
    assert configured.status[0] == MISSING_INTERNAL_TOPICS
    assert configured.to_create == {"rep": (3, {}), "store-changelog": (3, {})}
    assert configured.tasks == {"0": 3, "1": 3}
    ready = configure(word_count(), {"in": 3, "rep": 3, "store-changelog": 3})
    assert ready.ready and ready.tasks == {"0": 3, "1": 3} and not ready.to_create
    assert configure(word_count(fixed=5), {"in": 3}).to_create["rep"] == (5, {})


def test_configuration_statuses():
    assert configure(word_count(), {}).status[0] == MISSING_SOURCE_TOPICS
    wrong = configure(word_count(), {"in": 3, "rep": 2})
    assert wrong.status[0] == INCORRECTLY_PARTITIONED_TOPICS and "expected 3, found 2" in wrong.status[1]
    # Co-partitioned: the flexible repartition topic takes the user topic's count; fixed ones must agree.
    assert configure(word_count(copartitioned=True), {"in": 3, "other": 6}).to_create["rep"] == (6, {})
    refused = configure(word_count(copartitioned=True, fixed=2), {"in": 3, "other": 6})
    assert refused.status[0] == INCORRECTLY_PARTITIONED_TOPICS


@pytest.mark.parametrize("subtopologies, message", [
    ([("0", ["in"], [], [("c", 3, 0, [])], [], [], [])], "must have an undefined partition count"),
    ([("0", [], [], [], [], [], [])], "has no source topics"),
    ([("0", ["in"], [], [], [], [], []), ("0", ["in"], [], [], [], [], [])], "is given twice"),
    ([("0", ["in"], [], [], [], [], [([1], [], [])])], "co-partition group index"),
])
def test_topologies_that_can_never_work(subtopologies, message):
    with pytest.raises(InvalidTopology, match=message):
        Topology.from_message(0, subtopologies)


def test_a_topology_survives_its_json():
    topology = word_count(copartitioned=True, fixed=4)
    assert Topology.from_json(topology.to_json()) == topology


@pytest.mark.parametrize("settings, complaint", [
    ({"streams_heartbeat_interval_ms": 0}, "1 <= streams_heartbeat_interval_ms"),
    ({"streams_session_timeout_ms": 5000}, "streams_heartbeat_interval_ms < streams_session_timeout_ms"),
    ({"streams_initial_rebalance_delay_ms": -1}, "must be >= 0"),
])
def test_streams_settings_out_of_their_bounds_are_refused(settings, complaint):
    from shmbroker.node.config import GroupConfig

    with pytest.raises(ValueError, match=complaint):
        GroupConfig(**settings)
