"""A worker's side of client quotas: charging quota'd clients' bytes, reporting them to the timer's quota
manager (node.timer.quotas), and computing the throttle time of a response from the node-wide rates it
sends back.

- `charge(client, kind, bytes)`: Produce charges the request's record bytes, Fetch the response's; only
  clients with a limit for that kind are counted (an unlimited client costs one look-up per request).
- `throttle_ms(client, kind)`: Kafka's QuotaUtils.throttleTime: (rate - quota) / quota x window size, rounded,
  at most the whole window (window_samples x window_ms); 0 within quota. The rate is the latest node-wide one
  plus this worker's bytes the timer has not counted yet (so, as in Kafka, a request's own bytes count in its
  check, and a burst between two reports is not let through).
- The charged bytes go to the timer every report_interval_ms (QUOTA_USAGE), one message for all clients.

How a throttled client waits is the handlers' and DelayedRequests' part (KIP-219): Produce v6+ and Fetch v8+
are answered at once and the connection is muted; older versions get their response held back; either way
the wait is a THROTTLE timer in the timer process.

Invariants: the node-wide rates known here are at most one report interval plus one timer turn old, and
every byte this worker charged is in exactly one of them and its own uncounted bytes (a QUOTA_STATE names
the last report of each worker it counted; reports after it stay uncounted here); a throttled Fetch is
answered without records and not charged.
"""

from __future__ import annotations

from typing import Any

from node.config import QuotaConfig
from shm import messages as M
from workers.connection import Request
from workers.outcome import Outcome

PRODUCE, FETCH = 0, 1


class ClientQuotas:
    def __init__(self, config: QuotaConfig, worker: int) -> None:
        self.config = config
        self.worker = str(worker)  # the key of QUOTA_STATE's "counted"
        self._pending: dict[str, list[int]] = {}  # client -> [produce, fetch] bytes not reported yet
        self._reports = 0
        self._in_flight: list[tuple[int, dict[str, list[int]]]] = []  # reports not yet counted by the timer
        # client -> [produce bytes/s, fetch bytes/s, produce window ms, fetch window ms], node-wide
        self._rates: dict[str, list[int]] = {}

    def reconfigure(self, config: QuotaConfig) -> None:
        self.config = config

    def _limit(self, client: str | None, kind: int) -> int:
        limits = self.config.clients.get(client or "", self.config.default)
        return limits.producer_byte_rate if kind == PRODUCE else limits.consumer_byte_rate

    def charge(self, client: str | None, kind: int, size: int) -> None:
        if size and self._limit(client, kind):
            pending = self._pending.get(client or "")
            if pending is None:
                pending = self._pending[client or ""] = [0, 0]
            pending[kind] += size

    def throttle_ms(self, client: str | None, kind: int) -> int:
        quota = self._limit(client, kind)
        if not quota:
            return 0
        key = client or ""
        state = self._rates.get(key)
        c = self.config
        # A client the timer has not measured yet is on Rate's shortest window: samples - 1 full windows.
        rate, window = (state[kind], state[2 + kind]) if state else (0, (c.window_samples - 1) * c.window_ms)
        uncounted = self._pending.get(key, (0, 0))[kind]
        for _, report in self._in_flight:
            uncounted += report.get(key, (0, 0))[kind]
        rate += uncounted * 1000 / window
        if rate <= quota:
            return 0
        throttle = (rate - quota) / quota * window
        return int(min(round(throttle), c.window_samples * c.window_ms))

    def on_state(self, message: Any) -> None:
        self._rates.update(message.document["rates"])
        counted = message.document["counted"].get(self.worker, 0)
        while self._in_flight and self._in_flight[0][0] <= counted:
            self._in_flight.pop(0)

    def report(self) -> bytes | None:
        """The QUOTA_USAGE frame of the bytes charged since the last report, or None if there were none."""
        if not self._pending:
            return None
        pending, self._pending = self._pending, {}
        self._reports += 1
        self._in_flight.append((self._reports, pending))
        return M.encode(M.Kind.QUOTA_USAGE, self._reports, document=pending)


class Throttler:
    """Applies a throttle time to a request's outcome, KIP-219's two ways: a client that backs off by itself
    (Produce v6+, Fetch v8+) gets its answer at once and its connection muted; an older one gets its answer
    held back. Either way the wait is a THROTTLE timer in the timer process (DelayedRequests.throttle)."""

    def __init__(self, quotas: ClientQuotas, delayed: Any, mute: Any, unmute: Any) -> None:
        self.quotas = quotas
        self.delayed = delayed
        self.mute = mute  # (connection) -> None: stop reading it
        self.unmute = unmute  # (connection) -> None: read it again (after as many unmutes as mutes)

    def apply(self, req: Request, outcome: Outcome, client: str | None, kind: int, throttle_ms: int,
              mutes: bool) -> Outcome:
        if throttle_ms <= 0:
            return outcome
        if mutes or not outcome.pieces:  # nothing to hold back (acks=0): mute in any version
            self.mute(req.conn)
            self.delayed.throttle(Request(req.conn, req.header, None), client, kind, throttle_ms,
                                  lambda status: self._unmuted(req.conn))
            return outcome
        return self.delayed.throttle(req, client, kind, throttle_ms, lambda status: outcome)

    def _unmuted(self, conn: Any) -> Outcome:
        self.unmute(conn)
        return Outcome.DEFERRED  # the mute's request has no response of its own
