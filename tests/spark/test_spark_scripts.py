"""Smoke test of scripts/bench_spark.py: a short run prints every measurement with its baselines as JSON
lines and draws a plot (again from the saved JSON), the streaming micro-batches respect
maxOffsetsPerTrigger, and the script leaves no process, temp dir or shared memory behind. Speed is never
asserted (benchmarks are not timed tests)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from scripts.harness import sparkjob

pytestmark = pytest.mark.node  # the script starts its own node
REPO = Path(__file__).resolve().parents[2]


def test_bench_spark_smoke(tmp_path):
    temp = tmp_path / "script-tmp"
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_spark.py"), "--json", "--records", "20000", "--runs", "1",
         "--warmup", "0", "--partitions", "2", "--max-offsets-per-trigger", "6000",
         "--plot", str(tmp_path / "bench.png")],
        cwd=REPO, env={**os.environ, "TMPDIR": str(temp)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-5000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert {(r["measure"], r["path"]) for r in rows} == {
        ("decode", "fixed-size"), ("decode", "varying-size"), ("read", "arrow"), ("read", "rows"),
        ("read", "ceiling"), ("write", "arrow"), ("write", "rows"), ("write", "ceiling"),
        ("stream", "trigger6000")}
    for row in rows:
        assert row["script"] == "bench_spark" and row["records_per_s"] > 0, row
    # The tests' quick JVMs (tests/conftest.py) are named in every row Spark measured.
    assert all(r.get("jvm_options") == sparkjob.FAST_START_JVM_OPTIONS for r in rows if r["measure"] != "decode")
    by = {(r["measure"], r["path"]): r for r in rows}
    assert by[("read", "arrow")]["records"] == 20000 and by[("read", "arrow")]["vs_rows"] > 0
    assert by[("write", "arrow")]["target_rows_per_s"] == 500_000
    stream = by[("stream", "trigger6000")]
    assert stream["micro_batches"] == 4 and stream["max_batch_rows"] <= 6000  # 20,000 offsets, 6,000 a trigger
    assert re.search(r"bench_spark: read-arrow run 1/1: [\d,]+ rows/s", done.stderr)
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A saved run gives the table and the plot again without measuring.
    saved = tmp_path / "run.jsonl"
    saved.write_text(done.stdout)
    again = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_spark.py"), "--from-json", str(saved),
         "--plot", str(tmp_path / "again.png")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-5000:]
    header, *lines = again.stdout.splitlines()
    assert header.split()[:3] == ["measure", "path", "records_per_s"] and len(lines) == len(rows)
    assert any(line.split()[:2] == ["read", "arrow"] for line in lines)
    assert (tmp_path / "again.png").stat().st_size > 1000
    # Nothing left: the node, the JVM and its workers, the temp dirs.
    assert list(temp.iterdir()) == []
    assert [p.pid for p in psutil.process_iter(["cmdline"]) if str(temp) in " ".join(p.info["cmdline"] or ())] == []
