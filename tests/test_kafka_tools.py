"""Apache Kafka 4.4.0's own command-line tools against the node, each run as its `kafka-*.sh` runs it: the
tool's main class on the classpath Maven fetched (scripts/harness/kafka_peer.py), a real node with 2 workers. The
tools run one after another in one JVM (kafka_peer.ToolRunner, as Kafka's own tests run them: a JVM start per run
cost 2-4 s on two cores); a tool that reads standard input runs in a JVM of its own.

Client quotas are the node's config: `kafka-configs` describes them, and its --alter on them is refused; it sets
and describes a streams group's configs (KIP-1071's streams.* on the GROUP resource).
`kafka-acls` runs against a second node, with the authorizer on and users on a SASL listener: what each change
lets a user do is checked on that node.
`kafka-streams-groups` lists, describes (members, tasks, offsets) and deletes a streams group (KIP-1071);
`kafka-share-groups` lists and describes a share group (KIP-932).
"""

from __future__ import annotations

import json
import re
import time

import pytest
from confluent_kafka import Consumer, Producer, ShareConsumer, TopicPartition

from scripts.harness import rawkafka as R
from scripts.harness.kafka_peer import ToolRunner, tool
from scripts.harness.nodeproc import NodeProcess
from shmbroker.node.storage import records
from tests.test_authorizer_groups import GROUP_DENIED, SecuredNode, commit_body
from tests.test_authorizer_topics import TOPIC_DENIED, TXN_DENIED, fetch_errors, produce_errors
from tests.test_security_sasl import PASSWORD

pytestmark = pytest.mark.node

TOOLS = "org.apache.kafka.tools."
TIMEOUT_S = 120
RECORDS = 20


