"""Offsets: resolving the options' starting and ending points on the node, cutting offset ranges into
Spark input partitions, and the streaming read limit.

- ``OffsetResolver`` turns an ``OffsetSpec`` (earliest, latest, per-partition JSON, timestamps) into one
  offset per topic-partition, with ListOffsets (by timestamp too), retried as fetchOffset.numRetries says.
- ``split_ranges`` gives one range per topic-partition, or more when minPartitions asks for more ranges
  than there are partitions (each range split in proportion to its size) or maxRecordsPerPartition caps
  a range's size.
- ``limit_offsets`` spreads a read limit (maxOffsetsPerTrigger) over the partitions in proportion to
  each one's backlog.

Invariants:
- Ranges are half open [start, end), never empty, and ``split_ranges`` covers exactly the offsets of its
  input ranges, each once, in order within a partition.
- ``limit_offsets`` never returns more than ``max_rows`` offsets beyond the start in total, nor an end
  past the latest offset, nor an end before the start.
- Streaming offsets are JSON-friendly dicts {"topic": {"partition": offset}}, Spark's Kafka layout.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, TypeVar

from pyspark_shmbroker import dependencies  # noqa: F401  (first: without them, an error saying what to do)
from pyspark_shmbroker.options import EARLIEST, LATEST, ConsumerSettings, OffsetSpec, OptionError, Subscription
from shmbroker.clients.wire import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    BrokerError,
    Connection,
    NodeUnavailable,
    TopicPartition,
    list_offsets,
    topic_partitions,
)

log = logging.getLogger("pyspark_shmbroker")
T = TypeVar("T")


class DataLossError(RuntimeError):
    """Offsets a query needs are gone from the node (retention deleted them, or the topic was recreated)."""


def data_loss_message(what: str) -> str:
    return (f"{what}. Some data may have been lost because it is not on the node any more: either retention "
            "deleted it or the topic was deleted (or recreated) before all its data was read. If you do not "
            "want the query to fail in such cases, set the source option 'failOnDataLoss' to 'false'.")


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets [start, end) of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        return self.end - self.start


def to_json_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def from_json_offsets(offsets: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {TopicPartition(topic, int(p)): int(o) for topic, parts in offsets.items() for p, o in parts.items()}


class OffsetResolver:
    """Asks the node where partitions start and end; one short-lived connection per call."""

    def __init__(self, settings: ConsumerSettings) -> None:
        self.settings = settings

    def _with_retries(self, what: str, call: Callable[[Connection], T]) -> T:
        settings = self.settings
        for attempt in range(settings.offset_retries + 1):
            try:
                with Connection(settings.servers, settings.request_timeout_ms / 1000, settings.client_id) as conn:
                    return call(conn)
            except (NodeUnavailable, BrokerError) as exc:
                retriable = isinstance(exc, NodeUnavailable) or exc.retriable
                if not retriable or attempt == settings.offset_retries:
                    raise
                log.warning("%s failed (%s); retry %d of %d", what, exc, attempt + 1, settings.offset_retries)
                time.sleep(settings.offset_retry_interval_ms / 1000)
        raise AssertionError("unreachable")

    def partitions(self, subscription: Subscription) -> list[TopicPartition]:
        """The partitions the subscription reads now. An assigned partition that does not exist fails."""
        available = self._with_retries("Metadata", lambda c: topic_partitions(c, subscription.topics_to_ask()))
        found = subscription.select(available)
        if subscription.kind == "assign":
            missing = [tp for tp in found if tp.partition >= available.get(tp.topic, 0)]
            if missing:
                tp = missing[0]
                have = available.get(tp.topic)
                where = f"topic {tp.topic!r} has {have} partitions" if have else f"topic {tp.topic!r} does not exist"
                raise OptionError(f"option 'assign': partition {tp} does not exist ({where})")
        return sorted(found)

    def list(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
        if not timestamps:
            return {}
        found = self._with_retries(
            "ListOffsets", lambda c: list_offsets(c, timestamps, self.settings.isolation_level))
        return {tp: (listed.offset, listed.timestamp) for tp, listed in found.items()}

    def earliest(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in self.list({tp: EARLIEST_TIMESTAMP for tp in partitions}).items()}

    def latest(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in self.list({tp: LATEST_TIMESTAMP for tp in partitions}).items()}

    def resolve(self, spec: OffsetSpec | None, default: str, partitions: list[TopicPartition], *,
                starting: bool, timestamp_strategy: str = "error") -> dict[TopicPartition, int]:
        """One offset per partition for `spec` (or `default`, "earliest" or "latest", when None)."""
        kind = spec.kind if spec is not None else default
        if kind == "earliest":
            return self.earliest(partitions)
        if kind == "latest":
            return self.latest(partitions)
        assert spec is not None
        if kind == "timestamp":
            wanted = {tp: spec.timestamp for tp in partitions}
        else:
            wanted = spec.as_dict()
            if set(wanted) != set(partitions):
                raise OptionError(
                    f"option '{spec.option}' must give every partition the query reads, and only those "
                    f"(use -2 for earliest, -1 for latest). Given: {sorted(map(str, wanted))}; "
                    f"read: {sorted(map(str, partitions))}")
        if kind == "offsets":
            special = {tp: (EARLIEST_TIMESTAMP if o == EARLIEST else LATEST_TIMESTAMP)
                       for tp, o in wanted.items() if o in (EARLIEST, LATEST)}
            listed = self.list(special)
            return {tp: (listed[tp][0] if tp in listed else o) for tp, o in wanted.items()}
        # By timestamp: the first offset whose record timestamp is at or after it.
        listed = self.list(wanted)
        unmatched = [tp for tp, (offset, _) in listed.items() if offset < 0]
        latest = self.latest(unmatched) if unmatched else {}
        if unmatched and starting and timestamp_strategy == "error":
            tp = unmatched[0]
            raise OptionError(
                f"option '{spec.option}': no record of {tp} has a timestamp at or after {wanted[tp]}, so there is "
                "no offset to start from; set 'startingOffsetsByTimestampStrategy' to 'latest' to start at the "
                "latest offset in that case")
        return {tp: (latest[tp] if offset < 0 else offset) for tp, (offset, _) in listed.items()}


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None = None,
                 max_records: int | None = None) -> list[OffsetRange]:
    """Non-empty ranges: one per input range, or more for minPartitions (in proportion to size) and
    maxRecordsPerPartition (no piece larger)."""
    ranges = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        parts = 1
        if min_partitions is not None and len(ranges) < min_partitions:
            parts = max(1, round(r.size / total * min_partitions))
        if max_records is not None:
            parts = max(parts, math.ceil(r.size / max_records))
        parts = min(parts, r.size)
        start = r.start
        for index in range(parts):
            # Integer shares; the last piece takes the rounding.
            end = r.start + (r.size * (index + 1)) // parts
            out.append(OffsetRange(r.topic, r.partition, start, end))
            start = end
    return out


def limit_offsets(start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
                  max_rows: int) -> dict[TopicPartition, int]:
    """End offsets that read at most `max_rows` offsets past `start` in all, shared in proportion to each
    partition's backlog (largest remainders get the leftover offsets). Every partition of `latest` must
    have a start."""
    backlog = {tp: max(0, latest[tp] - start[tp]) for tp in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    shares = {tp: max_rows * b // total for tp, b in backlog.items()}
    left = max_rows - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda tp: (-(max_rows * backlog[tp] % total), tp))
    for tp in by_remainder:
        if left == 0:
            break
        if shares[tp] < backlog[tp]:
            shares[tp] += 1
            left -= 1
    return {tp: max(start[tp], min(latest[tp], start[tp] + shares[tp])) for tp in latest}
