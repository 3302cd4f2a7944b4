"""The servers of the load-test report behind one face: where to send traffic, and what the server spent.

A ``Server`` is the node (nodeproc.NodeProcess), Apache Kafka (kafka_peer.KafkaPeer) or Redis
(redis_peer.RedisServer), under the name the report gives it (``system``). What it spent is read with psutil
over its whole process tree: CPU seconds (user + system) and memory (RSS, and PSS, which splits shared pages
such as the node's rings between the processes mapping them). ``Spent`` takes the CPU over one measurement and
gives it per operation, so that a ratio of rates on a shared 2-core machine comes with what each side paid.

Invariants: only processes the harness started are read; a process that ended meanwhile counts what it had
spent when last seen, never an error.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable

import psutil

from scripts.harness import benchnode
from scripts.harness.nodeproc import LOOPBACK, NodeProcess

NODE, KAFKA, KAFKA_FSYNC, REDIS = "shmbroker", "kafka", "kafka-fsync", "redis"


@dataclass
class Server:
    system: str
    port: int
    processes: Callable[[], list[psutil.Process]]
    data_dir: str | None = None  # the node's data dir (its stats segment and segment files); None for a peer
    log_dir: str | None = None  # where the server keeps its logs: the disk blocks it stores
    node: NodeProcess | None = None  # the node, when this is one (its roles)
    handle: Any = None  # the KafkaPeer or RedisServer

    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def target(self) -> benchnode.Target:
        return benchnode.Target(LOOPBACK, self.port, self.data_dir, self.node)

    def cpu_seconds(self) -> float:
        total = 0.0
        for process in self.processes():
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    def memory(self) -> dict[str, int]:
        totals = {"rss_bytes": 0, "pss_bytes": 0, "processes": 0}
        for process in self.processes():
            with contextlib.suppress(psutil.Error):
                info = process.memory_full_info()
                totals["rss_bytes"] += info.rss
                totals["pss_bytes"] += getattr(info, "pss", info.rss)
                totals["processes"] += 1
        return totals


def _tree(pid: int | None) -> list[psutil.Process]:
    if pid is None:
        return []
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def of_node(node: NodeProcess) -> Server:
    return Server(NODE, node.port, lambda: _tree(node.proc.pid if node.alive() else None), str(node.data_dir),
                  str(node.data_dir), node)


def of_kafka(peer: Any) -> Server:
    return Server(KAFKA_FSYNC if peer.durability == "fsync" else KAFKA, peer.port, peer.processes,
                  log_dir=str(peer.work / "logs"), handle=peer)


def of_redis(server: Any) -> Server:
    return Server(REDIS, server.port, lambda: _tree(server.pid), handle=server)


class Spent:
    """The CPU seconds a server's processes spent between entering and leaving, and the wall seconds."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.cpu_s = 0.0
        self.wall_s = 0.0

    def __enter__(self) -> "Spent":
        self._cpu = self.server.cpu_seconds()
        self._wall = time.monotonic()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cpu_s = self.server.cpu_seconds() - self._cpu
        self.wall_s = time.monotonic() - self._wall

    def fields(self, operations: float | None) -> dict[str, float | None]:
        """server_cpu_s, server_cores (CPU seconds per wall second) and cpu_us_per_op (None without operations)."""
        return {"server_cpu_s": round(self.cpu_s, 3),
                "server_cores": round(self.cpu_s / self.wall_s, 3) if self.wall_s else None,
                "cpu_us_per_op": round(self.cpu_s / operations * 1e6, 3) if operations else None}
