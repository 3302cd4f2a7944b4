"""What ListTransactions and DescribeTransactions answer from the transaction coordinator's state (Kafka's
TransactionStateManager.listTransactionStates and the coordinator's describe).

Invariants:
- Dead transactional ids are never listed nor described (an id being removed is gone already).
- A state filter names Kafka's state names (TxnState values); names that are no state come back as unknown
  states and match nothing. Empty filters match everything.
- The duration filter (ms, -1: none) keeps the ids whose current transaction started longer ago than it
  (an id with no open transaction has no start, -1, and always passes, as in Kafka).
- Topics of a description are grouped by name, partitions ascending; an id with no open transaction has start
  time -1 (Kafka's "none"); an error's entry has Kafka's defaults (zeros).
"""

from __future__ import annotations

from typing import Iterable

from kio.schema.errors import ErrorCode

from shmbroker.node.timer.transactions.metadata import DEAD, TransactionMetadata, TxnState
from shmbroker.shm import messages as M

STATE_NAMES = frozenset(state.value for state in TxnState)


def unknown_states(states: Iterable[str]) -> list[str]:
    return sorted({state for state in states if state not in STATE_NAMES})


def listed(transactions: Iterable[TransactionMetadata], states: Iterable[str], producer_ids: Iterable[int],
           duration_filter_ms: int, now_wall_ms: int) -> list[tuple[str, int, str]]:
    """(transactional id, producer id, state name) of each transaction the filters keep."""
    states, producer_ids = set(states), set(producer_ids)
    kept = []
    for metadata in transactions:
        if metadata.state == DEAD:
            continue
        if states and metadata.state.value not in states:
            continue
        if producer_ids and metadata.producer_id not in producer_ids:
            continue
        if duration_filter_ms >= 0 and now_wall_ms - metadata.start_wall_ms <= duration_filter_ms:
            continue
        kept.append((metadata.transactional_id, metadata.producer_id, metadata.state.value))
    return sorted(kept)


def not_described(transactional_id: str, error: ErrorCode) -> tuple:
    """An error's DescribedTransaction: Kafka's defaults (zeros, no state) beside the error."""
    return M.DescribedTransaction(int(error), transactional_id, "", 0, 0, 0, 0, [])


def described(transactional_id: str, metadata: TransactionMetadata | None, error: ErrorCode | None = None) -> tuple:
    """A DescribedTransaction: the id's state, or `error` (TRANSACTIONAL_ID_NOT_FOUND for an unknown or dead one)."""
    if error is None and (metadata is None or metadata.state == DEAD):
        error = ErrorCode.transactional_id_not_found
    if error is not None:
        return not_described(transactional_id, error)
    topics: dict[str, list[int]] = {}
    for topic, partition in sorted(metadata.partitions):
        topics.setdefault(topic, []).append(partition)
    return M.DescribedTransaction(0, transactional_id, metadata.state.value, metadata.timeout_ms,
                                  metadata.start_wall_ms, metadata.producer_id, metadata.producer_epoch,
                                  [(topic, partitions) for topic, partitions in topics.items()])
