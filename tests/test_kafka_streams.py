"""Kafka Streams 4.4.0 against a real node (2 workers): a stateful application with
processing.guarantee=exactly_once_v2 (tests/java/StreamsApp.java, a single-file source the JVM runs on the
classpath Maven fetched) keeps exact outputs
- through a clean run;
- through a SIGKILL of its JVM in the middle of a run (once some output is committed, and while a stream thread the
  program holds has records of its open transaction at the node) and a restart on the same state dir (the same
  transactional ids fence the killed ones and abort their transactions; the stores, wiped, are restored);
- on from the clean run: more input, a run killed, and a restart on a fresh state dir (new transactional ids: the
  coordinator aborts the killed transactions at their timeout), whose stores are restored whole from their
  changelogs (the app's restore listener says how many records) and go on from there.

The input is written here (confluent-kafka, idempotent): record i is user u<i mod 7> -> amount (i mod 10) + 1 at
T0 + (i mod 240) s, T0 a minute boundary shortly before now, so the 60 s windows are known. The app has no record
cache, so every update is an output record and each output key's values read with read_committed are a known
sequence: the counts 1..n of a user, of an amount (the branch behind a repartition topic), the running sums of a
user's window in the input's order. "Exact" is that sequence, whole: a record processed twice (its transaction's
effect seen, or a count restored from a stale changelog) shows as a repeated or skipped value, and a record of an
aborted transaction as one too many.

Each test runs under both rebalance protocols (PROTOCOLS): "classic" and "streams" (KIP-1071, the node's
StreamsGroupHeartbeat). The tests share one node; each protocol's application has its own application id and
topics.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from scripts.harness.nodeproc import NodeProcess, die_with_parent
from tests import waiting
from tests.test_java_clients import java_command

pytestmark = pytest.mark.node

PROTOCOLS = ("classic", "streams")
PROGRAM = Path(__file__).resolve().parent / "java" / "StreamsApp.java"
# No wait before a new group's first rebalance (Kafka's tests set group.initial.rebalance.delay.ms to 0 too).
# The streams protocol's session timeout is the group coordinator's (KIP-1071): as short as the classic runs'
# consumers ask for theirs (StreamsApp.java, 6 s), so a killed instance's member leaves as soon in both.
NODE_CONFIG = ("[groups]\ninitial_rebalance_delay_ms = 0\nstreams_session_timeout_ms = 6000\n"
               "streams_heartbeat_interval_ms = 1000\nstreams_min_session_timeout_ms = 6000\n"
               "streams_min_heartbeat_interval_ms = 1000\n")
USERS = 7
AMOUNTS = 10
WINDOW_MS = 60_000
SPAN_S = 240  # the input's timestamps: T0 .. T0 + 239 s, four windows
INPUT_PARTITIONS = 3
OUTPUT_PARTITIONS = 2
FIRST_RECORDS = 420  # the first run's input
MORE_RECORDS = 600  # then written, for a run killed before a restart on a fresh state dir
KILLED_RECORDS = 600  # the input of the run killed before a restart on the same state dir
# Per record, in a run to be killed: it lasts over a second, and the kill comes once a fifth of it is committed.
THROTTLE_MS = 4
APP_DEADLINE_S = 90
TIMEOUT_S = 120
STORES = ("counts", "amount-counts", "window-sums")


def t0_ms() -> int:
    """A minute boundary 10 minutes before now: the records' timestamps are recent (inside every retention)."""
    return (int(time.time() * 1000) // WINDOW_MS - 10) * WINDOW_MS


def record(i: int, t0: int) -> tuple[str, str, int]:
    return f"u{i % USERS}", str(i % AMOUNTS + 1), t0 + (i % SPAN_S) * 1000


class Topics:
    """An application's id and topics; outputs by branch (the program's names for them)."""

    def __init__(self, app: str) -> None:
        self.app = app
        self.input = f"{app}-input"
        self.outputs = {"counts": f"{app}-counts", "amounts": f"{app}-amounts", "windows": f"{app}-windows"}
        self.changelogs = {store: f"{app}-{store}-changelog" for store in STORES}
        self.repartition = f"{app}-by-amount-repartition"

    def create(self, bootstrap: str) -> None:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = [NewTopic(self.input, num_partitions=INPUT_PARTITIONS, replication_factor=1)]
        topics += [NewTopic(name, num_partitions=OUTPUT_PARTITIONS, replication_factor=1)
                   for name in self.outputs.values()]
        for future in admin.create_topics(topics).values():
            future.result(timeout=TIMEOUT_S)


def produce_input(bootstrap: str, topic: str, first: int, stop: int, t0: int) -> None:
    """Records first..stop-1, partitioned by key as Kafka's Java producer does (murmur2)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                         "partitioner": "murmur2_random"})
    for i in range(first, stop):
        user, amount, timestamp = record(i, t0)
        producer.produce(topic, key=user, value=amount, timestamp=timestamp)
    assert producer.flush(TIMEOUT_S) == 0


def expected(records: int, t0: int) -> dict[str, dict[str, list[str]]]:
    """Each output's values per key, in order, for the input's first `records`."""
    out: dict[str, dict[str, list[str]]] = {"counts": defaultdict(list), "amounts": defaultdict(list),
                                             "windows": defaultdict(list)}
    sums: dict[str, int] = defaultdict(int)
    for i in range(records):
        user, amount, timestamp = record(i, t0)
        out["counts"][user].append(str(len(out["counts"][user]) + 1))
        by_amount = f"amount-{amount}"
        out["amounts"][by_amount].append(str(len(out["amounts"][by_amount]) + 1))
        window = f"{user}@{timestamp // WINDOW_MS * WINDOW_MS}"
        sums[window] += int(amount)
        out["windows"][window].append(str(sums[window]))
    return {name: dict(values) for name, values in out.items()}


def read_topics(bootstrap: str, names: list[str], isolation: str) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every record of each topic as (key, value), partition after partition, each in offset order, read up to
    the partition's end (its last stable offset under read_committed)."""
    # fetch.wait.max.ms: a partition read to its end is told so at once, not after the fetch's 500 ms wait.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": isolation,
                         "fetch.wait.max.ms": 10})
    try:
        metadata = consumer.list_topics(timeout=TIMEOUT_S).topics
        partitions = sorted((name, p) for name in names for p in metadata[name].partitions)
        consumer.assign([TopicPartition(name, p, 0) for name, p in partitions])
        got: dict[tuple[str, int], list[tuple[bytes, bytes]]] = {tp: [] for tp in partitions}
        at_end: set[tuple[str, int]] = set()
        deadline = time.monotonic() + TIMEOUT_S
        while at_end != set(partitions) and time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add((msg.topic(), msg.partition()))
            else:
                got[msg.topic(), msg.partition()].append((msg.key(), msg.value()))
        assert at_end == set(partitions), f"only {sorted(at_end)} of {partitions} read to their end"
        return {name: [pair for tp in partitions if tp[0] == name for pair in got[tp]] for name in names}
    finally:
        consumer.close()


