"""Member sessions of the group coordinator, as timers in a timing wheel, renewed lazily.

Every heartbeat, join and sync renews a member's session: its deadline moves to now + session timeout. A
renewal only stores the new deadline; the member keeps one entry in the wheel, armed at an older deadline.
When that entry fires, the session is re-armed at the moved deadline if it moved, or expires. So a heartbeat
costs one dict look-up and one store, not a cancel and an add of a timer (at 10,000 heartbeats a second the
cancel-and-add, with its watcher-list purges, took about a fifth of the timer process's time).

Invariants:
- A live session has exactly one armed wheel entry, at or before its deadline; an expiry is reported
  (`on_expired(key)`) no earlier than the deadline, and at most one tick past the wheel advance that reaches it.
- A renewal to an earlier deadline (a shorter session timeout) re-arms at once, so no session outlives its
  timeout.
- `forget(key)` ends a session for good: its entry, when it fires, is ignored.
"""

from __future__ import annotations

from typing import Callable, Hashable

from shmbroker.node.config import WheelConfig
from shmbroker.node.timer.wheel import TimingWheel


class Sessions:
    def __init__(self, wheel: WheelConfig, start_ms: int, on_expired: Callable[[Hashable], None]) -> None:
        self._wheel = TimingWheel.configured(wheel, start_ms)
        self._on_expired = on_expired
        self._sessions: dict[Hashable, list[int]] = {}  # key -> [deadline, armed handle, armed deadline]
        self._keys: dict[int, Hashable] = {}  # armed handle -> key
        self.expired = 0  # sessions that ran out (for the stats segment)

    def __len__(self) -> int:
        return len(self._sessions)

    def renew(self, key: Hashable, deadline_ms: int) -> None:
        session = self._sessions.get(key)
        if session is None:
            self._sessions[key] = session = [deadline_ms, 0, 0]
            self._arm(key, session)
        elif deadline_ms < session[2]:  # earlier than the armed entry: re-arm now
            self._wheel.cancel(session[1])
            self._keys.pop(session[1], None)
            session[0] = deadline_ms
            self._arm(key, session)
        else:
            session[0] = deadline_ms

    def _arm(self, key: Hashable, session: list[int]) -> None:
        handle = self._wheel.add(session[0])
        session[1], session[2] = handle, session[0]
        self._keys[handle] = key

    def forget(self, key: Hashable) -> None:
        session = self._sessions.pop(key, None)
        if session is not None:
            self._wheel.cancel(session[1])
            self._keys.pop(session[1], None)

    def advance(self, now_ms: int) -> None:
        for handle in self._wheel.advance(now_ms).tolist():
            key = self._keys.pop(handle, None)
            session = self._sessions.get(key) if key is not None else None
            if session is None or session[1] != handle:
                continue
            if session[0] > now_ms:  # renewed since it was armed
                self._arm(key, session)
            else:
                del self._sessions[key]
                self.expired += 1
                self._on_expired(key)

    def next_expiration(self) -> int | None:
        return self._wheel.next_expiration()

    @property
    def wheel(self) -> TimingWheel:
        return self._wheel

