"""One consumer-protocol group (KIP-848) as the coordinator holds it: members with their subscriptions, member
epochs and assignments, the group epoch and the target assignment (Kafka's ConsumerGroup).

Invariants:
- `epoch` (the group epoch) grows whenever what the target assignment depends on changes: a member joins,
  leaves, is fenced or changes its subscription or assignor, or a subscribed topic's partitions change (a new
  topic matching a regex included). `assignment_epoch` is the group epoch the target was computed at; the
  target is recomputed when it is behind.
- `owners` maps every partition some member holds (assigned or pending revocation) to that member and its
  epoch; a partition has at most one owner (node.timer.groups.reconciliation gives a partition only when free).
- A static member's instance id maps to exactly one member id (`static_members`); member epoch -2 means the
  static member left for a while and keeps its assignment until it comes back or its session ends.
- A member's regex matches the topics of its resolution in `resolved` (none before it is resolved); `resolved`
  holds only regexes some member uses.
- State (what ConsumerGroupDescribe shows): Empty without members, Assigning while the target is behind the
  group epoch, Reconciling while a member has not reached the target, else Stable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from shmbroker.node.timer.groups.reconciliation import MemberBook, ReconcilingMember


@dataclass
class ConsumerMember(ReconcilingMember):
    subscribed_topics: tuple[str, ...] = ()
    subscribed_regex: str | None = None
    assignor: str | None = None


@dataclass
class ConsumerGroup(MemberBook):  # its members are ConsumerMembers; never NotReady
    subscribed_partitions: dict[str, int] = field(default_factory=dict)  # topic -> partitions, of the subscriptions
    catalog_version: int = -1  # the catalog the subscribed partitions were read from
    assignor_name: str = ""
    # The members' regexes, resolved against the catalog of `resolved_version` (regex text -> matching topics);
    # a regex not in here matches nothing yet.
    resolved: dict[str, frozenset[str]] = field(default_factory=dict)
    resolved_version: int = -1

    def regexes(self) -> set[str]:
        return {m.subscribed_regex for m in self.members.values() if m.subscribed_regex is not None}

    def regexes_stale(self, catalog_version: int) -> bool:
        """Whether a member's regex is not resolved yet, or was resolved against an older catalog."""
        regexes = self.regexes()
        if any(regex not in self.resolved for regex in regexes):
            return True
        return bool(regexes) and self.resolved_version != catalog_version

    def resolve(self, topics: Iterable[str], catalog_version: int) -> None:
        """Resolve every regex the members use against `topics` (the catalog's non-internal topics)."""
        names = list(topics)
        self.resolved = {}
        for regex in self.regexes():
            pattern = re.compile(regex)
            self.resolved[regex] = frozenset(t for t in names if pattern.fullmatch(t) is not None)
        self.resolved_version = catalog_version

    def forget_unused_regexes(self) -> None:
        """Drop the resolutions no member's subscription uses: a regex subscribed again is resolved anew."""
        used = self.regexes()
        self.resolved = {regex: topics for regex, topics in self.resolved.items() if regex in used}

    def subscriptions(self, topics: Mapping[str, int]) -> dict[str, frozenset[str]]:
        """Member id -> the existing topics it subscribes to (by name, or by its regex once resolved)."""
        return {m.member_id: frozenset(t for t in m.subscribed_topics if t in topics)
                | frozenset(t for t in self.resolved.get(m.subscribed_regex or "", ()) if t in topics)
                for m in self.members.values()}

    def subscribed_topics(self) -> set[str]:
        return set(self.subscribed_partitions)

    def removed(self, member: ConsumerMember) -> None:
        self.forget_unused_regexes()
        self.catalog_version = -1  # its subscription may have been the only one to a topic: read them again

    def replace_static(self, old_id: str, member: ConsumerMember) -> None:
        """A static member back under a new member id takes over its instance's assignment and subscription (as
        Kafka copies the member under its new id): the same subscription in its heartbeat changes nothing, so the
        group epoch stays and no other member reconciles."""
        old = self.members.pop(old_id)
        self.release(old)
        member.assigned, member.pending_revocation = old.assigned, old.pending_revocation
        member.subscribed_topics, member.subscribed_regex = old.subscribed_topics, old.subscribed_regex
        member.assignor, member.rack_id, member.rebalance_timeout_ms = old.assignor, old.rack_id, \
            old.rebalance_timeout_ms
        member.state, member.epoch, member.previous_epoch = old.state, 0, old.previous_epoch
        if old_id in self.target:
            self.target[member.member_id] = self.target.pop(old_id)
        self.add(member)
        self.hold(member)
