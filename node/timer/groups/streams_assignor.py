"""The task assignor of streams groups (KIP-1071): active tasks to members, sticky and balanced per subtopology,
in the spirit of Kafka's StickyTaskAssignor.

Each subtopology is assigned on its own, in id order: a member keeps the tasks of it that it had in the previous
target, up to its share (`tasks // members`); the rest (the remainder included) go one by one to the member with
the fewest tasks of that subtopology, then the fewest tasks in all, then its previous owner, then a member that
held it as standby (its state is warm: Kafka's second pass), then the smallest id, so the remainders of
subtopologies even out the members' totals. So every member runs part of every subtopology (what Kafka's
assignor aims at: a subtopology's load spread over the application's instances), and a member that joins or
leaves moves few tasks.

Standby tasks (the group's streams.num.standby.replicas > 0), as Kafka's assignStandby: each task of a stateful
subtopology (one with changelog topics) gets up to that many standby replicas, each on a process (an application
instance, its members being its stream threads) that holds the task neither as active nor as standby, so a
standby is never beside its active task. Tasks go in (partition, subtopology) order; for each, first the members
that held it as standby in the previous target (stickiness: their state is warm) while their process may take it
and they are below the even share of all tasks (active and standby, per member); the other replicas go to the
least loaded process that may take it (tasks per member, then the process id), to its member with the fewest
tasks (then the smallest id). With too few processes a task gets fewer replicas (Kafka logs a warning too).

Where it differs from Kafka's: active tasks are balanced member by member, where Kafka balances processes first
(a process with several stream threads is several members here); there are no warm-up tasks, and rack or client
tags play no part (Kafka's rack-aware standby placement).

Invariants:
- Every task of every subtopology goes to exactly one member as active (none without members).
- Per subtopology, members' active task counts differ by at most one.
- A standby task is only of a stateful subtopology, never on the process of the task's active member, and at most
  one replica of a task per process; a task has at most `replicas` standbys.
- The result depends only on the inputs (members by id, subtopologies by id).
"""

from __future__ import annotations

import logging
from typing import Iterable, Mapping

log = logging.getLogger("shmbroker.groups")

# member id -> subtopology id -> partitions (task ids)
Assignment = dict[str, dict[str, set[int]]]


class StreamsTaskAssignor:
    name = "sticky"

    def assign(self, members: Iterable[str], tasks: Mapping[str, int],
               previous: Mapping[str, Mapping[str, set[int]]],
               previous_standby: Mapping[str, Mapping[str, set[int]]] | None = None) -> Assignment:
        """`tasks`: subtopology id -> its number of tasks; `previous`: the last target assignment (its active
        tasks), `previous_standby` its standby tasks."""
        previous_standby = previous_standby or {}
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
                warm = {m for m in ids if partition in (previous_standby.get(m) or {}).get(subtopology, ())}
                member = min(ids, key=lambda m: (len(owned[m]), load[m] + len(owned[m]), m not in had,
                                                 m not in warm, m))
                owned[member].add(partition)
            for member, partitions in owned.items():
                if partitions:
                    result[member][subtopology] = partitions
                    load[member] += len(partitions)
        return result

    def assign_standbys(self, processes: Mapping[str, str], tasks: Mapping[str, int], stateful: Iterable[str],
                        replicas: int, active: Assignment,
                        previous: Mapping[str, Mapping[str, set[int]]]) -> Assignment:
        """Standby tasks (see the header). `processes`: member id -> its process id; `active`: this target's
        active tasks (assign()'s result); `previous`: the last target's standby tasks."""
        ids = sorted(processes)
        result: Assignment = {m: {} for m in ids}
        stateful_tasks = [(sub, p) for sub in sorted(set(stateful) & set(tasks)) for p in range(tasks[sub])]
        if replicas <= 0 or not ids or not stateful_tasks:
            return result
        load = {m: sum(len(parts) for parts in active.get(m, {}).values()) for m in ids}
        members_of: dict[str, list[str]] = {}
        for member in ids:
            members_of.setdefault(processes[member], []).append(member)
        holders: dict[tuple[str, int], set[str]] = {}  # task -> processes holding it (active or standby)
        for member in ids:
            for sub, partitions in active.get(member, {}).items():
                for p in partitions:
                    holders.setdefault((sub, p), set()).add(processes[member])
        total = sum(load.values()) + len(stateful_tasks) * replicas
        share = -(-total // len(ids))  # each member's even share of all tasks, rounded up

        def give(member: str, task: tuple[str, int]) -> None:
            result[member].setdefault(task[0], set()).add(task[1])
            holders.setdefault(task, set()).add(processes[member])
            load[member] += 1

        def process_load(process: str) -> tuple:
            members = members_of[process]
            return (sum(load[m] for m in members) / len(members), process)

        for task in sorted(stateful_tasks, key=lambda t: (t[1], t[0])):
            placed = 0
            for member in ids:  # stickiness: the previous target's standby members
                if (placed < replicas and task[1] in (previous.get(member) or {}).get(task[0], ())
                        and processes[member] not in holders.get(task, set()) and load[member] < share):
                    give(member, task)
                    placed += 1
            while placed < replicas:
                free = [p for p in members_of if p not in holders.get(task, set())]
                if not free:
                    log.warning("streams task %s_%d has %d of %d standby replicas: too few application instances",
                                task[0], task[1], placed, replicas)
                    break
                process = min(free, key=process_load)
                give(min(members_of[process], key=lambda m: (load[m], m)), task)
                placed += 1
        return result


TASK_ASSIGNOR = StreamsTaskAssignor()
