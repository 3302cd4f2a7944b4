"""Load-test report on Spark: per-run, per-workload tables of throughput and latency percentiles
(p50/p90/p99/p99.9), saturation curves and comparisons across runs, written as Parquet, PNG plots and a
Markdown summary.

Input: results records (scripts/harness/results.py, format shmbroker-results/1) from JSON-lines files
(--results FILE|DIR|GLOB ..., what the benchmarks append with their --results option), and/or from a topic
on the node (--topic TOPIC --bootstrap HOST:PORT: the same records published with
`scripts/harness/results.py publish`, read through the pyspark_shmbroker connector).

Computed in Spark (so the same job runs on any cluster with --master; local[*] by default):
- points: one row per (run, workload, load). Records and seconds of the records sharing that key are
  summed (records/s = records / seconds); their latency histograms are pooled (buckets exploded and
  summed per bound), accumulated in bound order over a window, and each percentile is the smallest bound
  whose cumulative count reaches ceil(q/100 * N) (nearest rank, as results.histogram_percentile, in exact
  integer arithmetic).
- saturation: the points of each (run, workload) measured at two loads or more, in load order: achieved
  records/s against p50 and p99 latency. Where throughput stops growing while latency climbs is where
  the node saturates; ``peak`` marks each curve's highest throughput.
- comparison: every (workload, load) measured in the baseline run (--baseline, default the run that
  started first) and in another run: the other run's records/s and p99 as ratios to the baseline's.
Written to --out (default ./loadtest-report): points.parquet, saturation.parquet, comparison.parquet
(Spark's Parquet directories), plots/*.png and summary.md, with progress lines on stderr.
On a cluster the --results paths must be readable by the executors (a shared filesystem), and --out is
written by Spark (Parquet) and by the driver (plots, summary): give a path both can write, or use --topic.

    .venv/bin/python -m scripts.report_spark --results results.jsonl [--out DIR] [--master local[*]]
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import re
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from scripts.harness import results

PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9))
KEY = ("run_id", "workload", "script", "client", "load", "load_unit")
# Percentiles in thousandths of a percent, so ranks are computed in integers: ceil(q * N).
_MILLI_PERCENT = 100_000


def progress(message: str) -> None:
    print(f"report_spark: {message}", file=sys.stderr, flush=True)


def records_schema() -> Any:
    from pyspark.sql.types import (
        ArrayType,
        DoubleType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    latency = StructType([StructField("unit", StringType()), StructField("significant_bits", IntegerType()),
                          StructField("samples", LongType()),
                          StructField("buckets", ArrayType(ArrayType(LongType())))])
    return StructType([
        StructField("format", StringType()), StructField("run_id", StringType()), StructField("script", StringType()),
        StructField("workload", StringType()), StructField("client", StringType()), StructField("load", DoubleType()),
        StructField("load_unit", StringType()), StructField("started_at", DoubleType()),
        StructField("ended_at", DoubleType()), StructField("seconds", DoubleType()),
        StructField("records", LongType()), StructField("records_per_s", DoubleType()),
        StructField("mb_per_s", DoubleType()), StructField("latency", latency),
        # Numbers and nested values of params arrive as their JSON text.
        StructField("params", MapType(StringType(), StringType())),
        StructField("host", StructType([StructField("hostname", StringType()), StructField("cpus", IntegerType())])),
    ])


def expand_paths(patterns: list[str]) -> list[str]:
    paths: list[str] = []
    for pattern in patterns:
        if os.path.isdir(pattern):
            paths += sorted(glob.glob(os.path.join(pattern, "*.jsonl")))
        elif any(ch in pattern for ch in "*?["):
            paths += sorted(glob.glob(pattern))
        else:
            paths.append(pattern)
    return paths


def load_records(spark: Any, paths: list[str], topic: str | None, bootstrap: str | None) -> Any:
    from pyspark.sql import functions as F

    frames = []
    if paths:
        frames.append(spark.read.schema(records_schema()).json(paths))
    if topic:
        values = (spark.read.format("shmbroker").option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", topic).load())
        frames.append(values.select(F.from_json(F.col("value").cast("string"), records_schema()).alias("r"))
                      .select("r.*"))
    if not frames:
        raise SystemExit("report_spark: give --results files or a --topic to read")
    records = frames[0]
    for frame in frames[1:]:
        records = records.unionByName(frame)
    return records


def compute_points(records: Any) -> Any:
    """One row per (run, workload, load): throughput and pooled latency percentiles (ms)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    key = list(KEY)
    throughput = (records.groupBy(key)
                  .agg(F.sum("records").alias("records"), F.sum("seconds").alias("seconds"),
                       F.sum(F.col("mb_per_s") * F.col("seconds")).alias("mb"),
                       F.count(F.lit(1)).alias("measurements"),
                       F.min("started_at").alias("started_at"), F.max("ended_at").alias("ended_at"))
                  .withColumn("records_per_s", F.col("records") / F.col("seconds"))
                  .withColumn("mb_per_s", F.col("mb") / F.col("seconds")).drop("mb"))
    buckets = (records.select(*key, F.explode("latency.buckets").alias("bucket"))
               .select(*key, F.col("bucket")[0].alias("bound"), F.col("bucket")[1].alias("count"))
               .groupBy(*key, "bound").agg(F.sum("count").alias("count")))
    by_key = Window.partitionBy(*key)
    running = by_key.orderBy("bound").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    ranked = (buckets.withColumn("cumulative", F.sum("count").over(running))
              .withColumn("total", F.sum("count").over(by_key)))
    columns = []
    for name, q in PERCENTILES:
        milli = int(round(q * 1000))
        rank = F.expr(f"({milli} * total + {_MILLI_PERCENT - 1}) div {_MILLI_PERCENT}")
        columns.append((F.min(F.when(F.col("cumulative") >= rank, F.col("bound"))) / 1e6).alias(f"{name}_ms"))
    latency = ranked.groupBy(*key).agg(*columns, F.first("total").alias("latency_samples"))
    joined = throughput.join(latency, [throughput[k].eqNullSafe(latency[k]) for k in key], "left")
    return joined.select(*[throughput[k] for k in key],
                         *[c for c in throughput.columns if c not in key],
                         *[f"{name}_ms" for name, _ in PERCENTILES], "latency_samples")


