"""Writing DataFrames to topics: df.write.format("shmbroker") and writeStream.

Columns, as in Spark's Kafka sink: ``value`` (binary or string, required), ``key`` (binary or string),
``topic`` (string; the ``topic`` option overrides it), ``partition`` (int) and ``headers``
(array<struct<key string, value binary>>); other columns are ignored, as Spark's Kafka sink does. The
columns are checked on the driver when the write is planned; each task then routes its rows to
topic-partitions (producer.py's partitioner), encodes them into batches and sends them with its own
idempotent producer, and returns what the node acknowledged. The driver's commit reports the rows
written (logger "pyspark_shmbroker" at INFO: visible with spark.sql.pyspark.worker.logging.enabled in
spark.tvf.python_worker_logs(), or wherever Python logging is configured).

Two paths: Arrow (default; DataSourceArrowWriter: Spark hands over Arrow batches, nothing is converted
row by row) and rows (useArrow=false: DataSourceWriter with Spark Rows, gathered into Arrow batches of
``ROW_CHUNK`` rows), kept as the benchmark's baseline.

Invariants:
- A task's write returns only after every row it was given is acknowledged by the node (acks=all);
  otherwise it raises, Spark retries the task, and the rows may then be written twice: at least once.
- Rows of one task and one topic-partition are written in the order the task received them.
- Missing or mistyped columns fail on the driver before any row is written, naming the column.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from pyspark_shmbroker import dependencies  # noqa: F401  (first: without them, an error saying what to do)
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from pyspark_shmbroker.options import SinkOptions
from pyspark_shmbroker.producer import CODECS, IdempotentProducer, WriteError, encode_partition, murmur2
from shmbroker.clients.wire import TopicPartition

log = logging.getLogger("pyspark_shmbroker")
ROW_CHUNK = 8192
_PAYLOAD = (BinaryType, StringType)


@dataclass(frozen=True)
class SinkColumns:
    """Which of the sink's columns the DataFrame has (checked on the driver)."""

    key: bool
    topic: bool
    partition: bool
    headers: bool
    arrow_types: tuple[tuple[str, Any], ...] = ()  # for the row path

    @classmethod
    def check(cls, schema: StructType, options: SinkOptions) -> SinkColumns:
        fields = {f.name: f.dataType for f in schema.fields}
        names = ", ".join(fields) or "none"
        if "value" not in fields:
            raise WriteError(f"the DataFrame written to shmbroker has no 'value' column (required, binary or "
                             f"string); its columns: {names}")
        for name in ("value", "key"):
            if name in fields and not isinstance(fields[name], _PAYLOAD):
                raise WriteError(f"column '{name}' must be binary or string, not {fields[name].simpleString()}")
        if "topic" in fields and not isinstance(fields["topic"], StringType):
            raise WriteError(f"column 'topic' must be a string, not {fields['topic'].simpleString()}")
        if "topic" not in fields and options.topic is None:
            raise WriteError("no topic to write to: set the option 'topic' or give the DataFrame a string "
                             "column 'topic'")
        if "partition" in fields and not isinstance(fields["partition"], IntegerType):
            raise WriteError(f"column 'partition' must be an int, not {fields['partition'].simpleString()}")
        if "headers" in fields:
            headers = fields["headers"]
            element = headers.elementType if isinstance(headers, ArrayType) else None
            if not (isinstance(element, StructType) and [f.name for f in element.fields] == ["key", "value"]
                    and isinstance(element["key"].dataType, StringType)
                    and isinstance(element["value"].dataType, _PAYLOAD)):
                raise WriteError("column 'headers' must be array<struct<key: string, value: binary>>, not "
                                 f"{headers.simpleString()}")
        from pyspark.sql.pandas.types import to_arrow_type

        used = [n for n in ("key", "value", "topic", "partition", "headers") if n in fields]
        return cls(key="key" in fields, topic="topic" in fields, partition="partition" in fields,
                   headers="headers" in fields,
                   arrow_types=tuple((n, to_arrow_type(fields[n], timezone="UTC")) for n in used))


