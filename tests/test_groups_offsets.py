"""Committed offsets survive anything: a restart, kill -9 of every node process in the middle of a commit
load, a compaction of their log; they load in slices (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and expire
once their group stays empty past the retention."""

from __future__ import annotations

import threading
import time

from tests import waiting
from tests.test_clients import create_topic
from tests.test_groups_protocol import GROUP_CONFIG, LOADING, MEMBER_ID_REQUIRED, NONE, Client

PARTITIONS = 4


def start_node(node_factory, extra: str = ""):
    node = node_factory(workers=2, config=GROUP_CONFIG + extra)
    create_topic(node.bootstrap, "t", PARTITIONS)
    return node


def fetch_all(node, group: str) -> dict:
    client = Client(node)
    try:
        deadline = time.monotonic() + 30
        while True:
            response, fetched = client.fetch_offsets(group, {"t": list(range(PARTITIONS))})
            if int(response.error_code) != LOADING:
                return {tp: offset for tp, (offset, _, error) in fetched.items()}
            assert time.monotonic() < deadline, "offsets never finished loading"
            time.sleep(0.05)
    finally:
        client.close()


def test_commits_survive_a_clean_restart(node_factory):
    node = start_node(node_factory)
    client = Client(node)
    committed = {("t", p): 100 + p for p in range(PARTITIONS)}
    assert set(client.commit("g", committed).values()) == {NONE}
    client.close()
    assert node.stop() == 0
    node.start()
    assert fetch_all(node, "g") == committed


def test_no_acknowledged_commit_is_lost_when_every_process_is_killed(node_factory):
    node = start_node(node_factory)
    acked: dict[tuple[str, int], int] = {}
    stop = threading.Event()

    def commit_load(group: str) -> None:
        client = Client(node)
        offset = 0
        try:
            while not stop.is_set() and offset < 1_000_000:
                offset += 1
                partition = offset % PARTITIONS
                try:
                    errors = client.commit(group, {("t", partition): offset})
                except Exception:  # the node died under us: what was acknowledged before counts
                    return
                if errors[("t", partition)] == NONE:
                    acked[(group, partition)] = offset
        finally:
            client.close()

    threads = [threading.Thread(target=commit_load, args=(f"g{i}",), daemon=True) for i in range(3)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(acked) < 3 * PARTITIONS or min(acked.values()) < 50:
        assert time.monotonic() < deadline, f"the commit load did not get going: {acked}"
        time.sleep(0.05)
    node.kill_all()  # kill -9 of the supervisor, the timer and both workers, mid-load
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    node.start()
    for group in ("g0", "g1", "g2"):
        recovered = fetch_all(node, group)
        for partition in range(PARTITIONS):
            assert recovered[("t", partition)] >= acked[(group, partition)], (group, partition)


def test_the_log_cleaner_compacts_the_offsets_log_which_is_still_complete_after_a_restart(node_factory):
    node = start_node(node_factory, "offsets_segment_bytes = 4000\n[cleaner]\nbackoff_ms = 200\n")
    client = Client(node)
    for round_ in range(1, 401):
        assert client.commit("busy", {("t", round_ % PARTITIONS): round_}) == {("t", round_ % PARTITIONS): NONE}
    assert set(client.commit("quiet", {("t", 0): 7}).values()) == {NONE}
    expected_busy = {("t", p): max(r for r in range(1, 401) if r % PARTITIONS == p) for p in range(PARTITIONS)}
    log_dir = node.data_dir / "__consumer_offsets-0"
    # A cleaning may start while the commits are still arriving and clean only what was closed by then:
    # wait for the cleanings (one or several) to bring the log far below the 400 commits' size.
    waiting.wait_for(lambda: sum(p.stat().st_size for p in log_dir.glob("*.log")) < 400 * 60, 30,
                     "the cleaner to compact the offsets log")
    assert "cleaned __consumer_offsets-0" in node.log()
    assert fetch_all(node, "busy") == expected_busy
    client.close()
    assert node.stop() == 0
    node.start()
    assert fetch_all(node, "busy") == expected_busy
    assert fetch_all(node, "quiet")[("t", 0)] == 7


def test_offsets_load_in_slices_answering_load_in_progress_meanwhile(node_factory):
    node = start_node(node_factory, "offsets_load_bytes_per_turn = 64\noffsets_load_interval_ms = 40\n")
    client = Client(node)
    for round_ in range(1, 101):
        assert set(client.commit(f"g{round_}", {("t", 0): round_}).values()) == {NONE}
    client.close()
    assert node.stop() == 0
    node.start()  # 100 batches at one per 40 ms: about 4 s of loading, the node answers after about 1
    client = Client(node)
    response, _ = client.fetch_offsets("g100", {"t": [0]})
    assert int(response.error_code) == LOADING
    assert client.join("any").error_code == LOADING
    client.close()
    assert fetch_all(node, "g100")[("t", 0)] == 100


def test_a_member_between_its_two_joins_keeps_a_new_group_through_the_expiry_checks(node_factory):
    node = start_node(node_factory, "offsets_retention_minutes = 0.02\noffsets_retention_check_interval_ms = 50\n")
    client = Client(node)
    first = client.join("new")
    assert first.error_code == MEMBER_ID_REQUIRED
    time.sleep(0.5)  # ten expiry checks while the group is empty, without offsets, its member pending
    joined = client.join("new", member=first.member_id)
    assert joined.error_code == NONE and joined.generation_id == 1
    # A member that never comes back keeps its group only for its session.
    assert client.join("abandoned", session_ms=500).error_code == MEMBER_ID_REQUIRED
    assert client.describe("abandoned").groups[0].group_state == "Empty"
    deadline = time.monotonic() + 20
    while client.describe("abandoned").groups[0].group_state != "Dead":
        assert time.monotonic() < deadline, "a group whose pending member's session ended was kept"
        time.sleep(0.1)
    client.close()


def test_offsets_of_a_group_left_empty_expire(node_factory):
    node = start_node(node_factory, "offsets_retention_minutes = 0.02\noffsets_retention_check_interval_ms = 200\n")
    client = Client(node)
    joined = client.join_fully("members")
    assert joined.error_code == NONE and joined.generation_id == 1
    assert client.sync("members", 1, joined.member_id, [(joined.member_id, b"x")]).error_code == NONE
    assert client.commit("members", {("t", 0): 5}, generation=1, member=joined.member_id) == {("t", 0): NONE}
    time.sleep(2)  # longer than the 1.2 s retention, but the group has a member: its offsets stay
    assert client.heartbeat("members", 1, joined.member_id) == NONE
    assert fetch_all(node, "members")[("t", 0)] == 5
    client.leave("members", joined.member_id)
    deadline = time.monotonic() + 20
    while fetch_all(node, "members")[("t", 0)] != -1:
        assert time.monotonic() < deadline, "the empty group's offsets never expired"
        time.sleep(0.2)
    assert client.describe("members").groups[0].group_state == "Dead", "with no offsets left the group is gone"
    client.close()
