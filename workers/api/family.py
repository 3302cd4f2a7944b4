"""A family of API handlers: the APIs one module of workers/api answers (admin, groups, transactions, ...).

Each family takes the node's config, the client of the timer's delayed requests (when its APIs wait on the
timer) and the authorizer, and lists its APIs in ``table``: API key -> the method that answers it. The
worker's dispatch (workers/api/handlers.py) merges the families' tables. A family whose requests the timer's
coordinators answer sends them with ``ask_coordinator``.
"""

from __future__ import annotations

from typing import Any, Callable

from shmbroker.shm import messages as M
from shmbroker.workers.api.authorizer import RequestAuthorizer
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.delayed import DelayedRequests, DocumentTooLarge
from shmbroker.workers.timer_client.outcome import Outcome

Handler = Callable[[Request, Any], Outcome]


class HandlerFamily:
    """Invariant: ``authorizer`` is never None; a family made without one allows every request
    (RequestAuthorizer.open_to_all), as a node with the authorizer off does."""

    def __init__(self, config: Any, delayed: DelayedRequests | None = None,
                 authorizer: RequestAuthorizer | None = None) -> None:
        self.config = config
        self.delayed = delayed
        self.authorizer = authorizer or RequestAuthorizer.open_to_all()

    def table(self) -> dict[int, Handler]:
        raise NotImplementedError

    def ask_coordinator(self, req: Request, kind: M.Kind, body: tuple, fields: tuple, answer: Callable[[Any], Outcome],
                        refusal: Callable[[E.ErrorCode], Any], timeout_ms: int | None = None) -> Outcome:
        """Send the timer `kind` with the request's id-to-be, API version, `body` and `fields`, to be answered within
        `timeout_ms` (default timer.control_timeout_ms); `answer` gets the REPLY's answer (None if the timer never
        gave one), or `refusal`'s coordinator-shaped answer (INVALID_REQUEST) when the request is too large to be
        sent. `answer` must not refer back to a closure that calls it: such a pair is a reference cycle, kept until
        a garbage collection (tests/test_reference_cycles.py)."""
        if timeout_ms is None:
            timeout_ms = self.config.timer.control_timeout_ms
        try:
            frame = M.encode(kind, 0, req.header.api_version, *body, *fields)
            return self.delayed.ask(req, frame, timeout_ms, lambda got: answer(None if got is None else got.answer))
        except DocumentTooLarge:
            return answer(refusal(E.INVALID_REQUEST))
