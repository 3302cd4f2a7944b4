"""SASL on the SASL_PLAINTEXT and SASL_SSL listeners: SaslHandshake v0-1, SaslAuthenticate v0-2, the mechanisms
SCRAM-SHA-256, SCRAM-SHA-512 (RFC 5802/7677, the server side by scramp) and PLAIN (RFC 4616), checked against the
users store (node.storage.users), and re-authentication (KIP-368).

A connection of a SASL listener starts with no principal (`conn.principal` None) and a SaslSession (`conn.sasl`):
SaslHandshake picks the mechanism, SaslAuthenticate carries its tokens (after a SaslHandshake v0, the tokens come as
bare size-prefixed frames instead, `raw_tokens`), and a login sets the principal "User:NAME".

Invariants:
- Before a login only ApiVersions, SaslHandshake and SaslAuthenticate are served (`allowed`); anything else closes
  the connection (the worker's check), and so does a request larger than sasl.server_max_receive_size.
- A failed login is answered SASL_AUTHENTICATION_FAILED (a SaslHandshake with a mechanism not enabled
  UNSUPPORTED_SASL_MECHANISM, one out of order ILLEGAL_SASL_STATE), then the connection closes once that answer is
  written (`failed`); nothing it sends afterwards is served. One log line per server.limit_log_interval_ms for the
  node, counting the rest; the answer never says whether the user or the password was wrong.
- With sasl.connections_max_reauth_ms set, a session ends that long after its login: SaslAuthenticate v1+ tells the
  client (session_lifetime_ms), and a request other than SASL after the end closes the connection. A client may log in
  again on the same connection (SaslHandshake, SaslAuthenticate) with the same mechanism, as the same principal.
- Unknown users cost what known ones do up to the failure: the answer comes as promptly for either.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from scramp import ScramException, ScramMechanism

from shmbroker.node.config import SaslConfig
from shmbroker.node.logging_setup import RateLimitedLog
from shmbroker.node.storage.users import SCRAM_MECHANISMS, UsersView
from shmbroker.shm.stats import MAX_LISTENERS, SASL_MECHANISMS
from shmbroker.workers.api.responses import entity, reply
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.codecs.errors import ErrorCode
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.outcome import Outcome

log = logging.getLogger("shmbroker.sasl")

SASL_HANDSHAKE = P.SASL_HANDSHAKE
SASL_AUTHENTICATE = P.SASL_AUTHENTICATE
# What a connection may send before it logged in.
PRE_AUTHENTICATION_APIS = frozenset((P.API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE))
FAILED_MESSAGE = "Authentication failed: invalid username or password"
MECHANISM_INDEX = {name: index for index, name in enumerate(SASL_MECHANISMS)}  # the stats' per-mechanism slots


class SaslFailure(Exception):
    """A login that must fail: the message is for the log, never for the client."""


class SaslSession:
    """One connection's SASL state."""

    __slots__ = ("listener", "mechanism", "scram", "raw_tokens", "failed", "expires_at", "principal",
                 "reauthenticating", "user")

    def __init__(self, listener: Any) -> None:
        self.listener = listener
        self.mechanism: str | None = None  # chosen by SaslHandshake
        self.scram: Any = None  # scramp's server of a SCRAM exchange in progress
        self.user = ""
        self.raw_tokens = False  # SaslHandshake v0: tokens arrive as bare frames
        self.failed = False  # refused: the connection closes once its answer is written
        self.expires_at: float | None = None  # loop time the session ends (connections_max_reauth_ms)
        self.principal: str | None = None  # once logged in
        self.reauthenticating = False

    def allowed(self, api_key: int, now: float) -> bool:
        """Whether a request of `api_key` may be served now."""
        if api_key in PRE_AUTHENTICATION_APIS:
            return not self.failed
        if self.principal is None or self.failed:
            return False
        return self.expires_at is None or now < self.expires_at