def compute_saturation(points: Any) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    curve = Window.partitionBy("run_id", "workload")
    return (points.filter(F.col("load").isNotNull())
            .withColumn("loads", F.size(F.collect_set("load").over(curve)))
            .filter(F.col("loads") >= 2).drop("loads")
            .withColumn("peak", F.col("records_per_s") == F.max("records_per_s").over(curve))
            .orderBy("workload", "run_id", "load"))


def compute_comparison(points: Any, baseline: str) -> Any:
    from pyspark.sql import functions as F

    base = points.filter(F.col("run_id") == baseline).select(
        "workload", "load", F.col("records_per_s").alias("baseline_records_per_s"), F.col("p99_ms").alias("baseline_p99_ms"))
    other = points.filter(F.col("run_id") != baseline)
    joined = other.join(base, [other["workload"] == base["workload"], other["load"].eqNullSafe(base["load"])])
    return (joined.select(other["workload"], other["load"], other["load_unit"], other["run_id"],
                          other["records_per_s"], "baseline_records_per_s", other["p99_ms"], "baseline_p99_ms")
            .withColumn("baseline_run_id", F.lit(baseline))
            .withColumn("records_per_s_ratio", F.col("records_per_s") / F.col("baseline_records_per_s"))
            .withColumn("p99_ratio", F.col("p99_ms") / F.col("baseline_p99_ms"))
            .orderBy("workload", "load", "run_id"))


# --------------------------------------------------------------------------- plots and summary


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:80]


