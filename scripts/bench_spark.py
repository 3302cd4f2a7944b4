"""Spark connector benchmark: batch read, batch write and streaming read of a node's topic through
pyspark_shmbroker on local[2], each next to its baselines measured in the same run.

- read: --records (1,000,000) records of --record-size (100) bytes in a --partitions (4) topic, read with
  spark.read.format("shmbroker") into the noop sink. Baselines: the row-tuple path (useArrow=false), and
  the ceiling: a Python data source yielding ready-made Arrow batches of the same schema and row count
  (no node, no decoding): what Spark's Python data source path itself carries on this machine.
- write: a cached DataFrame of as many values written to a new topic (Arrow path, the default), against
  the row path (useArrow=false) and the noop sink (the ceiling).
- stream: readStream with maxOffsetsPerTrigger (--max-offsets-per-trigger) and Trigger.AvailableNow over
  the same topic into the noop sink: records/s from start to end, and the median micro-batch rate.
- decode: records.decode_record_set alone (no Spark, no node), ns per record, fixed-size 100-byte values
  (the run path) and sizes varying record to record (the scalar loop).
Targets: read >= 1,000,000 rows/s and write >= 500,000 rows/s.

Runs are interleaved (read-arrow, read-rows, read-ceiling, read-arrow, ...), after --warmup rounds that
are not counted (the JVM's JIT compiles the hot paths in the first ones); a figure is the median of
--runs, with min and max. CPU: core-seconds per million rows of the driver JVM, its Python workers and the
node (when started here). Progress goes to stderr, one line per run; results as a table, or one JSON
object per line with --json; --plot PNG draws each median with its min-max range next to the targets.
--from-json FILE prints the table (and --plot) of a saved --json run without measuring again. Usage:
    .venv/bin/python -m scripts.bench_spark [--runs 5] [--json > run.jsonl] [--plot bench_spark.png]
    .venv/bin/python -m scripts.bench_spark --from-json run.jsonl --plot bench_spark.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import psutil

from shmbroker.node.storage.records import set_producer
from shmbroker.clients.wire import TopicPartition, parse_servers
from scripts.harness import benchnode, sparkjob

# The connector and pyarrow (shmbroker[spark]) are imported where a measure needs them, so that the module
# imports with the node's dependencies alone (tests/test_script_imports.py), as every script does.
if TYPE_CHECKING:
    import pyarrow as pa

SCRIPT = "bench_spark"
READ_TARGET = 1_000_000
WRITE_TARGET = 500_000
FILL_CHUNK = 10_000  # records per Arrow batch given to the producer when filling the topic
DECODE_RECORDS = 9_000  # about one 1 MiB batch of 100-byte values
DECODE_REPEATS = 30


def progress(message: str) -> None:
    print(f"bench_spark: {message}", file=sys.stderr, flush=True)


def fixed_values(first: int, count: int, size: int) -> pa.Array:
    """`count` values of `size` bytes, each starting with its index (8 bytes, big-endian)."""
    import pyarrow as pa

    matrix = np.full((count, size), ord("x"), dtype=np.uint8)
    matrix[:, : min(8, size)] = (np.arange(first, first + count, dtype=">u8").view(np.uint8)
                                 .reshape(count, 8)[:, : min(8, size)])
    offsets = np.arange(count + 1, dtype=np.int32) * size
    return pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(matrix)])


def fill_topic(bootstrap: str, topic: str, partitions: int, records: int, record_size: int) -> float:
    """The topic filled with the connector's own producer (outside Spark); returns records/s."""
    from pyspark_shmbroker.options import ProducerSettings
    from pyspark_shmbroker.producer import IdempotentProducer, encode_partition

    started = time.monotonic()
    producer = IdempotentProducer(ProducerSettings(servers=tuple(parse_servers(bootstrap))))
    try:
        for index, first in enumerate(range(0, records, FILL_CHUNK)):
            count = min(FILL_CHUNK, records - first)
            tp = TopicPartition(topic, index % partitions)
            producer.add(encode_partition(tp, None, fixed_values(first, count, record_size), None,
                                          producer.settings.batch_bytes, 0, int(time.time() * 1000)))
        producer.flush()
    finally:
        producer.close()
    return records / (time.monotonic() - started)


