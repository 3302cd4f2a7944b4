"""The priority-aware Fetch: a Fetch that covers two or more levels of one priority topic (T.p0 ... T.p{L-1},
the highest level last) fills its max_bytes budget across those levels as the capacity-burst priority
consumer splits its records, so a plain consumer assigned to every level drains high priority first
without starving low priority.

How a family's budget is filled (`grant`):
1. Every partition of the family is read up to its partition_max_bytes (and the whole budget): what it has.
2. The budget is split across the levels present exponentially, each level twice the one below (levels 0, 1,
   2 of 50 kB: 7, 14, 29 kB; the remainder to the highest level).
3. A level that has less than its share keeps what it has and lends the rest; the lent bytes go to the levels
   that have more than their share, the highest first (the burst rule: give way to higher priorities). So a
   lone backlog still gets the whole budget.
4. Within a level, partitions take its grant in request order, and every partition with data gets at least
   one whole batch even past the budget (KIP-74, for every partition rather than only the first: no level
   starves, however small max_bytes is).

Partitions outside any family are read as Kafka reads them, in request order from what budget is left when
they come; a family is read where its first topic comes in the request.

Invariants: the grants of a family add up to at most the family's budget; no level gets less than
min(its share, what it has); no level gets more than what it has (beyond the one-batch rule).
"""

from __future__ import annotations

import re
from typing import Any

_LEVEL_TOPIC = re.compile(r"^(?P<family>.+)\.p(?P<level>\d+)$")


class LevelNames:
    """topic name -> (priority topic, level) or None, remembered (the node's topics are few, requests many)."""

    def __init__(self, max_levels: int, max_remembered: int) -> None:
        self.max_levels = max_levels
        self.max_remembered = max_remembered  # a client naming endless topics cannot grow this without bound
        self._known: dict[str, tuple[str, int] | None] = {}

    def of(self, name: str | None) -> tuple[str, int] | None:
        """None also for no name (a topic asked for by an unknown topic id)."""
        try:
            return self._known[name]
        except KeyError:
            pass
        match = _LEVEL_TOPIC.match(name) if name else None
        level = (match["family"], int(match["level"])) if match and int(match["level"]) < self.max_levels else None
        if len(self._known) >= self.max_remembered:
            self._known.clear()
        self._known[name] = level
        return level

    def families(self, topics: list[Any]) -> dict[str, list[int]] | None:
        """{priority topic: indices of the request's topics at its levels} for those with two or more levels
        in `topics` (objects with a .topic name); None when there is none (the plain path)."""
        seen: dict[str, list[int]] = {}
        levels: dict[str, set[int]] = {}
        for index, topic in enumerate(topics):
            level = self.of(topic.topic)
            if level is not None:
                seen.setdefault(level[0], []).append(index)
                levels.setdefault(level[0], set()).add(level[1])
        found = {family: indices for family, indices in seen.items() if len(levels[family]) > 1}
        return found or None


def exponential_split(budget: int, levels: list[int]) -> dict[int, int]:
    """`budget` across `levels` (level numbers) with weights 2^level; the remainder to the highest level."""
    weights = sum(1 << level for level in levels)
    shares = {level: budget * (1 << level) // weights for level in levels}
    shares[max(levels)] += budget - sum(shares.values())
    return shares


def grant(budget: int, available: dict[int, int]) -> dict[int, int]:
    """Bytes each level reads of `budget`, given what each has (steps 2 and 3 of the module docstring)."""
    shares = exponential_split(budget, list(available))
    granted = {level: min(shares[level], available[level]) for level in available}
    spare = budget - sum(granted.values())
    for level in sorted(available, reverse=True):
        if spare <= 0:
            break
        extra = min(spare, available[level] - granted[level])
        granted[level] += extra
        spare -= extra
    return granted
