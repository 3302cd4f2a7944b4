"""`shmbroker dashboard` in a real pseudo-terminal (tmux) against a live node under load: the view shows every
process and the node's rates, the numbers move with the load, a stopped node shows one clear line, and a
restarted node (same data directory) is picked up again. The tmux session is this test's own and is gone
at the end (the dashboard exits by itself after --duration; the session is also killed by its unique name).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

REPO = Path(__file__).resolve().parent.parent
DASHBOARD_S = 60


class Pane:
    """A tmux session on a tmux server of this test's own: its socket is in the test's temporary directory, so
    nothing is left in /tmp/tmux-<uid> (the server ends with its last session)."""

    def __init__(self, directory: Path) -> None:
        self.socket = directory / "tmux.sock"
        self.name = f"smbdash{uuid.uuid4().hex[:8]}"

    def tmux(self, *args: str, **options) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-S", str(self.socket), *args], timeout=10, **options)

    def capture(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.name, capture_output=True, text=True).stdout


def wait_screen(session: Pane, predicate, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = session.capture()
        if predicate(screen):
            return screen
        time.sleep(0.3)
    raise AssertionError(f"screen never matched:\n{screen}")


def produce_rate(screen: str) -> int:
    match = re.search(r"│ Produce\s+│\s+(\d+)\s+│", screen)
    return int(match.group(1)) if match else 0


def group_lag(screen: str) -> int:
    match = re.search(r"│ group dashboard-group: lag\s+│\s+(\d+)\s+│", screen)
    return int(match.group(1)) if match else 0


def test_dashboard_in_tmux_under_load(node_factory, tmp_path):
    assert shutil.which("tmux"), "tmux is missing: `make test` installs it"
    node = node_factory(workers=2)
    stop = threading.Event()

    def load() -> None:
        producer = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 5})
        deadline = time.monotonic() + DASHBOARD_S
        while not stop.is_set() and time.monotonic() < deadline:
            for _ in range(200):
                try:
                    producer.produce("dashboard-load", value=b"x" * 100)
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
            time.sleep(0.005)
        producer.flush(10)

    loader = threading.Thread(target=load)
    loader.start()
    # A group that committed offset 5 of a partition the load keeps growing: its lag shows and grows.
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "dashboard-group"})
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:  # the topic comes with the load's first produce
                if consumer.get_watermark_offsets(TopicPartition("dashboard-load", 0), timeout=5)[1] > 5:
                    break
            except KafkaException:
                pass
            time.sleep(0.1)
        consumer.commit(offsets=[TopicPartition("dashboard-load", 0, 5)], asynchronous=False)
    finally:
        consumer.close()
    session = Pane(tmp_path)
    # The pane decides the size (pytest may have exported COLUMNS/LINES, which rich would obey).
    command = f"env -u COLUMNS -u LINES {sys.executable} -m node.tools.cli dashboard --data-dir {node.data_dir} --duration {DASHBOARD_S}"
    session.tmux("new-session", "-d", "-s", session.name, "-x", "180", "-y", "60", "-c", str(REPO), command,
                 check=True)
    try:
        screen = wait_screen(session, lambda s: produce_rate(s) > 0)
        for label in ("supervisor", "timer", "worker 0", "worker 1", "purgatory produce", "timer lateness",
                      "fsyncs/s", "rings of worker 0"):
            assert label in screen, screen
        assert f"127.0.0.1:{node.port}" in screen
        lag = wait_screen(session, lambda s: group_lag(s) > 0)
        assert group_lag(wait_screen(session, lambda s: group_lag(s) > group_lag(lag))) > group_lag(lag)
        # The numbers move: the Produce rate of two refreshes apart differ, or the clock line does.
        first = produce_rate(screen)
        later = wait_screen(session, lambda s: produce_rate(s) not in (0, first))
        assert produce_rate(later) > 0
        stop.set()
        loader.join()
        wait_screen(session, lambda s: produce_rate(s) == 0)  # the load is gone: the rate falls to 0

        # The node goes: one clear line; it comes back (same data directory and port): the view is back.
        assert node.stop() == 0
        wait_screen(session, lambda s: "node not running" in s)
        node.start()
        wait_screen(session, lambda s: "node not running" not in s and "worker 1" in s, timeout=30)
    finally:
        stop.set()
        loader.join()
        session.tmux("kill-session", "-t", session.name, capture_output=True)
