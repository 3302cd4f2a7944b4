"""The stats segment and the `shmbroker` command line against real nodes and real clients.

- shm.stats: a writer in another process publishes rows whose words must all be equal; readers never see a
  mixed row (a torn copy would mix two publishes).
- `shmbroker stats --json` reads the counters of a live node (produce, fetch, groups, rings, flushes, partitions)
  without a request to it; the counters move with the load.
- `topics` and `groups` through the Kafka API, with lag; `--version`; exit codes and messages for a node that
  is not running, a bad config file (file:line: key: reason), a port in use; process titles.
- `serve --metrics`: the Prometheus endpoint serves the same counters with Kafka-like names.
- The transaction coordinator's state: `transactions list|describe`, `stats`, the dashboard and /metrics show a
  committed, an aborted, a timed-out and an open transaction, and the open one's LSO lag; the transactions
  document has its own area of the segment, cut at whole ids.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
from confluent_kafka import Consumer, Producer, TopicPartition
from shm_testing import unique_instance_id

from shmbroker.node.storage.catalog import topic_id_text
from scripts.harness import rawkafka as R
from scripts.harness.nodeproc import CLI
from shmbroker.shm import stats as S
from tests.test_docs import documented_series
from tests.waiting import wait_for
from shmbroker.workers.codecs import protocol as P

UNKNOWN_TOPIC_OR_PARTITION = 3

REPO = Path(__file__).resolve().parent.parent
CLI_TIMEOUT_S = 60


def cli(*args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def stats_json(node) -> dict:
    done = cli("stats", "--data-dir", str(node.data_dir), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def metrics_page(port: int) -> str:
    """The text of the node's Prometheus endpoint on `port`."""
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def wait_for_metric(port: int, sample: str, what: str) -> str:
    """The endpoint's text once it holds `sample` (a sample's line, or its start)."""
    return wait_for(lambda: (lambda text: text if sample in text else None)(metrics_page(port)), what=what)


# -- the segment ------------------------------------------------------------------------------

WRITER = r"""
import sys, time
from shmbroker.shm import stats as S
segment = S.StatsSegment.attach(sys.argv[1])
writer = segment.writer(1, "worker", 0, 4242)
deadline = time.monotonic() + float(sys.argv[2])
value = 0
while time.monotonic() < deadline:
    value += 1
    writer.counts = [value] * S.SLOT_WORDS
    writer.publish()
print(value)
"""


COMMITTED_WRITER = r"""
import sys, time
from shmbroker.shm import stats as S
segment = S.StatsSegment.attach(sys.argv[1])
deadline = time.monotonic() + float(sys.argv[2])
value = 0
while time.monotonic() < deadline:
    value += 1
    # Every entry of one publish carries the same offset, and the number of groups varies with it.
    segment.publish_committed({f"g{i}": [("t", p, value) for p in range(3)] for i in range(1 + value % 5)})
print(value)
"""


def test_committed_offsets_are_consistent_and_cut_at_whole_groups():
    name = f"/shmbroker-{unique_instance_id('sc')}-stats"
    segment = S.StatsSegment.create(name, 3, committed_bytes=4096)
    try:
        assert segment.read_committed() == ({}, True)
        writer = subprocess.Popen([sys.executable, "-c", COMMITTED_WRITER, name, "1.5"], cwd=REPO,
                                  stdout=subprocess.PIPE, text=True)
        reader = S.StatsSegment.attach(name, writable=False)
        seen = set()
        try:
            deadline = time.monotonic() + 10
            while writer.poll() is None and time.monotonic() < deadline:
                document, complete = reader.read_committed()
                offsets = {offset for entries in document.values() for _, _, offset in entries}
                assert complete and len(offsets) <= 1, "a torn copy mixed two publishes"
                if offsets:
                    value = offsets.pop()
                    assert len(document) == 1 + value % 5
                    seen.add(value)
        finally:
            writer.wait(timeout=30)
            reader.close()
        assert int(writer.stdout.read()) > 1000 and len(seen) > 10
        # Too large for the slot: whole groups only, in order, and the reader is told.
        big = {f"group-{i}": [("topic", p, 10**12 + p) for p in range(8)] for i in range(100)}
        assert segment.publish_committed(big) is False
        document, complete = segment.read_committed()
        assert not complete and 0 < len(document) < 100
        assert document == {g: [list(e) for e in big[g]] for g in list(big)[:len(document)]}
    finally:
        segment.close()
        segment.unlink()


