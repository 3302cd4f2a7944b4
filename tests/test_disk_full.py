"""A full disk with real clients: the data directory on a small tmpfs (and on ext4 whose thin storage runs
out, for failing fsyncs). Every request is answered, KAFKA_STORAGE_ERROR or success; nothing acknowledged
is lost; reads and metadata keep working; appends resume by themselves when space comes back; a restart
on a full disk opens read-only. The test prints the timeline of what each client saw (-s to see it)."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer
from kafka.errors import KafkaStorageError

from tests.small_fs import MiB, ballast, ext4_on_thin_storage, fill, tmpfs
from tests.test_clients import CLIENT_TIMEOUT_S, consume_all

# each test starts a node on a small filesystem of its own; its answers' times and log rates are measured
pytestmark = [pytest.mark.node, pytest.mark.serial]
STORAGE_ERROR = "KAFKA_STORAGE_ERROR"
CONFIG = "[log]\nsegment_bytes = 1048576\nindex_max_bytes = 65536\n"
VALUE_BYTES = 1000


class Timeline:
    def __init__(self) -> None:
        self.start = time.monotonic()
        self.events: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()

    def note(self, who: str, what: str) -> None:
        with self._lock:
            self.events.append((time.monotonic() - self.start, who, what))

    def render(self) -> str:
        return "\n".join(f"  {t:7.2f} s  {who:22} {what}" for t, who, what in self.events)


class Client:
    """One producing client: what it sent, what was acknowledged, which errors it got."""

    def __init__(self, name: str, topic: str, timeline: Timeline) -> None:
        self.name, self.topic, self.timeline = name, topic, timeline
        self.sequence = 0
        self.acked: set[bytes] = set()
        self.errors: dict[str, int] = {}
        self._seen_error = False
        self._lock = threading.Lock()

    def _value(self) -> bytes:
        self.sequence += 1
        return f"{self.name}-{self.sequence:08d}-".encode().ljust(VALUE_BYTES, b".")

    def _result(self, value: bytes, error: str | None) -> None:
        with self._lock:
            if error is None:
                self.acked.add(value)
                if self._seen_error:
                    self._seen_error = False
                    self.timeline.note(self.name, "appends succeed again")
            else:
                self.errors[error] = self.errors.get(error, 0) + 1
                if not self._seen_error:
                    self._seen_error = True
                    self.timeline.note(self.name, f"first error: {error} (after {len(self.acked)} acknowledged)")

    def produce_until_errors(self, errors: int, seconds: float = 60.0) -> None:
        deadline = time.monotonic() + seconds
        start_errors = sum(self.errors.values())
        while sum(self.errors.values()) - start_errors < errors and time.monotonic() < deadline:
            self.send_batch(200)

    def send_batch(self, count: int) -> None:
        raise NotImplementedError


class ConfluentClient(Client):
    def __init__(self, name: str, topic: str, timeline: Timeline, bootstrap: str, **config) -> None:
        super().__init__(name, topic, timeline)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "retries": 0,
                                  "message.timeout.ms": 30000, **config})

    def send_batch(self, count: int) -> None:
        for _ in range(count):
            value = self._value()
            self.producer.produce(self.topic, value, on_delivery=lambda err, msg, value=value:
                                  self._result(value, err.name() if err else None))
        assert self.producer.flush(CLIENT_TIMEOUT_S) == 0


class KafkaPythonClient(Client):
    def __init__(self, name: str, topic: str, timeline: Timeline, bootstrap: str) -> None:
        super().__init__(name, topic, timeline)
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, retries=0, linger_ms=5,
                                      request_timeout_ms=30000)

    def send_batch(self, count: int) -> None:
        futures = []
        for _ in range(count):
            value = self._value()
            futures.append((value, self.producer.send(self.topic, value)))
        for value, future in futures:
            try:
                future.get(timeout=CLIENT_TIMEOUT_S)
                self._result(value, None)
            except KafkaStorageError:
                self._result(value, STORAGE_ERROR)


def storage_lines(log: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for partition in re.findall(r"WARNING shmbroker.storage: partition (\S+):", log):
        counts[partition] = counts.get(partition, 0) + 1
    return counts


def check_nothing_acknowledged_lost(bootstrap: str, client: Client, partitions: int) -> None:
    got = consume_all(bootstrap, client.topic, partitions, len(client.acked), at_least=True)
    missing = client.acked - {m.value() for m in got}
    assert not missing, f"{client.name}: {len(missing)} acknowledged records lost"


def test_a_full_disk_costs_an_error_code_and_appends_resume_by_themselves(tmp_path):
    from scripts.harness.nodeproc import NodeProcess

    timeline = Timeline()
    with tmpfs(tmp_path / "fs", 40 * MiB) as fs:
        node = NodeProcess(tmp_path, workers=2, data_dir=fs / "data", config=CONFIG)
        try:
            node.start()
            first_room, second_room = ballast(fs, "ballast-1", 6 * MiB), ballast(fs, "ballast-2", 6 * MiB)
            admin = AdminClient({"bootstrap.servers": node.bootstrap})
            topics = {"full-all": 2, "full-one": 2, "full-kp": 2, "full-retry": 1}
            for future in admin.create_topics([NewTopic(t, p, 1) for t, p in topics.items()]).values():
                future.result(CLIENT_TIMEOUT_S)
            clients = [
                ConfluentClient("confluent acks=all", "full-all", timeline, node.bootstrap, acks="all"),
                ConfluentClient("confluent acks=1", "full-one", timeline, node.bootstrap, acks="1"),
                KafkaPythonClient("kafka-python acks=1", "full-kp", timeline, node.bootstrap),
            ]
            # A client that retries (idempotent, acks=all): it should never see an error, only a delay.
            patient = ConfluentClient("confluent retrying", "full-retry", timeline, node.bootstrap, acks="all",
                                      **{"enable.idempotence": True, "retries": 2**31 - 1,
                                         "message.timeout.ms": 120000, "retry.backoff.ms": 200})
            children = set(node.pids())
            timeline.note("test", "producing until the disk is full")
            fillers = [threading.Thread(target=c.produce_until_errors, args=(50,)) for c in clients]
            for thread in fillers:
                thread.start()
            for thread in fillers:
                thread.join(120)
            for _ in range(100):
                value = patient._value()
                patient.producer.produce(patient.topic, value, on_delivery=lambda err, msg, value=value:
                                         patient._result(value, err.name() if err else None))
            patient.producer.poll(1)
            timeline.note("test", "disk full: every client got errors; reading and metadata now")
            for client in clients:
                assert client.errors, f"{client.name} never met the full disk"
                assert set(client.errors) == {STORAGE_ERROR}, (client.name, client.errors)
                check_nothing_acknowledged_lost(node.bootstrap, client, topics[client.topic])
            assert set(admin.list_topics(timeout=CLIENT_TIMEOUT_S).topics) >= set(topics)
            timeline.note("test", "reads and metadata served while full; freeing 6 MiB (no restart)")
            os.unlink(first_room)
            freed = time.monotonic()
            for client in clients:
                before = len(client.acked)
                client.send_batch(50)
                assert len(client.acked) >= before + 50, (client.name, client.errors)
            assert patient.producer.flush(CLIENT_TIMEOUT_S) == 0
            timeline.note("test", f"every client appends again ({time.monotonic() - freed:.2f} s after the space "
                                  f"came back); the retrying client's {len(patient.acked)} records delivered")
            assert not patient.errors and len(patient.acked) == 100
            assert set(node.pids()) == children, "appends resumed by a restart"

            timeline.note("test", "filling again, then restarting the node on the full disk")
            for client in clients:
                client.produce_until_errors(20)
            fill(fs)
            assert node.stop() == 0
            node.start()
            assert "READ-ONLY" in node.log(), node.log()
            # Recovery may have cut the torn tails that failed appends left behind, freeing their pages: take
            # them too, so the appends below meet a full disk for sure.
            fill(fs, "filler-2")
            timeline.note("test", "node restarted READ-ONLY; reads work, appends answer KAFKA_STORAGE_ERROR")
            for client in clients:
                check_nothing_acknowledged_lost(node.bootstrap, client, topics[client.topic])
                errors_before = sum(client.errors.values())
                client.send_batch(20)
                assert sum(client.errors.values()) > errors_before, client.name
            os.unlink(second_room)
            os.unlink(fs / "filler")
            os.unlink(fs / "filler-2")
            freed = time.monotonic()
            for client in clients:
                before = len(client.acked)
                client.send_batch(50)
                assert len(client.acked) >= before + 50, (client.name, client.errors)
            timeline.note("test", f"space back after the read-only start: appends resumed "
                                  f"({time.monotonic() - freed:.2f} s), no restart")
            for client in clients + [patient]:
                check_nothing_acknowledged_lost(node.bootstrap, client, topics[client.topic])
                assert set(client.errors) <= {STORAGE_ERROR}, (client.name, client.errors)
            log = node.log(10**7)
            elapsed_min = (time.monotonic() - timeline.start) / 60
            lines = storage_lines(log)
            assert lines, log
            # One line per partition per minute (plus one after the restart, which starts the row afresh).
            assert max(lines.values()) <= 2 + int(elapsed_min), lines
            assert "Traceback" not in log
            summary = "\n".join(f"  {c.name}: {len(c.acked)} acknowledged, errors {c.errors}"
                                for c in clients + [patient])
            print(f"\ndisk-full timeline:\n{timeline.render()}\n{summary}\n  storage log lines per partition: "
                  f"{lines}")
        finally:
            node.close()


def test_acks_all_whose_fsync_fails_answers_storage_error_not_a_timeout(tmp_path):
    """ext4 on thin storage: appends land in the page cache, then the flusher's fsync fails with EIO.
    acks=all producers are answered KAFKA_STORAGE_ERROR at once, never REQUEST_TIMED_OUT."""
    from scripts.harness.nodeproc import NodeProcess

    timeline = Timeline()
    with ext4_on_thin_storage(tmp_path / "ext4", 256 * MiB, 24 * MiB) as fs:
        node = NodeProcess(tmp_path, workers=1, data_dir=fs / "data", config=CONFIG)
        try:
            node.start()
            admin = AdminClient({"bootstrap.servers": node.bootstrap})
            admin.create_topics([NewTopic("thin", 1, 1)])["thin"].result(CLIENT_TIMEOUT_S)
            client = ConfluentClient("confluent acks=all", "thin", timeline, node.bootstrap, acks="all",
                                     **{"request.timeout.ms": 60000})
            client.produce_until_errors(50, seconds=120)
            assert client.errors, "the thin storage never ran out"
            assert set(client.errors) == {STORAGE_ERROR}, client.errors  # no REQUEST_TIMED_OUT, no timeouts
            log = node.log(10**7)
            assert "fsync" in log and "KAFKA_STORAGE_ERROR" in log, log
            assert "Traceback" not in log
            faults = "\n".join(line for line in log.splitlines() if "shmbroker.storage" in line)
            print(f"\nfailed-fsync timeline:\n{timeline.render()}\n  {len(client.acked)} acknowledged, "
                  f"errors {client.errors}\n{faults}")
            node.stop()
        finally:
            node.close()


def test_offset_commits_on_a_full_disk_answer_an_error_at_once_and_resume(tmp_path):
    """The offsets log of groups: a commit that cannot be appended (or fsync'd) is answered NOT_COORDINATOR at
    once, as Kafka maps a storage error (the client looks the coordinator up again and retries), never a
    timeout and never acknowledged; after space comes back commits succeed again, and survive a restart."""
    from scripts.harness.nodeproc import NodeProcess
    from tests.test_groups_protocol import Client

    not_coordinator = 16
    with tmpfs(tmp_path / "fs", 24 * MiB) as fs:
        node = NodeProcess(tmp_path, workers=1, data_dir=fs / "data", config=CONFIG)
        try:
            node.start()
            room = ballast(fs, "ballast", 4 * MiB)
            admin = AdminClient({"bootstrap.servers": node.bootstrap})
            admin.create_topics([NewTopic("t", 1, 1)])["t"].result(CLIENT_TIMEOUT_S)
            client = Client(node)
            assert client.commit("g", {("t", 0): 5}) == {("t", 0): 0}
            filler = fill(fs)
            answered = []
            for offset in range(6, 26):  # until the offsets log's segment runs out of room
                started = time.monotonic()
                answered.append((client.commit("g", {("t", 0): offset}), time.monotonic() - started, offset))
            failed = [(codes, seconds) for codes, seconds, _ in answered if codes[("t", 0)] != 0]
            assert failed, answered
            assert all(codes[("t", 0)] == not_coordinator and seconds < 2 for codes, seconds in failed), answered
            last_acked = max((offset for codes, _, offset in answered if codes[("t", 0)] == 0), default=5)
            _, fetched = client.fetch_offsets("g", {"t": [0]})
            assert fetched[("t", 0)][0] == last_acked  # what was acknowledged, nothing that was refused
            filler.unlink()
            room.unlink()
            assert client.commit("g", {("t", 0): 100}) == {("t", 0): 0}  # resumes, no restart
            client.conn.close()
            node.stop()
            node.start()
            again = Client(node)
            _, fetched = again.fetch_offsets("g", {"t": [0]})
            assert fetched[("t", 0)][0] == 100
            again.conn.close()
            assert "Traceback" not in node.log()
        finally:
            if node.alive():
                node.stop()
