"""A worker's delayed requests: the requests that wait on the timer process, and how each is answered.

This is all a request handler knows of the timer. A handler that must wait hands its request here
(`delay_produce`, `delay_fetch`, `topics`) with a continuation; this object sends the message to the
timer (shm.messages), keeps the continuation, and when the answer comes (COMPLETION, REPLY)
runs it and settles the request through the worker's `settle` callback.

A delayed fetch waits in the timer for its deadline; the appends that satisfy it are answered here
(`answer_appended`), as Kafka's request handler completes the fetches its append satisfies
(checkAndComplete): the client gets its records without a round trip through the timer, and the timer
gets a CANCEL for the wait. The condition is the timer's too (shm.fetch_condition). This worker's own
appends are checked as soon as the Produce that made them has appended, before its response is built
(Handlers.after_appends: the worker asks `answers_due`, then calls `answer_appended`). Another worker's
append reaches it as a ring of its doorbell, rung at the append (shm.interest.WorkerWatches says who
watches a row), and it checks the rows whose end moved since it last looked. A new wait is checked once
in the turn it starts, after its count is raised. Each fetch answered so is reported with the worker
whose append answered it (`on_answered`: workers.affinity moves a consumer that another worker's
appends keep answering).

A long poll is handed to the timer only once it has waited `fetch_handoff_ms` here (at once if its max wait
is not longer): on a busy topic the next append answers most long polls before that, and such a fetch costs
the timer nothing, neither a DELAY_FETCH frame nor a CANCEL nor a wake. The deadline in the frame is the
one the fetch began with, so a handed-off wait expires exactly when it would have.

Invariants:
- Request ids carry the worker's pid in their high bits (PID_SHIFT), so a restarted worker never mistakes
  a completion meant for its predecessor; answers for unknown ids are dropped.
- At most one wait per request id, and its continuation runs exactly once: with the timer's result
  (a Completed: status and Kafka error code, or a REPLY), or with None when the worker answers it
  by itself.
- `self_answer`: a wait `delayed_grace_ms` past its deadline is answered here, so no client waits forever,
  even with the timer process dead.
- `resubmit` (the timer announced a restart) sends every handed-off request's frame again; the timer ignores
  duplicates of what it already holds. A fetch not yet handed off goes when its handoff comes.
- The timer hears of a fetch (DELAY_FETCH, then CANCEL) only once it is handed off: a wait answered or closed
  before then sends nothing. Handoffs are due in arrival order (one delay for all), so a deque holds them.
- A closed connection cancels its waits (`cancel_connection`); the timer completes them without an answer.
- A fetch answered here on an append is popped before its CANCEL is sent: a COMPLETION the timer sent for
  it meanwhile (its deadline came) finds no wait and is dropped, so the continuation still runs once.
- No append is missed (shm.interest): this worker's row of WorkerWatches counts its waiting fetches per
  partition row, raised (then a fence) before the new wait's first check, lowered when it is answered or
  cancelled; an appending worker publishes, fences, then reads the counts of the others and rings them.
  At worst (a worker that died between its append and its rings) a wait is answered at its deadline.
- Nothing here blocks: frames go to the link's backlog, and doorbells are eventfd writes; `end_turn`
  flushes the link. A CANCEL does not wake a sleeping timer (shm.timer_link, NOT_URGENT): it takes it in the turn
  it wakes for anyway, before that turn's expiries.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from shmbroker.shm import messages as M
from shmbroker.shm.doorbell import EventfdDoorbell
from shmbroker.shm.fetch_condition import FetchCondition
from shmbroker.shm.interest import WorkerWatches, full_fence
from shmbroker.shm.table import END_BYTES, PartitionTable
from shmbroker.workers.connection import Connection, Request
from shmbroker.workers.timer_client.outcome import Outcome
from shmbroker.shm.timer_link import NOT_URGENT, TimerLink

log = logging.getLogger("shmbroker.delayed")

# Request id = (pid & PID_MASK) << PID_SHIFT | sequence: 24 bits of pid above a 40-bit sequence, which
# a worker would take decades to exhaust at a million delayed requests per second.
PID_SHIFT = 40
PID_MASK = 0xFFFFFF

# A continuation: called once with the timer's result (or None: answered without the timer); returns the outcome.
Continuation = Callable[[Any], Outcome]


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Completed(NamedTuple):
    """The timer's answer to a delayed request: SATISFIED, EXPIRED, or FAILED with a Kafka error code."""

    status: M.Status
    error_code: int = 0


