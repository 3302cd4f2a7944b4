"""One transactional.id's state: Kafka's TransactionMetadata and its state machine (TransactionState).

    Empty ──AddPartitions/AddOffsets──> Ongoing ──EndTxn(commit)──> PrepareCommit ──markers──> CompleteCommit
      ^                                   │ ──EndTxn(abort), timeout,──> PrepareAbort ──markers──> CompleteAbort
      │                                   │   InitProducerId
      └──InitProducerId── CompleteCommit / CompleteAbort ──AddPartitions/AddOffsets──> Ongoing
    Dead: a transactional.id idle past transactional.id.expiration.ms, while its tombstone is written (then it is
    forgotten; an InitProducerId of it starts afresh with a new producer id).

Invariants:
- `transition()` allows exactly Kafka's transitions (VALID_PREVIOUS) and raises InvalidTransition otherwise:
  the coordinator checks the request first (answering Kafka's error code), so an InvalidTransition is a bug.
- `partitions`, `offsets` and `boot_id` are those of the current transaction: cleared when it completes.
- `pending` is True while a state record of this id waits for its fsync: any other request then answers
  CONCURRENT_TRANSACTIONS (Kafka's pendingState), so the records of one id are written one at a time, in order.
- to_record()/from_record() round-trip everything but `pending` (the record format is in state_log.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class TxnState(Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"


EMPTY, ONGOING = TxnState.EMPTY, TxnState.ONGOING
PREPARE_COMMIT, PREPARE_ABORT = TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT
COMPLETE_COMMIT, COMPLETE_ABORT, DEAD = TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT, TxnState.DEAD
COMPLETED = (COMPLETE_COMMIT, COMPLETE_ABORT)
PREPARED = (PREPARE_COMMIT, PREPARE_ABORT)

VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    EMPTY: frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT}),
    ONGOING: frozenset({ONGOING, EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT}),
    PREPARE_COMMIT: frozenset({ONGOING}),
    PREPARE_ABORT: frozenset({ONGOING}),
    COMPLETE_COMMIT: frozenset({PREPARE_COMMIT}),
    COMPLETE_ABORT: frozenset({PREPARE_ABORT}),
    DEAD: frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT}),
}
MAX_EPOCH = 32767  # a producer epoch is an int16; past it the producer gets a new id (Kafka's)
NO_PRODUCER_ID = NO_PRODUCER_EPOCH = -1

TopicPartition = tuple[str, int]
OffsetKey = tuple[str, str, int]  # group, topic, partition
PendingOffset = tuple[int, int, "str | None"]  # offset, leader epoch, metadata


class InvalidTransition(RuntimeError):
    """A transition Kafka's state machine does not have."""


@dataclass
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)  # AddOffsetsToTxn's groups
    offsets: dict[OffsetKey, PendingOffset] = field(default_factory=dict)  # TxnOffsetCommit's, until the commit
    start_wall_ms: int = -1  # when the current transaction began (Ongoing), for its timeout
    last_update_wall_ms: int = -1  # when the id's state last changed (its expiry counts from there)
    # KIP-360: the epoch before the last bump a producer asked for with its own epoch (-1 after a fencing bump),
    # and the producer id before the last one (given when the epoch ran out): a producer retrying such an
    # InitProducerId whose answer it lost is answered the current epoch rather than fenced.
    last_producer_epoch: int = -1
    previous_producer_id: int = -1
    # The machine's boot id when the current transaction began: its records wait in the page cache for its commit,
    # so one begun before the machine restarted may have lost some (the coordinator aborts it at load).
    boot_id: str = ""
    pending: bool = False

    def transition(self, state: TxnState) -> None:
        if self.state not in VALID_PREVIOUS[state]:
            raise InvalidTransition(f"{self.transactional_id}: {self.state.value} -> {state.value}")
        self.state = state
        if state in COMPLETED or state == EMPTY:
            self.partitions, self.groups, self.offsets, self.start_wall_ms = set(), set(), {}, -1
            self.boot_id = ""

    def begin(self, wall_ms: int, boot_id: str) -> None:
        """Ongoing, the transaction's clock started (and the machine's boot id kept) if it was not open."""
        if self.state != ONGOING:
            self.start_wall_ms = wall_ms
            self.boot_id = boot_id
        self.transition(ONGOING)

    def copy(self) -> "TransactionMetadata":
        """An independent copy (its own sets), not pending: what a state change writes before it is installed."""
        return TransactionMetadata(self.transactional_id, self.producer_id, self.producer_epoch, self.timeout_ms,
                                   self.state, set(self.partitions), set(self.groups), dict(self.offsets),
                                   self.start_wall_ms, self.last_update_wall_ms, self.last_producer_epoch,
                                   self.previous_producer_id, self.boot_id)

    def bump_epoch(self) -> bool:
        """The next epoch; False when the epoch is exhausted (the caller then gives the id a new producer id)."""
        if self.epoch_exhausted(self.producer_epoch):
            return False
        self.producer_epoch += 1
        return True

    @staticmethod
    def epoch_exhausted(epoch: int) -> bool:
        return epoch >= MAX_EPOCH - 1

    def to_record(self) -> dict:
        return {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch, "timeout_ms": self.timeout_ms,
                "state": self.state.value, "partitions": sorted(self.partitions), "groups": sorted(self.groups),
                "offsets": [[*key, *value] for key, value in sorted(self.offsets.items(), key=lambda kv: kv[0])],
                "start_wall_ms": self.start_wall_ms, "last_update_wall_ms": self.last_update_wall_ms,
                "last_producer_epoch": self.last_producer_epoch, "previous_producer_id": self.previous_producer_id,
                "boot_id": self.boot_id}

    @classmethod
    def from_record(cls, transactional_id: str, record: dict) -> "TransactionMetadata":
        """Raises KeyError, TypeError or ValueError on a record that is not one."""
        return cls(transactional_id, int(record["producer_id"]), int(record["producer_epoch"]),
                   int(record["timeout_ms"]), TxnState(record["state"]),
                   {(str(topic), int(partition)) for topic, partition in record["partitions"]},
                   {str(group) for group in record["groups"]},
                   {(str(g), str(t), int(p)): (int(offset), int(epoch), None if metadata is None else str(metadata))
                    for g, t, p, offset, epoch, metadata in record["offsets"]},
                   int(record["start_wall_ms"]), int(record["last_update_wall_ms"]),
                   int(record.get("last_producer_epoch", -1)), int(record.get("previous_producer_id", -1)),
                   str(record.get("boot_id", "")))
