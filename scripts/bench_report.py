"""The load-test report: the node beside Redis Streams on the same machine in the same run, as JSON lines,
PNG plots and a Markdown report.

Sections (the Kafka reference benchmark table, seed 004) and what this version measures:
1. producer throughput, 100-byte records: the node with 1 and 3 raw producers and confluent-kafka, acks=1 and
   acks=all; Redis with redis-benchmark XADD pipelined (-P 16), 1 and 3 clients, without persistence and with
   appendfsync always (the honest peer of acks=all);
2. consumer throughput, 1 consumer (raw fetches and confluent-kafka) beside Redis XREAD COUNT 1000 from the start;
4. record size sweep 10 B - 100 KB: records/s and MB/s, the node's raw producer beside XADD;
6. end-to-end latency with a long-polling consumer (confluent-kafka, 1000 records/s) beside Redis XREAD BLOCK.
Sections 3 (producer and consumer together), 5 (throughput while the data grows to 10 GB), 7 (purgatory
saturation) and 8 (10,000 long-polling connections) are not measured by this version: the report says so.

The node's figures come from the benchmark scripts (producer_perf.py, consumer_perf.py, e2e_latency.py) run
against one node started here; Redis runs from the distribution's redis-server (`make redis`), started by this
script on a free loopback port with its own temp dir and stopped by its pid. Every step is bounded in time.
Output in --out (default ./bench-report): results.jsonl, *.png, report.md. Usage:
    .venv/bin/python scripts/bench_report.py --quick      # about 5 minutes
    .venv/bin/python scripts/bench_report.py              # longer runs per step
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import orjson

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchnode  # noqa: E402
from nodeproc import NodeProcess, free_port  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent
SIZES = (10, 100, 1000, 10_000, 100_000)
REDIS_PIPELINE = 16
REDIS_START_TIMEOUT_S = 20.0
STEP_TIMEOUT_S = 600.0


class Progress:
    """One line per step on stderr: [step/total] what (elapsed)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.started = time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        bar = "#" * (20 * self.done // self.total)
        print(f"[{bar:<20}] {self.done}/{self.total} {what} ({time.monotonic() - self.started:.0f} s)",
              file=sys.stderr, flush=True)


# -- Redis -----------------------------------------------------------------------------------

@contextmanager
def redis_server(appendfsync_always: bool) -> Iterator[int]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("bench_report: redis-server is missing: run `make redis` (Debian package redis-server)")
    port = free_port()
    work = tempfile.mkdtemp(prefix="shmbroker-redis-")
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", work, "--save", "",
            "--daemonize", "no", "--protected-mode", "yes", "--logfile", os.path.join(work, "redis.log")]
    args += ["--appendonly", "yes", "--appendfsync", "always"] if appendfsync_always else ["--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {proc.returncode}")
                time.sleep(0.05)
        else:
            raise RuntimeError("redis-server did not start")
        yield port
    finally:
        proc.terminate()  # by pid
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
        shutil.rmtree(work, ignore_errors=True)


def redis_xadd(port: int, clients: int, value_size: int, requests: int, stream: str) -> dict:
    """redis-benchmark XADD, pipelined: records/s."""
    value = "v" * value_size
    done = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
                           "-P", str(REDIS_PIPELINE), "-n", str(requests), "--csv", "XADD", stream, "*", "f", value],
                          capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    rows = [line for line in done.stdout.splitlines() if line.startswith('"XADD')]
    if done.returncode != 0 or not rows:
        raise RuntimeError(f"redis-benchmark failed: {done.stderr[-500:]}")
    rps = float(rows[-1].split(",")[1].strip('"'))
    return {"records_per_s": round(rps, 1), "mb_per_s": round(rps * value_size / 1e6, 3)}


def redis_consume(port: int, records: int, value_size: int) -> dict:
    """Fill a stream (redis-benchmark), then read it from the start with XREAD COUNT 1000 (redis-py)."""
    import redis

    stream = f"consume-{os.getpid()}"
    redis_xadd(port, 1, value_size, records, stream)
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        last, got = "0-0", 0
        started = time.monotonic()
        deadline = started + STEP_TIMEOUT_S
        while time.monotonic() < deadline:
            reply = client.xread({stream: last}, count=1000)
            if not reply:
                break
            entries = reply[0][1]
            got += len(entries)
            last = entries[-1][0]
        elapsed = time.monotonic() - started
    finally:
        client.close()
    return {"records": got, "records_per_s": round(got / elapsed, 1), "mb_per_s": round(got * value_size / elapsed / 1e6, 3)}


