"""A share-partition's records without a node (node.timer.groups.share_partition, and the state records that
node.timer.groups.share writes and restores: a share-partition's, a share group's): acquisition, acknowledgement,
locks, the delivery-count limit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st
from kio.schema.errors import ErrorCode as E

from shmbroker.node.config import GroupConfig, NodeConfig, WheelConfig
from shmbroker.node.storage.store import GROUP_RESOURCE, PartitionStore
from shmbroker.node.timer.groups.offsets import SHARE_GROUP_STATE, OffsetStore
from shmbroker.node.storage.share_records import recorded_in_flight
from shmbroker.node.timer.groups.share import ShareGroups, restored, snapshot
from shmbroker.node.timer.groups.share_group import ShareGroup, ShareMember
from shmbroker.node.timer.groups.share_partition import DONE, AckType, RecordState, SharePartition
from tests.record_batches import SharedTable

ACCEPT, RELEASE, REJECT, GAP, RENEW = (int(AckType.ACCEPT), int(AckType.RELEASE), int(AckType.REJECT),
                                      int(AckType.GAP), int(AckType.RENEW))


def partition(start: int = 0, limit: int = 3, in_flight: int = 100) -> SharePartition:
    return SharePartition(start, limit, in_flight)


def test_acquisition_takes_new_records_up_to_the_high_watermark_and_max_records():
    p = partition()
    assert p.acquire("a", 4, 10, 0, lock=1) == [(0, 3, 1)]
    assert p.acquire("b", 100, 10, 0, lock=2) == [(4, 9, 1)]
    assert p.acquire("a", 5, 10, 0, lock=3) == []  # nothing left: every record is acquired
    assert (p.start_offset, p.next_offset, p.in_flight()) == (0, 10, 10)


def test_accept_moves_the_start_and_forgets_done_records():
    p = partition()
    p.acquire("a", 5, 5, 0, lock=1)
    assert p.acknowledge("a", 0, 1, [ACCEPT]) == E.none
    assert p.acknowledge("a", 3, 4, [ACCEPT]) == E.none
    assert p.start_offset == 2 and sorted(p.records) == [2, 3, 4]  # 3 and 4 wait behind 2
    assert p.acknowledge("a", 2, 2, [REJECT]) == E.none
    assert (p.start_offset, p.records) == (5, {})


def test_released_records_go_out_again_first_with_their_delivery_count():
    p = partition()
    p.acquire("a", 4, 10, 0, lock=1)
    assert p.acknowledge("a", 0, 3, [ACCEPT, RELEASE, RELEASE, ACCEPT]) == E.none
    assert p.acquire("b", 3, 10, 0, lock=2) == [(1, 2, 2), (4, 4, 1)]
    assert p.redelivered == 2


def test_only_the_holder_acknowledges_and_a_refused_batch_changes_nothing():
    p = partition()
    p.acquire("a", 3, 10, 0, lock=1)
    assert p.acknowledge("b", 0, 0, [ACCEPT]) == E.invalid_record_state
    assert p.acknowledge("a", 1, 5, [ACCEPT]) == E.invalid_record_state  # 3-5 were never acquired
    assert p.acknowledge("a", 0, 2, [ACCEPT, ACCEPT]) == E.invalid_request  # two types for three offsets
    assert p.acknowledge("a", 0, 0, [9]) == E.invalid_request
    assert p.acknowledge("a", 10**15, 10**18, [ACCEPT]) == E.invalid_record_state  # no walk over the range
    assert all(r.state is RecordState.ACQUIRED and r.member == "a" for r in p.records.values())
    assert p.acknowledge("a", 0, 2, [ACCEPT]) == E.none and p.start_offset == 3


def test_an_expired_lock_releases_only_its_own_records():
    p = partition()
    p.acquire("a", 2, 10, 0, lock=1)
    p.acquire("b", 2, 10, 0, lock=2)
    assert p.expire(1) == 2
    assert [p.records[o].state for o in range(4)] == [RecordState.AVAILABLE] * 2 + [RecordState.ACQUIRED] * 2
    assert p.expire(1) == 0
    assert p.acknowledge("a", 0, 0, [ACCEPT]) == E.invalid_record_state  # its lock ran out


def test_the_delivery_count_limit_archives():
    p = partition(limit=2)
    for lock in (1, 2):
        assert p.acquire("a", 1, 1, 0, lock) == [(0, 0, lock)]
        p.acknowledge("a", 0, 0, [RELEASE]) if lock == 1 else p.expire(lock)
    assert p.acquire("a", 1, 1, 0, lock=3) == [] and p.start_offset == 1 and p.archived == 1


def test_renew_moves_records_to_a_new_lock():
    p = partition()
    p.acquire("a", 2, 10, 0, lock=1)
    assert p.acknowledge("a", 0, 0, [RENEW], renew_lock=7) == E.none
    assert p.expire(1) == 1 and p.records[0].state is RecordState.ACQUIRED and p.locked(7) == [0]


def test_gaps_and_bounds():
    p = partition(in_flight=5)
    assert p.acquire("a", 100, 50, 0, lock=1) == [(0, 4, 1)]  # at most 5 in flight
    del p.records[2]  # as a control record's offset: nothing to acknowledge there but a GAP
    p.records[2] = p.records[1].__class__(RecordState.ACQUIRED, 1, "a", 1)
    assert p.acknowledge("a", 0, 4, [ACCEPT, ACCEPT, GAP, ACCEPT, ACCEPT]) == E.none and p.start_offset == 5
    p.acquire("a", 1, 50, 20, lock=2)  # the log's start moved to 20: what is below it is gone
    assert p.start_offset == 20 and sorted(p.records) == [20]


def test_a_member_that_leaves_releases_what_it_holds():
    p = partition()
    p.acquire("a", 2, 10, 0, lock=1)
    p.acquire("b", 2, 10, 0, lock=2)
    assert p.release_member("a") == 2 and p.locked(2) == [2, 3]


def test_the_state_record_round_trips_and_acquired_records_come_back_available():
    p = partition(start=10)
    p.acquire("a", 6, 30, 0, lock=1)
    p.acknowledge("a", 11, 12, [ACCEPT])
    p.acknowledge("a", 13, 13, [RELEASE])
    state = snapshot(p)
    assert state == [1, 10, 16, [[10, 10, 1, 1], [11, 12, 2, 1], [13, 13, 0, 1], [14, 15, 1, 1]], ""]
    back = restored(state, 3, 100)
    assert (back.start_offset, back.next_offset) == (10, 16)
    assert {o: (r.state, r.delivery_count) for o, r in back.records.items() if r.state not in DONE} == {
        10: (RecordState.AVAILABLE, 1), 13: (RecordState.AVAILABLE, 1), 14: (RecordState.AVAILABLE, 1),
        15: (RecordState.AVAILABLE, 1)}
    assert back.acquire("b", 10, 30, 0, lock=2)[:2] == [(10, 10, 2), (13, 15, 2)]


def runs_by_offset(p: SharePartition) -> list[list[int]]:
    """The state record's runs the obvious way, offset by offset (what SharePartition.runs computes)."""
    runs: list[list[int]] = []
    for offset in range(p.start_offset, p.next_offset):
        record = p.records.get(offset)
        state, count = (int(record.state), record.delivery_count) if record else (int(RecordState.ARCHIVED), 0)
        if runs and runs[-1][2:] == [state, count]:
            runs[-1][1] = offset
        else:
            runs.append([offset, offset, state, count])
    return runs


