"""A streams group's topology (KIP-1071) and its configuration against the node's topics: how many tasks each
subtopology has, and which internal topics (changelogs, repartition topics) must exist with how many partitions.

A topology is what the first member of a Streams application sends when it joins: subtopologies, each reading
source topics (the user's) and repartition source topics (internal, written by other subtopologies), keeping
state in changelog topics (internal), with groups of topics that must be co-partitioned. Configuration (Kafka's
InternalTopicManager.configureTopics) decides, in this order:

1. every source topic exists, else status MISSING_SOURCE_TOPICS;
2. a repartition topic without a fixed partition count gets the largest partition count of the source topics
   (user or repartition) of the subtopologies writing to it, repeated until nothing changes; one still undecided
   is INCORRECTLY_PARTITIONED_TOPICS;
3. in each co-partition group the topics with a fixed count (user topics, fixed repartition topics) must agree,
   else INCORRECTLY_PARTITIONED_TOPICS; the group's flexible repartition topics take that count (or, with none
   fixed, the largest of theirs);
4. a subtopology has as many tasks as the largest partition count of its source and repartition source topics;
   its changelog topics have that many partitions;
5. an internal topic that exists with another partition count is INCORRECTLY_PARTITIONED_TOPICS; one that does
   not exist is to be created (MISSING_INTERNAL_TOPICS until it is).

Invariants:
- `configure` depends only on the topology and the partition counts it is given; a configuration is `ready`
  (tasks may be assigned) only when it has no status, and then every subtopology has at least one task.
- `validate` refuses (STREAMS_INVALID_TOPOLOGY, InvalidTopology) what can never be configured: a changelog
  with a partition count, a subtopology with no source, a co-partition index out of its lists, a subtopology id
  given twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

# The status codes of StreamsGroupHeartbeatResponse (Kafka's StreamsGroupHeartbeatResponse.Status).
STALE_TOPOLOGY = 0
MISSING_SOURCE_TOPICS = 1
INCORRECTLY_PARTITIONED_TOPICS = 2
MISSING_INTERNAL_TOPICS = 3
SHUTDOWN_APPLICATION = 4
ASSIGNMENT_DELAYED = 5


class InvalidTopology(Exception):
    """A topology no configuration can make work (STREAMS_INVALID_TOPOLOGY)."""


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int  # 0: decided by configuration
    replication_factor: int
    configs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Subtopology:
    subtopology_id: str
    source_topics: tuple[str, ...]
    changelog_topics: tuple[TopicInfo, ...]
    repartition_sink_topics: tuple[str, ...]
    repartition_source_topics: tuple[TopicInfo, ...]
    copartition_groups: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # (source indexes, repartition indexes)

    def copartitioned_topics(self) -> list[set[str]]:
        return [{self.source_topics[i] for i in sources} | {self.repartition_source_topics[i].name for i in repart}
                for sources, repart in self.copartition_groups]


@dataclass(frozen=True)
class Topology:
    """A topology as its members sent it; equality is content equality (a rejoining member's must match)."""

    epoch: int
    subtopologies: tuple[Subtopology, ...]

    @staticmethod
    def from_message(epoch: int, subtopologies: list) -> Topology:
        """From the heartbeat message's Subtopology records (shm.messages); InvalidTopology if it cannot work."""
        built = []
        for sub_id, sources, _regex, changelogs, sinks, repartitions, copartitions in subtopologies:
            built.append(Subtopology(
                str(sub_id), tuple(sources), tuple(_topic(t) for t in changelogs), tuple(sinks),
                tuple(_topic(t) for t in repartitions),
                tuple((tuple(int(i) for i in s), tuple(int(i) for i in r)) for s, _, r in copartitions)))
        topology = Topology(int(epoch), tuple(sorted(built, key=lambda s: s.subtopology_id)))
        topology.validate()
        return topology

    def validate(self) -> None:
        seen = set()
        for sub in self.subtopologies:
            if sub.subtopology_id in seen:
                raise InvalidTopology(f"Subtopology {sub.subtopology_id} is given twice.")
            seen.add(sub.subtopology_id)
            if not sub.source_topics and not sub.repartition_source_topics:
                raise InvalidTopology(f"Subtopology {sub.subtopology_id} has no source topics.")
            for topic in sub.changelog_topics:
                if topic.partitions != 0:
                    raise InvalidTopology(f"Changelog topic {topic.name} must have an undefined partition count, "
                                          f"but it is set to {topic.partitions}.")
            for topic in sub.repartition_source_topics:
                if topic.partitions < 0:
                    raise InvalidTopology(f"Repartition topic {topic.name} has a negative partition count.")
            for sources, repartitions in sub.copartition_groups:
                if any(not 0 <= i < len(sub.source_topics) for i in sources) or \
                        any(not 0 <= i < len(sub.repartition_source_topics) for i in repartitions):
                    raise InvalidTopology(f"Subtopology {sub.subtopology_id} has a co-partition group index out "
                                          "of its topics.")

    def internal_topics(self) -> list[TopicInfo]:
        return [t for sub in self.subtopologies for t in (*sub.repartition_source_topics, *sub.changelog_topics)]

    def to_json(self) -> list:
        return [self.epoch, [[s.subtopology_id, list(s.source_topics), [_topic_json(t) for t in s.changelog_topics],
                              list(s.repartition_sink_topics), [_topic_json(t) for t in s.repartition_source_topics],
                              [[list(a), list(b)] for a, b in s.copartition_groups]] for s in self.subtopologies]]

    @staticmethod
    def from_json(data: list) -> Topology:
        epoch, subs = data
        return Topology(int(epoch), tuple(Subtopology(
            str(i), tuple(src), tuple(_topic_from_json(t) for t in ch), tuple(sinks),
            tuple(_topic_from_json(t) for t in rep), tuple((tuple(a), tuple(b)) for a, b in cop))
            for i, src, ch, sinks, rep, cop in subs))


def _topic(record: tuple) -> TopicInfo:
    name, partitions, replication_factor, configs = record
    return TopicInfo(str(name), int(partitions), int(replication_factor), tuple((str(k), str(v)) for k, v in configs))


def _topic_json(topic: TopicInfo) -> list:
    return [topic.name, topic.partitions, topic.replication_factor, [list(kv) for kv in topic.configs]]


def _topic_from_json(data: list) -> TopicInfo:
    name, partitions, replication_factor, configs = data
    return TopicInfo(name, int(partitions), int(replication_factor), tuple((k, v) for k, v in configs))


@dataclass
class Configured:
    """A topology configured against the node's topics: `tasks` per subtopology when ready, else `status`."""

    status: tuple[int, str] | None = None
    tasks: dict[str, int] = field(default_factory=dict)
    to_create: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)  # name -> (partitions, configs)
    partitions: dict[str, int] = field(default_factory=dict)  # every topic's count, internal ones as decided
    unauthorized: bool = False  # `to_create` was not created: the member's principal may not create topics

    @property
    def ready(self) -> bool:
        return self.status is None