def redis_e2e(port: int, rate: float, seconds: float, value_size: int) -> list[int]:
    """Paced XADD from one connection, XREAD BLOCK from another: latencies in ns."""
    import redis

    stream = f"e2e-{os.getpid()}"
    producer = redis.Redis(host="127.0.0.1", port=port)
    consumer = redis.Redis(host="127.0.0.1", port=port)
    latencies: list[int] = []
    stop = threading.Event()
    padding = b"x" * max(0, value_size - 20)

    def send() -> None:
        interval = 1 / rate
        next_at = time.monotonic()
        end = next_at + seconds
        while not stop.is_set() and next_at < end:
            now = time.monotonic()
            if now < next_at:
                time.sleep(next_at - now)
            producer.xadd(stream, {"t": str(time.monotonic_ns()).encode(), "p": padding})
            next_at += interval

    thread = threading.Thread(target=send)
    last = "$"
    try:
        consumer.xadd(stream, {"t": b"0"})
        last = "$"
        thread.start()
        deadline = time.monotonic() + seconds + 10
        while time.monotonic() < deadline and (thread.is_alive() or last != "$"):
            reply = consumer.xread({stream: last}, block=1000, count=1000)
            now = time.monotonic_ns()
            if not reply:
                if not thread.is_alive():
                    break
                continue
            for entry_id, fields in reply[0][1]:
                last = entry_id
                stamp = int(fields[b"t"])
                if stamp:
                    latencies.append(now - stamp)
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(seconds + 10)
        producer.close()
        consumer.close()
    return latencies


# -- the node ----------------------------------------------------------------------------------

