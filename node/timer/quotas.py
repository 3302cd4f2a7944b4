"""Client quotas of the node (KIP-13, KIP-219): byte rates per client id, measured node-wide in the timer.

Workers count the bytes of clients that have a quota (Produce: the request's record bytes; Fetch: the
response's record bytes) and report them every `report_interval_ms` (QUOTA_USAGE). Here each client's
rate is Kafka's Rate over a SampledStat: `window_samples` samples of `window_ms`; the rate is the samples'
total over the window size, which is the time since the oldest retained sample but never less than
samples - 1 full windows (so a client that just started is not judged on a sliver of time). After the
reports of a loop turn the changed rates go back to every worker (QUOTA_STATE), which computes a response's
throttle time as Kafka's QuotaUtils does: (rate - quota) / quota x window size, at most the whole window.
A client over its quota is sent again every report interval even when it reports nothing: its rate falls
as time passes, and a throttled fetch is not charged, so without it a worker would throttle it forever.

The waiting itself is a timer here: a worker that throttles a client sends THROTTLE (a request id and a
deadline); a purgatory operation that nothing satisfies expires at the deadline and the worker gets its
COMPLETION (then unmutes the connection, or sends the response it held back).

Invariants:
- A rate only counts bytes recorded within the retained samples; samples older than the whole window are
  reset before the rate is read.
- Counters per client (throttled requests, throttle time, rates) only grow, except the rates.
- A reconfiguration (SIGHUP) keeps the measured rates: only the limits change, and the workers apply them.
- While a client's last sent rate is over its quota, a fresher one goes out at most report_interval_ms later.
- A client with no usage and no throttle for idle_client_expiry_ms, and not over its quota, is forgotten (looked
  for at most every tenth of that): it starts afresh if it comes back, as with Kafka's expired sensors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from shmbroker.node.config import QuotaConfig
from shmbroker.node.timer.outbox import Outbox
from shmbroker.shm import messages as M

PRODUCE, FETCH = 0, 1  # the kind field of QUOTA_USAGE and THROTTLE


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class SampledRate:
    """Kafka's Rate of a SampledTotal: bytes per second over `samples` windows of `window_ms`."""

    __slots__ = ("samples", "window_ms", "_starts", "_totals", "_current")

    def __init__(self, samples: int, window_ms: int, now_ms: int) -> None:
        self.samples = samples
        self.window_ms = window_ms
        self._starts = [now_ms] * samples
        self._totals = [0.0] * samples
        self._current = 0

    def record(self, value: float, now_ms: int) -> None:
        if now_ms - self._starts[self._current] >= self.window_ms:
            self._current = (self._current + 1) % self.samples
            self._starts[self._current] = now_ms
            self._totals[self._current] = 0.0
        self._totals[self._current] += value

    def _purge(self, now_ms: int) -> None:
        horizon = self.samples * self.window_ms
        for i in range(self.samples):
            if now_ms - self._starts[i] >= horizon:
                self._starts[i] = now_ms
                self._totals[i] = 0.0

    def window_size_ms(self, now_ms: int) -> int:
        self._purge(now_ms)
        elapsed = now_ms - min(self._starts)
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return max(elapsed, 1)

    def rate(self, now_ms: int) -> float:
        window = self.window_size_ms(now_ms)
        return sum(self._totals) * 1000.0 / window


@dataclass
class ClientUsage:
    rates: list[SampledRate]  # [produce, fetch]
    throttled_requests: list[int] = field(default_factory=lambda: [0, 0])
    throttle_ms_total: list[int] = field(default_factory=lambda: [0, 0])
    last_seen_ms: int = 0  # the last usage or throttle of this client (for idle expiry)


