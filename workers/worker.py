"""A network worker process: its own SO_REUSEPORT listening socket (bound by the supervisor, put to listen here
as the loop starts: the port accepts only once a worker serves it), its client connections, its completion
doorbell and a signal wakeup pipe, on one event loop (workers.eventloop).

The server logic hangs on the loop as handlers and hooks:
- file events: accept on the listener (a new connection goes on, unread, to the live worker holding the
  fewest when it holds fewer than this one: server.balance_connections); read and write on each
  connection (and its hang-up while its reads are paused); drain the doorbell; the wakeup pipe;
  connections other workers hand over (shm.handoff);
- after a Produce's appends (before its own response is built), after each request, and on a ring of the
  doorbell: the delayed fetches an append satisfied, answered and written at once (their clients are the
  ones waiting; the rest of the turn's responses wait for its end);
- before each sleep: the heartbeat, the stop procedure, the timer's messages (completions, topic outcomes,
  layout changes), the responses that became ready, the memory budget's resumptions, the connections due
  to move to another worker (workers.affinity), the turn's frames to the timer; then the doorbell's sleep
  announcement;
- after each sleep: the completion ring's sleep flag is cleared;
- timers: delayed requests the timer process left far past their deadline (workers.timer_client.delayed); each
  connection's deadlines (idle, incomplete request); the listener's rest after running out of fds.

Invariants:
- The worker never blocks except in the loop's one select(); sockets are non-blocking, ring writes
  never wait (a full ring keeps frames in a local backlog, retried every turn).
- Every request read gets its response in request order on its connection (see
  workers.connection). Requests that wait on the timer live in workers.timer_client.delayed, which answers them
  when the timer does, or by itself once they are far past their deadline, and re-submits them when
  the timer process restarts: no client waits forever, even with the timer process dead.
- Bad input closes only its own connection, with one log line; no input ends the process.
- Memory is bounded whatever clients do: the worker's share of server.queued_max_request_bytes
  (workers.memory: backpressure by not reading, never a close), and per connection
  server.connection_max_queued_response_bytes of responses its client has not read (past it, the complete
  requests already read wait and the connection is not read until its client reads).
- Connections over server.max_connections or server.max_connections_per_ip (node-wide, workers.limits)
  are closed at accept; a connection idle for server.connections_max_idle_ms, or whose request stays
  incomplete for server.request_timeout_ms while it is read, is closed. Each cause logs one line per
  server.limit_log_interval_ms (counting the rest).
- The loop turns at least every server.heartbeat_interval_ms and beats the worker's heartbeat every turn
  (shm.heartbeat): the supervisor replaces a worker whose heartbeat stops.
- A connection moves to another worker only when nothing of it is in flight here (no request read and
  unanswered, no byte buffered either way, no delayed request, no pause), and only between requests
  served: the socket and what its client sent since go to the peer whole, and this worker forgets it.
- SIGTERM: stop accepting, finish in-flight requests within the grace period, then exit 0.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import sys
import time
from typing import Any

from node.config import NodeConfig, read_runtime, reload_runtime
from node.logging_setup import RateLimitedLog, setup_logging
from node.storage.store import PartitionStore
from shm import instance as shm_instance
from shm import messages as M
from shm.connections import ConnectionCounts
from node.proctitle import set_title
from shm import stats as S
from shm.heartbeat import BeatWatch, HeartbeatTable, worker_slot
from shm.doorbell import EventfdDoorbell
from shm.handoff import AFFINITY, BALANCE, Handoffs
from shm.interest import WorkerWatches
from shm.ring import max_payload
from shm.table import PartitionTable
from workers.codecs import protocol as P
from workers.affinity import ConnectionAffinity
from workers.connection import (PAUSED_MEMORY, PAUSED_OUTPUT, PAUSED_THROTTLE, Connection, ConnectionClosed,
                                Request)
from workers.timer_client.delayed import DelayedRequests, monotonic_ms
from workers.codecs.errors import ProtocolError
from workers.eventloop import EventLoop, Timer
from workers.api.handlers import Handlers
from workers.limits import ConnectionLimits
from workers.memory import MemoryBudget
from workers.timer_client.outcome import Outcome
from workers.api.quotas import ClientQuotas, Throttler
from shm.timer_link import TimerLink

log = logging.getLogger("shmbroker.worker")

WAKEUP_READ_BYTES = 512  # one byte per signal delivered; more than a turn ever sees
# accept() errors that mean "no resources now": the listener rests instead of spinning on them.
_ACCEPT_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_REQUESTS = S.OFFSETS["requests"]
_ERRORS = S.OFFSETS["request_errors"]
_BYTES_IN = S.OFFSETS["bytes_in"]
_ERROR_RESPONSES = S.OFFSETS["error_responses"]
_ERROR_CODES = S.OFFSETS["error_codes"]
_LAST_ERROR_CODE = S.MAX_ERROR_CODES - 1
_BYTES_OUT = S.OFFSETS["bytes_out"]
_ACCEPTED = S.OFFSETS["connections_accepted"]
_CLOSED_ON_ERROR = S.OFFSETS["connections_closed_on_error"]
_STREAM = socket.SocketKind.SOCK_STREAM


class Worker:
    def __init__(self, instance: str, index: int, config: NodeConfig, listen_fd: int, bell_fds: list[int],
                 supervisor_pid: int, config_path: str, heartbeat_slot: int,
                 handoffs: Handoffs | None = None) -> None:
        self.instance = instance
        self.config_path = config_path
        self.index = index
        self.config = config
        self.supervisor_pid = supervisor_pid
        server = config.server
        self.table = PartitionTable.attach(shm_instance.table_name(instance))
        self.watches = WorkerWatches.attach(shm_instance.watches_name(instance))
        self.heartbeats = HeartbeatTable.attach(shm_instance.heartbeat_name(instance))
        self.heartbeat = self.heartbeats.heartbeat(heartbeat_slot, os.getpid())
        self.counts = ConnectionCounts.attach(shm_instance.connections_name(instance))
        self.limits = ConnectionLimits(self.counts, index, server.max_connections, server.max_connections_per_ip)
        self.partitions = PartitionStore(os.path.abspath(server.data_dir), self.table, config.log,
                                         config.topics.max_partitions)
        self.link = TimerLink(instance, index, config.rings, bell_fds[index])
        max_frame = min(config.groups.max_request_document_bytes, max_payload(config.rings.capacity))
        peer_bells = {peer: EventfdDoorbell(fd) for peer, fd in enumerate(bell_fds) if peer != index}
        self.delayed = DelayedRequests(self.link, self.table, config.timer.delayed_grace_ms, self._settle_delayed,
                                       max_frame, self.watches, index, peer_bells, config.timer.fetch_handoff_ms)
        self.quotas = ClientQuotas(config.quotas, index)
        throttler = Throttler(self.quotas, self.delayed, self._mute, self._unmute)
        self.handlers = Handlers(self.partitions, config, self.delayed, f"shmbroker-{instance}", throttler)
        self.handlers.after_appends = self._answer_appended_if_due
        self.message_handlers = {
            M.Kind.QUOTA_STATE: self.quotas.on_state,
            M.Kind.COMPLETION: self.delayed.on_completion,
            M.Kind.REPLY: self.delayed.on_reply,
            M.Kind.TIMER_STARTED: self._on_timer_started,
            M.Kind.LAYOUT: self._on_layout,
        }
        self.listener = socket.socket(fileno=listen_fd)
        self.listener.setblocking(False)
        self.loop = EventLoop()
        self.connections: dict[int, Connection] = {}
        self._dirty: set[Connection] = set()
        self._answered: dict[Connection, None] = {}  # dirty with a delayed request's answer: written first
        self._moving: set[Connection] = set()  # due to move (workers.affinity), written out: moved before sleeping
        self._write_chunk = config.timer.completion_chunk
        self._stopping_since: float | None = None
        self._next_parent_check = 0.0
        self._stop_started = False
        self._self_check: Timer | None = None
        self._quota_report: Timer | None = None
        self._reload = False
        self._wakeup_r, self._wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        share = server.worker_request_bytes()
        self.memory = (MemoryBudget(share, server.recv_bytes, self._pause_for_memory, self._resume_for_memory)
                       if share >= 0 else None)
        self.output_limit = server.connection_max_queued_response_bytes
        # One line per cause per interval for the whole node (the marks are shared by the workers).
        self.limit_log = RateLimitedLog(log, server.limit_log_interval_ms / 1000, marks=self.counts.log_marks(
            ("accept", "server.max_connections", "server.max_connections_per_ip", "server.connections_max_idle_ms",
             "server.request_timeout_ms")))
        self.idle_s = server.connections_max_idle_ms / 1000 if server.connections_max_idle_ms > 0 else None
        self.request_timeout_s = server.request_timeout_ms / 1000 if server.request_timeout_ms > 0 else None
        # Each connection's deadline timer fires at least this often (see _check_deadlines).
        periods = [s for s in (self.idle_s, self.request_timeout_s) if s is not None]
        self.deadline_period_s = min(periods) if periods else None
        self.stats_segment = S.StatsSegment.attach(shm_instance.stats_name(instance)) if config.stats.enabled else None
        self.stats = (self.stats_segment.writer(S.worker_row(index), "worker", index, os.getpid())
                      if self.stats_segment is not None else None)
        self.handoffs = handoffs
        rows = [self.counts.row(w) for w in range(self.counts.workers)]
        # New connections to the worker holding the fewest (_pass_to_fewest); counted for the stats segment.
        self._balance_rows = rows if handoffs is not None and handoffs.peers() and server.balance_connections else None
        self.balanced_out = self.balanced_in = 0
        self._peer_beats = BeatWatch(self.heartbeats)  # the peers' liveness, as the supervisor's HangWatch reads it
        self.affinity: ConnectionAffinity | None = None
        if handoffs is not None and handoffs.peers() and server.connection_affinity_waits > 0:
            self.affinity = ConnectionAffinity(index, server.connection_affinity_waits,
                                               server.connection_affinity_slack,
                                               server.connection_affinity_cooldown_ms / 1000,
                                               lambda worker: rows[worker].count)
            self.delayed.on_answered = lambda conn, appender: self.affinity.answered(conn, appender,
                                                                                     self.loop.now)

    # -- connections -------------------------------------------------------------------------

    def _accept(self) -> None:
        server = self.config.server
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
                    self._rest_listener()
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
                self.stats.counts[_ACCEPTED] += 1
            if self._balance_rows is not None and self._pass_to_fewest(sock, passed):
                continue
            self._adopt(sock, peer, bucket)

    def _pass_to_fewest(self, sock: socket.socket, passed: dict[int, int]) -> bool:
        """Pass a new connection, before any byte of it is read, to the live worker holding the fewest, if it
        holds fewer than this one does now (so it ends with no more than this one keeps). The others' counts are
        of a moment ago (shm.connections), and a connection passed in this accept call is not in its peer's
        count yet: `passed` adds them. Liveness is the heartbeat's, as the supervisor's HangWatch reads it."""
        rows = self._balance_rows
        fewest, count = None, rows[self.index].count  # the peer must hold fewer than this one holds now
        for peer in self.handoffs.peers():
            held = rows[peer].count + passed.get(peer, 0)
            if held < count and self._turning(peer):
                fewest, count = peer, held
        if fewest is None or not self.handoffs.send(fewest, sock.fileno(), BALANCE):
            return False
        sock.close()  # this worker's copy: the socket lives on in the peer
        passed[fewest] = passed.get(fewest, 0) + 1
        self.balanced_out += 1
        return True

    def _adopt(self, sock: socket.socket, peer: Any, bucket: int) -> Connection:
        """Serve `sock` from now on: an accepted connection, or one another worker passed here."""
        server = self.config.server
        sock.setblocking(False)
        conn = Connection(sock, peer, server.request_max_bytes, server.recv_bytes, self.loop.now, bucket)
        self.connections[conn.fd] = conn
        self.limits.opened(bucket)
        self.loop.watch(sock, lambda: self._on_readable(conn), on_hangup=lambda: self._close(conn, None))
        if self.deadline_period_s is not None:
            self._arm_deadlines(conn, self.loop.now)
        return conn

    def _rest_listener(self) -> None:
        self.loop.pause_reading(self.listener)

        def wake() -> None:
            if not self._stop_started:
                self.loop.resume_reading(self.listener)

        self.loop.call_later(self.config.server.accept_retry_ms / 1000, wake)

    def _close(self, conn: Connection, reason: str | None = None) -> None:
        if conn.closed:
            return
        if reason:
            log.warning("closing connection from %s: %s", conn.peer, reason)
            if self.stats is not None:
                self.stats.counts[_CLOSED_ON_ERROR] += 1
        self.loop.unwatch(conn.sock)
        self.connections.pop(conn.fd, None)
        self._dirty.discard(conn)
        self._answered.pop(conn, None)
        self._moving.discard(conn)
        conn.close()
        if conn.timer is not None:
            conn.timer.cancel()
        self.limits.closed(conn.bucket)
        if self.memory is not None:
            self.memory.forget(conn)
        self.delayed.cancel_connection(conn)
        if self.affinity is not None:
            self.affinity.forget(conn)

    # -- connections moving between workers (workers.affinity, shm.handoff) ---------------------

    def _move_due(self) -> None:
        """Before sleeping, when no request is being served (a connection's frames read in one go are handled
        in a loop that must not lose its connection midway): move the due connections written out this turn."""
        moving, self._moving = self._moving, set()
        for conn in moving:
            self._move_if_quiet(conn)

    def _move_if_quiet(self, conn: Connection) -> None:
        """Pass a connection due to move to its peer, if nothing of it is in flight here: no request read and
        unanswered, no byte buffered either way, no delayed request, no pause. Else try again after its
        next write."""
        if (conn.closed or conn.slots or conn.outq or conn.held or conn.paused or conn.mutes
                or conn.partial_bytes or self.delayed.holds(conn)):
            return
        peer = self.affinity.destination(conn)
        if peer is None or not self.handoffs.send(peer, conn.fd, AFFINITY):
            return
        self._close(conn)  # this worker's copy and its accounting only: the socket lives on in the peer
        self.affinity.sent()

    def _turning(self, peer: int) -> bool:
        """Whether a peer's loop turned within two heartbeat intervals: a stopped, hung or dead one (its beats
        zeroed until its replacement runs) would leave a connection passed to it waiting for the supervisor.
        Its beats are looked at every interval too (_look_at_peers): a first look could not tell."""
        beats, silent_s = self._peer_beats.look(worker_slot(peer), self.loop.now)
        return beats > 0 and silent_s <= 2 * self.config.server.heartbeat_interval_ms / 1000

    def _look_at_peers(self) -> None:
        """Every heartbeat interval, while balancing: the peers' beats, for _turning."""
        now = self.loop.now
        for peer in self.handoffs.peers():
            self._peer_beats.look(worker_slot(peer), now)
        self.loop.call_later(self.config.server.heartbeat_interval_ms / 1000, self._look_at_peers)

    def _on_handoff(self) -> None:
        """Connections other workers passed here: served as if accepted (their unread requests are in the
        socket), then read at once."""
        for fd, sender, reason in self.handoffs.receive():
            sock = socket.socket(fileno=fd)
            if sender is None or sock.type != _STREAM:
                log.warning("dropping a malformed handoff (sender %s, %r)", sender, sock.type)
                sock.close()
                continue
            try:
                peer = sock.getpeername()
            except OSError:  # its client left while it was on the way: nothing to serve
                sock.close()
                continue
            conn = self._adopt(sock, peer, self.limits.bucket_of(peer[0] if isinstance(peer, tuple) else str(peer)))
            if reason == BALANCE:
                self.balanced_in += 1
            elif self.affinity is not None:
                self.affinity.adopted(conn, self.loop.now)
            self._on_readable(conn)

    def _on_readable(self, conn: Connection) -> None:
        if conn.closed:
            return
        try:
            frames = conn.receive(self.loop.now)
        except ConnectionClosed as exc:
            self._close(conn, None if str(exc) == "peer closed" else str(exc))
            return
        if frames:
            self._serve(conn, frames)
        if self.memory is not None and not conn.closed:
            self.memory.update(conn)

    def _serve(self, conn: Connection, frames: list[memoryview]) -> None:
        """Handle complete requests in order; past the output bound, or once a throttle began, hold the rest
        back (they are handled when it ends, as Kafka, which handles one request of a connection at a time,
        would read them only then)."""
        limit = self.output_limit
        for position, frame in enumerate(frames):
            if conn.closed:
                return
            if conn.mutes:
                conn.hold(frames[position:])
                return
            if 0 <= limit < conn.queued_bytes:
                conn.hold(frames[position:])
                self._pause(conn, PAUSED_OUTPUT)
                return
            self._handle(conn, frame)
            self._answer_appended_if_due()

    def _handle(self, conn: Connection, frame: memoryview) -> None:
        try:
            header = P.parse_request_header(frame)
        except ProtocolError as exc:
            self._close(conn, f"bad request header: {exc}")
            return
        if not P.is_supported(header.api_key, header.api_version):
            if header.api_key == P.API_VERSIONS:
                conn.fill(conn.new_slot(), [P.encode_api_versions_unsupported(header.correlation_id)])
                self._dirty.add(conn)
                return
            self._close(conn, f"unsupported api {header.api_key} v{header.api_version}")
            return
        req = Request(conn, header, conn.new_slot())
        stats = self.stats
        if stats is not None:
            counts = stats.counts
            counts[_REQUESTS + header.api_key] += 1
            counts[_BYTES_IN + header.api_key] += len(frame)
        try:
            request = P.decode_request(header.api_key, header.api_version, frame[header.body_offset:])
            outcome = self.handlers.dispatch(req, request)
        except ProtocolError as exc:
            if stats is not None:
                stats.counts[_ERRORS + header.api_key] += 1
            self._close(conn, f"bad request api {header.api_key} v{header.api_version}: {exc}")
            return
        except Exception:  # a bug must cost one connection, never the worker
            log.exception("handler failed for api %d v%d", header.api_key, header.api_version)
            if stats is not None:
                stats.counts[_ERRORS + header.api_key] += 1
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
        size = req.conn.fill(req.slot, outcome.pieces)
        self._dirty.add(req.conn)
        stats = self.stats
        if stats is not None:
            counts = stats.counts
            counts[_BYTES_OUT + req.header.api_key] += size
            if outcome.errors is not None:
                errors = outcome.errors()
                if errors:
                    counts[_ERROR_RESPONSES + req.header.api_key] += 1
                    for error in errors:
                        counts[_ERROR_CODES + min(error, _LAST_ERROR_CODE)] += 1

    def _settle_delayed(self, req: Request, outcome: Outcome | None) -> None:
        """A delayed request's answer: its client has been waiting, and on one CPU the first response written
        wakes its reader first. Written before this turn's other responses (an append's produce ack is not what
        a consumer waits on)."""
        self._settle(req, outcome)
        if req.conn in self._dirty:
            self._answered[req.conn] = None

    def _answer_appended_if_due(self) -> None:
        """After a Produce's appends (before its response is built), and after each request."""
        if self.delayed.answers_due():
            self._answer_appended()

    def _answer_appended(self) -> None:
        """Answer the delayed fetches that an append just satisfied, and write their responses at once: their
        clients are the ones waiting (a producer's ack is written with the turn's other responses). After a
        Produce's appends and after each request, as Kafka's KafkaApis.handle completes delayed operations
        (tryCompleteActions)."""
        self.delayed.answer_appended(self._write_chunk_ready)
        if self._answered:
            self._write_answered(self._dirty)

    def _write(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.collect_ready()
        try:
            done = conn.flush(self.loop.now)
        except ConnectionClosed as exc:
            self._close(conn, str(exc))
            return
        if conn.wants_write != (not done):
            conn.wants_write = not done
            self.loop.want_write(conn.sock, None if done else lambda: self._dirty.add(conn))
        if conn.paused & PAUSED_OUTPUT and conn.queued_bytes <= self.output_limit:
            self._unpause(conn, PAUSED_OUTPUT)
            if conn.held:
                self._serve(conn, conn.take_held())
        if self.memory is not None and not conn.closed:
            self.memory.update(conn)
        if done and self.affinity is not None and conn in self.affinity.due:
            self._moving.add(conn)

    # -- backpressure ---------------------------------------------------------------------------

    def _pause(self, conn: Connection, reason: int) -> None:
        if conn.pause(reason, self.loop.now):
            self.loop.pause_reading(conn.sock)

    def _unpause(self, conn: Connection, reason: int) -> None:
        if not conn.closed and conn.unpause(reason, self.loop.now):
            self.loop.resume_reading(conn.sock)

    def _pause_for_memory(self, conn: Connection) -> None:
        self._pause(conn, PAUSED_MEMORY)

    def _resume_for_memory(self, conn: Connection) -> None:
        self._unpause(conn, PAUSED_MEMORY)

    # -- deadlines ------------------------------------------------------------------------------

    def _arm_deadlines(self, conn: Connection, when: float) -> None:
        conn.timer = self.loop.call_at(when + self.deadline_period_s, lambda: self._check_deadlines(conn))

    def _check_deadlines(self, conn: Connection) -> None:
        """A connection's timer: close it if idle or if its request is incomplete for too long; else look again
        by its next deadline. The timer is never set further than one period ahead, so a request that begins
        meanwhile is caught in time without re-arming on every read."""
        if conn.closed:
            return
        now = time.monotonic()
        due = now + self.deadline_period_s
        if conn.request_since is not None:
            if self.request_timeout_s is not None and not conn.paused:
                incomplete_s = now - conn.request_since
                if incomplete_s >= self.request_timeout_s:
                    self._close_for("server.request_timeout_ms", conn, "request incomplete for %d ms",
                                    incomplete_s)
                    return
                due = min(due, conn.request_since + self.request_timeout_s)
        elif self.idle_s is not None and not conn.slots and not conn.held:
            idle_s = now - conn.last_active
            if idle_s >= self.idle_s:
                self._close_for("server.connections_max_idle_ms", conn, "idle for %d ms", idle_s)
                return
            due = min(due, conn.last_active + self.idle_s)
        conn.timer = self.loop.call_at(due, lambda: self._check_deadlines(conn))

    def _close_for(self, setting: str, conn: Connection, what: str, seconds: float) -> None:
        self.limit_log.warning(setting, "closing connection from %s: " + what + " (%s)", conn.peer,
                               seconds * 1000, setting)
        self._close(conn)

    # -- messages from the timer -------------------------------------------------------------

    def _on_timer_started(self, message) -> None:
        self.delayed.resubmit()
        self.partitions.reload()

    def _on_layout(self, message) -> None:
        if message.catalog_version != self.partitions.version:
            self.partitions.reload()

    # -- quotas --------------------------------------------------------------------------------

    def _mute(self, conn: Connection) -> None:
        """Stop reading a throttled client's connection until its throttle ends (KIP-219)."""
        if not conn.closed:
            conn.mutes += 1
            self._pause(conn, PAUSED_THROTTLE)

    def _unmute(self, conn: Connection) -> None:
        if not conn.closed:
            conn.mutes = max(0, conn.mutes - 1)
            if not conn.mutes:  # on the next turn: this runs inside a timer message's handling
                self.loop.call_later(0, lambda: self._resume(conn))

    def _resume(self, conn: Connection) -> None:
        """A throttle ended: the requests held back first (they may throttle again, or meet the output bound),
        then the socket, unless another reason still pauses it."""
        if conn.closed or conn.mutes:
            return
        if conn.held:
            self._serve(conn, conn.take_held())
        if not conn.mutes:
            self._unpause(conn, PAUSED_THROTTLE)

    def _report_quota_usage(self) -> None:
        self._quota_report = None
        frame = self.quotas.report()
        if frame is not None:
            self.link.send(frame)
        self._arm_quota_report()

    def _arm_quota_report(self) -> None:
        if self.config.quotas.enabled and self._quota_report is None:
            self._quota_report = self.loop.call_later(self.quotas.next_report_ms / 1000, self._report_quota_usage)

    def _reload_config(self) -> None:
        """SIGHUP: the supervisor rewrote the config file with new reloadable settings."""
        self._reload = False
        config = reload_runtime(self.config, self.config_path, log)
        if config is None:
            return
        self.config = config
        self.handlers.config = self.config
        self.quotas.reconfigure(self.config.quotas)
        self._arm_quota_report()
        log.info("reloaded quotas")

    # -- loop hooks ---------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._stopping_since is None:
            self._stopping_since = time.monotonic()

    def _on_hup(self, signum: int, frame: Any) -> None:
        self._reload = True
    def _beat(self) -> float | None:
        """First before sleeping: one heartbeat per turn, and a turn at least every heartbeat interval."""
        self.heartbeat.beat()
        return self.config.server.heartbeat_interval_ms / 1000

    def _stop_procedure(self) -> float | None:
        """Before sleeping: notice a lost supervisor; once stopping, stop accepting, close idle connections,
        and end the loop when in-flight responses are out (or the grace period is over)."""
        if self._stopping_since is None and self.loop.now >= self._next_parent_check:
            # Normally PR_SET_PDEATHSIG has killed us already; this covers a lost signal. Once per heartbeat
            # interval, not per turn: a syscall per request at 1,000s of requests per second.
            self._next_parent_check = self.loop.now + self.config.server.heartbeat_interval_ms / 1000
            if os.getppid() != self.supervisor_pid:
                log.error("supervisor is gone: stopping")
                self._stopping_since = time.monotonic()
        if self._stopping_since is None:
            return None
        if not self._stop_started:
            self._stop_started = True
            self.loop.unwatch(self.listener)
            self.listener.close()
            for conn in list(self.connections.values()):
                if not conn.slots and not conn.pending_output():
                    self._close(conn)
        grace_s = self.config.server.shutdown_grace_ms / 1000
        if time.monotonic() - self._stopping_since > grace_s or not any(
                conn.slots or conn.pending_output() for conn in self.connections.values()):
            self.loop.stop()
        return self.config.timer.self_check_interval_ms / 1000

    def _from_timer(self) -> float | None:
        """Before sleeping: the timer's messages, then the delayed fetches this turn's appends satisfied."""
        if self._reload:
            self._reload_config()
        for message in self.link.receive():
            handler = self.message_handlers.get(message.kind)
            if handler is None:
                log.warning("dropping a %s message: no handler", message.kind.name)
            else:
                handler(message)
            self._write_chunk_ready()
        self.delayed.ring_peers()
        self.delayed.answer_appended(self._write_chunk_ready)
        return None

    def _write_chunk_ready(self) -> None:
        if len(self._dirty) >= self._write_chunk:  # a fan-out: the first clients read while the rest are encoded
            self._write_dirty()

    def _to_timer(self) -> float | None:
        """Before sleeping, after the responses are written: this turn's frames to the timer. Ringing its
        doorbell wakes the timer, which on a busy host can take this worker's CPU: the clients' responses
        go out first."""
        self.delayed.end_turn()
        if self.delayed and self._self_check is None:
            self._self_check = self.loop.call_later(self.config.timer.self_check_interval_ms / 1000,
                                                    self._check_delayed)
        if self._dirty:  # fetches answered there (requests served in _write_ready): no sleep before writing
            return 0.0
        if self.link.backlogged():  # a full request ring: try again soon
            return self.config.timer.ring_full_retry_ms / 1000
        handoff_ms = self.delayed.next_handoff_ms(monotonic_ms())
        return None if handoff_ms is None else handoff_ms / 1000

    def _check_delayed(self) -> None:
        self._self_check = None
        self.delayed.self_answer(monotonic_ms())

    def _write_ready(self) -> float | None:
        self._write_dirty()
        if self._moving:
            self._move_due()
        if self.memory is not None and self.memory.engaged:
            self.memory.end_turn()
        # Requests served from a held-back queue just now have responses to write: no sleep before that.
        return 0.0 if self._dirty else None

    def _write_dirty(self) -> None:
        if self._dirty:
            dirty, self._dirty = self._dirty, set()
            if self._answered:
                self._write_answered(dirty)
            for conn in dirty:
                self._write(conn)

    def _write_answered(self, dirty: set[Connection]) -> None:
        """Write the connections a delayed request's answer made dirty, taking them out of `dirty` first (a
        write may serve held requests, which mark their connection dirty again)."""
        answered, self._answered = self._answered, {}
        for conn in answered:
            dirty.discard(conn)
            self._write(conn)

    def _announce_sleep(self) -> float | None:
        """Last before sleeping: tell the timer we sleep on the doorbell (0: frames arrived meanwhile)."""
        return None if self.link.announce_sleep() else 0.0

    def _publish_stats(self) -> None:
        """Every stats.publish_interval_ms: the gauges, then the whole row (shm.stats)."""
        stats = self.stats
        link = self.link
        stats.set("loop_turns", self.heartbeat.beats)
        stats.set("connections", len(self.connections))
        stats.set("delayed_waiting", len(self.delayed))
        stats.set("fetches_answered_on_append", self.delayed.answered_on_append)
        stats.set("fetches_handed_off", self.delayed.handed_off)
        if self.affinity is not None:
            stats.set("connections_moved_out", self.affinity.moved_out)
            stats.set("connections_moved_in", self.affinity.moved_in)
        stats.set("connections_balanced_out", self.balanced_out)
        stats.set("connections_balanced_in", self.balanced_in)
        stats.set("throttled_connections", sum(1 for conn in self.connections.values() if conn.mutes))
        stats.set("ring_frames_sent", link.frames_sent)
        stats.set("ring_frames_received", link.frames_received)
        capacity = self.config.rings.capacity
        stats.set("ring_capacity_bytes", capacity)
        stats.set("ring_used_bytes", max(0, capacity - link.writer.free_bytes()))
        stats.publish()
        self.loop.call_later(self.config.stats.publish_interval_ms / 1000, self._publish_stats)

    def _on_doorbell(self) -> None:
        self.link.drain_doorbell()
        self.delayed.doorbell_rang()
        self._answer_appended()  # another worker's append: its consumers here wait on this

    def _read_wakeup(self) -> None:
        try:
            os.read(self._wakeup_r, WAKEUP_READ_BYTES)
        except BlockingIOError:
            pass

    def run(self) -> int:
        signal.set_wakeup_fd(self._wakeup_w)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_hup)
        loop = self.loop
        self._arm_quota_report()
        loop.watch(self.listener, self._accept)
        loop.watch(self.link.doorbell_fd, self._on_doorbell)
        loop.watch(self._wakeup_r, self._read_wakeup)
        if self.handoffs is not None:
            loop.watch(self.handoffs.receiving_fd, self._on_handoff)
        if self.stats is not None:
            self._publish_stats()
        if self._balance_rows is not None:
            self._look_at_peers()
        for hook in (self._beat, self._stop_procedure, self._from_timer, self._write_ready, self._to_timer,
                     self._announce_sleep):
            loop.before_sleep(hook)
        loop.after_sleep(self.link.woke)
        # The port accepts from now on (the supervisor only bound it); a replacement's socket listens already.
        self.listener.listen(self.config.server.listen_backlog)
        log.info("worker %d ready", self.index)
        loop.run()
        for conn in list(self.connections.values()):
            self._close(conn)
        loop.close()
        self.link.close()
        if self.handoffs is not None:
            self.handoffs.close()
        self.partitions.close()
        self.table.close()
        self.watches.close()
        self.counts.close()
        self.heartbeats.close()
        if self.stats_segment is not None:
            self.stats_segment.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instance", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--config-file", required=True)
    parser.add_argument("--heartbeat-slot", type=int, required=True)
    parser.add_argument("--supervisor-pid", type=int, required=True)
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--worker-bell-fds", required=True,
                        help="every worker's doorbell eventfd, by worker index (comma-separated)")
    parser.add_argument("--inbox-fd", type=int, help="this worker's handoff inbox, its receiving end (shm.handoff)")
    parser.add_argument("--worker-inbox-fds", default="",
                        help="every worker's handoff inbox, its sending end, by worker index (comma-separated)")
    args = parser.parse_args(argv)
    setup_logging(f"worker-{args.index}")
    config = read_runtime(args.config_file)
    set_title(f"worker {args.index} {config.server.host}:{config.server.port}")
    bell_fds = [int(fd) for fd in args.worker_bell_fds.split(",")]
    handoffs = None
    if args.inbox_fd is not None:
        inbox_fds = dict(enumerate(int(fd) for fd in args.worker_inbox_fds.split(",")))
        handoffs = Handoffs(args.index, args.inbox_fd, inbox_fds)
    worker = Worker(args.instance, args.index, config, args.listen_fd, bell_fds, args.supervisor_pid,
                    args.config_file, args.heartbeat_slot, handoffs)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