def run_script(name: str, *args: str) -> list[dict]:
    done = subprocess.run([sys.executable, str(SCRIPTS / name), "--json", *args], capture_output=True, text=True,
                          timeout=STEP_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed: {done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def node_e2e(bootstrap: str, rate: float, seconds: float, value_size: int) -> list[int]:
    import e2e_latency

    host, port = benchnode.parse_bootstrap(bootstrap)
    run = e2e_latency.LatencyRun(f"report-e2e-{os.getpid()}", rate, seconds, 0.5, value_size)
    outcome = e2e_latency.run_confluent(benchnode.Target(host, port, None), run)
    return list(outcome.latencies_ns)


# -- report --------------------------------------------------------------------------------------

def percentiles(latencies_ns: list[int]) -> dict:
    if not latencies_ns:
        return {"p50_ms": None, "p99_ms": None, "p999_ms": None, "samples": 0}
    ordered = sorted(latencies_ns)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6, 3)

    return {"p50_ms": at(0.5), "p99_ms": at(0.99), "p999_ms": at(0.999), "samples": len(ordered)}


def plots(out: Path, rows: list[dict], latencies: dict[str, list[int]]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    sweep = [r for r in rows if r["section"] == "size_sweep"]
    if sweep:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        for system, style in (("shmbroker", "o-"), ("redis", "s--")):
            points = sorted((r["record_size"], r["records_per_s"], r["mb_per_s"]) for r in sweep if r["system"] == system)
            if points:
                left.plot([p[0] for p in points], [p[1] for p in points], style, label=system)
                right.plot([p[0] for p in points], [p[2] for p in points], style, label=system)
        for axis, label in ((left, "records/s"), (right, "MB/s")):
            axis.set_xscale("log")
            axis.set_yscale("log")
            axis.set_xlabel("record size (bytes)")
            axis.set_ylabel(label)
            axis.grid(True, which="both", alpha=0.3)
            axis.legend()
        fig.suptitle("Producer throughput against record size (acks=1 / no persistence)")
        fig.tight_layout()
        fig.savefig(out / "throughput_vs_record_size.png", dpi=110)
        plt.close(fig)
        made.append("throughput_vs_record_size.png")
    if latencies:
        fig, axis = plt.subplots(figsize=(7, 4.2))
        for name, values in latencies.items():
            if values:
                ordered = sorted(v / 1e6 for v in values)
                axis.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=name)
        axis.set_xscale("log")
        axis.set_xlabel("end-to-end latency (ms)")
        axis.set_ylabel("fraction of records")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
        axis.set_title("End-to-end latency CDF (long-poll fetch vs XREAD BLOCK)")
        fig.tight_layout()
        fig.savefig(out / "latency_cdf.png", dpi=110)
        plt.close(fig)
        made.append("latency_cdf.png")
    producers = [r for r in rows if r["section"] == "producer"]
    if producers:
        fig, axis = plt.subplots(figsize=(9, 4.5))
        labels = [r["case"] for r in producers]
        axis.barh(labels, [r["records_per_s"] for r in producers],
                  color=["tab:blue" if r["system"] == "shmbroker" else "tab:red" for r in producers])
        axis.set_xscale("log")
        axis.grid(True, which="both", axis="x", alpha=0.3)
        axis.set_xlabel("records/s (100-byte records, log scale)")
        axis.set_title("Producer throughput: shmbroker (blue) and Redis Streams (red)")
        fig.tight_layout()
        fig.savefig(out / "producer_throughput.png", dpi=110)
        plt.close(fig)
        made.append("producer_throughput.png")
    return made


def _cell(value: object, column: str) -> str:
    if value is None:
        return ""
    if column.endswith("_ms") and isinstance(value, (int, float)):
        return f"{value:.2f}"
    if column in ("records_per_s", "samples", "record_size") and isinstance(value, (int, float)):
        return f"{value:,.0f}"
    if column == "mb_per_s" and isinstance(value, (int, float)):
        return f"{value:,.1f}"
    return str(value)


def markdown(out: Path, rows: list[dict], made: list[str], quick: bool, elapsed_s: float) -> str:
    lines = [f"# shmbroker load-test report ({'quick' if quick else 'full'} run)", "",
             f"Same machine, same run: the node (started here, {rows[0].get('workers', '?') if rows else '?'} "
             f"workers) and Redis Streams (redis-server from the distribution). Run time {elapsed_s:.0f} s.", ""]

    def table(section: str, title: str, columns: list[str]) -> None:
        chosen = [r for r in rows if r["section"] == section]
        if not chosen:
            return
        lines.extend([f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)])
        for r in chosen:
            lines.append("| " + " | ".join(_cell(r.get(c), c) for c in columns) + " |")
        lines.append("")

    table("producer", "1. Producer throughput, 100-byte records", ["system", "case", "records_per_s", "mb_per_s", "p99_ms"])
    best_node = max((r["records_per_s"] for r in rows if r["section"] == "producer" and r["system"] == "shmbroker"
                     and "acks=1" in r["case"] and "raw" in r["case"]), default=None)
    best_redis = max((r["records_per_s"] for r in rows if r["section"] == "producer" and r["system"] == "redis"
                      and "no persistence" in r["case"]), default=None)
    if best_node and best_redis:
        lines.append(f"Target: node producer records/s >= redis-benchmark XADD with pipelining: "
                     f"{best_node:,.0f} vs {best_redis:,.0f} (ratio {best_node / best_redis:.2f}).\n")
    table("consumer", "2. Consumer throughput, 1 consumer", ["system", "case", "records_per_s", "mb_per_s"])
    table("size_sweep", "4. Record size sweep (producer)", ["system", "record_size", "records_per_s", "mb_per_s"])
    table("e2e", "6. End-to-end latency, long-polling consumer", ["system", "case", "p50_ms", "p99_ms", "p999_ms", "samples"])
    e2e = {r["system"]: r for r in rows if r["section"] == "e2e"}
    if "shmbroker" in e2e and "redis" in e2e and e2e["redis"]["p99_ms"]:
        ratio = e2e["shmbroker"]["p99_ms"] / e2e["redis"]["p99_ms"]
        lines.append(f"Target: end-to-end p99 <= 2x Redis XREAD BLOCK p99: ratio {ratio:.2f}.\n")
    lines += ["## Not measured by this version", "",
              "3. producer and consumer together; 5. throughput while the data grows to 10 GB; "
              "7. purgatory saturation (see scripts/bench_delayed.py, scripts/bench_purgatory.py); "
              "8. 10,000 long-polling connections beside 10,000 XREAD BLOCK clients.", ""]
    for png in made:
        lines += [f"![{png}]({png})", ""]
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about 5 minutes")
    parser.add_argument("--out", default="bench-report", help="output directory (default %(default)s)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, help="seconds per measurement (default: 4 with --quick, else 15)")
    parser.add_argument("--records", type=int, help="records per consumer run (default: 300,000 with --quick)")
    parser.add_argument("--json", action="store_true", help="the JSON lines on stdout instead of the Markdown")
    args = parser.parse_args(argv)
    seconds = args.seconds or (4.0 if args.quick else 15.0)
    records = args.records or (300_000 if args.quick else 2_000_000)
    if seconds <= 0 or records < 1000 or args.workers < 1:
        parser.error("--seconds and --workers must be positive, --records at least 1000")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    latencies: dict[str, list[int]] = {}
    started = time.monotonic()
    progress = Progress(total=6 + 1 + len(SIZES) + 1 + 2 * 2 + 1 + len(SIZES) + 1)
    results = open(out / "results.jsonl", "wb")

    def record(row: dict) -> None:
        rows.append(row)
        results.write(orjson.dumps(row) + b"\n")
        results.flush()

    try:
        with NodeProcess(workers=args.workers, announce=True) as node:
            bootstrap = node.bootstrap
            for client, producers in (("raw", 1), ("raw", 3), ("confluent", 1)):
                for acks in ("1", "all"):
                    extra = ["--processes", str(producers), "--connections", str(max(4, producers))] if client == "raw" else []
                    (row,) = run_script("producer_perf.py", "--bootstrap", bootstrap, "--client", client, "--acks", acks,
                                        "--seconds", str(seconds), *extra)
                    record({"section": "producer", "system": "shmbroker", "workers": args.workers,
                            "case": f"{client} x{producers} acks={acks}", "records_per_s": row["records_per_s"],
                            "mb_per_s": row["mb_per_s"], "p99_ms": row.get("p99_ms")})
                    progress.step(f"node producer {client} x{producers} acks={acks}")
            consumed = run_script("consumer_perf.py", "--bootstrap", bootstrap, "--data-dir", str(node.data_dir),
                                  "--records", str(records), "--seconds", str(seconds), "--passes", "1")
            for row in consumed:
                record({"section": "consumer", "system": "shmbroker", "case": row["client"],
                        "records_per_s": row["records_per_s"], "mb_per_s": row["mb_per_s"]})
            progress.step("node consumers")
            for size in SIZES:
                batch = max(8192, size + 128)
                (row,) = run_script("producer_perf.py", "--bootstrap", bootstrap, "--client", "raw", "--acks", "1",
                                    "--record-size", str(size), "--batch-bytes", str(batch), "--seconds", str(seconds / 2))
                record({"section": "size_sweep", "system": "shmbroker", "record_size": size,
                        "records_per_s": row["records_per_s"], "mb_per_s": row["mb_per_s"]})
                progress.step(f"node size {size}")
            latencies["shmbroker (confluent-kafka, long-poll fetch)"] = node_latencies = node_e2e(
                bootstrap, 1000.0, seconds * 2, 100)
            record({"section": "e2e", "system": "shmbroker", "case": "confluent-kafka, 1000 records/s",
                    **percentiles(node_latencies)})
            progress.step("node end-to-end latency")
        for always in (False, True):
            mode = "appendfsync always" if always else "no persistence"
            with redis_server(always) as port:
                for clients in (1, 3):
                    requests = (records if not always else records // 10) * clients
                    got = redis_xadd(port, clients, 100, requests, f"p{clients}")
                    record({"section": "producer", "system": "redis", "case": f"XADD -P {REDIS_PIPELINE} x{clients} {mode}",
                            **got})
                    progress.step(f"redis XADD x{clients} {mode}")
                if not always:
                    got = redis_consume(port, records, 100)
                    record({"section": "consumer", "system": "redis", "case": "XREAD COUNT 1000", **got})
                    progress.step("redis consumer")
                    for size in SIZES:
                        count = max(2000, min(records, int(records * 100 / size)))
                        got = redis_xadd(port, 1, size, count, f"s{size}")
                        record({"section": "size_sweep", "system": "redis", "record_size": size, **got})
                        progress.step(f"redis size {size}")
                    latencies["redis (XREAD BLOCK)"] = redis_latencies = redis_e2e(port, 1000.0, seconds * 2, 100)
                    record({"section": "e2e", "system": "redis", "case": "redis-py, 1000 records/s",
                            **percentiles(redis_latencies)})
                    progress.step("redis end-to-end latency")
    finally:
        results.close()
    made = plots(out, rows, latencies)
    text = markdown(out, rows, made, args.quick, time.monotonic() - started)
    if args.json:
        for row in rows:
            print(orjson.dumps(row).decode())
    else:
        print(text)
    print(f"bench_report: {out / 'report.md'}, {out / 'results.jsonl'}, {', '.join(made)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
