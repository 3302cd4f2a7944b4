"""The consumer protocol's server-side assignors and its reconciliation state machine (KIP-848), as units."""

from __future__ import annotations

import itertools
import time

import pytest

from shmbroker.node.timer.groups.assignors import ASSIGNORS, RangeAssignor, UniformAssignor
from shmbroker.node.timer.groups.reconciliation import MemberState, reconcile


def owners(assignment):
    seen = {}
    for member, topics in assignment.items():
        for topic, partitions in topics.items():
            for p in partitions:
                assert (topic, p) not in seen, f"{topic}-{p} given twice"
                seen[(topic, p)] = member
    return seen


def counts(assignment):
    return {m: sum(len(p) for p in t.values()) for m, t in assignment.items()}


@pytest.mark.parametrize("members, partitions", list(itertools.product([1, 2, 3, 5, 7], [1, 6, 10])))
def test_uniform_covers_every_partition_once_and_balances(members, partitions):
    subs = {f"m{i}": frozenset({"a", "b"}) for i in range(members)}
    result = UniformAssignor().assign(subs, {"a": partitions, "b": 3}, {})
    assert len(owners(result)) == partitions + 3
    assert max(counts(result).values()) - min(counts(result).values()) <= 1


def test_uniform_is_sticky_when_a_member_joins_or_leaves():
    subs = {"m1": frozenset({"t"}), "m2": frozenset({"t"}), "m3": frozenset({"t"})}
    first = UniformAssignor().assign(subs, {"t": 6}, {})
    subs["m4"] = frozenset({"t"})
    second = UniformAssignor().assign(subs, {"t": 6}, first)
    moved = [k for k, m in owners(second).items() if owners(first)[k] != m]
    assert len(moved) == 1 and owners(second)[moved[0]] == "m4"  # only what m4 needs moves
    del subs["m2"]
    third = UniformAssignor().assign(subs, {"t": 6}, {m: second[m] for m in subs})
    assert all(owners(third)[k] == owners(second)[k] for k, m in owners(second).items() if m != "m2")
    assert max(counts(third).values()) - min(counts(third).values()) <= 1


def test_uniform_gives_topics_only_to_their_subscribers():
    subs = {"a1": frozenset({"a"}), "b1": frozenset({"b"}), "ab": frozenset({"a", "b"})}
    result = UniformAssignor().assign(subs, {"a": 4, "b": 4}, {})
    assert "b" not in result["a1"] and "a" not in result["b1"]
    assert len(owners(result)) == 8


def test_range_gives_contiguous_ranges_per_topic():
    subs = {"m1": frozenset({"t"}), "m2": frozenset({"t"}), "m3": frozenset({"t", "u"})}
    result = RangeAssignor().assign(subs, {"t": 7, "u": 2}, {})
    assert result["m1"]["t"] == {0, 1, 2} and result["m2"]["t"] == {3, 4} and result["m3"]["t"] == {5, 6}
    assert result["m3"]["u"] == {0, 1}
    assert set(ASSIGNORS) == {"uniform", "range"}


def free(topic, partition):
    return -1


def test_a_new_member_at_epoch_zero_gets_its_free_target_at_once():
    out = reconcile(MemberState.STABLE, 0, -1, {}, {}, 3, {"t": {0, 1}}, {}, free)
    assert out.state is MemberState.STABLE and out.epoch == 3 and out.assigned == {"t": {0, 1}}


def test_revocation_comes_before_assignment_and_keeps_the_epoch():
    out = reconcile(MemberState.STABLE, 3, 2, {"t": {0, 1, 2}}, {}, 4, {"t": {0, 3}}, {"t": {0, 1, 2}}, free)
    assert out.state is MemberState.UNREVOKED_PARTITIONS and out.epoch == 3
    assert out.assigned == {"t": {0}} and out.pending_revocation == {"t": {1, 2}}
    # Still owning a revoked partition: nothing moves.
    again = reconcile(out.state, out.epoch, out.previous_epoch, out.assigned, out.pending_revocation, 4,
                      {"t": {0, 3}}, {"t": {0, 1}}, free)
    assert again.state is MemberState.UNREVOKED_PARTITIONS and again.epoch == 3
    # Revoked: the new epoch, and the new partition since nobody holds it.
    done = reconcile(out.state, out.epoch, out.previous_epoch, out.assigned, out.pending_revocation, 4,
                     {"t": {0, 3}}, {"t": {0}}, free)
    assert done.state is MemberState.STABLE and done.epoch == 4 and done.previous_epoch == 3
    assert done.assigned == {"t": {0, 3}}


def test_a_partition_still_owned_by_another_member_waits_unreleased():
    held = {("t", 1): 3}

    def owner(topic, partition):
        return held.get((topic, partition), -1)

    out = reconcile(MemberState.STABLE, 3, 2, {"t": {0}}, {}, 4, {"t": {0, 1}}, {"t": {0}}, owner)
    assert out.state is MemberState.UNRELEASED_PARTITIONS and out.epoch == 4 and out.assigned == {"t": {0}}
    held.clear()
    later = reconcile(out.state, out.epoch, out.previous_epoch, out.assigned, {}, 4, {"t": {0, 1}}, {"t": {0}}, owner)
    assert later.state is MemberState.STABLE and later.assigned == {"t": {0, 1}}


def test_a_member_that_does_not_say_what_it_owns_is_taken_to_still_own_it():
    out = reconcile(MemberState.UNREVOKED_PARTITIONS, 3, 2, {}, {"t": {0}}, 4, {}, None, free)
    assert out.state is MemberState.UNREVOKED_PARTITIONS


def test_uniform_keeps_the_balance_when_previous_owners_held_more_than_their_share():
    subs = {m: frozenset({"t"}) for m in ("m1", "m2", "m3", "m4")}
    previous = {"m1": {"t": {0, 1, 2, 9}}, "m2": {"t": {3, 4, 5}}, "m3": {"t": {6, 7, 8}}}
    result = UniformAssignor().assign(subs, {"t": 10}, previous)
    assert sorted(counts(result).values()) == [2, 2, 3, 3]
    assert all(result[m]["t"] <= previous[m]["t"] for m in previous)  # the rest stays where it was


def test_uniform_scales_to_thousands_of_members():
    subs = {f"m{i:05d}": frozenset({"t"}) for i in range(5000)}
    started = time.perf_counter()
    result = UniformAssignor().assign(subs, {"t": 10_000}, {})
    assert time.perf_counter() - started < 2.0  # O(P log M): about 10 ms here; O(P * M) took seconds
    assert set(counts(result).values()) == {2}