def test_the_transactions_document_is_its_own_area_cut_at_whole_ids():
    name = f"/shmbroker-{unique_instance_id('sx')}-stats"
    segment = S.StatsSegment.create(name, 3, committed_bytes=4096, transactions_bytes=2048)
    try:
        assert segment.transactions.read() == ({}, True)
        segment.publish_committed({"g": [("t", 0, 7)]})
        entry = {"state": "Ongoing", "producer_id": 1, "producer_epoch": 0, "partitions": [["t", 0]]}
        many = {f"id-{i}": {**entry, "producer_id": i} for i in range(100)}
        assert segment.transactions.publish(many) is False
        document, complete = segment.transactions.read()
        assert not complete and 0 < len(document) < 100
        assert document == {key: many[key] for key in list(many)[:len(document)]}  # the first ones, whole
        assert segment.read_committed() == ({"g": [["t", 0, 7]]}, True)  # the other area is untouched
        assert segment.transactions.publish({"one": entry}) is True
        assert segment.transactions.read() == ({"one": entry}, True)
    finally:
        segment.close()
        segment.unlink()


def test_each_row_has_its_own_area_of_denials_by_principal_cleared_for_a_new_owner():
    name = f"/shmbroker-{unique_instance_id('sp')}-stats"
    segment = S.StatsSegment.create(name, 4, committed_bytes=4096, transactions_bytes=2048, principals_bytes=1024)
    try:
        reader = S.StatsSegment.attach(name, writable=False)
        try:
            segment.denials_by_principal[2].publish({"User:alice": {"0": 3}})
            segment.denials_by_principal[3].publish({"User:bob": {"3": 1}})
            segment.transactions.publish({"t": {"state": "Ongoing"}})
            assert reader.denials_by_principal[2].read() == ({"User:alice": {"0": 3}}, True)
            assert reader.denials_by_principal[3].read() == ({"User:bob": {"3": 1}}, True)
            assert reader.transactions.read() == ({"t": {"state": "Ongoing"}}, True)
            segment.reset(2)  # a restarted worker counts from zero
            assert reader.denials_by_principal[2].read() == ({}, True)
            assert reader.denials_by_principal[3].read() == ({"User:bob": {"3": 1}}, True)
            many = {f"User:{i:04}": {"0": i} for i in range(100)}
            assert segment.denials_by_principal[1].publish(many) is False  # cut at a whole principal
            document, complete = reader.denials_by_principal[1].read()
            assert not complete and 0 < len(document) < 100 and reader.denials_by_principal[0].read() == ({}, True)
        finally:
            reader.close()
    finally:
        segment.close()
        segment.unlink()


def test_the_open_states_the_tools_know_are_the_coordinators():
    from shmbroker.node.timer.transactions.metadata import ONGOING, PREPARED
    from shmbroker.node.tools.inspect import OPEN_STATES

    assert OPEN_STATES == tuple(state.value for state in (ONGOING, *PREPARED))


def test_snapshots_are_consistent_while_another_process_publishes():
    name = f"/shmbroker-{unique_instance_id('st')}-stats"
    segment = S.StatsSegment.create(name, 3)
    try:
        writer = subprocess.Popen([sys.executable, "-c", WRITER, name, "2.0"], cwd=REPO, stdout=subprocess.PIPE,
                                  text=True)
        reader = S.StatsSegment.attach(name, writable=False)
        seen = set()
        try:
            deadline = time.monotonic() + 10
            while writer.poll() is None and time.monotonic() < deadline:
                row = reader.read(1)
                values = row.values.copy()
                reference = values[S.OFFSETS["loop_turns"]]
                values[S.OFFSETS["published_ms"]] = reference  # publish() stamps its time in this word
                assert (values == reference).all(), "a torn snapshot mixed two publishes"
                seen.add(int(reference))
        finally:
            writer.wait(timeout=30)
            reader.close()
        published = int(writer.stdout.read())
        assert published > 1000 and len(seen) > 10
        assert segment.read(1).pid == 4242 and segment.read(1).role == "worker"
        assert [row.row for row in segment.snapshot()] == [1]
    finally:
        segment.close()
        segment.unlink()