def outputs(bootstrap: str, topics: Topics, isolation: str = "read_committed") -> dict[str, dict[str, list[str]]]:
    """Each output's values per key, in order (a key's records are in one partition)."""
    records = read_topics(bootstrap, list(topics.outputs.values()), isolation)
    out: dict[str, dict[str, list[str]]] = {}
    for branch, topic in topics.outputs.items():
        values: dict[str, list[str]] = defaultdict(list)
        for key, value in records[topic]:
            values[key.decode()].append(value.decode())
        out[branch] = dict(values)
    return out


def output_records(bootstrap: str, topics: Topics, isolation: str) -> int:
    return sum(len(records) for records in read_topics(bootstrap, list(topics.outputs.values()), isolation).values())


def changelog_records(bootstrap: str, topics: Topics) -> dict[str, int]:
    """The records of each store's changelog, read_committed (what a restore reads)."""
    records = read_topics(bootstrap, list(topics.changelogs.values()), "read_committed")
    return {store: len(records[name]) for store, name in topics.changelogs.items()}


def log_ranges(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """Each partition's (log start, end) offsets."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}"})
    try:
        partitions = consumer.list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S) for p in partitions}
    finally:
        consumer.close()


def app_argv(node: NodeProcess, topics: Topics, state: Path, protocol: str, expect: int,
             throttle_ms: int = 0) -> list[str]:
    """The program's command line; its state dir and the JVM's temp dir (where RocksDB unpacks its native library,
    15 MB a run, which a killed JVM leaves) beside each other, in the test's tmp_path."""
    args = {"bootstrap": node.bootstrap, "app": topics.app, "state": str(state), "input": topics.input,
            **topics.outputs, "protocol": protocol, "expect": str(expect), "deadline-s": str(APP_DEADLINE_S),
            "throttle-ms": str(throttle_ms)}
    temp = state.parent / "jvm-tmp"
    temp.mkdir(parents=True, exist_ok=True)
    return [*java_command(PROGRAM, f"-Djava.io.tmpdir={temp}"), *(f"{k}={v}" for k, v in args.items())]


class StreamsProcess:
    """StreamsApp.java as a JVM of its own: its JSON lines as they come (a reader thread; its other output and
    its log go to `log`), stopped by its pid."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        with open(log, "ab") as errors:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.PIPE,
                                         preexec_fn=die_with_parent)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            text = raw.decode(errors="replace")
            if text.startswith('{"step"'):
                self.lines.put(json.loads(text))
            else:
                with open(self.log, "a") as log:
                    log.write(text)
        self.lines.put(None)  # the end of its output

    def next_line(self, predicate: Callable[[dict], bool], timeout: float = TIMEOUT_S) -> dict:
        """The first line from here on that `predicate` takes; AssertionError if the output ends or time is up."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no such line in {timeout} s: {self.seen}\n{self.text()}") from None
            assert line is not None, f"the app ended: {self.seen}\n{self.text()}"
            self.seen.append(line)
            if predicate(line):
                return line

    def command(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def finish(self) -> list[dict]:
        """Every line, once the JVM exited by itself (AssertionError if it did not in TIMEOUT_S, or failed)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # no command
        self.proc.wait(timeout=TIMEOUT_S)
        self.reader.join(TIMEOUT_S)
        while (line := self.lines.get(timeout=TIMEOUT_S)) is not None:
            self.seen.append(line)
        assert self.proc.returncode == 0, f"exited {self.proc.returncode}: {self.seen}\n{self.text()}"
        return self.seen

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=TIMEOUT_S)
        self.reader.join(TIMEOUT_S)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")[-8000:]


def run_to_completion(argv: list[str], log: Path) -> list[dict]:
    """A run that ends by itself once its outputs are complete, and closes cleanly: its lines."""
    app = StreamsProcess(argv, log)
    try:
        lines = app.finish()
    finally:
        app.kill()
    steps = [line["step"] for line in lines]
    assert "complete" in steps and "error" not in steps, f"{lines}\n{app.text()}"
    assert [line["clean"] for line in lines if line["step"] == "closed"] == [True], lines
    return lines


def kill_inside_a_transaction(bootstrap: str, argv: list[str], log: Path, topics: Topics,
                               committed: int) -> list[dict]:
    """A run killed with SIGKILL once the counts output holds `committed` records (read_committed) and one of its
    stream threads, held (the program's "hold"), has records of its open transaction at the broker: a count
    partition's high watermark past its last stable offset. Its lines until then."""
    app = StreamsProcess(argv, log)
    try:
        app.next_line(lambda line: line["step"] == "progress"
                      and line["committed"][topics.outputs["counts"]] >= committed)
        app.command("hold")
        app.next_line(lambda line: line["step"] == "held")
        waiting.wait_for(lambda: open_records(bootstrap, topics.outputs["counts"]) > 0, timeout=TIMEOUT_S,
                         what="the held transaction's records at the broker", poll_s=0.05)
    finally:
        app.kill()
    assert "error" not in [line["step"] for line in app.seen], app.seen
    return app.seen


def open_records(bootstrap: str, topic: str) -> int:
    """Records of open transactions in `topic`: high watermarks past last stable offsets (markers included)."""
    ends = {}
    for isolation in ("read_uncommitted", "read_committed"):  # librdkafka asks ListOffsets with its isolation
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}",
                             "isolation.level": isolation})
        try:
            partitions = consumer.list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions
            ends[isolation] = sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S,
                                                                 cached=False)[1] for p in partitions)
        finally:
            consumer.close()
    return ends["read_uncommitted"] - ends["read_committed"]


