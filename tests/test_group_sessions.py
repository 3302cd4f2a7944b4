"""Lazily renewed member sessions (node.timer.groups.sessions) against a model: every session expires once,
never before its last deadline, and no later than the first advance past it."""

from __future__ import annotations


from hypothesis import given, settings
from hypothesis import strategies as st

from shmbroker.node.timer.groups.sessions import Sessions
from shmbroker.node.config import WheelConfig
from shmbroker.shm import messages as M

KEYS = [("g", f"m{i}") for i in range(5)]


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.tuples(st.sampled_from(["renew", "forget", "advance"]), st.sampled_from(KEYS),
                          st.integers(0, 3000)), max_size=60))
def test_sessions_expire_once_at_their_last_deadline(steps):
    expired: list[tuple] = []
    sessions = Sessions(WheelConfig(), 0, expired.append)
    now, deadlines = 0, {}
    for action, key, amount in steps:
        if action == "renew":
            deadlines[key] = now + amount
            sessions.renew(key, now + amount)
        elif action == "forget":
            deadlines.pop(key, None)
            sessions.forget(key)
        else:
            now += amount
            sessions.advance(now)
            due = {k for k, d in deadlines.items() if d <= now}
            assert set(expired) == due, (expired, due, now)
            assert len(expired) == len(due)
            for k in due:
                del deadlines[k]
            expired.clear()
        assert len(sessions) == len(deadlines)


def test_a_renewed_session_outlives_its_first_deadline_and_a_shorter_one_rearms():
    expired = []
    sessions = Sessions(WheelConfig(), 0, expired.append)
    sessions.renew("a", 100)
    sessions.renew("a", 250)  # a heartbeat: moves the deadline, keeps the armed entry
    sessions.advance(120)
    assert expired == []
    sessions.advance(250)
    assert expired == ["a"]
    sessions.renew("b", 10_000)
    sessions.renew("b", 300)  # a shorter session timeout: re-armed at once
    sessions.advance(301)
    assert expired == ["a", "b"]


def test_with_request_id_rewrites_only_the_id():
    frame = M.encode(M.Kind.HEARTBEAT, 0, 3, 7, "g", "m-1", None)
    moved = M.decode(M.with_request_id(frame, 2**64 - 1))
    assert tuple(moved) == (2**64 - 1, 3, 7, "g", "m-1", None)
