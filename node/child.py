"""What every child process of the supervisor (the timer, the network workers, the log cleaners) shares: the
arguments node.supervisor gives each of them, its start (logging, runtime config), its reload on SIGHUP and
its close-down.

Invariants:
- The arguments here are the ones node.supervisor.Supervisor.spawn writes for every child; each child's own
  follow them.
- SIGHUP (the supervisor rewrote the config file with new reloadable settings, node.config.RELOADABLE): the
  signal handler only notes the request (`ConfigReload.requested`); the child reloads in its loop, between
  handlers, never inside one, and several signals before then make one reload. Only the reloadable settings
  change; a file that cannot be read keeps the running config, with one log line. The new config goes to
  `apply`, which hands it to the parts that use it.
- `close_all` closes in the order given, so what depends on another closes first.
- `settle_garbage_collector` runs once, when a child is set up and about to serve: what it built until then
  lives as long as the child and is never scanned again (gc.freeze). From then on every collection is counted
  in the child's stats row (`GarbageCollectorStats`). A collection's pause stalls every request the process
  holds, so a request's path leaves no reference cycles: gc_collected stays near zero.
"""

from __future__ import annotations

import argparse
import gc
import logging
import time
from typing import Any, Callable

from shmbroker.node.config import NodeConfig, read_runtime, reload_runtime
from shmbroker.node.logging_setup import setup_logging
from shmbroker.shm.stats import OFFSETS

_GC_COLLECTIONS = OFFSETS["gc_collections"]  # + generation
_GC_COLLECTED = OFFSETS["gc_collected"]
_GC_PAUSE_TOTAL = OFFSETS["gc_pause_us_total"]
_GC_PAUSE_MAX = OFFSETS["gc_pause_us_max"]


def child_arguments() -> argparse.ArgumentParser:
    """A parser of the arguments every child gets; a child adds its own."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--instance", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--config-file", required=True)
    parser.add_argument("--heartbeat-slot", type=int, required=True)
    parser.add_argument("--supervisor-pid", type=int, required=True)
    return parser


def start_child(role: str, config_file: str) -> NodeConfig:
    """Log lines marked `role`; the runtime config the supervisor wrote."""
    setup_logging(role)
    return read_runtime(config_file)


class GarbageCollectorStats:
    """Counts each garbage collection into a stats row (shm.stats' gc_* fields): a gc.callbacks hook, so it costs
    nothing between collections."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts
        self._started_ns = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started_ns = time.perf_counter_ns()
            return
        pause_us = (time.perf_counter_ns() - self._started_ns) // 1000
        counts = self.counts
        counts[_GC_COLLECTIONS + info["generation"]] += 1
        counts[_GC_COLLECTED] += info["collected"]
        counts[_GC_PAUSE_TOTAL] += pause_us
        if pause_us > counts[_GC_PAUSE_MAX]:
            counts[_GC_PAUSE_MAX] = pause_us

    def install(self) -> None:
        gc.callbacks.append(self)


def settle_garbage_collector(config: NodeConfig, stats_counts: list[int] | None = None) -> None:
    """Freeze what the child built so far, then collect young objects only every `gc_young_threshold`
    allocations (server config), counting each collection into `stats_counts` (the child's stats row)."""
    gc.collect()
    gc.freeze()
    if config.server.gc_young_threshold > 0:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(config.server.gc_young_threshold, middle, old)
    if stats_counts is not None:
        GarbageCollectorStats(stats_counts).install()


class ConfigReload:
    def __init__(self, path: str, config: NodeConfig, apply: Callable[[NodeConfig], None],
                 log: logging.Logger) -> None:
        self.path = path
        self.config = config
        self._apply = apply
        self._log = log
        self.requested = False

    def on_hup(self, signum: int, frame: Any) -> None:
        self.requested = True

    def reload(self) -> None:
        self.requested = False
        config = reload_runtime(self.config, self.path, self._log)
        if config is None:
            return
        self.config = config
        self._apply(config)


def close_all(*resources: Any) -> None:
    """Close each resource in turn (None: one this child does not have)."""
    for resource in resources:
        if resource is not None:
            resource.close()
