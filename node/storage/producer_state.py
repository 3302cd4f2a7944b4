"""Idempotent- and transactional-producer state of one partition: the last batches of every producer id and
each producer's open transaction, as Kafka's ProducerStateManager keeps them.

For each producer id the state holds its current epoch and the metadata (first sequence, last sequence,
base offset, last offset, max timestamp) of its last `batches_per_producer` batches (Kafka: 5, the most a
producer may have in flight), so a retried batch is answered with its original offsets instead of being
appended twice.

Invariants:
- `end_offset` is the log offset up to which the state reflects the log: every batch below it has been
  applied with apply(), none at or above it. Several processes append to one partition, so before checking
  a batch a process applies the headers of the batches others appended since its end_offset (node/storage/log.py).
- check() never changes the state; apply() is called only for batches that were appended.
- Sequence rules follow Kafka's ProducerAppendInfo: an older epoch is fenced (INVALID_PRODUCER_EPOCH); a new
  epoch must start at sequence 0; within an epoch the next batch starts at last sequence + 1 (wrapping at
  INT32_MAX) or gets OUT_OF_ORDER_SEQUENCE_NUMBER; an unknown producer id is accepted at any sequence (its
  earlier batches may have been deleted by retention, as in Kafka).
- A producer has at most one open transaction per partition: it opens at the first offset of its first
  transactional batch and closes at its marker (a control batch, COMMIT or ABORT). first_unstable_offset() is
  the smallest first offset of an open transaction (-1: none); the last stable offset (LSO) is that, or the
  high watermark when nothing is open. A marker does not touch sequences: a producer's sequences run on across
  its transactions within an epoch. A producer with an open transaction never expires.
- Snapshots are written atomically (temporary file + rename) as `<end_offset, 20 digits>.snapshot`; a
  write that fails (a full disk) removes its temporary file.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import orjson

from shmbroker.node.storage import formats
from shmbroker.node.storage.durable import write_durably
from shmbroker.node.storage.records import INT32_MAX, ErrorCode, StorageError

SNAPSHOT_SUFFIX = ".snapshot"
# 1 had no "format" field and (before transactions) four fields per producer; both are read.
PRODUCER_SNAPSHOT_FORMAT = formats.PRODUCER_SNAPSHOT_FORMAT


class BatchMetadata(NamedTuple):
    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int
    max_timestamp: int


class CompletedTransaction(NamedTuple):
    """A transaction a marker closed: its first offset and the marker's offset (Kafka's CompletedTxn)."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


@dataclass
class ProducerEntry:
    epoch: int
    batches: deque = field(default_factory=deque)
    last_timestamp: int = -1
    open_transaction_from: int = -1  # first offset of its open transaction here, -1 when none

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


def _in_sequence(last_sequence: int, next_sequence: int) -> bool:
    return next_sequence == last_sequence + 1 or (next_sequence == 0 and last_sequence == INT32_MAX)


