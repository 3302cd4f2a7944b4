"""One share group (KIP-932) as the coordinator holds it: its members, their subscriptions and assignments, and
the group epoch (Kafka's ShareGroup).

The share assignor gives every member every partition of the topics it subscribes to: records, not partitions,
are what members share (each record is acquired by one member at a time: node.timer.groups.share_partition).
So a member's assignment depends only on its own subscription and the topics' partition counts, and nobody
has to give anything up before another gets it (no reconciliation, unlike KIP-848's groups).

The group is kept in the offsets log as one snapshot (`snapshot`/`restore`, SNAPSHOT_FORMAT): its epoch and each
member's ids, client, subscription, epochs and assignment, as Kafka keeps ShareGroupMetadata and
ShareGroupMemberMetadata in __consumer_offsets; sessions are not kept (the coordinator starts them anew).

Invariants:
- `epoch` grows whenever the membership, a subscription or a subscribed topic's partitions change; a member's
  epoch is the group epoch its assignment was computed at.
- State (what ShareGroupDescribe and ListGroups show): Empty without members, else Stable.
- `restore(snapshot())` is the group again (same epoch, members in the same order, same fields).
"""

from __future__ import annotations

from dataclasses import dataclass, field

Partitions = dict[str, list[int]]
SNAPSHOT_FORMAT = 1  # the version of `snapshot`'s layout in the offsets log; `restore` reads this one


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

    def snapshot(self) -> list:
        return [self.member_id, self.rack_id, self.client_id, self.client_host, list(self.subscribed_topics),
                self.epoch, self.previous_epoch, [[topic, list(parts)] for topic, parts in
                                                  sorted(self.assignment.items())]]

    @staticmethod
    def restore(data: list) -> ShareMember:
        member_id, rack_id, client_id, client_host, topics, epoch, previous_epoch, assignment = data
        return ShareMember(str(member_id), None if rack_id is None else str(rack_id), str(client_id),
                           str(client_host), tuple(str(t) for t in topics), int(epoch), int(previous_epoch),
                           {str(topic): [int(p) for p in parts] for topic, parts in assignment})


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

    def snapshot(self) -> list:
        """The group as the offsets log keeps it (SNAPSHOT_FORMAT)."""
        return [SNAPSHOT_FORMAT, self.epoch, [m.snapshot() for m in self.members.values()]]

    @staticmethod
    def restore(group_id: str, data: list) -> ShareGroup:
        """ValueError if `data` is not a snapshot of SNAPSHOT_FORMAT (TypeError, IndexError if it is malformed)."""
        if not isinstance(data, list) or not data or data[0] != SNAPSHOT_FORMAT:
            raise ValueError(f"not a share group snapshot of format {SNAPSHOT_FORMAT}")
        _, epoch, members = data
        group = ShareGroup(group_id, int(epoch))
        for member_data in members:
            member = ShareMember.restore(member_data)
            group.members[member.member_id] = member
        return group
