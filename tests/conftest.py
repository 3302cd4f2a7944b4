"""Shared fixtures: real nodes as subprocesses, cleaned up by pid; nothing left in /dev/shm (a module of
storage tests asks for that check with `pytestmark = pytest.mark.usefixtures("nothing_left_in_dev_shm")`);
librdkafka clients collected after each test of a module that asks (`librdkafka_clients_collected`); a fresh
partition table.

A test that measures time, CPU or rates tightly, or keeps both cores busy itself, carries the marker `serial`:
`make test` runs those alone, after the others ran TEST_JOBS (3) at a time.

A test that starts a real node carries the marker `node`, so `pytest -m "not node"` runs the others: the
`node` and `node_factory` fixtures give it to every test that uses them (at collection), and a test that
starts a node otherwise (a NodeProcess of its own, `shmbroker serve`, `make run`, a script that starts one)
is marked by hand (`pytestmark = pytest.mark.node`, or `@pytest.mark.node`). A test without the marker that
starts a NodeProcess fails, in its own process or in a script it runs. Likewise a test that starts a JVM (Spark,
Kafka, its tools, a Java program) and no node carries the marker `jvm` (the `spark` fixture gives it); `make
check` runs the tests marked neither.
"""

from __future__ import annotations

import gc
import os
import resource
import time

import pytest

from scripts.harness.nodeproc import REFUSE_NODES_ENV, NodeProcess  # the one launcher of tests and benchmarks
from scripts.harness.sparkjob import QUICK_JVMS_ENV, REFUSE_JVMS_ENV
from shmbroker.node.config import WATCH_ANSWERS_ENV
from tests.record_batches import SharedTable, dev_shm_entries

# Every node the tests start, whatever starts it, checks its answers (workers.api.answer_watch); NodeProcess fails
# the test whose node logged a breach. SHMBROKER_WATCH_ANSWERS=0 turns it off for a run.
os.environ.setdefault(WATCH_ANSWERS_ENV, "1")
# Kafka's JVMs (the peer, its tools) and the scripts' Spark drivers with C1 only: they start often here and run
# briefly on small loads, where C2's compiles cost more CPU than they save (test_kafka_peer: 19 s of CPU, 12 s with
# C1). The tests' own Spark session always starts so (tests/spark/conftest.py).
os.environ.setdefault(QUICK_JVMS_ENV, "1")

NODE_FIXTURES = {"node", "node_factory"}
JVM_FIXTURES = {"spark"}  # tests/spark/conftest.py: one Spark session for the run


# `make test` runs the tests in two parts: those marked `serial` alone, the others four at a time (pytest-xdist,
# --dist loadgroup), each file's tests in one worker, in order (but those of SPREAD_FILES). Files that share
# something run in one group.
SHARED_GROUPS = {
    "spark": "spark",  # one Spark session (a JVM on both cores) for them all
    "test_disk_full.py": "loop-mounts",  # loop devices and a machine-wide sync (tests/small_fs.py)
    "test_storage_faults.py": "loop-mounts",
}


# The groups that take longest, longest first (seconds of `pytest --durations=0` in a full run, summed by group;
# what is not here follows, in collection order). xdist hands groups to its workers in the order of the collection
# (`make test` turns off its reordering by test count): the longest going first, no worker is left with a long
# one when the others are done.
LONGEST_GROUPS_FIRST = (
    "test_ops_scripts",  # the load-test report beside Kafka and Redis: 350-420 s
    "spark",  # 300-350 s
    "test_librdkafka_suite",  # 140-150 s: librdkafka's tests side by side, mostly their own fixed waits
    "test_bench_scripts",
    "test_transactions",
    "test_stream_processors",
    "test_upgrade",
    "test_admin",
    "test_compaction",
    "test_connect",  # 90 s: Connect's worker started thrice, MirrorMaker twice, a Kafka
    "test_java_clients",  # 60 s: six JVM runs
    "test_kafka_streams",  # 75 s: ten runs of a Kafka Streams application, both rebalance protocols
    "test_streams_java",  # 45-55 s: Kafka Streams on the node, then Kafka 4.4 and Streams again
)


