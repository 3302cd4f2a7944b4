"""Load-test results as JSON lines: the record format the benchmarks append with ``--results PATH`` and the
report job (scripts/report_spark.py) reads, from files or from a topic on the node.

One JSON object per line, one per measured point (format "shmbroker-results/1"):

    format          "shmbroker-results/1"
    run_id          the run the point belongs to: every point of one benchmark invocation shares it;
                    ``--run-id`` (or SHMBROKER_RUN_ID) gives several invocations one id, e.g. a sweep
    script          producer_perf, consumer_perf, e2e_latency, ...
    workload        what was measured, the same in every run, without the load: the key that points of
                    different runs are compared by (e.g. "producer_perf raw acks=1 record_size=100 partitions=4")
    client          raw, confluent, ...
    load            the offered load of the point, for saturation curves (e2e_latency: its --rate in records/s;
                    producer_perf raw: requests in flight, connections x inflight); null when not swept
    load_unit       what load counts
    started_at      unix time (seconds) when the measurement started; ended_at when it ended
    seconds, records, records_per_s, mb_per_s     as the benchmark's JSON line has them
    latency         {"unit": "ns", "significant_bits": 10, "samples": N, "buckets": [[lower_bound, count], ...]}:
                    every latency sample v counted in the bucket of v with all but its 10 leading bits
                    cleared (so each bucket's lower bound is within 2^-9 = 0.2% below its samples),
                    buckets sorted by bound; "buckets": [] when the point measured no latency
    params          the benchmark's other fields (acks, record size, errors, CPU, ...)
    host            {"hostname": ..., "cpus": ...}

Percentiles are nearest-rank over the buckets (``histogram_percentile``): the lower bound of the bucket
holding the ceil(q * N)-th smallest sample, so a percentile read from the histogram is at most 0.2%
below the one of the raw samples.

``python -m scripts.harness.results publish FILE --bootstrap HOST:PORT --topic TOPIC`` produces the lines of
FILE to a topic (one record each, keyed by run id), where report_spark.py --topic reads them.

Invariants: a record is appended whole (one write of one line, the file opened in append mode), so
concurrent benchmarks may share a file; nothing here changes a benchmark's own output.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from typing import Any, Iterable, Sequence

import numpy as np
import orjson

FORMAT = "shmbroker-results/1"
SIGNIFICANT_BITS = 10
WORKLOAD_FIELDS = ("acks", "record_size", "partitions")  # parameters that name a workload (not its load)
_POWERS_OF_TWO = np.left_shift(np.int64(1), np.arange(63, dtype=np.int64))
_RESULT_KEYS = ("script", "client", "records", "records_per_s", "mb_per_s", "seconds", "p50_ms", "p99_ms", "p999_ms")


def latency_histogram(latencies_ns: Sequence[int] | np.ndarray) -> dict[str, Any]:
    samples = np.asarray(latencies_ns, dtype=np.int64)
    samples = samples[samples > 0]
    if len(samples) == 0:
        return {"unit": "ns", "significant_bits": SIGNIFICANT_BITS, "samples": 0, "buckets": []}
    # Clear all but the leading SIGNIFICANT_BITS bits of each sample (bit lengths exactly, not via log2).
    bits = np.searchsorted(_POWERS_OF_TWO, samples, side="right")
    drop = np.maximum(bits - SIGNIFICANT_BITS, 0)
    bounds = (samples >> drop) << drop
    values, counts = np.unique(bounds, return_counts=True)
    return {"unit": "ns", "significant_bits": SIGNIFICANT_BITS, "samples": int(len(samples)),
            "buckets": [[int(v), int(c)] for v, c in zip(values, counts)]}


def histogram_percentile(buckets: Sequence[Sequence[int]], q: float) -> int | None:
    """Nearest-rank q-th percentile (0 < q <= 100) of a histogram: the lower bound of the bucket that holds
    the ceil(q/100 * N)-th smallest sample."""
    total = sum(c for _, c in buckets)
    if total == 0:
        return None
    # ceil(q/100 * total) in integers (q in thousandths of a percent), so 99.9% of 1000 is rank 999, not 1000.
    rank = max(1, -(-round(q * 1000) * total // 100_000))
    seen = 0
    for bound, count in buckets:
        seen += count
        if seen >= rank:
            return int(bound)
    return int(buckets[-1][0])


def workload_of(row: dict[str, Any]) -> str:
    parts = [row["script"], str(row["client"])]
    parts += [f"{k}={row[k]}" for k in WORKLOAD_FIELDS if row.get(k) is not None]
    return " ".join(parts)


def default_run_id(script: str) -> str:
    return os.environ.get("SHMBROKER_RUN_ID") or f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{script}-{os.getpid()}"


def result_record(row: dict[str, Any], latencies_ns: Sequence[int] | np.ndarray | None, *, run_id: str,
                  started_at: float, ended_at: float, load: float | None = None,
                  load_unit: str | None = None) -> dict[str, Any]:
    """The results record of one benchmark JSON line (``benchnode.result_row``) and its latency samples."""
    return {
        "format": FORMAT, "run_id": run_id, "script": row["script"], "workload": workload_of(row),
        "client": str(row["client"]), "load": load, "load_unit": load_unit,
        "started_at": round(started_at, 3), "ended_at": round(ended_at, 3),
        "seconds": row.get("seconds"), "records": row["records"],
        "records_per_s": row.get("records_per_s"), "mb_per_s": row.get("mb_per_s"),
        "latency": latency_histogram(latencies_ns if latencies_ns is not None else ()),
        "params": {k: v for k, v in row.items() if k not in _RESULT_KEYS},
        "host": {"hostname": socket.gethostname(), "cpus": os.cpu_count()},
    }


def append(path: str, records: Iterable[dict[str, Any]]) -> None:
    with open(path, "ab") as out:
        for record in records:
            out.write(orjson.dumps(record) + b"\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", metavar="PATH", help="also append results records (JSON lines, see "
                        "scripts/harness/results.py) to PATH, for scripts/report_spark.py")
    parser.add_argument("--run-id", help="the run id of those records (default: SHMBROKER_RUN_ID, or one per "
                        "invocation)")


class Recorder:
    """What a benchmark calls around each measurement when --results is given (otherwise nothing)."""

    def __init__(self, args: argparse.Namespace, script: str) -> None:
        self.path = getattr(args, "results", None)
        self.run_id = getattr(args, "run_id", None) or default_run_id(script)
        self.started_at = time.time()

    def start(self) -> None:
        self.started_at = time.time()

    def record(self, row: dict[str, Any], latencies_ns: Sequence[int] | np.ndarray | None, *,
               load: float | None = None, load_unit: str | None = None) -> None:
        if not self.path:
            return
        append(self.path, [result_record(row, latencies_ns, run_id=self.run_id, started_at=self.started_at,
                                         ended_at=time.time(), load=load, load_unit=load_unit)])


def publish(path: str, bootstrap: str, topic: str, timeout_s: float = 60.0) -> int:
    """Produce every line of `path` to `topic` (keyed by run id); returns how many."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    failures: list[Any] = []
    count = 0
    with open(path, "rb") as lines:
        for line in lines:
            if not line.strip():
                continue
            record = orjson.loads(line)
            producer.produce(topic, value=line.rstrip(b"\n"), key=str(record.get("run_id", "")).encode(),
                             on_delivery=lambda err, _msg: err is not None and failures.append(err))
            producer.poll(0)
            count += 1
    left = producer.flush(timeout_s)
    if left or failures:
        raise SystemExit(f"results: {left} records unsent, {len(failures)} failed: {failures[:3]}")
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.harness.results",
                                     description="Load-test results records (see the module docstring).")
    sub = parser.add_subparsers(dest="command", required=True)
    pub = sub.add_parser("publish", help="produce a results file's records to a topic")
    pub.add_argument("file")
    pub.add_argument("--bootstrap", required=True, help="HOST:PORT of the node")
    pub.add_argument("--topic", default="loadtest-results")
    args = parser.parse_args(argv)
    count = publish(args.file, args.bootstrap, args.topic)
    print(f"results: published {count} records to {args.topic}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
