"""Benchmark: kio versus our hot-path codecs (Produce request decode, Fetch response encode, the
ConsumerGroupHeartbeat answer without an assignment).

Cases: request header parse (kio's bare reader of header v1 against
workers.codecs.protocol.parse_request_header, compiled where it was built: workers/codecs/_header.c; and a
flexible Fetch's header v2 with the Python parser, which wraps kio's reader, on the "kio" side), Produce request
decode, Produce response build+encode, Fetch
response build+encode (kio's side includes the pread its in-memory records
need; ours leaves the records as file ranges for sendfile).

This is the measurement behind the choice, stated in workers/codecs/produce.py and
workers/codecs/fetch.py, to hand-write those two and use kio for everything else.
Both sides run in the same process and run, interleaved, so machine noise hits
both alike; each figure is the median over ``--runs`` runs of microseconds per
message, and ``ratio`` is kio / ours (above 1: ours is faster).

Usage: .venv/bin/python -m scripts.bench_protocol [--runs 7] [--seconds 0.2] [--json]
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

import orjson
from kio.schema.fetch.v11 import response as fetch_v11
from kio.schema.produce.v8 import response as produce_v8
from kio.schema.produce.v8.request import ProduceRequest
from kio.schema.request_header.v1.header import RequestHeader as KioRequestHeaderV1
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32, i32Timedelta, i64

from scripts.harness import rawkafka
from shmbroker.workers.codecs import protocol
from shmbroker.workers.codecs.consumer_group_heartbeat import encode_response_without_assignment
from shmbroker.workers.codecs.fetch import FetchPartitionResult, FetchTopicResult, encode_fetch_response
from shmbroker.workers.codecs.produce import (ProducePartitionResult, ProduceTopicResult, decode_produce_request,
                                              encode_produce_response)
from shmbroker.workers.codecs.protocol import parse_request_header, parse_request_header_python

RECORD_SIZE = 100


@dataclass
class FileSlice:
    """A (file, position, length) record range, as the worker's FileRange."""

    file: Any
    position: int
    length: int


def per_op_us(fn: Callable[[], Any], seconds: float) -> float:
    """Microseconds per call of fn, over at least ``seconds`` (bounded count)."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds or n >= 1 << 22:
            return elapsed / n * 1e6
        n *= 2


def compare(name: str, kio_fn: Callable[[], Any], own_fn: Callable[[], Any], runs: int, seconds: float) -> dict:
    kio_runs, own_runs = [], []
    for _ in range(runs):
        kio_runs.append(per_op_us(kio_fn, seconds))
        own_runs.append(per_op_us(own_fn, seconds))
    kio_us = statistics.median(kio_runs)
    own_us = statistics.median(own_runs)
    return {
        "script": "bench_protocol",
        "case": name,
        "kio_us": round(kio_us, 3),
        "own_us": round(own_us, 3),
        "ratio": round(kio_us / own_us, 2),
        "runs": runs,
    }


def produce_cases(partitions: int, batch_bytes: int) -> tuple[Callable, Callable]:
    count = rawkafka.records_for_batch_bytes(batch_bytes, RECORD_SIZE)
    batch = rawkafka.make_batch(count, RECORD_SIZE)
    body = memoryview(rawkafka.produce_body({"bench": {p: batch for p in range(partitions)}}, acks=1))
    read_kio = entity_reader(ProduceRequest)

    def with_kio() -> Any:
        return read_kio(body, 0)

    def with_own() -> Any:
        return decode_produce_request(8, body)

    return with_kio, with_own


def fetch_cases(partitions: int, records_per_partition: int, fd: int) -> tuple[Callable, Callable]:
    records = b"\x00" * records_per_partition
    write_kio = entity_writer(fetch_v11.FetchResponse)

    def with_kio() -> bytes:
        # kio needs the record bytes in memory: that read is part of its cost on this path,
        # so it is included (pread of the same range ours sends with sendfile).
        parts = tuple(
            fetch_v11.PartitionData(
                partition_index=i32(p),
                error_code=ErrorCode.none,
                high_watermark=i64(1000),
                last_stable_offset=i64(1000),
                log_start_offset=i64(0),
                aborted_transactions=(),
                preferred_read_replica=i32(-1),
                records=os.pread(fd, records_per_partition, 0),
            )
            for p in range(partitions)
        )
        resp = fetch_v11.FetchResponse(
            throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
            error_code=ErrorCode.none,
            session_id=i32(0),
            responses=(fetch_v11.FetchableTopicResponse(topic="bench", partitions=parts),),
        )
        buf = io.BytesIO()
        buf.write(b"\x00" * 8)
        write_kio(buf, resp)
        return buf.getvalue()

    def with_own() -> Any:
        parts = [
            FetchPartitionResult(
                partition_index=p,
                high_watermark=1000,
                log_start_offset=0,
                records=(FileSlice(fd, 0, records_per_partition),),
            )
            for p in range(partitions)
        ]
        return encode_fetch_response(11, 1, [FetchTopicResult("bench", parts)])

    del records
    return with_kio, with_own


def produce_response_cases(partitions: int) -> tuple[Callable, Callable]:
    write_kio = entity_writer(produce_v8.ProduceResponse)

    def with_kio() -> bytes:
        resp = produce_v8.ProduceResponse(
            responses=(
                produce_v8.TopicProduceResponse(
                    name="bench",
                    partition_responses=tuple(
                        produce_v8.PartitionProduceResponse(
                            index=i32(p),
                            error_code=ErrorCode.none,
                            base_offset=i64(1000),
                            log_append_time=None,
                            log_start_offset=i64(0),
                            record_errors=(),
                            error_message=None,
                        )
                        for p in range(partitions)
                    ),
                ),
            ),
            throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        )
        buf = io.BytesIO()
        buf.write(b"\x00" * 8)
        write_kio(buf, resp)
        return buf.getvalue()

    def with_own() -> bytes:
        parts = [ProducePartitionResult(p, 0, 1000, -1, 0) for p in range(partitions)]
        return encode_produce_response(8, 1, [ProduceTopicResult("bench", parts)])

    return with_kio, with_own


def heartbeat_response_cases() -> tuple[Callable, Callable]:
    """A settled KIP-848 member's answer (no assignment), as workers.api.consumer_groups builds it either way."""
    cls = protocol.response_schema(protocol.CONSUMER_GROUP_HEARTBEAT, 1).ConsumerGroupHeartbeatResponse
    interval = datetime.timedelta(milliseconds=5000)

    def with_kio() -> bytes:
        return protocol.encode_response(protocol.CONSUMER_GROUP_HEARTBEAT, 1, 7, protocol.build_entity(
            cls, throttle_time=i32Timedelta.parse(datetime.timedelta(0)), error_code=ErrorCode.none,
            error_message=None, member_id="a0b1c2d3e4f5g6h7i8j9kl", member_epoch=i32(42),
            heartbeat_interval=i32Timedelta.parse(interval), assignment=None))

    def with_own() -> bytes:
        return encode_response_without_assignment(7, 0, 0, None, "a0b1c2d3e4f5g6h7i8j9kl", 42, 5000)

    return with_kio, with_own


