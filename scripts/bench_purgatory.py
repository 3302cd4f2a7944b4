#!/usr/bin/env python3
"""Purgatory benchmark: the Purgatory Redesign Proposal's test, as Kafka's TestPurgatoryPerformance runs it.

N requests arrive with exponential inter-arrival times at --rate; each gets a completion latency drawn from a
log-normal distribution fixed by its 75th and 50th percentiles (case low: 60/20 ms, case high: 400/200 ms),
a 200 ms timeout and 3 distinct watch keys out of 100. A request whose latency is below the timeout is
force-completed at arrival + latency (the current Java port schedules it at the timeout instead, a bug not
copied here); the others expire. Time is integer monotonic milliseconds.

Implementations (--impl):
  wheel-timer    node.timer.wheel.TimingWheel alone, as the node calls it: add / cancel per request, advance.
  heapq-timer    baseline (a): a bare heapq of (deadline, request), lazy cancel flag, pop expired.
  purgatory      node.timer.purgatory.Purgatory, as the timer process calls it: one DelayedOperation per
                 request, try_complete_else_watch / force_complete / advance.
  purgatory-0.8  baseline (b): Kafka 0.8.x style: a heapq delay queue of requests with lazy deletion, per-key
                 Python watcher lists, and on every reaper pass (one per advance) a purge that scans every
                 watcher list when their total size reaches --purge-interval (and the delay queue when its
                 size does), as 0.8.x's ExpiredRequestReaper did on each poll.

--clock virtual runs the events as fast as possible: the timer owner wakes every --step-ms of virtual time
(default: one tick), takes that step's arrivals and completions and advances the clock; it reports
requests per CPU-second. --clock real paces arrivals in real time and reports target and achieved rate, CPU %
and timer lateness (fire time minus deadline) p50/p99/max.

Each (impl, case, rate) runs in its own child process (so peak RSS is per configuration), --repeat times;
the parent reports medians. --outstanding M first loads M timers (or watched operations) with deadlines hours
away, to compare the cost per request with 10k and 1M timers outstanding.

Examples:
  python -m scripts.bench_purgatory --json                        # all impls, both cases, 100k/s and 1M/s
  python -m scripts.bench_purgatory --clock real --requests 200000
  python -m scripts.bench_purgatory --impl wheel-timer,purgatory --outstanding 1000000 --rate 100000
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

from shmbroker.node.config import WheelConfig
from shmbroker.node.timer.purgatory import DelayedOperation, Purgatory
from shmbroker.node.timer.wheel import TimingWheel

IMPLS = ("wheel-timer", "heapq-timer", "purgatory", "purgatory-0.8")
CASES = {"low": (60.0, 20.0), "high": (400.0, 200.0)}  # (pct75, pct50) of the completion latency, ms
DEFAULT_RATES = (100_000.0, 1_000_000.0)
Z75 = 0.6744897501960817  # standard normal quantile at 0.75: sigma = (ln pct75 - ln pct50) / Z75
OUTSTANDING_HORIZON_MS = 3_600_000  # preloaded timers are due one to two hours out: never during a run


# --------------------------------------------------------------------------- workload
class Workload:
    """Pre-generated events (not timed): per request arrival, deadline, completion time, keys."""

    def __init__(self, args, rate: float, pct75: float, pct50: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        n = args.requests
        self.n = n
        self.arrival = np.floor(np.cumsum(rng.exponential(1000.0 / rate, n))).astype(np.int64)
        sigma = (np.log(pct75) - np.log(pct50)) / Z75
        latency = rng.lognormal(np.log(pct50), sigma, n)
        self.deadline = self.arrival + args.timeout_ms
        completes = latency < args.timeout_ms
        complete_at = self.arrival + np.floor(latency).astype(np.int64)  # < deadline when it completes
        order = np.flatnonzero(completes)
        self.completion_order = order[np.argsort(complete_at[order], kind="stable")]
        self.completion_time = complete_at[self.completion_order]
        self.expected_expired = int(n - completes.sum())
        self.keys = distinct_keys(rng, n, args.keys_per_request, args.key_space)
        self.end_ms = int(self.deadline.max()) + args.tick_ms


def distinct_keys(rng, n: int, width: int, space: int) -> np.ndarray:
    """n rows of `width` distinct keys in [0, space), uniformly, without a Python loop per row."""
    if width > space:
        raise SystemExit(f"--keys-per-request {width} exceeds --key-space {space}")
    chosen = np.empty((n, width), np.int64)
    for j in range(width):
        pick = rng.integers(0, space - j, n)
        for earlier in np.sort(chosen[:, :j], axis=1).T:  # skip over the keys already taken, ascending
            pick += pick >= earlier
        chosen[:, j] = pick
    return chosen


# --------------------------------------------------------------------------- implementations
class WheelTimer:
    """The node's wheel calls: one add() per arrival, one cancel() per completion, advance() per wake."""

    def __init__(self, args, w: Workload, start_ms: int) -> None:
        self.wheel = TimingWheel(args.tick_ms, args.wheel_size, start_ms)
        self.ids = [0] * w.n
        self.deadlines = w.deadline.tolist()
        self.completion_order = w.completion_order.tolist()
        self.request_of: dict[int, int] | None = None  # real clock only: maps an expired handle to its request

    def preload(self, deadlines: np.ndarray, keys: np.ndarray) -> None:
        add = self.wheel.add
        for deadline in deadlines.tolist():
            add(deadline)

    def arrive(self, a0: int, a1: int) -> None:
        add, ids = self.wheel.add, self.ids
        for request in range(a0, a1):
            ids[request] = add(self.deadlines[request])
        if self.request_of is not None:
            self.request_of.update((ids[request], request) for request in range(a0, a1))

    def complete(self, c0: int, c1: int) -> int:
        cancel, ids = self.wheel.cancel, self.ids
        return sum(cancel(ids[request]) for request in self.completion_order[c0:c1])

    def advance(self, now_ms: int) -> list[int]:
        fired = self.wheel.advance(now_ms).tolist()
        return [self.request_of.pop(handle) for handle in fired] if self.request_of is not None else fired

    def extra(self) -> dict:
        return {"levels": self.wheel.levels, "compactions": self.wheel.compactions}


