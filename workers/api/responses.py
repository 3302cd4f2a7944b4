"""Building a response of the requested API version, for every handler (workers.api.handlers, workers.api.groups).

`entity(req, "ClassName", **values)` builds the kio dataclass of that name in the response schema of the
request's API and version, keeping the fields that version has (one handler serves every version; a nested
class the version lacks gives None, dropped with its field);
`reply(req, response)` frames it as the request's Outcome. `code(n)` turns a number into kio's ErrorCode.

Invariants: error codes are kio ErrorCode members (Kafka's own table), durations datetime.timedelta, as kio
expects; an unknown number becomes UNKNOWN_SERVER_ERROR, never an exception.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from kio.static.primitive import i32Timedelta

from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.outcome import Outcome

ZERO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))

# KIP-430's authorized operations when the request did not ask for them (workers.api.authorizer computes them).
NOT_REQUESTED = -(2**31)


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
    return Outcome.reply([P.encode_response(h.api_key, h.api_version, h.correlation_id, response)],
                         lambda: error_codes(response))


def error_codes(response: Any) -> tuple[int, ...]:
    """The non-zero error codes anywhere in a kio response entity, one per occurrence (for the stats)."""
    found: list[int] = []
    _collect_errors(response, found)
    return tuple(found)


_ENTITY_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}  # per class: (field name, is an error code)


def _collect_errors(entity: Any, found: list[int]) -> None:
    cls = type(entity)
    fields = _ENTITY_FIELDS.get(cls)
    if fields is None:
        fields = _ENTITY_FIELDS[cls] = tuple((f.name, f.name.endswith("error_code"))
                                             for f in dataclasses.fields(entity)) \
            if dataclasses.is_dataclass(entity) else ()
    for name, is_code in fields:
        value = getattr(entity, name)
        if is_code:
            if value:
                found.append(int(value))
        elif type(value) is tuple:
            for item in value:
                if dataclasses.is_dataclass(item):
                    _collect_errors(item, found)
        elif dataclasses.is_dataclass(value):
            _collect_errors(value, found)