def header_cases() -> tuple[Callable, Callable]:
    frame = memoryview(rawkafka.encode_request(0, 8, 7, b"")[4:])
    read_kio = entity_reader(KioRequestHeaderV1)
    return (lambda: read_kio(frame, 0)), (lambda: parse_request_header(frame))


def flexible_header_cases() -> tuple[Callable, Callable]:
    """An idle consumer's long poll: Fetch v12, header v2 (the worker parses one per request)."""
    frame = memoryview(rawkafka.encode_request(1, 12, 7, b"")[4:])
    return (lambda: parse_request_header_python(frame)), (lambda: parse_request_header(frame))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_protocol", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per case; the median is reported")
    parser.add_argument("--seconds", type=float, default=0.2, help="minimum time per run")
    parser.add_argument("--batch-bytes", type=int, default=8192)
    parser.add_argument("--fetch-partition-bytes", type=int, default=1024 * 1024)
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)

    results = []
    with tempfile.TemporaryFile() as segment:
        segment.write(b"\x00" * args.fetch_partition_bytes)
        segment.flush()
        fd = segment.fileno()
        cases = {
            "request_header_v1": header_cases(),
            "request_header_v2_fetch_v12": flexible_header_cases(),
            "produce_v8_decode_1x8KiB": produce_cases(1, args.batch_bytes),
            "produce_v8_decode_10x8KiB": produce_cases(10, args.batch_bytes),
            "produce_v8_decode_1x1MiB": produce_cases(1, 1024 * 1024),
            "produce_v8_response_1p": produce_response_cases(1),
            "produce_v8_response_10p": produce_response_cases(10),
            "fetch_v11_encode_1x1MiB": fetch_cases(1, args.fetch_partition_bytes, fd),
            "fetch_v11_encode_10x64KiB": fetch_cases(10, 64 * 1024, fd),
            "fetch_v11_encode_10x0B": fetch_cases(10, 0, fd),
            "consumer_group_heartbeat_v1_response": heartbeat_response_cases(),
        }
        for name, (kio_fn, own_fn) in cases.items():
            results.append(compare(name, kio_fn, own_fn, args.runs, args.seconds))
    for row in results:
        if args.json:
            print(orjson.dumps(row).decode())
        else:
            print(f"{row['case']:<38} kio {row['kio_us']:>9.2f} us  ours {row['own_us']:>8.2f} us  kio/ours {row['ratio']:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