class BenchOperation(DelayedOperation):
    """A request as the timer process holds one: completed by force_complete or by its deadline."""

    __slots__ = ("request", "expired_sink")

    def __init__(self, request: int, expired_sink: list | None) -> None:
        self.request = request
        self.expired_sink = expired_sink

    def try_complete(self) -> bool:
        return False

    def on_expiration(self) -> None:
        if self.expired_sink is not None:
            self.expired_sink.append(self.request)


class PurgatoryImpl:
    """The node's purgatory calls: try_complete_else_watch per arrival, force_complete per completion."""

    def __init__(self, args, w: Workload, start_ms: int) -> None:
        self.purgatory = Purgatory("bench", args.purge_interval, WheelConfig(tick_ms=args.tick_ms,
                                                                             wheel_size=args.wheel_size), start_ms)
        self.ops: list[BenchOperation | None] = [None] * w.n
        self.deadlines = w.deadline.tolist()
        self.keys = [tuple(row) for row in w.keys.tolist()]
        self.completion_order = w.completion_order.tolist()
        self.request_of: dict[int, int] | None = None  # set by run_real: then expired requests are collected
        self._expired: list[int] = []

    def preload(self, deadlines: np.ndarray, keys: np.ndarray) -> None:
        watch = self.purgatory.try_complete_else_watch
        for deadline, row in zip(deadlines.tolist(), keys.tolist()):
            watch(BenchOperation(-1, None), tuple(row), deadline)

    def arrive(self, a0: int, a1: int) -> None:
        watch, ops = self.purgatory.try_complete_else_watch, self.ops
        sink = self._expired if self.request_of is not None else None
        for request in range(a0, a1):
            op = ops[request] = BenchOperation(request, sink)
            watch(op, self.keys[request], self.deadlines[request])

    def complete(self, c0: int, c1: int) -> int:
        force, ops = self.purgatory.force_complete, self.ops
        return sum(force(ops[request]) for request in self.completion_order[c0:c1])

    def advance(self, now_ms: int) -> list[int]:
        count = self.purgatory.advance(now_ms)
        if self.request_of is None:
            return [0] * count
        expired, self._expired = self._expired, []
        return expired

    def extra(self) -> dict:
        p = self.purgatory
        return {"purges": p.purges, "levels": p.timer.levels}


