"""What `shmbroker dashboard` costs: its CPU use (cores) while it watches a node under load, in a real
pseudo-terminal (tmux), refreshing every second. Target: under 5% of a core.

A node with --workers workers is started here, a raw producer (scripts/producer_perf.py's load) keeps it busy,
the dashboard runs in a tmux session of this script's own for --seconds, and psutil measures the dashboard
process's CPU time over the middle of that window (the first refreshes, which import rich and the Kafka client,
are left out). One JSON line with --json. Usage:
    .venv/bin/python -m scripts.bench_dashboard [--seconds 30] [--json]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import uuid

import psutil

from scripts.harness import benchnode
from scripts.harness.nodeproc import NodeProcess
from scripts.producer_perf import RawProduceLoad, run_raw_producer

SCRIPT = "bench_dashboard"
WARMUP_S = 5.0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(port: int, topic: str, seconds: float) -> None:
    run_raw_producer(benchnode.LOOPBACK, port, RawProduceLoad(topic, 2), seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_dashboard", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.seconds <= WARMUP_S + 1:
        parser.error(f"--seconds must be above {WARMUP_S + 1}")
    session = f"smbbench{uuid.uuid4().hex[:8]}"
    # A tmux server of this script's own, its socket in a directory removed at the end (none left in /tmp/tmux-<uid>).
    with NodeProcess(workers=args.workers) as node, tempfile.TemporaryDirectory(prefix="smbbench-tmux-") as sockets:
        tmux = ["tmux", "-S", os.path.join(sockets, "tmux.sock")]
        topic = f"bench-dashboard-{os.getpid()}"
        benchnode.create_topic(benchnode.LOOPBACK, node.port, topic, 2)
        loader = multiprocessing.get_context("spawn").Process(target=_load, args=(node.port, topic, args.seconds + 5),
                                                              daemon=True)
        loader.start()
        command = (f"env -u COLUMNS -u LINES {sys.executable} -m node.tools.cli dashboard --data-dir {node.data_dir} "
                   f"--duration {args.seconds}")
        subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "180", "-y", "60", "-c", REPO, command],
                       check=True, timeout=10)
        try:
            pid = int(subprocess.run([*tmux, "display", "-p", "-t", session, "#{pane_pid}"], capture_output=True,
                                     text=True, check=True, timeout=10).stdout)
            dashboard = psutil.Process(pid)
            print(f"{SCRIPT}: dashboard pid {pid}, warming up {WARMUP_S:.0f} s", file=sys.stderr, flush=True)
            time.sleep(WARMUP_S)
            before, started = dashboard.cpu_times(), time.monotonic()
            node_before = sum(sum(p.cpu_times()[:2]) for p in [psutil.Process(node.proc.pid)] + node.children())
            window = args.seconds - WARMUP_S - 1
            print(f"{SCRIPT}: measuring {window:.0f} s", file=sys.stderr, flush=True)
            time.sleep(window)
            after, elapsed = dashboard.cpu_times(), time.monotonic() - started
            node_after = sum(sum(p.cpu_times()[:2]) for p in [psutil.Process(node.proc.pid)] + node.children())
        finally:
            subprocess.run([*tmux, "kill-session", "-t", session], capture_output=True, timeout=10)
            loader.join(args.seconds + 30)
            if loader.is_alive():
                loader.kill()  # by pid
                loader.join(10)
    cores = (after.user + after.system - before.user - before.system) / elapsed
    row = {"script": SCRIPT, "seconds": round(elapsed, 1), "dashboard_cores": round(cores, 4),
           "dashboard_percent_of_core": round(100 * cores, 2), "node_cores": round((node_after - node_before) / elapsed, 3),
           "workers": args.workers, "target": "under 5% of a core"}
    if args.json:
        benchnode.emit(row, True)
    else:
        print(f"dashboard: {row['dashboard_percent_of_core']}% of a core while the node used {row['node_cores']} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