class ProducerStateTable:
    """The producer states of one partition, as of `end_offset`."""

    def __init__(self, batches_per_producer: int = 5, end_offset: int = 0):
        self.batches_per_producer = batches_per_producer
        self.end_offset = end_offset
        self.producers: dict[int, ProducerEntry] = {}
        self.marker_end = 0  # the offset after the newest transaction marker applied

    def check(self, producer_id: int, epoch: int, first_sequence: int, last_sequence: int) -> BatchMetadata | None:
        """Validate an idempotent batch before appending it.

        Returns the metadata of the original batch if this one is a retry of one of the last batches
        (the caller answers with those offsets and appends nothing); None if it may be appended;
        raises StorageError otherwise.
        """
        entry = self.producers.get(producer_id)
        if entry is None:
            return None
        if epoch < entry.epoch:
            raise StorageError(
                ErrorCode.INVALID_PRODUCER_EPOCH, f"producer {producer_id} epoch {epoch} is older than {entry.epoch}"
            )
        if epoch > entry.epoch:
            if first_sequence != 0:
                raise StorageError(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"producer {producer_id} new epoch {epoch} starts at sequence {first_sequence}, not 0",
                )
            return None
        for batch in entry.batches:
            if batch.first_sequence == first_sequence and batch.last_sequence == last_sequence:
                return batch
        if entry.batches and not _in_sequence(entry.last_sequence, first_sequence):
            raise StorageError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {producer_id} sequence {first_sequence} after {entry.last_sequence}",
            )
        return None

    def apply(
        self,
        producer_id: int,
        epoch: int,
        first_sequence: int,
        last_sequence: int,
        base_offset: int,
        last_offset: int,
        max_timestamp: int,
        transactional: bool = False,
    ) -> None:
        """Record an appended data batch (of any producer id; non-idempotent batches only move end_offset)."""
        if producer_id >= 0:
            entry = self.producers.get(producer_id)
            if entry is None or epoch != entry.epoch:
                open_from = entry.open_transaction_from if entry is not None else -1
                entry = self.producers[producer_id] = ProducerEntry(epoch, open_transaction_from=open_from)
            entry.batches.append(BatchMetadata(first_sequence, last_sequence, base_offset, last_offset, max_timestamp))
            if len(entry.batches) > self.batches_per_producer:
                entry.batches.popleft()
            entry.last_timestamp = max(entry.last_timestamp, max_timestamp)
            if transactional and entry.open_transaction_from < 0:
                entry.open_transaction_from = base_offset
        self.end_offset = last_offset + 1

    def check_marker(self, producer_id: int, epoch: int) -> None:
        """Validate a transaction marker before appending it: a marker of an older epoch than the producer's
        is refused (INVALID_PRODUCER_EPOCH), as Kafka's coordinator-origin epoch check does."""
        entry = self.producers.get(producer_id)
        if entry is not None and epoch < entry.epoch:
            raise StorageError(
                ErrorCode.INVALID_PRODUCER_EPOCH, f"marker of producer {producer_id} epoch {epoch} < {entry.epoch}"
            )

    def apply_marker(self, producer_id: int, epoch: int, aborted: bool, offset: int,
                     timestamp: int) -> CompletedTransaction | None:
        """Record an appended marker at `offset`; returns the transaction it closed (None: none was open
        here, e.g. a partition the producer added but never wrote to)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(epoch)
        elif epoch > entry.epoch:  # a new epoch forgets the old epoch's sequences, as a data batch's would
            entry.epoch, entry.batches = epoch, deque()
        entry.last_timestamp = max(entry.last_timestamp, timestamp)
        self.end_offset = self.marker_end = offset + 1
        first = entry.open_transaction_from
        if first < 0:
            return None
        entry.open_transaction_from = -1
        return CompletedTransaction(producer_id, first, offset, aborted)

    def first_unstable_offset(self) -> int:
        """The first offset of the oldest open transaction, -1 when none is open (see the invariants)."""
        return min((entry.open_transaction_from for entry in self.producers.values()
                    if entry.open_transaction_from >= 0), default=-1)

    def open_transactions(self) -> dict[int, int]:
        """{producer id: first offset} of the open transactions."""
        return {pid: entry.open_transaction_from for pid, entry in self.producers.items()
                if entry.open_transaction_from >= 0}

    def newest_batch_end(self) -> int:
        """The offset after the newest batch or marker this state holds for any producer (0 when it holds none):
        a process catching up must read the markers too, or it would see their transactions still open."""
        return max(max((entry.batches[-1].last_offset + 1 for entry in self.producers.values() if entry.batches),
                       default=0), self.marker_end)

    def expire(self, now_ms: int, expiration_ms: int) -> None:
        """Forget producers idle longer than expiration_ms (Kafka's producer.id.expiration.ms)."""
        horizon = now_ms - expiration_ms
        for producer_id in [pid for pid, entry in self.producers.items()
                            if entry.last_timestamp < horizon and entry.open_transaction_from < 0]:
            del self.producers[producer_id]

    # Snapshots -------------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "format": PRODUCER_SNAPSHOT_FORMAT,
                "end_offset": self.end_offset,
                "marker_end": self.marker_end,
                "producers": [
                    [pid, entry.epoch, entry.last_timestamp, [list(batch) for batch in entry.batches],
                     entry.open_transaction_from]
                    for pid, entry in self.producers.items()
                ],
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes, batches_per_producer: int = 5) -> "ProducerStateTable":
        """Parse a snapshot; raises ValueError if it is not a well-formed one."""
        try:
            document = orjson.loads(data)
            formats.version_of(document, "a producer state snapshot", "format", PRODUCER_SNAPSHOT_FORMAT)
            table = cls(batches_per_producer, int(document["end_offset"]))
            table.marker_end = int(document.get("marker_end", 0))
            for pid, epoch, last_timestamp, batches, *open_from in document["producers"]:
                # A snapshot written before transactions has four fields: nothing was open then.
                entry = ProducerEntry(int(epoch), deque(maxlen=None), int(last_timestamp),
                                      int(open_from[0]) if open_from else -1)
                for batch in batches[-batches_per_producer:]:
                    entry.batches.append(BatchMetadata(*(int(value) for value in batch)))
                table.producers[int(pid)] = entry
        except formats.NewerFormat:
            raise
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise ValueError(f"bad producer state snapshot: {error}") from error
        return table

    def write_snapshot(self, directory: str) -> str:
        """Write `<end_offset>.snapshot` atomically and return its path."""
        path = os.path.join(directory, snapshot_name(self.end_offset))
        # A snapshot lost in a crash only makes the rebuild scan longer: no directory fsync.
        write_durably(path, self.to_bytes(), sync_directory=False)
        return path


def snapshot_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offsets(directory: str) -> list[int]:
    """Offsets of the snapshot files in a partition directory, ascending."""
    offsets = []
    for name in os.listdir(directory):
        if name.endswith(SNAPSHOT_SUFFIX) and name[: -len(SNAPSHOT_SUFFIX)].isdigit():
            offsets.append(int(name[: -len(SNAPSHOT_SUFFIX)]))
    return sorted(offsets)


def load_latest_snapshot(directory: str, max_offset: int, batches_per_producer: int = 5) -> ProducerStateTable | None:
    """The newest readable snapshot at or below max_offset, or None. Unreadable snapshots are skipped."""
    for offset in reversed(snapshot_offsets(directory)):
        if offset > max_offset:
            continue
        try:
            with open(os.path.join(directory, snapshot_name(offset)), "rb") as file:
                table = ProducerStateTable.from_bytes(file.read(), batches_per_producer)
        except formats.NewerFormat as exc:  # not ours to skip: a newer node's, in a directory it upgraded
            raise formats.NewerFormat(os.path.join(directory, snapshot_name(offset)), exc.found, exc.known) from None
        except (OSError, ValueError):
            continue
        if table.end_offset == offset:
            return table
    return None


def delete_snapshots(directory: str, keep) -> None:
    """Delete snapshot files whose offset fails keep(offset)."""
    for offset in snapshot_offsets(directory):
        if not keep(offset):
            try:
                os.unlink(os.path.join(directory, snapshot_name(offset)))
            except FileNotFoundError:
                pass
