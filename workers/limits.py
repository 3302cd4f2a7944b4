"""Connection admission: the node-wide limits on open connections, server.max_connections and
server.max_connections_per_ip (Kafka's max.connections and max.connections.per.ip), checked when a
worker accepts a connection, against the counts every worker keeps in shared memory (shm.connections).

Invariants:
- Every open connection of this worker is counted in its row (once, from accept to close), whatever the
  limits, so the node-wide counts are there for the limits and for whoever reads them.
- A connection over a limit is closed right after accept, before any byte is read; the caller logs it
  (rate-limited, per cause).
- Concurrent accepts in two workers can each pass a limit by one: the node holds at most
  limit + workers - 1 connections (see shm.connections).
"""

from __future__ import annotations

from typing import NamedTuple

from shmbroker.shm.connections import ConnectionCounts

UNLIMITED = 2**31 - 1  # Kafka's default for both limits


class Refusal(NamedTuple):
    setting: str  # the config key that refused it
    limit: int


class ConnectionLimits:
    def __init__(self, counts: ConnectionCounts, worker: int, max_connections: int, max_per_ip: int) -> None:
        self.counts = counts
        counts.reset(worker)  # a predecessor's connections died with it
        self.row = counts.row(worker)
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip

    def bucket_of(self, address: str) -> int:
        return self.counts.bucket_of(address)

    def refusal(self, bucket: int) -> Refusal | None:
        """Why a new connection from an address in `bucket` must be refused, or None."""
        if self.max_connections < UNLIMITED and self.counts.total() >= self.max_connections:
            return Refusal("server.max_connections", self.max_connections)
        if self.max_per_ip < UNLIMITED and self.counts.in_bucket(bucket) >= self.max_per_ip:
            return Refusal("server.max_connections_per_ip", self.max_per_ip)
        return None

    def opened(self, bucket: int) -> None:
        self.row.opened(bucket)

    def closed(self, bucket: int) -> None:
        self.row.closed(bucket)