# Files of pure functions (no node, no files, no shared memory of their own) that would hold one worker for long:
# their tests are dealt in turn to this many groups, which any worker may take.
SPREAD_FILES = {"test_protocol.py": 4}


def _xdist_group(item: pytest.Item, index: int) -> str:
    """`index`: the item's place among its file's tests."""
    path = item.path
    lanes = SPREAD_FILES.get(path.name)
    if lanes:
        return f"{path.stem}-{index % lanes}"
    return SHARED_GROUPS.get(path.parent.name) or SHARED_GROUPS.get(path.name) or path.stem


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker, and before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    in_file: dict[object, int] = {}
    for item in items:
        if NODE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.node)
        if JVM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.jvm)
        if item.get_closest_marker("xdist_group") is None:
            index = in_file[item.path] = in_file.get(item.path, -1) + 1
            item.add_marker(pytest.mark.xdist_group(_xdist_group(item, index)))
    rank = {group: index for index, group in enumerate(LONGEST_GROUPS_FIRST)}
    items.sort(key=lambda item: rank.get(_group_of(item), len(rank)))  # stable: a file's tests keep their order


def pytest_collection_finish(session: pytest.Session) -> None:
    """In a worker of `--dist loadgroup`: every test's id names its group, as xdist groups by it; refuse to run
    otherwise (a pytest whose ids xdist cannot rewrite spread a file's tests over every worker, silently)."""
    if getattr(session.config.option, "loadgroup", False) and any("@" not in item.nodeid for item in session.items):
        raise pytest.UsageError("pytest-xdist's --dist loadgroup cannot group the tests with this pytest "
                                f"({pytest.__version__}): see the pin in pyproject.toml")


# SHMBROKER_TEST_CPU_LOG=<file>: each test's CPU seconds (this process and the children it waited for: its nodes,
# JVMs and clients) and wall seconds, set-up and teardown included, and the time it ended (Unix seconds), appended
# as "<cpu> <wall> <end> <id>" lines. On a CPU-bound machine the suite's time follows the CPU its tests take, which
# durations alone do not show; the end times show which tests hold the run's last minutes.
CPU_LOG = os.environ.get("SHMBROKER_TEST_CPU_LOG")


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not CPU_LOG:
        yield
        return
    cpu, wall = _cpu_seconds(), time.monotonic()
    yield
    with open(CPU_LOG, "a") as log:
        log.write(f"{_cpu_seconds() - cpu:.2f} {time.monotonic() - wall:.2f} {time.time():.1f} {item.nodeid}\n")


def _group_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return marker.args[0] if marker.args else marker.kwargs.get("name", "")


@pytest.fixture(autouse=True)
def _markers_required(request, monkeypatch):
    """A test that starts a node without the marker `node`, or a JVM without `node` or `jvm`, fails: in its
    own process or in a script it runs (the harness reads the variables)."""
    if request.node.get_closest_marker("node") is None:
        monkeypatch.setenv(REFUSE_NODES_ENV, f"{request.node.nodeid} starts a node without the marker `node`")
        if request.node.get_closest_marker("jvm") is None:
            monkeypatch.setenv(REFUSE_JVMS_ENV, f"{request.node.nodeid} starts a JVM without the marker `jvm`")


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


@pytest.fixture
def nothing_left_in_dev_shm():
    before = dev_shm_entries()
    yield
    assert dev_shm_entries() == before


@pytest.fixture
def librdkafka_clients_collected():
    """librdkafka clients a test's frames keep in reference cycles (pytest.raises) are destroyed here, in this
    process: a later test that forks would otherwise have its child collect, and destroy, them (a segfault)."""
    yield
    gc.collect()


@pytest.fixture
def table():
    """A fresh partition table of 4 rows, unlinked afterwards."""
    with SharedTable(rows=4) as shared:
        yield shared