def pop_due(heap: list[tuple[int, int]], finished: bytearray, now_ms: int, mark: bool) -> list[int]:
    """The requests of the heap's entries due by `now_ms` (popped) that are not `finished`, which marks them
    finished with `mark`: the expiry step both heap baselines share."""
    pop = heapq.heappop
    expired = []
    while heap and heap[0][0] <= now_ms:
        _, i = pop(heap)
        if not finished[i]:
            if mark:
                finished[i] = 1
            expired.append(i)
    return expired


class HeapqTimer:
    """Baseline (a): a bare heapq timer. Inputs are Python lists (converted before timing) to be fair."""

    def __init__(self, args, w: Workload, start_ms: int) -> None:
        self.heap: list[tuple[int, int]] = []
        self.cancelled = bytearray(w.n)
        self.deadline = w.deadline.tolist()
        self.order = w.completion_order.tolist()

    def preload(self, deadlines: np.ndarray, keys: np.ndarray) -> None:
        self.heap = [(d, -1 - i) for i, d in enumerate(deadlines.tolist())]
        heapq.heapify(self.heap)

    def arrive(self, a0: int, a1: int) -> None:
        heap, deadline, push = self.heap, self.deadline, heapq.heappush
        for i in range(a0, a1):
            push(heap, (deadline[i], i))

    def complete(self, c0: int, c1: int) -> int:
        cancelled = self.cancelled
        for i in self.order[c0:c1]:
            cancelled[i] = 1
        return c1 - c0

    def advance(self, now_ms: int) -> list[int]:
        return pop_due(self.heap, self.cancelled, now_ms, mark=False)

    def extra(self) -> dict:
        return {}


class Purgatory08:
    """Baseline (b): the 0.8.x purgatory, single-threaded (see the module docstring)."""

    def __init__(self, args, w: Workload, start_ms: int) -> None:
        self.purge_interval = args.purge_interval
        self.heap: list[tuple[int, int]] = []
        self.satisfied = bytearray(w.n)
        self.deadline = w.deadline.tolist()
        self.order = w.completion_order.tolist()
        self.keys = [tuple(row) for row in w.keys.tolist()]
        self.watchers: list[list[int]] = [[] for _ in range(args.key_space)]
        self.watched_total = 0
        self.purges = 0
        self.queue_purges = 0

    def preload(self, deadlines: np.ndarray, keys: np.ndarray) -> None:
        raise SystemExit("purgatory-0.8 with --outstanding would only measure its purge scans; not supported")

    def arrive(self, a0: int, a1: int) -> None:
        heap, deadline, keys, watchers, push = self.heap, self.deadline, self.keys, self.watchers, heapq.heappush
        for i in range(a0, a1):
            row = keys[i]
            for key in row:
                watchers[key].append(i)
            self.watched_total += len(row)
            push(heap, (deadline[i], i))

    def complete(self, c0: int, c1: int) -> int:
        satisfied = self.satisfied
        done = 0
        for i in self.order[c0:c1]:
            if not satisfied[i]:
                satisfied[i] = 1
                done += 1
        return done

    def advance(self, now_ms: int) -> list[int]:
        heap, satisfied = self.heap, self.satisfied
        expired = pop_due(heap, satisfied, now_ms, mark=True)
        if self.watched_total >= self.purge_interval:  # scan every watcher list
            total = 0
            for lst in self.watchers:
                lst[:] = [i for i in lst if not satisfied[i]]
                total += len(lst)
            self.watched_total = total
            self.purges += 1
        if len(heap) >= self.purge_interval:  # and the delay queue
            heap[:] = [entry for entry in heap if not satisfied[entry[1]]]
            heapq.heapify(heap)
            self.queue_purges += 1
        return expired

    def extra(self) -> dict:
        return {"purges": self.purges, "queue_purges": self.queue_purges}


