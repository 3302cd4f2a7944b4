"""One share group (KIP-932) as the coordinator holds it: its members, their subscriptions and assignments, and
the group epoch (Kafka's ShareGroup).

The share assignor gives every member every partition of the topics it subscribes to: records, not partitions,
are what members share (each record is acquired by one member at a time: node.timer.groups.share_partition).
So a member's assignment depends only on its own subscription and the topics' partition counts, and nobody
has to give anything up before another gets it (no reconciliation, unlike KIP-848's groups).

Invariants:
- `epoch` grows whenever the membership, a subscription or a subscribed topic's partitions change; a member's
  epoch is the group epoch its assignment was computed at.
- State (what ShareGroupDescribe and ListGroups show): Empty without members, else Stable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Partitions = dict[str, list[int]]


@dataclass
class ShareMember:
    member_id: str
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topics: tuple[str, ...] = ()
    epoch: int = 0
    previous_epoch: int = 0
    assignment: Partitions = field(default_factory=dict)


@dataclass
class ShareGroup:
    group_id: str
    epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return "Stable" if self.members else "Empty"

    def subscribed(self) -> set[str]:
        return {topic for member in self.members.values() for topic in member.subscribed_topics}