@dataclass
class WriteCommit(WriterCommitMessage):
    """What one task wrote: {"topic-partition": [records, first offset, last offset]}."""

    rows: int
    partitions: dict[str, list] = field(default_factory=dict)
    producer_id: int = -1
    seconds: float = 0.0


def report(messages: list, batch_id: int | None = None) -> dict[str, Any]:
    """Sum the tasks' commit messages and log the rows written; returns the summary."""
    done = [m for m in messages if isinstance(m, WriteCommit)]
    per_topic: dict[str, int] = {}
    for message in done:
        for name, (records, _, _) in message.partitions.items():
            topic = name.rsplit("-", 1)[0]
            per_topic[topic] = per_topic.get(topic, 0) + records
    summary = {"rows": sum(m.rows for m in done), "tasks": len(done), "topics": per_topic}
    where = f" (micro-batch {batch_id})" if batch_id is not None else ""
    log.info("shmbroker sink: wrote %d rows%s in %d tasks: %s", summary["rows"], where, summary["tasks"],
             ", ".join(f"{t} {n}" for t, n in sorted(per_topic.items())) or "no rows")
    return summary


def _log_abort(messages: list, batch_id: int | None = None) -> None:
    done = [m for m in messages if isinstance(m, WriteCommit)]
    where = f"micro-batch {batch_id}" if batch_id is not None else "write"
    log.warning("shmbroker sink: %s aborted; the %d rows of its %d finished tasks stay written (a retry writes "
                "them again: at least once)", where, sum(m.rows for m in done), len(done))


