"""One consumer group as the coordinator holds it: members, generation, state (Kafka's classic GroupMetadata).

States and their moves (Kafka's GroupState):

    Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup--> Stable
    Stable / CompletingRebalance --join with new metadata, leave, session expiry--> PreparingRebalance
    PreparingRebalance --every member gone--> Empty;  Empty --DeleteGroups, offsets expired (none pending)--> Dead

Invariants:
- `generation` grows by one per completed join phase; members of an older generation get ILLEGAL_GENERATION.
- A member is either known (in `members`, with an id the node issued) or pending (`pending`: issued an id by a
  JoinGroup v4+ answered MEMBER_ID_REQUIRED, not yet rejoined with it).
- A static member's instance id maps to exactly one member id (`static_members`); a newer join with the same
  instance id replaces the old member id, which from then on is fenced.
- `protocol` is chosen only when a join phase completes: the one every member supports that most members
  prefer (each member votes for its first supported candidate), as Kafka's selectProtocol.
- The coordinator never computes an assignment: it relays the leader's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# A request that waits for its answer: (worker, request id, API version, its message kind).
Waiter = tuple[int, int, int, int]


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (name, metadata), in the member's order of preference
    assignment: bytes = b""
    awaiting_join: Waiter | None = None
    awaiting_sync: Waiter | None = None

    def metadata(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def same_protocols(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: dict[str, bool] = field(default_factory=dict)  # member ids issued, not yet back (sessions of their own)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    new_member_added: bool = False  # a new member joined during the initial rebalance delay
    join: Any = None  # the pending join phase (node.timer.groups.delayed.DelayedJoin)
    empty_since_ms: int | None = None  # for offset expiry (Kafka's currentStateTimestamp of Empty)

    # -- queries ------------------------------------------------------------------------------

    def is_(self, state: GroupState) -> bool:
        return self.state is state

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def awaiting_join_count(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join is not None)

    def all_members_joined(self) -> bool:
        """Kafka's hasAllMembersJoined: every known member rejoined and no pending member is outstanding."""
        return len(self.members) == self.awaiting_join_count() and not self.pending

    def max_rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def candidate_protocols(self) -> set[str]:
        """The protocols every member supports."""
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Could a member with these protocols join? Kafka's supportsProtocols."""
        if self.is_(GroupState.EMPTY):
            return bool(protocol_type) and bool(protocols)
        return protocol_type == self.protocol_type and bool(
            self.candidate_protocols() & {name for name, _ in protocols})

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = next(name for name, _ in member.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(sorted(votes), key=lambda name: votes[name])

    def current_static_member(self, instance_id: str | None) -> str | None:
        return self.static_members.get(instance_id) if instance_id is not None else None

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to, read from their consumer-protocol metadata; None if unknown."""
        if self.protocol_type != "consumer" or self.protocol is None or not self.members:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            parsed = consumer_subscription(member.metadata(self.protocol))
            if parsed is None:
                return None
            topics |= parsed
        return topics

    # -- changes ------------------------------------------------------------------------------

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.empty_since_ms = now_ms if state is GroupState.EMPTY else None

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id
        if self.leader is None:
            self.leader = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.instance_id is not None and self.static_members.get(member.instance_id) == member_id:
            del self.static_members[member.instance_id]
        if self.leader == member_id:
            self.leader = next(iter(self.members), None)
        if not self.members:
            self.protocol_type = None if self.is_(GroupState.EMPTY) else self.protocol_type
        return member

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        member = self.members.pop(old_id)
        member.member_id = new_id
        self.members[new_id] = member
        self.static_members[instance_id] = new_id
        if self.leader == old_id:
            self.leader = new_id
        return member

    def complete_join_phase(self, now_ms: int) -> None:
        """The join phase ended with members: next generation, protocol chosen, waiting for the leader's sync."""
        self.generation += 1
        self.protocol = self.select_protocol()
        if self.leader not in self.members:
            self.leader = next(iter(self.members))
        self.transition(GroupState.COMPLETING_REBALANCE, now_ms)


def consumer_subscription(metadata: bytes) -> set[str] | None:
    """The topics of a consumer-protocol Subscription (version i16, topics [string], ...); None if malformed."""
    try:
        if len(metadata) < 6:
            return None
        count = int.from_bytes(metadata[2:6], "big", signed=True)
        position, topics = 6, set()
        for _ in range(count):
            size = int.from_bytes(metadata[position:position + 2], "big", signed=True)
            topics.add(metadata[position + 2:position + 2 + size].decode())
            position += 2 + size
        return topics
    except (UnicodeDecodeError, ValueError):
        return None
