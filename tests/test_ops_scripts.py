"""Smoke runs of the operations benchmarks, a few seconds each, against nodes (and Redis) they start themselves:
they finish, print what they promise, write the report's files, and leave nothing behind (temp dirs, processes,
shared memory). Speed is never asserted here: the figures are the scripts' business.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from shmbroker.shm import instance as shm_instance
from shmbroker.shm.instance import instance_id_for

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.node  # each script starts its own nodes


def run(tmp_path: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    temp = tmp_path / "script-tmp"
    temp.mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, *args], cwd=REPO, env={**os.environ, "TMPDIR": str(temp)},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-5000:]
    assert list(temp.iterdir()) == []
    assert [p.pid for p in psutil.process_iter(["cmdline"]) if str(temp) in " ".join(p.info["cmdline"] or ())] == []
    started = re.findall(r"nodeproc: node pid \d+ on 127\.0\.0\.1:(\d+), data (\S+)", done.stderr)
    assert started, done.stderr[-3000:]
    for port, data_dir in started:
        assert shm_instance.list_objects(instance_id_for(data_dir, int(port))) == ([], [])
    return done


def test_bench_stats_compares_both_settings(tmp_path):
    done = run(tmp_path, "-m", "scripts.bench_stats", "--rounds", "1", "--seconds", "1", "--json")
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(r["stats"] for r in rows if "step" in r) == ["disabled", "enabled"]
    summary = rows[-1]
    assert summary["summary"] and summary["enabled_median_records_per_s"] > 0
    assert summary["disabled_median_records_per_s"] > 0 and summary["ratio_median"] > 0


@pytest.mark.timeout(900)  # every section, the node beside Kafka (seven JVM starts) and Redis
def test_bench_report_writes_tables_plots_and_json_lines(tmp_path):
    assert shutil.which("redis-server") and shutil.which("redis-benchmark"), "`make test` installs redis-server"
    out = tmp_path / "report"
    done = run(tmp_path, "-m", "scripts.bench_report", "--runs", "1", "--seconds", "1", "--records", "20000",
               "--workers", "1", "--waiters", "100", "--fanout-rounds", "1", "--grow-mb", "16", "--grow-steps", "2",
               "--rates", "200", "400", "--rate-seconds", "0.5", "--e2e-runs", "2", "--e2e-settle-s", "0",
               "--e2e-tool-records", "200", "--e2e-seconds", "1", "--e2e-warmup-s", "0.5", "--group-members", "20",
               "--group-periods", "1", "--group-join-delay-ms", "500", "--compact-mb", "8", "--out", str(out),
               "--json", timeout=900)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert all(r["run"] == "median" for r in rows)
    sections = {(r["section"], r["system"]) for r in rows}
    for section in ("startup", "producer", "consumer", "together", "size_sweep", "e2e", "waiters"):
        for system in ("shmbroker", "kafka", "redis"):
            assert (section, system) in sections, (section, system)
    for section in ("growth", "saturation", "groups", "transactions", "compaction"):  # no Redis peer
        assert (section, "shmbroker") in sections and (section, "kafka") in sections, section
    # Kafka with an fsync per append is the peer of the acks=all and transaction rows, and of those only.
    fsync_rows = [r for r in rows if r["system"] == "kafka-fsync"]
    assert {r["section"] for r in fsync_rows} == {"producer", "transactions"}, fsync_rows
    assert all("acks=all" in r["case"] for r in fsync_rows if r["section"] == "producer"), fsync_rows
    # The same clients against the node and Kafka: every node row of a Kafka section has Kafka's of its case.
    cases = {(r["section"], r["system"], r.get("case")) for r in rows}
    for row in (r for r in rows if r["system"] == "shmbroker" and r["section"] not in ("target",)):
        assert (row["section"], "kafka", row.get("case")) in cases, row
    assert all(r["records_per_s"] > 0 for r in rows if r.get("records_per_s") is not None)
    # CPU per operation beside every throughput and latency figure of a server.
    measured = [r for r in rows if r["section"] in ("producer", "consumer", "together", "size_sweep", "e2e",
                                                    "waiters", "groups", "transactions")
                and r["system"] != "redis"]
    assert measured and all(r["cpu_us_per_op"] and r["cpu_us_per_op"] > 0 for r in measured), measured
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r for r in lines if r["run"] == "median"] == rows and {r["run"] for r in lines} == {0, "median"}
    # Every node row with a Redis peer names a Redis row that was measured.
    redis_cases = {(r["section"], r["case"]) for r in rows if r["system"] == "redis"}
    assert all((r["section"], r["peer"]) in redis_cases for r in rows if r["system"] == "shmbroker" and r.get("peer"))
    consumers = {(r["system"], r["case"]): r for r in rows if r["section"] == "consumer"}
    for case in ("confluent group x1", "confluent group x3", "kafka-consumer-perf-test x1, group"):
        for system in ("shmbroker", "kafka"):
            assert consumers[system, case]["records"] >= 20000, consumers[system, case]
    for case in ("XREADGROUP x1", "XREADGROUP x3"):
        assert consumers["redis", case]["records"] >= 20000, consumers["redis", case]
    together = [r for r in rows if r["section"] == "together"]
    assert all(r["producer_records_per_s"] > 0 and r["consumer_records_per_s"] > 0 for r in together)
    assert all(r["consumed"] >= 1000 for r in together), together
    for system in ("shmbroker", "kafka"):
        growth = [r for r in rows if r["section"] == "growth" and r["system"] == system]
        assert len(growth) == 2 and 0 < growth[0]["stored_gb"] < growth[1]["stored_gb"], growth
        for step in growth:  # a first step written beside each step, from empty on the second server
            # (Kafka's deleted topics linger a second, its fixed files weigh on a fill this small: the node only)
            assert 0 < step["first_step_gb"] < (growth[1]["stored_gb"] if system == "shmbroker" else 1), step
            assert abs(step["vs_first_now"] - step["records_per_s"] / step["first_step_records_per_s"]) < 0.002
            chunks = [float(r) for r in step["vs_first_now_chunks"].split(" / ")]  # chunk by chunk, in turn
            assert len(chunks) >= 2 and min(chunks) - 0.01 <= step["vs_first_now"] <= max(chunks) + 0.01, step
    saturation = [r for r in rows if r["section"] == "saturation"]
    assert sorted(r["offered_per_s"] for r in saturation) == [200, 200, 400, 400], saturation
    assert all(r["completed_per_s"] > 0 and r["server_cores"] is not None for r in saturation), saturation
    assert all(r["timer_lateness_p99_us"] is not None for r in saturation if r["system"] == "shmbroker")
    e2e = [r for r in rows if r["section"] == "e2e" and r["case"] != "Kafka's EndToEndLatency, one record at a time"]
    assert len(e2e) == 5 and all(r["runs"] == 2 and len(r["p99_runs"].split(" / ")) == 2 for r in e2e), e2e
    redis_p99s = [float(p99) for p99 in next(r for r in e2e if r["system"] == "redis")["p99_runs"].split(" / ")]
    for row in (r for r in e2e if r["system"] != "redis"):  # each round's p99 against that round's Redis
        paired = [float(p99) / peer for p99, peer in zip(row["p99_runs"].split(" / "), redis_p99s)]
        assert [float(r) for r in row["vs_redis_runs"].split(" / ")] == pytest.approx(paired, rel=0.1, abs=0.01)
        assert row["vs_redis_paired"] == pytest.approx(statistics.median(paired), rel=0.1, abs=0.01), row
    for row in (r for r in e2e if r["system"] == "shmbroker"):
        # One worker (--workers 1) serves both the producer and the consumer, in every round, as the stats say.
        assert row["placement_runs"].split(" / ") == ["one worker"] * 2, row
        assert row["vs_redis_one_worker"] == row["vs_redis_paired"], row
        assert row["vs_redis_two_workers"] is None and row["vs_redis_moved_to_one"] is None, row
        assert row["vs_kafka_paired"] > 0, row
    assert all(min(map(float, r["p99_runs"].split(" / "))) - 0.01 <= r["p99_ms"]
               <= max(map(float, r["p99_runs"].split(" / "))) + 0.01 for r in e2e), "p99: the median of the runs'"
    tool = [r for r in rows if r.get("case") == "Kafka's EndToEndLatency, one record at a time"]
    assert {r["system"] for r in tool} == {"shmbroker", "kafka"} and all(r["samples"] == 200 for r in tool)
    waiters = [r for r in rows if r["section"] == "waiters"]
    assert all(r["waiters"] == 100 and r["fanout_ms_median"] > 0 and r["rss_mb"] > 0 for r in waiters)
    groups = [r for r in rows if r["section"] == "groups"]
    assert len(groups) == 4 and all(r["heartbeats"] > 0 and r["members_with_errors"] == 0 for r in groups), groups
    transactions = {(r["system"], r["case"].split()[1]): r for r in rows if r["section"] == "transactions"}
    for system in ("shmbroker", "kafka", "kafka-fsync"):
        assert transactions[system, "transactional,"]["end_txn_p99_ms"] > 0, transactions
        assert transactions[system, "idempotent,"]["records_per_s"] > 0, transactions
    compaction = [r for r in rows if r["section"] == "compaction"]
    assert len(compaction) == 2 and all(r["clean_mb_per_s"] > 0 and r["passes"] >= 1 for r in compaction)
    assert compaction[0]["log_mb"] == compaction[1]["log_mb"], compaction  # the same dirty log
    startup = [r for r in rows if r["section"] == "startup"]
    assert all(r["first_answer_s"] > 0 and r["idle_rss_mb"] > 0 for r in startup), startup
    targets = [r for r in rows if r["section"] == "target"]
    assert len(targets) == 6 and all(isinstance(t["met"], bool) and t["ratio"] > 0 for t in targets), targets
    report = (out / "report.md").read_text()
    # tests/conftest.py's quick JVMs, named: C1 only and, with the archive `make kafka` dumps, Kafka's classes mapped.
    assert re.search(r"Kafka's JVMs ran with -XX:TieredStopAtLevel=1 (-XX:SharedArchiveFile=\S+ )?"
                     r"(-Xlog:\S+ )*\(SHMBROKER_QUICK_JVMS=1, the tests' setting\)", report)
    for title in ("## Targets", "## Where Kafka is ahead", "## 0. Start-up", "## 1. Producer throughput",
                  "## 2. Consumer throughput", "## 3. Producer and consumer", "## 4. Record size sweep",
                  "## 5. Producer throughput while the stored data grows", "## 6. End-to-end latency",
                  "## 7. Purgatory saturation", "## 8. Long-poll waiters", "## 9. Consumer groups",
                  "## 10. Transactions", "## 11. Log compaction"):
        assert title in report, title
    assert "node / Kafka" in report and "node / Redis" in report and "node / Kafka fsync" in report
    for png in ("startup.png", "producer.png", "consumer.png", "together.png", "e2e.png", "waiters.png",
                "groups.png", "transactions.png", "compaction.png", "throughput_vs_record_size.png",
                "latency_cdf.png", "saturation.png", "throughput_vs_stored.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{png}]({png})" in report
    assert "[" in done.stderr  # the progress lines
    kafkas = re.findall(r"kafka_peer: Kafka [\d.]+ pid (\d+)", done.stderr)
    assert kafkas and not any(psutil.pid_exists(int(pid)) for pid in kafkas)  # every JVM stopped


def test_bench_report_takes_medians_over_runs_and_turns_which_server_goes_first(tmp_path):
    from scripts import bench_report

    plan = bench_report.Plan(True, 1, 1.0, 1000, 10, 1, 0, 1, [100.0], 1.0, 1.0, runs=3)
    report = bench_report.Run(tmp_path, plan)
    firsts = []
    for index, (rate, p99) in enumerate(((100.0, 5.0), (300.0, 1.0), (200.0, 3.0))):
        report.index = index
        report.record({"section": "producer", "system": "kafka", "case": "raw x1 acks=1", "records_per_s": rate,
                       "p99_ms": p99, "records": 10})
        stages = bench_report.stages(report, 0, index)
        firsts.append(stages[0][1][0][0].split()[0])
    report.merge()
    report.close()
    (row,) = report.rows
    assert row["records_per_s"] == 200.0 and row["p99_ms"] == 3.0 and row["records"] == 10
    assert row["each_run"] == "100 / 300 / 200" and row["runs_measured"] == 3 and row["run"] == "median"
    assert firsts == ["shmbroker", "kafka", "redis"]  # each run starts with another server
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["run"] for r in lines] == [0, 1, 2, "median"]
