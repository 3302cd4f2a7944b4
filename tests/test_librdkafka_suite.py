"""librdkafka's own tests that need Apache Kafka's command-line tools, in full mode, against one real node
(scripts/harness/librdkafka_suite.py: librdkafka's test-runner built from its source, KAFKA_PATH's bin/kafka-*.sh
running Kafka 4.4's tools on the fetched classpath):

- 0052 msg_timestamps: topics with message.timestamp.type CreateTime/LogAppendTime made by kafka-topics.sh.
- 0077 compaction: a compacted topic made by kafka-topics.sh, compacted while the test waits.
- 0103 transactions: topics of replication factor 3 (the node's accept_replication_factor_above_one takes them).
- 0109 auto_create_topics, 0115 producer_auth, 0119 consumer_auth: ACLs added with kafka-acls.sh for User:*
  (the authorizer on, open where no ACL is found: no super user, so the deny ACLs hold for everyone).

A test passes when the test-runner exits 0 and its report has the test (and its _local part) PASSED.
"""

from __future__ import annotations

import pytest

from scripts.harness.librdkafka_suite import KafkaTools, run_tests
from scripts.harness.nodeproc import NodeProcess

pytestmark = pytest.mark.node

TIMEOUT_S = 600.0
CONFIG = """
[topics]
accept_replication_factor_above_one = true

[authorizer]
enabled = true
allow_everyone_if_no_acl_found = true
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(tmp_path_factory.mktemp("librdkafka-suite"), workers=2, config=CONFIG) as started:
        yield started


@pytest.fixture(scope="module")
def kafka_tools(tmp_path_factory):
    return KafkaTools(tmp_path_factory.mktemp("kafka-path"))


@pytest.mark.parametrize("test_id", ["0052", "0077", "0103", "0109", "0115", "0119"])
def test_librdkafka_test_passes_against_the_node(node, kafka_tools, tmp_path, test_id):
    done = run_tests(test_id, node.bootstrap, tmp_path / "run", TIMEOUT_S, kafka_tools)
    summary = done.output[-8000:]
    assert done.returncode == 0, f"test-runner TESTS={test_id} exited {done.returncode}:\n{summary}"
    ran = done.states_of(test_id)
    assert ran and set(ran.values()) == {"PASSED"}, (ran, summary)
    assert "FAILED" not in done.states.values(), (done.states, summary)
