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


def test_bench_report_writes_tables_plots_and_json_lines(tmp_path):
    assert shutil.which("redis-server") and shutil.which("redis-benchmark"), "`make test` installs redis-server"
    out = tmp_path / "report"
    done = run(tmp_path, "-m", "scripts.bench_report", "--seconds", "1", "--records", "20000", "--workers", "1",
               "--waiters", "100", "--fanout-rounds", "1", "--grow-mb", "16", "--grow-steps", "2",
               "--rates", "200", "400", "--rate-seconds", "0.5", "--e2e-runs", "2", "--out", str(out), "--json")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    sections = {(r["section"], r["system"]) for r in rows}
    for section in ("producer", "consumer", "together", "size_sweep", "e2e", "waiters"):
        assert (section, "shmbroker") in sections and (section, "redis") in sections, sections
    for section in ("growth", "saturation"):  # node only: Redis has no disk log, no purgatory
        assert (section, "shmbroker") in sections, sections
    assert all(r["records_per_s"] > 0 for r in rows if "records_per_s" in r)
    assert [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()] == rows
    # Every node row with a peer names a Redis row that was measured.
    cases = {(r["section"], r["case"]) for r in rows if r["system"] == "redis"}
    assert all((r["section"], r["peer"]) in cases for r in rows if r["system"] == "shmbroker" and r.get("peer"))
    consumers = {r["case"]: r for r in rows if r["section"] == "consumer"}
    for case in ("confluent group x1", "confluent group x3", "XREADGROUP x1", "XREADGROUP x3"):
        assert consumers[case]["records"] >= 20000, consumers[case]
    together = {r["system"]: r for r in rows if r["section"] == "together"}
    assert all(r["producer_records_per_s"] > 0 and r["consumer_records_per_s"] > 0 for r in together.values())
    assert all(r["consumed"] >= 1000 for r in together.values()), together
    growth = [r for r in rows if r["section"] == "growth"]
    assert len(growth) == 2 and 0 < growth[0]["stored_gb"] < growth[1]["stored_gb"], growth
    for step in growth:  # a first step written beside each step, from empty on the second node, then deleted
        assert 0 < step["first_step_gb"] < growth[1]["stored_gb"], step
        assert abs(step["vs_first_now"] - step["records_per_s"] / step["first_step_records_per_s"]) < 0.002, step
        chunks = [float(r) for r in step["vs_first_now_chunks"].split(" / ")]  # chunk by chunk, in turn
        assert len(chunks) >= 2 and min(chunks) - 0.01 <= step["vs_first_now"] <= max(chunks) + 0.01, step
    saturation = [r for r in rows if r["section"] == "saturation"]
    assert [r["offered_per_s"] for r in saturation] == [200, 400], saturation
    assert all(r["completed_per_s"] > 0 and r["timer_lateness_p99_us"] is not None for r in saturation), saturation
    e2e = [r for r in rows if r["section"] == "e2e"]
    assert len(e2e) == 3 and all(r["runs"] == 2 and len(r["p99_runs"].split(" / ")) == 2 for r in e2e), e2e
    redis_p99s = [float(p99) for p99 in next(r for r in e2e if r["system"] == "redis")["p99_runs"].split(" / ")]
    for row in (r for r in e2e if r["system"] == "shmbroker"):  # each round's node p99 against that round's Redis
        paired = [float(p99) / peer for p99, peer in zip(row["p99_runs"].split(" / "), redis_p99s)]
        assert [float(r) for r in row["vs_redis_runs"].split(" / ")] == pytest.approx(paired, rel=0.1, abs=0.01)
        assert row["vs_redis_paired"] == pytest.approx(statistics.median(paired), rel=0.1, abs=0.01), row
        # One worker (--workers 1) serves both the producer and the consumer, in every round, as the stats say.
        assert row["placement_runs"].split(" / ") == ["one worker"] * 2, row
        assert row["vs_redis_one_worker"] == row["vs_redis_paired"], row
        assert row["vs_redis_two_workers"] is None and row["vs_redis_moved_to_one"] is None, row
    assert all(min(map(float, r["p99_runs"].split(" / "))) - 0.01 <= r["p99_ms"]
               <= max(map(float, r["p99_runs"].split(" / "))) + 0.01 for r in e2e), "p99: the median of the runs'"
    waiters = {r["system"]: r for r in rows if r["section"] == "waiters"}
    assert all(r["waiters"] == 100 and r["fanout_ms_median"] > 0 and r["rss_mb"] > 0 for r in waiters.values())
    targets = [r for r in rows if r["section"] == "target"]
    assert len(targets) == 6 and all(isinstance(t["met"], bool) and t["ratio"] > 0 for t in targets), targets
    report = (out / "report.md").read_text()
    for title in ("## Targets", "## 1. Producer throughput", "## 2. Consumer throughput", "## 3. Producer and consumer",
                  "## 4. Record size sweep", "## 5. Producer throughput while the stored data grows",
                  "## 6. End-to-end latency", "## 7. Purgatory saturation", "## 8. Long-poll waiters"):
        assert title in report, title
    assert "node / Redis" in report and "Not measured" not in report
    for png in ("throughput_vs_record_size.png", "latency_cdf.png", "producer_throughput.png", "saturation.png",
                "throughput_vs_stored.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{png}]({png})" in report
    assert "[" in done.stderr  # the progress lines
