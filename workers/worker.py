"""A network worker process: one selectors loop over the shared listening socket, its client
connections, its completion doorbell and a signal wakeup pipe.

Invariants:
- The worker never blocks except in its single select(); sockets are non-blocking, ring writes
  never wait (a full ring keeps frames in a local backlog, retried every turn).
- Every request read gets its response in request order on its connection (see
  workers.connection). Requests that wait on the timer live in workers.delayed, which answers them
  when the timer does, or by itself once they are far past their deadline, and re-submits them when
  the timer process restarts: no client waits forever, even with the timer process dead.
- Bad input closes only its own connection, with one log line; no input ends the process.
- SIGTERM: stop accepting, finish in-flight requests within the grace period, then exit 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import selectors
import signal
import socket
import sys
import time
from typing import Any

from node.config import NodeConfig
from node.logging_setup import setup_logging
from node.storage.store import PartitionStore
from shm import instance as shm_instance
from shm import messages as M
from shm.interest import InterestTable
from shm.table import PartitionTable
from workers import protocol as P
from workers.connection import Connection, ConnectionClosed, Request
from workers.delayed import DelayedRequests, monotonic_ms
from workers.errors import ProtocolError
from workers.handlers import Handlers
from workers.outcome import Outcome
from workers.timer_link import TimerLink

log = logging.getLogger("shmbroker.worker")

_ACCEPT, _BELL, _WAKEUP = "accept", "bell", "wakeup"
WAKEUP_READ_BYTES = 512  # one byte per signal delivered; more than a turn ever sees


class Worker:
    def __init__(self, instance: str, index: int, config: NodeConfig, listen_fd: int, bell_fd: int,
                 supervisor_pid: int) -> None:
        self.instance = instance
        self.index = index
        self.config = config
        self.supervisor_pid = supervisor_pid
        self.table = PartitionTable.attach(shm_instance.table_name(instance))
        self.interest = InterestTable.attach(shm_instance.interest_name(instance))
        self.partitions = PartitionStore(os.path.abspath(config.server.data_dir), self.table, config.log,
                                         config.topics.max_partitions)
        self.link = TimerLink(instance, index, config.rings, bell_fd)
        self.delayed = DelayedRequests(self.link, self.interest, config.timer.delayed_grace_ms, self._settle)
        self.handlers = Handlers(self.partitions, config, self.delayed, cluster_id=f"shmbroker-{instance}")
        self.message_handlers = {
            M.Kind.COMPLETION: self.delayed.on_completion,
            M.Kind.TOPICS_OUTCOME: self.delayed.on_topics_outcome,
            M.Kind.TIMER_STARTED: self._on_timer_started,
            M.Kind.LAYOUT: self._on_layout,
        }
        self.listener = socket.socket(fileno=listen_fd)
        self.listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.connections: dict[int, Connection] = {}
        self._dirty: set[Connection] = set()
        self._stopping_since: float | None = None
        self._next_self_check = 0
        self._wakeup_r, self._wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # -- connections -------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(self.config.server.accepts_per_turn):
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("accept failed: %s", exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server = self.config.server
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, server.socket_send_buffer_bytes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, server.socket_receive_buffer_bytes)
            conn = Connection(sock, peer, server.request_max_bytes, server.recv_bytes)
            self.connections[conn.fd] = conn
            self.selector.register(sock, selectors.EVENT_READ, conn)

    def _close(self, conn: Connection, reason: str | None = None) -> None:
        if conn.closed:
            return
        if reason:
            log.warning("closing connection from %s: %s", conn.peer, reason)
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        self.connections.pop(conn.fd, None)
        self._dirty.discard(conn)
        conn.close()
        self.delayed.cancel_connection(conn)

    def _on_readable(self, conn: Connection) -> None:
        try:
            frames = conn.receive()
        except ConnectionClosed as exc:
            self._close(conn, None if str(exc) == "peer closed" else str(exc))
            return
        for frame in frames:
            if conn.closed:
                return
            self._handle(conn, frame)

    def _handle(self, conn: Connection, frame: memoryview) -> None:
        try:
            header = P.parse_request_header(frame)
        except ProtocolError as exc:
            self._close(conn, f"bad request header: {exc}")
            return
        if not P.is_supported(header.api_key, header.api_version):
            if header.api_key == P.API_VERSIONS:
                conn.new_slot().fill([P.encode_api_versions_unsupported(header.correlation_id)])
                self._dirty.add(conn)
                return
            self._close(conn, f"unsupported api {header.api_key} v{header.api_version}")
            return
        req = Request(conn, header, conn.new_slot())
        try:
            request = P.decode_request(header.api_key, header.api_version, frame[header.body_offset:])
            outcome = self.handlers.dispatch(req, request)
        except ProtocolError as exc:
            self._close(conn, f"bad request api {header.api_key} v{header.api_version}: {exc}")
            return
        except Exception:  # a bug must cost one connection, never the worker
            log.exception("handler failed for api %d v%d", header.api_key, header.api_version)
            self._close(conn, "internal error")
            return
        self._settle(req, outcome)

    def _settle(self, req: Request, outcome: Outcome | None) -> None:
        """Fill the request's slot with its outcome; None: its continuation failed (a bug), close the connection."""
        if outcome is None:
            self._close(req.conn, "internal error")
            return
        if outcome.deferred or req.conn.closed:
            return
        req.slot.fill(outcome.pieces)
        self._dirty.add(req.conn)

    def _write(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.collect_ready()
        try:
            done = conn.flush()
        except ConnectionClosed as exc:
            self._close(conn, str(exc))
            return
        events = selectors.EVENT_READ | (0 if done else selectors.EVENT_WRITE)
        if conn.wants_write != (not done):
            conn.wants_write = not done
            self.selector.modify(conn.sock, events, conn)

    # -- messages from the timer -------------------------------------------------------------

    def _on_timer_started(self, message) -> None:
        self.delayed.resubmit()
        self.partitions.reload()

    def _on_layout(self, message) -> None:
        if message.catalog_version != self.partitions.version:
            self.partitions.reload()

    # -- loop --------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._stopping_since is None:
            self._stopping_since = time.monotonic()

    def _begin_stop(self) -> None:
        try:
            self.selector.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.listener.close()
        for conn in list(self.connections.values()):
            if not conn.slots and not conn.pending_output():
                self._close(conn)

    def _stop_done(self) -> bool:
        grace_s = self.config.server.shutdown_grace_ms / 1000
        if time.monotonic() - self._stopping_since > grace_s:
            return True
        return not any(conn.slots or conn.pending_output() for conn in self.connections.values())

    def run(self) -> int:
        signal.set_wakeup_fd(self._wakeup_w)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.selector.register(self.listener, selectors.EVENT_READ, _ACCEPT)
        self.selector.register(self.link.doorbell_fd, selectors.EVENT_READ, _BELL)
        self.selector.register(self._wakeup_r, selectors.EVENT_READ, _WAKEUP)
        stop_started = False
        while True:
            if self._stopping_since is None and os.getppid() != self.supervisor_pid:
                # Normally PR_SET_PDEATHSIG has killed us already; this covers a lost signal.
                log.error("supervisor is gone: stopping")
                self._stopping_since = time.monotonic()
            if self._stopping_since is not None:
                if not stop_started:
                    stop_started = True
                    self._begin_stop()
                if self._stop_done():
                    break
            self_check_ms = self.config.timer.self_check_interval_ms
            timeout = self_check_ms / 1000 if self.delayed or self._stopping_since else None
            if self.link.backlogged():  # a full request ring: try again soon
                timeout = self.config.timer.ring_full_retry_ms / 1000
            if not self.link.announce_sleep():
                timeout = 0
            events = self.selector.select(timeout)
            self.link.woke()
            for key, mask in events:
                tag = key.data
                if tag is _ACCEPT:
                    self._accept()
                elif tag is _BELL:
                    self.link.drain_doorbell()
                elif tag is _WAKEUP:
                    try:
                        os.read(self._wakeup_r, WAKEUP_READ_BYTES)
                    except BlockingIOError:
                        pass
                else:
                    if mask & selectors.EVENT_READ:
                        self._on_readable(tag)
                    if mask & selectors.EVENT_WRITE and not tag.closed:
                        self._dirty.add(tag)
            for message in self.link.receive():
                handler = self.message_handlers.get(message.kind)
                if handler is None:
                    log.warning("dropping a %s message: no handler", message.kind.name)
                else:
                    handler(message)
            self.delayed.end_turn()
            now = monotonic_ms()
            if self.delayed and now >= self._next_self_check:
                self._next_self_check = now + self_check_ms
                self.delayed.self_answer(now)
            if self._dirty:
                dirty, self._dirty = self._dirty, set()
                for conn in dirty:
                    self._write(conn)
        for conn in list(self.connections.values()):
            self._close(conn)
        self.link.close()
        self.partitions.close()
        self.table.close()
        self.interest.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instance", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--supervisor-pid", type=int, required=True)
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--bell-fd", type=int, required=True)
    args = parser.parse_args(argv)
    setup_logging(f"worker-{args.index}")
    config = NodeConfig.from_json(args.config_json)
    worker = Worker(args.instance, args.index, config, args.listen_fd, args.bell_fd, args.supervisor_pid)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