operations = st.lists(st.tuples(st.sampled_from(["acquire", "ack", "expire", "leave", "trim"]), st.sampled_from("ab"),
                                st.integers(0, 12), st.integers(0, 4), st.sampled_from([ACCEPT, RELEASE, REJECT])),
                      max_size=60)


@settings(max_examples=100, deadline=None, database=None)
@given(operations)
def test_a_record_has_one_holder_and_the_start_never_rests_on_a_done_record(ops):
    p = partition(limit=3, in_flight=8)
    delivered: dict[int, int] = {}
    for lock, (op, member, offset, span, kind) in enumerate(ops, start=1):
        if op == "acquire":
            for first, last, count in p.acquire(member, span + 1, 20, 0, lock):
                for o in range(first, last + 1):
                    assert count == delivered.get(o, 0) + 1 <= 3
                    delivered[o] = count
        elif op == "ack":
            p.acknowledge(member, offset, offset + span, [kind])
        elif op == "expire":
            p.expire(offset)
        elif op == "trim":  # retention took the log below `offset`: an acquisition moves the start there
            for first, last, count in p.acquire(member, span + 1, 20, offset, lock):
                for o in range(first, last + 1):
                    delivered[o] = count
        else:
            p.release_member(member)
        assert list(p.records) == sorted(p.records) and p.runs() == runs_by_offset(p)
        assert p.start_offset <= p.next_offset and p.next_offset - p.start_offset <= 8
        assert all(p.start_offset <= o < p.next_offset for o in p.records)
        assert p.start_offset == p.next_offset or p.records[p.start_offset].state not in DONE
        assert all((r.state is RecordState.ACQUIRED) == bool(r.member) for r in p.records.values())
    back = restored(snapshot(p), 3, 8)  # acquired records come back released: archived at the limit
    assert back.start_offset >= p.start_offset and back.next_offset == p.next_offset
    assert all(r.state is not RecordState.ACQUIRED for r in back.records.values())


def test_a_share_groups_snapshot_restores_the_same_group():
    """The share group record (node.timer.groups.share_group): epoch and members with their ids, client, rack,
    subscription, epochs and assignment come back as they were, in order; another format is refused."""
    group = ShareGroup("g", epoch=7)
    group.members["m1"] = ShareMember("m1", None, "c1", "/127.0.0.1", ("a", "b"), 7, 5, {"a": [0, 1], "b": [0]})
    group.members["m0"] = ShareMember("m0", "rack-1", "c0", "/127.0.0.2", ("a",), 6, 4, {"a": [0, 1]})
    back = ShareGroup.restore("g", group.snapshot())
    assert back == group and list(back.members) == ["m1", "m0"]
    with pytest.raises(ValueError):
        ShareGroup.restore("g", [99, *group.snapshot()[1:]])


