"""Kafka Streams 4.4.0 with group.protocol=streams (KIP-1071) against a real node, and the same program against a
real Apache Kafka 4.4.0 (scripts.harness.kafka_peer) to compare: tests/java/StreamsGroupApp.java, a stateful word count
(a repartition topic and a store with its changelog, both created by the broker), one JVM per broker, one JSON line
per step.

On the node the program sets the group's streams.num.standby.replicas to 1 with the admin (a GROUP config), runs two
instances that share the tasks, each holding the other's stateful tasks as standby, has the admin describe the group
(describeStreamsGroups), closes one instance (the other takes every task), then waits while the test restarts the
node and checks that the group, its epochs and the counts go on; then a third instance of another application
counts with exactly_once_v2, and the admin lists the first group's offsets and deletes it.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from pathlib import Path

import pytest

from scripts.harness.kafka_peer import KafkaPeer
from scripts.harness.nodeproc import NodeProcess, die_with_parent
from tests.test_java_clients import PROGRAMS, java_command

pytestmark = pytest.mark.node

TIMEOUT_S = 240
PREFIX = "wc"
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
ALL_TASKS = [f"{s}_{p}" for s in (0, 1) for p in range(4)]
# A member learns of a new assignment at its next heartbeat: short intervals on both brokers (defaults 5 s), and
# no initial rebalance delay (3 s by default on both; tests/test_streams_groups_protocol.py tries the node's).
HEARTBEAT_MS = 500
NODE_CONFIG = (f"[groups]\nstreams_heartbeat_interval_ms = {HEARTBEAT_MS}\n"
               f"streams_min_heartbeat_interval_ms = {HEARTBEAT_MS}\nstreams_initial_rebalance_delay_ms = 0\n")
KAFKA_SETTINGS = {"group.streams.heartbeat.interval.ms": str(HEARTBEAT_MS),
                  "group.streams.min.heartbeat.interval.ms": str(HEARTBEAT_MS),
                  "group.streams.initial.rebalance.delay.ms": "0"}


def counts(rounds: int) -> dict[str, int]:
    """Word i appears i + 1 times per round."""
    return {word: rounds * (i + 1) for i, word in enumerate(WORDS)}


def run_streams_app(bootstrap: str, work: Path, on_restart=None) -> dict[str, dict]:
    """StreamsGroupApp.java's lines by step; `on_restart()` runs at its before-restart step (then the program goes
    on)."""
    mode = "restart" if on_restart is not None else "no-restart"
    stderr_path = work / "streams-app.err"
    java_tmp = work / "java-tmp"  # RocksDB unpacks its native library into java.io.tmpdir: kept inside tmp_path
    java_tmp.mkdir(exist_ok=True)
    lines: queue.Queue = queue.Queue()
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen([*java_command(PROGRAMS / "StreamsGroupApp.java", f"-Djava.io.tmpdir={java_tmp}"),
                                 bootstrap, PREFIX, str(work / "state"), mode],
                                stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr, text=True, preexec_fn=die_with_parent)
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)],
                              daemon=True)
    reader.start()
    got: dict[str, dict] = {}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            if not line.startswith('{"step"'):
                continue
            step = json.loads(line)
            got[step["step"]] = step
            if step["step"] == "before-restart":
                on_restart()
                proc.stdin.write("go on\n")
                proc.stdin.flush()
        proc.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        reader.join(timeout=5)
        proc.stdout.close()
    assert proc.returncode == 0 and "done" in got, \
        f"StreamsGroupApp exited {proc.returncode}; steps {list(got)}\n{stderr_path.read_text()[-4000:]}"
    return got


@pytest.fixture(scope="module")
def on_node(tmp_path_factory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("streams-node")
    with NodeProcess(work, workers=2, config=NODE_CONFIG) as node:
        def restart() -> None:
            node.stop()
            node.start()
        got = run_streams_app(node.bootstrap, work, on_restart=restart)
        assert "Traceback" not in node.log(), node.log()
    assert node.leftovers() == []
    return got


@pytest.fixture(scope="module")
def on_kafka(tmp_path_factory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("streams-kafka")
    kafka = KafkaPeer(partitions=1, settings=KAFKA_SETTINGS)
    kafka.start()
    try:
        return run_streams_app(kafka.bootstrap, work)
    finally:
        kafka.close()


def per_subtopology(tasks: list[str]) -> dict[str, int]:
    shares: dict[str, int] = {}
    for task in tasks:
        shares[task.split("_")[0]] = shares.get(task.split("_")[0], 0) + 1
    return shares


def test_two_instances_share_every_subtopology(on_node):
    a, b = on_node["two-instances"]["a"], on_node["two-instances"]["b"]
    assert sorted(a + b) == ALL_TASKS
    assert per_subtopology(a) == per_subtopology(b) == {"0": 2, "1": 2}  # as Kafka's assignor spreads them
    assert on_node["counts"]["counts"] == counts(1)


def stateful(tasks: list[str]) -> list[str]:
    return [t for t in tasks if t.startswith("1_")]  # subtopology 1 has the store (a changelog)


@pytest.mark.parametrize("broker", ["node", "kafka"])
def test_with_one_standby_replica_each_instance_holds_the_others_stateful_tasks(on_node, on_kafka, broker):
    """streams.num.standby.replicas=1, a GROUP config set by the admin before the group exists: as Kafka's assignor,
    the node gives each instance the other's tasks of the stateful subtopology as standby (never its own); the
    instances' own metadata (metadataForLocalThreads) and describeStreamsGroups say so."""
    got = {"node": on_node, "kafka": on_kafka}[broker]
    two = got["two-instances"]
    assert two["standbyA"] == stateful(two["b"]) and two["standbyB"] == stateful(two["a"]) and two["standbyA"]
    assert [m["standby"] for m in got["describe"]["group"]["members"]] == [two["standbyA"], two["standbyB"]]
    assert got["one-left"]["a"] == ALL_TASKS  # the standbys of the instance left became active


