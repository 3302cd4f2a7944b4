"""Shared fixtures: real nodes as subprocesses, cleaned up by pid; nothing left in /dev/shm."""

from __future__ import annotations

import pytest

from scripts.harness.nodeproc import NodeProcess  # the one launcher of tests and benchmarks


@pytest.fixture
def node_factory(tmp_path):
    """Start nodes with `node_factory(workers=1, config="", ...)`; all are stopped after the test."""
    started: list[NodeProcess] = []

    def make(**kwargs) -> NodeProcess:
        node = NodeProcess(tmp_path, **kwargs)
        started.append(node)
        return node.start()

    yield make
    for node in started:
        if node.alive():
            node.stop()
    # A test that killed every process left the instance's shared memory behind on purpose;
    # a start of the same instance removes it, and the clean stop above unlinks it.
    for node in started:
        if node.leftovers():
            node.start()
            node.stop()
        assert node.leftovers() == []
        # No process of the node may have died of an exception, whatever the test did to it.
        assert "Traceback" not in node.log(), node.log()


@pytest.fixture
def node(node_factory):
    return node_factory(workers=1)
