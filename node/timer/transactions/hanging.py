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
from typing import Callable

import numpy as np

from node.storage.records import ControlType, StorageError
from node.storage.store import PartitionStore
from node.timer.transactions.markers import COORDINATOR_EPOCH

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
        rows = self.store.rows()
        if not rows:
            return 0
        states = self.store.table.read_rows(np.asarray(rows, dtype=np.int64))
        now = self.clock()
        seen: dict[tuple[int, int, int], int] = {}
        aborted = 0
        for at in np.flatnonzero(states["first_unstable_offset"] >= 0).tolist():
            row = rows[at]
            topic, partition = self.store.owner(row)
            try:
                plog = self.store.log(row)
                for producer_id, (first, epoch) in plog.open_transactions().items():
                    key = (row, producer_id, first)
                    since = seen[key] = self._first_seen.get(key, now)
                    if now - since <= self.grace_ms or self._owned(producer_id, topic, partition):
                        continue
                    plog.append_marker(producer_id, epoch, ControlType.ABORT, COORDINATOR_EPOCH)
                    log.warning("aborted a hanging transaction of producer %d in %s-%d (open from offset %d, in no "
                                "transaction of the coordinator)", producer_id, topic, partition, first)
                    aborted += 1
            except StorageError as exc:
                log.warning("could not look for hanging transactions in %s-%d: %s", topic, partition, exc)
        self._first_seen = seen
        self.aborted += aborted
        return aborted