def test_the_group_configs_as_kafka(on_node, on_kafka):
    # 3 is above group.streams.max.standby.replicas (2); the override is the group's (source GROUP_CONFIG, 8), the
    # heartbeat interval the broker's static setting, the session timeout its default.
    assert on_node["group-config"] == on_kafka["group-config"] == {"step": "group-config", "result": {
        "three": "InvalidConfigurationException", "configs": {
            "streams.heartbeat.interval.ms": f"{HEARTBEAT_MS} STATIC_BROKER_CONFIG",
            "streams.num.standby.replicas": "1 DYNAMIC_GROUP_CONFIG",
            "streams.session.timeout.ms": "45000 DEFAULT_CONFIG"}}}


def test_the_admin_describes_members_tasks_and_topology(on_node):
    group = on_node["describe"]["group"]
    assert group["state"] == "Stable" and group["groupEpoch"] == group["assignmentEpoch"]
    assert [m["active"] for m in group["members"]] == [on_node["two-instances"]["a"], on_node["two-instances"]["b"]]
    assert {m["memberEpoch"] for m in group["members"]} == {group["groupEpoch"]}
    assert group["subtopologies"] == [
        {"id": "0", "sources": [f"{PREFIX}-in"], "repartitionSinks": [f"{PREFIX}-app-counts-repartition"],
         "changelogs": [], "repartitionSources": []},
        {"id": "1", "sources": [], "repartitionSinks": [], "changelogs": [f"{PREFIX}-app-counts-changelog"],
         "repartitionSources": [f"{PREFIX}-app-counts-repartition"]}]


def test_the_instance_left_takes_every_task_and_the_counts_go_on(on_node):
    assert on_node["one-left"]["a"] == ALL_TASKS
    assert on_node["counts-after-leave"]["counts"] == counts(2)


def test_a_node_restart_keeps_the_group(on_node):
    before, after = on_node["before-restart"]["group"], on_node["after-restart"]["group"]
    # The same group, epochs and member: restored from the offsets log, not rebuilt by a rejoin (a new group
    # would start again at epoch 1); the store's counts go on from its changelog.
    assert after["groupEpoch"] == before["groupEpoch"] and after["members"] == before["members"]
    assert on_node["after-restart"]["a"] == ALL_TASKS
    assert on_node["counts-after-restart"]["counts"] == counts(3)


def test_exactly_once_commits_its_offsets_in_transactions(on_node, on_kafka):
    # Its TxnOffsetCommits carry the member's epoch (KIP-447's checks against the streams group); the output,
    # read read_committed, has every count once.
    assert on_node["exactly-once"]["counts"] == counts(3)
    assert on_kafka["exactly-once"]["counts"] == counts(2)


def test_the_groups_offsets_and_its_deletion(on_node):
    committed = on_node["offsets"]["committed"]
    # Every record of the input topic (6 words, 21 records a round, three rounds) is behind the committed offsets.
    assert sum(offset for name, offset in committed.items() if name.startswith(f"{PREFIX}-in-")) == 3 * 21
    assert set(committed) <= {f"{PREFIX}-{topic}-{p}" for topic in ("in", "app-counts-repartition") for p in range(4)}
    assert any(name.startswith(f"{PREFIX}-app-counts-repartition-") for name in committed)
    assert on_node["deleted"]["describeAfter"] == "GroupIdNotFoundException"


def test_the_node_answers_as_kafka(on_node, on_kafka):
    for step in ("counts", "counts-after-leave", "one-left", "deleted"):
        assert {k: v for k, v in on_node[step].items()} == on_kafka[step], step
    node_two, kafka_two = on_node["two-instances"], on_kafka["two-instances"]
    assert per_subtopology(node_two["a"]) == per_subtopology(kafka_two["a"])
    assert per_subtopology(node_two["b"]) == per_subtopology(kafka_two["b"])
    node_group, kafka_group = on_node["describe"]["group"], on_kafka["describe"]["group"]
    for key in ("state", "topologyEpoch", "subtopologies"):
        assert node_group[key] == kafka_group[key], key
    assert [m["clientId"] for m in node_group["members"]] == [m["clientId"] for m in kafka_group["members"]]
