"""Process identity for liveness checks of peers recorded in shared memory.

A pid alone is not an identity: after a crash the kernel may hand the same pid to an
unrelated process. We record (pid, start time) and call a peer alive only if a process
with that pid exists now *and* started at the recorded time.

Invariants:
- `start_time(pid)` is stable for the lifetime of a process (psutil derives it from
  /proc/<pid>/stat, resolution one clock tick), so equality within `START_TIME_TOLERANCE_S`
  identifies the same process.
- pid 0 means "nobody recorded"; such a peer is never alive.
- Zombies count as dead: they hold no more mappings and will never write again.
"""

from __future__ import annotations

import os

import psutil

# Start times are jiffies (10 ms) turned into float seconds; allow for float rounding only.
START_TIME_TOLERANCE_S = 0.005


def start_time(pid: int) -> float:
    """Start time (seconds since the epoch) of a running process; raises psutil.Error."""
    return psutil.Process(pid).create_time()


def my_identity() -> tuple[int, float]:
    """(pid, start time) of the calling process."""
    pid = os.getpid()
    return pid, start_time(pid)


def is_alive(pid: int, started_at: float) -> bool:
    """True if the process `pid` that started at `started_at` is still running."""
    if pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - started_at) > START_TIME_TOLERANCE_S:
            return False
        return process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        # Exists but belongs to someone else; it cannot be ours to clean up.
        return True
