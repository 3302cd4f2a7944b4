"""What a read_committed share group (share.isolation.level) never delivers: control batches and the batches of
aborted transactions, found in a partition's log from the timer process.

A read_committed consumer skips them itself with the aborted-transaction list a Fetch answers; a share consumer
is given acquired offsets instead, so the share-partition archives those records when its acquisition passes
them (Kafka's SharePartition does the same), and acquires only below the last stable offset.

`committed_exclusions` reads the batch headers from `start` towards the LSO, at most SCAN_BYTES of log per call
(the acquisition's bound is where the scan stopped: the next acquisition goes on from there).

Invariants: the returned bound is within [start, lso]; every excluded range lies within [start, bound) and is a
whole batch: a control batch, or a transactional batch of a producer whose transaction in the log's transaction
index was aborted and covers the batch.
"""

from __future__ import annotations

import os

from shmbroker.node.storage.log import PartitionLog
from shmbroker.node.storage.records import (BATCH_HEADER_SIZE, CONTROL_BIT, LENGTH_FIELDS_SIZE, TRANSACTIONAL_BIT,
                                            StorageError, parse_header)

SCAN_BYTES = 1 << 20  # log bytes read per acquisition of a read_committed share-partition
MAX_READS = 64  # reads per scan (each returns at least one whole batch)


def committed_exclusions(plog: PartitionLog, start: int, lso: int) -> tuple[int, list[tuple[int, int]]]:
    """(bound, excluded): how far the acquisition may go (<= lso) and the (first, last) offset ranges in
    [start, bound) it must archive."""
    if start >= lso:
        return lso, []
    try:
        aborted = plog.aborted_transactions(start, lso)
    except StorageError:
        return start, []
    excluded: list[tuple[int, int]] = []
    offset, scanned = start, 0
    for _ in range(MAX_READS):
        if offset >= lso or scanned >= SCAN_BYTES:
            break
        try:
            piece = plog.read(offset, SCAN_BYTES - scanned, min_one_batch=True)
        except StorageError:
            break
        before = offset
        for fd, position, length in piece.ranges:
            data = os.pread(fd, length, position)
            scanned += len(data)
            at = 0
            while at + BATCH_HEADER_SIZE <= len(data) and offset < lso:
                header = parse_header(data, at)
                end = at + LENGTH_FIELDS_SIZE + header.batch_length
                if end > len(data):
                    break
                last = header.base_offset + header.last_offset_delta
                if header.attributes & CONTROL_BIT or (header.attributes & TRANSACTIONAL_BIT and any(
                        entry.producer_id == header.producer_id and entry.first_offset <= header.base_offset
                        <= entry.last_offset for entry in aborted)):
                    excluded.append((header.base_offset, last))
                offset = max(offset, last + 1)
                at = end
        if offset == before:
            break
    return min(offset, lso), excluded
