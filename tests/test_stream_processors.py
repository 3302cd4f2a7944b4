"""Stateful stream processors on the node, as their users run them, with no workaround: quixstreams' windowed
count and a faust-streaming Table keep their state in compacted changelog topics they create themselves, and
restore it from them after a restart without their local state; quixstreams' running count with
processing_guarantee="exactly-once" (its output, changelog and offsets in one transaction) stays exact across
kill -9 of the app in the middle of a transaction.

Each framework runs from a venv of its own (in the frameworks cache outside the checkout, tests/frameworks/cache.py,
made from the package registry on first use), since their pins (confluent-kafka, aiokafka) differ from the node's
test venv."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from tests import waiting
from tests.frameworks.cache import install_home, installed, mark_installed
from tests.test_clients import create_topic
from tests.test_transactions import consume_all

pytestmark = pytest.mark.node
APPS = Path(__file__).resolve().parent / "frameworks"
INSTALL_TIMEOUT_S = 900
TIMEOUT_S = 120
# Window timestamps inside one hour, so every count of a word falls in one tumbling window.
HOUR_START_MS = 1_700_002_800_000


def framework_python(name: str, requirement: str) -> Path:
    """The Python of a venv with `requirement` installed for this interpreter (made once; reused while both are
    the same)."""
    spec = f"{requirement} for {os.path.realpath(sys.executable)}"
    failures = []
    with install_home(f"python-{name}", spec) as home:
        while not installed(home, spec):
            # Once more from a fresh venv if pip fails (a full suite once saw pip lose a file of its own
            # mid-install, OSError ENOENT on a dist-info temp file); twice is a failure.
            assert len(failures) < 2, "\n".join(failures)
            shutil.rmtree(home, ignore_errors=True)
            venv.create(home, with_pip=True)
            done = subprocess.run([str(home / "bin" / "python"), "-m", "pip", "install", "--quiet", requirement],
                                  capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
            if done.returncode == 0:
                mark_installed(home, spec)
            else:
                failures.append(done.stderr[-3000:])
    return home / "bin" / "python"


@pytest.fixture(scope="module")
def quix_python():
    return framework_python("quixstreams", "quixstreams>=3.20")


@pytest.fixture(scope="module")
def faust_python():
    return framework_python("faust", "faust-streaming>=0.11")


class App:
    """A framework app as a process of its own; stopped with SIGTERM (as its users stop it), or killed with
    SIGKILL, by pid."""

    def __init__(self, argv: list[str], log: Path, trace: Path | None = None) -> None:
        """trace: where the app writes its client's trace (faust_app.py: FAUST_FETCH_LOG), shown with its log."""
        self.log = log
        self.trace = trace
        env = {**os.environ, "PYTHONPATH": "", **({"FAUST_FETCH_LOG": str(trace)} if trace else {})}
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=APPS, env=env)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=TIMEOUT_S)

    def text(self) -> str:
        text = self.log.read_text(errors="replace")[-6000:]
        if self.trace is not None and self.trace.exists():
            text += "\n--- the client's fetches and commits:\n" + self.trace.read_text(errors="replace")[-20000:]
        return text


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], timestamp_ms: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i, (key, value) in enumerate(records):
        kwargs = {"timestamp": timestamp_ms + i} if timestamp_ms is not None else {}
        producer.produce(topic, key=key, value=value, **kwargs)
    assert producer.flush(TIMEOUT_S) == 0