# --------------------------------------------------------------------------- the ceiling source


def register_ceiling_source(spark: Any) -> None:
    """A Python data source named "shmbroker_ceiling" that yields ready-made Arrow batches of the Kafka
    source's schema: Spark's own cost of carrying them, with nothing read or decoded."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from pyspark_shmbroker.source import kafka_schema

    class CeilingReader(DataSourceReader):
        def __init__(self, options: dict) -> None:
            self.partitions_count = int(options["partitions"])
            self.rows = int(options["rows"])
            self.record_size = int(options["recordsize"])  # Spark lower-cases option names
            self.batch_rows = int(options["batchrows"])

        def partitions(self) -> list:
            return [InputPartition(i) for i in range(self.partitions_count)]

        def read(self, partition: InputPartition):
            import numpy as np
            import pyarrow as pa

            from pyspark_shmbroker.records import arrow_schema

            rows = self.rows // self.partitions_count
            n = min(self.batch_rows, rows)
            values = pa.array([b"x" * self.record_size] * n, pa.binary())
            batch = pa.RecordBatch.from_arrays([
                pa.nulls(n, pa.binary()), values, pa.array(["bench"] * n, pa.string()),
                pa.array(np.full(n, partition.value, dtype=np.int32)), pa.array(np.arange(n, dtype=np.int64)),
                pa.array(np.full(n, 1_700_000_000_000_000, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
                pa.array(np.zeros(n, dtype=np.int32))], schema=arrow_schema(False))
            for first in range(0, rows, n):
                yield batch.slice(0, min(n, rows - first))

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "shmbroker_ceiling"

        def schema(self):
            return kafka_schema(False)

        def reader(self, schema):
            return CeilingReader(dict(self.options))

    spark.dataSource.register(CeilingSource)


# --------------------------------------------------------------------------- measuring


class CpuSampler:
    """Core-seconds used by the Spark JVM (java), its Python workers and the node, between two samples."""

    def __init__(self, jvm_pid: int, node: benchnode.NodeProcess | None) -> None:
        self.jvm = psutil.Process(jvm_pid)
        self.node = psutil.Process(node.proc.pid) if node is not None and node.proc is not None else None

    def sample(self) -> dict[str, float]:
        used = {"jvm": 0.0, "python_workers": 0.0, "node": 0.0}
        for root, name in ((self.jvm, "jvm"), (self.node, "node")):
            if root is None:
                continue
            with contextlib.suppress(psutil.Error):
                for process in [root] + root.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        times = process.cpu_times()
                        key = "python_workers" if name == "jvm" and "python" in process.name() else name
                        used[key] += times.user + times.system
        return used


@dataclass
class Series:
    measure: str
    path: str
    rows: int
    seconds: list[float] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def rates(self) -> list[float]:
        return [self.rows / s for s in self.seconds]

    def median_rate(self) -> float:
        return statistics.median(self.rates())


def timed(series: Series, sampler: CpuSampler, action: Callable[[], Any], counted: bool, label: str) -> None:
    before = sampler.sample()
    started = time.monotonic()
    action()
    elapsed = time.monotonic() - started
    after = sampler.sample()
    rate = series.rows / elapsed
    progress(f"{label}: {rate:,.0f} rows/s ({elapsed:.2f} s){'' if counted else ' [warm-up]'}")
    if counted:
        series.seconds.append(elapsed)
        series.cpu.append({k: (after[k] - before[k]) / series.rows * 1e6 for k in before})


def run_stream(spark: Any, bootstrap: str, topic: str, max_offsets: int, checkpoint: str) -> dict[str, Any]:
    query = (spark.readStream.format("shmbroker").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(max_offsets)).load()
             .writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    finally:
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"streaming query failed: {query.exception()}")
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    return {"micro_batches": len(batches), "max_batch_rows": max(p["numInputRows"] for p in batches),
            "batch_rows_per_s": [p["processedRowsPerSecond"] for p in batches]}


def decode_figures(record_size: int) -> list[dict[str, Any]]:
    """ns per record of decode_record_set on one ~1 MiB batch: fixed-size and varying-size values."""
    import pyarrow as pa

    from pyspark_shmbroker import records as R
    from pyspark_shmbroker.producer import encode_partition

    rng = np.random.default_rng(16)
    cases = {"fixed-size": fixed_values(0, DECODE_RECORDS, record_size),
             "varying-size": pa.array([b"v" * int(n) for n in rng.integers(record_size // 2, record_size * 3 // 2,
                                                                            DECODE_RECORDS)], pa.binary())}
    rows = []
    for name, values in cases.items():
        [batch] = encode_partition(TopicPartition("t", 0), None, values, None, 4 << 20, 0, 1_700_000_000_000)
        set_producer(batch.data, -1, -1, -1)  # and seal it
        data = bytes(batch.data)
        R.decode_record_set(data, "t", 0)
        seconds = [timeit.timeit(lambda: R.decode_record_set(data, "t", 0), number=1) for _ in range(DECODE_REPEATS)]
        ns = statistics.median(seconds) / DECODE_RECORDS * 1e9
        progress(f"decode {name}: {ns:.0f} ns/record")
        rows.append(benchnode.result_row(SCRIPT, f"decode-{name}", DECODE_RECORDS, statistics.median(seconds),
                                         DECODE_RECORDS * record_size, measure="decode", path=name,
                                         ns_per_record=round(ns, 1)))
    return rows


# --------------------------------------------------------------------------- main


def summarize(series: Series, baseline: Series | None, ceiling: Series | None, record_size: int,
              target: int | None) -> dict[str, Any]:
    median_seconds = statistics.median(series.seconds)
    rates = series.rates()
    row = benchnode.result_row(SCRIPT, f"spark-{series.path}", series.rows, median_seconds,
                               series.rows * record_size, measure=series.measure, path=series.path,
                               runs=len(rates), rows_per_s_min=round(min(rates), 1),
                               rows_per_s_max=round(max(rates), 1))
    for key in ("jvm", "python_workers", "node"):
        row[f"{key}_core_s_per_m_rows"] = round(statistics.median(c[key] for c in series.cpu), 3)
    if sparkjob.quick_jvms():  # the tests' setting: C1 only, not Spark as users run it
        row["jvm_options"] = sparkjob.FAST_START_JVM_OPTIONS
    if baseline is not None:
        row[f"vs_{baseline.path}"] = round(series.median_rate() / baseline.median_rate(), 2)
    if ceiling is not None:
        row[f"vs_{ceiling.path}"] = round(series.median_rate() / ceiling.median_rate(), 2)
    if target is not None:
        row["target_rows_per_s"] = target
        row["meets_target"] = series.median_rate() >= target
    row.update(series.extra)
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    columns = ("measure", "path", "records_per_s", "rows_per_s_min", "rows_per_s_max", "vs_rows", "vs_ceiling",
               "vs_arrow", "jvm_core_s_per_m_rows", "python_workers_core_s_per_m_rows", "node_core_s_per_m_rows",
               "ns_per_record", "meets_target")
    shown = [c for c in columns if any(r.get(c) is not None for r in rows)]
    cells = [[("" if r.get(c) is None else f"{r[c]:,.0f}" if isinstance(r.get(c), float) and r[c] > 100
               else str(r[c])) for c in shown] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(shown)]
    print("  ".join(c.ljust(w) for c, w in zip(shown, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """One panel per measure: median rows/s of each path with its min-max range, the target as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measures = [m for m in ("read", "write", "stream") if any(r["measure"] == m for r in rows)]
    if not measures:
        raise SystemExit("bench_spark: no read, write or stream rows to plot")
    figure, axes = plt.subplots(1, len(measures), figsize=(4.2 * len(measures), 3.8), squeeze=False)
    for axis, measure in zip(axes[0], measures):
        chosen = [r for r in rows if r["measure"] == measure]
        medians = [r["records_per_s"] for r in chosen]
        low = [m - r.get("rows_per_s_min", m) for m, r in zip(medians, chosen)]
        high = [r.get("rows_per_s_max", m) - m for m, r in zip(medians, chosen)]
        axis.bar([r["path"] for r in chosen], medians, yerr=[low, high], capsize=4, color="#4c72b0")
        for target in {r["target_rows_per_s"] for r in chosen if r.get("target_rows_per_s")}:
            axis.axhline(target, color="#c44e52", linestyle="--", label=f"target {target:,}")
            axis.legend(loc="best", fontsize=8)
        axis.set_yscale("log")
        axis.set_title(f"{measure} (median of {chosen[0].get('runs', '?')} runs)")
        axis.set_ylabel("rows/s")
        axis.tick_params(axis="x", labelrotation=20)
    figure.suptitle(f"bench_spark: {chosen[0]['records']:,} records through pyspark_shmbroker")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    progress(f"plot written to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_spark", description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="HOST:PORT of a running node on 127.0.0.1 (default: start one)")
    parser.add_argument("--workers", type=int, default=benchnode.DEFAULT_WORKERS,
                        help="network workers of the node started here (default %(default)s)")
    parser.add_argument("--master", default="local[2]", help="Spark master (default %(default)s)")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5, help="counted runs of each measurement")
    parser.add_argument("--warmup", type=int, default=2, help="uncounted rounds first (the JVM's JIT)")
    parser.add_argument("--max-offsets-per-trigger", type=int, nargs="+", default=[100_000, 500_000],
                        help="one streaming measurement per value (default %(default)s)")
    parser.add_argument("--measures", nargs="+", default=["decode", "read", "write", "stream"],
                        choices=["decode", "read", "write", "stream"])
    parser.add_argument("--no-baselines", action="store_true", help="skip the row paths (slow) and the ceilings")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--plot", metavar="PNG", help="also draw the medians and their ranges to this file")
    parser.add_argument("--from-json", metavar="FILE", help="table (and --plot) of a saved --json run; no measuring")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as saved:
            results = [json.loads(line) for line in saved if line.strip()]
        print_table(results)
        if args.plot:
            plot(results, args.plot)
        return 0
    if min(args.records, args.record_size, args.partitions, args.runs, *args.max_offsets_per_trigger) < 1 \
            or args.warmup < 0:
        parser.error("counts and sizes must be positive")
    results: list[dict[str, Any]] = []
    if "decode" in args.measures:
        results += decode_figures(args.record_size)
    spark_measures = [m for m in args.measures if m != "decode"]
    if spark_measures:
        results += run_spark_measures(args, spark_measures)
    if args.json:
        for row in results:
            benchnode.emit(row, True)
    else:
        print_table(results)
    if args.plot:
        plot(results, args.plot)
    return 0


