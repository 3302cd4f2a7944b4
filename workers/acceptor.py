"""The worker's listening socket: accepting new connections, admitting them (workers.limits) and handing each,
unread, to the worker that serves it: a less loaded peer (workers.balance) or this worker (`adopt`).

Invariants:
- The supervisor only bound the listener; it listens from `start()` on, as the worker's loop starts, so the
  port accepts connections only once a worker can serve them.
- At most server.accepts_per_turn connections per readable event: a flood of connects cannot starve the
  connections already served.
- accept() running out of resources (EMFILE, ENFILE, ENOBUFS, ENOMEM) rests the listener for
  server.accept_retry_ms instead of spinning on it (one line per server.limit_log_interval_ms node-wide); a
  client that gave up before it was taken is skipped; any other error ends the call with one log line.
- A connection over server.max_connections or server.max_connections_per_ip is closed before any byte of it
  is read, with a rate-limited line.
- Every admitted connection gets TCP_NODELAY and the configured socket buffers, and is counted once in
  connections_accepted, whether it is served here or passed on.
- After `stop()` the listener is closed and never watched again (the end of a rest does not revive it).
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any, Callable

from shmbroker.node.config import ServerConfig
from shmbroker.node.logging_setup import RateLimitedLog
from shmbroker.workers.balance import ConnectionBalance
from shmbroker.workers.eventloop import EventLoop
from shmbroker.workers.limits import ConnectionLimits
from shmbroker.workers.stats import ACCEPTED, WorkerStats

log = logging.getLogger("shmbroker.worker")

# accept() errors that mean "no resources now": the listener rests instead of spinning on them.
_ACCEPT_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

Adopt = Callable[[socket.socket, Any, int], Any]  # (socket, peer address, address bucket): serve it here


class Acceptor:
    def __init__(self, listen_fd: int, server: ServerConfig, loop: EventLoop, limits: ConnectionLimits,
                 limit_log: RateLimitedLog, stats: WorkerStats | None, balance: ConnectionBalance | None,
                 adopt: Adopt) -> None:
        self.listener = socket.socket(fileno=listen_fd)
        self.listener.setblocking(False)
        self.server = server
        self.loop = loop
        self.limits = limits
        self.limit_log = limit_log
        self.stats = stats
        self.balance = balance
        self.adopt = adopt
        self.stopped = False

    def start(self) -> None:
        self.loop.watch(self.listener, self.accept)
        if self.balance is not None:
            self.balance.start()
        self.listener.listen(self.server.listen_backlog)

    def stop(self) -> None:
        """Stop accepting: the listener is closed (a replacement worker listens on its own)."""
        self.stopped = True
        self.loop.unwatch(self.listener)
        self.listener.close()

    def accept(self) -> None:
        server = self.server
        passed: dict[int, int] = {}  # connections passed to each peer in this call, not yet in its count
        for _ in range(server.accepts_per_turn):
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _ACCEPT_EXHAUSTED:
                    self.limit_log.warning("accept", "cannot accept connections (%s): the listener rests %d ms",
                                           exc, server.accept_retry_ms)
                    self._rest()
                    return
                if exc.errno == errno.ECONNABORTED:
                    continue  # the client gave up before we took it
                log.warning("accept failed: %s", exc)
                return
            address = peer[0] if isinstance(peer, tuple) else str(peer)
            bucket = self.limits.bucket_of(address)
            refusal = self.limits.refusal(bucket)
            if refusal is not None:
                sock.close()
                self.limit_log.warning(refusal.setting, "refused a connection from %s: over %s (%d)",
                                       address, refusal.setting, refusal.limit)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, server.socket_send_buffer_bytes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, server.socket_receive_buffer_bytes)
            if self.stats is not None:
                self.stats.counts[ACCEPTED] += 1
            if self.balance is not None and self.balance.pass_to_fewest(sock, passed):
                continue
            self.adopt(sock, peer, bucket)

    def _rest(self) -> None:
        self.loop.pause_reading(self.listener)

        def wake() -> None:
            if not self.stopped:
                self.loop.resume_reading(self.listener)

        self.loop.call_later(self.server.accept_retry_ms / 1000, wake)
