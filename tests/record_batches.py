"""Test helpers for storage: v2 record batches (node.storage.records' builder, which tests/test_records.py checks
against kafka-python's) and byte-level edits of them."""

from __future__ import annotations

import os
import struct
import time

from shmbroker.node.storage.records import build_batch, pack_header, seal
from shmbroker.shm.table import PartitionTable

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
    """A v2 batch of `count` records (compressed with codec `compression`), keys b"k<i>", values tag + padding,
    record i at timestamp + i with one header."""
    if timestamp is None:
        timestamp = time.time_ns() // 1_000_000
    records = [(b"k%d" % index, (tag + b"." + str(index).encode()).ljust(value_size, b"x")) for index in range(count)]
    return build_batch(records, timestamp, timestamp_deltas=range(count), headers=[[("h", b"1")]] * count,
                       compression=compression, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)


def recrc(batch: bytes) -> bytes:
    """The batch with its CRC recomputed (after an edit of the covered bytes)."""
    data = bytearray(batch)
    seal(data)
    return bytes(data)


def edit(batch: bytes, position: int, fmt: str, value, fix_crc: bool = True) -> bytes:
    data = bytearray(batch)
    struct.pack_into(fmt, data, position, value)
    return recrc(bytes(data)) if fix_crc else bytes(data)


def opaque_compressed_batch(codec: int, payload_size: int = 500, count: int = 10) -> bytes:
    """A batch claiming codec 2-4 (snappy, lz4, zstd) with opaque records: storage never decompresses."""
    header = pack_header(payload_size, count, 1000, 1000 + count, attributes=codec, partition_leader_epoch=-1)
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
    """This process's test entries in /dev/shm (unique_shm_name puts the pid in each name): a test run beside
    another (pytest-xdist) sees only its own."""
    mine = f"-{os.getpid()}-"
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(prefix) and mine in name)