IMPL_CLASSES = {
    "wheel-timer": WheelTimer,
    "heapq-timer": HeapqTimer,
    "purgatory": PurgatoryImpl,
    "purgatory-0.8": Purgatory08,
}


# --------------------------------------------------------------------------- drivers
def preload(impl, args, rng) -> None:
    if args.outstanding:
        m = args.outstanding
        deadlines = OUTSTANDING_HORIZON_MS + rng.integers(0, OUTSTANDING_HORIZON_MS, m).astype(np.int64)
        impl.preload(deadlines, distinct_keys(rng, m, args.keys_per_request, args.key_space))


def run_virtual(impl, w: Workload, args) -> dict:
    step = args.step_ms
    grid = np.arange(step, w.end_ms + step, step, dtype=np.int64)
    arrived = np.searchsorted(w.arrival, grid, "right").tolist()
    completed = np.searchsorted(w.completion_time, grid, "right").tolist()
    grid = grid.tolist()
    done = expired = 0
    a0 = c0 = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for now, a1, c1 in zip(grid, arrived, completed):
        if a1 > a0:
            impl.arrive(a0, a1)
            a0 = a1
        if c1 > c0:
            done += impl.complete(c0, c1)
            c0 = c1
        expired += len(impl.advance(now))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"completed": done, "expired": expired, "cpu_s": cpu, "wall_s": wall,
            "req_per_cpu_s": w.n / cpu if cpu > 0 else None}


def run_real(impl, w: Workload, args) -> dict:
    """Pace arrivals in real time; the owner sleeps until its next event, as the timer process will."""
    if hasattr(impl, "request_of"):
        impl.request_of = {}
    timer = getattr(impl, "wheel", None) or getattr(getattr(impl, "purgatory", None), "timer", None)
    n_completions = len(w.completion_time)
    arrival, completion_time = w.arrival, w.completion_time
    lateness: list[np.ndarray] = []
    done = expired = 0
    a0 = c0 = 0
    origin = time.monotonic_ns()
    cpu0 = time.process_time()
    last_arrival_wall = None
    while True:
        now_ns = time.monotonic_ns() - origin
        now = now_ns // 1_000_000
        a1 = int(np.searchsorted(arrival, now, "right"))
        if a1 > a0:
            impl.arrive(a0, a1)
            a0 = a1
            if a0 == w.n:
                last_arrival_wall = (time.monotonic_ns() - origin) / 1e9
        c1 = int(np.searchsorted(completion_time, now, "right"))
        if c1 > c0:
            done += impl.complete(c0, c1)
            c0 = c1
        fired = impl.advance(now)
        if len(fired):
            fired_at_ms = (time.monotonic_ns() - origin) / 1e6
            expired += len(fired)
            lateness.append(fired_at_ms - w.deadline[np.asarray(fired, np.int64)])
        if a0 == w.n and c0 == n_completions and expired + done >= w.n:
            break
        if now > w.end_ms + 10_000:  # bounded: never wait more than 10 s past the last deadline
            break
        wake = w.end_ms
        if a0 < w.n:
            wake = min(wake, int(arrival[a0]))
        if c0 < n_completions:
            wake = min(wake, int(completion_time[c0]))
        if timer is not None:
            due = timer.next_expiration()
            if due is not None:
                wake = min(wake, due)
        else:
            heap = impl.heap
            if heap:
                wake = min(wake, heap[0][0])
        sleep_ns = wake * 1_000_000 - (time.monotonic_ns() - origin)
        if sleep_ns > 0:
            time.sleep(sleep_ns / 1e9)
    wall = (time.monotonic_ns() - origin) / 1e9
    cpu = time.process_time() - cpu0
    late = np.concatenate(lateness) if lateness else np.zeros(0)
    arrival_span_s = max(last_arrival_wall or wall, 1e-9)
    return {
        "completed": done, "expired": expired, "cpu_s": cpu, "wall_s": wall,
        "req_per_cpu_s": w.n / cpu if cpu > 0 else None,
        "target_rate": args.current_rate, "achieved_rate": w.n / arrival_span_s,
        "cpu_pct": 100.0 * cpu / wall if wall > 0 else None,
        "lateness_ms_p50": float(np.percentile(late, 50)) if len(late) else None,
        "lateness_ms_p99": float(np.percentile(late, 99)) if len(late) else None,
        "lateness_ms_max": float(late.max()) if len(late) else None,
        "early_fires": int((late < 0).sum()),
    }


