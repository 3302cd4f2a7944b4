"""Priority topics on any Kafka-compatible broker, built on confluent-kafka: a producer that routes records
by priority and the capacity-burst priority consumer (the design of flipkart-incubator's
priority-kafka-client, KIP-349's use case).

Naming. A logical priority topic `T` with `L` levels is the family of ordinary topics `T.p0` ... `T.p{L-1}`;
level L-1 is the highest. Anyone may produce to a level topic directly; `PriorityProducer` only names it.

The consumer. `CapacityBurstPriorityConsumer` keeps one confluent-kafka consumer per level, all in the
caller's group (each subscribed to its level's topics), and splits `max_poll_records` across levels
exponentially, each level twice the one below: floor(N x 2^i / (2^L - 1)), the remainder to the highest
level (3 levels, 50 records: {2: 29, 1: 14, 0: 7}). A poll takes up to its capacity from each level, highest
first, and returns them together: with a backlog everywhere, high priority gets most of the throughput and
low priority still moves.

Capacity burst. Fixed shares waste capacity when a level has little to do, so each level keeps a window of
its last `window_size` poll counts (default 6). A level is *maxed out* when at least `maxout_threshold` of
them (default 4) reached its share: it has more waiting. Before a poll, the highest maxed-out level bursts:
it takes, from every other level, that level's unused share over the whole window (share - the most it got
in any poll of the window, if positive). Lower maxed-out levels wait their turn (give way to higher
priorities). Worked cases (3 levels, 50 records):
- windows 2: [29]*6, 1: [10, 10, 7, 10, 9, 0], 0: [7]*6 -> level 2 polls 29 + (14 - 10) = 33;
- windows 2: [20, 25, 25, 20, 15, 10], 1: as above, 0: [7]*6 -> level 2 and 1 are not maxed out, level 0 is:
  7 + (29 - 25) + (14 - 10) = 15.

Invariants: the shares add up to max_poll_records; only one level bursts per poll; a burst never takes from a
level that came near its share within the window.
"""

from __future__ import annotations

import re
import time
from collections import deque
from typing import Any

LEVEL_SUFFIX = ".p"
_LEVEL_TOPIC = re.compile(r"^(?P<topic>.+)\.p(?P<level>\d+)$")
DEFAULT_WINDOW_SIZE = 6
DEFAULT_MAXOUT_THRESHOLD = 4
IDLE_WAIT_S = 0.005  # between rounds of a poll that found nothing yet


def level_topic(topic: str, level: int) -> str:
    """The ordinary topic that holds level `level` of the priority topic `topic`."""
    return f"{topic}{LEVEL_SUFFIX}{level}"


def level_of(name: str) -> tuple[str, int] | None:
    """(priority topic, level) of a level topic's name, or None for any other topic."""
    match = _LEVEL_TOPIC.match(name)
    return (match["topic"], int(match["level"])) if match else None


