"""A network worker process: one selectors loop over the shared listening socket, its client
connections, its completion doorbell and a signal wakeup pipe.

Invariants:
- The worker never blocks except in its single select(); sockets are non-blocking, ring writes
  never wait (a full ring keeps frames in a local backlog, retried every turn).
- Every request read gets its response in request order on its connection (see
  workers.connection). Delayed requests stay in `waiting` until their completion arrives, or until
  their deadline is `delayed_grace_ms` past, when the worker answers by itself: no client waits
  forever, even with the timer process dead.
- Request ids carry the worker's pid in their high bits, so a restarted worker never mistakes a
  completion meant for its predecessor; unknown completions are dropped.
- When the timer process restarts it announces itself; the worker re-submits every waiting
  request (the timer ignores duplicates), so nothing waits on a purgatory that no longer exists.
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
from dataclasses import dataclass
from typing import Any, Callable

from node.cli import setup_logging
from node.config import NodeConfig
from node.storage.partitions import Partitions
from node.resources import interest_name, table_name
from shm.interest import InterestTable, full_fence
from shm.table import PartitionTable
from workers import protocol as P
from workers.connection import Connection, ConnectionClosed, ResponseSlot
from workers import errors as E
from workers.errors import ProtocolError
from workers.handlers import DEFERRED, NO_RESPONSE, Handlers
from workers.timer_link import OP_LAYOUT, OP_TIMER_STARTED, Message, TimerLink

log = logging.getLogger("shmbroker.worker")

_ACCEPT, _BELL, _WAKEUP = "accept", "bell", "wakeup"


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(slots=True)
class Request:
    conn: Connection
    header: P.RequestHeader
    slot: ResponseSlot


@dataclass(slots=True)
class Waiting:
    request: Request
    deadline_ms: int
    # Called with expired=True/False; returns the response pieces.
    finish: Callable[[Any], list]
    frame: bytes  # as sent to the timer, kept for re-submission


class Worker:
    def __init__(self, instance: str, index: int, config: NodeConfig, listen_fd: int, bell_fd: int,
                 supervisor_pid: int) -> None:
        self.instance = instance
        self.index = index
        self.config = config
        self.supervisor_pid = supervisor_pid
        self.table = PartitionTable.attach(table_name(instance))
        self.interest = InterestTable.attach(interest_name(instance))
        self.partitions = Partitions(os.path.abspath(config.server.data_dir), self.table, config.log,
                                     config.topics.max_partitions)
        self.link = TimerLink(instance, index, config, bell_fd)
        self.handlers = Handlers(self)
        self.listener = socket.socket(fileno=listen_fd)
        self.listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.connections: dict[int, Connection] = {}
        self.waiting: dict[int, Waiting] = {}
        self._request_seq = 0
        self._pid_bits = (os.getpid() & 0xFFFFFF) << 40
        self._appends: dict[int, tuple[int, int]] = {}
        self._dirty: set[Connection] = set()
        self._stopping_since: float | None = None
        self._next_self_check = 0
        self._wakeup_r, self._wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # -- services for handlers ---------------------------------------------------------------

    @staticmethod
    def wall_ms() -> int:
        return time.time_ns() // 1_000_000

    def _new_request_id(self) -> int:
        self._request_seq += 1
        return self._pid_bits | self._request_seq

    def appended(self, row: int, end_offset: int, end_bytes: int) -> None:
        """Note an append. If a delayed fetch watches the partition, the timer hears of it at the end
        of this loop turn. The fence orders the append (in the table) before the interest read."""
        full_fence()
        if self.interest.counts[row]:
            self._appends[row] = (end_offset, end_bytes)

    def _wait(self, req: Request, frame_for: Callable[[int], bytes], deadline_ms: int,
              finish: Callable[[Any], list]) -> object:
        request_id = self._new_request_id()
        frame = frame_for(request_id)
        self.waiting[request_id] = Waiting(req, deadline_ms, finish, frame)
        self.link.send(frame)
        return DEFERRED

    def delay_produce(self, req: Request, waits: list[tuple[int, int]], timeout_ms: int,
                      finish: Callable[[Any], list]) -> object:
        deadline = monotonic_ms() + max(0, timeout_ms)
        return self._wait(req, lambda rid: self.link.delay_produce_frame(rid, deadline, waits), deadline, finish)

    def delay_fetch(self, req: Request, watch: list[tuple[int, int]], min_bytes: int, max_wait_ms: int,
                    finish: Callable[[Any], list]) -> object:
        deadline = monotonic_ms() + max_wait_ms
        return self._wait(req, lambda rid: self.link.delay_fetch_frame(rid, deadline, min_bytes, watch),
                          deadline, finish)

    def control_then(self, req: Request, payload: dict, answer: Callable[[dict], list]) -> object:
        """Send a topic creation or deletion to the timer; answer with its outcome, a document
        {topic: (error code, message)}. If the timer never answers, every topic times out."""
        deadline = monotonic_ms() + self.config.timer.control_timeout_ms
        names = [t[0] if isinstance(t, (list, tuple)) else t for t in payload["topics"]]

        def finish(outcome: Any) -> list:
            self.partitions.reload()
            if not isinstance(outcome, dict):  # expired: the timer never answered
                outcome = {name: (int(E.REQUEST_TIMED_OUT), "timed out") for name in names}
            return answer(outcome)

        return self._wait(req, lambda rid: self.link.control_frame(rid, payload), deadline, finish)

    def create_topics_then(self, req: Request, topics: list[tuple[str, int]], rerun: Callable[[], Any]) -> object:
        """Auto-create `topics`, then run the request again; `rerun` must not auto-create again
        (a creation that failed, e.g. the node is full, then answers UNKNOWN_TOPIC_OR_PARTITION)."""

        def after(outcome: dict) -> list:
            result = rerun()
            if result is DEFERRED:
                return None  # the re-run registered its own wait and owns the slot now
            return [] if result is NO_RESPONSE else result

        return self.control_then(req, {"op": "create_topics", "topics": topics}, after)

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
            conn = Connection(sock, peer, server.request_max_bytes)
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
        for request_id in [rid for rid, w in self.waiting.items() if w.request.conn is conn]:
            del self.waiting[request_id]
            self.link.send(self.link.cancel_frame(request_id))

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

    def _settle(self, req: Request, outcome: Any) -> None:
        if outcome is DEFERRED or outcome is None:
            return
        req.slot.fill([] if outcome is NO_RESPONSE else outcome)
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

    # -- completions from the timer --------------------------------------------------------------

    def _on_message(self, message: Message) -> None:
        if message.op == OP_TIMER_STARTED:
            self._resubmit()
        elif message.op == OP_LAYOUT:
            self.partitions.reload()
        else:  # a completion or a control reply: finish the request it answers, if still waiting
            waiting = self.waiting.pop(message.request_id, None)
            if waiting is not None:
                self._finish(waiting, message.outcome)

    def _finish(self, waiting: Waiting, outcome: Any) -> None:
        req = waiting.request
        if req.conn.closed:
            return
        try:
            pieces = waiting.finish(outcome)
        except Exception:
            log.exception("finishing a delayed request failed")
            self._close(req.conn, "internal error")
            return
        if pieces is not None:
            req.slot.fill(pieces)
            self._dirty.add(req.conn)

    def _resubmit(self) -> None:
        log.info("timer process (re)started: re-submitting %d delayed requests", len(self.waiting))
        for waiting in self.waiting.values():
            self.link.send(waiting.frame)
        self.partitions.reload()

    def _self_answer(self, now_ms: int) -> None:
        """Answer delayed requests the timer left far past their deadline."""
        grace = self.config.timer.delayed_grace_ms
        late = [rid for rid, w in self.waiting.items() if now_ms > w.deadline_ms + grace]
        for request_id in late:
            waiting = self.waiting.pop(request_id)
            log.warning("timer did not answer request %d in time; answering it here", request_id)
            self._finish(waiting, True)

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
            timeout = self_check_ms / 1000 if self.waiting or self._stopping_since else None
            if self.link.backlogged():
                timeout = 0.001
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
                        os.read(self._wakeup_r, 512)
                    except BlockingIOError:
                        pass
                else:
                    if mask & selectors.EVENT_READ:
                        self._on_readable(tag)
                    if mask & selectors.EVENT_WRITE and not tag.closed:
                        self._dirty.add(tag)
            for message in self.link.receive():
                self._on_message(message)
            if self._appends:
                self.link.send_appends(self._appends)
                self._appends = {}
            self.link.flush()
            now = monotonic_ms()
            if self.waiting and now >= self._next_self_check:
                self._next_self_check = now + self_check_ms
                self._self_answer(now)
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
