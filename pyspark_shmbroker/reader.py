"""Reading topics: the batch and streaming readers and the fetch loop their tasks run.

A query's offsets are resolved on the driver (``OffsetResolver``), cut into ``RangePartition``s (one per
topic-partition offset range, more with minPartitions / maxRecordsPerPartition), and each Spark task
runs ``read_range``: one connection, opened inside the task, fetching [start, end) in order. Each fetch
answer becomes one Arrow RecordBatch (``records.decode_record_set``); the next fetch is sent before the
current answer is decoded, so the node serves it meanwhile.

Streaming keeps offsets per topic-partition ({"topic": {"partition": offset}}, Spark's Kafka layout) in
Spark's checkpoint. ``latestOffset(start, limit)`` honours the read limit (maxOffsetsPerTrigger as
ReadMaxRows, minOffsetsPerTrigger with maxTriggerDelay as ReadMinRows); Trigger.AvailableNow reads up to
the offsets latest when the query started; partitions that appear later are read from their earliest
offset, as Spark's Kafka source does.

Invariants:
- Readers and partitions hold options and offsets only: they pickle, and no connection outlives a call.
- A range yields each record of [start, end) that the node still has exactly once, in offset order, and
  nothing outside it. Re-planning the same (start, end) after a restart yields the same records, which is
  what makes a restart from a checkpoint lose and repeat nothing.
- Offsets a range needs that the node no longer has are data loss: with failOnDataLoss (the default)
  the task fails with a message naming the partition and offsets; without, it logs a warning and reads
  what is left.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from pyspark_shmbroker import dependencies  # noqa: F401  (first: without them, an error saying what to do)
import pyarrow as pa
from kio.schema.errors import ErrorCode
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from pyspark_shmbroker.offsets import (
    DataLossError,
    OffsetRange,
    OffsetResolver,
    data_loss_message,
    from_json_offsets,
    limit_offsets,
    split_ranges,
    to_json_offsets,
)
from pyspark_shmbroker.options import SourceOptions
from shmbroker.node.storage.records import iter_batches
from pyspark_shmbroker.records import decode_record_set
from shmbroker.clients.wire import (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, BrokerError, Connection, TopicPartition,
                                   fetch_request, list_offsets)

log = logging.getLogger("pyspark_shmbroker")


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Spark input partition: offsets [start, end) of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def range(self) -> OffsetRange:
        return OffsetRange(self.topic, self.partition, self.start, self.end)


def _partitions_of(ranges: Sequence[OffsetRange]) -> list[InputPartition]:
    return [RangePartition(r.topic, r.partition, r.start, r.end) for r in ranges]


def _next_offset(records: memoryview) -> int | None:
    """One past the last whole batch of a fetched record set (None when there is no whole batch):
    headers only, so the next fetch can go out before this one is decoded."""
    found = None
    for _, header in iter_batches(records):
        found = header.last_offset + 1
    return found


def read_range(options: SourceOptions, offsets: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The records of `offsets`, one Arrow RecordBatch per fetch answer that has any."""
    settings = options.consumer
    tp = offsets.tp
    offset, end = offsets.start, offsets.end

    def fetch(at: int) -> Any:
        return fetch_request({tp: at}, max_wait_ms=settings.fetch_max_wait_ms, min_bytes=1,
                             max_bytes=settings.fetch_max_bytes,
                             partition_max_bytes=settings.max_partition_fetch_bytes,
                             isolation_level=settings.isolation_level)

    timeout_s = (settings.request_timeout_ms + settings.fetch_max_wait_ms) / 1000
    patience_s = settings.poll_timeout_ms / 1000
    with Connection(settings.servers, timeout_s, settings.client_id) as conn:
        conn.send(fetch(offset))
        stalled_since = time.monotonic()
        while offset < end:
            part = conn.receive_fetch().partition(tp)
            if part is None:
                raise BrokerError(ErrorCode.unknown_server_error, f"Fetch of {tp}", "the answer lacks the partition")
            if part.error_code == ErrorCode.offset_out_of_range:
                # The answer's offsets are -1 (as Kafka's): ask where the log starts and ends now.
                log_start = list_offsets(conn, {tp: EARLIEST_TIMESTAMP})[tp].offset
                high_watermark = list_offsets(conn, {tp: LATEST_TIMESTAMP})[tp].offset
                offset = _out_of_range(options, tp, offset, end, log_start, high_watermark)
                if offset >= end:
                    return
                conn.send(fetch(offset))
                continue
            if part.error_code != ErrorCode.none:
                error = BrokerError(part.error_code, f"Fetch of {tp} at offset {offset}")
                if not error.retriable or time.monotonic() - stalled_since > patience_s:
                    raise error
                time.sleep(settings.retry_backoff_ms / 1000)
                conn.send(fetch(offset))
                continue
            following = _next_offset(part.records)
            if following is None:
                # Nothing at `offset`. Past the log end the records the range promised are gone;
                # otherwise wait (the fetch itself long-polls) up to kafkaConsumer.pollTimeoutMs.
                if part.high_watermark <= offset:
                    _lost(options, f"Cannot fetch offsets [{offset}, {end}) of {tp}: the node's log of it ends at "
                                   f"{part.high_watermark}")
                    return
                if time.monotonic() - stalled_since > patience_s:
                    raise TimeoutError(f"no record of {tp} at offset {offset} within kafkaConsumer.pollTimeoutMs "
                                       f"({settings.poll_timeout_ms} ms)")
                conn.send(fetch(offset))
                continue
            if following < end:
                conn.send(fetch(following))  # the node serves it while this answer is decoded
            decoded = decode_record_set(part.records, tp.topic, tp.partition, keep_from=offset, keep_until=end,
                                        include_headers=options.include_headers, check_crc=settings.check_crcs,
                                        buffer=part.buffer, records_at=part.records_at,
                                        aborted_transactions=part.aborted_transactions)
            if decoded.batch is not None:
                yield decoded.batch
            offset = following
            stalled_since = time.monotonic()