class SaslAuthenticator:
    """A worker's SASL: the users it checks logins against, its counters and its failure log."""

    def __init__(self, config: SaslConfig, users: UsersView, clock, failure_log: RateLimitedLog,
                 request_max_bytes: int) -> None:
        self.config = config
        self.request_max_bytes = request_max_bytes  # server.request_max_bytes: a logged-in client's bound
        self.users = users
        self.clock = clock  # the loop's time
        self.failure_log = failure_log  # one line per interval for the node (key "sasl.authentication")
        self.logins = [0] * len(MECHANISM_INDEX)  # per mechanism, for the stats
        self.failures = [0] * len(MECHANISM_INDEX)
        # per listener and mechanism (listener index * mechanisms + mechanism; shm.stats.MAX_LISTENERS listeners)
        self.logins_by_listener = [0] * (MAX_LISTENERS * len(MECHANISM_INDEX))
        self.failures_by_listener = [0] * (MAX_LISTENERS * len(MECHANISM_INDEX))
        self._scram = {name: ScramMechanism(name) for name in SCRAM_MECHANISMS}

    def session(self, listener: Any) -> SaslSession:
        return SaslSession(listener)

    def table(self) -> dict[int, Any]:
        return {SASL_HANDSHAKE: self.handshake, SASL_AUTHENTICATE: self.authenticate}

    # -- SaslHandshake ------------------------------------------------------------------------

    def handshake(self, req: Request, request: Any) -> Outcome:
        session: SaslSession | None = req.conn.sasl
        enabled = tuple(self.config.mechanisms)
        if session is None:  # not a SASL listener
            return self._handshake_reply(req, ErrorCode.illegal_sasl_state, ())
        if session.principal is not None:
            if session.expires_at is None or request.mechanism != session.mechanism:
                return self._refuse_handshake(req, session, ErrorCode.illegal_sasl_state,
                                              f"a second SaslHandshake ({request.mechanism}) after a login")
            session.reauthenticating = True
        elif session.mechanism is not None:
            return self._refuse_handshake(req, session, ErrorCode.illegal_sasl_state, "a second SaslHandshake")
        if request.mechanism not in enabled:
            return self._refuse_handshake(req, session, ErrorCode.unsupported_sasl_mechanism,
                                          f"mechanism {request.mechanism!r} is not enabled", enabled)
        session.mechanism = request.mechanism
        session.scram = None
        session.raw_tokens = req.header.api_version == 0
        return self._handshake_reply(req, ErrorCode.none, enabled)

    def _refuse_handshake(self, req: Request, session: SaslSession, error: ErrorCode, why: str,
                          enabled: tuple[str, ...] = ()) -> Outcome:
        session.failed = True
        self._log_failure(req.conn, session.mechanism or "-", why)
        return self._handshake_reply(req, error, enabled)

    def _handshake_reply(self, req: Request, error: ErrorCode, mechanisms: tuple[str, ...]) -> Outcome:
        return reply(req, entity(req, "SaslHandshakeResponse", error_code=error, mechanisms=mechanisms))

    # -- SaslAuthenticate ----------------------------------------------------------------------

    def authenticate(self, req: Request, request: Any) -> Outcome:
        session: SaslSession | None = req.conn.sasl
        if session is None or session.mechanism is None or session.failed:
            if session is not None:
                session.failed = True
            self._log_failure(req.conn, "-", "SaslAuthenticate before SaslHandshake")
            return self._authenticate_reply(req, ErrorCode.illegal_sasl_state, "SaslHandshake first", b"")
        try:
            answer, done = self.step(session, bytes(request.auth_bytes))
        except SaslFailure as exc:
            return self._fail(req, session, str(exc))
        lifetime_ms = 0
        if done:
            lifetime_ms = self._logged_in(req.conn, session)
            if session.failed:
                return self._fail(req, session, "re-authenticated as another principal")
        return self._authenticate_reply(req, ErrorCode.none, None, answer, lifetime_ms)

    def _authenticate_reply(self, req: Request, error: ErrorCode, message: str | None, token: bytes,
                            lifetime_ms: int = 0) -> Outcome:
        return reply(req, entity(req, "SaslAuthenticateResponse", error_code=error, error_message=message,
                                 auth_bytes=token, session_lifetime=datetime.timedelta(milliseconds=lifetime_ms)))

    def _fail(self, req: Request, session: SaslSession, why: str) -> Outcome:
        session.failed = True
        self._count(self.failures, self.failures_by_listener, session)
        self._log_failure(req.conn, session.mechanism, why)
        return self._authenticate_reply(req, ErrorCode.sasl_authentication_failed, FAILED_MESSAGE, b"")

    def raw_token(self, conn: Any, token: bytes) -> tuple[bytes, bool]:
        """A bare token after SaslHandshake v0: the answer token, and whether it is a refusal (then close)."""
        session: SaslSession = conn.sasl
        try:
            answer, done = self.step(session, token)
        except SaslFailure as exc:
            session.failed = True
            self._count(self.failures, self.failures_by_listener, session)
            self._log_failure(conn, session.mechanism, str(exc))
            return b"", True
        if done:
            self._logged_in(conn, session)
            session.raw_tokens = False
        return answer, session.failed

    @staticmethod
    def _count(by_mechanism: list[int], by_listener: list[int], session: SaslSession) -> None:
        mechanism = MECHANISM_INDEX[session.mechanism]
        by_mechanism[mechanism] += 1
        listener = getattr(session.listener, "index", 0)
        if listener < MAX_LISTENERS:
            by_listener[listener * len(MECHANISM_INDEX) + mechanism] += 1

    def _logged_in(self, conn: Any, session: SaslSession) -> int:
        """Set the connection's principal; the session's lifetime in ms (0: none)."""
        principal = f"User:{session.user}"
        if session.reauthenticating and principal != session.principal:
            session.failed = True
            return 0
        session.principal = conn.principal = principal
        conn.max_request = self.request_max_bytes  # the pre-login bound (sasl.server_max_receive_size) lifts
        session.reauthenticating = False
        session.scram = None
        self._count(self.logins, self.logins_by_listener, session)
        lifetime_ms = self.config.connections_max_reauth_ms
        session.expires_at = self.clock() + lifetime_ms / 1000 if lifetime_ms > 0 else None
        return lifetime_ms

    # -- the mechanisms ---------------------------------------------------------------------------

    def step(self, session: SaslSession, token: bytes) -> tuple[bytes, bool]:
        """One client token of the session's mechanism: (the server's token, whether the login is complete)."""
        if session.mechanism == "PLAIN":
            return self._plain(session, token)
        return self._scram_step(session, token)

    def _plain(self, session: SaslSession, token: bytes) -> tuple[bytes, bool]:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslFailure("a PLAIN token that is not authzid NUL user NUL password")
        try:
            authzid, user, password = (part.decode() for part in parts)
        except UnicodeDecodeError:
            raise SaslFailure("a PLAIN token that is not UTF-8") from None
        if authzid and authzid != user:
            raise SaslFailure(f"user {user!r} asked to act as {authzid!r}")
        credentials = self.users.credentials(user)
        if not credentials:
            raise SaslFailure(f"unknown user {user!r}")
        if not any(credential.matches(password) for credential in credentials):
            raise SaslFailure(f"wrong password for user {user!r}")
        session.user = user
        return b"", True

    def _scram_step(self, session: SaslSession, token: bytes) -> tuple[bytes, bool]:
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise SaslFailure("a SCRAM message that is not UTF-8") from None
        mechanism = session.mechanism
        try:
            if session.scram is None:  # client-first-message
                unknown = []

                def auth_info(user: str) -> tuple[bytes, bytes, bytes, int]:
                    session.user = user
                    credential = self.users.credential(user, mechanism)
                    if credential is None:
                        unknown.append(user)
                        raise ScramException("unknown user")
                    return credential.salt, credential.stored_key, credential.server_key, credential.iterations

                server = self._scram[mechanism].make_server(auth_info)
                try:
                    server.set_client_first(text)
                except ScramException:
                    if unknown:
                        raise SaslFailure(f"unknown user {unknown[0]!r} ({mechanism})") from None
                    raise
                session.scram = server
                return server.get_server_first().encode(), False
            server = session.scram
            try:
                server.set_client_final(text)
            except ScramException as exc:
                raise SaslFailure(f"wrong password for user {session.user!r} ({mechanism}): {exc}") from None
            return server.get_server_final().encode(), True
        except ScramException as exc:
            raise SaslFailure(f"a malformed {mechanism} message: {exc}") from None

    def _log_failure(self, conn: Any, mechanism: str, why: str) -> None:
        listener = conn.listener.name if conn.listener is not None else "-"
        self.failure_log.warning("sasl.authentication", "authentication failed for %s on %s (%s): %s", conn.peer, listener,
                                 mechanism, why)
