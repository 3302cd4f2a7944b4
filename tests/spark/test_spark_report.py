"""The load-test report job (scripts/report_spark.py) on a small generated fixture: its percentile table
matches numpy's nearest-rank percentiles of the same histograms (and the raw samples within the
histogram's 0.2%), throughput is records over seconds with repeated measurements pooled, saturation
curves and run comparisons come out right, and the Parquet tables, PNG plots and Markdown summary are
written and not empty. The same records published to a topic give the same report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from scripts import report_spark
from scripts.harness import results

T0 = 1_790_000_000.0
WORKLOADS = {  # workload row fields -> offered loads (None: not swept)
    ("e2e_latency", "raw", None): [500.0, 1000.0, 2000.0],
    ("producer_perf", "raw", "1"): [8.0, 32.0],
    ("consumer_perf", "raw", None): [None],
}
SIZES = [997, 3001, 5003, 1499]  # sample counts where q * N is never a whole number


def make_fixture(path: Path) -> dict:
    """Two runs of every workload and load, one point measured twice; returns what each point pooled."""
    rng = np.random.default_rng(16)
    expected: dict = {}
    for run_index, run_id in enumerate(["run-a", "run-b"]):
        clock = T0 + 3600 * run_index
        for (script, client, acks), loads in WORKLOADS.items():
            for load_index, load in enumerate(loads):
                repeats = 2 if (run_id == "run-b" and script == "e2e_latency" and load == 1000.0) else 1
                for _ in range(repeats):
                    n = SIZES[(load_index + run_index) % len(SIZES)]
                    scale_ms = 0.3 * (1 + load_index) * (1.2 if run_id == "run-b" else 1.0)
                    samples = None if script == "consumer_perf" else \
                        (rng.lognormal(np.log(scale_ms), 0.6, n) * 1e6).astype(np.int64) + 1
                    seconds = float(rng.uniform(1.0, 3.0))
                    # Throughput grows with the offered load, then flattens (saturation), plus noise.
                    achieved = min((load or 4000.0) * 300.0, 1_000_000.0) * float(rng.uniform(0.9, 1.1))
                    records = int(achieved * seconds)
                    row = {"script": script, "client": client, "records": records, "seconds": seconds,
                           "records_per_s": records / seconds, "mb_per_s": records * 100 / seconds / 1e6}
                    if acks:
                        row.update(acks=acks, record_size=100, partitions=4)
                    record = results.result_record(row, samples, run_id=run_id, started_at=clock,
                                                   ended_at=clock + seconds, load=load,
                                                   load_unit=None if load is None else "offered")
                    clock += 10
                    results.append(str(path), [record])
                    point = expected.setdefault((run_id, record["workload"], load),
                                                {"records": 0, "seconds": 0.0, "samples": []})
                    point["records"] += records
                    point["seconds"] += seconds
                    if samples is not None:
                        point["samples"].append(samples)
    with open(path, "a") as out:
        out.write('{"format": "someone-else/9", "run_id": "x"}\n')  # another format: skipped
    return expected


def check_points(points: pd.DataFrame, expected: dict) -> None:
    assert len(points) == len(expected)
    for _, row in points.iterrows():
        load = None if pd.isna(row["load"]) else row["load"]
        want = expected[(row["run_id"], row["workload"], load)]
        assert row["records_per_s"] == pytest.approx(want["records"] / want["seconds"])
        if not want["samples"]:
            assert pd.isna(row["p99_ms"]) and pd.isna(row["latency_samples"])
            continue
        samples = np.concatenate(want["samples"])
        buckets = results.latency_histogram(samples)["buckets"]
        bucketed = np.repeat([b for b, _ in buckets], [c for _, c in buckets])
        assert row["latency_samples"] == len(samples)
        for name, q in report_spark.PERCENTILES:
            got_ns = row[f"{name}_ms"] * 1e6
            # Exactly numpy's nearest-rank percentile of the histogram...
            assert got_ns == pytest.approx(np.percentile(bucketed, q, method="inverted_cdf"), rel=1e-12)
            assert got_ns == pytest.approx(results.histogram_percentile(buckets, q), rel=1e-12)
            # ...and at most the histogram's 2^-9 below the raw samples'.
            raw = np.percentile(samples, q, method="inverted_cdf")
            assert raw * (1 - 2.0 ** -9) - 1 <= got_ns <= raw


def test_report_tables_plots_and_summary(spark, tmp_path):
    fixture = tmp_path / "results.jsonl"
    expected = make_fixture(fixture)
    out = tmp_path / "report"
    got = report_spark.build_report(spark, [str(fixture)], out, master="local[2]")
    check_points(got["points"], expected)
    assert got["baseline"] == "run-a"
    # Saturation: the swept workloads only, each run's curve in load order, its top throughput the peak.
    saturation = got["saturation"]
    assert set(saturation["workload"]) == {"e2e_latency raw", "producer_perf raw acks=1 record_size=100 partitions=4"}
    for (_, _), curve in saturation.groupby(["run_id", "workload"]):
        assert list(curve["load"]) == sorted(curve["load"])
        assert curve.loc[curve["peak"], "records_per_s"].tolist() == [curve["records_per_s"].max()]
    # Comparison: run-b against run-a, point by point.
    comparison = got["comparison"]
    points = got["points"].set_index(["run_id", "workload", "load"])
    assert len(comparison) == len(expected) // 2 and set(comparison["run_id"]) == {"run-b"}
    for _, row in comparison.iterrows():
        load = row["load"]
        a = points.loc[("run-a", row["workload"], load)] if not pd.isna(load) else \
            got["points"][(got["points"]["run_id"] == "run-a") & (got["points"]["workload"] == row["workload"])].iloc[0]
        assert row["records_per_s_ratio"] == pytest.approx(row["records_per_s"] / a["records_per_s"])
    # Parquet tables as computed.
    assert pq.read_table(out / "points.parquet").num_rows == len(expected)
    assert pq.read_table(out / "comparison.parquet").num_rows == len(comparison)
    # Plots: one saturation figure per swept workload, throughput and p99 bars, ratios to the baseline.
    names = sorted(p.name for p in got["plots"])
    assert names == ["comparison.png", "p99.png", "saturation-e2e-latency-raw.png",
                     "saturation-producer-perf-raw-acks-1-record-size-100-partitions-4.png", "throughput.png"]
    import matplotlib.image

    for plot in got["plots"]:
        assert plot.stat().st_size > 15_000
        pixels = matplotlib.image.imread(plot)
        assert pixels.shape[0] >= 300 and pixels.shape[1] >= 600
        assert len(np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0)) > 50  # lines, bars, text, colours
    summary = got["summary"].read_text()
    for heading in ("## Runs", "## Throughput and latency per run and workload", "## Saturation",
                    "## Comparison across runs", "Baseline: run `run-a`", "1 records of another format"):
        assert heading in summary
    e2e_a = got["points"][(got["points"]["run_id"] == "run-a") & (got["points"]["load"] == 500.0)].iloc[0]
    assert f"| run-a | e2e_latency raw | 500 | {e2e_a['records_per_s']:,.0f} |" in summary
    assert f"{e2e_a['p99_ms']:.3f}" in summary
    assert all(f"plots/{p.name}" in summary for p in got["plots"])


def test_report_from_a_topic_matches_the_files(spark, node_factory, tmp_path):
    node = node_factory(workers=1)
    fixture = tmp_path / "results.jsonl"
    expected = make_fixture(fixture)
    assert results.publish(str(fixture), node.bootstrap, "loadtest-results") == sum(1 for _ in open(fixture))
    got = report_spark.build_report(spark, [], tmp_path / "from-topic", topic="loadtest-results",
                                    bootstrap=node.bootstrap)
    check_points(got["points"], expected)
    assert (tmp_path / "from-topic" / "summary.md").stat().st_size > 2000


def test_histogram_percentile_is_nearest_rank():
    samples = np.arange(1, 1001) * 1000  # q * N is whole for every percentile here
    buckets = results.latency_histogram(samples)["buckets"]
    bucketed = np.repeat([b for b, _ in buckets], [c for _, c in buckets])
    for q in (50, 90, 99, 99.9, 100):
        rank = int(np.ceil(round(q * 1000) * len(samples) / 100_000))
        assert results.histogram_percentile(buckets, q) == np.sort(bucketed)[rank - 1]
    assert results.histogram_percentile([], 50) is None
    assert results.latency_histogram([])["buckets"] == []
