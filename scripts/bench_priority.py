"""The node's priority-aware Fetch, seen by a plain consumer: a backlog on every level of a priority topic
and a steady arrival on the highest level, with the split on and off in the same run.

One trial: a node (fetch_split on or off) with topics T.p0, T.p1, T.p2 of one partition each; --backlog
records of 100 bytes on each level, then a confluent-kafka consumer assigned to all three levels from offset 0
that processes at most --consume-rate records/s (a consumer slower than its producers: why a backlog exists),
while a producer adds --arrival-rate records/s to level 2 for --seconds. Measured:
- the delay of each arrival (consumed at - produced at: its CreateTime) through the backlog: p50/p99/max;
- the share of records each level received while every level still had a backlog, counted from the first
  moment every level had delivered a record (at the start librdkafka may fetch some partitions alone, before
  the others are ready: those records say nothing about the split);
- when each level's backlog was drained.
Trials alternate on/off --runs times; the table shows medians and the on/off ratios of the same run, a PNG
(--plot) the cumulative records per level over time and the arrival delays.

Only 127.0.0.1; every phase is bounded in time. Usage:
    .venv/bin/python -m scripts.bench_priority [--runs 3] [--json] [--plot bench_priority.png]
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from typing import Any

import numpy as np

from shmbroker.clients.priority import level_of, level_topic
from scripts.harness import abba, benchnode
from scripts.harness import rawkafka as R
from scripts.harness.nodeproc import NodeProcess

SCRIPT = "bench_priority"
LEVELS = 3
TOPIC = "work"
RECORD_BYTES = 100
BACKLOG_BATCH = 50  # records per produced backlog batch
PRODUCE = 0
MODES = {"split": "", "plain": "[priority]\nfetch_split = false\n"}


def progress(line: str) -> None:
    print(f"{SCRIPT}: {line}", file=sys.stderr, flush=True)


def make_backlog(port: int, records: int) -> None:
    """`records` on every level, produced raw in pipelined batches."""
    batch = R.make_batch(BACKLOG_BATCH, RECORD_BYTES)
    with R.RawConnection("127.0.0.1", port) as conn:
        for level in range(LEVELS):
            frame = R.encode_request(PRODUCE, 8, 0, R.produce_body({level_topic(TOPIC, level): {0: batch}}))
            batches = records // BACKLOG_BATCH
            for start in range(0, batches, 100):
                count = min(100, batches - start)
                conn.send_frames([(PRODUCE, 8, frame)] * count)
                for _ in range(count):
                    conn.recv_response()


def arrive(bootstrap: str, rate: float, seconds: float, stop: threading.Event, sent: list[int]) -> None:
    """Level-2 records at `rate` per second for `seconds`, paced by the clock."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": 1})
    started = time.monotonic()
    payload = b"x" * RECORD_BYTES
    count = 0
    while not stop.is_set():
        elapsed = time.monotonic() - started
        if elapsed >= seconds:
            break
        due = int(elapsed * rate)
        while count < due:
            producer.produce(level_topic(TOPIC, 2), payload)
            count += 1
        producer.poll(0)
        time.sleep(0.001)
    producer.flush(30)
    sent.append(count)


