"""A user's first hour with a node: the port answers as soon as it accepts, `make run` stops cleanly on Ctrl-C and
on SIGTERM, the `groups` and `topics` commands say what is true (states, a group that does not exist, an address
nobody answers on, within the connect timeout) and every option says what it does and its default; a group's
pending sync ends when its only member leaves."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, Producer

from scripts.harness.nodeproc import CLI, free_port, shadowing_folders, shm_leftovers
from shmbroker.shm.instance import instance_id_for
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parent.parent
CLI_TIMEOUT_S = 60
START_TIMEOUT_S = 60
FIRST_ANSWER_S = 1.0  # a worker in its loop answers ApiVersions at once, the first connection too

pytestmark = pytest.mark.node


def cli(*args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def _api_versions_answer_s(port: int) -> float | None:
    """Seconds from a successful connect to the answer of an ApiVersions v0; None if the connect is refused."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=0.2)
    except OSError:
        return None
    with sock:
        connected = time.monotonic()
        sock.settimeout(30)
        request = struct.pack(">hhih", 18, 0, 7, 4) + b"test"
        sock.sendall(struct.pack(">i", len(request)) + request)
        assert len(sock.recv(8)) == 8
        return time.monotonic() - connected


@pytest.mark.serial  # its first answer within FIRST_ANSWER_S
def test_the_port_accepts_only_once_a_worker_serves_it(tmp_path):
    port = free_port()
    log_path = tmp_path / "node.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*CLI, "serve", "--listen", f"127.0.0.1:{port}",
                                 "--data-dir", str(tmp_path / "data"), "--workers", "2"], cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        answer_s = None
        while answer_s is None and time.monotonic() < deadline and proc.poll() is None:
            answer_s = _api_versions_answer_s(port)
            time.sleep(0.01)
        assert answer_s is not None, log_path.read_text()
        assert answer_s < FIRST_ANSWER_S, f"the first connection waited {answer_s:.2f} s for its answer"
        text = wait_for(lambda: "serving on" in log_path.read_text() and log_path.read_text(), START_TIMEOUT_S,
                         "serving on")
        serving = text.index("serving on")
        assert all(0 <= text.find(f"worker {i} ready") < serving for i in range(2)), text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert shm_leftovers(instance_id_for(str(tmp_path / "data"), port)) == []


@pytest.mark.parametrize("how", ["sigterm to make", "ctrl-c to the process group"])
def test_make_run_stops_the_node_cleanly(tmp_path, how):
    port = free_port()
    data = tmp_path / "data"
    log_path = tmp_path / "make.log"
    with open(log_path, "wb") as log:
        make = subprocess.Popen(["make", "--no-print-directory", "-C", str(REPO), "run", f"LISTEN=127.0.0.1:{port}",
                                 f"DATA_DIR={data}"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _api_versions_answer_s(port) is not None, START_TIMEOUT_S, "make run to serve")
        (node,) = psutil.Process(make.pid).children()  # the recipe execs the node: make's only child
        assert "supervisor" in " ".join(node.cmdline())
        family = [node, *node.children(recursive=True)]
        if how == "sigterm to make":
            make.send_signal(signal.SIGTERM)
        else:
            os.killpg(make.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        make.wait(timeout=60)
        gone, alive = psutil.wait_procs(family, timeout=60)
        assert alive == []
        text = log_path.read_text()
        assert "stopped" in text and "Traceback" not in text, text
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
    assert shm_leftovers(instance_id_for(str(data), port)) == []


def test_groups_list_shows_states_and_describe_refuses_a_missing_group(node):
    producer = Producer({"bootstrap.servers": node.bootstrap})
    producer.produce("states", b"x")
    assert producer.flush(30) == 0
    # One group with a member (Stable), one with only committed offsets (Empty).
    committed = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "only-offsets",
                          "auto.offset.reset": "earliest", "enable.auto.commit": False})
    member = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "with-member", "auto.offset.reset": "earliest"})
    try:
        for consumer in (committed, member):
            consumer.subscribe(["states"])
            wait_for(lambda c=consumer: (m := c.poll(0.5)) is not None and not m.error(), 60, "a record")
        committed.commit(asynchronous=False)
        committed.close()

        def listed():
            done = cli("groups", "list", "--bootstrap", node.bootstrap, "--json")
            assert done.returncode == 0, done.stderr
            states = {g["group"]: g["state"] for g in json.loads(done.stdout)}
            return states if states == {"only-offsets": "EMPTY", "with-member": "STABLE"} else None

        wait_for(listed, 30, "both groups with their states")
        table = cli("groups", "list", "--bootstrap", node.bootstrap)
        assert "STABLE" in table.stdout and "EMPTY" in table.stdout and "UNKNOWN" not in table.stdout
    finally:
        member.close()
    missing = cli("groups", "describe", "no-such-group", "--bootstrap", node.bootstrap)
    assert missing.returncode == 1 and "group no-such-group does not exist" in missing.stderr, missing