def read_all(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}",
                         "enable.auto.commit": False})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)
        consumer.assign([TopicPartition(topic, 0, 0)])
        out = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(out) < high and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out.append((msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


def end_offset(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> int:
    """The end of partition 0 as a reader of `isolation` sees it: the high watermark, or the LSO (0 while the
    node does not answer)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks", "isolation.level": isolation})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)[1]
    except Exception:
        return 0
    finally:
        consumer.close()


def wait_for_output(app: App, bootstrap: str, topic: str, records: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while end_offset(bootstrap, topic) < records:
        assert app.proc.poll() is None, app.text()
        assert time.monotonic() < deadline, f"{topic} holds {end_offset(bootstrap, topic)} of {records}:\n{app.text()}"
        time.sleep(0.5)


def compacted_topics(bootstrap: str, names: list[str]) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.describe_configs([ConfigResource("topic", name) for name in names])
    return {resource.name: future.result(timeout=TIMEOUT_S)["cleanup.policy"].value
            for resource, future in futures.items()}


def words(count: int, distinct: int) -> list[tuple[bytes, bytes]]:
    return [(b"w%d" % (i % distinct), json.dumps({"word": "w%d" % (i % distinct)}).encode()) for i in range(count)]


def test_quixstreams_windowed_count_restores_its_state_from_its_changelog(node_factory, tmp_path, quix_python):
    node = node_factory(workers=2, config="[cleaner]\nbackoff_ms = 500\n")
    state = tmp_path / "state"
    produce(node.bootstrap, "words", words(300, 10), HOUR_START_MS)
    app = App([str(quix_python), "quix_app.py", node.bootstrap, str(state), "counter"], tmp_path / "quix.log")
    try:
        wait_for_output(app, node.bootstrap, "counts", 300)
    finally:
        app.stop()
    changelogs = [name for name in AdminClient({"bootstrap.servers": node.bootstrap}).list_topics(timeout=30).topics
                  if name.startswith("changelog__counter")]
    assert changelogs and set(compacted_topics(node.bootstrap, changelogs).values()) == {"compact"}, app.text()
    # Without its local state, the restarted app restores the counts from the changelog and goes on from them.
    shutil.rmtree(state)
    produce(node.bootstrap, "words", words(100, 10), HOUR_START_MS + 300)
    app = App([str(quix_python), "quix_app.py", node.bootstrap, str(state), "counter"], tmp_path / "quix.log")
    try:
        wait_for_output(app, node.bootstrap, "counts", 400)
    finally:
        app.stop()
    last = {}
    for key, value in read_all(node.bootstrap, "counts"):
        last[key] = json.loads(value)["count"]
    assert last == {b"w%d" % i: 40 for i in range(10)}, app.text()


def wait_for_log(app: App, text: str, count: int) -> None:
    """Until the app's log (shared by its runs) holds `text` `count` times."""
    deadline = time.monotonic() + TIMEOUT_S
    while app.log.read_text(errors="replace").count(text) < count:
        assert app.proc.poll() is None, app.text()
        assert time.monotonic() < deadline, f"{text!r} not logged {count} times:\n{app.text()}"
        time.sleep(0.2)


def test_faust_table_recovers_from_its_changelog(node_factory, tmp_path, faust_python):
    node = node_factory(workers=2, config="[cleaner]\nbackoff_ms = 500\n")
    create_topic(node.bootstrap, "fwords", 1)
    raw = [(b"w%d" % (i % 5), b"w%d" % (i % 5)) for i in range(100)]
    argv = [str(faust_python), "faust_app.py", node.bootstrap, "--datadir", str(tmp_path / "faust"), "worker", "-l",
            "info", "--without-web"]
    # Each run gets its input only once its table is recovered ("Worker ready"): faust-streaming 0.15 drops the
    # events its stream took during a recovery and may commit past them (faust-streaming issues 596 and 606).
    trace = tmp_path / "fetches.log"
    app = App(argv, tmp_path / "faust.log", trace)
    try:
        wait_for_log(app, "Worker ready", 1)
        produce(node.bootstrap, "fwords", raw)
        wait_for_output(app, node.bootstrap, "fcounts", 100)
    finally:
        app.stop()
    assert compacted_topics(node.bootstrap, ["fcount-counts-changelog"]) == {"fcount-counts-changelog": "compact"}
    # The table is in memory: the restarted worker has only the changelog to recover it from.
    app = App(argv, tmp_path / "faust.log", trace)
    try:
        wait_for_log(app, "Worker ready", 2)
        produce(node.bootstrap, "fwords", raw[:50])
        wait_for_output(app, node.bootstrap, "fcounts", 150)
    finally:
        app.stop()
    last = {key: int(value.split(b":")[1]) for key, value in read_all(node.bootstrap, "fcounts")}
    # Recovered from the changelog, each word counts on from 20 to 30 (a table lost would restart at 10).
    # faust is at least once: records after its last offset commit (at most broker_commit_every, 10, two a
    # word) may be counted again after a restart.
    assert set(last) == {b"w%d" % i for i in range(5)}, app.text()
    assert all(30 <= count <= 32 for count in last.values()), (last, app.text())


EOS_WORDS, EOS_RECORDS = 10, 6000
# The node aborts a killed app's open transaction after this (quixstreams' transactional.id is new each start).
QUIX_TRANSACTION_TIMEOUT_MS = 5000


def committed_offset(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return consumer.committed([TopicPartition(topic, 0)], TIMEOUT_S)[0].offset
    finally:
        consumer.close()


def read_values(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[dict]:
    """Every value of partition 0 up to its end for `isolation` (the LSO for read_committed), as JSON."""
    return [json.loads(value) for value in consume_all(bootstrap, topic, isolation, timeout_s=TIMEOUT_S, must_end=True)]


def kill_inside_a_transaction(app: App, bootstrap: str, topic: str, at_least: int) -> None:
    """SIGKILL the app once `topic` holds `at_least` records and its end is past its LSO: an open transaction
    of the app has written there, so the kill lands in its middle."""
    def open_transaction_past_the_mark() -> bool:
        high = end_offset(bootstrap, topic, "read_uncommitted")
        return app.proc.poll() is not None or (high >= at_least and high > end_offset(bootstrap, topic,
                                                                                        "read_committed"))
    try:
        assert waiting.poll(open_transaction_past_the_mark, TIMEOUT_S, 0.05) and app.proc.poll() is None, \
            f"no open transaction in {topic} past {at_least} records:\n{app.text()}"
    finally:
        app.kill()


def test_quixstreams_exactly_once_counts_are_exact_across_kills_of_the_app(node_factory, tmp_path, quix_python):
    node = node_factory(workers=2, config="[transactions]\ntransaction_max_timeout_ms = 60000\n")
    produce(node.bootstrap, "eos-words", words(EOS_RECORDS, EOS_WORDS))
    state = tmp_path / "eos-state"
    argv = [str(quix_python), "quix_count_app.py", node.bootstrap, str(state), "eos-counter", "exactly-once",
            "eos-words", "eos-counts", str(QUIX_TRANSACTION_TIMEOUT_MS)]
    for kill_at in (EOS_RECORDS // 4, EOS_RECORDS // 2):  # its local state kept, as a restarted host has it
        kill_inside_a_transaction(App(argv, tmp_path / "quix.log"), node.bootstrap, "eos-counts", kill_at)
    app = App(argv, tmp_path / "quix.log")
    try:
        # The input's offsets are committed with the output: at the input's end, every count is committed.
        consumed = waiting.poll(lambda: app.proc.poll() is not None or committed_offset(
            node.bootstrap, "eos-counter", "eos-words") == EOS_RECORDS, TIMEOUT_S, 0.5)
        assert consumed and app.proc.poll() is None, f"the input not consumed:\n{app.text()}"
    finally:
        app.stop()
    counts: dict[str, list[int]] = {}
    for value in read_values(node.bootstrap, "eos-counts"):
        counts.setdefault(value["word"], []).append(value["count"])
    expected = list(range(1, EOS_RECORDS // EOS_WORDS + 1))
    wrong = {word: f"{len(seen)} counts, {len(seen) - len(set(seen))} repeated, last {seen[-1]}"
             for word, seen in counts.items() if seen != expected}
    assert sorted(counts) == ["w%d" % i for i in range(EOS_WORDS)] and not wrong, (wrong, app.text())
    # The kills left aborted counts behind, which read_committed skipped.
    assert len(read_values(node.bootstrap, "eos-counts", "read_uncommitted")) > EOS_RECORDS
