"""A family of API handlers: the APIs one module of workers/api answers (admin, groups, transactions, ...).

Each family takes the node's config, the client of the timer's delayed requests (when its APIs wait on the
timer) and the authorizer, and lists its APIs in ``table``: API key -> the method that answers it. The
worker's dispatch (workers/api/handlers.py) merges the families' tables.
"""

from __future__ import annotations

from typing import Any, Callable

from shmbroker.workers.api.authorizer import RequestAuthorizer
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.delayed import DelayedRequests
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