class _TaskWriter:
    """Routes, encodes and produces one task's Arrow batches."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns
        self.codec = CODECS[options.producer.compression]
        self.sticky: dict[str, int] = {}  # keyless records: the partition of the current batch, per topic

    def write(self, batches: Iterator[pa.RecordBatch]) -> WriteCommit:
        started = time.monotonic()
        producer = IdempotentProducer(self.options.producer)
        rows = 0
        try:
            for batch in batches:
                if batch.num_rows:
                    producer.add(self._encode(batch, producer))
                    rows += batch.num_rows
            producer.flush()
            written = producer.written()
        finally:
            producer.close()
        acked = sum(n for n, _, _ in written.values())
        if acked != rows:
            raise WriteError(f"{rows} rows given but {acked} acknowledged")
        return WriteCommit(rows, {str(tp): [n, first, last] for tp, (n, first, last) in sorted(written.items())},
                           producer.producer_id, round(time.monotonic() - started, 3))

    def _encode(self, batch: pa.RecordBatch, producer: IdempotentProducer) -> list:
        n = batch.num_rows
        names = batch.schema.names
        keys = batch.column(names.index("key")) if self.columns.key else None
        values = batch.column(names.index("value"))
        headers = batch.column(names.index("headers")) if self.columns.headers else None
        now_ms = time.time_ns() // 1_000_000
        encoded = []
        for tp, rows in self._route(batch, keys, producer).items():
            if rows is None:
                part_keys, part_values, part_headers = keys, values, headers
            else:
                take = pa.array(rows)
                part_keys = keys.take(take) if keys is not None else None
                part_values = values.take(take)
                part_headers = headers.take(take) if headers is not None else None
            encoded.extend(encode_partition(tp, part_keys, part_values, part_headers, self.options.producer.batch_bytes,
                                            self.codec, now_ms))
        return encoded

    def _route(self, batch: pa.RecordBatch, keys: pa.Array | None,
               producer: IdempotentProducer) -> dict[TopicPartition, np.ndarray | None]:
        """{topic-partition: row indices in order} (None: all rows, in order)."""
        n = batch.num_rows
        names = batch.schema.names
        if self.options.topic is not None:
            groups = [(self.options.topic, None)]
        else:
            topics = batch.column(names.index("topic"))
            if topics.null_count:
                raise WriteError("a row has a null topic: give every row a topic, or set the option 'topic'")
            encoded = pc.dictionary_encode(topics).combine_chunks() if isinstance(topics, pa.ChunkedArray) \
                else pc.dictionary_encode(topics)
            indices = np.asarray(encoded.indices)
            names_of = encoded.dictionary.to_pylist()
            groups = [(names_of[0], None)] if len(names_of) == 1 else \
                [(name, np.nonzero(indices == i)[0]) for i, name in enumerate(names_of)]
        explicit = batch.column(names.index("partition")) if self.columns.partition else None
        routed: dict[TopicPartition, np.ndarray | None] = {}
        for topic, rows in groups:
            count = producer.partitions_of(topic)
            m = n if rows is None else len(rows)
            chosen = np.full(m, -1, dtype=np.int64)
            if explicit is not None:
                wanted = explicit if rows is None else explicit.take(pa.array(rows))
                given = np.asarray(wanted.is_valid())
                values = np.asarray(wanted.fill_null(-1), dtype=np.int64)
                bad = given & ((values < 0) | (values >= count))
                if bad.any():
                    raise WriteError(f"partition {int(values[bad][0])} does not exist: topic {topic!r} has {count} "
                                     f"partitions (0-{count - 1})")
                chosen[given] = values[given]
            if keys is not None:
                these = keys if rows is None else keys.take(pa.array(rows))
                keyed = (chosen < 0) & np.asarray(these.is_valid())
                if keyed.any():
                    hashes = murmur2(these.filter(pa.array(keyed)))
                    chosen[keyed] = (hashes & np.uint32(0x7FFFFFFF)).astype(np.int64) % count
            if (chosen < 0).any():
                # Keyless rows: Kafka's sticky partitioning, one partition per batch, rotating.
                self.sticky[topic] = (self.sticky.get(topic, -1) + 1) % count
                chosen[chosen < 0] = self.sticky[topic]
            partitions = np.unique(chosen)
            if len(partitions) == 1:
                routed[TopicPartition(topic, int(partitions[0]))] = rows
                continue
            order = np.argsort(chosen, kind="stable")
            bounds = np.searchsorted(chosen[order], partitions)
            for p, lo, hi in zip(partitions, bounds, list(bounds[1:]) + [m]):
                picked = order[lo:hi]
                routed[TopicPartition(topic, int(p))] = picked if rows is None else rows[picked]
        return routed


def _rows_to_batches(rows: Iterator[Any], columns: SinkColumns) -> Iterator[pa.RecordBatch]:
    """The row path: Spark Rows gathered into Arrow batches of ROW_CHUNK rows."""
    names = [n for n, _ in columns.arrow_types]
    schema = pa.schema(list(columns.arrow_types))
    chunk: list = []
    for row in rows:
        chunk.append(tuple(row[n] for n in names))
        if len(chunk) == ROW_CHUNK:
            yield pa.RecordBatch.from_arrays([pa.array(c, type=t) for c, t in zip(zip(*chunk), schema.types)],
                                             schema=schema)
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_arrays([pa.array(c, type=t) for c, t in zip(zip(*chunk), schema.types)],
                                         schema=schema)


class _ArrowWrite:
    """A task's Arrow batches (Spark's Arrow path) written by a _TaskWriter."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        return _TaskWriter(self.options, self.columns).write(iterator)


class _RowWrite(_ArrowWrite):
    """A task's Spark Rows (the row path), gathered into Arrow batches first."""

    def write(self, iterator: Iterator[Any]) -> WriteCommit:
        return super().write(_rows_to_batches(iterator, self.columns))


class _BatchCommit:
    def commit(self, messages: list) -> None:
        report(messages)

    def abort(self, messages: list) -> None:
        _log_abort(messages)


class _StreamCommit:
    def commit(self, messages: list, batchId: int) -> None:
        report(messages, batchId)

    def abort(self, messages: list, batchId: int) -> None:
        _log_abort(messages, batchId)


class ArrowWriter(_ArrowWrite, _BatchCommit, DataSourceArrowWriter):
    pass


class RowWriter(_RowWrite, _BatchCommit, DataSourceWriter):
    pass


class StreamArrowWriter(_ArrowWrite, _StreamCommit, DataSourceStreamArrowWriter):
    pass


class StreamRowWriter(_RowWrite, _StreamCommit, DataSourceStreamWriter):
    pass