def save_plot(figure: Any, path: Path) -> Path:
    """Write the figure (its layout tightened) to `path` and free it."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def labelled(frame: Any) -> tuple[Any, list[str]]:
    """A copy of `frame` with a bar label per row (its workload, wrapped, and its load if any), and the
    labels in workload then load order."""
    frame = frame.copy()
    frame["label"] = frame.apply(lambda r: textwrap.fill(r["workload"], 40)
                                 + ("" if r["load"] != r["load"] else f"\n@ load {r['load']:g}"), axis=1)
    order = frame.assign(sort_load=frame["load"].fillna(-1)).sort_values(["workload", "sort_load"])
    return frame, list(dict.fromkeys(order["label"]))


def plot_saturation(saturation: Any, plots: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    written = []
    for workload, curves in saturation.groupby("workload"):
        figure, axis = plt.subplots(figsize=(8, 5))
        for index, (run_id, curve) in enumerate(curves.groupby("run_id")):
            curve = curve.sort_values("load")
            color = f"C{index % 10}"
            axis.plot(curve["records_per_s"], curve["p99_ms"], "o-", color=color, label=f"{run_id} p99")
            axis.plot(curve["records_per_s"], curve["p50_ms"], "s--", color=color, alpha=0.6, label=f"{run_id} p50")
            for _, point in curve.iterrows():
                axis.annotate(f"{point['load']:g}", (point["records_per_s"], point["p99_ms"]), fontsize=7,
                              textcoords="offset points", xytext=(3, 3))
        unit = curves["load_unit"].dropna().iloc[0] if curves["load_unit"].notna().any() else "load"
        axis.set_title(f"Saturation: {workload}\n(points labelled with the offered load, {unit})", fontsize=10)
        axis.set_xlabel("achieved records/s")
        axis.set_ylabel("latency (ms)")
        axis.set_yscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
        axis.yaxis.set_major_formatter(plain)
        axis.yaxis.set_minor_formatter(plain)
        axis.tick_params(axis="y", which="minor", labelsize=7)
        axis.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:,.0f}"))
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
        written.append(save_plot(figure, plots / f"saturation-{slug(workload)}.png"))
    return written


def plot_runs(points: Any, plots: Path) -> list[Path]:
    """Grouped bars per workload (and load) and run: records/s, and p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    frame, labels = labelled(points)
    runs = sorted(frame["run_id"].unique())
    written = []
    for column, title, name in (("records_per_s", "records/s", "throughput"), ("p99_ms", "p99 latency (ms)", "p99")):
        figure, axis = plt.subplots(figsize=(10, max(3.0, 0.6 * len(labels) * max(1, len(runs)) ** 0.5 + 1.5)))
        height = 0.8 / max(1, len(runs))
        for index, run_id in enumerate(runs):
            mine = frame[frame["run_id"] == run_id].set_index("label")
            values = [mine[column].get(label, np.nan) for label in labels]
            axis.barh(np.arange(len(labels)) + index * height, values, height=height, label=run_id, color=f"C{index % 10}")
        axis.set_yticks(np.arange(len(labels)) + height * (len(runs) - 1) / 2)
        axis.set_yticklabels(labels, fontsize=7)
        axis.invert_yaxis()  # first workload on top
        axis.set_xlabel(f"{title} (log scale)")
        axis.set_xscale("log")  # workloads differ by orders of magnitude
        axis.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
        axis.set_title(f"{title} per workload and run")
        axis.grid(True, axis="x", alpha=0.3)
        axis.legend(fontsize=7)
        written.append(save_plot(figure, plots / f"{name}.png"))
    return written


