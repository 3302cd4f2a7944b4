"""Waiting in tests for what another process does: polls bounded in time.

`poll` returns the first truthy value of a predicate, or its last value once the time is up (for a caller
that reports more than the timeout); `wait_for` fails the test then, naming what it waited for.
"""

from __future__ import annotations

import time
from typing import Any, Callable


def poll(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    return predicate()


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "", poll_s: float = 0.2) -> Any:
    value = poll(predicate, timeout, poll_s)
    if not value:
        raise AssertionError(f"timed out waiting for {what}")
    return value
