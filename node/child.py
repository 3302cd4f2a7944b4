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
  lives as long as the child and is never scanned again (gc.freeze).
"""

from __future__ import annotations

import argparse
import gc
import logging
from typing import Any, Callable

from node.config import NodeConfig, read_runtime, reload_runtime
from node.logging_setup import setup_logging


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


def settle_garbage_collector(config: NodeConfig) -> None:
    """Freeze what the child built so far, then collect young objects only every `gc_young_threshold`
    allocations (server config)."""
    gc.collect()
    gc.freeze()
    if config.server.gc_young_threshold > 0:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(config.server.gc_young_threshold, middle, old)


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