def _lost(options: SourceOptions, what: str) -> None:
    if options.fail_on_data_loss:
        raise DataLossError(data_loss_message(what))
    log.warning("%s; failOnDataLoss is false, so the query goes on without them", what)


def _out_of_range(options: SourceOptions, tp: TopicPartition, offset: int, end: int, log_start: int,
                  high_watermark: int) -> int:
    """Where a read goes on after OFFSET_OUT_OF_RANGE at `offset` (or raises DataLossError)."""
    if 0 <= log_start and offset < log_start:
        _lost(options, f"Cannot fetch offset {offset} of {tp}: the node's log of it starts at {log_start}, so "
                       f"offsets [{offset}, {min(log_start, end)}) are gone")
        return log_start
    _lost(options, f"Cannot fetch offsets [{offset}, {end}) of {tp}: the node's log of it ends at {high_watermark}")
    return end


def rows_of(batch: pa.RecordBatch) -> Iterator[tuple]:
    """The row-tuple path (useArrow=false): the same records as Python tuples."""
    columns = [column.to_pylist() for column in batch.columns]
    if batch.num_columns > 7:  # headers: a list of (key, value) tuples rather than dicts
        columns[7] = [[(h["key"], h["value"]) for h in headers] for headers in columns[7]]
    return zip(*columns)


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[Any]:
    if not isinstance(partition, RangePartition):  # Spark's placeholder when there is nothing to read
        return
    for batch in read_range(options, partition.range):
        if options.use_arrow:
            yield batch
        else:
            yield from rows_of(batch)