def restored(lines: list[dict]) -> dict[str, int]:
    """The records restored from its changelog, per store."""
    out: dict[str, int] = {}
    for line in lines:
        if line["step"] == "restored":
            out[line["store"]] = out.get(line["store"], 0) + line["records"]
    return out


def aborted_records(bootstrap: str, topics: Topics, records: int) -> int:
    """The output records of aborted transactions: read_uncommitted sees them, read_committed does not (the
    three outputs hold `records` committed records each once exact)."""
    return output_records(bootstrap, topics, "read_uncommitted") - 3 * records


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(tmp_path_factory.mktemp("kafka-streams"), workers=2, config=NODE_CONFIG) as started:
        yield started


@pytest.fixture(scope="module", params=PROTOCOLS)
def first_run(request, node, tmp_path_factory):
    """One clean run of a protocol's application over the first FIRST_RECORDS: its topics, T0, work dir and
    lines. The fresh state dir's test goes on from it (more input, a run killed, another state dir)."""
    protocol = request.param
    topics = Topics(f"streams-{protocol}")
    topics.create(node.bootstrap)
    t0 = t0_ms()
    produce_input(node.bootstrap, topics.input, 0, FIRST_RECORDS, t0)
    work = tmp_path_factory.mktemp(f"streams-{protocol}")
    lines = run_to_completion(app_argv(node, topics, work / "state", protocol, FIRST_RECORDS), work / "first.log")
    return {"protocol": protocol, "topics": topics, "t0": t0, "work": work, "lines": lines}