# One client id with quotas, far above what the tests send: what kafka-configs describes. A classic group's first
# member joins at once (Kafka's tests set group.initial.rebalance.delay.ms=0 too): kafka-verifiable-consumer joins
# twice. Streams groups assign at once too: kafka-streams-groups describes the tasks.
QUOTAS = """
[quotas.clients."cli-quota"]
producer_byte_rate = 1048576
consumer_byte_rate = 2097152

[groups]
initial_rebalance_delay_ms = 0
streams_initial_rebalance_delay_ms = 0
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(tmp_path_factory.mktemp("tools"), workers=2, config=QUOTAS) as started:
        yield started


@pytest.fixture(scope="module")
def tools():
    with ToolRunner() as runner:
        yield runner


def run(tools: ToolRunner, main_class: str, node: NodeProcess, *args: str, stdin: str | None = None) -> str:
    """The tool's output; AssertionError with it when the tool exits non-zero. Run in the module's tool runner, or
    in a JVM of its own for a tool that reads `stdin`."""
    command = ["--bootstrap-server", node.bootstrap, *args]
    if stdin is None:
        done = tools.run(TOOLS + main_class, *command, check=False, timeout=TIMEOUT_S)
    else:
        done = tool(TOOLS + main_class, *command, check=False, timeout=TIMEOUT_S, stdin=stdin)
    assert done.returncode == 0, f"{main_class} {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


def produce(node: NodeProcess, topic: str, count: int, partitions: int = 2) -> None:
    producer = Producer({"bootstrap.servers": node.bootstrap})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % partitions)
    assert producer.flush(TIMEOUT_S) == 0


def test_kafka_topics_creates_describes_alters_and_deletes(tools, node):
    assert run(tools, "TopicCommand", node, "--create", "--topic", "cli-topics", "--partitions", "3",
               "--replication-factor", "1", "--config", "retention.ms=3600000").strip() == "Created topic cli-topics."
    assert "cli-topics" in run(tools, "TopicCommand", node, "--list").split()
    described = run(tools, "TopicCommand", node, "--describe", "--topic", "cli-topics")
    assert re.search(r"PartitionCount: 3\tReplicationFactor: 1\tConfigs: retention.ms=3600000", described), described
    assert described.count("Leader: 0\tReplicas: 0\tIsr: 0") == 3, described
    run(tools, "TopicCommand", node, "--alter", "--topic", "cli-topics", "--partitions", "5")
    assert "PartitionCount: 5" in run(tools, "TopicCommand", node, "--describe", "--topic", "cli-topics")
    run(tools, "TopicCommand", node, "--delete", "--topic", "cli-topics")
    assert "cli-topics" not in run(tools, "TopicCommand", node, "--list").split()


def kafka_configs(tools: ToolRunner, node: NodeProcess, entity: str, *args: str) -> str:
    """kafka-configs on one entity ("topics cli-configs", "brokers" for the broker default): its output."""
    kind, *name = entity.split()
    return run(tools, "ConfigCommand", node, "--entity-type", kind,
               *(["--entity-name", name[0]] if name else ["--entity-default"]), *args)


def test_kafka_configs_alters_and_describes_a_topic_and_shows_the_broker(tools, node):
    run(tools, "TopicCommand", node, "--create", "--topic", "cli-configs", "--partitions", "1")
    topic = "topics cli-configs"
    kafka_configs(tools, node, topic, "--alter", "--add-config", "retention.ms=1000,cleanup.policy=[compact,delete]")
    described = kafka_configs(tools, node, topic, "--describe")
    assert "retention.ms=1000 sensitive=false" in described, described
    assert "cleanup.policy=compact,delete sensitive=false" in described, described
    kafka_configs(tools, node, topic, "--alter", "--delete-config", "retention.ms")
    described = kafka_configs(tools, node, topic, "--describe")
    assert "retention.ms" not in described, described
    kafka_configs(tools, node, "brokers", "--alter", "--add-config", "log.retention.ms=7200000")
    assert "log.retention.ms=7200000" in kafka_configs(tools, node, "brokers", "--describe")
    kafka_configs(tools, node, "brokers", "--alter", "--delete-config", "log.retention.ms")
    # A user's SCRAM credential (AlterUserScramCredentials).
    assert "Completed updating config for user alice" in kafka_configs(
        tools, node, "users alice", "--alter", "--add-config", "SCRAM-SHA-256=[iterations=8192,password=alice-secret]")
    # A streams group's own configs (KIP-1071's GROUP resource), before the group exists; out of bounds refused.
    group = "groups cli-streams"
    kafka_configs(tools, node, group, "--alter", "--add-config",
                  "streams.num.standby.replicas=1,streams.session.timeout.ms=50000")
    described = kafka_configs(tools, node, group, "--describe")
    assert "streams.num.standby.replicas=1 sensitive=false" in described, described
    assert "streams.session.timeout.ms=50000 sensitive=false" in described, described
    refused = tools.run(TOOLS + "ConfigCommand", "--bootstrap-server", node.bootstrap, "--entity-type", "groups",
                        "--entity-name", "cli-streams", "--alter", "--add-config", "streams.num.standby.replicas=3",
                        check=False, timeout=TIMEOUT_S)
    assert refused.returncode != 0 and "less than or equal to 2" in refused.stdout + refused.stderr, refused


def test_kafka_consumer_groups_lists_describes_resets_and_deletes(tools, node):
    run(tools, "TopicCommand", node, "--create", "--topic", "cli-groups", "--partitions", "2")
    produce(node, "cli-groups", RECORDS)
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "cli-group", "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition("cli-groups", 0, 2), TopicPartition("cli-groups", 1, 3)],
                    asynchronous=False)
    consumer.close()
    assert "cli-group" in run(tools, "consumer.group.ConsumerGroupCommand", node, "--list").split()
    described = run(tools, "consumer.group.ConsumerGroupCommand", node, "--describe", "--group", "cli-group")
    lags = [int(line.split()[5]) for line in described.splitlines() if line.startswith("cli-group ")]
    assert sorted(lags) == [RECORDS // 2 - 3, RECORDS // 2 - 2], described
    for how in (["--to-earliest"], ["--to-latest"], ["--to-offset", "3"], ["--shift-by", "-1"],
                ["--to-datetime", "2000-01-01T00:00:00.000"], ["--by-duration", "PT1H"]):
        run(tools, "consumer.group.ConsumerGroupCommand", node, "--reset-offsets", "--group", "cli-group", "--topic",
            "cli-groups", *how, "--execute")
    after = run(tools, "consumer.group.ConsumerGroupCommand", node, "--describe", "--group", "cli-group")
    assert [int(line.split()[3]) for line in after.splitlines() if line.startswith("cli-group ")] == [0, 0], after
    run(tools, "consumer.group.ConsumerGroupCommand", node, "--delete", "--group", "cli-group")
    assert "cli-group" not in run(tools, "consumer.group.ConsumerGroupCommand", node, "--list").split()


def test_kafka_get_offsets_and_delete_records(tools, node, tmp_path):
    run(tools, "TopicCommand", node, "--create", "--topic", "cli-offsets", "--partitions", "2")
    produce(node, "cli-offsets", RECORDS)
    assert sorted(run(tools, "GetOffsetShell", node, "--topic", "cli-offsets").split()) == [
        f"cli-offsets:0:{RECORDS // 2}", f"cli-offsets:1:{RECORDS // 2}"]
    plan = tmp_path / "delete.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": "cli-offsets", "partition": 0, "offset": 4}]}))
    assert "partition: cli-offsets-0\tlow_watermark: 4" in run(tools, "DeleteRecordsCommand", node,
                                                                "--offset-json-file", str(plan))
    earliest = run(tools, "GetOffsetShell", node, "--topic", "cli-offsets", "--time", "-2").split()
    assert sorted(earliest) == ["cli-offsets:0:4", "cli-offsets:1:0"]


def test_kafka_console_producer_and_consumer_round_trip(tools, node):
    run(tools, "TopicCommand", node, "--create", "--topic", "cli-console", "--partitions", "1")
    lines = "".join(f"key-{i}:line {i}\n" for i in range(5))
    run(tools, "ConsoleProducer", node, "--topic", "cli-console", "--reader-property", "parse.key=true",
        "--reader-property", "key.separator=:", stdin=lines)
    got = run(tools, "consumer.ConsoleConsumer", node, "--topic", "cli-console", "--from-beginning",
              "--max-messages", "5", "--formatter-property", "print.key=true", "--formatter-property", "key.separator=:",
              "--timeout-ms", "30000")
    assert got == lines


def test_kafka_streams_groups_lists_describes_and_deletes_a_streams_group(tools, node):
    from tests.test_clients import create_topic
    from tests.test_streams_groups_protocol import StreamsMember, word_count

    create_topic(node.bootstrap, "cli-streams-in", 2)
    member = StreamsMember(node.port, "cli-streams-app", "m-1", topology=word_count("cli-streams-app",
                                                                                   source="cli-streams-in"))
    try:
        assert member.heartbeat().error_code == 0
        command = "streams.StreamsGroupCommand"
        assert "cli-streams-app" in run(tools, command, node, "--list").split()
        members = run(tools, command, node, "--describe", "--group", "cli-streams-app", "--members", "--verbose")
        row = next(line.split() for line in members.splitlines() if line.startswith("cli-streams-app"))
        assert row[3:7] == ["m-1", "streams", str(member.epoch), "process-m-1"], members
        assert "ACTIVE: 0:[0,1]; 1:[0,1];" in members, members
        offsets = run(tools, command, node, "--describe", "--group", "cli-streams-app", "--offsets")
        assert {tuple(line.split()[1:3]) for line in offsets.splitlines()[1:] if line.strip()} == {
            (topic, str(p)) for topic in ("cli-streams-in", "cli-streams-app-counts-repartition") for p in (0, 1)}
        assert member.heartbeat(epoch=-1).error_code == 0
    finally:
        member.close()
    assert "was successful" in run(tools, command, node, "--delete", "--group", "cli-streams-app")
    assert "cli-streams-app" not in run(tools, command, node, "--list").split()


def test_kafka_broker_api_versions_and_transactions_list(tools, node):
    versions = run(tools, "BrokerApiVersionsCommand", node)
    assert re.search(r"Produce\(0\): 3 to 11 \[usable: 11\]", versions), versions
    assert "ShareFetch(78): 1 to 2 [usable: 2]" in versions
    assert "AlterShareGroupOffsets(91): 0 [usable: 0]" in versions
    assert "StreamsGroupTopologyDescriptionUpdate(93): UNSUPPORTED" in versions
    assert run(tools, "TransactionsCommand", node, "list").split()[:4] == ["TransactionalId", "Coordinator",
                                                                            "ProducerId", "TransactionState"]


def test_kafka_share_groups_lists_and_describes_a_share_group(tools, node):
    """kafka-share-groups (KIP-932): --list, --describe (each share-partition's start offset and lag),
    --describe --members of a share group a ShareConsumer read from; once it is empty, --reset-offsets and
    --delete-offsets."""
    run(tools, "TopicCommand", node, "--create", "--topic", "cli-share", "--partitions", "1")
    consumer = ShareConsumer({"bootstrap.servers": node.bootstrap, "group.id": "cli-share-group",
                              "client.id": "cli-sharer"})
    consumer.subscribe(["cli-share"])
    try:
        consumer.poll(1.0)  # joined: the share-partition starts at the end (share.auto.offset.reset latest)
        produce(node, "cli-share", 5, partitions=1)
        got, deadline = 0, time.monotonic() + TIMEOUT_S
        while got < 5 and time.monotonic() < deadline:
            got += sum(1 for m in consumer.poll(0.5) if m.error() is None)
        assert got == 5
        consumer.poll(0.5)  # acknowledges them (implicit mode)
        command = "consumer.group.ShareGroupCommand"
        assert "cli-share-group" in run(tools, command, node, "--list").split()
        described = run(tools, command, node, "--describe", "--group", "cli-share-group")
        rows = [line.split() for line in described.splitlines() if line.startswith("cli-share-group ")]
        assert [row[1:5] for row in rows] == [["cli-share", "0", "5", "0"]], described
        members = run(tools, command, node, "--describe", "--group", "cli-share-group", "--members")
        assert "cli-sharer" in members and "cli-share:0" in members, members
    finally:
        consumer.close()
    run(tools, command, node, "--reset-offsets", "--group", "cli-share-group", "--topic", "cli-share", "--to-earliest",
        "--execute")
    described = run(tools, command, node, "--describe", "--group", "cli-share-group")
    rows = [line.split() for line in described.splitlines() if line.startswith("cli-share-group ")]
    assert [row[1:5] for row in rows] == [["cli-share", "0", "0", "5"]], described
    run(tools, command, node, "--delete-offsets", "--group", "cli-share-group", "--topic", "cli-share")
    described = run(tools, command, node, "--describe", "--group", "cli-share-group")
    assert not [line for line in described.splitlines() if line.startswith("cli-share-group cli-share ")], described


def test_kafka_metadata_quorum_describes_the_node_as_its_one_voter(tools, node):
    status = run(tools, "MetadataQuorumCommand", node, "describe", "--status")
    fields = {key: value.strip() for key, value in (line.split(": ", 1) for line in status.splitlines() if ": " in line)}
    assert (fields["LeaderId"], fields["LeaderEpoch"], fields["MaxFollowerLag"]) == ("0", "1", "0"), status
    assert int(fields["HighWatermark"]) >= 1 and fields["CurrentObservers"] == "[]", status
    (voter,) = json.loads(fields["CurrentVoters"])
    assert voter["id"] == 0 and voter["endpoints"] == [f"PLAINTEXT://{node.bootstrap}"], status
    replication = run(tools, "MetadataQuorumCommand", node, "describe", "--replication").splitlines()
    assert replication[0].split() == ["NodeId", "DirectoryId", "LogEndOffset", "Lag", "LastFetchTimestamp",
                                      "LastCaughtUpTimestamp", "Status"], replication
    (row,) = replication[1:]
    assert row.split()[0] == "0" and row.split()[3] == "0" and row.split()[-1] == "Leader", replication


def test_kafka_configs_describes_client_quotas_and_users(tools, node):
    described = run(tools, "ConfigCommand", node, "--entity-type", "clients", "--entity-name", "cli-quota",
                    "--describe")
    assert "producer_byte_rate=1048576.0" in described and "consumer_byte_rate=2097152.0" in described, described
    assert run(tools, "ConfigCommand", node, "--entity-type", "clients", "--describe") == described
    assert run(tools, "ConfigCommand", node, "--entity-type", "clients", "--entity-name", "nobody", "--describe") == ""
    run(tools, "ConfigCommand", node, "--entity-type", "users", "--entity-name", "bob", "--alter", "--add-config",
        "SCRAM-SHA-512=[iterations=8192,password=bob-secret]")
    user = run(tools, "ConfigCommand", node, "--entity-type", "users", "--entity-name", "bob", "--describe")
    assert "SCRAM-SHA-512=iterations=8192" in user and "Quota configs" not in user, user  # no user quotas
    # Quotas change in the node's config (and a SIGHUP), not through the API: the tool says the node lacks it.
    refused = tools.run(TOOLS + "ConfigCommand", "--bootstrap-server", node.bootstrap, "--entity-type", "clients",
                        "--entity-name", "cli-quota", "--alter", "--add-config", "producer_byte_rate=1024",
                        check=False, timeout=TIMEOUT_S)
    assert refused.returncode != 0 and "UnsupportedVersionException" in refused.stdout + refused.stderr, refused


def test_kafka_transactions_finds_and_aborts_a_hanging_transaction(tools, node):
    """KIP-664: a transactional batch of a producer the coordinator has no state for (as left by a client that wrote
    to a partition it never added, or whose coordinator state is gone) opens a transaction no marker of the
    coordinator will close; read_committed readers stop at it. `kafka-transactions find-hanging` names it (open
    longer than the longest transaction may last), `abort` closes it with WriteTxnMarkers, and a read_committed
    consumer then reads past it."""
    topic, producer_id = "cli-hanging", 424242
    run(tools, "TopicCommand", node, "--create", "--topic", topic, "--partitions", "1")
    an_hour_ago = int(time.time() * 1000) - 3_600_000
    hanging = records.build_batch([(b"h%d" % i, b"hanging %d" % i) for i in range(2)], an_hour_ago,
                                  producer_id=producer_id, producer_epoch=3, base_sequence=0, transactional=True)
    with R.RawConnection("127.0.0.1", node.port, timeout_s=20) as conn:
        answer = conn.call(0, 8, R.produce_body({topic: {0: hanging}}, acks=-1))
        assert answer.responses[0].partition_responses[0].error_code == 0, answer
    produce(node, topic, RECORDS // 2, partitions=1)  # offsets 2..11, past the open transaction

    found = run(tools, "TransactionsCommand", node, "find-hanging", "--topic", topic).splitlines()
    assert found[0].split()[:4] == ["Topic", "Partition", "ProducerId", "ProducerEpoch"], found
    # The producer's epoch, no coordinator epoch (-1), the first offset, open for an hour (its last timestamp).
    assert [line.split()[:6] + line.split()[7:8] for line in found[1:]] == [
        [topic, "0", str(producer_id), "3", "-1", "0", "60"]], found

    aborted = run(tools, "TransactionsCommand", node, "abort", "--topic", topic, "--partition", "0",
                  "--start-offset", "0")
    assert aborted.strip() == "", aborted  # the tool says nothing when the abort is done
    assert run(tools, "TransactionsCommand", node, "find-hanging", "--topic", topic).splitlines()[1:] == []

    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "cli-hanging-reader",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < RECORDS // 2 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                got.append((message.offset(), message.value()))
    finally:
        consumer.close()
    # The aborted records (offsets 0-1) are skipped, every other one read (the marker, at 12, is the node's).
    assert got == [(2 + i, b"v%d" % i) for i in range(RECORDS // 2)], got


# --------------------------------------------------------------------------- kafka-acls


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A node with the authorizer on: users admin (a super user), alice and bob on a SASL_PLAINTEXT listener."""
    with SecuredNode(tmp_path_factory.mktemp("tools-acls")) as node:
        yield node


def acls(tools: ToolRunner, secured: SecuredNode, admin_config, *args: str) -> str:
    """kafka-acls as the super user admin (its SASL login in --command-config); its output."""
    done = tools.run(TOOLS + "AclCommand", "--bootstrap-server", f"127.0.0.1:{secured.sasl_port}",
                     "--command-config", str(admin_config), *args, check=False, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"AclCommand {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


ACL_RESOURCE = re.compile(r"ResourcePattern\(resourceType=(\w+), name=(\S+), patternType=(\w+)\)`:")
ACL_ENTRY = re.compile(r"\(principal=(\S+), host=(\S+), operation=(\w+), permissionType=(\w+)\)")


def listed(output: str) -> set[tuple[str, ...]]:
    """The ACLs kafka-acls --list printed: (resource type, name, pattern type, principal, operation, permission)."""
    found, resource = set(), None
    for line in output.splitlines():
        if (head := ACL_RESOURCE.search(line)) is not None:
            resource = head.groups()
        elif (entry := ACL_ENTRY.search(line)) is not None:
            assert resource is not None, output
            principal, _host, operation, permission = entry.groups()
            found.add((*resource, principal, operation, permission))
    return found


def test_kafka_acls_adds_lists_and_removes_what_the_node_then_enforces(tools, secured, tmp_path):
    """Each change kafka-acls makes is checked by what a client of that principal may then do on the node (raw
    requests logged in as alice or bob), not only by what the tool prints."""
    admin_config = tmp_path / "admin.properties"
    admin_config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.jaas.config="
                            "org.apache.kafka.common.security.plain.PlainLoginModule required "
                            f'username="admin" password="{PASSWORD}";\n')
    secured.topic("acl.orders")
    with secured.login("alice") as alice, secured.login("bob") as bob:
        assert produce_errors(alice, "acl.orders") == [TOPIC_DENIED]

        # Operations for a principal on a literal topic.
        acls(tools, secured, admin_config, "--add", "--allow-principal", "User:alice", "--operation", "Write",
             "--operation", "Describe", "--topic", "acl.orders")
        assert produce_errors(alice, "acl.orders") == [0]
        assert fetch_errors(alice, "acl.orders") == [TOPIC_DENIED]  # WRITE is not READ
        assert produce_errors(bob, "acl.orders") == [TOPIC_DENIED]

        # --consumer on prefixed patterns: READ and DESCRIBE on topics acl.*, READ on groups acl.readers*.
        acls(tools, secured, admin_config, "--add", "--consumer", "--allow-principal", "User:bob", "--topic", "acl.",
             "--group", "acl.readers", "--resource-pattern-type", "prefixed")
        assert fetch_errors(bob, "acl.orders") == [0]
        assert produce_errors(bob, "acl.orders") == [TOPIC_DENIED]
        committed = bob.call(8, 8, commit_body("acl.readers-1", {("acl.orders", 0): 1}))
        assert [p.error_code for t in committed.topics for p in t.partitions] == [0]
        refused = bob.call(8, 8, commit_body("other-group", {("acl.orders", 0): 1}))
        assert [p.error_code for t in refused.topics for p in t.partitions] == [GROUP_DENIED]

        # --producer with a transactional id: WRITE, DESCRIBE, CREATE on the topic, WRITE on the id.
        assert produce_errors(bob, "acl.orders", transactional_id="acl.tx") == [TXN_DENIED]
        acls(tools, secured, admin_config, "--add", "--producer", "--allow-principal", "User:bob", "--topic",
             "acl.orders", "--transactional-id", "acl.tx")
        assert produce_errors(bob, "acl.orders") == [0]
        assert produce_errors(bob, "acl.orders", transactional_id="acl.tx") == [0]
        assert produce_errors(bob, "acl.orders", transactional_id="acl.other") == [TXN_DENIED]

        # A deny wins over the prefixed allow.
        acls(tools, secured, admin_config, "--add", "--deny-principal", "User:bob", "--operation", "Read", "--topic",
             "acl.orders")
        assert fetch_errors(bob, "acl.orders") == [TOPIC_DENIED]

        literal = {("TOPIC", "acl.orders", "LITERAL", "User:alice", "WRITE", "ALLOW"),
                   ("TOPIC", "acl.orders", "LITERAL", "User:alice", "DESCRIBE", "ALLOW"),
                   ("TOPIC", "acl.orders", "LITERAL", "User:bob", "WRITE", "ALLOW"),
                   ("TOPIC", "acl.orders", "LITERAL", "User:bob", "DESCRIBE", "ALLOW"),
                   ("TOPIC", "acl.orders", "LITERAL", "User:bob", "CREATE", "ALLOW"),
                   ("TOPIC", "acl.orders", "LITERAL", "User:bob", "READ", "DENY")}
        prefixed_topic = {("TOPIC", "acl.", "PREFIXED", "User:bob", "READ", "ALLOW"),
                          ("TOPIC", "acl.", "PREFIXED", "User:bob", "DESCRIBE", "ALLOW")}
        group = {("GROUP", "acl.readers", "PREFIXED", "User:bob", "READ", "ALLOW")}
        transactional = {("TRANSACTIONAL_ID", "acl.tx", "LITERAL", "User:bob", "WRITE", "ALLOW"),
                         ("TRANSACTIONAL_ID", "acl.tx", "LITERAL", "User:bob", "DESCRIBE", "ALLOW")}
        assert listed(acls(tools, secured, admin_config, "--list", "--topic", "acl.orders")) == literal
        assert listed(acls(tools, secured, admin_config, "--list", "--topic", "acl.",
                           "--resource-pattern-type", "prefixed")) == prefixed_topic
        # MATCH: every ACL that applies to the topic, whatever its pattern.
        assert listed(acls(tools, secured, admin_config, "--list", "--topic", "acl.orders",
                           "--resource-pattern-type", "match")) == literal | prefixed_topic
        by_bob = listed(acls(tools, secured, admin_config, "--list", "--principal", "User:bob"))
        assert by_bob == {acl for acl in literal | prefixed_topic | group | transactional if acl[3] == "User:bob"}

        # Remove one operation, then all of a resource's.
        acls(tools, secured, admin_config, "--remove", "--force", "--allow-principal", "User:alice", "--operation",
             "Write", "--topic", "acl.orders")
        assert produce_errors(alice, "acl.orders") == [TOPIC_DENIED]
        assert produce_errors(bob, "acl.orders") == [0]
        acls(tools, secured, admin_config, "--remove", "--force", "--topic", "acl.orders")
        assert listed(acls(tools, secured, admin_config, "--list", "--topic", "acl.orders")) == set()
        assert produce_errors(bob, "acl.orders") == [TOPIC_DENIED]
        assert fetch_errors(bob, "acl.orders") == [0]  # the prefixed allow, the deny gone
        acls(tools, secured, admin_config, "--remove", "--force", "--topic", "acl.", "--resource-pattern-type",
             "prefixed")
        assert fetch_errors(bob, "acl.orders") == [TOPIC_DENIED]
        assert listed(acls(tools, secured, admin_config, "--list")) == group | transactional


# --------------------------------------------------------------------------- kafka-verifiable-producer/-consumer


def events(output: str) -> list[dict]:
    """The JSON events a verifiable tool printed, in order (a client's own log lines are left out)."""
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def named(printed: list[dict], name: str) -> list[dict]:
    return [event for event in printed if event["name"] == name]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_kafka_verifiable_producer_and_consumer_agree_with_the_node(tools, node, protocol):
    """kafka-verifiable-producer's acked records are the records two kafka-verifiable-consumers of one group read,
    one after the other (the second from the offsets the first committed: none read twice, none missed); each
    consumer's partitions_assigned and offsets_committed events agree with the node's committed offsets."""
    topic, group, partitions, total, first = f"cli-verifiable-{protocol}", f"cli-verifiable-{protocol}", 3, 300, 170
    run(tools, "TopicCommand", node, "--create", "--topic", topic, "--partitions", str(partitions))
    produced = events(run(tools, "VerifiableProducer", node, "--topic", topic, "--max-messages", str(total),
                          "--acks", "-1"))
    acked = {(e["partition"], e["offset"], e["value"]) for e in named(produced, "producer_send_success")}
    (summary,) = named(produced, "tool_data")
    assert (summary["sent"], summary["acked"], len(acked)) == (total, total, total), summary
    assert named(produced, "producer_send_error") == []
    assert {value for _, _, value in acked} == {str(i) for i in range(total)}  # the tool's values: 0, 1, ...

    read: list[tuple[int, int, str]] = []
    for max_messages in (first, total - first):
        printed = events(run(tools, "VerifiableConsumer", node, "--topic", topic, "--group-id", group,
                             "--group-protocol", protocol, "--max-messages", str(max_messages), "--verbose"))
        names = [e["name"] for e in printed]
        assert names[0] == "startup_complete" and "shutdown_complete" in names, names
        assigned = [(p["topic"], p["partition"]) for e in named(printed, "partitions_assigned")
                    for p in e["partitions"]]
        assert sorted(assigned) == [(topic, p) for p in range(partitions)], printed  # alone in the group: all
        records = [(e["partition"], e["offset"], e["value"]) for e in named(printed, "record_data")]
        assert len(records) == max_messages
        consumed = named(printed, "records_consumed")
        assert sum(s["count"] for e in consumed for s in e["partitions"]) == max_messages
        commits = named(printed, "offsets_committed")
        assert commits and all(e["success"] for e in commits), commits
        last_commit = {}
        for commit in commits:
            last_commit.update({o["partition"]: o["offset"] for o in commit["offsets"]})
        # Each commit is of the offset after the last record read of its partition.
        for partition, offset in last_commit.items():
            assert offset == 1 + max(o for p, o, _ in read + records if p == partition), (partition, commits)
        assert committed(node, group, topic, partitions) == {
            p: last_commit.get(p, previous) for p, previous in committed_before(read, partitions).items()}
        read += records
    assert len(read) == total and set(read) == acked  # every acked record read, once


def committed_before(read: list[tuple[int, int, str]], partitions: int) -> dict[int, int | None]:
    """The offsets committed for the records `read` so far: past each partition's last one (None: none read)."""
    return {p: max((o + 1 for q, o, _ in read if q == p), default=None) for p in range(partitions)}


def committed(node: NodeProcess, group: str, topic: str, partitions: int) -> dict[int, int | None]:
    """The group's committed offsets, as the node answers OffsetFetch (None: none committed)."""
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        answer = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=TIMEOUT_S)
    finally:
        consumer.close()
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in answer}