# -- a live node --------------------------------------------------------------------------------

def test_stats_counts_the_node_at_work(node_factory):
    node = node_factory(workers=2, config="[stats]\npublish_interval_ms = 100\n")
    before = stats_json(node)
    assert [p["role"] for p in before["processes"]] == ["supervisor", "timer", "worker", "worker", "cleaner"]
    assert before["totals"]["children_alive"] == 4

    producer = Producer({"bootstrap.servers": node.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(2000):
        producer.produce("stats-topic", value=b"x" * 100)
        producer.poll(0)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "stats-group",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["stats-topic"])
    got = 0
    deadline = time.monotonic() + 60
    while got < 1500 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got += 1
    consumer.commit(asynchronous=False)
    # Errors in responses, counted per API and per code: a produce to a partition the topic lacks (the
    # produce path's own encoder) and a Metadata request for a topic that is not there (kio's).
    with R.RawConnection("127.0.0.1", node.port) as conn:
        produced = conn.call(P.PRODUCE, 8, R.produce_body({"stats-topic": {7: R.build_record_batch([b"x"])}}, acks=1))
        assert produced.responses[0].partition_responses[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
        meta = conn.call(P.METADATA, 8, R.metadata_body(["not-there"], allow_auto_topic_creation=False))
        assert meta.topics[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
    try:
        def moved():
            doc = stats_json(node)
            apis, totals = doc["apis"], doc["totals"]
            ok = (apis.get("Produce", {}).get("requests", 0) > 0 and apis.get("Fetch", {}).get("requests", 0) > 0
                  and apis["Produce"]["bytes_in"] > 2000 * 100 and apis.get("JoinGroup", {}).get("requests", 0) > 0
                  and totals["purgatory_produce_completed"] > 0 and totals["fsyncs"] > 0
                  and totals["bytes_flushed"] >= 2000 * 100 and totals["groups"] >= 1
                  and totals["group_members"] >= 1 and totals["rebalances"] >= 1 and totals["connections"] >= 2
                  and totals["purgatory_fetch_completed"] + totals["purgatory_fetch_expired"] > 0
                  and totals["bytes_sendfile"] >= got * 100
                  and doc["errors"].get("UNKNOWN_TOPIC_OR_PARTITION", 0) >= 2
                  and "stats-group" in doc["groups"])
            return doc if ok else None

        doc = wait_for(moved, what="counters to move")
    finally:
        consumer.close()
    # The records left by sendfile: part of the fetch responses' bytes, the rest their headers.
    assert doc["totals"]["bytes_sendfile"] < doc["apis"]["Fetch"]["bytes_out"]
    partition = [p for p in doc["partitions"] if p["topic"] == "stats-topic"]
    assert partition == [{"topic": "stats-topic", "partition": 0, "log_start_offset": 0, "log_end_offset": 2000,
                          "high_watermark": 2000, "last_stable_offset": 2000, "unflushed_bytes": 0}]
    assert doc["apis"]["Produce"]["error_responses"] >= 1 and doc["apis"]["Metadata"]["error_responses"] >= 1
    by_level = doc["totals"]["wheel_entries_by_level"]
    assert len(by_level) == doc["totals"]["wheel_levels"] and sum(by_level) == doc["totals"]["wheel_entries"]
    assert sum(r["request"]["frames_sent"] for r in doc["rings"]) > 0
    assert sum(r["completion"]["frames_sent"] for r in doc["rings"]) > 0
    # The group's lag from the segment (no request to the node), and through the Kafka API: 2000 - committed.
    assert doc["groups"]["stats-group"] == {"total_lag": 2000 - got, "partitions": [
        {"topic": "stats-topic", "partition": 0, "committed_offset": got, "high_watermark": 2000, "lag": 2000 - got}]}
    assert doc["groups_complete"] is True
    described = cli("groups", "describe", "stats-group", "--bootstrap", node.bootstrap, "--json")
    assert described.returncode == 0, described.stderr
    group = json.loads(described.stdout)
    (row,) = group["partitions"]
    assert row["high_watermark"] == 2000 and row["committed_offset"] == got and row["lag"] == 2000 - got
    listed = cli("groups", "list", "--bootstrap", node.bootstrap, "--json")
    assert [g["group"] for g in json.loads(listed.stdout)] == ["stats-group"]
    # Human-readable tables too.
    table = cli("stats", "--data-dir", str(node.data_dir))
    assert table.returncode == 0 and "Produce" in table.stdout and "stats-topic" in table.stdout
    assert "UNKNOWN_TOPIC_OR_PARTITION" in table.stdout and "committed offsets and lag" in table.stdout


def test_topics_commands(node):
    assert cli("topics", "create", "cli-topic", "--partitions", "3", "--bootstrap", node.bootstrap).returncode == 0
    listed = json.loads(cli("topics", "list", "--bootstrap", node.bootstrap, "--json").stdout)
    assert {"topic": "cli-topic", "partitions": 3, "error": None} in listed
    described = json.loads(cli("topics", "describe", "cli-topic", "--bootstrap", node.bootstrap, "--json").stdout)
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    catalog = json.loads((node.data_dir / "catalog.json").read_text())
    assert described["topic_id"] == topic_id_text(uuid.UUID(catalog["topics"]["cli-topic"]["id"]))
    table = cli("topics", "describe", "cli-topic", "--bootstrap", node.bootstrap)
    assert table.returncode == 0 and described["topic_id"] in table.stdout
    again = cli("topics", "create", "cli-topic", "--bootstrap", node.bootstrap)
    assert again.returncode == 1 and "TOPIC_ALREADY_EXISTS" in again.stderr
    assert cli("topics", "delete", "cli-topic", "--bootstrap", node.bootstrap).returncode == 0
    missing = cli("topics", "describe", "cli-topic", "--bootstrap", node.bootstrap)
    assert missing.returncode == 1 and "cli-topic" in missing.stderr


def test_process_titles(node_factory):
    node = node_factory(workers=2)
    titles = {" ".join(p.cmdline()).strip() for p in node.children()}
    assert titles == {"shmbroker: timer", "shmbroker: cleaner 0", f"shmbroker: worker 0 {node.bootstrap}",
                      f"shmbroker: worker 1 {node.bootstrap}"}
    assert " ".join(psutil.Process(node.proc.pid).cmdline()).startswith(f"shmbroker: supervisor {node.bootstrap}")


def test_clear_errors_and_exit_codes(tmp_path, node):
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("shmbroker ")
    gone = cli("stats", "--data-dir", str(tmp_path / "nothing"))
    assert gone.returncode == 3 and "no node" in gone.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))  # kept bound, not listening: connects are refused, and no other node takes it
        closed_port = probe.getsockname()[1]
        unreachable = cli("topics", "list", "--bootstrap", f"127.0.0.1:{closed_port}", timeout=90)
    assert unreachable.returncode == 3 and "no broker reachable" in unreachable.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nworkers = 1\n\n[flush]\nflush_interval_ms = \"often\"\n")
    done = cli("serve", "--config", str(bad), "--data-dir", str(tmp_path / "d"))
    assert done.returncode == 2
    assert f"{bad}:5: flush.flush_interval_ms must be int" in done.stderr
    in_use = cli("serve", "--listen", node.bootstrap, "--data-dir", str(tmp_path / "other"), "--workers", "1")
    assert in_use.returncode == 4 and "port is in use" in in_use.stderr
    taken = cli("serve", "--listen", f"127.0.0.1:{closed_port}", "--data-dir", str(node.data_dir), "--workers", "1")
    assert taken.returncode == 4 and "in use by another node" in taken.stderr