class TopicConfigurationError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def configure(topology: Topology, topics: Mapping[str, int]) -> Configured:
    """The topology against `topics` (name -> partition count of the node's topics)."""
    try:
        missing = sorted({t for sub in topology.subtopologies for t in sub.source_topics if t not in topics})
        if missing:
            raise TopicConfigurationError(MISSING_SOURCE_TOPICS, f"Source topics {_summary(missing)} are missing.")
        decided = _repartition_counts(topology, topics)
        _copartition(topology, topics, decided)
        counts = {**topics, **decided}  # internal topics as they should be; an existing one is checked below
        tasks = {sub.subtopology_id: max(counts[t] for t in
                                         (*sub.source_topics, *(r.name for r in sub.repartition_source_topics)))
                 for sub in topology.subtopologies}
        wanted: dict[str, tuple[int, dict[str, str]]] = {}
        for sub in topology.subtopologies:
            for topic in sub.repartition_source_topics:
                wanted[topic.name] = (decided[topic.name], dict(topic.configs))
            for topic in sub.changelog_topics:
                wanted[topic.name] = (tasks[sub.subtopology_id], dict(topic.configs))
        to_create = {}
        for name, (count, configs) in sorted(wanted.items()):
            if name in topics:
                if topics[name] != count:
                    raise TopicConfigurationError(INCORRECTLY_PARTITIONED_TOPICS, f"Existing topic {name} has "
                                                  f"different number of partitions: expected {count}, found "
                                                  f"{topics[name]}")
            else:
                to_create[name] = (count, configs)
            counts[name] = count
        if to_create:
            return Configured((MISSING_INTERNAL_TOPICS, f"Internal topics are missing: {_summary(to_create)}"),
                              tasks, to_create, counts)
        return Configured(None, tasks, {}, counts)
    except TopicConfigurationError as exc:
        return Configured((exc.status, str(exc)))


def _repartition_counts(topology: Topology, topics: Mapping[str, int]) -> dict[str, int]:
    """Kafka's RepartitionTopics.setup: a fixed count stays; a flexible one (0) takes the largest source count
    of the subtopologies writing to it, found by repeating until nothing changes (bounded by the topics)."""
    decided = {t.name: t.partitions for sub in topology.subtopologies for t in sub.repartition_source_topics
               if t.partitions > 0}
    flexible = {t.name for sub in topology.subtopologies for t in sub.repartition_source_topics
                if t.partitions == 0}
    for _ in range(len(flexible) + 1):
        changed = False
        for name in sorted(flexible - set(decided)):
            counts = []
            for sub in topology.subtopologies:
                if name not in sub.repartition_sink_topics:
                    continue
                for source in sub.source_topics:
                    counts.append(topics[source])
                for source in (r.name for r in sub.repartition_source_topics):
                    if source in decided:
                        counts.append(decided[source])
            if counts:
                decided[name] = max(counts)
                changed = True
        if not changed:
            break
    undecided = sorted(flexible - set(decided))
    if undecided:
        raise TopicConfigurationError(INCORRECTLY_PARTITIONED_TOPICS, "Cannot decide the number of partitions of "
                                      f"repartition topics {_summary(undecided)}.")
    return decided


def _copartition(topology: Topology, topics: Mapping[str, int], decided: dict[str, int]) -> None:
    """Kafka's CopartitionedTopicsEnforcer: fixed counts must agree; flexible repartition topics follow them."""
    fixed_repartition = {t.name for sub in topology.subtopologies for t in sub.repartition_source_topics
                         if t.partitions > 0}
    repartition = {t.name for sub in topology.subtopologies for t in sub.repartition_source_topics}
    for sub in topology.subtopologies:
        for group in sub.copartitioned_topics():
            fixed = {t: decided[t] if t in repartition else topics[t] for t in sorted(group)
                     if t not in repartition or t in fixed_repartition}
            if len(set(fixed.values())) > 1:
                raise TopicConfigurationError(INCORRECTLY_PARTITIONED_TOPICS, "Following topics do not have the "
                                              f"same number of partitions: {dict(sorted(fixed.items()))}")
            flexible = [t for t in group if t not in fixed]
            if not flexible:
                continue
            count = next(iter(fixed.values())) if fixed else max(decided[t] for t in flexible)
            for topic in flexible:
                decided[topic] = count


def _summary(names) -> str:
    names = sorted(names)
    shown = ", ".join(names[:3])
    return shown if len(names) <= 3 else f"{shown} and {len(names) - 3} more"