def plot_comparison(comparison: Any, baseline: str, plots: Path) -> list[Path]:
    """Each run's records/s and p99 as ratios to the baseline run's, per workload and load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    if not len(comparison):
        return []
    frame, labels = labelled(comparison)
    runs = sorted(frame["run_id"].unique())
    figure, axes = plt.subplots(1, 2, figsize=(12, max(3.0, 0.6 * len(labels) + 1.5)), sharey=True)
    height = 0.8 / len(runs)
    for axis, column, title in ((axes[0], "records_per_s_ratio", "records/s vs baseline"),
                                (axes[1], "p99_ratio", "p99 latency vs baseline")):
        for index, run_id in enumerate(runs):
            mine = frame[frame["run_id"] == run_id].set_index("label")
            values = [mine[column].get(label, np.nan) for label in labels]
            axis.barh(np.arange(len(labels)) + index * height, values, height=height, label=run_id,
                      color=f"C{(index + 1) % 10}")
        axis.axvline(1.0, color="black", linewidth=1)
        axis.set_title(f"{title} (run {baseline} = 1)", fontsize=10)
        axis.grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks(np.arange(len(labels)) + height * (len(runs) - 1) / 2)
    axes[0].set_yticklabels(labels, fontsize=7)
    axes[0].invert_yaxis()
    axes[1].legend(fontsize=7)
    return [save_plot(figure, plots / "comparison.png")]


def markdown_table(frame: Any, columns: list[tuple[str, str, str]]) -> str:
    """(column, header, format) -> a Markdown table; empty values as '-'."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for _, row in frame.iterrows():
        cells = []
        for column, _, fmt in columns:
            value = row[column]
            cells.append("-" if value is None or value != value else format(value, fmt))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_summary(out: Path, points: Any, saturation: Any, comparison: Any, baseline: str | None,
                  sources: list[str], master: str, plot_files: list[Path], skipped: int) -> Path:
    latency_columns = [(f"{name}_ms", f"{name.replace('p999', 'p99.9')} ms", ".3f") for name, _ in PERCENTILES]
    runs = (points.groupby("run_id").agg(started=("started_at", "min"), ended=("ended_at", "max"),
                                         scripts=("script", lambda s: ", ".join(sorted(set(s)))),
                                         points=("workload", "size")).reset_index().sort_values("started"))
    for column in ("started", "ended"):
        runs[column] = runs[column].map(lambda t: datetime.datetime.fromtimestamp(t, datetime.timezone.utc)
                                        .strftime("%Y-%m-%d %H:%M:%S UTC"))
    parts = [
        "# Load-test report", "",
        f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S UTC} by scripts/report_spark.py "
        f"on Spark {master}, from {int(points['measurements'].sum())} measurements ({', '.join(sources)})."
        + (f" {skipped} records of another format were skipped." if skipped else ""), "",
        "Percentiles are nearest-rank over the pooled log-linear histograms (10 significant bits: a value is "
        "at most 0.2% below the raw samples' percentile).", "",
        "## Runs", "",
        markdown_table(runs, [("run_id", "run", "s"), ("started", "started", "s"), ("ended", "ended", "s"),
                              ("scripts", "scripts", "s"), ("points", "points", "d")]), "",
        "## Throughput and latency per run and workload", "",
        markdown_table(points.sort_values(["run_id", "workload", "load"]),
                       [("run_id", "run", "s"), ("workload", "workload", "s"), ("load", "load", "g"),
                        ("records_per_s", "records/s", ",.0f"), ("mb_per_s", "MB/s", ".2f")] + latency_columns
                       + [("latency_samples", "samples", ",.0f")]), "",
        "## Saturation", "",
    ]
    if len(saturation):
        parts += ["Achieved throughput and latency as the offered load grows; **peak** is each curve's highest "
                  "throughput. Past it, more load only adds latency.", "",
                  markdown_table(saturation.assign(peak=saturation["peak"].map(lambda p: "**peak**" if p else "")),
                                 [("workload", "workload", "s"), ("run_id", "run", "s"), ("load", "load", "g"),
                                  ("load_unit", "unit", "s"), ("records_per_s", "records/s", ",.0f"),
                                  ("p50_ms", "p50 ms", ".3f"), ("p99_ms", "p99 ms", ".3f"), ("peak", "", "s")]), ""]
        parts += [f"![{p.stem}](plots/{p.name})" for p in plot_files if p.name.startswith("saturation-")] + [""]
    else:
        parts += ["No workload was measured at two loads or more in one run (sweep a benchmark's load with one "
                  "--run-id to draw a curve).", ""]
    parts += ["## Comparison across runs", ""]
    if baseline is not None and len(comparison):
        parts += [f"Baseline: run `{baseline}`. A ratio above 1 is more throughput (records/s) or more latency "
                  "(p99).", "",
                  markdown_table(comparison, [("workload", "workload", "s"), ("load", "load", "g"),
                                              ("run_id", "run", "s"), ("records_per_s", "records/s", ",.0f"),
                                              ("records_per_s_ratio", "vs baseline", ".2f"),
                                              ("p99_ms", "p99 ms", ".3f"), ("p99_ratio", "p99 vs baseline", ".2f")]),
                  ""]
    else:
        parts += ["Only one run, or no workload shared with the baseline run: nothing to compare.", ""]
    parts += [f"![{p.stem}](plots/{p.name})" for p in plot_files if not p.name.startswith("saturation-")] + [""]
    parts += ["## Files", "", "- `points.parquet`, `saturation.parquet`, `comparison.parquet`: the tables above",
              "- `plots/`: the figures", ""]
    path = out / "summary.md"
    path.write_text("\n".join(parts))
    return path


