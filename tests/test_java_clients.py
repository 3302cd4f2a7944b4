"""Apache Kafka 4.4.0's Java client against a real node (2 workers): the programs of tests/java/, single-file
sources the JVM compiles and runs (`java -cp <Kafka's jars> tests/java/Name.java ...`, on the classpath Maven
fetched: scripts/harness/kafka_peer.py), print one JSON line per step, and the tests assert on what they read back.

- Clients.java `transactions`: an idempotent producer's records and offsets read back; a consume-transform-produce
  loop of a transactional producer (initTransactions, an aborted then a committed transaction, each with
  sendOffsetsToTransaction): the group's offset is the committed one only, a read_committed consumer reads the
  committed records at their exact offsets and never an aborted one (read_uncommitted sees them), a second
  producer of the same transactional id fences the first.
- Clients.java `groups`: a consumer of group.protocol=classic and one of group.protocol=consumer (KIP-848) read
  every record of three partitions exactly once, in order, and commit.
- Clients.java `static`, for group.protocol classic and consumer: two static members (group.instance.id); one
  closes and a new consumer of its instance id comes back inside the session timeout: it gets the same partition,
  and the other member sees no rebalance.
- Clients.java `cooperative`: partition.assignment.strategy cooperative-sticky: a second member takes half of the
  first's partitions; the first gives up only those (its listener is told of them alone) and gets them back when
  the second leaves.
- AdminSteps.java, one run on a node with the authorizer on (User:ANONYMOUS its super user): topics (create with a
  config, list, describe, an existing name, createPartitions, delete), configs (incrementalAlterConfigs SET, APPEND,
  SUBTRACT, DELETE, an unknown key, a broker default), listOffsets (earliest, latest, max timestamp, by timestamp)
  and deleteRecords, consumer groups (listGroups with types and states, describe, alterConsumerGroupOffsets while
  active and empty, listConsumerGroupOffsets, delete), ACLs (create, describe by filters, delete), SCRAM users
  (alterUserScramCredentials, describeUserScramCredentials), describeTransactions and listTransactions of an open
  transaction, abortTransaction (WriteTxnMarkers, under the coordinator's open transaction), describeCluster and
  describeFeatures.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scripts.harness.kafka_peer import class_sharing, java, program
from scripts.harness.nodeproc import NodeProcess, die_with_parent

pytestmark = pytest.mark.node

PROGRAMS = Path(__file__).resolve().parent / "java"
TIMEOUT_S = 180
AUTHORIZER = '[authorizer]\nenabled = true\nsuper_users = ["User:ANONYMOUS"]\n'
# Short client runs: C1 alone starts the client in a third of the time the full tiered JIT takes on two busy cores;
# no hsperfdata in /tmp.
CLIENT_JVM_OPTIONS = ("-Xmx256m", "-XX:-UsePerfData", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                      "-Djava.awt.headless=true")


def java_command(source: Path, *options: str) -> list[str]:
    """The command line (before the program's arguments) that runs the Java program `source` on Kafka's jars:
    CLIENT_JVM_OPTIONS and `options`, Kafka's classes mapped from the class archive, the program compiled once
    (kafka_peer.program)."""
    return [java(), *CLIENT_JVM_OPTIONS, *class_sharing(), *options, *program(source)]


def run_java(program: str, *args: str) -> list[dict]:
    """The JSON lines a program printed (the client's own log lines are left out); AssertionError with its output
    when it exits non-zero."""
    done = subprocess.run([*java_command(PROGRAMS / program), *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL,
                          preexec_fn=die_with_parent)
    assert done.returncode == 0, f"{program} {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"step"')]


def steps(lines: list[dict]) -> dict[str, dict]:
    return {line["step"]: line for line in lines}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(tmp_path_factory.mktemp("java-clients"), workers=2) as started:
        yield started


# --------------------------------------------------------------------------- producers and consumers


def test_idempotent_and_transactional_producers_and_read_committed(node):
    got = steps(run_java("Clients.java", "transactions", node.bootstrap, "jtx"))
    assert got["idempotent"]["sent"] == [f"jtx-in-0@{i}" for i in range(6)]
    assert got["idempotent-read"]["records"] == [[i, f"in-{i}"] for i in range(6)]
    assert got["source"]["records"] == [[0, i, f"in-{i}", f"in-{i}"] for i in range(6)]
    # The aborted transaction's sendOffsetsToTransaction (offset 3) is not the group's; the committed one (6) is.
    assert got["after-abort"]["committed"] is None
    assert got["after-commit"]["committed"] == 6
    assert got["fenced"]["old"] == "ProducerFencedException"
    # aborted 0-2, its marker 3, committed 4-9, marker 10, the successor's 11-12, marker 13.
    assert got["ends"]["end"] == 14
    committed = [[4 + i, f"committed-{i}"] for i in range(6)] + [[11, "successor-0"], [12, "successor-1"]]
    assert got["read_committed"]["records"] == committed
    aborted = [[i, f"aborted-{i}"] for i in range(3)]
    assert got["read_uncommitted"]["records"] == aborted + committed


def test_classic_and_consumer_protocol_groups_read_every_record(node):
    lines = run_java("Clients.java", "groups", node.bootstrap, "jgroups")
    assert [line["protocol"] for line in lines] == ["classic", "consumer"]
    partitions = [f"jgroups-topic-{p}" for p in range(3)]
    expected = sorted([i % 3, i // 3, f"k{i}", f"v{i}"] for i in range(30))
    for line in lines:
        assert sorted(line["records"]) == expected, line["protocol"]
        for p in range(3):  # each partition's records in their order
            offsets = [record[1] for record in line["records"] if record[0] == p]
            assert offsets == list(range(10)), (line["protocol"], p, offsets)
        assert line["assignment"] == partitions
        assert line["committed"] == {name: 10 for name in partitions}
        assert line["generation"] >= 1 and line["member"]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_static_member_returns_to_its_partition_without_a_rebalance(node, protocol):
    prefix = f"jstatic-{protocol}"
    got = steps(run_java("Clients.java", "static", node.bootstrap, prefix, protocol))
    joined, returned = got["joined"], got["returned"]
    assert joined["settled"], joined
    assert sorted(joined["a"]["assignment"] + joined["b"]["assignment"]) == [f"{prefix}-topic-0", f"{prefix}-topic-1"]
    assert returned["back"], returned
    # The returning instance has its partition back at the same generation (classic) or member epoch (KIP-848: the
    # group epoch did not move); the other member was told nothing (same generation or epoch, no listener call).
    assert returned["a"]["assignment"] == joined["a"]["assignment"]
    assert returned["a"]["generation"] == joined["a"]["generation"]
    assert returned["a"]["events"] == [["assigned", joined["a"]["assignment"]]]
    assert returned["b"] == joined["b"]


def test_cooperative_sticky_moves_only_the_partitions_that_change_owner(node):
    got = steps(run_java("Clients.java", "cooperative", node.bootstrap, "jcoop"))
    everything = [f"jcoop-topic-{p}" for p in range(4)]
    assert got["alone"]["settled"] and got["alone"]["first"]["assignment"] == everything
    shared = got["shared"]
    assert shared["settled"], shared
    kept, moved = shared["first"]["assignment"], shared["second"]["assignment"]
    assert len(kept) == 2 and sorted(kept + moved) == everything
    events = shared["first"]["events"]
    assert events[0] == ["assigned", everything]
    # Incremental: the first member is told of the moved partitions alone, and loses none.
    assert [e for e in events[1:] if e[0] != "assigned"] == [["revoked", moved]], events
    assert all(e[1] == [] for e in events[1:] if e[0] == "assigned"), events
    # The second member may first be given nothing (the partitions it will have are still the first's), by timing.
    assert [e for e in shared["second"]["events"] if e[1]] == [["assigned", moved]], shared["second"]
    left = got["second-left"]
    assert left["settled"] and left["first"]["assignment"] == everything
    after = left["first"]["events"][len(events):]
    assert [e for e in after if e[1]] == [["assigned", moved]], after


# --------------------------------------------------------------------------- the AdminClient


@pytest.fixture(scope="module")
def admin_steps(tmp_path_factory) -> dict[str, dict]:
    """AdminSteps.java's lines by step, from one run on a node with the authorizer on."""
    with NodeProcess(tmp_path_factory.mktemp("java-admin"), workers=2, config=AUTHORIZER) as started:
        return steps(run_java("AdminSteps.java", started.bootstrap, "jadm"))


def ok(admin_steps: dict[str, dict], name: str) -> dict:
    line = admin_steps[name]
    assert "error" not in line, line
    return line


def test_admin_topics_and_partitions(admin_steps):
    got = ok(admin_steps, "topics")
    assert got["listed"] == ["jadm-a", "jadm-b"]
    one_replica_on_node_0 = [0, 1, 1]  # leader, replicas, in-sync replicas
    assert got["partitions"] == {"0": one_replica_on_node_0, "1": one_replica_on_node_0}
    assert got["default_partitions"] == {"0": one_replica_on_node_0}  # num.partitions 1
    assert got["create_again"] == "TopicExistsException"
    assert got["grown"] == {str(p): one_replica_on_node_0 for p in range(4)}
    assert got["after_delete"] == ["jadm-a"]


def test_admin_incremental_alter_configs(admin_steps):
    got = ok(admin_steps, "configs")
    assert got["set"] == {"cleanup.policy": ["delete,compact", "DYNAMIC_TOPIC_CONFIG"],
                          "max.message.bytes": ["65536", "DYNAMIC_TOPIC_CONFIG"],
                          "retention.ms": ["1000", "DYNAMIC_TOPIC_CONFIG"]}
    assert got["deleted"] == {"cleanup.policy": ["compact", "DYNAMIC_TOPIC_CONFIG"],
                              "max.message.bytes": ["65536", "DYNAMIC_TOPIC_CONFIG"],
                              "retention.ms": ["604800000", "DEFAULT_CONFIG"]}
    assert got["unknown_key"] == "InvalidConfigurationException"
    assert got["broker_default"] == {"log.retention.ms": ["7200000", "DYNAMIC_DEFAULT_BROKER_CONFIG"]}


def test_admin_list_offsets_and_delete_records(admin_steps):
    got = ok(admin_steps, "offsets")
    # [offset, timestamp - the first record's]: ten records one second apart.
    assert got["before"] == {"earliest": [0, -1], "latest": [10, -1], "max_timestamp": [9, 9000],
                             "at_5": [5, 5000], "at_2_5": [3, 3000], "after_all": [-1, -1]}
    assert got["low_watermark"] == 4
    assert got["after"] == {"earliest": [4, -1], "latest": [10, -1], "max_timestamp": [9, 9000],
                            "at_5": [5, 5000], "at_2_5": [4, 4000], "after_all": [-1, -1]}
    assert got["past_the_end"] == "OffsetOutOfRangeException"


def test_admin_consumer_groups(admin_steps):
    got = ok(admin_steps, "groups")
    assert got["consumed"] == [8, 8]
    assert got["listed_active"] == {"jadm-848": ["Consumer", "Stable", "consumer"],
                                    "jadm-classic": ["Classic", "Stable", "consumer"]}
    everything = [f"jadm-a-{p}" for p in range(4)]
    assert got["described"] == {
        "jadm-848": {"type": "Consumer", "state": "Stable", "assignor": "uniform", "simple": False,
                     "members": [{"client_id": "consumer-jadm-848-2", "assignment": everything}]},
        "jadm-classic": {"type": "Classic", "state": "Stable", "assignor": "range", "simple": False,
                         "members": [{"client_id": "consumer-jadm-classic-1", "assignment": everything}]}}
    assert got["describe_unknown"] == "GroupIdNotFoundException"
    assert got["alter_while_active"] == "UnknownMemberIdException"  # Kafka's answer to a group with members
    assert got["listed_after_close"] == {"jadm-848": ["Consumer", "Empty", "consumer"],
                                         "jadm-classic": ["Classic", "Empty", "consumer"]}
    # Two records per partition were committed; partitions 0 and 1 altered after.
    assert got["offsets_altered"] == {"jadm-a-0": [1, ""], "jadm-a-1": [0, "from java"], "jadm-a-2": [2, ""],
                                      "jadm-a-3": [2, ""]}
    assert got["listed_after_delete"] == {}


def test_admin_acls(admin_steps):
    got = ok(admin_steps, "acls")

    def binding(resource: str, name: str, pattern: str, principal: str, host: str, operation: str,
                permission: str) -> str:
        return (f"(pattern=ResourcePattern(resourceType={resource}, name={name}, patternType={pattern}), "
                f"entry=(principal={principal}, host={host}, operation={operation}, permissionType={permission}))")

    cluster = binding("CLUSTER", "kafka-cluster", "LITERAL", "User:alice", "*", "DESCRIBE", "ALLOW")
    groups = binding("GROUP", "jadm", "PREFIXED", "User:bob", "127.0.0.1", "ALL", "DENY")
    topic = binding("TOPIC", "jadm-a", "LITERAL", "User:alice", "*", "READ", "ALLOW")
    assert got["all"] == [cluster, groups, topic]
    assert got["alices"] == [cluster, topic]
    assert got["matching_group"] == [groups]  # MATCH: the prefixed binding covers jadm-consumers
    assert got["deleted"] == [cluster, topic]
    assert got["left"] == [groups]
    assert got["bad_principal"] == "InvalidRequestException"  # "alice", not "User:alice"


def test_admin_scram_users(admin_steps):
    got = ok(admin_steps, "scram")
    # Kafka's controller takes one change per user in a request: two mechanisms of one user are DUPLICATE_RESOURCE
    # for that user, the other users' changes are made.
    assert got["one_request"] == {"jadm-alice": "DuplicateResourceException", "jadm-bob": "altered"}
    assert got["after_one_request"] == {"jadm-bob": ["SCRAM_SHA_512/10000"]}
    assert got["described"] == {"jadm-alice": ["SCRAM_SHA_256/8192", "SCRAM_SHA_512/4096"],
                                "jadm-bob": ["SCRAM_SHA_512/10000"]}
    assert got["after_delete"] == {"jadm-alice": ["SCRAM_SHA_512/4096"]}
    assert got["unknown_in_all"] == {"jadm-nobody": []}  # all() passes RESOURCE_NOT_FOUND as no credentials
    assert got["unknown_user"] == "ResourceNotFoundException"
    assert got["ten_iterations"] == "UnacceptableCredentialException"


def test_admin_describe_and_list_transactions(admin_steps):
    got = ok(admin_steps, "transactions")
    assert got["state"] == "Ongoing" and got["partitions"] == ["jadm-tx-0"]
    assert got["epoch"] == 0 and got["timeout_ms"] == 60000 and got["started"]
    assert got["listed"] == {"jadm-open": ["Ongoing", True]}  # True: the producer id describeTransactions gave
    assert got["ongoing"] == {"jadm-open": "Ongoing"}
    assert got["unknown_id"] == "TransactionalIdNotFoundException"
    assert (got["lso"], got["high_watermark"]) == (0, 1)


def test_admin_abort_transaction(admin_steps):
    got = admin_steps["abort-transaction"]
    assert got["aborted"] is True, got
    assert got["lso"] == 2, got  # the open record, then the abort marker


def test_admin_describe_cluster_and_features(admin_steps):
    got = ok(admin_steps, "cluster")
    port = got["nodes"][0][2]
    assert got["nodes"] == [[0, "127.0.0.1", port]] and got["controller"] == 0
    assert got["cluster_id"].startswith("shmbroker-")
    features = ok(admin_steps, "features")
    # The node lists no feature (Kafka 4.4 lists metadata.version, group.version, transaction.version, ...): a
    # client takes transactions v1 (KIP-890's v2 needs transaction.version 2, which the node does not serve).
    assert features["finalized"] == {} and features["supported"] == {}, features
