"""Building a response of the requested API version, for every handler (workers.handlers, workers.groups).

`entity(req, "ClassName", **values)` builds the kio dataclass of that name in the response schema of the
request's API and version, keeping the fields that version has (one handler serves every version; a nested
class the version lacks gives None, dropped with its field);
`reply(req, response)` frames it as the request's Outcome. `code(n)` turns a number into kio's ErrorCode.

Invariants: error codes are kio ErrorCode members (Kafka's own table), durations datetime.timedelta, as kio
expects; an unknown number becomes UNKNOWN_SERVER_ERROR, never an exception.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.static.primitive import i32Timedelta

from workers import errors as E
from workers import protocol as P
from workers.connection import Request
from workers.outcome import Outcome

ZERO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))


def code(value: int) -> E.ErrorCode:
    try:
        return E.ErrorCode(value)
    except ValueError:
        return E.UNKNOWN_SERVER_ERROR


def entity(req: Request, class_name: str, /, **values: Any) -> Any:
    """None when the version has no such class: the field holding it does not exist in that version either,
    and the enclosing entity drops it."""
    cls = getattr(P.response_schema(req.header.api_key, req.header.api_version), class_name, None)
    return None if cls is None else P.build_entity(cls, **values)


def reply(req: Request, response: Any) -> Outcome:
    h = req.header
    return Outcome.reply([P.encode_response(h.api_key, h.api_version, h.correlation_id, response)])