def open_offsets(store: PartitionStore) -> OffsetStore:
    """The offsets log of the store, loaded as a timer loads it at start (writes need no fsync here)."""
    offsets = OffsetStore(store, lambda rows, ends, deadline_ms, done: done(True), lambda name, job: None,
                          load_bytes_per_turn=1 << 20, load_interval_ms=0, segment_bytes=1 << 20,
                          commit_timeout_ms=1000)
    for _ in range(100):
        if offsets.load_step(0):
            return offsets
    raise AssertionError("the offsets log did not load")


def test_share_state_from_before_the_group_records_restores_the_groups_empty(tmp_path):
    """An offsets log written before share groups kept their membership has share-partition records alone: their
    groups come back, empty, with their share-partitions, under the group's configs at restore (a delivery-count
    limit of 2 archives the record its dead lock had delivered twice); a share group record that cannot be read is
    forgotten and its group comes back as the older ones do. A share-partition that restore changed is written
    again: the log's latest record of it is what memory holds (what `shmbroker groups describe` reads)."""
    p = partition(start=4)
    p.acquire("a", 3, 10, 0, lock=1)
    p.expire(1)
    p.acquire("a", 1, 10, 0, lock=2)  # offset 4 delivered twice and held, 5 and 6 once and waiting
    config = NodeConfig()
    with SharedTable(rows=4) as table:
        store = PartitionStore(str(tmp_path), table, config.log, 4)
        try:
            assert store.alter_configs([(GROUP_RESOURCE, "old", "incremental", [
                (0, "share.delivery.count.limit", "2")])], groups=config.groups) == [(0, None)]
            before = open_offsets(store)  # what a node before the share group records wrote, and a broken one
            before.write_share_states([(("old", "t", 0), snapshot(p)), (("broken", "t", 1), snapshot(partition()))], 0)
            before.write_group_state("broken", [1, "not an epoch"], 0, SHARE_GROUP_STATE)
            offsets = open_offsets(store)
            groups = ShareGroups(config.groups, None, store, WheelConfig(), 0, lambda: 0,
                                 classic=SimpleNamespace(offsets=offsets))
            groups.restore(offsets.share_group_states, offsets.share_states)
            assert sorted(groups.groups) == ["broken", "old"]
            assert all(not g.members and g.epoch == 0 for g in groups.groups.values())
            back = groups.partitions[("old", "t", 0)]
            assert (back.start_offset, back.next_offset, back.in_flight(), back.delivery_limit) == (5, 7, 2, 2)
            assert len(groups.sessions) == 0
            assert recorded_in_flight(open_offsets(store).share_states[("old", "t", 0)]) == (5, 2)
        finally:
            store.close()


def test_configure_takes_a_groups_new_limits():
    """A lowered delivery-count limit archives the waiting records that reached it (never delivered again); a
    lowered in-flight bound stops new acquisitions until the records in flight are done."""
    p = partition(limit=5, in_flight=100)
    p.acquire("a", 4, 10, 0, lock=1)
    p.expire(1)
    p.acquire("a", 2, 10, 0, lock=2)  # 0 and 1 delivered twice, 2 and 3 once and waiting
    p.expire(2)
    p.configure(2, 2)
    assert (p.start_offset, p.archived, sorted(p.records)) == (2, 2, [2, 3])
    assert p.acquire("b", 10, 10, 0, lock=3) == [(2, 3, 2)]  # no new record: 2 in flight already
    p.configure(2, 100)
    assert p.acquire("b", 10, 6, 0, lock=4) == [(4, 5, 1)]


@pytest.mark.parametrize("settings, complaint, widened", [
    ({"share_session_timeout_ms": 6000}, "share_min_session_timeout_ms <= share_session_timeout_ms",
     {"share_min_session_timeout_ms": 6000}),
    ({"share_heartbeat_interval_ms": 16_000}, "<= share_max_heartbeat_interval_ms",
     {"share_max_heartbeat_interval_ms": 16_000}),
    ({"share_delivery_count_limit": 1}, "share_min_delivery_count_limit <= share_delivery_count_limit",
     {"share_min_delivery_count_limit": 1}),
    ({"share_partition_max_record_locks": 5000}, "<= share_max_partition_max_record_locks",
     {"share_max_partition_max_record_locks": 5000}),
])
def test_the_nodes_share_settings_stay_within_their_bounds(settings, complaint, widened):
    """As Kafka's broker refuses group.share.* values outside their min/max: the node's [groups] share_* too,
    unless the bound is moved with them."""
    with pytest.raises(ValueError, match=complaint):
        GroupConfig(**settings)
    assert GroupConfig(**settings, **widened)
