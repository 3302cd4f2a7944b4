"""Test helpers for storage: real v2 record batches (kafka-python's builder) and byte-level edits of them."""

from __future__ import annotations

import os
import struct
import time

import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from node.storage.records import BATCH_HEADER_SIZE, CRC_START
from shm.table import PartitionTable

GZIP = 1


def make_batch(
    count: int = 3,
    value_size: int = 100,
    timestamp: int | None = None,
    producer_id: int = -1,
    epoch: int = -1,
    sequence: int = -1,
    compression: int = 0,
    tag: bytes = b"",
) -> bytes:
    """A real v2 batch of `count` records (uncompressed or gzip), keys b"k<i>", values tag + padding."""
    builder = DefaultRecordBatchBuilder(2, compression, 0, producer_id, epoch, sequence, 1 << 30)
    if timestamp is None:
        timestamp = time.time_ns() // 1_000_000
    for index in range(count):
        value = (tag + b"." + str(index).encode()).ljust(value_size, b"x")
        builder.append(index, timestamp + index, b"k%d" % index, value, [("h", b"1")])
    return bytes(builder.build())


def recrc(batch: bytes) -> bytes:
    """The batch with its CRC recomputed (after an edit of the covered bytes)."""
    data = bytearray(batch)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[CRC_START:])))
    return bytes(data)


def edit(batch: bytes, position: int, fmt: str, value, fix_crc: bool = True) -> bytes:
    data = bytearray(batch)
    struct.pack_into(fmt, data, position, value)
    return recrc(bytes(data)) if fix_crc else bytes(data)


def opaque_compressed_batch(codec: int, payload_size: int = 500, count: int = 10) -> bytes:
    """A batch claiming codec 2-4 (snappy, lz4, zstd) with opaque records: storage never decompresses."""
    header = struct.pack(
        ">qiibIhiqqqhii",
        0,
        BATCH_HEADER_SIZE + payload_size - 12,
        -1,
        2,
        0,
        codec,
        count - 1,
        1000,
        1000 + count,
        -1,
        -1,
        -1,
        count,
    )
    return recrc(header + os.urandom(payload_size))


def unique_shm_name(label: str) -> str:
    return f"/shmbroker-test-{label}-{os.getpid()}-{time.monotonic_ns()}"


class SharedTable:
    """Context manager: a fresh partition table that is unlinked afterwards."""

    def __init__(self, rows: int = 8, label: str = "storage"):
        self.name = unique_shm_name(label)
        self.rows = rows

    def __enter__(self) -> PartitionTable:
        self.table = PartitionTable.create(self.name, self.rows)
        return self.table

    def __exit__(self, *exc_info):
        self.table.close()
        self.table.unlink()


def dev_shm_entries(prefix: str = "shmbroker-test-") -> list[str]:
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(prefix))