def node_with_metrics(node_factory):
    """A one-worker node publishing stats every 100 ms, serving /metrics on a free port: (node, port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    node = node_factory(workers=1, config="[stats]\npublish_interval_ms = 100\n")
    node.stop()
    node.start_args = ["--metrics", f"127.0.0.1:{port}"]
    node.start()
    return node, port


def test_prometheus_endpoint(node_factory):
    node, port = node_with_metrics(node_factory)
    producer = Producer({"bootstrap.servers": node.bootstrap})
    for _ in range(100):
        producer.produce("metrics-topic", value=b"m")
    assert producer.flush(30) == 0

    text = wait_for_metric(port, 'kafka_network_requests_total{request="Produce",worker="0"}',
                           "Produce requests in /metrics")
    assert 'kafka_log_log_end_offset{partition="0",topic="metrics-topic"} 100.0' in text
    assert 'kafka_server_delayed_operations{purgatory="fetch"}' in text
    assert "shmbroker_fsyncs_total" in text
    # docs/metrics.md (generated from the collector) lists exactly the series a live node exposes.
    assert set(re.findall(r"^# TYPE (\w+) ", text, re.M)) == documented_series()
    # Every child settles its collector and counts each collection from then on (gc.freeze's own is before).
    assert 'shmbroker_gc_collections_total{generation="0",index="0",process="worker"}' in text
    assert "shmbroker_gc_pause_us_total" in text and "shmbroker_gc_collected_total" in text
    # A fetch from a partition the topic lacks: its error code, by name.
    with R.RawConnection("127.0.0.1", node.port) as conn:
        fetched = R.parse_fetch_response(11, conn.request(P.FETCH, 11, R.fetch_body({"metrics-topic": {5: 0}})))
        assert [p.error_code for p in fetched.partitions] == [UNKNOWN_TOPIC_OR_PARTITION]
    text = wait_for_metric(port, 'error="UNKNOWN_TOPIC_OR_PARTITION"', "the error code in /metrics")
    assert 'kafka_network_error_responses_total{request="Fetch",worker="0"} 1.0' in text
    # A group's committed offset and lag.
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "metrics-group"})
    try:
        consumer.commit(offsets=[TopicPartition("metrics-topic", 0, 40)], asynchronous=False)
    finally:
        consumer.close()
    lag_line = 'kafka_consumergroup_lag{consumergroup="metrics-group",partition="0",topic="metrics-topic"} 60.0'
    wait_for_metric(port, lag_line, "the group's lag in /metrics")


def test_transactions_in_the_cli_stats_dashboard_and_metrics(node_factory):
    """`transactions list|describe`, `stats`, the dashboard and /metrics show the transaction coordinator's state:
    a committed, an aborted, a timed-out and an open transaction, and the open one's LSO lag."""
    from confluent_kafka.admin import AdminClient, NewTopic
    from rich.console import Console

    from shmbroker.node.tools.dashboard import Dashboard

    node, port = node_with_metrics(node_factory)
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    for future in admin.create_topics([NewTopic("txn-stats", 2, 1)]).values():
        future.result(timeout=30)

    def transactional(transactional_id: str, timeout_ms: int = 60_000) -> Producer:
        producer = Producer({"bootstrap.servers": node.bootstrap, "transactional.id": transactional_id,
                             "linger.ms": 1, "transaction.timeout.ms": timeout_ms})
        producer.init_transactions(30)
        producer.begin_transaction()
        return producer

    def written(producer: Producer, partition: int, count: int) -> Producer:
        for i in range(count):
            producer.produce("txn-stats", value=b"v%d" % i, partition=partition)
        assert producer.flush(30) == 0
        return producer

    written(transactional("committer"), 0, 3).commit_transaction(30)
    written(transactional("aborter"), 0, 2).abort_transaction(30)
    started_ms = time.time_ns() // 1_000_000
    still_open = written(transactional("open"), 1, 5)
    written(transactional("forgotten", timeout_ms=1000), 0, 1)  # the node aborts it past its timeout

    def listed():
        done = cli("transactions", "list", "--data-dir", str(node.data_dir), "--json")
        assert done.returncode == 0, done.stderr
        by_id = {t["transactional_id"]: t for t in json.loads(done.stdout)}
        states = {name: t["state"] for name, t in by_id.items()}
        want = {"committer": "CompleteCommit", "aborter": "CompleteAbort", "open": "Ongoing",
                "forgotten": "CompleteAbort"}
        return by_id if states == want else None

    try:
        by_id = wait_for(listed, what="the four transactional ids in their states")
        assert list(by_id)[0] == "open"  # open transactions come first
        assert by_id["forgotten"]["producer_epoch"] == 1  # the timeout fenced its producer
        assert len({t["producer_id"] for t in by_id.values()}) == 4
        described = cli("transactions", "describe", "open", "--data-dir", str(node.data_dir), "--json")
        assert described.returncode == 0, described.stderr
        entry = json.loads(described.stdout)
        assert entry["state"] == "Ongoing" and entry["producer_epoch"] == 0 and entry["timeout_ms"] == 60_000
        assert entry["partitions"] == [{"topic": "txn-stats", "partition": 1}] and entry["groups"] == []
        assert started_ms - 1000 <= entry["start_ms"] <= time.time_ns() // 1_000_000 and entry["duration_ms"] >= 0
        table = cli("transactions", "describe", "open", "--data-dir", str(node.data_dir))
        assert table.returncode == 0 and "Ongoing" in table.stdout and "txn-stats" in table.stdout
        table = cli("transactions", "list", "--data-dir", str(node.data_dir))
        assert table.returncode == 0 and all(name in table.stdout for name in by_id)
        missing = cli("transactions", "describe", "nobody", "--data-dir", str(node.data_dir))
        assert missing.returncode == 1 and "'nobody' not found" in missing.stderr

        # The same through the Kafka API (ListTransactions, DescribeTransactions), as against any broker.
        same = ("state", "producer_id", "producer_epoch", "timeout_ms", "start_ms", "partitions")
        by_api = cli("transactions", "list", "--bootstrap", node.bootstrap, "--json")
        assert by_api.returncode == 0, by_api.stderr
        api_ids = {t["transactional_id"]: t for t in json.loads(by_api.stdout)}
        assert list(api_ids)[0] == "open"
        assert {name: [t[k] for k in same] for name, t in api_ids.items()} == {
            name: [t[k] for k in same] for name, t in by_id.items()}
        described = cli("transactions", "describe", "open", "--bootstrap", node.bootstrap, "--json")
        assert described.returncode == 0, described.stderr
        assert [json.loads(described.stdout)[k] for k in same] == [entry[k] for k in same]
        table = cli("transactions", "describe", "committer", "--bootstrap", node.bootstrap)
        assert table.returncode == 0 and "CompleteCommit" in table.stdout
        missing = cli("transactions", "describe", "nobody", "--bootstrap", node.bootstrap)
        assert missing.returncode == 1 and "'nobody' not found" in missing.stderr

        def counted():
            doc = stats_json(node)
            totals = doc["totals"]
            got = (totals["transactions_open"], totals["transactions_committed"], totals["transactions_aborted"],
                   totals["transactions_timed_out"])
            return doc if got == (1, 1, 2, 1) else None

        doc = wait_for(counted, what="1 open, 1 committed, 2 aborted (1 timed out) in `stats`")
        lso_lag = {p["partition"]: p["high_watermark"] - p["last_stable_offset"]
                   for p in doc["partitions"] if p["topic"] == "txn-stats"}
        assert lso_lag == {0: 0, 1: 5}
        assert [t["transactional_id"] for t in doc["open_transactions"]] == ["open"]
        table = subprocess.run([*CLI, "stats", "--data-dir", str(node.data_dir)],
                               cwd=REPO, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                               env={**os.environ, "COLUMNS": "240"})
        assert "open transactions" in table.stdout and "LSO lag" in table.stdout, table.stdout
        assert "transactions_timed_out" in table.stdout

        console = Console(record=True, width=240)
        dashboard = Dashboard(str(node.data_dir))
        try:
            dashboard.render()  # the first refresh reads the lag and the transactions; the next shows them
            console.print(dashboard.render())
        finally:
            dashboard._drop("")
        screen = console.export_text()
        assert "transactions open / committed / aborted (timed out)" in screen and "1 / 1 / 2 (1)" in screen
        assert "partition txn-stats-1: LSO lag" in screen and "transaction open: Ongoing" in screen

        text = metrics_page(port)
        for line in ('shmbroker_transactions_open{index="0",process="timer"} 1.0',
                     'shmbroker_transactions_committed_total{index="0",process="timer"} 1.0',
                     'shmbroker_transactions_aborted_total{index="0",process="timer"} 2.0',
                     'shmbroker_transactions_timed_out_total{index="0",process="timer"} 1.0',
                     'kafka_cluster_partition_last_stable_offset_lag{partition="1",topic="txn-stats"} 5.0',
                     'kafka_cluster_partition_last_stable_offset_lag{partition="0",topic="txn-stats"} 0.0'):
            assert line in text, line
        oldest = [line for line in text.splitlines() if line.startswith("shmbroker_transactions_oldest_open_ms ")]
        assert len(oldest) == 1 and float(oldest[0].split()[1]) >= 0
    finally:
        still_open.abort_transaction(30)