def build_report(spark: Any, paths: list[str], out: str | Path, topic: str | None = None,
                 bootstrap: str | None = None, baseline: str | None = None, master: str = "") -> dict[str, Any]:
    """The whole report from results records; returns the tables (pandas) and the files written."""
    from pyspark.sql import functions as F

    out = Path(out)
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    all_records = load_records(spark, paths, topic, bootstrap)
    records = all_records.filter(F.col("format") == results.FORMAT).cache()
    skipped = all_records.count() - records.count()
    if records.count() == 0:
        raise SystemExit("report_spark: no results records (format shmbroker-results/1) found")
    progress(f"{records.count()} records ({skipped} skipped) from {len(paths)} files{' and ' + topic if topic else ''}")
    points = compute_points(records).cache()
    if baseline is None:
        baseline = points.orderBy("started_at").first()["run_id"]
    saturation = compute_saturation(points)
    comparison = compute_comparison(points, baseline)
    for name, frame in (("points", points), ("saturation", saturation), ("comparison", comparison)):
        frame.write.mode("overwrite").parquet(str(out / f"{name}.parquet"))
        progress(f"wrote {name}.parquet")
    tables = {"points": points.toPandas(), "saturation": saturation.toPandas(), "comparison": comparison.toPandas()}
    plot_files = (plot_saturation(tables["saturation"], plots) + plot_runs(tables["points"], plots)
                  + plot_comparison(tables["comparison"], baseline, plots))
    progress(f"wrote {len(plot_files)} plots")
    sources = [f"{len(paths)} files"] + ([f"topic {topic}"] if topic else [])
    summary = write_summary(out, tables["points"], tables["saturation"], tables["comparison"],
                            baseline if tables["points"]["run_id"].nunique() > 1 else None, sources, master,
                            plot_files, skipped)
    records.unpersist()
    points.unpersist()
    progress(f"wrote {summary} in {time.monotonic() - started:.1f} s")
    return {**tables, "baseline": baseline, "plots": plot_files, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.report_spark", description=__doc__.splitlines()[0])
    parser.add_argument("--results", nargs="*", default=[], help="results files, directories (*.jsonl) or globs")
    parser.add_argument("--topic", help="also read the records from this topic (through pyspark_shmbroker)")
    parser.add_argument("--bootstrap", help="HOST:PORT of the node holding --topic")
    parser.add_argument("--out", default="loadtest-report", help="output directory (default %(default)s)")
    parser.add_argument("--baseline", help="run id the others are compared with (default: the earliest)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default %(default)s)")
    args = parser.parse_args(argv)
    if args.topic and not args.bootstrap:
        parser.error("--topic needs --bootstrap")
    paths = expand_paths(args.results)
    missing = [p for p in paths if "://" not in p and not os.path.exists(p)]
    if missing:
        parser.error(f"no such results file: {missing[0]}")
    from scripts.harness import sparkjob

    scratch = tempfile.mkdtemp(prefix="report-spark-")
    try:
        progress(f"starting Spark ({args.master})")
        with sparkjob.spark_session(args.master, scratch, app_name="shmbroker-loadtest-report") as spark:
            build_report(spark, paths, args.out, args.topic, args.bootstrap, args.baseline, args.master)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