class BatchReader(DataSourceReader):
    """spark.read: offsets resolved when the query is planned, one partition per offset range."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def plan(self) -> list[OffsetRange]:
        options = self.options
        resolver = OffsetResolver(options.consumer)
        partitions = resolver.partitions(options.subscription)
        if not partitions:
            log.warning("%s matches no partition on the node: the result is empty", options.subscription.describe())
        start = resolver.resolve(options.starting, "earliest", partitions, starting=True,
                                 timestamp_strategy=options.timestamp_strategy)
        end = resolver.resolve(options.ending, "latest", partitions, starting=False)
        ranges = []
        for tp in partitions:
            if start[tp] > end[tp]:
                raise ValueError(f"the starting offset of {tp} ({start[tp]}) is after its ending offset ({end[tp]}); "
                                 "check startingOffsets / endingOffsets (or their by-timestamp forms)")
            ranges.append(OffsetRange(tp.topic, tp.partition, start[tp], end[tp]))
        return split_ranges(ranges, options.min_partitions, options.max_records_per_partition)

    def partitions(self) -> list[InputPartition]:
        return _partitions_of(self.plan())

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """spark.readStream: offsets per topic-partition, read limits, Trigger.AvailableNow."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.available_now: dict[TopicPartition, int] | None = None  # the target of Trigger.AvailableNow
        self.last_trigger = time.monotonic()  # when a micro-batch last got new offsets (maxTriggerDelay)
        self.latest_seen: dict[TopicPartition, int] | None = None

    def _resolver(self) -> OffsetResolver:
        return OffsetResolver(self.options.consumer)

    def initialOffset(self) -> dict:
        options = self.options
        resolver = self._resolver()
        partitions = resolver.partitions(options.subscription)
        offsets = resolver.resolve(options.starting, "latest", partitions, starting=True,
                                   timestamp_strategy=options.timestamp_strategy)
        return to_json_offsets(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        resolver = self._resolver()
        self.available_now = resolver.latest(resolver.partitions(self.options.subscription))
        log.info("Trigger.AvailableNow reads up to %s", to_json_offsets(self.available_now))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        resolver = self._resolver()
        begin = from_json_offsets(start)
        if self.available_now is not None:
            latest = dict(self.available_now)
        else:
            latest = resolver.latest(resolver.partitions(self.options.subscription))
        self.latest_seen = latest
        gone = sorted(set(begin) - set(latest))
        if gone and self.available_now is None:
            _lost(self.options, f"partitions {', '.join(map(str, gone))} are gone from the node")
        new = [tp for tp in latest if tp not in begin]
        begin.update(resolver.earliest(new))
        # A partition whose latest offset went back (a recreated topic) ends this micro-batch there:
        # partitions() reports the loss (or skips it), and the next one starts from the new offsets.
        went_back = [tp for tp in latest if latest[tp] < begin[tp]]
        for tp in went_back:
            begin[tp] = latest[tp]
        end = self._limited(begin, latest, limit)
        if all(end[tp] == begin[tp] for tp in end) and not new and not gone and not went_back:
            return start
        self.last_trigger = time.monotonic()
        return to_json_offsets(end)

    def _limited(self, begin: dict[TopicPartition, int], latest: dict[TopicPartition, int],
                 limit: ReadLimit) -> dict[TopicPartition, int]:
        if isinstance(limit, ReadAllAvailable):
            return latest
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else self.options.min_offsets_per_trigger
        if min_rows is not None and self.available_now is None:
            # minOffsetsPerTrigger: wait for that many new offsets, at most maxTriggerDelay.
            available = sum(latest[tp] - begin[tp] for tp in latest)
            waited_ms = (time.monotonic() - self.last_trigger) * 1000
            if available < min_rows and waited_ms < self.options.max_trigger_delay_ms:
                return dict(begin)
        if max_rows is None:
            return latest
        return limit_offsets(begin, latest, max_rows)

    def reportLatestOffset(self) -> dict | None:
        return to_json_offsets(self.latest_seen) if self.latest_seen is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, finish = from_json_offsets(start), from_json_offsets(end)
        new = [tp for tp in finish if tp not in begin]
        if new:
            begin.update(self._resolver().earliest(new))
        ranges = []
        for tp, until in sorted(finish.items()):
            if until < begin[tp]:
                _lost(self.options, f"the offsets of {tp} went back from {begin[tp]} to {until} (was the topic "
                                    "recreated?)")
                continue
            ranges.append(OffsetRange(tp.topic, tp.partition, begin[tp], until))
        return _partitions_of(split_ranges(ranges, self.options.min_partitions,
                                           self.options.max_records_per_partition))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.options, partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint; nothing is committed to a consumer group."""
