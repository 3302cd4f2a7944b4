"""Requests of a transactional id whose previous transaction is still completing, held to run once it has.

The coordinator answers a transaction's EndTxn as soon as its markers are appended, while their fsync (and that
of its consumer offsets) is still under way; the id's next requests wait for that rather than being answered
CONCURRENT_TRANSACTIONS, which clients retry only after a backoff. The wait is bounded: at most `per_id` requests
of one id are held, each for at most `max_hold_ms`; a request beyond either bound is refused (the coordinator
answers CONCURRENT_TRANSACTIONS, as Kafka does for every such request, and the client retries).

Invariants:
- Every held request is either run (`release`) or refused (its hold time passed), exactly once, in the order it
  came for its id; one runs only when the caller says the id is ready (no completion, no state write in flight),
  so the requests of one id never race each other's state writes.
- An id with held requests has one wheel entry, at the deadline of its oldest held request; none without.
- `per_id` 0 holds nothing: every request of a completing id is refused, Kafka's own behaviour.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from shmbroker.node.config import WheelConfig
from shmbroker.node.timer.groups.sessions import Sessions

Action = Callable[[], None]


class HeldRequests:
    def __init__(self, per_id: int, max_hold_ms: int, wheel: WheelConfig, now_ms: int,
                 clock: Callable[[], int]) -> None:
        self.per_id = per_id
        self.max_hold_ms = max_hold_ms
        self.clock = clock
        self._held: dict[str, deque[tuple[int, Action, Action]]] = {}  # id -> (deadline, run, refuse), oldest first
        self._deadlines = Sessions(wheel, now_ms, self._expired)
        self.held = self.refused = 0  # (the stats segment counts them)

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._held.values())

    def hold(self, transactional_id: str, run: Action, refuse: Action) -> bool:
        """Hold a request until `release(transactional_id)` runs it, or its hold time passes and `refuse` answers it;
        False (nothing held, the caller refuses it now) when the id already has `per_id` requests held."""
        queue = self._held.get(transactional_id)
        if len(queue or ()) >= self.per_id:
            self.refused += 1
            return False
        if queue is None:
            queue = self._held[transactional_id] = deque()
        deadline = self.clock() + self.max_hold_ms
        queue.append((deadline, run, refuse))
        if len(queue) == 1:
            self._deadlines.renew(transactional_id, deadline)
        self.held += 1
        return True

    def __contains__(self, transactional_id: str) -> bool:
        return transactional_id in self._held

    def release(self, transactional_id: str, ready: Callable[[], bool]) -> None:
        """Run the id's held requests in the order they came, while `ready()` (a request that starts a state write
        leaves the rest held until the caller releases them again, once it is durable)."""
        queue = self._held.get(transactional_id)
        while queue and ready():
            _, run, _ = queue.popleft()
            if not queue and self._held.get(transactional_id) is queue:
                del self._held[transactional_id]
                self._deadlines.forget(transactional_id)
            run()

    def _expired(self, transactional_id: str) -> None:
        queue = self._held.get(transactional_id)
        if not queue:
            return
        due = [queue.popleft()[2]]  # the wheel fired at the oldest one's deadline
        now = self.clock()
        while queue and queue[0][0] <= now:
            due.append(queue.popleft()[2])
        if queue:
            self._deadlines.renew(transactional_id, queue[0][0])
        else:
            del self._held[transactional_id]
        self.refused += len(due)
        for refuse in due:
            refuse()

    def advance(self, now_ms: int) -> None:
        self._deadlines.advance(now_ms)

    def next_expiration(self) -> int | None:
        return self._deadlines.next_expiration()
