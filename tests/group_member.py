"""One consumer-group member in a process of its own, for the group tests: a real client library consuming
a topic in a group, reporting on stdout, one JSON object per line:

    {"event": "assigned", "partitions": [0, 3]}      after each rebalance, its whole assignment
    {"event": "record", "p": 3, "o": 17, "v": "..."}  each record consumed
    {"event": "committed", "p": 3, "o": 18}          after a commit succeeded: offsets below o are committed
    {"event": "error", "code": "...", ...}           an error the client reported (confluent-kafka)
    {"event": "closed"}                              after a clean close (SIGTERM)

It commits synchronously after each poll that returned records, so duplicates across rebalances can only be
records consumed after its last "committed" line. SIGTERM: close cleanly (leave the group, unless static);
SIGKILL: dies at once, as tests want. Bounded: it exits by itself after --max-seconds.

    python tests/group_member.py --client confluent|kafka-python|aiokafka --bootstrap H:P --group G --topic T
        [--assignor range|roundrobin|cooperative-sticky] [--instance-id ID] [--session-timeout-ms 6000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

stop = False


def emit(**event) -> None:
    print(json.dumps(event), flush=True)


def on_term(signum, frame) -> None:
    global stop
    stop = True


def run_confluent(args) -> None:
    from confluent_kafka import Consumer, TopicPartition

    config = {"bootstrap.servers": args.bootstrap, "group.id": args.group, "auto.offset.reset": "earliest",
              "enable.auto.commit": False, "session.timeout.ms": args.session_timeout_ms,
              "heartbeat.interval.ms": args.heartbeat_interval_ms, "partition.assignment.strategy": args.assignor,
              "max.poll.interval.ms": args.max_poll_interval_ms}
    if args.instance_id:
        config["group.instance.id"] = args.instance_id
    consumer = Consumer(config)
    cooperative = args.assignor == "cooperative-sticky"
    owned: set[int] = set()

    def assigned(c, partitions) -> None:
        owned.update(p.partition for p in partitions)
        if cooperative:
            c.incremental_assign(partitions)
        emit(event="assigned", partitions=sorted(owned))

    def revoked(c, partitions) -> None:
        owned.difference_update(p.partition for p in partitions)
        if cooperative:
            c.incremental_unassign(partitions)
        emit(event="assigned", partitions=sorted(owned))

    consumer.subscribe([args.topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)
    deadline = time.monotonic() + args.max_seconds
    while not stop and time.monotonic() < deadline:
        messages = consumer.consume(100, 0.2)
        for m in messages:
            if m.error() and m.error().code() != -191:  # -191: _PARTITION_EOF, not an error
                emit(event="error", code=m.error().name(), text=m.error().str(), fatal=m.error().fatal())
        records = [m for m in messages if not m.error()]
        for m in records:
            emit(event="record", p=m.partition(), o=m.offset(), v=m.value().decode())
        if records:
            last = {}
            for m in records:
                last[m.partition()] = m.offset() + 1
            try:
                done = consumer.commit(offsets=[TopicPartition(args.topic, p, o) for p, o in last.items()],
                                       asynchronous=False)
                for tp in done:
                    if tp.error is None:
                        emit(event="committed", p=tp.partition, o=tp.offset)
            except Exception as exc:  # a commit during a rebalance may fail: the records come again
                emit(event="commit_failed", error=str(exc))
    consumer.close()
    emit(event="closed")


def run_kafka_python(args) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.structs import OffsetAndMetadata

    assignors = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}
    consumer = KafkaConsumer(bootstrap_servers=args.bootstrap, group_id=args.group, auto_offset_reset="earliest",
                             enable_auto_commit=False, session_timeout_ms=args.session_timeout_ms,
                             heartbeat_interval_ms=args.heartbeat_interval_ms,
                             max_poll_interval_ms=args.max_poll_interval_ms,
                             partition_assignment_strategy=[assignors[a] for a in args.assignor.split(",")])

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            emit(event="assigned", partitions=[])

        def on_partitions_assigned(self, assigned):
            emit(event="assigned", partitions=sorted(tp.partition for tp in assigned))

    consumer.subscribe([args.topic], listener=Listener())
    deadline = time.monotonic() + args.max_seconds
    while not stop and time.monotonic() < deadline:
        last = emit_records(consumer.poll(timeout_ms=200))
        if last:
            try:
                consumer.commit({TopicPartition(args.topic, p): OffsetAndMetadata(o, "", -1) for p, o in last.items()})
                for p, o in last.items():
                    emit(event="committed", p=p, o=o)
            except Exception as exc:
                emit(event="commit_failed", error=str(exc))
    consumer.close()
    emit(event="closed")


def emit_records(batches: dict) -> dict[int, int]:
    """Emit the records of a kafka-python / aiokafka poll; {partition: next offset} to commit."""
    last = {}
    for records in batches.values():
        for m in records:
            emit(event="record", p=m.partition, o=m.offset, v=m.value.decode())
            last[m.partition] = m.offset + 1
    return last


def run_aiokafka(args) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):
            emit(event="assigned", partitions=[])

        async def on_partitions_assigned(self, assigned):
            emit(event="assigned", partitions=sorted(tp.partition for tp in assigned))

    async def main() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=args.bootstrap, group_id=args.group,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    session_timeout_ms=args.session_timeout_ms,
                                    heartbeat_interval_ms=args.heartbeat_interval_ms,
                                    max_poll_interval_ms=args.max_poll_interval_ms)
        consumer.subscribe([args.topic], listener=Listener())
        await consumer.start()
        deadline = time.monotonic() + args.max_seconds
        try:
            while not stop and time.monotonic() < deadline:
                last = emit_records(await consumer.getmany(timeout_ms=200))
                if last:
                    try:
                        await consumer.commit({TopicPartition(args.topic, p): OffsetAndMetadata(o, "")
                                               for p, o in last.items()})
                        for p, o in last.items():
                            emit(event="committed", p=p, o=o)
                    except Exception as exc:
                        emit(event="commit_failed", error=str(exc))
        finally:
            await consumer.stop()
        emit(event="closed")

    asyncio.run(main())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", choices=["confluent", "kafka-python", "aiokafka"], required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--assignor", default="range")
    parser.add_argument("--instance-id")
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=500)
    parser.add_argument("--max-poll-interval-ms", type=int, default=30000)
    parser.add_argument("--max-seconds", type=float, default=120)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    {"confluent": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka}[args.client](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
