"""Hanging transactions: open in a partition, but in no transaction of the coordinator.

A transactional batch opens a transaction in its partition whatever the coordinator knows; only the coordinator's
markers close it. A client that writes to a partition it never added (AddPartitionsToTxn) leaves a transaction no
marker will ever close, and read_committed readers of that partition stop at it for good (Kafka's "hanging
transaction", which its operators abort by hand). The sweep finds them and aborts them, as the node aborts a
timed-out transaction.

Invariants:
- A transaction is aborted here only once it has been seen open, at the same first offset, for longer than
  grace_ms (more than any transaction may last), and only if no open or completing transaction of the
  coordinator has that producer id and that partition: a transaction the coordinator owns is never touched.
- The ABORT marker carries the partition's own epoch for the producer, so the partition takes it; a producer
  still writing with that epoch is not fenced by it (its next batch opens a new transaction, swept the same way).
"""

from __future__ import annotations

import logging
from typing import Callable, NamedTuple

import numpy as np

from shmbroker.node.storage.records import ControlType, StorageError
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.transactions.markers import COORDINATOR_EPOCH

log = logging.getLogger("shmbroker.transactions")


class HangingTransactions:
    def __init__(self, store: PartitionStore, owned: Callable[[int, str, int], bool], grace_ms: int,
                 clock: Callable[[], int]) -> None:
        self.store = store
        self._owned = owned  # (producer id, topic, partition) -> whether a coordinator transaction holds it
        self.grace_ms = grace_ms
        self.clock = clock
        self._first_seen: dict[tuple[int, int, int], int] = {}  # (row, producer id, first offset) -> when
        self.aborted = 0

    def sweep(self) -> int:
        """Look at every partition with an open transaction; abort the hanging ones. Returns how many."""
        now = self.clock()
        seen: dict[tuple[int, int, int], int] = {}
        aborted = 0
        for found in open_in_partitions(self.store):
            key = (found.row, found.producer_id, found.first_offset)
            since = seen[key] = self._first_seen.get(key, now)
            if now - since <= self.grace_ms or self._owned(found.producer_id, found.topic, found.partition):
                continue
            try:
                self.store.log(found.row).append_marker(found.producer_id, found.epoch, ControlType.ABORT,
                                                        COORDINATOR_EPOCH)
            except StorageError as exc:
                log.warning("could not abort a hanging transaction in %s-%d: %s", found.topic, found.partition, exc)
                continue
            log.warning("aborted a hanging transaction of producer %d in %s-%d (open from offset %d, in no "
                        "transaction of the coordinator)", found.producer_id, found.topic, found.partition,
                        found.first_offset)
            aborted += 1
        self._first_seen = seen
        self.aborted += aborted
        return aborted


class OpenTransaction(NamedTuple):
    """A transaction open in one partition: the partition's producer state, whatever the coordinator knows."""
    row: int
    topic: str
    partition: int
    producer_id: int
    first_offset: int
    epoch: int


def open_in_partitions(store: PartitionStore) -> list[OpenTransaction]:
    """Every transaction open in a partition now (the partitions whose row shows one are looked at); a partition
    that cannot be read is logged and skipped."""
    rows = store.rows()
    if not rows:
        return []
    states = store.table.read_rows(np.asarray(rows, dtype=np.int64))
    found = []
    for at in np.flatnonzero(states["first_unstable_offset"] >= 0).tolist():
        row = rows[at]
        topic, partition = store.owner(row)
        try:
            opened = store.log(row).open_transactions()
        except StorageError as exc:
            log.warning("could not look for open transactions in %s-%d: %s", topic, partition, exc)
            continue
        found.extend(OpenTransaction(row, topic, partition, producer_id, first, epoch)
                     for producer_id, (first, epoch) in opened.items())
    return found