def exponential_shares(levels: int, total: int) -> dict[int, int]:
    """`total` split across `levels` levels, each twice the one below; the remainder goes to the highest."""
    weights = (1 << levels) - 1
    if levels < 1 or total < weights:
        raise ValueError(f"{total} cannot be split across {levels} levels: at least {weights} needed")
    shares = {level: total * (1 << level) // weights for level in range(levels)}
    shares[levels - 1] += total - sum(shares.values())
    return shares


class PollWindow:
    """The last `size` poll counts of one level, judged against its share."""

    def __init__(self, size: int, maxout_threshold: int, share: int) -> None:
        if not 0 < maxout_threshold <= size:
            raise ValueError("maxout_threshold must be in 1..window size")
        self.share = share
        self.maxout_threshold = maxout_threshold
        self.counts: deque[int] = deque([0] * size, maxlen=size)

    def add(self, count: int) -> None:
        self.counts.append(count)

    @property
    def maxed_out(self) -> bool:
        """At least maxout_threshold polls of the window got the whole share: more is waiting."""
        return sum(count >= self.share for count in self.counts) >= self.maxout_threshold

    def unused(self) -> int:
        """The share this level did not need in any poll of the window."""
        return max(0, self.share - max(self.counts))


class CapacityBurst:
    """The split and the burst rule, apart from any client: capacities() before a poll, record() after."""

    def __init__(self, levels: int, max_poll_records: int, window_size: int = DEFAULT_WINDOW_SIZE,
                 maxout_threshold: int = DEFAULT_MAXOUT_THRESHOLD) -> None:
        self.levels = levels
        self.shares = exponential_shares(levels, max_poll_records)
        self.windows = {level: PollWindow(window_size, maxout_threshold, share)
                        for level, share in self.shares.items()}

    def burst_level(self) -> int | None:
        """The highest maxed-out level, or None."""
        return next((level for level in range(self.levels - 1, -1, -1) if self.windows[level].maxed_out), None)

    def capacities(self) -> dict[int, int]:
        capacities = dict(self.shares)
        bursting = self.burst_level()
        if bursting is not None:
            capacities[bursting] += sum(window.unused() for level, window in self.windows.items() if level != bursting)
        return capacities

    def record(self, counts: dict[int, int]) -> None:
        for level, window in self.windows.items():
            window.add(counts.get(level, 0))


class PriorityProducer:
    """A confluent-kafka Producer that sends a record of priority p of topic T to T.p{p}."""

    def __init__(self, config: dict[str, Any], levels: int) -> None:
        from confluent_kafka import Producer

        if levels < 1:
            raise ValueError("a priority topic has at least one level")
        self.levels = levels
        self.producer = Producer(config)

    def produce(self, topic: str, value: Any = None, key: Any = None, priority: int = 0, **kwargs: Any) -> None:
        if not 0 <= priority < self.levels:
            raise ValueError(f"priority {priority} outside 0..{self.levels - 1}")
        self.producer.produce(level_topic(topic, priority), value=value, key=key, **kwargs)

    def poll(self, timeout: float = 0) -> int:
        return self.producer.poll(timeout)

    def flush(self, timeout: float = -1) -> int:
        return self.producer.flush(timeout)

    def __len__(self) -> int:
        return len(self.producer)


class CapacityBurstPriorityConsumer:
    """One confluent-kafka Consumer per level, in the caller's group; poll() returns up to max_poll_records
    records across levels, split and burst as the module docstring says (highest level first)."""

    def __init__(self, config: dict[str, Any], levels: int, max_poll_records: int,
                 window_size: int = DEFAULT_WINDOW_SIZE, maxout_threshold: int = DEFAULT_MAXOUT_THRESHOLD,
                 idle_wait_s: float = IDLE_WAIT_S) -> None:
        from confluent_kafka import Consumer

        if "group.id" not in config:
            raise ValueError("a priority consumer needs group.id")
        self.burst = CapacityBurst(levels, max_poll_records, window_size, maxout_threshold)
        self.levels = levels
        self.idle_wait_s = idle_wait_s
        client_id = config.get("client.id", "priority-consumer")
        self.consumers = {level: Consumer({**config, "client.id": f"{client_id}{LEVEL_SUFFIX}{level}"})
                          for level in range(levels)}

    def subscribe(self, topics: list[str], **kwargs: Any) -> None:
        """Subscribe to priority topics by their logical names: each level's consumer to its level topics."""
        for level, consumer in self.consumers.items():
            consumer.subscribe([level_topic(topic, level) for topic in topics], **kwargs)

    def poll(self, timeout: float = 1.0) -> list:
        """Records (confluent-kafka Messages, errors included) from the highest level down, at most the
        levels' capacities; waits up to `timeout` seconds for the first."""
        capacities = self.burst.capacities()
        deadline = time.monotonic() + timeout
        while True:
            records: list = []
            counts: dict[int, int] = {}
            for level in range(self.levels - 1, -1, -1):
                messages = self.consumers[level].consume(num_messages=capacities[level], timeout=0)
                counts[level] = sum(1 for message in messages if message.error() is None)
                records.extend(messages)
            remaining = deadline - time.monotonic()
            if records or remaining <= 0:
                break
            time.sleep(min(self.idle_wait_s, remaining))
        self.burst.record(counts)
        return records

    def commit(self, asynchronous: bool = False) -> None:
        """Commit every level's consumed positions (levels that consumed nothing yet are skipped)."""
        from confluent_kafka import KafkaError, KafkaException

        for consumer in self.consumers.values():
            try:
                consumer.commit(asynchronous=asynchronous)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._NO_OFFSET:
                    raise

    def assignment(self) -> list:
        return [partition for consumer in self.consumers.values() for partition in consumer.assignment()]

    def close(self) -> None:
        for consumer in self.consumers.values():
            consumer.close()

    def __enter__(self) -> "CapacityBurstPriorityConsumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
