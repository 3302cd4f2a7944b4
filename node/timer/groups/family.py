"""A family of groups beside the classic coordinator (KIP-848's consumer groups, KIP-1071's streams groups,
KIP-932's share groups): what each holds alike. Its groups by id; the node's group settings, the outbox to the
workers, the partition store and the clock; the classic coordinator (node.timer.groups.coordinator), which holds
the other families and the offsets log; and its deadlines in Sessions wheels (members' sessions, and the family's
own: revocations, acquisition locks), which the timer process advances together and sleeps until the soonest of.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

from shmbroker.node.config import GroupConfig, WheelConfig
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.groups.sessions import Sessions
from shmbroker.node.timer.outbox import Outbox


class GroupFamily:
    def __init__(self, config: GroupConfig, outbox: Outbox, store: PartitionStore, wheel: WheelConfig, now_ms: int,
                 clock: Callable[[], int], classic: Any) -> None:
        self.config = config
        self.outbox = outbox
        self.store = store
        self.clock = clock
        self.classic = classic  # the classic coordinator: its groups, the other families, the offsets log
        self.groups: dict[str, Any] = {}
        self.sessions = Sessions(wheel, now_ms, self.session_expired)

    def session_expired(self, key: Hashable) -> None:
        raise NotImplementedError

    def timer_wheels(self) -> tuple[Sessions, ...]:
        """The family's Sessions wheels: `sessions` and its own."""
        raise NotImplementedError

    def advance(self, now_ms: int) -> None:
        for wheel in self.timer_wheels():
            wheel.advance(now_ms)

    def next_expiration(self) -> int | None:
        due = [d for wheel in self.timer_wheels() if (d := wheel.next_expiration()) is not None]
        return min(due) if due else None