def run_spark_measures(args: argparse.Namespace, measures: list[str]) -> list[dict[str, Any]]:
    scratch = tempfile.mkdtemp(prefix="bench-spark-")
    rows: list[dict[str, Any]] = []
    try:
        with benchnode.node_for(args) as target:
            topic = f"bench-spark-{os.getpid()}"
            benchnode.create_topic(target.host, target.port, topic, args.partitions)
            progress(f"filling {topic}: {args.records:,} records of {args.record_size} B in {args.partitions} "
                     "partitions")
            fill_rate = fill_topic(target.bootstrap, topic, args.partitions, args.records, args.record_size)
            progress(f"filled at {fill_rate:,.0f} records/s")
            progress(f"starting Spark ({args.master})" + (
                f"; its JVM with {sparkjob.FAST_START_JVM_OPTIONS} ({sparkjob.QUICK_JVMS_ENV}=1, the tests' setting): "
                "its figures are not Spark's" if sparkjob.quick_jvms() else ""))
            with sparkjob.spark_session(args.master, scratch, app_name=SCRIPT,
                                        conf={"spark.driver.memory": "2g",
                                              "spark.sql.shuffle.partitions": "2"}) as spark:
                sampler = CpuSampler(spark.sparkContext._gateway.proc.pid, target.node)
                rows = measure_all(spark, sampler, target, topic, args, measures, scratch)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def measure_all(spark: Any, sampler: CpuSampler, target: Any, topic: str, args: argparse.Namespace,
                measures: list[str], scratch: str) -> list[dict[str, Any]]:
    n, bootstrap = args.records, target.bootstrap
    baselines = not args.no_baselines
    series: dict[str, Series] = {}
    actions: dict[str, Callable[[int], Any]] = {}

    def reader(use_arrow: str):
        return lambda run: (spark.read.format("shmbroker").option("kafka.bootstrap.servers", bootstrap)
                            .option("subscribe", topic).option("useArrow", use_arrow).load()
                            .write.format("noop").mode("overwrite").save())

    if "read" in measures:
        series["read-arrow"] = Series("read", "arrow", n)
        actions["read-arrow"] = reader("true")
        if baselines:
            register_ceiling_source(spark)
            series["read-rows"] = Series("read", "rows", n)
            actions["read-rows"] = reader("false")
            series["read-ceiling"] = Series("read", "ceiling", n)
            actions["read-ceiling"] = lambda run: (
                spark.read.format("shmbroker_ceiling").option("partitions", args.partitions).option("rows", n)
                .option("recordSize", args.record_size).option("batchRows", 32_768).load()
                .write.format("noop").mode("overwrite").save())
    if "write" in measures:
        values = (spark.range(n, numPartitions=2)
                  .selectExpr(f"cast(lpad(cast(id as string), {args.record_size}, 'x') as binary) as value").cache())
        values.count()

        def writer(use_arrow: str):
            def write(run: int) -> None:
                out = f"{topic}-w{use_arrow[0]}{run}"
                benchnode.create_topic(target.host, target.port, out, args.partitions)
                (values.write.format("shmbroker").option("kafka.bootstrap.servers", bootstrap).option("topic", out)
                 .option("useArrow", use_arrow).mode("append").save())
            return write

        series["write-arrow"] = Series("write", "arrow", n)
        actions["write-arrow"] = writer("true")
        if baselines:
            series["write-rows"] = Series("write", "rows", n)
            actions["write-rows"] = writer("false")
            series["write-ceiling"] = Series("write", "ceiling", n)
            actions["write-ceiling"] = lambda run: values.write.format("noop").mode("overwrite").save()
    stream_rates: dict[str, list[float]] = {}
    for limit in (args.max_offsets_per_trigger if "stream" in measures else ()):
        name = f"stream-{limit}"
        stream = series[name] = Series("stream", f"trigger{limit}", n)
        stream.extra = {"max_offsets_per_trigger": limit}
        stream_rates[name] = []

        def streamed(run: int, limit: int = limit, name: str = name) -> None:
            got = run_stream(spark, bootstrap, topic, limit, os.path.join(scratch, f"checkpoint-{limit}-{run}"))
            if run >= args.warmup:  # counted runs only
                stream_rates[name].extend(got["batch_rows_per_s"])
            series[name].extra.update(micro_batches=got["micro_batches"], max_batch_rows=got["max_batch_rows"])
            if got["max_batch_rows"] > limit:
                raise RuntimeError(f"a micro-batch of {got['max_batch_rows']} rows exceeds maxOffsetsPerTrigger {limit}")

        actions[name] = streamed
    total = args.warmup + args.runs
    for round_index in range(total):
        counted = round_index >= args.warmup
        for name, action in actions.items():
            label = f"{name} {'run %d/%d' % (round_index - args.warmup + 1, args.runs) if counted else 'warm-up'}"
            timed(series[name], sampler, lambda: action(round_index), counted, label)
    for name, rates in stream_rates.items():
        series[name].extra["micro_batch_rows_per_s_median"] = round(statistics.median(rates), 1)
    rows = []
    for name, item in series.items():
        measure, path = item.measure, item.path
        baseline = series.get(f"{measure}-rows") if path == "arrow" else None
        ceiling = series.get(f"{measure}-ceiling") if path == "arrow" else None
        if measure == "stream":
            baseline = series.get("read-arrow")  # vs_arrow: the batch read of the same records
        target_rate = {"read": READ_TARGET, "write": WRITE_TARGET}.get(measure) if path == "arrow" else None
        rows.append(summarize(item, baseline, ceiling, args.record_size, target_rate))
    return rows


if __name__ == "__main__":
    sys.exit(main())
