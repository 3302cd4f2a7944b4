"""The workers' scaling, measured: the node with 1, 2 and 3 workers under the same long-poll load, pinned apart.

For each worker count (--workers-list), alternating their order over --runs runs (1 2 3, 3 2 1, ...: drift of a
shared machine hits each alike), one `scripts.bench_delayed --workload offered` run at each of --rates (expiring
long polls offered open loop), with the node on --node-cpus and the load generator on --client-cpus (taskset: they
never share a CPU). Per worker count, the medians over runs of: completed long polls/s, client lateness p99, the
node's cores, and the CPU microseconds per completed long poll of the timer process and of the workers together.

What it shows: whether a long poll's CPU in the workers stays the same as workers are added (it must, for the
workers to scale with cores: no lock, no shared queue between them, only their own rings to the timer), and what
the one timer process costs per operation, the ceiling of the design (1e6 / timer_us_per_op operations/s, however
many cores). From those two figures at the highest rate offered (the timer's cost per operation falls as its turns
carry more of them) `projection` gives, for hosts of --project-cores cores, the delayed operations per second the
timer allows and the cores the workers need for them (README "On larger hosts").

On a machine with fewer CPUs than workers + 1, the workers share the node's CPUs: the per-operation figures still
hold (CPU time, not wall time), the completed/s then show the node's CPUs saturating, not the workers scaling.
A table goes to stderr, one JSON line per run and a summary per worker count with --json, and --plot PNG draws
the per-operation CPU and completions against the worker count.

    .venv/bin/python -m scripts.bench_scaling [--runs 3] [--rates 10000] [--node-cpus 0 --client-cpus 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from scripts.harness.benchnode import cpu_list

SCRIPT = "bench_scaling"
RUN_TIMEOUT_S = 300.0
FIGURES = ("completed_per_s", "p99_ms", "node_cores", "timer_us_per_op", "worker_us_per_op")


def progress(text: str) -> None:
    print(f"[{SCRIPT}] {text}", file=sys.stderr, flush=True)


def cpus_text(cpus: set[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def default_cpus() -> tuple[set[int], set[int]]:
    """The node on every CPU but the last, the load generator on the last (one CPU: both on it)."""
    cpus = sorted(os.sched_getaffinity(0))
    return (set(cpus[:-1]) or set(cpus)), {cpus[-1]}


def one_run(workers: int, args: argparse.Namespace) -> list[dict]:
    """One bench_delayed offered run with `workers` workers; its per-rate rows."""
    command = [sys.executable, "-m", "scripts.bench_delayed", "--workload", "offered", "--workers", str(workers),
               "--rates", *map(str, args.rates), "--step-seconds", str(args.step_seconds),
               "--expire-ms", str(args.expire_ms), "--node-cpus", cpus_text(args.node_cpus),
               "--client-cpus", cpus_text(args.client_cpus), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    for line in done.stderr.splitlines():
        if line.startswith("nodeproc:"):  # which node ran, for whoever checks what the run left behind
            print(line, file=sys.stderr, flush=True)
    return [row for line in done.stdout.splitlines() if line.startswith("{")
            for row in [json.loads(line)] if row.get("workload") == "offered"]


def projection(timer_us: float, worker_us: float, cores: list[int]) -> list[dict]:
    """Per host size: the timer's ceiling (operations/s, one core for it) and the cores the workers need to
    carry that many, from the per-operation CPU measured here."""
    ceiling = 1e6 / timer_us if timer_us > 0 else None
    rows = []
    for total in cores:
        worker_cores = total - 1  # one core is the timer's
        carried = worker_cores * 1e6 / worker_us if worker_us > 0 else None
        limit = min(x for x in (ceiling, carried) if x is not None) if (ceiling or carried) else None
        rows.append({"host_cores": total, "timer_ceiling_per_s": round(ceiling) if ceiling else None,
                     "workers_carry_per_s": round(carried) if carried else None,
                     "node_limit_per_s": round(limit) if limit else None,
                     "limited_by": "timer" if ceiling and carried and ceiling <= carried else "workers",
                     "worker_cores_for_timer_ceiling": round(ceiling * worker_us / 1e6, 1) if ceiling else None})
    return rows


def summarize(rows: list[dict], workers: int, rate: float) -> dict:
    mine = [row for row in rows if row["workers"] == workers and row["rate"] == rate]
    summary: dict = {"script": SCRIPT, "summary": True, "workers": workers, "rate": rate, "runs": len(mine)}
    for figure in FIGURES:
        values = [row[figure] for row in mine if row.get(figure) is not None]
        summary[figure] = round(statistics.median(values), 3) if values else None
    return summary


def plot(summaries: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for rate in sorted({s["rate"] for s in summaries}):
        points = sorted((s for s in summaries if s["rate"] == rate), key=lambda s: s["workers"])
        counts = [s["workers"] for s in points]
        left.plot(counts, [s["worker_us_per_op"] for s in points], "o-", label=f"workers, {rate:,.0f}/s offered")
        left.plot(counts, [s["timer_us_per_op"] for s in points], "s--", label=f"timer, {rate:,.0f}/s offered")
        right.plot(counts, [s["completed_per_s"] for s in points], "o-", label=f"{rate:,.0f}/s offered")
    left.set(xlabel="workers", ylabel="CPU us per completed long poll", title="CPU per operation")
    right.set(xlabel="workers", ylabel="completed long polls/s", title="Completions (node CPUs pinned)")
    for axis in (left, right):
        axis.set_xticks(sorted({s["workers"] for s in summaries}))
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    progress(f"plot written to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m scripts.{SCRIPT}", description=__doc__.split("\n")[0])
    parser.add_argument("--workers-list", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--runs", type=int, default=3, help="runs of each worker count, alternating order")
    parser.add_argument("--rates", type=float, nargs="+", default=[10_000.0], help="long polls/s offered")
    parser.add_argument("--step-seconds", type=float, default=6.0)
    parser.add_argument("--expire-ms", type=int, default=200)
    node_default, client_default = default_cpus()
    parser.add_argument("--node-cpus", type=cpu_list, default=node_default)
    parser.add_argument("--client-cpus", type=cpu_list, default=client_default)
    parser.add_argument("--project-cores", type=int, nargs="+", default=[2, 16, 64])
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--plot", help="PNG path of the plot")
    args = parser.parse_args(argv)
    if min(args.workers_list) < 1 or args.runs < 1:
        raise SystemExit("--workers-list and --runs must be at least 1")
    shared = args.node_cpus & args.client_cpus
    progress(f"node on CPUs {cpus_text(args.node_cpus)}, load generator on {cpus_text(args.client_cpus)}"
             + (f" (sharing {cpus_text(shared)})" if shared else ""))
    rows: list[dict] = []
    order = list(args.workers_list)
    for run in range(args.runs):
        for workers in order if run % 2 == 0 else order[::-1]:
            started = time.monotonic()
            for row in one_run(workers, args):
                row = {"script": SCRIPT, "run": run + 1, "workers": workers,
                       **{key: row.get(key) for key in ("rate", *FIGURES)}}
                rows.append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
            progress(f"run {run + 1}/{args.runs}, {workers} worker(s): {time.monotonic() - started:.0f} s")
    summaries = [summarize(rows, workers, rate) for rate in args.rates for workers in args.workers_list]
    print(f"{'workers':>7} {'offered/s':>10} {'completed/s':>12} {'p99 ms':>8} {'node cores':>10} "
          f"{'timer us/op':>11} {'workers us/op':>13}", file=sys.stderr)
    for s in summaries:
        print(f"{s['workers']:>7} {s['rate']:>10,.0f} {s['completed_per_s'] or 0:>12,.0f} {s['p99_ms'] or 0:>8.1f} "
              f"{s['node_cores'] or 0:>10.2f} {s['timer_us_per_op'] or 0:>11.1f} {s['worker_us_per_op'] or 0:>13.1f}",
              file=sys.stderr)
    # The per-operation CPU at the highest rate offered: the timer's falls as its turns carry more operations
    # (its batch paths), so the figures nearest the ceiling are the ones to project from.
    top = max(args.rates)
    measured = [s for s in summaries if s["rate"] == top and s["timer_us_per_op"] and s["worker_us_per_op"]]
    projected = projection(statistics.median(s["timer_us_per_op"] for s in measured),
                           statistics.median(s["worker_us_per_op"] for s in measured),
                           args.project_cores) if measured else []
    for p in projected:
        print(f"a {p['host_cores']}-core host: the timer allows {p['timer_ceiling_per_s']:,}/s; "
              f"its other cores' workers carry {p['workers_carry_per_s']:,}/s; limited by the {p['limited_by']}",
              file=sys.stderr)
    if args.json:
        for s in summaries:
            print(json.dumps(s))
        print(json.dumps({"script": SCRIPT, "projection": projected, "projected_from_rate": top}))
    if args.plot:
        plot(summaries, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