def test_an_address_nobody_answers_is_reported_within_the_connect_timeout():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))  # kept bound, not listening: connects are refused, and no other node takes it
        closed = probe.getsockname()[1]
        for command in (("topics", "list"), ("groups", "list"), ("groups", "describe", "g")):
            started = time.monotonic()
            done = cli(*command, "--bootstrap", f"127.0.0.1:{closed}", "--connect-timeout", "2")
            took = time.monotonic() - started
            assert done.returncode == 3 and "no broker reachable" in done.stderr, done
            assert took < 6, f"{command} took {took:.1f} s to say the broker is unreachable"


def _options(help_text: str) -> list[tuple[str, str]]:
    """(option, its help) for each option of an argparse --help."""
    section = help_text.split("options:", 1)[1]
    entries = re.split(r"\n  (?=-)", "\n" + section)
    out = []
    for entry in entries:
        entry = entry.strip()
        if not entry.startswith("-"):
            continue
        name = entry.split()[0].rstrip(",")
        out.append((name, " ".join(entry.split()[1:])))
    return out


@pytest.mark.parametrize("command", [("serve",), ("stats",), ("dashboard",), ("topics", "list"), ("topics", "create"),
                                     ("topics", "describe"), ("topics", "delete"), ("groups", "list"),
                                     ("groups", "describe")])
def test_every_option_has_help_and_its_default(command):
    done = cli(*command, "--help")
    assert done.returncode == 0
    flags = {"-h", "--json", "--internal", "--version"}
    for name, text in _options(done.stdout):
        assert text, f"{command} {name} has no help"
        if name not in flags:
            assert "default" in text, f"{command} {name}: its help does not give its default: {text!r}"


def test_a_pending_sync_ends_when_the_only_member_leaves(node_factory):
    node = node_factory(workers=1, config="[stats]\npublish_interval_ms = 100\n")
    producer = Producer({"bootstrap.servers": node.bootstrap})
    producer.produce("leaving", b"x")
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "leaves", "auto.offset.reset": "earliest",
                         "max.poll.interval.ms": 300000})  # the rebalance timeout: a pending sync's deadline
    consumer.subscribe(["leaving"])
    try:
        wait_for(lambda: consumer.poll(0.2) is None and consumer.assignment(), 60, "an assignment")
    finally:
        consumer.close()

    def pending_syncs() -> int:
        done = cli("stats", "--data-dir", str(node.data_dir), "--json")
        return json.loads(done.stdout)["totals"]["purgatory_sync_pending"]

    # Within a few publishes: nothing waits for the sync of a generation that is over.
    wait_for(lambda: pending_syncs() == 0, 5, "the pending sync to end")


def test_ctrl_c_while_the_children_start_stops_the_node_cleanly(tmp_path):
    """A terminal's Ctrl-C reaches every process of the group, children still importing among them: only the
    supervisor acts on it."""
    port = free_port()
    log_path = tmp_path / "node.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*CLI, "serve", "--listen", f"127.0.0.1:{port}",
                                 "--data-dir", str(tmp_path / "data"), "--workers", "2"], cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: len(psutil.Process(proc.pid).children()) == 4, START_TIMEOUT_S,
                 "the timer, both workers and the cleaner to start")
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children()]
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0, log_path.read_text()
        assert psutil.wait_procs(family, timeout=30)[1] == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log_path.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert shm_leftovers(instance_id_for(str(tmp_path / "data"), port)) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_node_started_in_a_directory_with_folders_named_like_its_packages_serves(node_factory, tmp_path, workers):
    """A user's own node/, shm/, workers/ and clients/ where the node starts (the working directory of a shell
    or of a systemd unit) are not what its processes import: the node's packages are installed as
    shmbroker.node and so on, and the children do not put the working directory on their path."""
    where = tmp_path / "home"
    where.mkdir()
    shadowing_folders(where)
    node = node_factory(workers=workers, cwd=where)
    producer = Producer({"bootstrap.servers": node.bootstrap})
    for i in range(10):
        producer.produce("shadowed", value=b"%d" % i)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "g", "auto.offset.reset": "earliest"})
    consumer.subscribe(["shadowed"])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 10 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            got.append(message.value())
    consumer.close()
    assert got == [b"%d" % i for i in range(10)]
    assert len(node.pids("worker")) == workers
    assert "the user's own" not in node.log(), node.log()
