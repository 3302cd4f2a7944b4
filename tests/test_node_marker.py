"""The markers `node` and `jvm` cannot be forgotten: a test without `node` that starts a NodeProcess fails, in its
process or in a script it runs, and so does one with neither marker that starts a JVM (tests/conftest.py); the
tests that use the node fixtures carry `node`, those that use the Spark session carry `jvm`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scripts.harness import kafka_peer
from scripts.harness.nodeproc import REPO_ROOT, NodeProcess


def test_a_node_started_without_the_marker_fails_the_test(tmp_path):
    node = NodeProcess(tmp_path)
    with pytest.raises(RuntimeError, match="without the marker `node`"):
        node.start()
    assert node.proc is None


def test_a_script_starting_a_node_without_the_marker_fails(tmp_path):
    done = subprocess.run([sys.executable, "-c", "from scripts.harness.nodeproc import NodeProcess; "
                           f"NodeProcess({str(tmp_path)!r}).start()"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "without the marker `node`" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "data").exists()


def test_a_jvm_started_without_a_marker_fails_the_test():
    with pytest.raises(RuntimeError, match="without the marker `jvm`"):
        kafka_peer.java()


@pytest.mark.jvm
def test_the_jvm_marker_lets_a_test_find_java():
    assert kafka_peer.java().endswith("/bin/java")


def test_the_node_fixtures_give_their_tests_the_marker(request, node_factory):
    assert request.node.get_closest_marker("node") is not None
    assert request.node.get_closest_marker("jvm") is None
