"""Backpressure: why a connection is not read, and its socket's reading following that. The reasons are the bits
of Connection.paused (workers.connection); the loop selects the socket for reading exactly while none is set.

- Memory: the worker's share of server.queued_max_request_bytes (workers.memory, `memory`; None: no bound).
  The budget only asks; this pauses and resumes.
- Output: past server.connection_max_queued_response_bytes (`output_limit`) of responses its client has not
  read, a connection's complete requests wait (the worker checks the bound as it serves them) and it is not
  read; when its client has read enough, the requests waiting are served and reading resumes (`output_drained`).
- Throttle (quotas, KIP-219): a throttled client's connection is muted (`mutes` counts the throttles in force)
  and not read; the requests read meanwhile wait. When the last throttle ends they are served first, on the
  loop's next turn (an unmute runs inside a timer message's handling), then reading resumes unless another
  reason still holds.

Invariants: backpressure never closes a connection, and a paused connection's hang-up is still noticed
(workers.eventloop); requests that wait keep their order and are served before anything read after them.
"""

from __future__ import annotations

from typing import Callable

from shmbroker.node.config import ServerConfig
from shmbroker.workers.connection import PAUSED_MEMORY, PAUSED_OUTPUT, PAUSED_THROTTLE, Connection
from shmbroker.workers.eventloop import EventLoop
from shmbroker.workers.memory import MemoryBudget

Serve = Callable[[Connection, list[memoryview]], None]  # the worker's: handle these requests, in order


class Backpressure:
    def __init__(self, server: ServerConfig, loop: EventLoop, serve: Serve) -> None:
        self.loop = loop
        self._serve = serve
        share = server.worker_request_bytes()
        self.memory = (MemoryBudget(share, server.recv_bytes, self._pause_for_memory, self._resume_for_memory)
                       if share >= 0 else None)
        self.output_limit = server.connection_max_queued_response_bytes

    def pause(self, conn: Connection, reason: int) -> None:
        if conn.pause(reason, self.loop.now):
            self.loop.pause_reading(conn.sock)

    def unpause(self, conn: Connection, reason: int) -> None:
        if not conn.closed and conn.unpause(reason, self.loop.now):
            self.loop.resume_reading(conn.sock)

    def output_drained(self, conn: Connection) -> None:
        """Its client read enough of the responses: read again, and serve the requests that waited."""
        self.unpause(conn, PAUSED_OUTPUT)
        if conn.held:
            self._serve(conn, conn.take_held())

    def _pause_for_memory(self, conn: Connection) -> None:
        self.pause(conn, PAUSED_MEMORY)

    def _resume_for_memory(self, conn: Connection) -> None:
        self.unpause(conn, PAUSED_MEMORY)

    # -- throttles (workers.api.quotas.Throttler) -------------------------------------------------

    def mute(self, conn: Connection) -> None:
        """Stop reading a throttled client's connection until its throttle ends."""
        if not conn.closed:
            conn.mutes += 1
            self.pause(conn, PAUSED_THROTTLE)

    def unmute(self, conn: Connection) -> None:
        if not conn.closed:
            conn.mutes = max(0, conn.mutes - 1)
            if not conn.mutes:  # on the next turn: this runs inside a timer message's handling
                self.loop.call_later(0, lambda: self._throttle_ended(conn))

    def _throttle_ended(self, conn: Connection) -> None:
        """The requests held back first (they may throttle again, or meet the output bound), then the socket,
        unless another reason still pauses it."""
        if conn.closed or conn.mutes:
            return
        if conn.held:
            self._serve(conn, conn.take_held())
        if not conn.mutes:
            self.unpause(conn, PAUSED_THROTTLE)
