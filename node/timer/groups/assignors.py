"""The server-side assignors of consumer-protocol groups (KIP-848): `uniform` (the default) and `range`.

An assignor maps every member to the partitions it should own (the group's target assignment) from the members'
subscriptions, the subscribed topics' partition counts and the previous target assignment.

Invariants (both assignors):
- Every partition of a topic that at least one member subscribes to is given to exactly one member, and only to a
  member subscribed to its topic; topics nobody subscribes to are given to nobody.
- The result depends only on the inputs (members are ordered by id), so a recomputation with nothing changed gives
  the same assignment.
- `uniform`: members subscribed to the same topics own counts that differ by at most one; a partition stays with
  its previous owner whenever that keeps the balance (sticky), so a membership change moves few partitions.
- `range`: per topic, the subscribed members (by id) each own one contiguous range of partitions, the first
  `partitions % members` of them one more.
"""

from __future__ import annotations

import heapq
from typing import Mapping

# member id -> topic -> partitions
Assignment = dict[str, dict[str, set[int]]]


class Assignor:
    name = ""

    def assign(self, subscriptions: Mapping[str, frozenset[str] | set[str]], partitions: Mapping[str, int],
               previous: Mapping[str, Mapping[str, set[int]]]) -> Assignment:
        raise NotImplementedError


class RangeAssignor(Assignor):
    name = "range"

    def assign(self, subscriptions, partitions, previous) -> Assignment:
        result: Assignment = {member: {} for member in subscriptions}
        for topic, count in sorted(partitions.items()):
            members = sorted(m for m, topics in subscriptions.items() if topic in topics)
            if not members or count <= 0:
                continue
            share, extra = divmod(count, len(members))
            start = 0
            for index, member in enumerate(members):
                size = share + (1 if index < extra else 0)
                if size:
                    result[member][topic] = set(range(start, start + size))
                start += size
        return result


class UniformAssignor(Assignor):
    """Sticky and balanced: previous owners keep what they may (up to their share), the rest goes to the least
    loaded eligible member; with subscriptions that differ, partitions then move from the most to the least
    loaded eligible members until no move would narrow the gap. Members subscribed alike cost O(P log M)."""

    name = "uniform"

    def assign(self, subscriptions, partitions, previous) -> Assignment:
        members = sorted(subscriptions)
        load = {m: 0 for m in members}
        owner: dict[tuple[str, int], str] = {}
        eligible = {topic: [m for m in members if topic in subscriptions[m]] for topic in partitions}
        all_partitions = [(t, p) for t in sorted(partitions) if eligible[t] for p in range(partitions[t])]
        if not members or not all_partitions:
            return {m: {} for m in members}
        alike = len({frozenset(subscriptions[m] & partitions.keys()) for m in members}) == 1
        if alike:  # each keeps at most its share: `share`, or one more for the first `extra` that can
            share, extra = divmod(len(all_partitions), len(members))
        else:  # each keeps at most the largest share; the balancing pass below evens out the rest
            share, extra = -(-len(all_partitions) // len(members)), 0
        for member in members:  # stickiness: previous partitions still valid, up to the member's share
            kept = [(topic, partition) for topic, owned in sorted((previous.get(member) or {}).items())
                    if topic in subscriptions[member] and topic in partitions
                    for partition in sorted(owned) if partition < partitions[topic]]
            limit = share + (1 if extra and len(kept) > share else 0)
            extra -= limit - share
            for key in kept:
                if load[member] < limit and key not in owner:
                    owner[key] = member
                    load[member] += 1
        for topic in sorted(partitions):  # the rest to the least loaded eligible member (a heap per topic)
            free = [(topic, p) for p in range(partitions[topic]) if (topic, p) not in owner] if eligible[topic] else []
            if not free:
                continue
            heap = [(load[m], m) for m in eligible[topic]]
            heapq.heapify(heap)
            for key in free:
                count, member = heapq.heappop(heap)
                owner[key] = member
                load[member] = count + 1
                heapq.heappush(heap, (count + 1, member))
        if not alike:
            self._balance(owner, load, eligible)
        result: Assignment = {m: {} for m in members}
        for (topic, partition), member in owner.items():
            result[member].setdefault(topic, set()).add(partition)
        return result

    @staticmethod
    def _balance(owner: dict[tuple[str, int], str], load: dict[str, int], eligible: dict[str, list[str]]) -> None:
        """Move partitions to less loaded eligible members while a move narrows a gap of two or more. Each move
        lowers the sum of squared loads, so the loop ends."""
        moved = True
        while moved:
            moved = False
            for key in sorted(owner, key=lambda k: (-load[owner[k]], k)):
                current = owner[key]
                target = min(eligible[key[0]], key=lambda m: (load[m], m))
                if load[current] - load[target] >= 2:
                    owner[key] = target
                    load[current] -= 1
                    load[target] += 1
                    moved = True


ASSIGNORS: dict[str, Assignor] = {a.name: a for a in (UniformAssignor(), RangeAssignor())}