def run_child(args) -> dict:
    pct75, pct50 = (args.pct75, args.pct50) if args.pct75 else CASES[args.case]
    args.current_rate = args.rate[0]
    w = Workload(args, args.rate[0], pct75, pct50, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    impl = IMPL_CLASSES[args.impl[0]](args, w, 0)
    preload(impl, args, rng)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    result = run_virtual(impl, w, args) if args.clock == "virtual" else run_real(impl, w, args)
    result.update(impl.extra())
    result.update({
        "impl": args.impl[0], "case": args.case, "rate": args.rate[0], "clock": args.clock,
        "requests": w.n, "expected_expired": w.expected_expired, "outstanding": args.outstanding,
        "purge_interval": args.purge_interval, "step_ms": args.step_ms, "pct75": pct75, "pct50": pct50,
        "us_per_request": 1e6 * result["cpu_s"] / w.n,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "rss_before_run_mb": rss_before,
    })
    return result


# --------------------------------------------------------------------------- parent
# The run's whole-number options, declared once: name -> (default, smallest allowed or None, help). The parent
# passes each to its children as given, but REPEAT (its own).
WHOLE_NUMBER_OPTIONS: dict[str, tuple[int, int | None, str | None]] = {
    "requests": (1_000_000, 1, None),
    "timeout-ms": (200, 1, None),
    "tick-ms": (1, 1, None),
    "wheel-size": (20, 1, None),
    "keys-per-request": (3, 1, None),
    "key-space": (100, 1, None),
    "purge-interval": (1000, 0, "Kafka's default: 1000"),
    "step-ms": (1, 1, "virtual clock: time per owner wake-up (default 1 tick)"),
    "outstanding": (0, 0, "timers preloaded hours away before the run"),
    "repeat": (1, 1, "runs per configuration; the median is reported"),
    "seed": (1, None, None),
}
REPEAT = "repeat"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m scripts.bench_purgatory", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--clock", choices=("virtual", "real"), default="virtual")
    p.add_argument("--impl", type=lambda s: s.split(","), default=list(IMPLS),
                   help="comma-separated subset of " + ",".join(IMPLS))
    p.add_argument("--case", choices=tuple(CASES), action="append",
                   help="low (pct75/pct50 = 60/20 ms) or high (400/200 ms); repeatable; default both")
    p.add_argument("--rate", type=float, action="append", help="requests/s; repeatable; default 100k and 1M")
    p.add_argument("--pct75", type=float, help="custom latency 75th percentile, ms (with --pct50)")
    p.add_argument("--pct50", type=float, help="custom latency median, ms (with --pct75)")
    for name, (default, _, help_text) in WHOLE_NUMBER_OPTIONS.items():
        p.add_argument(f"--{name}", type=int, default=default, help=help_text)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [i for i in args.impl if i not in IMPLS]
    if unknown:
        p.error(f"unknown --impl {unknown}; choose from {IMPLS}")
    for name, (_, smallest, _) in WHOLE_NUMBER_OPTIONS.items():
        if smallest is not None and getattr(args, name.replace("-", "_")) < smallest:
            p.error(f"--{name} must be >= {smallest}")
    if (args.pct75 is None) != (args.pct50 is None) or (args.pct75 is not None and not 0 < args.pct50 < args.pct75):
        p.error("--pct75 and --pct50 go together, with 0 < pct50 < pct75")
    if args.rate and any(r <= 0 for r in args.rate):
        p.error("--rate must be > 0")
    args.case = args.case or (["custom"] if args.pct75 else list(CASES))
    args.rate = args.rate or list(DEFAULT_RATES)
    return args