def trial(args: Any, mode: str) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition

    backlog = args.backlog // BACKLOG_BATCH * BACKLOG_BATCH
    with NodeProcess(workers=args.workers, config=MODES[mode], announce=True) as node:
        for level in range(LEVELS):
            benchnode.create_topic("127.0.0.1", node.port, level_topic(TOPIC, level), 1)
        make_backlog(node.port, backlog)
        consumer = Consumer({
            "bootstrap.servers": node.bootstrap, "group.id": SCRIPT, "enable.auto.commit": False,
            "fetch.max.bytes": args.fetch_max_bytes, "message.max.bytes": min(args.fetch_max_bytes, 1_000_000),
            "queued.max.messages.kbytes": args.prefetch_kbytes,
            "fetch.queue.backoff.ms": 10,  # librdkafka waits 1 s by default once its prefetch is full
        })
        consumer.assign([TopicPartition(level_topic(TOPIC, level), 0, 0) for level in range(LEVELS)])
        stop, sent = threading.Event(), []
        producer = threading.Thread(target=arrive, args=(node.bootstrap, args.arrival_rate, args.seconds, stop, sent))
        consumed = {level: 0 for level in range(LEVELS)}
        timeline: list[tuple[float, int, int, int]] = []  # (s, consumed per level)
        delays_ms: list[float] = []
        shares_at: dict[int, int] | None = None  # consumed per level when the first backlog ran out
        all_started: dict[int, int] | None = None  # consumed per level once every level had delivered a record
        drained_s: dict[int, float] = {}
        started = time.monotonic()
        producer.start()
        deadline = started + args.seconds + args.drain_timeout_s
        batch = max(1, int(args.consume_rate * 0.02))  # 20 ms of processing per consume call
        try:
            while time.monotonic() < deadline:
                if sent and sum(consumed.values()) >= LEVELS * backlog + sent[0]:
                    break
                messages = consumer.consume(num_messages=batch, timeout=0.02)
                received_ms = time.time() * 1000
                for message in messages:
                    if message.error() is not None:
                        continue
                    level = level_of(message.topic())[1]
                    consumed[level] += 1
                    if level == 2 and message.offset() >= backlog:
                        delays_ms.append(received_ms - message.timestamp()[1])
                    if all_started is None and min(consumed.values()) > 0:
                        all_started = dict(consumed)
                    if consumed[level] == backlog and level not in drained_s:
                        drained_s[level] = time.monotonic() - started
                        if shares_at is None:
                            shares_at = dict(consumed)
                timeline.append((time.monotonic() - started, consumed[0], consumed[1], consumed[2]))
                if messages:  # the consumer's own work on the records, at its rate
                    time.sleep(len(messages) / args.consume_rate)
        finally:
            stop.set()
            producer.join(timeout=60)
            consumer.close()
    until = shares_at or consumed
    shares = {level: until[level] - (all_started or {}).get(level, 0) for level in range(LEVELS)}
    total = sum(shares.values())
    delays = np.asarray(delays_ms) if delays_ms else np.asarray([np.nan])
    return {
        "script": SCRIPT, "mode": mode, "records": int(sum(consumed.values())),
        "arrivals": sent[0] if sent else 0, "arrivals_consumed": len(delays_ms),
        "delay_p50_ms": round(float(np.percentile(delays, 50)), 1),
        "delay_p99_ms": round(float(np.percentile(delays, 99)), 1),
        "delay_max_ms": round(float(np.max(delays)), 1),
        "share": {str(level): round(shares[level] / total, 4) if total else None for level in range(LEVELS)},
        "drained_s": {str(level): round(drained_s[level], 2) for level in sorted(drained_s)},
        "timeline": timeline[:: max(1, len(timeline) // 400)], "delays_ms": delays_ms[:: max(1, len(delays_ms) // 2000)],
    }


def summary(rows: list[dict]) -> dict[str, Any]:
    by_mode = {mode: [row for row in rows if row["mode"] == mode] for mode in MODES}

    def median(mode: str, key: str) -> float:
        return statistics.median(row[key] for row in by_mode[mode])

    out: dict[str, Any] = {"script": SCRIPT, "summary": True, "runs": len(by_mode["split"])}
    for mode in MODES:
        for key in ("delay_p50_ms", "delay_p99_ms", "delay_max_ms"):
            out[f"{mode}_{key}"] = median(mode, key)
        out[f"{mode}_share"] = {str(level): round(statistics.median(row["share"][str(level)] for row in by_mode[mode]), 4)
                                for level in range(LEVELS)}
    out["delay_p50_ratio"] = round(out["split_delay_p50_ms"] / out["plain_delay_p50_ms"], 3)
    out["delay_p99_ratio"] = round(out["split_delay_p99_ms"] / out["plain_delay_p99_ms"], 3)
    out["expected_share"] = {str(level): round((1 << level) / ((1 << LEVELS) - 1), 4) for level in range(LEVELS)}
    return out


def print_table(rows: list[dict], total: dict) -> None:
    print(f"\n{'mode':6} {'run':>3} {'L2 delay p50':>13} {'p99':>8} {'max':>8}   share L0/L1/L2        drained at (s)")
    for index, row in enumerate(rows):
        share = "/".join(f"{row['share'][str(level)]:.3f}" for level in range(LEVELS))
        drained = " ".join(f"L{level}:{s}" for level, s in row["drained_s"].items())
        print(f"{row['mode']:6} {index // 2 + 1:>3} {row['delay_p50_ms']:>10.0f} ms {row['delay_p99_ms']:>8.0f} "
              f"{row['delay_max_ms']:>8.0f}   {share:20}  {drained}")
    print(f"\nmedians of {total['runs']} runs: level-2 delay p50 split {total['split_delay_p50_ms']:.0f} ms vs plain "
          f"{total['plain_delay_p50_ms']:.0f} ms (ratio {total['delay_p50_ratio']}), p99 {total['split_delay_p99_ms']:.0f}"
          f" vs {total['plain_delay_p99_ms']:.0f} ms (ratio {total['delay_p99_ratio']})")
    print(f"shares while every level had a backlog: split {total['split_share']}, plain {total['plain_share']}, "
          f"design {total['expected_share']}")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {0: "tab:blue", 1: "tab:orange", 2: "tab:red"}
    for mode, style in (("split", "-"), ("plain", ":")):
        row = next(row for row in rows if row["mode"] == mode)
        times = [point[0] for point in row["timeline"]]
        for level in range(LEVELS):
            left.plot(times, [point[1 + level] for point in row["timeline"]], style, color=colors[level],
                      label=f"level {level}, {mode}")
        delays = np.sort(np.asarray(row["delays_ms"]))
        right.plot(delays, np.linspace(0, 1, len(delays)), style, color="black", label=f"{mode} fetch")
    left.set(xlabel="seconds", ylabel="records consumed", title="Records per level (first run)")
    left.legend(fontsize=7)
    right.set(xlabel="delay of level-2 arrivals (ms)", ylabel="fraction", title="Level-2 delay CDF (first run)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    progress(f"plot written to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = abba.ab_parser(SCRIPT, __doc__, 3, "trials of each mode, alternating (default %(default)s)",
                            "one JSON object per line")
    parser.add_argument("--backlog", type=int, default=60_000, help="records waiting on each level at the start")
    parser.add_argument("--arrival-rate", type=float, default=1000.0, help="level-2 records/s during the trial")
    parser.add_argument("--consume-rate", type=float, default=30_000.0, help="records/s the consumer processes")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long level-2 records arrive")
    parser.add_argument("--drain-timeout-s", type=float, default=30.0)
    parser.add_argument("--fetch-max-bytes", type=int, default=256 * 1024)
    parser.add_argument("--prefetch-kbytes", type=int, default=256, help="librdkafka queued.max.messages.kbytes")
    parser.add_argument("--plot", help="PNG path of the plot")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.backlog < BACKLOG_BATCH or args.consume_rate <= 0 or args.arrival_rate <= 0:
        parser.error("--runs >= 1, --backlog >= 50, positive rates")
    rows = []
    for run in range(args.runs):
        for mode in MODES:
            progress(f"run {run + 1}/{args.runs}: {mode} fetch")
            rows.append(trial(args, mode))
    total = summary(rows)
    if args.json:
        for row in rows:
            benchnode.emit({k: v for k, v in row.items() if k not in ("timeline", "delays_ms")}, True)
        benchnode.emit(total, True)
    else:
        print_table(rows, total)
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
