"""The task assignor of streams groups (KIP-1071): active tasks to members, sticky and balanced per subtopology,
in the spirit of Kafka's StickyTaskAssignor.

Each subtopology is assigned on its own, in id order: a member keeps the tasks of it that it had in the previous
target, up to its share (`tasks // members`); the rest (the remainder included) go one by one to the member with
the fewest tasks of that subtopology, then the fewest tasks in all, then its previous owner, then the smallest
id, so the remainders of subtopologies even out the members' totals. So every member runs part of every
subtopology (what Kafka's assignor aims at: a subtopology's load spread over the application's instances), and a
member that joins or leaves moves few tasks.

Where it differs from Kafka's: members are balanced one by one, where Kafka balances processes first (a process
with several stream threads is several members here); there are no standby tasks (num.standby.replicas is 0)
and no warm-up tasks, and rack or client tags play no part.

Invariants:
- Every task of every subtopology goes to exactly one member (none without members).
- Per subtopology, members' task counts differ by at most one.
- The result depends only on the inputs (members by id, subtopologies by id).
"""

from __future__ import annotations

from typing import Iterable, Mapping

# member id -> subtopology id -> partitions (task ids)
Assignment = dict[str, dict[str, set[int]]]


class StreamsTaskAssignor:
    name = "sticky"

    def assign(self, members: Iterable[str], tasks: Mapping[str, int],
               previous: Mapping[str, Mapping[str, set[int]]]) -> Assignment:
        """`tasks`: subtopology id -> its number of tasks; `previous`: the last target assignment."""
        ids = sorted(members)
        result: Assignment = {m: {} for m in ids}
        if not ids:
            return result
        load = {m: 0 for m in ids}
        for subtopology in sorted(tasks):
            count = tasks[subtopology]
            share = count // len(ids)
            owned: dict[str, set[int]] = {m: set() for m in ids}
            taken: set[int] = set()
            for member in ids:  # stickiness: what it had, up to its share
                kept = sorted(p for p in (previous.get(member) or {}).get(subtopology, ()) if 0 <= p < count)
                for partition in kept:
                    if len(owned[member]) < share and partition not in taken:
                        owned[member].add(partition)
                        taken.add(partition)
            for partition in range(count):  # the rest: fewest of this subtopology, then fewest in all
                if partition in taken:
                    continue
                had = {m for m in ids if partition in (previous.get(m) or {}).get(subtopology, ())}
                member = min(ids, key=lambda m: (len(owned[m]), load[m] + len(owned[m]), m not in had, m))
                owned[member].add(partition)
            for member, partitions in owned.items():
                if partitions:
                    result[member][subtopology] = partitions
                    load[member] += len(partitions)
        return result


TASK_ASSIGNOR = StreamsTaskAssignor()
