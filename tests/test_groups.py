"""Consumer groups against a real node with real clients, each member a process of its own
(tests/group_member.py): balanced assignments, rebalances on close and on SIGKILL, no record lost,
duplicates only of records consumed and not committed; kcat -G; cooperative-sticky; static membership."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.test_clients import CLIENT_TIMEOUT_S, create_topic

MEMBER = str(Path(__file__).resolve().parent / "group_member.py")
WAIT_S = 60.0
SESSION_MS = 4000
# Groups start their first join phase after 100 ms instead of Kafka's 3 s; sessions as short as the tests want.
GROUP_CONFIG = "[groups]\ninitial_rebalance_delay_ms = 100\nmin_session_timeout_ms = 1000\n"


class Member:
    """A group_member.py process; a thread collects its JSON lines. Stopped by pid."""

    def __init__(self, client: str, bootstrap: str, group: str, topic: str, *extra: str) -> None:
        self.client = client
        self.proc = subprocess.Popen([sys.executable, MEMBER, "--client", client, "--bootstrap", bootstrap,
                                      "--group", group, "--topic", topic, "--session-timeout-ms", str(SESSION_MS),
                                      *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self._lock:
                self.events.append(event)

    def of(self, kind: str) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e["event"] == kind]

    @property
    def assignment(self) -> set[int]:
        assigned = self.of("assigned")
        return set(assigned[-1]["partitions"]) if assigned else set()

    def consumed(self) -> list[tuple[int, int, str]]:
        return [(e["p"], e["o"], e["v"]) for e in self.of("record")]

    def committed_consumptions(self) -> set[tuple[int, int]]:
        """(partition, offset) of the records this member consumed and then committed past."""
        done: dict[int, int] = {}
        for e in self.of("committed"):
            done[e["p"]] = max(done.get(e["p"], 0), e["o"])
        return {(p, o) for p, o, _ in self.consumed() if o < done.get(p, 0)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=WAIT_S)
        self._reader.join(timeout=WAIT_S)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=WAIT_S)
        self._reader.join(timeout=WAIT_S)


@pytest.fixture
def members():
    started: list[Member] = []

    def make(*args: str) -> Member:
        member = Member(*args)
        started.append(member)
        return member

    yield make
    for member in started:
        if member.proc.poll() is None:
            member.kill()


def wait_until(condition, what: str, timeout: float = WAIT_S) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def produce_numbered(bootstrap: str, topic: str, first: int, count: int, partitions: int) -> set[str]:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    values = set()
    for i in range(first, first + count):
        producer.produce(topic, value=f"r{i}".encode(), partition=i % partitions)
        values.add(f"r{i}")
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    return values


def balanced(group: list[Member], partitions: int) -> bool:
    owned = [m.assignment for m in group]
    return all(owned) and sum(len(o) for o in owned) == partitions and set().union(*owned) == set(range(partitions))


def consumed_values(group: list[Member]) -> set[str]:
    return {v for m in group for _, _, v in m.consumed()}


def check_no_committed_record_again(group: list[Member]) -> None:
    """A record may be consumed twice only if at most one of its consumers committed past it."""
    counts: dict[tuple[int, int], int] = {}
    for member in group:
        for key in member.committed_consumptions():
            counts[key] = counts.get(key, 0) + 1
    twice = {key: n for key, n in counts.items() if n > 1}
    assert not twice, f"records consumed again after a commit: {sorted(twice)[:10]}"


@pytest.mark.parametrize("clients", [
    ("confluent", "confluent", "confluent"),
    ("kafka-python", "kafka-python", "kafka-python"),
    ("aiokafka", "aiokafka", "aiokafka"),
    ("confluent", "kafka-python", "confluent"),
], ids=["confluent", "kafka-python", "aiokafka", "mixed"])
def test_three_members_share_six_partitions_through_close_and_kill(node_factory, members, clients):
    node = node_factory(workers=2, config=GROUP_CONFIG)
    topic, partitions = "shared", 6
    create_topic(node.bootstrap, topic, partitions)
    produced = produce_numbered(node.bootstrap, topic, 0, 600, partitions)
    group = [members(client, node.bootstrap, "g-share", topic) for client in clients]
    wait_until(lambda: balanced(group, partitions), "three members owning six partitions between them")
    wait_until(lambda: produced <= consumed_values(group), "every record consumed")
    assert all(len(m.assignment) == 2 for m in group), [m.assignment for m in group]

    # A clean close leaves the group: the others take its partitions at once, not after its session timeout.
    leaving, staying = group[0], group[1:]
    leaving.stop()
    assert leaving.of("closed")
    took = wait_until(lambda: balanced(staying, partitions), "the two remaining members owning all six", SESSION_MS / 1000)
    produced |= produce_numbered(node.bootstrap, topic, 600, 300, partitions)
    wait_until(lambda: produced <= consumed_values(group), "records after the close consumed")

    # SIGKILL: no goodbye; the survivor gets every partition once the dead member's session expires.
    killed, survivor = staying
    killed.kill()
    started = time.monotonic()
    wait_until(lambda: balanced([survivor], partitions), "the survivor owning all six", WAIT_S)
    detected_s = time.monotonic() - started
    produced |= produce_numbered(node.bootstrap, topic, 900, 300, partitions)
    wait_until(lambda: produced <= consumed_values(group), "records after the kill consumed")
    check_no_committed_record_again(group)
    print(f"{clients}: close rebalanced in {took:.2f} s, kill detected in {detected_s:.2f} s")


def test_kcat_balanced_consumer_reads_every_record(node_factory):
    node = node_factory(workers=2, config=GROUP_CONFIG)
    create_topic(node.bootstrap, "kcat-group", 3)
    produced = produce_numbered(node.bootstrap, "kcat-group", 0, 90, 3)
    done = subprocess.run(["kcat", "-b", node.bootstrap, "-G", "g-kcat", "-o", "beginning", "-c", "90", "-q",
                           "-X", "session.timeout.ms=6000", "kcat-group"],
                          capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == produced


def test_cooperative_sticky_moves_only_what_it_must(node_factory, members):
    node = node_factory(workers=2, config=GROUP_CONFIG)
    topic, partitions = "sticky", 6
    create_topic(node.bootstrap, topic, partitions)
    produced = produce_numbered(node.bootstrap, topic, 0, 300, partitions)
    first = [members("confluent", node.bootstrap, "g-sticky", topic, "--assignor", "cooperative-sticky")
             for _ in range(2)]
    wait_until(lambda: balanced(first, partitions), "two cooperative members owning six partitions")
    before = [m.assignment for m in first]
    third = members("confluent", node.bootstrap, "g-sticky", topic, "--assignor", "cooperative-sticky")
    group = first + [third]
    wait_until(lambda: balanced(group, partitions) and all(len(m.assignment) == 2 for m in group),
               "three cooperative members with two partitions each")
    for member, owned in zip(first, before):
        # Incremental: each kept two of its three partitions and never gave up all of them in between.
        assert len(member.assignment & owned) == 2, (owned, member.assignment)
        assert all(e["partitions"] for e in member.of("assigned")), member.of("assigned")
    produced |= produce_numbered(node.bootstrap, topic, 300, 300, partitions)
    wait_until(lambda: produced <= consumed_values(group), "every record consumed")
    check_no_committed_record_again(group)


def test_static_member_restart_keeps_its_partitions_without_a_rebalance(node_factory, members):
    node = node_factory(workers=2, config=GROUP_CONFIG)
    topic, partitions = "static", 4
    create_topic(node.bootstrap, topic, partitions)
    produced = produce_numbered(node.bootstrap, topic, 0, 200, partitions)
    session = ["--session-timeout-ms", "15000"]
    one = members("confluent", node.bootstrap, "g-static", topic, "--instance-id", "one", *session)
    two = members("confluent", node.bootstrap, "g-static", topic, "--instance-id", "two", *session)
    wait_until(lambda: balanced([one, two], partitions), "two static members")
    wait_until(lambda: produced <= consumed_values([one, two]), "every record consumed")
    owned, events_of_two = one.assignment, len(two.of("assigned"))
    one.kill()  # gone without a LeaveGroup; back within its 15 s session
    again = members("confluent", node.bootstrap, "g-static", topic, "--instance-id", "one", *session)
    wait_until(lambda: again.assignment, "the restarted static member's assignment")
    assert again.assignment == owned, "the same partitions come back"
    produced |= produce_numbered(node.bootstrap, topic, 200, 200, partitions)
    wait_until(lambda: produced <= consumed_values([one, two, again]), "records after the restart consumed")
    assert len(two.of("assigned")) == events_of_two, "no rebalance: the other member saw no change"

    # A second live member with the same instance id fences the current one.
    duplicate = members("confluent", node.bootstrap, "g-static", topic, "--instance-id", "one", *session)
    wait_until(lambda: any("fenced" in e["text"].lower() for e in again.of("error")), "the fenced instance's error")
    wait_until(lambda: duplicate.assignment == owned, "the newest instance owning the partitions")


def test_group_consumers_recover_when_the_timer_is_killed(node_factory, members):
    """kill -9 of the timer process loses the groups' membership (they rejoin the new coordinator) but no
    committed offset: after the restart no record is consumed again past a commit, and none is lost."""
    node = node_factory(workers=2, config=GROUP_CONFIG)
    topic, partitions = "timer-dies", 4
    create_topic(node.bootstrap, topic, partitions)
    produced = produce_numbered(node.bootstrap, topic, 0, 400, partitions)
    group = [members("confluent", node.bootstrap, "g-timer", topic) for _ in range(2)]
    wait_until(lambda: balanced(group, partitions), "two members")
    wait_until(lambda: produced <= consumed_values(group), "every record consumed")
    timer = node.pids("timer")[0]
    os.kill(timer, signal.SIGKILL)
    node.wait_for_pids("timer", 1, exclude={timer})
    produced |= produce_numbered(node.bootstrap, topic, 400, 400, partitions)
    wait_until(lambda: produced <= consumed_values(group), "records after the timer's restart consumed")
    wait_until(lambda: balanced(group, partitions), "the group formed again")
    check_no_committed_record_again(group)
