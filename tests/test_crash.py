"""Processes die: clean restarts keep data, kill -9 of a worker or the timer is survived, and
kill -9 of the whole node loses nothing that was acknowledged with acks=all."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from confluent_kafka import Producer

from scripts.harness.nodeproc import NodeProcess
from tests.test_clients import CLIENT_TIMEOUT_S, consume_all, create_topic, produce


class BackgroundProducer:
    """confluent-kafka producing numbered values until stopped; remembers what was acknowledged."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, **config) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "acks": "all",
                                  "enable.idempotence": True, "message.timeout.ms": 60000,
                                  "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, **config})
        self.topic, self.partitions = topic, partitions
        self.acked: set[bytes] = set()
        self.failed: list = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, err, msg) -> None:
        if err:
            self.failed.append(err)
        else:
            self.acked.add(msg.value())

    def _run(self) -> None:
        deadline = time.monotonic() + 120
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                self.producer.produce(self.topic, value=b"value-%d" % self.sent,
                                      partition=self.sent % self.partitions, on_delivery=self._on_delivery)
                self.sent += 1
            except BufferError:
                pass
            self.producer.poll(0.001)

    def start(self) -> "BackgroundProducer":
        self._thread.start()
        return self

    def stop(self, flush: bool = True) -> None:
        self._stop.set()
        self._thread.join(timeout=CLIENT_TIMEOUT_S)
        if flush:
            self.producer.flush(CLIENT_TIMEOUT_S)
        else:
            self.producer.purge()
            self.producer.poll(0)

    def wait_acked(self, count: int) -> None:
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while len(self.acked) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.acked) >= count, f"only {len(self.acked)} acknowledged, failures {self.failed[:3]}"


def node_under_load(node_factory, workers: int, topic: str, partitions: int,
                    acked: int) -> tuple[NodeProcess, BackgroundProducer]:
    """A node with `topic` and a producer writing to it in the background, `acked` records acknowledged."""
    node = node_factory(workers=workers)
    create_topic(node.bootstrap, topic, partitions)
    load = BackgroundProducer(node.bootstrap, topic, partitions).start()
    load.wait_acked(acked)
    return node, load


@pytest.mark.parametrize("workers", [1, 2])
def test_restart_keeps_all_data(node_factory, workers):
    node = node_factory(workers=workers)
    create_topic(node.bootstrap, "durable", 2)
    sent = [{"value": f"r{i}".encode(), "partition": i % 2} for i in range(1000)]
    produce(node.bootstrap, "durable", sent, acks="1")
    assert node.stop() == 0
    assert node.leftovers() == []
    node.start()
    got = consume_all(node.bootstrap, "durable", 2, len(sent))
    assert sorted(m.value() for m in got) == sorted(r["value"] for r in sent)


@pytest.mark.parametrize("workers", [1, 2])
def test_worker_killed_is_replaced(node_factory, workers):
    node, load = node_under_load(node_factory, workers, "survive", 2, acked=500)
    victim = node.pids("worker")[0]
    os.kill(victim, signal.SIGKILL)
    node.wait_for_pids("worker", workers, exclude={victim})
    acked_at_kill = len(load.acked)
    load.wait_acked(acked_at_kill + 500)
    load.stop()
    assert load.failed == []
    got = consume_all(node.bootstrap, "survive", 2, len(load.acked))
    values = [m.value() for m in got]
    assert len(values) == len(set(values)), "idempotent producer must not duplicate across a worker crash"
    assert set(values) == load.acked


def test_timer_killed_long_poll_still_answers(node_factory):
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "longpoll", 1)
    timer = node.pids("timer")[0]
    os.kill(timer, signal.SIGKILL)
    node.wait_for_pids("timer", 1, exclude={timer})
    # acks=all needs the (restarted) timer's flusher; a consumer's long poll needs its purgatory.
    produce(node.bootstrap, "longpoll", [{"value": b"after-timer-restart", "partition": 0}], acks="all")
    got = consume_all(node.bootstrap, "longpoll", 1, 1, **{"fetch.wait.max.ms": 500})
    assert [m.value() for m in got] == [b"after-timer-restart"]


@pytest.mark.parametrize("workers", [1, 2])
def test_kill9_everything_loses_nothing_acknowledged(node_factory, workers):
    node, load = node_under_load(node_factory, workers, "acked", 3, acked=2000)
    node.kill_all()
    acked = set(load.acked)  # nothing can be acknowledged after the kill
    load.stop(flush=False)
    node.start()
    got = consume_all(node.bootstrap, "acked", 3, len(acked), at_least=True)
    missing = acked - {m.value() for m in got}
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"



def test_supervisor_killed_children_follow_and_restart_recovers(node_factory):
    import psutil

    node = node_factory(workers=2)
    create_topic(node.bootstrap, "orphans", 1)
    sent = [{"value": f"o{i}".encode(), "partition": 0} for i in range(100)]
    produce(node.bootstrap, "orphans", sent, acks="all")
    children = node.children()
    assert len(children) == 4  # the timer, two workers, a log cleaner
    os.kill(node.proc.pid, signal.SIGKILL)
    node.proc.wait(timeout=CLIENT_TIMEOUT_S)
    _, alive = psutil.wait_procs(children, timeout=CLIENT_TIMEOUT_S)
    assert alive == [], "children must not outlive their supervisor (they would hold the port and rings)"
    node.start()  # same port and data dir: the dead instance's shared memory is cleared first
    got = consume_all(node.bootstrap, "orphans", 1, len(sent))
    assert [m.value() for m in got] == [r["value"] for r in sent]


def test_systemd_notify_ready_then_stopping(node_factory, tmp_path):
    import socket

    address = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(address)
        listener.settimeout(CLIENT_TIMEOUT_S)
        node = node_factory(workers=1, env={"NOTIFY_SOCKET": address})

        def until(state: str) -> str:
            for _ in range(20):  # STATUS= lines come first (recovery, start)
                message = listener.recv(4096).decode()
                if state in message.split("\n"):
                    return message
            raise AssertionError(f"no {state}")

        ready = until("READY=1")
        assert f"MAINPID={node.proc.pid}" in ready
        assert node.stop() == 0
        until("STOPPING=1")


WORKERS_EXIT_AT_START = """
import os, sys


def exit_if_a_worker():  # the supervisor's frame that forked this child holds the child's spec
    frame = sys._getframe(1)
    while frame is not None:
        if getattr(frame.f_locals.get("spec"), "role", None) == "worker":
            os._exit(3)
        frame = frame.f_back


os.register_at_fork(after_in_child=exit_if_a_worker)
"""


@pytest.mark.node
def test_a_child_that_cannot_boot_stops_the_node(tmp_path):
    """A worker that dies at every start (here: a sitecustomize hook in the supervisor, run in each child it forks
    for a worker's spec, makes it exit at once) is not restarted forever: the supervisor stops the node, says
    why, exits 1."""
    from scripts.harness.nodeproc import NodeProcess, STOP_TIMEOUT_S

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(WORKERS_EXIT_AT_START)
    node = NodeProcess(tmp_path, workers=1, config="[server]\nchild_boot_failures_max = 3\n",
                       env={"PYTHONPATH": f"{hook}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    with pytest.raises(RuntimeError, match="node exited with 1"):
        node.start()
    node.proc.wait(timeout=STOP_TIMEOUT_S)
    log = node.log()
    assert "worker 0 exited 3 times within 5000 ms of starting (last exit code 3)" in log, log
    assert log.count("restarting in") == 2, log
    assert node.leftovers() == []
    assert "Traceback" not in log