# The answers without an error code, made once: a fan-out or a slot's expiries finish thousands per turn.
SATISFIED = Completed(M.Status.SATISFIED)
EXPIRED = Completed(M.Status.EXPIRED)
_FAILED = int(M.Status.FAILED)
_SATISFIED = int(M.Status.SATISFIED)


@dataclass(slots=True)
class Waiting:
    request: Request
    deadline_ms: int
    finish: Continuation
    frame: bytes  # as sent to the timer, kept for re-submission
    fetch: FetchCondition | None = None  # a delayed fetch's condition, checked here when an append may meet it
    handed_off: bool = False  # sent to the timer (a long poll only after fetch_handoff_ms)


class DocumentTooLarge(ValueError):
    """A request whose message would not fit the ring to the timer (or the configured bound)."""


class DelayedRequests:
    def __init__(self, link: TimerLink, table: PartitionTable, delayed_grace_ms: int,
                 settle: Callable[[Request, Outcome | None], None], max_frame_bytes: int,
                 watches: WorkerWatches | None = None, index: int = 0,
                 peer_bells: dict[int, EventfdDoorbell] | None = None, fetch_handoff_ms: int = 0) -> None:
        self.link = link
        self.max_frame_bytes = max_frame_bytes
        self.table = table
        self.delayed_grace_ms = delayed_grace_ms
        self.settle = settle
        self.waiting: dict[int, Waiting] = {}
        self._by_connection: dict[Connection, set[int]] = {}
        self._sequence = 0
        self._pid_bits = (os.getpid() & PID_MASK) << PID_SHIFT
        self._flush_rows: set[int] = set()
        self._fetches_by_row: dict[int, set[int]] = {}  # row -> ids of this worker's delayed fetches watching it
        self._appended_here: set[int] = set()  # rows to check this turn: this worker appended to them
        self._new_fetches: list[int] = []  # fetches that began to wait this turn: each checked once, by itself
        self.answered_on_append = 0  # for the stats segment
        self.handed_off = 0  # fetches handed to the timer (for the stats segment)
        self.fetch_handoff_ms = fetch_handoff_ms
        self._handoffs: deque[tuple[int, int]] = deque()  # (due ms, request id) of fetches not yet handed off
        # The table, not views of it: it closes its mapping at exit, which a view held here would prevent.
        self._watches = watches
        self._index = index
        if watches is not None:
            watches.counts[index] = 0  # a dead predecessor's counts
        self._peer_bells = peer_bells or {}
        self._peers_rung: set[int] = set()  # rung at an append this turn
        self._peers_to_ring: set[int] = set()  # appended to again since: rung in the turn's hooks
        self._rang = False  # the doorbell rang this turn: another worker may have appended
        self._seen_end: dict[int, int] = {}  # watched row -> its end bytes when last checked after a ring
        # Told of each fetch an append answered: (its connection, the appending worker; None: unknown).
        self.on_answered: Callable[[Connection, int | None], None] | None = None

    def __len__(self) -> int:
        return len(self.waiting)

    # -- what handlers call ----------------------------------------------------------------------

    def appended(self, row: int) -> None:
        """Note an append to `row`: this worker's fetches on it are checked once the Produce's appends are done
        (the worker asks `answers_due`), and the workers that count a wait on it are rung. The fence orders the
        append (published in the table) before the counts' read (shm.interest).

        A peer is rung at once on its first such append of the turn: it wakes (tens of microseconds on a
        virtual CPU) while this worker answers its producer. Its later ones this turn ring it again (the peer may
        have looked at the row in between) in the turn's hooks, before the writes and after them (`ring_peers`):
        a few rings per peer per turn, however many appends."""
        full_fence()
        if self._peer_bells:
            counts = self._watches.counts
            for peer in self._peer_bells:
                if counts[peer, row]:
                    self._watches.appenders[row] = self._index + 1  # before the ring (workers.affinity)
                    if peer in self._peers_rung:
                        self._peers_to_ring.add(peer)
                    else:
                        self._peers_rung.add(peer)
                        self._peer_bells[peer].ring()
        if row in self._fetches_by_row:
            self._appended_here.add(row)

    def wants_flush(self, row: int) -> None:
        """The topic's flush.messages records wait on `row`: the timer starts an fsync round (end of this turn)."""
        self._flush_rows.add(row)

    def delay_produce(self, req: Request, waits: list[tuple[int, int]], timeout_ms: int,
                      finish: Continuation) -> Outcome:
        """Wait until every (row, offset) is fsync'd, or timeout_ms; `finish(status)` builds the answer."""
        deadline = monotonic_ms() + max(0, timeout_ms)
        return self._wait(req, deadline, finish,
                          lambda rid: M.encode(M.Kind.DELAY_PRODUCE, rid, deadline, items=waits))

    def delay_fetch(self, req: Request, watch: list[tuple[int, int, int]], min_bytes: int, max_wait_ms: int,
                    finish: Continuation) -> Outcome:
        """Wait until min_bytes are appended past the (row, start_bytes, stable_from) items (shm.fetch_condition),
        or max_wait_ms."""
        now = monotonic_ms()
        deadline = now + max(0, max_wait_ms)
        handoff = self.fetch_handoff_ms
        hand_off_at = now + handoff if 0 < handoff < max_wait_ms else None
        return self._wait(req, deadline, finish,
                          lambda rid: M.encode_delay_fetch(rid, deadline, min_bytes, watch),
                          FetchCondition(watch, min_bytes), hand_off_at)

    def throttle(self, req: Request, client: str | None, quota_kind: int, throttle_ms: int,
                 then: Continuation) -> Outcome:
        """Hold a throttled client for throttle_ms on a timer in the timer process (THROTTLE); `then(status)` runs
        when it ends: it unmutes the connection (Outcome.DEFERRED) or returns the response held back."""
        deadline = monotonic_ms() + throttle_ms
        return self._wait(req, deadline, then, lambda rid: M.encode(M.Kind.THROTTLE, rid, deadline, throttle_ms,
                                                                    quota_kind, client or ""))

    def ask(self, req: Request, frame: bytes, timeout_ms: int, answer: Continuation) -> Outcome:
        """A request the timer process answers with a REPLY (topic administration, the group coordinator's
        requests): `frame` is its message encoded with request id 0 (shm.messages; the id is set here);
        `answer(reply or None)` builds the response. Raises DocumentTooLarge, sending nothing, if the frame
        exceeds max_frame_bytes."""
        if len(frame) > self.max_frame_bytes:
            raise DocumentTooLarge(f"{M.kind_of(frame).name} of {len(frame)} bytes, at most {self.max_frame_bytes}")
        return self._wait(req, monotonic_ms() + timeout_ms, answer, lambda rid: M.with_request_id(frame, rid))

    def _wait(self, req: Request, deadline_ms: int, finish: Continuation, frame_for: Callable[[int], bytes],
              fetch: FetchCondition | None = None, hand_off_at: int | None = None) -> Outcome:
        self._sequence += 1
        request_id = self._pid_bits | self._sequence
        waiting = self.waiting[request_id] = Waiting(req, deadline_ms, finish, frame_for(request_id), fetch)
        if fetch is not None:
            mine = self._watches.counts[self._index] if self._watches is not None else None
            for row, *_ in fetch.watch:
                self._fetches_by_row.setdefault(row, set()).add(request_id)
                if mine is not None:
                    mine[row] += 1
            full_fence()
            self._new_fetches.append(request_id)  # checked this turn, after the fence: an append that raced it
        self._by_connection.setdefault(req.conn, set()).add(request_id)
        if hand_off_at is None:
            self._hand_off(waiting)
        else:
            self._handoffs.append((hand_off_at, request_id))
        return Outcome.DEFERRED

    def _hand_off(self, waiting: Waiting) -> None:
        waiting.handed_off = True
        self.link.send(waiting.frame)
        if waiting.fetch is not None:
            self.handed_off += 1

    def _hand_off_due(self, now_ms: int) -> None:
        """Hand the timer the fetches that waited fetch_handoff_ms here (those answered or closed since: skipped)."""
        handoffs = self._handoffs
        while handoffs and handoffs[0][0] <= now_ms:
            waiting = self.waiting.get(handoffs.popleft()[1])
            if waiting is not None and not waiting.handed_off:
                self._hand_off(waiting)

    def next_handoff_ms(self, now_ms: int) -> int | None:
        """How soon the oldest fetch not yet handed off is due (the worker's sleep is bounded by it)."""
        handoffs = self._handoffs
        while handoffs and handoffs[0][1] not in self.waiting:
            handoffs.popleft()  # answered or closed: nothing to hand off
        return max(0, handoffs[0][0] - now_ms) if handoffs else None

    # -- what the worker's loop calls ------------------------------------------------------------

    def on_completion(self, message: Any) -> None:
        finish = self._finish
        for request_id, status, error_code in message.items:
            if status == _FAILED:
                finish(request_id, Completed(M.Status.FAILED, error_code))
            else:
                finish(request_id, SATISFIED if status == _SATISFIED else EXPIRED)

    def on_reply(self, message: Any) -> None:
        self._finish(message.request_id, message)

    def _finish(self, request_id: int, result: Any) -> None:
        waiting = self._pop(request_id)
        if waiting is None or waiting.request.conn.closed:
            return
        try:
            outcome = waiting.finish(result)
        except Exception:
            log.exception("finishing a delayed request failed")
            outcome = None  # the worker closes the connection: a bug costs one connection, never the worker
        self.settle(waiting.request, outcome)

    def _pop(self, request_id: int) -> Waiting | None:
        waiting = self.waiting.pop(request_id, None)
        if waiting is not None:
            ids = self._by_connection.get(waiting.request.conn)
            if ids is not None:
                ids.discard(request_id)
                if not ids:
                    del self._by_connection[waiting.request.conn]
            if waiting.fetch is not None:
                self._unindex_fetch(request_id, waiting.fetch)
        return waiting

    def _unindex_fetch(self, request_id: int, fetch: FetchCondition) -> None:
        mine = self._watches.counts[self._index] if self._watches is not None else None
        for row, *_ in fetch.watch:
            if mine is not None and mine[row]:
                mine[row] -= 1
            ids = self._fetches_by_row.get(row)
            if ids is not None:
                ids.discard(request_id)
                if not ids:
                    del self._fetches_by_row[row]
                    self._seen_end.pop(row, None)

    def doorbell_rang(self) -> None:
        """The timer or another worker rang: this turn, also check the watched rows whose end moved."""
        self._rang = True

    def answers_due(self) -> bool:
        """Whether answer_appended has anything to check: an append or a ring since, or a new wait."""
        return bool(self._appended_here or self._new_fetches or self._rang)

    def holds(self, conn: Connection) -> bool:
        """Whether a request of `conn` waits here."""
        return conn in self._by_connection

    def answer_fetches_now(self, conn: Connection) -> None:
        """Answer `conn`'s waiting fetches at once, in arrival order, as if their deadlines had come (a read of the
        same connection arrived behind them: workers.worker); the timer drops the handed-off ones' waits."""
        ids = sorted(rid for rid in self._by_connection.get(conn, ()) if self.waiting[rid].fetch is not None)
        cancelled = [(rid,) for rid in ids if self.waiting[rid].handed_off]
        for request_id in ids:
            self._finish(request_id, EXPIRED)
        if cancelled:
            self._send_items(M.Kind.CANCEL, cancelled, NOT_URGENT)

    def cancel_connection(self, conn: Connection) -> None:
        """The connection closed: forget its waits and tell the timer to drop them."""
        ids = self._by_connection.pop(conn, None)
        if not ids:
            return
        cancelled = []
        for request_id in ids:
            waiting = self.waiting.pop(request_id)
            if waiting.fetch is not None:
                self._unindex_fetch(request_id, waiting.fetch)
            if waiting.handed_off:
                cancelled.append((request_id,))
        if cancelled:
            self._send_items(M.Kind.CANCEL, cancelled, NOT_URGENT)

    def answer_appended(self, after_each: Callable[[], None]) -> None:
        """Answer this worker's delayed fetches that appends satisfied: on the rows this turn appended to, and
        after a doorbell ring on the watched rows whose end moved. `after_each()` runs after each answer (the
        worker writes in chunks); the timer drops their waits on the CANCEL sent here."""
        table = self.table
        rung: set[int] = set()  # watched rows whose end moved since the last look: another worker appended
        if self._rang:
            self._rang = False
            seen = self._seen_end
            for row in self._fetches_by_row:
                end = table.read_field(row, END_BYTES)
                if seen.get(row) != end:
                    seen[row] = end
                    rung.add(row)
        if not self._appended_here and not rung and not self._new_fetches:
            return
        here, self._appended_here = self._appended_here, set()
        candidates, self._new_fetches = self._new_fetches, []
        by_row = self._fetches_by_row
        for row in here | rung if rung else here:
            candidates.extend(by_row.get(row, ()))
        answered, cancelled = 0, []
        on_answered = self.on_answered
        for request_id in candidates:
            waiting = self.waiting.get(request_id)  # None: answered already (it watches two rows), or gone
            if waiting is None or not waiting.fetch.satisfied(table):
                continue
            answered += 1
            if waiting.handed_off:
                cancelled.append((request_id,))
            if on_answered is not None:
                on_answered(waiting.request.conn, self._appender(waiting.fetch, here, rung))
            self._finish(request_id, SATISFIED)
            after_each()
        self.answered_on_append += answered
        if cancelled:
            self._send_items(M.Kind.CANCEL, cancelled, NOT_URGENT)

    def _appender(self, fetch: FetchCondition, here: set[int], rung: set[int]) -> int | None:
        """Which worker's append answered `fetch`: this one, a peer (the last that rang for the row), or None
        (a new wait that found its records at once)."""
        for row, *_ in fetch.watch:
            if row in here:
                return self._index
        if self._watches is not None:
            for row, *_ in fetch.watch:
                if row in rung:
                    worker = int(self._watches.appenders[row]) - 1
                    return worker if worker >= 0 else None
        return None

    def resubmit(self) -> None:
        handed_off = [waiting for waiting in self.waiting.values() if waiting.handed_off]
        log.info("timer process (re)started: re-submitting %d delayed requests", len(handed_off))
        for waiting in handed_off:
            self.link.send(waiting.frame)

    def self_answer(self, now_ms: int) -> None:
        """Answer the waits the timer left `delayed_grace_ms` past their deadline."""
        late = [rid for rid, w in self.waiting.items() if now_ms > w.deadline_ms + self.delayed_grace_ms]
        for request_id in late:
            log.warning("timer did not answer request %d in time; answering it here", request_id)
            self._finish(request_id, None)

    def ring_peers(self) -> None:
        """Ring the peers appended to again this turn after their first ring (see `appended`): the worker calls
        it before answering the turn's own waits, so the others answer their share meanwhile."""
        if self._peers_to_ring:
            for peer in self._peers_to_ring:
                self._peer_bells[peer].ring()
            self._peers_to_ring.clear()

    def end_turn(self) -> None:
        self.ring_peers()  # appends made since (requests held back until a write)
        self._peers_rung.clear()
        if self._appended_here or self._new_fetches:
            self.answer_appended(lambda: None)  # requests served after answer_appended, in _write_ready
        if self._handoffs:
            self._hand_off_due(monotonic_ms())
        if self._flush_rows:
            self._send_items(M.Kind.FLUSH, [(row,) for row in self._flush_rows])
            self._flush_rows.clear()
        self.link.flush()

    def _send_items(self, kind: M.Kind, items: list[tuple], needed_by_ms: int | None = None) -> None:
        for start in range(0, len(items), M.MAX_ITEMS):
            self.link.send(M.encode(kind, items=items[start:start + M.MAX_ITEMS]), needed_by_ms)
