"""@platformatic/kafka (a current Node.js client that speaks only Kafka 3.5+'s versions: Metadata v9+, CreateTopics
v7+, Fetch v12+, ...) against a real node: its Admin creates, lists (with topic ids) and deletes topics, its
idempotent Producer sends (InitProducerId v3+), two Consumers of one group read everything (tests/frameworks/platformatic_kafka.mjs).

The package comes from the npm registry (tests/frameworks/npm.py); its 2.x needs Node.js 22.22+, so an older
Node.js gets the newest 1.x, which speaks the same protocol versions."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from scripts.harness import rawkafka as R
from tests.frameworks.npm import NODE_MISSING, have_node, node_modules, node_version

SCRIPT = Path(__file__).resolve().parent / "frameworks" / "platformatic_kafka.mjs"
NEWEST_NODE_OF_1X = (22, 22, 0)  # @platformatic/kafka 2.x's engines: node >= 22.22.0
RUN_TIMEOUT_S = 120
RECORDS = 300
GROUP_CONFIG = "[groups]\ninitial_rebalance_delay_ms = 0\n"


def platformatic_kafka() -> Path:
    package = "@platformatic/kafka@^2.12.1" if node_version() >= NEWEST_NODE_OF_1X else "@platformatic/kafka@^1.35.0"
    return node_modules("platformatic-kafka", package)


@pytest.mark.skipif(not have_node(), reason=NODE_MISSING)
def test_platformatic_kafka_admin_produce_and_group_consume(node_factory) -> None:
    modules = platformatic_kafka()
    node = node_factory(workers=2, config=GROUP_CONFIG)
    done = subprocess.run(["node", str(SCRIPT), node.bootstrap, "plt", "plt-group", str(RECORDS)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env={**os.environ, "NODE_PATH": str(modules)})
    assert done.returncode == 0, done.stderr[-5000:] + node.log(5000)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["created"] == ["plt", "plt-gone"]
    assert seen["afterDelete"] == ["plt"]
    ids = R.topic_ids("127.0.0.1", node.port, ["plt"])
    assert seen["topicIds"]["plt"] == str(ids["plt"])
    assert seen["topicIds"]["plt-gone"] not in ("", "00000000-0000-0000-0000-000000000000", str(ids["plt"]))
    consumed = [value for values in seen["consumed"].values() for value in values]
    assert set(consumed) == {f"v{i}" for i in range(RECORDS)}  # a rebalance may hand a record out twice, none lost
    assert "group plt-group: generation 2 with 2 members" in node.log()  # both consumers joined the group
