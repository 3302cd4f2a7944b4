"""Helpers of the Spark tests: topics created and records produced with real Kafka clients (confluent-kafka,
librdkafka), and what a read of them must give back."""

from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT_S = 60.0


def local_datetime(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms // 1000).replace(microsecond=(ms % 1000) * 1000)


@dataclass(frozen=True)
class Produced:
    """A record as the node acknowledged it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes | None], ...] = ()

    def as_row(self, include_headers: bool = True) -> tuple:
        """The Spark row a read gives for it (a timestamp comes back as pyspark makes it: a naive datetime
        in the Python process's local time)."""
        row = (self.key, self.value, self.topic, self.partition, self.offset, local_datetime(self.timestamp_ms), 0)
        return row + (list(self.headers),) if include_headers else row


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                      operation_timeout=TIMEOUT_S).values():
        future.result(timeout=TIMEOUT_S)


def produce(bootstrap: str, topic: str, records: list[dict], **config) -> list[Produced]:
    """Produce each record (dict of value, and optionally key, partition, timestamp, headers) with
    librdkafka; returns them as acknowledged, in offset order per partition."""
    delivered: list[Produced] = []
    errors: list = []

    def on_delivery(record, err, msg):
        if err is not None:
            errors.append(err)
            return
        # Headers as sent: delivery reports do not carry them.
        headers = tuple((k, v) for k, v in (record.get("headers") or []))
        delivered.append(Produced(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                                  msg.timestamp()[1], headers))

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, **config})
    for record in records:
        kwargs = {k: record[k] for k in ("key", "partition", "timestamp", "headers") if record.get(k) is not None}
        producer.produce(topic, value=record.get("value"), on_delivery=functools.partial(on_delivery, record),
                         **kwargs)
        producer.poll(0)
    left = producer.flush(TIMEOUT_S)
    assert left == 0 and not errors, (left, errors)
    return sorted(delivered, key=lambda r: (r.topic, r.partition, r.offset))


class TransactionalWriter:
    """A confluent-kafka transactional producer whose writes come back as acknowledged (`write`), inside the
    transactions it begins, commits and aborts."""

    def __init__(self, bootstrap: str, transactional_id: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                                  "linger.ms": 1})
        self.producer.init_transactions(TIMEOUT_S)

    def begin(self) -> None:
        self.producer.begin_transaction()

    def write(self, topic: str, records: list[dict]) -> list[Produced]:
        """Each record (value, partition) written and acknowledged, in offset order per partition."""
        delivered: list[Produced] = []
        errors: list = []

        def on_delivery(err, msg):
            if err is not None:
                errors.append(err)
            else:
                delivered.append(Produced(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                                          msg.timestamp()[1]))

        for record in records:
            self.producer.produce(topic, value=record["value"], partition=record.get("partition", 0),
                                  on_delivery=on_delivery)
        left = self.producer.flush(TIMEOUT_S)
        assert left == 0 and not errors, (left, errors)
        return sorted(delivered, key=lambda r: (r.topic, r.partition, r.offset))

    def commit(self) -> None:
        self.producer.commit_transaction(TIMEOUT_S)

    def abort(self) -> None:
        self.producer.abort_transaction(TIMEOUT_S)


def read(spark, bootstrap: str, **options):
    reader = spark.read.format("shmbroker").option("kafka.bootstrap.servers", bootstrap)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def rows(df) -> list[tuple]:
    """The DataFrame's rows as plain tuples (headers as lists of (key, value)), ordered by topic,
    partition and offset."""
    out = []
    for row in df.collect():
        values = list(row)
        if "headers" in row.__fields__:
            values[-1] = [(h["key"], h["value"]) for h in row["headers"]]
        values[0] = bytes(values[0]) if values[0] is not None else None
        values[1] = bytes(values[1]) if values[1] is not None else None
        out.append(tuple(values))
    return sorted(out, key=lambda r: (r[2], r[3], r[4]))
