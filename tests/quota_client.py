"""One confluent-kafka client in a process of its own, for the quota tests: it offers a load for a while and
writes what it saw as one JSON object to --out:

    produce: {"acked": [[seconds since start, bytes], ...], "latency_ms": [...], "throttle_ms": [...],
              "offered_bytes": N, "seconds": S, "start": time.monotonic() at start}
    consume: {"consumed": [[seconds since start, bytes], ...], "throttle_ms": [...], "seconds": S, "start": ...}

"throttle_ms" holds librdkafka's own statistics (each broker's throttle window max, once a second): what the
client saw in the responses' throttle_time_ms. A producer offers --rate bytes/s in --value-bytes records
(the rest waits in librdkafka's queue); a consumer reads a topic from the start. Bounded: --seconds, then it
purges what is left unsent and exits.

    python tests/quota_client.py produce|consume --bootstrap H:P --client-id ID --topic T --seconds S --out F
        [--rate BYTES_PER_S] [--value-bytes N] [--batch-bytes N] [--fetch-partition-bytes N]
"""

from __future__ import annotations

import argparse
import json
import time

STATS_INTERVAL_MS = 1000
POLL_S = 0.005
FLUSH_S = 10.0


def throttle_of(stats_json: str) -> int:
    stats = json.loads(stats_json)
    return max((b.get("throttle", {}).get("max", 0) for b in stats["brokers"].values() if b.get("nodeid", -1) >= 0),
               default=0)


def produce(args) -> dict:
    from confluent_kafka import Producer

    throttles: list[int] = []
    producer = Producer({"bootstrap.servers": args.bootstrap, "client.id": args.client_id, "linger.ms": args.linger_ms,
                         "batch.size": args.batch_bytes, "acks": 1, "statistics.interval.ms": STATS_INTERVAL_MS,
                         "stats_cb": lambda s: throttles.append(throttle_of(s))})
    acked: list[list[float]] = []
    latency_ms: list[float] = []
    value = b"q" * args.value_bytes
    start = time.monotonic()

    def delivered(err, msg, sent_at: float) -> None:
        if err is None:
            now = time.monotonic()
            acked.append([now - start, len(msg.value())])
            latency_ms.append((now - sent_at) * 1000)

    offered = 0
    while time.monotonic() - start < args.seconds:
        due = (time.monotonic() - start) * args.rate
        while offered < due:
            sent_at = time.monotonic()
            try:
                producer.produce(args.topic, value, on_delivery=lambda err, msg, t=sent_at: delivered(err, msg, t))
            except BufferError:
                break
            offered += len(value)
        producer.poll(POLL_S)
    producer.purge()  # what the quota held back is not part of the measurement
    producer.flush(FLUSH_S)
    return {"acked": acked, "latency_ms": latency_ms, "throttle_ms": throttles, "offered_bytes": offered,
            "seconds": args.seconds, "start": start}


def consume(args) -> dict:
    from confluent_kafka import Consumer

    throttles: list[int] = []
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "client.id": args.client_id, "group.id": args.client_id,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "max.partition.fetch.bytes": args.fetch_partition_bytes,
                         "statistics.interval.ms": STATS_INTERVAL_MS,
                         "stats_cb": lambda s: throttles.append(throttle_of(s))})
    consumer.subscribe([args.topic])
    consumed: list[list[float]] = []
    start = time.monotonic()
    while time.monotonic() - start < args.seconds:
        for msg in consumer.consume(num_messages=1000, timeout=0.05):
            if msg.error() is None:
                consumed.append([time.monotonic() - start, len(msg.value())])
    consumer.close()
    return {"consumed": consumed, "throttle_ms": throttles, "seconds": args.seconds, "start": start}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["produce", "consume"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rate", type=float, default=1 << 20)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--batch-bytes", type=int, default=1_000_000)
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--fetch-partition-bytes", type=int, default=1 << 20)
    args = parser.parse_args()
    result = produce(args) if args.mode == "produce" else consume(args)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
