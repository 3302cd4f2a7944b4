"""A network worker process: its listening sockets (one per listener), its client connections, its completion doorbell, its handoff
inbox and a signal wakeup pipe on one event loop (workers.eventloop). The worker serves requests and writes
responses; each other concern is a part of its own, which the worker wires to the loop:
workers.acceptor (accept, admission) with workers.balance (new connections to the worker holding the fewest),
workers.moves (connections arriving from and leaving for other workers; workers.affinity decides the moves),
workers.backpressure (pausing and resuming reads: memory budget, output bound, throttles), workers.deadlines
(idle and incomplete-request timeouts), workers.stats (the stats row), workers.listeners (the listener a connection
came through: its protocol, its advertised address), workers.tls (TLS handshakes and connections), workers.api.sasl
(logins on SASL listeners); SIGHUP reloads through node.child.ConfigReload.

The hooks on the loop:
- file events: each listener (Acceptor.accept); a TLS connection's handshake steps (TlsHandshake), then read on each
  connection, and its hang-up while its reads are
  paused; write on a connection the socket did not take all of; the doorbell (the timer's messages, or another
  worker's append); the handoff inbox (ConnectionMoves.receive); the wakeup pipe;
- after a Produce's appends (before its own response is built), after each request, and on a ring of the
  doorbell: the delayed fetches an append satisfied, answered and written at once (their clients are the
  ones waiting; the rest of the turn's responses wait for its end);
- before each sleep, in order: the heartbeat; the stop procedure; a requested reload, the timer's messages
  (completions, replies, quota state, timer restarts, layout changes) and the delayed fetches appends
  satisfied; the responses that became ready, then the connections due to move that were written out
  (ConnectionMoves.move_quiet), then the memory budget's resumptions; the turn's frames to the timer; last the
  doorbell's sleep announcement;
- after each sleep, before the file events: the completion ring's sleep flag is cleared, then the timer's messages
  are read (so a change the timer made before answering a request is known to every worker before a request sent
  after that answer is served);
- timers: delayed requests the timer process left far past their deadline (workers.timer_client.delayed); each
  connection's deadlines; the quota usage report; the stats row; the peers' heartbeats while balancing; the
  listener's rest after running out of fds; the end of a throttle.

Invariants:
- The worker never blocks except in the loop's one epoll wait; sockets are non-blocking, ring writes
  never wait (a full ring keeps frames in a local backlog, retried every turn).
- Every request read gets its response in request order on its connection (see workers.connection).
  Requests that wait on the timer live in workers.timer_client.delayed, which answers them when the timer
  does, or by itself once they are far past their deadline, and re-submits them when the timer process
  restarts: no client waits forever, even with the timer process dead.
- Bad input closes only its own connection, with one log line; no input ends the process.
- Memory is bounded whatever clients do (workers.backpressure): backpressure by not reading, never a close.
- The request path reads the parts it needs per request through the worker's own attributes (`memory`,
  `output_limit`, `stats`, `affinity`): no extra hop per request or response.
- The loop turns at least every server.heartbeat_interval_ms and beats the worker's heartbeat every turn
  (shm.heartbeat): the supervisor replaces a worker whose heartbeat stops.
- A connection of a SASL listener is served nothing but ApiVersions and SASL before its login (workers.api.sasl);
  TLS and SASL connections never move to a peer by affinity (`Connection.pinned`: their state lives here).
- A closed connection is forgotten by every part at once (`_close`); a connection that moved to another worker
  is closed here the same way, its socket living on in the peer.
- SIGTERM: stop accepting, finish in-flight requests within server.shutdown_grace_ms, then exit 0.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from typing import Any

from shmbroker.node.child import ConfigReload, child_arguments, close_all, settle_garbage_collector, start_child
from shmbroker.node.config import NodeConfig
from shmbroker.node.logging_setup import RateLimitedLog
from shmbroker.node.proctitle import set_title
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.storage.users import UsersView
from shmbroker.shm import instance as shm_instance
from shmbroker.shm import messages as M
from shmbroker.shm.connections import ConnectionCounts
from shmbroker.shm.doorbell import EventfdDoorbell
from shmbroker.shm.handoff import Handoffs
from shmbroker.shm.heartbeat import HeartbeatTable
from shmbroker.shm.generations import ChangeCounters
from shmbroker.shm.interest import WorkerWatches
from shmbroker.shm.ring import max_payload
from shmbroker.shm.table import PartitionTable
from shmbroker.shm.timer_link import TimerLink
from shmbroker.workers.acceptor import Acceptor
from shmbroker.workers.affinity import ConnectionAffinity
from shmbroker.workers.api.answer_watch import AnswerWatch
from shmbroker.workers.api.fetch_sessions import FetchSessionCache
from shmbroker.workers.api.handlers import Handlers
from shmbroker.workers.api.sasl import MECHANISM_INDEX, SaslAuthenticator
from shmbroker.workers.api.authorizer import RequestAuthorizer
from shmbroker.workers.api.quotas import ClientQuotas, Throttler
from shmbroker.workers.api.repeated_fetch import RepeatedFetch, RepeatedFetches
from shmbroker.workers.backpressure import Backpressure
from shmbroker.workers.balance import ConnectionBalance
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.codecs.errors import ProtocolError
from shmbroker.workers.connection import PAUSED_OUTPUT, Connection, ConnectionClosed, Request
from shmbroker.workers.deadlines import ConnectionDeadlines
from shmbroker.workers.eventloop import EventLoop, Timer
from shmbroker.workers.limits import ConnectionLimits
from shmbroker.workers.listeners import ANONYMOUS, Listener, Listeners
from shmbroker.workers.tls import TlsConnection, TlsHandshake, TlsStream, peer_subject
from shmbroker.workers.moves import ConnectionMoves
from shmbroker.workers.stats import (AUTHORIZATION_DENIALS, BYTES_IN, BYTES_OUT, BYTES_SENDFILE, CLOSED_ON_ERROR,
                                     ERROR_CODES, ERROR_RESPONSES, LAST_ERROR_CODE, REQUEST_ERRORS, REQUESTS,
                                     WorkerStats)
from shmbroker.workers.timer_client.delayed import DelayedRequests, monotonic_ms
from shmbroker.workers.timer_client.outcome import Outcome

log = logging.getLogger("shmbroker.worker")

# The stats fields of each SASL mechanism (sasl_logins_<name>, sasl_login_failures_<name>) and its counters' index.
SASL_STATS_NAMES = tuple((mechanism.lower().replace("-", "_"), index) for mechanism, index in MECHANISM_INDEX.items())
WAKEUP_READ_BYTES = 512  # one byte per signal delivered; more than a turn ever sees
READS_BEHIND_A_POLL = frozenset((P.FETCH, P.LIST_OFFSETS))  # answered after a long poll of their connection


class Worker:
    def __init__(self, instance: str, index: int, config: NodeConfig, listen_fds: list[int], bell_fds: list[int],
                 supervisor_pid: int, config_path: str, heartbeat_slot: int,
                 handoffs: Handoffs | None = None) -> None:
        self.instance = instance
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
        self.loop = EventLoop()
        self.backpressure = Backpressure(server, self.loop, self._serve)
        # The request path's own references (no hop through backpressure per request or response).
        self.memory = self.backpressure.memory
        self.output_limit = self.backpressure.output_limit
        self.quotas = ClientQuotas(config.quotas, index)
        throttler = Throttler(self.quotas, self.delayed, self.backpressure.mute, self.backpressure.unmute)
        workers = len(bell_fds)
        self.repeated_fetches_per_connection = server.repeated_fetches_per_connection
        self.repeated_fetch_max_bytes = server.repeated_fetch_max_bytes
        self.fetches_repeated = 0  # Fetches whose connection kept the same body: not decoded again (stats)
        self.fetch_sessions = FetchSessionCache(-(-server.max_incremental_fetch_session_cache_slots // workers),
                                                server.min_incremental_fetch_session_eviction_ms, index, workers,
                                                monotonic_ms)
        self.acl_counters = ChangeCounters.attach(shm_instance.generations_name(instance))
        self.authorizer = RequestAuthorizer(config.authorizer, self.partitions.data_dir, self.acl_counters)
        self.handlers = Handlers(self.partitions, config, self.delayed, f"shmbroker-{instance}", throttler,
                                 self.fetch_sessions, self.authorizer)
        self.handlers.after_appends = self._answer_appended_if_due
        self.answer_watch = AnswerWatch(self.partitions) if config.checks.watch_answers else None
        if self.answer_watch is not None:  # tests only: every request and answer passes it (workers.api.answer_watch)
            self.handlers.dispatch = self.answer_watch.watch_dispatch(self.handlers.dispatch)
            self._settle = self.answer_watch.watch_settle(self._settle)
            log.info("answer watch on: every Fetch and ListOffsets answer is checked")
        self.message_handlers = {
            M.Kind.QUOTA_STATE: self.quotas.on_state,
            M.Kind.COMPLETION: self.delayed.on_completion,
            M.Kind.REPLY: self.delayed.on_reply,
            M.Kind.TIMER_STARTED: self._on_timer_started,
            M.Kind.LAYOUT: self._on_layout,
        }
        self.reload = ConfigReload(config_path, config, self._apply_config, log)
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
        self._wakeup_r, self._wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # One line per cause per interval for the whole node (the marks are shared by the workers).
        limit_log = RateLimitedLog(log, server.limit_log_interval_ms / 1000, marks=self.counts.log_marks(
            ("accept", "server.max_connections", "server.max_connections_per_ip", "server.connections_max_idle_ms",
             "server.request_timeout_ms", "tls.handshake", "sasl.authentication")))
        self.sasl = SaslAuthenticator(config.sasl, UsersView(self.partitions.data_dir,
                                                             config.sasl.users_check_interval_ms / 1000),
                                      lambda: self.loop.now, limit_log, server.request_max_bytes)
        self.handlers.dispatch_table.update(self.sasl.table())
        deadlines = ConnectionDeadlines(server, self.loop, limit_log, self._close)
        self.deadlines = deadlines if deadlines.period_s is not None else None
        self.stats = (WorkerStats(instance, index, config.stats.publish_interval_ms / 1000)
                      if config.stats.enabled else None)
        if self.stats is not None:
            self.authorizer.denials = self.stats.counts
            self.authorizer.denials_offset = AUTHORIZATION_DENIALS
        rows = [self.counts.row(w) for w in range(self.counts.workers)]
        has_peers = handoffs is not None and bool(handoffs.peers())
        self.balance = (ConnectionBalance(index, handoffs, rows, self.heartbeats,
                                          server.heartbeat_interval_ms / 1000, self.loop)
                        if has_peers and server.balance_connections else None)
        self.listeners = Listeners(config.listener_list(), config.tls, server)
        # One acceptor per listener, in the order of the listening fds (the config's order of [[listeners]]).
        self.acceptors = [Acceptor(fd, server, self.loop, self.limits, limit_log, self.stats, self.balance,
                                   lambda sock, peer, bucket, listener=listener: self._adopt(sock, peer, bucket,
                                                                                             listener))
                          for fd, listener in zip(listen_fds, self.listeners.all, strict=True)]
        self.handshakes = TlsHandshake(self.loop, self._handshake_done, self._handshake_failed)
        self._handshaking: set[Connection] = set()
        self.tls_handshake_failures = 0  # for the stats segment
        # TLS handshakes that fail (a plaintext client, garbage, a certificate that does not verify): one line per
        # server.limit_log_interval_ms for the node.
        self.limit_log = limit_log
        self.affinity: ConnectionAffinity | None = None
        if has_peers and server.connection_affinity_waits > 0:
            self.affinity = ConnectionAffinity(index, server.connection_affinity_waits,
                                               server.connection_affinity_slack,
                                               server.connection_affinity_cooldown_ms / 1000,
                                               lambda worker: rows[worker].count)
            self.delayed.on_answered = lambda conn, appender: (None if conn.pinned else
                                                               self.affinity.answered(conn, appender, self.loop.now))
        self.moves = (ConnectionMoves(handoffs, self.affinity, self.delayed.holds, self.limits, self.loop, self._adopt,
                                      self._read_arrived, self._close)
                      if handoffs is not None else None)

    # -- connections -------------------------------------------------------------------------

    def _adopt(self, sock: socket.socket, peer: Any, bucket: int, listener: Listener | None = None) -> Connection:
        """Serve `sock` from now on: an accepted connection (of `listener`), or one another worker passed here (its
        listener found by its local address). A TLS connection's handshake starts first."""
        server = self.config.server
        sock.setblocking(False)
        listener = listener or self.listeners.of_socket(sock)
        if listener is None:  # its local address is gone: the client left on the way
            conn = Connection(sock, peer, server.request_max_bytes, server.recv_bytes, self.loop.now, bucket)
            conn.close()
            return conn
        advertised = listener.advertised_for(sock)
        if listener.tls is not None:
            tls = listener.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            conn = TlsConnection(TlsStream(tls), peer, server.request_max_bytes, server.recv_bytes, self.loop.now,
                                 bucket)
            conn.request_since = self.loop.now  # the handshake is bounded as a request is (request_timeout_ms)
        else:
            conn = Connection(sock, peer, server.request_max_bytes, server.recv_bytes, self.loop.now, bucket)
        conn.listener = listener
        conn.advertised = advertised
        if listener.sasl:
            conn.principal = None
            conn.sasl = self.sasl.session(listener)
            conn.max_request = min(server.request_max_bytes, self.config.sasl.server_max_receive_size)
        conn.pinned = listener.protocol != "PLAINTEXT"
        self.connections[conn.fd] = conn
        self.limits.opened(bucket)
        if self.deadlines is not None:
            self.deadlines.arm(conn)
        if listener.tls is not None:
            self._handshaking.add(conn)
            self.handshakes.start(conn)
        else:
            self._watch(conn)
        return conn

    def _watch(self, conn: Connection) -> None:
        self.loop.watch(conn.sock, lambda: self._on_readable(conn), on_hangup=lambda: self._close(conn, None))

    def _read_arrived(self, conn: Connection) -> None:
        """A connection a peer passed here: read what its client sent meanwhile (once its handshake is done)."""
        if conn not in self._handshaking:
            self._on_readable(conn)

    def _handshake_done(self, conn: Connection) -> None:
        self._handshaking.discard(conn)
        conn.request_since = None
        conn.last_active = self.loop.now
        if conn.listener.mutual_tls and conn.sasl is None:
            subject = peer_subject(conn.sock.tls)
            conn.principal = f"User:{subject}" if subject else ANONYMOUS
        self._watch(conn)
        self._on_readable(conn)  # what the client sent right after its handshake may be decrypted already

    def _handshake_failed(self, conn: Connection, why: str) -> None:
        if why != "peer closed":
            self.limit_log.warning("tls.handshake", "closing connection from %s on %s: %s", conn.peer, conn.listener.name, why)
            if self.stats is not None:
                self.stats.counts[CLOSED_ON_ERROR] += 1
            self.tls_handshake_failures += 1
        self._close(conn)

    def _close(self, conn: Connection, reason: str | None = None) -> None:
        if conn.closed:
            return
        if reason:
            log.warning("closing connection from %s: %s", conn.peer, reason)
            if self.stats is not None:
                self.stats.counts[CLOSED_ON_ERROR] += 1
        self.loop.unwatch(conn.sock)
        self._handshaking.discard(conn)
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

    # -- requests and responses -----------------------------------------------------------------

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
            if conn.closed or conn.closing is not None:
                return
            if conn.mutes:
                conn.hold(frames[position:])
                return
            if 0 <= limit < conn.queued_bytes:
                conn.hold(frames[position:])
                self.backpressure.pause(conn, PAUSED_OUTPUT)
                return
            self._handle(conn, frame)
            self._answer_appended_if_due()

    def _handle(self, conn: Connection, frame: memoryview) -> None:
        session = conn.sasl
        if session is not None and (session.raw_tokens or session.failed):
            self._sasl_frame(conn, frame)
            return
        try:
            header = P.parse_request_header(frame)
        except ProtocolError as exc:
            self._close(conn, f"bad request header: {exc}")
            return
        if session is not None and not session.allowed(header.api_key, self.loop.now):
            self._close(conn, f"api {header.api_key} before authentication" if session.principal is None
                        else f"api {header.api_key} after the SASL session ended (connections_max_reauth_ms)")
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
            counts[REQUESTS + header.api_key] += 1
            counts[BYTES_IN + header.api_key] += len(frame)
        try:
            body = frame[header.body_offset:]
            if header.api_key == P.FETCH and self.repeated_fetches_per_connection:
                request = self._fetch_request(conn, header.api_version, body)
            else:
                request = P.decode_request(header.api_key, header.api_version, body)
            if header.api_key in READS_BEHIND_A_POLL and self.delayed.holds(conn):
                # Kafka reads a connection's next request only once it answered the last: a read pipelined behind
                # a long poll must not answer from an older state than the poll's answer, which its client reads
                # first (a high watermark that goes back). The poll is answered now, as if its wait had ended.
                self.delayed.answer_fetches_now(conn)
            outcome = self.handlers.dispatch(req, request)
        except ProtocolError as exc:
            if stats is not None:
                stats.counts[REQUEST_ERRORS + header.api_key] += 1
            self._close(conn, f"bad request api {header.api_key} v{header.api_version}: {exc}")
            return
        except Exception:  # a bug must cost one connection, never the worker
            log.exception("handler failed for api %d v%d", header.api_key, header.api_version)
            if stats is not None:
                stats.counts[REQUEST_ERRORS + header.api_key] += 1
            self._close(conn, "internal error")
            return
        self._settle(req, outcome)

    def _fetch_request(self, conn: Connection, version: int, body: memoryview) -> Any:
        """A Fetch's decoded form: kept by the connection if it sent the same body bytes before
        (workers.api.repeated_fetch), else decoded, and kept if it came again. conn.last_fetch: its entry."""
        conn.last_fetch = None
        if len(body) > self.repeated_fetch_max_bytes:
            return P.decode_request(P.FETCH, version, body)
        key = bytes(body)
        fetches = conn.repeated_fetches
        if fetches is None:
            fetches = conn.repeated_fetches = RepeatedFetches(self.repeated_fetches_per_connection)
        else:
            kept = fetches.get(version, key)
            if kept is not None:
                self.fetches_repeated += 1
                conn.last_fetch = kept
                return kept.request
        request = P.decode_request(P.FETCH, version, body)
        if fetches.came_again(version, key):
            conn.last_fetch = fetches.keep(RepeatedFetch(version, key, request))
        return request

    def _sasl_frame(self, conn: Connection, frame: memoryview) -> None:
        """A frame of a connection whose SASL login failed (dropped: it closes once its answer is out), or a bare
        token after SaslHandshake v0 (answered bare; a refused one closes the connection, as Kafka does)."""
        if conn.sasl.failed:
            return
        answer, refused = self.sasl.raw_token(conn, bytes(frame))
        if refused:
            self._close(conn)
            return
        # No empty piece: a write of nothing makes no progress.
        conn.fill(conn.new_slot(), [len(answer).to_bytes(4, "big") + answer])
        self._dirty.add(conn)

    def _settle(self, req: Request, outcome: Outcome | None) -> None:
        """Fill the request's slot with its outcome; None: its continuation failed (a bug), close the connection."""
        if outcome is None:
            self._close(req.conn, "internal error")
            return
        if outcome.deferred or req.conn.closed:
            return
        size = req.conn.fill(req.slot, outcome.pieces)
        if outcome.closes is not None:
            req.conn.closing = outcome.closes
        self._dirty.add(req.conn)
        stats = self.stats
        if stats is not None:
            counts = stats.counts
            counts[BYTES_OUT + req.header.api_key] += size
            if outcome.errors is not None:
                errors = outcome.errors()
                if errors:
                    counts[ERROR_RESPONSES + req.header.api_key] += 1
                    for error in errors:
                        counts[ERROR_CODES + min(error, LAST_ERROR_CODE)] += 1

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
        sendfile_before = conn.sendfile_bytes
        try:
            done = conn.flush(self.loop.now)
        except ConnectionClosed as exc:
            self._close(conn, str(exc))
            return
        finally:
            if self.stats is not None:
                self.stats.counts[BYTES_SENDFILE] += conn.sendfile_bytes - sendfile_before
        if conn.wants_write != (not done):
            conn.wants_write = not done
            self.loop.want_write(conn.sock, None if done else lambda: self._dirty.add(conn))
        if conn.paused & PAUSED_OUTPUT and conn.queued_bytes <= self.output_limit:
            self.backpressure.output_drained(conn)
        if self.memory is not None and not conn.closed:
            self.memory.update(conn)
        if done and conn.closing is not None and not conn.slots and not conn.closed:
            self._close(conn, conn.closing)  # the responses before its last request are out
            return
        if done and self.affinity is not None and conn in self.affinity.due:
            self._moving.add(conn)
        if done and conn.sasl is not None and conn.sasl.failed and not conn.closed:
            self._close(conn)  # its refusal is written: a failed login ends the connection

    # -- messages from the timer -------------------------------------------------------------

    def _on_timer_started(self, message) -> None:
        self.delayed.resubmit()
        self.partitions.reload()

    def _on_layout(self, message) -> None:
        if message.catalog_version != self.partitions.version:
            self.partitions.reload()

    # -- quotas and reload ---------------------------------------------------------------------

    def _report_quota_usage(self) -> None:
        self._quota_report = None
        frame = self.quotas.report()
        if frame is not None:
            self.link.send(frame)
        self._arm_quota_report()

    def _arm_quota_report(self) -> None:
        if self.config.quotas.enabled and self._quota_report is None:
            self._quota_report = self.loop.call_later(self.quotas.next_report_ms / 1000, self._report_quota_usage)

    def _apply_config(self, config: NodeConfig) -> None:
        """A reloaded config (node.child.ConfigReload): its reloadable settings are the quotas and the authorizer."""
        self.config = config
        self.handlers.config = config
        self.quotas.reconfigure(config.quotas)
        self._arm_quota_report()
        self.authorizer.reconfigure(config.authorizer)
        log.info("reloaded quotas and the authorizer")

    # -- loop hooks ---------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._stopping_since is None:
            self._stopping_since = time.monotonic()

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
            for acceptor in self.acceptors:
                acceptor.stop()
            for conn in list(self.connections.values()):
                if not conn.slots and not conn.pending_output():
                    self._close(conn)
        grace_s = self.config.server.shutdown_grace_ms / 1000
        if time.monotonic() - self._stopping_since > grace_s or not any(
                conn.slots or conn.pending_output() for conn in self.connections.values()):
            self.loop.stop()
        return self.config.timer.self_check_interval_ms / 1000

    def _woke(self) -> None:
        """After each sleep, before the file events: the completion ring's sleep flag, then the timer's messages.
        What the timer sent before answering a request (a new catalog, the quota state) is known here before any
        request a client sent after that answer is served, even one this sleep's wake-up reports too."""
        self.link.woke()
        self._receive_from_timer()

    def _receive_from_timer(self) -> None:
        for message in self.link.receive():
            handler = self.message_handlers.get(message.kind)
            if handler is None:
                log.warning("dropping a %s message: no handler", message.kind.name)
            else:
                handler(message)
            self._write_chunk_ready()

    def _from_timer(self) -> float | None:
        """Before sleeping: a requested reload, the timer's messages, then the delayed fetches this turn's
        appends satisfied."""
        if self.reload.requested:
            self.reload.reload()
        self._receive_from_timer()
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
            # Before sleeping, when no request is being served (a connection's frames read in one go are
            # handled in a loop that must not lose its connection midway).
            moving, self._moving = self._moving, set()
            self.moves.move_quiet(moving)
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

    def _gauges(self) -> list[tuple[str, int]]:
        """The stats row's gauges (workers.stats), read as it is published."""
        link = self.link
        capacity = self.config.rings.capacity
        gauges = [
            ("loop_turns", self.heartbeat.beats),
            ("connections", len(self.connections)),
            ("delayed_waiting", len(self.delayed)),
            ("fetches_answered_on_append", self.delayed.answered_on_append),
            ("fetches_handed_off", self.delayed.handed_off),
            ("fetches_answered_from_first_read", self.handlers.fetches_answered_from_first_read),
            ("fetches_repeated", self.fetches_repeated),
            ("fetches_repeated_idle", self.handlers.idle_fetches_repeated),
            ("fetch_sessions", len(self.fetch_sessions)),
            ("fetch_sessions_opened", self.fetch_sessions.opened),
            ("fetch_sessions_evicted", self.fetch_sessions.evicted),
            ("fetches_incremental", self.fetch_sessions.incremental_fetches),
            ("fetch_session_errors", self.fetch_sessions.session_errors),
        ]
        if self.affinity is not None:
            gauges += [("connections_moved_out", self.affinity.moved_out),
                       ("connections_moved_in", self.affinity.moved_in)]
        gauges += [
            ("connections_balanced_out", self.balance.balanced_out if self.balance is not None else 0),
            ("connections_balanced_in", self.moves.balanced_in if self.moves is not None else 0),
            ("throttled_connections", sum(1 for conn in self.connections.values() if conn.mutes)),
            ("tls_handshake_failures", self.tls_handshake_failures),
            *((f"sasl_logins_{name}", self.sasl.logins[index]) for name, index in SASL_STATS_NAMES),
            *((f"sasl_login_failures_{name}", self.sasl.failures[index]) for name, index in SASL_STATS_NAMES),
            *(("sasl_logins_by_listener", value, position)
              for position, value in enumerate(self.sasl.logins_by_listener) if value),
            *(("sasl_login_failures_by_listener", value, position)
              for position, value in enumerate(self.sasl.failures_by_listener) if value),
            ("ring_frames_sent", link.frames_sent),
            ("ring_frames_received", link.frames_received),
            ("ring_capacity_bytes", capacity),
            ("ring_used_bytes", max(0, capacity - link.writer.free_bytes())),
        ]
        return gauges

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
        signal.signal(signal.SIGHUP, self.reload.on_hup)
        loop = self.loop
        self._arm_quota_report()
        loop.watch(self.link.doorbell_fd, self._on_doorbell)
        loop.watch(self._wakeup_r, self._read_wakeup)
        if self.moves is not None:
            self.moves.start()
        if self.stats is not None:
            authorizer = self.authorizer
            self.stats.start(loop, self._gauges,
                             lambda: (authorizer.denials_counted, authorizer.denials_by_principal))
        for hook in (self._beat, self._stop_procedure, self._from_timer, self._write_ready, self._to_timer,
                     self._announce_sleep):
            loop.before_sleep(hook)
        loop.after_sleep(self._woke)
        settle_garbage_collector(self.config, None if self.stats is None else self.stats.counts)
        for acceptor in self.acceptors:
            acceptor.start()  # the port accepts from now on
        log.info("worker %d ready", self.index)
        loop.run()
        for conn in list(self.connections.values()):
            self._close(conn)
        close_all(loop, self.link, self.moves, self.partitions, self.table, self.watches, self.counts,
                  self.heartbeats, self.stats, self.acl_counters)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = child_arguments()
    parser.add_argument("--listen-fd", type=int, action="append", required=True,
                        help="a listening socket, one per listener in the config's order")
    parser.add_argument("--worker-bell-fds", required=True,
                        help="every worker's doorbell eventfd, by worker index (comma-separated)")
    parser.add_argument("--inbox-fd", type=int, help="this worker's handoff inbox, its receiving end (shm.handoff)")
    parser.add_argument("--worker-inbox-fds", default="",
                        help="every worker's handoff inbox, its sending end, by worker index (comma-separated)")
    args = parser.parse_args(argv)
    config = start_child(f"worker-{args.index}", args.config_file)
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
