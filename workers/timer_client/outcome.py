"""What a request handler did with a request: the one outcome type of every handler and continuation.

- `Outcome.reply(pieces, errors)`: the response is ready: pieces (bytes-likes and FileRanges) to write in
  order, and how to find the non-zero Kafka error codes it carries (top-level and per partition, one per
  occurrence: what the stats count): a function called only when the stats are on, so a node without
  stats never walks a response for them; None when the handler knows there is none (Produce and Fetch,
  whose clean answers are most of a node's responses, so the stats cost them nothing per partition). An
  empty list is a request that gets no response (Produce with acks=0): its slot is filled with nothing, so
  the responses behind it still leave in order.
- `Outcome.closing(reason, errors)`: no response, and the connection is closed once the responses before it
  are written (Kafka's answer to a Produce with acks=0 that failed: the client learns of it only so); the
  connection serves no request after it.
- `Outcome.DEFERRED`: the request waits (for the timer process, or for a topic creation); whoever owns the
  wait fills the request's slot later, exactly once, with the outcome of its continuation.

Invariants: an Outcome is immutable; DEFERRED is the only outcome without pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable


@dataclass(frozen=True, slots=True)
class Outcome:
    pieces: list[Any] | None
    errors: Callable[[], Iterable[int]] | None = None  # the error codes, computed on demand; None: none
    closes: str | None = None  # why the connection closes after it (logged once); None: it stays open

    DEFERRED: ClassVar["Outcome"]
    NO_RESPONSE: ClassVar["Outcome"]

    @staticmethod
    def reply(pieces: list[Any], errors: Callable[[], Iterable[int]] | None = None) -> "Outcome":
        return Outcome(pieces, errors)

    @staticmethod
    def closing(reason: str, errors: Callable[[], Iterable[int]] | None = None) -> "Outcome":
        return Outcome([], errors, reason)

    @property
    def deferred(self) -> bool:
        return self.pieces is None


Outcome.DEFERRED = Outcome(None)
Outcome.NO_RESPONSE = Outcome([])
