"""librdkafka's own tests that need Apache Kafka's command-line tools, in full mode, against one real node
(scripts/harness/librdkafka_suite.py: librdkafka's test-runner built from its source, KAFKA_PATH's bin/kafka-*.sh
running Kafka 4.4's tools on the fetched classpath):

- 0052 msg_timestamps: topics with message.timestamp.type CreateTime/LogAppendTime made by kafka-topics.sh.
- 0077 compaction: a compacted topic made by kafka-topics.sh, compacted while the test waits.
- 0103 transactions: topics of replication factor 3 (the node's accept_replication_factor_above_one takes them).
- 0109 auto_create_topics, 0115 producer_auth, 0119 consumer_auth: ACLs added with kafka-acls.sh for User:*
  (the authorizer on, open where no ACL is found: no super user, so the deny ACLs hold for everyone).

Each runs under both consumer group protocols, classic and KIP-848's: one test-runner per protocol, both at once,
each running the six side by side; a test passes when its runner's report has it (and its _local part) PASSED.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from scripts.harness.librdkafka_suite import KafkaTools, SuiteRun, run_tests
from scripts.harness.nodeproc import NodeProcess

pytestmark = pytest.mark.node

TEST_IDS = ("0052", "0077", "0103", "0109", "0115", "0119")
PROTOCOLS = ("classic", "consumer")  # the consumers' group.protocol (KIP-848's is "consumer")
TIMEOUT_S = 600.0
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
# No initial rebalance delay: each new classic group's first join waited 3 s (0077 joins four groups, one
# after another); none of the six tests measures or relies on the delay. The cleaner at normal priority, as
# Kafka's cleaner threads run: 0077 gives compaction 20 s, and the node's default SCHED_IDLE cleaner gets no CPU
# while the suite's other jobs keep both cores busy (both runners failed so in a clean clone's `make test`).
CONFIG = """
[groups]
initial_rebalance_delay_ms = 0

[topics]
accept_replication_factor_above_one = true

[authorizer]
enabled = true
allow_everyone_if_no_acl_found = true

[cleaner]
scheduling = "normal"
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(tmp_path_factory.mktemp("librdkafka-suite"), workers=2, config=CONFIG) as started:
        yield started


@pytest.fixture(scope="module")
def suites(node, tmp_path_factory) -> dict[str, SuiteRun]:
    """Two test-runners at once, one per consumer group protocol (TEST_CONSUMER_GROUP_PROTOCOL), each running the
    six side by side on topics of its own: 130-150 s in all, where the six one after another took 340 s for one
    protocol (mostly their own fixed waits: 0077 waits 20-30 s for the cleaner at each of its four topics)."""
    kafka_tools = KafkaTools(tmp_path_factory.mktemp("kafka-path"))

    def run(protocol: str) -> SuiteRun:
        work = tmp_path_factory.mktemp(f"librdkafka-suite-{protocol}")
        return run_tests(",".join(TEST_IDS), node.bootstrap, work, TIMEOUT_S, kafka_tools,
                         extra_env={"TEST_CONSUMER_GROUP_PROTOCOL": protocol})

    with ThreadPoolExecutor(len(PROTOCOLS)) as pool:
        return dict(zip(PROTOCOLS, pool.map(run, PROTOCOLS)))


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("test_id", TEST_IDS)
def test_librdkafka_test_passes_against_the_node(suites, test_id, protocol):
    suite = suites[protocol]
    ran = suite.states_of(test_id)
    lines = "\n".join(line for line in ANSI_COLOUR.sub("", suite.output).splitlines()
                      if line.startswith(f"[{test_id}_"))
    assert ran and set(ran.values()) == {"PASSED"}, (
        f"test-runner exited {suite.returncode}, {ran}:\n{lines[-6000:] or suite.output[-6000:]}")