def child_argv(args, impl: str, case: str, rate: float) -> list[str]:
    argv = [sys.executable, "-m", "scripts.bench_purgatory", "--child", "--impl", impl, "--rate", repr(rate),
            "--clock", args.clock]
    for name in WHOLE_NUMBER_OPTIONS:
        if name != REPEAT:
            argv += [f"--{name}", str(getattr(args, name.replace("-", "_")))]
    if case == "custom":
        argv += ["--pct75", repr(args.pct75), "--pct50", repr(args.pct50)]
    else:
        argv += ["--case", case]
    return argv


def median_of(runs: list[dict]) -> dict:
    merged = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
            if len(values) == len(runs):
                exact = all(isinstance(v, int) for v in values)  # counts stay ints
                merged[key] = statistics.median_low(values) if exact else statistics.median(values)
    merged["runs"] = len(runs)
    if len(runs) > 1 and all(r.get("req_per_cpu_s") for r in runs):
        merged["req_per_cpu_s_all"] = [round(r["req_per_cpu_s"]) for r in runs]
    return merged


def print_row(row: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(row), flush=True)
        return
    if "error" in row:
        print(f"{row['impl']:>14} {row['case']:>5} {row['rate']:>10,.0f}  ERROR {row['error']}", flush=True)
        return
    text = (f"{row['impl']:>14} {row['case']:>5} {row['rate']:>10,.0f}/s  {row['req_per_cpu_s'] or 0:>12,.0f} req/cpu-s"
            f"  {row['us_per_request']:6.3f} us/req  completed {row['completed']:>8} expired {row['expired']:>8}"
            f"  rss {row['peak_rss_mb']:6.1f} MB")
    if row["clock"] == "real":
        text += (f"  achieved {row['achieved_rate']:,.0f}/s cpu {row['cpu_pct']:.0f}%"
                 f"  late p50/p99/max {row['lateness_ms_p50'] or 0:.2f}/{row['lateness_ms_p99'] or 0:.2f}"
                 f"/{row['lateness_ms_max'] or 0:.2f} ms")
    print(text, flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        args.case = args.case[0]
        print(json.dumps(run_child(args)), flush=True)
        return 0
    if not args.json:
        print(f"clock={args.clock} requests={args.requests} purge_interval={args.purge_interval} "
              f"step_ms={args.step_ms} outstanding={args.outstanding} repeat={args.repeat}", flush=True)
    failures = 0
    for case in args.case:
        for rate in args.rate:
            # Repeats outermost, so the implementations compared share the machine's state as closely as they can.
            runs: dict[str, list[dict]] = {impl: [] for impl in args.impl}
            errors: dict[str, str] = {}
            for _ in range(args.repeat):
                for impl in args.impl:
                    if impl in errors:
                        continue
                    proc = subprocess.run(child_argv(args, impl, case, rate), capture_output=True, text=True,
                                          env={**os.environ, "PYTHONHASHSEED": "0"})
                    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
                    if proc.returncode != 0 or not lines:
                        errors[impl] = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                        continue
                    runs[impl].append(json.loads(lines[-1]))
            for impl in args.impl:
                if impl in errors:
                    failures += 1
                    print_row({"impl": impl, "case": case, "rate": rate, "error": errors[impl]}, args.json)
                else:
                    print_row(median_of(runs[impl]), args.json)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
