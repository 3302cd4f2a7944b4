"""A worker's side of client quotas: charging quota'd clients' bytes, reporting them to the timer's quota
manager (node.timer.quotas), and computing the throttle time of a response from the node-wide rates it
sends back.

- `charge(client, kind, bytes)`: Produce charges the request's record bytes, Fetch the response's; only
  clients with a limit for that kind are counted (an unlimited client costs one look-up per request).
- `throttle_ms(client, kind)`: Kafka's QuotaUtils.throttleTime: (rate - quota) / quota x window size, rounded,
  at most the whole window (window_samples x window_ms); 0 within quota. The rate is the latest node-wide one
  plus this worker's bytes the timer has not counted yet (so, as in Kafka, a request's own bytes count in its
  check, and a burst between two reports is not let through).
- The charged bytes go to the timer every report_interval_ms (QUOTA_USAGE), one message for all clients,
  or every far_report_interval_ms while no client checked since the last report was above half its quota.

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

from shmbroker.node.config import QuotaConfig
from shmbroker.shm import messages as M
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.outcome import Outcome

PRODUCE, FETCH = 0, 1


MAX_TRACKED_CLIENTS = 100_000  # client ids remembered; past it the idle ones are forgotten (see _track)


class _Client:
    """What a worker knows of one client with a quota: its limits, the node-wide rates and window sizes last
    heard from the timer, and its bytes the timer has not counted yet (pending: not reported; uncounted:
    pending plus reported but not yet counted). All [produce, fetch]."""

    __slots__ = ("limits", "pending", "uncounted", "rates", "windows")

    def __init__(self, limits: list[int], window_ms: int) -> None:
        self.limits = limits
        self.pending = [0, 0]
        self.uncounted = [0, 0]
        self.rates = [0, 0]
        self.windows = [window_ms, window_ms]


_UNLIMITED = _Client([0, 0], 1)  # every client without a quota: never charged, never written


class ClientQuotas:
    """One dictionary look-up per charge or check on the request path (profiled: the check was 2% of a
    worker's CPU under a raw producer when it looked up limits, rates and in-flight reports separately)."""

    def __init__(self, config: QuotaConfig, worker: int) -> None:
        self.config = config
        self.worker = worker  # its entry in QUOTA_STATE's counted reports
        self._clients: dict[str, _Client] = {}
        self._pending: dict[str, _Client] = {}  # clients charged since the last report
        self._reports = 0
        self._in_flight: list[tuple[int, dict[str, list[int]]]] = []  # reports not yet counted by the timer
        self._near_quota = False  # a client checked since the last report was above half its quota
        self.next_report_ms = config.far_report_interval_ms

    def _limits(self, key: str) -> list[int]:
        limits = self.config.clients.get(key, self.config.default)
        return [limits.producer_byte_rate, limits.consumer_byte_rate]

    def _track(self, key: str) -> _Client:
        """The state of a client seen for the first time (the shared _UNLIMITED for one without a quota)."""
        limits = self._limits(key)
        if len(self._clients) >= MAX_TRACKED_CLIENTS:
            # Forget clients with nothing uncounted: a throttled one's rate comes back within a report
            # interval (the timer re-sends over-quota clients), an idle one's is not needed.
            self._clients = {k: c for k, c in self._clients.items() if c.uncounted[0] or c.uncounted[1]}
        if not (limits[0] or limits[1]):
            client = _UNLIMITED
        else:
            client = _Client(limits, (self.config.window_samples - 1) * self.config.window_ms)
        self._clients[key] = client
        return client

    def reconfigure(self, config: QuotaConfig) -> None:
        self.config = config
        self._clients = {key: client for key, client in self._clients.items() if client is not _UNLIMITED}
        for key, client in self._clients.items():
            client.limits = self._limits(key)

    def charge(self, client_id: str | None, kind: int, size: int) -> None:
        key = client_id or ""
        client = self._clients.get(key) or self._track(key)
        if not size or not client.limits[kind]:
            return
        client.pending[kind] += size
        client.uncounted[kind] += size
        self._pending[key] = client

    def throttle_ms(self, client_id: str | None, kind: int) -> int:
        key = client_id or ""
        client = self._clients.get(key) or self._track(key)
        quota = client.limits[kind]
        if not quota:
            return 0
        window = client.windows[kind]
        rate = client.rates[kind] + client.uncounted[kind] * 1000 / window
        if rate * 2 > quota:
            self._near_quota = True
        if rate <= quota:
            return 0
        throttle = (rate - quota) / quota * window
        return int(min(round(throttle), self.config.window_samples * self.config.window_ms))

    def on_state(self, message: Any) -> None:
        for key, produce, fetch, produce_window, fetch_window in message.rates:
            client = self._clients.get(key) or self._track(key)
            if client is not _UNLIMITED:
                client.rates = [produce, fetch]
                client.windows = [produce_window, fetch_window]
        counted = next((report for worker, report in message.counted if worker == self.worker), 0)
        while self._in_flight and self._in_flight[0][0] <= counted:
            for key, counts in self._in_flight.pop(0)[1].items():
                client = self._clients.get(key)
                if client is not None:
                    client.uncounted[0] -= counts[0]
                    client.uncounted[1] -= counts[1]

    def report(self) -> bytes | None:
        """The QUOTA_USAGE frame of the bytes charged since the last report, or None if there were none;
        sets next_report_ms."""
        c = self.config
        self.next_report_ms = c.report_interval_ms if self._near_quota else c.far_report_interval_ms
        self._near_quota = False
        if not self._pending:
            return None
        pending, self._pending = self._pending, {}
        document = {}
        for key, client in pending.items():
            document[key] = client.pending
            client.pending = [0, 0]
        self._reports += 1
        self._in_flight.append((self._reports, document))
        return M.encode(M.Kind.QUOTA_USAGE, self._reports, [(key, *counts) for key, counts in document.items()])


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