class QuotaManager:
    def __init__(self, config: QuotaConfig, outbox: Outbox, now_ms: int) -> None:
        self.config = config
        self.outbox = outbox
        self.clients: dict[str, ClientUsage] = {}
        self._changed: set[str] = set()
        self._counted: dict[int, int] = {}  # worker -> its last report counted
        self._over: set[str] = set()  # clients whose last sent rate is over a quota of theirs
        self._next_refresh: int | None = None
        self._next_expiry_check = now_ms + max(1, config.idle_client_expiry_ms // 10)
        self.expired = 0  # clients forgotten for being idle
        self.throttles = 0  # throttles of all clients ever (an expired client's stay counted)
        self.throttle_ms_total = 0

    def reconfigure(self, config: QuotaConfig) -> None:
        if (config.window_samples, config.window_ms) != (self.config.window_samples, self.config.window_ms):
            self.clients.clear()  # a new sampling shape: measure afresh
        self.config = config
        self._changed.update(self.clients)  # judged against the new limits at the end of the turn

    def _usage_of(self, client: str, now_ms: int) -> ClientUsage:
        usage = self.clients.get(client)
        if usage is None:
            c = self.config
            usage = self.clients[client] = ClientUsage([SampledRate(c.window_samples, c.window_ms, now_ms),
                                                        SampledRate(c.window_samples, c.window_ms, now_ms)])
        usage.last_seen_ms = now_ms
        return usage

    # -- messages from workers ----------------------------------------------------------------

    def usage(self, worker: int, message: Any) -> None:
        """QUOTA_USAGE: each client id's produced and fetched bytes since the worker's last report."""
        now = monotonic_ms()
        self._counted[worker] = message.report
        for client, produced, fetched in message.clients:
            usage = self._usage_of(client, now)
            if produced:
                usage.rates[PRODUCE].record(produced, now)
            if fetched:
                usage.rates[FETCH].record(fetched, now)
            self._changed.add(client)

    def throttled(self, worker: int, message: Any) -> None:
        """THROTTLE's bookkeeping (the timer itself is the delayed-operation service's)."""
        usage = self._usage_of(message.client, monotonic_ms())
        usage.throttled_requests[message.quota_kind] += 1
        usage.throttle_ms_total[message.quota_kind] += message.throttle_ms
        self.throttles += 1
        self.throttle_ms_total += message.throttle_ms

    @property
    def over_quota(self) -> set[str]:
        """Clients whose last measured rate is over a quota of theirs (throttled now)."""
        return self._over

    # -- the timer loop's calls ---------------------------------------------------------------

    def next_expiration(self) -> int | None:
        """When the rates of the clients over quota are due again (None: no client is over)."""
        return self._next_refresh

    def end_turn(self, now_ms: int) -> None:
        """Send the changed clients' node-wide rates to every worker, and the over-quota ones when due."""
        if now_ms >= self._next_expiry_check:
            self._expire_idle(now_ms)
        due = self._changed
        if self._next_refresh is not None and now_ms >= self._next_refresh:
            due |= self._over
            self._next_refresh = None
        if not due:
            return
        state = {}
        for client in due:
            usage = self.clients.get(client)
            if usage is None:  # measured afresh after a reconfiguration
                self._over.discard(client)
                continue
            produce, fetch = usage.rates
            rates = state[client] = [round(produce.rate(now_ms)), round(fetch.rate(now_ms)),
                                     produce.window_size_ms(now_ms), fetch.window_size_ms(now_ms)]
            limits = self.config.limits(client)
            if 0 < limits.producer_byte_rate < rates[PRODUCE] or 0 < limits.consumer_byte_rate < rates[FETCH]:
                self._over.add(client)
            else:
                self._over.discard(client)
        self._changed = set()
        if self._over and self._next_refresh is None:
            self._next_refresh = now_ms + self.config.report_interval_ms
        self.outbox.broadcast(M.encode(M.Kind.QUOTA_STATE, [(client, *rates) for client, rates in state.items()],
                                       list(self._counted.items())))

    def _expire_idle(self, now_ms: int) -> None:
        expiry = self.config.idle_client_expiry_ms
        self._next_expiry_check = now_ms + max(1, expiry // 10)
        idle = [client for client, usage in self.clients.items()
                if now_ms - usage.last_seen_ms >= expiry and client not in self._over and client not in self._changed]
        for client in idle:
            del self.clients[client]
        self.expired += len(idle)

    def snapshot(self, now_ms: int) -> dict[str, dict]:
        """Per client: rates and throttle counters (for stats and tests)."""
        return {client: {"produce_rate": u.rates[PRODUCE].rate(now_ms), "fetch_rate": u.rates[FETCH].rate(now_ms),
                         "throttled_requests": list(u.throttled_requests), "throttle_ms": list(u.throttle_ms_total)}
                for client, u in self.clients.items()}
