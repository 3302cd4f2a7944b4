"""The marker `node` cannot be forgotten: a test without it that starts a NodeProcess fails (tests/conftest.py),
and the tests that use the node fixtures carry it."""

from __future__ import annotations

import pytest

from scripts.harness.nodeproc import NodeProcess


def test_a_node_started_without_the_marker_fails_the_test(tmp_path):
    node = NodeProcess(tmp_path)
    with pytest.raises(pytest.fail.Exception, match="without the marker `node`"):
        node.start()
    assert node.proc is None


def test_the_node_fixtures_give_their_tests_the_marker(request, node_factory):
    assert request.node.get_closest_marker("node") is not None