def test_clean_run_outputs_are_exact(node, first_run):
    topics, t0 = first_run["topics"], first_run["t0"]
    assert outputs(node.bootstrap, topics) == expected(FIRST_RECORDS, t0)
    assert aborted_records(node.bootstrap, topics, FIRST_RECORDS) == 0
    # The application made its changelog and repartition topics on the node, and deleted the repartition topic's
    # records once consumed (DeleteRecords after its commits).
    names = set(AdminClient({"bootstrap.servers": node.bootstrap}).list_topics(timeout=TIMEOUT_S).topics)
    internal = {*topics.changelogs.values(), topics.repartition}
    assert internal <= names, sorted(name for name in names if name.startswith(topics.app))
    repartition = log_ranges(node.bootstrap, topics.repartition)
    assert sum(start for start, _ in repartition.values()) > 0, repartition


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sigkill_mid_run_then_restart_on_the_same_state_dir_is_exact(node, tmp_path, protocol):
    topics = Topics(f"streams-killed-{protocol}")
    topics.create(node.bootstrap)
    t0 = t0_ms()
    produce_input(node.bootstrap, topics.input, 0, KILLED_RECORDS, t0)
    killed = app_argv(node, topics, tmp_path / "state", protocol, KILLED_RECORDS, throttle_ms=THROTTLE_MS)
    kill_inside_a_transaction(node.bootstrap, killed, tmp_path / "killed.log", topics, KILLED_RECORDS // 5)
    # The same state dir: the same process id, so the same transactional ids; the restarted producers fence the
    # killed ones and abort their open transactions.
    lines = run_to_completion(app_argv(node, topics, tmp_path / "state", protocol, KILLED_RECORDS),
                              tmp_path / "restarted.log")
    assert outputs(node.bootstrap, topics) == expected(KILLED_RECORDS, t0)
    # The kill left records of open transactions in the outputs; read_committed skipped them.
    assert aborted_records(node.bootstrap, topics, KILLED_RECORDS) > 0, "the kill found no open transaction"
    # Under exactly-once an unclean stop leaves no checkpoint: the stores are wiped and restored from the
    # changelogs.
    assert set(restored(lines)) == set(STORES), lines


def test_sigkill_mid_run_then_restart_on_a_fresh_state_dir_restores_from_the_changelogs(node, first_run):
    """On from the clean run: more input, a run on its state dir killed, a restart on a fresh one."""
    topics, t0, work, protocol = first_run["topics"], first_run["t0"], first_run["work"], first_run["protocol"]
    total = FIRST_RECORDS + MORE_RECORDS
    produce_input(node.bootstrap, topics.input, FIRST_RECORDS, total, t0)
    kill_inside_a_transaction(node.bootstrap, app_argv(node, topics, work / "state", protocol, total,
                                                       throttle_ms=THROTTLE_MS),
                              work / "killed.log", topics, FIRST_RECORDS + MORE_RECORDS // 5)
    # What a restore reads: each changelog's committed records (no cache: one per update); the killed run's open
    # transactions are after them.
    changelog = changelog_records(node.bootstrap, topics)
    assert all(FIRST_RECORDS <= records < total for records in changelog.values()), changelog
    assert changelog["counts"] >= FIRST_RECORDS + MORE_RECORDS // 5, changelog  # committed with those outputs
    # A fresh state dir: a new process id, so new transactional ids. The killed run's open transactions end when
    # the coordinator aborts them at their timeout (Streams' transaction.timeout.ms, 10 s); the restores and the
    # repartition topic's consumer wait for that (their last stable offsets).
    lines = run_to_completion(app_argv(node, topics, work / "fresh-state", protocol, total), work / "fresh.log")
    # Each store was restored whole, and the counts and sums went on from the restored values.
    assert restored(lines) == changelog, lines
    assert outputs(node.bootstrap, topics) == expected(total, t0)
    assert aborted_records(node.bootstrap, topics, total) > 0, "the kill found no open transaction"
