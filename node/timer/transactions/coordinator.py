"""The transaction coordinator of the node (every transactional.id's): Kafka's TransactionCoordinator, in the timer
process, driven by the transaction messages of the worker-timer contract (shm.messages) and by its timers.

The algorithm (KIP-98), per transactional.id (node.timer.transactions.metadata has the state machine):
- InitProducerId gives the id a producer id (kept for good) and a new epoch (bumped on every init, so the
  producer of an older epoch is fenced: PRODUCER_FENCED here, INVALID_PRODUCER_EPOCH at the partitions). A
  transaction still open from the previous epoch is aborted first (with the bumped epoch) and the client
  answered CONCURRENT_TRANSACTIONS; it retries and gets the epoch once the abort completed. A producer that
  names its own producer id and epoch (KIP-360, v3+: it bumps its epoch after an abortable error) gets the
  next epoch only if they are current; its retry of a bump it did not hear back from gets the current epoch
  again (the id keeps the epoch before the bump); another producer's id or an older epoch is PRODUCER_FENCED.
  An epoch that ran out gives the id a new producer id.
- AddPartitionsToTxn and AddOffsetsToTxn open the transaction (Ongoing) or add to it; TxnOffsetCommit adds the
  consumer offsets it will commit. Each change is a record of `__transaction_state`, fsync'd before the answer,
  except an AddPartitionsToTxn's that widens an Ongoing transaction, answered once appended (the producer waits for
  it before it writes to the partition; the group commit's next round or the fsync of the EndTxn's decision makes
  it durable). The one that begins a transaction is fsync'd, which makes the previous transaction's Complete*
  record durable too: a restart never completes a transaction again once the next one has begun.
- EndTxn commit first waits until every partition of the transaction is fsync'd up to its log end: the workers
  answer a transaction's acks=all records once appended, and its commit is their durability point. Then EndTxn
  writes PrepareCommit or PrepareAbort (fsync'd: the decision), then the markers to every partition of
  the transaction and, for a commit once they are appended, the pending offsets to `__consumer_offsets` (through
  the group coordinator: OffsetFetch sees them once fsync'd), both fsync'd by one group-commit round, then
  CompleteCommit or CompleteAbort. EndTxn is answered once the markers are appended (after the fsyncs of the
  records and of the decision), so a read_committed consumer sees the outcome as soon as the producer's commit
  returns (a commit with offsets once they are durable too, so that OffsetFetch shows them then); the id's next
  requests (the next transaction's AddPartitionsToTxn) are held until the markers and offsets are durable,
  rather than answered CONCURRENT_TRANSACTIONS, which clients retry only after a backoff. So are the requests
  that come while one of the id's state records waits for its fsync (an AddPartitionsToTxn for the next
  partition, an AddOffsetsToTxn): each runs once the record before it is durable, in arrival order
  (held_requests_per_id of them per id, each for held_request_max_ms at most: beyond, CONCURRENT_TRANSACTIONS
  as Kafka answers).
- A transaction open longer than its timeout (transaction.timeout.ms, at most transaction_max_timeout_ms) is
  aborted by the node with a bumped epoch (a timer in the wheel per open transaction): a killed client never
  holds readers back for longer than its timeout.
- At start the state is loaded from `__transaction_state` (after the group coordinator's offsets, which a
  commit writes): a Prepare* completes again (markers and offsets written again change nothing that was
  already written), an Ongoing gets its timeout back by the wall clock. Then the partitions are reconciled with
  it (reconcile_partitions): a partition holding an open transaction of an id's producer id and epoch that a
  lost AddPartitionsToTxn record left out joins the id's Ongoing transaction; if the id has none (the partition
  was written without AddPartitionsToTxn), that transaction is aborted with the producer fenced.

Error codes are Kafka's: COORDINATOR_LOAD_IN_PROGRESS while loading; INVALID_PRODUCER_ID_MAPPING for an unknown
id or another producer id; PRODUCER_FENCED for another epoch (the worker turns it into INVALID_PRODUCER_EPOCH
for the request versions before KIP-588); CONCURRENT_TRANSACTIONS to an InitProducerId while it aborts the
open transaction of the previous epoch; INVALID_TXN_STATE for an EndTxn that does not match the state; INVALID_TRANSACTION_TIMEOUT.

Invariants:
- Every request gets exactly one REPLY, unless the timer process dies first (then the worker answers it).
- The in-memory state of an id changes only when its record is fsync'd (a copy is written, then installed),
  except the Complete* step, whose record may be lost harmlessly (its Prepare* completes again after a crash,
  and any later record of the id is in the same log after it; a transaction begins with an fsync'd record), and
  the record of an AddPartitionsToTxn that widens an Ongoing transaction, installed once appended: its loss only
  drops partitions of a durably Ongoing transaction, which the reconciliation at start gives back (the log is
  fsync'd as a whole: a durable record makes every record before it durable).
- A commit is answered only for a transaction whose every partition is marked: a partition written in a
  transaction is in the coordinator's state, or found by the reconciliation before any request is answered.
- A PrepareCommit is written only once the transaction's records are durable, so no crash leaves a durable
  commit of records the page cache lost; and a transaction still Ongoing at load that began before the machine
  last restarted (its boot id, kept in its state record, is not this boot's) is aborted with its producer fenced,
  so its producer cannot commit what is left of it after a machine crash lost some of its records; one whose
  record has no boot id (a version before them wrote it) is given this boot's at load (an fsync'd record).
- Markers are written only after the decision (Prepare*) is durable, so a transaction is all or nothing in
  every partition, whatever process dies when.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from kio.schema.errors import ErrorCode

from shmbroker.node.config import TransactionConfig, WheelConfig
from shmbroker.node.storage import producer_ids
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.groups.sessions import Sessions
from shmbroker.node.timer.outbox import Outbox
from shmbroker.node.timer.transactions import listing
from shmbroker.node.timer.transactions.hanging import open_in_partitions
from shmbroker.node.timer.transactions.held import HeldRequests
from shmbroker.node.timer.transactions.markers import MarkerWriter
from shmbroker.node.timer.transactions.metadata import (COMPLETE_ABORT, COMPLETE_COMMIT, COMPLETED, DEAD, EMPTY,
                                                        NO_PRODUCER_EPOCH, NO_PRODUCER_ID, ONGOING, PREPARE_ABORT,
                                                        PREPARE_COMMIT, PREPARED, TransactionMetadata)
from shmbroker.node.timer.transactions.state_log import TransactionStateLog, wall_ms
from shmbroker.shm import messages as M

log = logging.getLogger("shmbroker.transactions")
E = ErrorCode
InitAnswer = M.reply_class(M.Kind.INIT_PRODUCER_ID)
Waiter = tuple[int, int, M.Kind]  # worker, request id, kind
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def machine_boot_id() -> str:
    """Linux's id of this boot of the machine (a new one after every restart); empty where there is none."""
    try:
        with open(BOOT_ID_PATH) as file:
            return file.read().strip()
    except OSError:
        return ""


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class TransactionCoordinator:
    def __init__(self, config: TransactionConfig, outbox: Outbox, state_log: TransactionStateLog,
                 markers: MarkerWriter, store: PartitionStore, commit_offsets: Callable, offsets_loading: Callable,
                 wheel: WheelConfig, now_ms: int, offset_metadata_max_bytes: int,
                 clock: Callable[[], int] = monotonic_ms,
                 member_error: Callable[[str, str, str | None, int], E] = lambda *member: E.none,
                 boot_id: str | None = None) -> None:
        self.config = config
        self.outbox = outbox
        self.state_log = state_log
        self.markers = markers
        self.store = store
        # (group, {(topic, partition): (offset, leader epoch, metadata)}, done(flushed, fault)): the group
        # coordinator's durable commit.
        self._commit_offsets = commit_offsets
        self._offsets_loading = offsets_loading  # the group coordinator's load must end before this one starts
        self.offset_metadata_max_bytes = offset_metadata_max_bytes
        # The group coordinator's KIP-447 checks of a TxnOffsetCommit's member (group, member, instance, generation).
        self._member_error = member_error
        self.clock = clock
        self.boot_id = machine_boot_id() if boot_id is None else boot_id  # this run's (TransactionMetadata.boot_id)
        self.transactions: dict[str, TransactionMetadata] = {}
        self.timeouts = Sessions(wheel, now_ms, self._timed_out)  # open transactions' deadlines
        self.retries = Sessions(wheel, now_ms, self._retry_completion)  # completions to try again
        self.completing: set[str] = set()  # ids whose completion (markers, offsets) is not durable yet
        self.held = HeldRequests(config.held_requests_per_id, config.held_request_max_ms, wheel, now_ms, clock)
        self.end_waiters: dict[str, list[Waiter]] = {}  # EndTxns answered once their offsets are durable
        self.loading = True
        self.commits = self.aborts = self.timed_out = 0  # (the stats segment counts them)
        self.reconciled = 0  # partitions given back to their transaction at start (reconcile_partitions)
        self.handlers: dict[M.Kind, Callable[[int, Any], None]] = {
            M.Kind.INIT_PRODUCER_ID: self.init_producer_id,
            M.Kind.ADD_PARTITIONS_TO_TXN: self.add_partitions,
            M.Kind.ADD_OFFSETS_TO_TXN: self.add_offsets,
            M.Kind.END_TXN: self.end_txn,
            M.Kind.TXN_OFFSET_COMMIT: self.txn_offset_commit,
            M.Kind.LIST_TRANSACTIONS: self.list_transactions,
            M.Kind.DESCRIBE_TRANSACTIONS: self.describe_transactions,
        }

    # -- the timer loop's calls ---------------------------------------------------------------

    def turn(self) -> None:
        """Once per loop turn while loading: load a slice of the state log, then finish what was in flight."""
        if self.loading and not self._offsets_loading() and self.state_log.load_step():
            self.loading = False
            self.transactions = self.state_log.loaded
            self.state_log.loaded = {}
            now, wall = self.clock(), wall_ms()
            for metadata in self.transactions.values():
                if metadata.state == ONGOING:
                    remaining = metadata.start_wall_ms + metadata.timeout_ms - wall
                    self.timeouts.renew(metadata.transactional_id, now + max(0, remaining))
                elif metadata.state in PREPARED:
                    self._complete(metadata)
            self.reconcile_partitions()
            # Its acks=all records waited in the page cache for its commit: after a restart of the machine some may
            # be gone, and its producer could still commit the rest. It is aborted instead, its producer fenced.
            for transactional_id in [m.transactional_id for m in self.transactions.values()
                                     if m.state == ONGOING and m.boot_id and m.boot_id != self.boot_id]:
                self._abort_open(transactional_id, "began before the machine restarted (records of it may be lost)")
            for metadata in [m for m in self.transactions.values()
                             if m.state == ONGOING and not m.boot_id and self.boot_id]:
                self._stamp_boot_id(metadata)

    def _stamp_boot_id(self, current: TransactionMetadata) -> None:
        """Give this boot's id to an Ongoing transaction whose record has none (written by a version before boot
        ids, whose workers answered its records once fsync'd; this one's answer them once appended), so that a
        later machine restart aborts it like any other. If the record is lost, the next load gives it again."""
        changed = current.copy()
        changed.boot_id = self.boot_id

        def failed(error: E) -> None:
            log.warning("transaction of %r: could not record this boot's id for it (%s); the next load tries again",
                        current.transactional_id, error.name)

        self._persist(current, changed, lambda metadata: None, failed)

    def reconcile_partitions(self) -> int:
        """Give the coordinator's transactions the partitions they lost (at start, once the state is loaded, before
        any request is answered): a transaction open in a partition, of a producer id and epoch the coordinator
        has, that the coordinator does not list there. An AddPartitionsToTxn that widens an Ongoing transaction is
        answered once its record is appended, so a crash may lose the record of a partition its producer then
        wrote to: the partition joins the Ongoing transaction (its EndTxn or its timeout marks it). If the id has
        no open transaction (Empty, Complete*; the AddPartitionsToTxn that begins one is fsync'd), its client wrote
        without AddPartitionsToTxn: no commit of that transaction was answered, and it is aborted with the epoch
        bumped, which fences the producer (else it could commit a transaction that lacks the partition), rather
        than by the hanging sweep much later. Any other open transaction is the hanging sweep's. Returns how many
        partitions were given an owner."""
        by_producer = {metadata.producer_id: metadata for metadata in self.transactions.values()
                       if metadata.state != DEAD}
        lost: dict[str, set[tuple[str, int]]] = {}
        for found in open_in_partitions(self.store):
            metadata = by_producer.get(found.producer_id)
            if metadata is None or metadata.producer_epoch != found.epoch or metadata.state in PREPARED:
                continue  # the hanging sweep's: no record lost here could have opened it
            if metadata.state == ONGOING and (found.topic, found.partition) in metadata.partitions:
                continue
            lost.setdefault(metadata.transactional_id, set()).add((found.topic, found.partition))
        for transactional_id, partitions in lost.items():
            current = self.transactions[transactional_id]
            if current.state == ONGOING:
                log.warning("transaction of %r: %s open but not in its state (a record lost in a crash): added",
                            transactional_id, sorted(partitions))
                # Installed at once: EndTxn's decision record, fsync'd before any marker, lists them.
                changed = current.copy()
                changed.partitions |= partitions
                changed.last_update_wall_ms = wall_ms()
                self.transactions[transactional_id] = changed
                self.state_log.write(changed, self.clock(), lambda flushed, fault=False: None, urgent=False)
            else:
                self._abort_unrecorded(current, partitions)
        self.reconciled += sum(len(partitions) for partitions in lost.values())
        return sum(len(partitions) for partitions in lost.values())

    def _abort_unrecorded(self, current: TransactionMetadata, partitions: set[tuple[str, int]]) -> None:
        """Abort a transaction the coordinator never had (see reconcile_partitions), fencing its producer."""
        transactional_id = current.transactional_id
        log.warning("transaction of %r: %s open, but the id has no open transaction (written without "
                    "AddPartitionsToTxn): aborting it, its producer fenced", transactional_id, sorted(partitions))
        changed = current.copy()
        changed.partitions |= partitions
        changed.begin(wall_ms(), self.boot_id)
        changed.bump_epoch()  # an exhausted epoch stays: the abort still closes the transaction
        changed.transition(PREPARE_ABORT)

        def failed(error: E) -> None:
            log.error("transaction of %r: cannot write its abort (%s); the hanging sweep aborts it later",
                      transactional_id, error.name)

        self._persist(current, changed, self._complete, failed)

    def advance(self, now_ms: int) -> None:
        self.timeouts.advance(now_ms)
        self.retries.advance(now_ms)
        self.held.advance(now_ms)

    def next_expiration(self) -> int | None:
        due = [d for timers in (self.timeouts, self.retries, self.held) if (d := timers.next_expiration()) is not None]
        if self.loading:
            due.append(self.clock())  # load on the next turn
        return min(due) if due else None

    def owns(self, producer_id: int, topic: str, partition: int) -> bool:
        """Whether an open or completing transaction of this producer id has the partition (node.timer.transactions.
        hanging); while loading, everything is owned."""
        if self.loading:
            return True
        return any(metadata.producer_id == producer_id and metadata.state in (ONGOING, *PREPARED)
                   and (topic, partition) in metadata.partitions for metadata in self.transactions.values())

    def open_transactions(self) -> int:
        return sum(1 for metadata in self.transactions.values() if metadata.state in (ONGOING, *PREPARED))

    def describe(self) -> dict[str, dict]:
        """Every transactional id's state (what `shmbroker transactions` shows), the open transactions first, then
        the most recently changed."""
        ordered = sorted(self.transactions.values(),
                         key=lambda m: (m.state not in (ONGOING, *PREPARED), -m.last_update_wall_ms))
        return {m.transactional_id: {
            "state": m.state.value, "producer_id": m.producer_id, "producer_epoch": m.producer_epoch,
            "timeout_ms": m.timeout_ms, "start_ms": m.start_wall_ms, "last_update_ms": m.last_update_wall_ms,
            "partitions": sorted(m.partitions), "groups": sorted(m.groups)} for m in ordered}

    def list_transactions(self, worker: int, message: Any) -> None:
        """ListTransactions (node.timer.transactions.listing says what the filters keep)."""
        answer = M.reply_class(M.Kind.LIST_TRANSACTIONS)
        if self.loading:
            self._reply(self._waiter(worker, message), answer(int(E.coordinator_load_in_progress)))
            return
        self._reply(self._waiter(worker, message), answer(
            0, listing.unknown_states(message.states),
            listing.listed(self.transactions.values(), message.states, message.producer_ids,
                           message.duration_filter_ms, wall_ms())))

    def describe_transactions(self, worker: int, message: Any) -> None:
        loading = E.coordinator_load_in_progress if self.loading else None
        self._reply(self._waiter(worker, message), M.reply_class(M.Kind.DESCRIBE_TRANSACTIONS)([
            listing.described(transactional_id, self.transactions.get(transactional_id), loading)
            for transactional_id in message.transactional_ids]))

    # -- answers ------------------------------------------------------------------------------

    def _reply(self, waiter: Waiter, answer: tuple) -> None:
        worker, request_id, kind = waiter
        self.outbox.send(worker, M.encode_reply(request_id, kind, answer))

    def _error_only(self, waiter: Waiter, error: E) -> None:
        self._reply(waiter, M.reply_class(waiter[2])(int(error)))

    def _partition_errors(self, waiter: Waiter, topics, error_of: Callable[[str, int], E]) -> None:
        self._reply(waiter, M.reply_class(waiter[2])(
            [(topic, [(partition, int(error_of(topic, partition))) for partition in partitions])
             for topic, partitions in topics]))

    @staticmethod
    def _waiter(worker: int, message: Any) -> Waiter:
        return (worker, message.request_id, message.kind)

    def _producer_error(self, message: Any) -> tuple[TransactionMetadata | None, E]:
        """The id's metadata and the error a request of this producer gets before anything else (NONE: go on)."""
        if self.loading:
            return None, E.coordinator_load_in_progress
        metadata = self.transactions.get(message.transactional_id)
        if metadata is None or metadata.state == DEAD or metadata.producer_id != message.producer_id:
            return metadata, E.invalid_producer_id_mapping
        if metadata.producer_epoch != message.producer_epoch:
            return metadata, E.producer_fenced
        if metadata.pending:
            return metadata, E.concurrent_transactions
        return metadata, E.none

    def _after_completion(self, worker: int, message: Any, handler: Callable[[int, Any], None]) -> bool:
        """Hold a request of an id whose completion or state write is not durable yet, to run once it is (rather
        than answer CONCURRENT_TRANSACTIONS, which clients retry only after a backoff: a producer's
        AddPartitionsToTxn for its next partition, or its AddOffsetsToTxn, often comes while the previous
        record waits for its fsync), within the bounds of `held`; beyond them it is answered
        CONCURRENT_TRANSACTIONS. True if it was held or answered."""
        transactional_id = message.transactional_id
        if self.loading:
            return False
        metadata = self.transactions.get(transactional_id)
        if transactional_id not in self.completing and (metadata is None or not metadata.pending):
            return False
        if not self.held.hold(transactional_id, lambda: handler(worker, message),
                              lambda: self._refuse_concurrent(worker, message)):
            self._refuse_concurrent(worker, message)
        return True

    def _refuse_concurrent(self, worker: int, message: Any) -> None:
        """CONCURRENT_TRANSACTIONS, in the shape of the request's answer."""
        waiter = self._waiter(worker, message)
        error = E.concurrent_transactions
        if message.kind == M.Kind.INIT_PRODUCER_ID:
            self._reply(waiter, InitAnswer(int(error), -1, -1))
        elif message.kind == M.Kind.ADD_PARTITIONS_TO_TXN:
            self._partition_errors(waiter, message.topics, lambda t, p: error)
        elif message.kind == M.Kind.TXN_OFFSET_COMMIT:
            topics = [(topic, [p[0] for p in partitions]) for topic, partitions in message.topics]
            self._partition_errors(waiter, topics, lambda t, p: error)
        else:  # AddOffsetsToTxn, EndTxn
            self._error_only(waiter, error)

    def _run_held(self, transactional_id: str) -> None:
        def ready() -> bool:
            metadata = self.transactions.get(transactional_id)
            return transactional_id not in self.completing and not (metadata is not None and metadata.pending)

        self.held.release(transactional_id, ready)

    # -- durable changes ------------------------------------------------------------------------

    def _persist(self, current: TransactionMetadata, changed: TransactionMetadata,
                 durable: Callable[[TransactionMetadata], None], failed: Callable[[E], None]) -> None:
        """Write `changed` (a copy of `current`), install it once fsync'd and call `durable(changed)`; else leave
        `current` as it was and call `failed(error)` (NOT_COORDINATOR on a storage fault, as Kafka answers an
        append that failed; COORDINATOR_NOT_AVAILABLE when the fsync did not come in time: clients retry)."""
        current.pending = True
        changed.last_update_wall_ms = wall_ms()

        def done(flushed: bool, fault: bool = False) -> None:
            current.pending = False
            if not flushed:
                failed(E.not_coordinator if fault else E.coordinator_not_available)
            else:
                self.transactions[changed.transactional_id] = changed
                durable(changed)
            if changed.transactional_id in self.held:  # requests held while this write was in flight
                self._run_held(changed.transactional_id)

        self.state_log.write(changed, self.clock(), done)

    def _install(self, current: TransactionMetadata, changed: TransactionMetadata,
                 appended: Callable[[TransactionMetadata], None], failed: Callable[[E], None]) -> None:
        """Write `changed` and install it once appended, not waiting for its fsync (the group commit's next round,
        or the fsync of a later record of the log, makes it durable): for a change whose loss the reconciliation at
        start repairs (reconcile_partitions)."""
        changed.last_update_wall_ms = wall_ms()
        failure: list[E] = []
        appending = [True]

        def done(flushed: bool, fault: bool = False) -> None:
            # Called during write() only if the append failed; a later failed fsync fails the next durable record too.
            if appending[0] and not flushed:
                failure.append(E.not_coordinator if fault else E.coordinator_not_available)

        self.state_log.write(changed, self.clock(), done, urgent=False)
        appending[0] = False
        if failure:
            return failed(failure[0])
        self.transactions[changed.transactional_id] = changed
        appended(changed)
        if changed.transactional_id in self.held:
            self._run_held(changed.transactional_id)

    # -- InitProducerId -----------------------------------------------------------------------

    def init_producer_id(self, worker: int, message: Any) -> None:
        if self._after_completion(worker, message, self.init_producer_id):
            return
        waiter = self._waiter(worker, message)
        transactional_id, timeout_ms = message.transactional_id, message.transaction_timeout_ms

        def answer(error: E, metadata: TransactionMetadata | None = None) -> None:
            ok = metadata is not None and not error
            self._reply(waiter, InitAnswer(int(error), metadata.producer_id if ok else -1,
                                           metadata.producer_epoch if ok else -1))

        if self.loading:
            return answer(E.coordinator_load_in_progress)
        if not transactional_id:
            return answer(E.invalid_request)
        if not 0 < timeout_ms <= self.config.transaction_max_timeout_ms:
            return answer(E.invalid_transaction_timeout)
        current = self.transactions.get(transactional_id)
        if current is None:
            if not self.state_log.ensure_created():
                return answer(E.coordinator_not_available)
            try:
                producer_id = producer_ids.allocate(self.store.data_dir)
            except OSError as exc:
                log.warning("cannot allocate a producer id for transactional id %r: %s", transactional_id, exc)
                return answer(E.coordinator_not_available)
            current = TransactionMetadata(transactional_id, producer_id, -1, timeout_ms)
            self.transactions[transactional_id] = current  # pending until its first record is durable

            def forget(error: E) -> None:
                if self.transactions.get(transactional_id) is current:
                    del self.transactions[transactional_id]
                answer(error)

            changed = current.copy()
            changed.producer_epoch = 0
            changed.transition(EMPTY)
            return self._persist(current, changed, lambda metadata: answer(E.none, metadata), forget)
        expected = None if message.expected_producer_id == NO_PRODUCER_ID else \
            (message.expected_producer_id, message.expected_producer_epoch)
        if current.pending:
            return answer(E.concurrent_transactions)
        if expected is not None and not self._may_reinit(current, *expected):
            return answer(E.producer_fenced)
        if current.state in PREPARED:
            return answer(E.concurrent_transactions)
        changed = current.copy()
        changed.timeout_ms = timeout_ms
        if current.state == ONGOING:
            # Fence the old epoch and abort its transaction; the client retries and gets the next epoch then.
            changed.bump_epoch()
            changed.last_producer_epoch = NO_PRODUCER_EPOCH
            changed.transition(PREPARE_ABORT)
            self.timeouts.forget(transactional_id)

            def abort_durable(metadata: TransactionMetadata) -> None:
                answer(E.concurrent_transactions)
                self._complete(metadata)

            return self._persist(current, changed, abort_durable, answer)
        expected_epoch = None if expected is None else expected[1]
        if current.epoch_exhausted(current.producer_epoch) and expected_epoch in (None, current.producer_epoch):
            try:
                changed.producer_id, changed.producer_epoch = producer_ids.allocate(self.store.data_dir), 0
            except OSError as exc:
                log.warning("cannot allocate a producer id for transactional id %r: %s", transactional_id, exc)
                return answer(E.coordinator_not_available)
            changed.previous_producer_id = current.producer_id
            changed.last_producer_epoch = current.producer_epoch if expected is not None else NO_PRODUCER_EPOCH
        elif expected_epoch is None or current.producer_epoch in (NO_PRODUCER_EPOCH, expected_epoch):
            changed.bump_epoch()
            changed.last_producer_epoch = NO_PRODUCER_EPOCH if expected is None else current.producer_epoch
        elif expected_epoch != current.last_producer_epoch:  # equal: a retry of a bump it did not hear back from
            log.info("transactional id %r: InitProducerId with epoch %d, the current is %d: fenced", transactional_id,
                     expected_epoch, current.producer_epoch)
            return answer(E.producer_fenced)
        changed.transition(EMPTY)
        self._persist(current, changed, lambda metadata: answer(E.none, metadata), answer)

    @staticmethod
    def _may_reinit(current: TransactionMetadata, producer_id: int, producer_epoch: int) -> bool:
        """Kafka's isValidProducerId: a producer naming itself may bump its id's epoch if the id has no epoch yet,
        if it is the id's producer, or if it is the previous producer id whose epoch ran out (a retry of the
        InitProducerId that gave the id a new producer id)."""
        return (current.producer_epoch == NO_PRODUCER_EPOCH or producer_id == current.producer_id
                or producer_id == current.previous_producer_id and current.epoch_exhausted(producer_epoch))

    # -- AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit ----------------------------------

    def add_partitions(self, worker: int, message: Any) -> None:
        if self._after_completion(worker, message, self.add_partitions):
            return
        waiter = self._waiter(worker, message)
        topics = [(topic, list(partitions)) for topic, partitions in message.topics]
        current, error = self._producer_error(message)
        if not error and current.state in PREPARED:
            error = E.concurrent_transactions
        if error:
            return self._partition_errors(waiter, topics, lambda t, p: error)
        wanted = {(topic, partition) for topic, partitions in topics for partition in partitions}
        unknown = {tp for tp in wanted if self.store.row(*tp) is None or self.store.is_internal(tp[0])}
        if unknown:  # as Kafka: nothing is added, the known partitions answer OPERATION_NOT_ATTEMPTED
            return self._partition_errors(waiter, topics, lambda t, p: E.unknown_topic_or_partition
                                          if (t, p) in unknown else E.operation_not_attempted)
        if current.state == ONGOING and wanted <= current.partitions:
            return self._partition_errors(waiter, topics, lambda t, p: E.none)
        changed = current.copy()
        changed.partitions |= wanted
        # Widening an Ongoing transaction is answered once appended: the producer's records wait for this answer, and
        # a lost record is repaired at start. Beginning one is fsync'd: that makes the previous transaction's
        # Complete* record durable too, whose loss would make a restart complete that transaction again, and its
        # markers would then close the records of this one in a partition both wrote to.
        self._begin(current, changed, lambda error: self._partition_errors(waiter, topics, lambda t, p: error),
                    durably=current.state != ONGOING)

    def add_offsets(self, worker: int, message: Any) -> None:
        if self._after_completion(worker, message, self.add_offsets):
            return
        waiter = self._waiter(worker, message)
        current, error = self._producer_error(message)
        if not error and current.state in PREPARED:
            error = E.concurrent_transactions
        if not error and not message.group:
            error = E.invalid_group_id
        if error:
            return self._error_only(waiter, error)
        if current.state == ONGOING and message.group in current.groups:
            return self._error_only(waiter, E.none)
        changed = current.copy()
        changed.groups.add(message.group)
        self._begin(current, changed, lambda error: self._error_only(waiter, error))

    def _begin(self, current: TransactionMetadata, changed: TransactionMetadata, answer: Callable[[E], None],
               durably: bool = True) -> None:
        """Open (or widen) the transaction: Ongoing, durable (or, not `durably`, appended), its timeout armed when it
        just began."""
        starting = current.state != ONGOING
        changed.begin(wall_ms(), self.boot_id)

        def written(metadata: TransactionMetadata) -> None:
            if starting:
                self.timeouts.renew(metadata.transactional_id, self.clock() + metadata.timeout_ms)
            answer(E.none)

        (self._persist if durably else self._install)(current, changed, written, answer)

    def txn_offset_commit(self, worker: int, message: Any) -> None:
        if self._after_completion(worker, message, self.txn_offset_commit):
            return
        waiter = self._waiter(worker, message)
        topics = [(topic, [p[0] for p in partitions]) for topic, partitions in message.topics]
        current, error = self._producer_error(message)
        if not error and current.state != ONGOING:
            error = E.concurrent_transactions if current.state in PREPARED else E.invalid_txn_state
        if not error and not message.group:
            error = E.invalid_group_id
        if not error:
            error = self._member_error(message.group, message.member, message.instance, message.generation)
        if error:
            return self._partition_errors(waiter, topics, lambda t, p: error)
        refused, entries = {}, {}
        for topic, partitions in message.topics:
            for partition, offset, leader_epoch, metadata in partitions:
                if self.store.row(topic, partition) is None:
                    refused[(topic, partition)] = E.unknown_topic_or_partition
                elif metadata is not None and len(metadata.encode()) > self.offset_metadata_max_bytes:
                    refused[(topic, partition)] = E.offset_metadata_too_large
                else:
                    entries[(message.group, topic, partition)] = (int(offset), int(leader_epoch), metadata)
        if not entries:
            return self._partition_errors(waiter, topics, lambda t, p: refused.get((t, p), E.none))
        changed = current.copy()
        changed.groups.add(message.group)
        changed.offsets.update(entries)
        self._persist(current, changed,
                      lambda metadata: self._partition_errors(waiter, topics, lambda t, p: refused.get((t, p), E.none)),
                      lambda error: self._partition_errors(waiter, topics, lambda t, p: refused.get((t, p), error)))

    def pending_offsets(self, group: str) -> set[tuple[str, int]]:
        """The (topic, partition)s of `group` whose offsets a transaction will commit (TxnOffsetCommit'd in one that
        is open or completing, until its offsets are durable): OffsetFetch's require_stable (KIP-447)."""
        return {(topic, partition) for metadata in self.transactions.values()
                if metadata.state == ONGOING or metadata.state in PREPARED
                or metadata.transactional_id in self.completing
                for (offset_group, topic, partition) in metadata.offsets if offset_group == group}

    # -- EndTxn and completion -------------------------------------------------------------------

    def end_txn(self, worker: int, message: Any) -> None:
        if self._after_completion(worker, message, self.end_txn):
            return
        waiter = self._waiter(worker, message)
        current, error = self._producer_error(message)
        if error:
            return self._error_only(waiter, error)
        commit = bool(message.committed)
        state = current.state
        if state in COMPLETED:
            return self._error_only(waiter, E.none if (state == COMPLETE_COMMIT) == commit else E.invalid_txn_state)
        if state in PREPARED:
            same = (state == PREPARE_COMMIT) == commit
            return self._error_only(waiter, E.concurrent_transactions if same else E.invalid_txn_state)
        if state != ONGOING:
            return self._error_only(waiter, E.invalid_txn_state)
        changed = current.copy()
        changed.transition(PREPARE_COMMIT if commit else PREPARE_ABORT)

        def durable(metadata: TransactionMetadata) -> None:
            self.timeouts.forget(metadata.transactional_id)
            self._complete(metadata, waiter)

        def decide() -> None:
            self._persist(current, changed, durable, lambda error: self._error_only(waiter, error))

        if not commit:
            return decide()
        # The transaction's records were answered once appended: they reach the disk before its decision does.
        current.pending = True  # the id's next requests wait meanwhile (held)

        def records_durable(flushed: bool, fault: bool = False) -> None:
            current.pending = False
            if flushed and self.transactions.get(current.transactional_id) is current:
                return decide()
            # Still Ongoing: the client retries its EndTxn (or the transaction times out and is aborted).
            self._error_only(waiter, E.not_coordinator if fault else E.coordinator_not_available)
            self._run_held(current.transactional_id)

        self.markers.wait_records_durable(current.partitions, self.clock(), records_durable)

    def _complete(self, metadata: TransactionMetadata, waiter: Waiter | None = None) -> None:
        """Finish a Prepare* transaction (its decision durable): markers and (a commit) its offsets, then
        Complete* once they are durable. Answers `waiter` (an EndTxn) with NONE as soon as the markers are
        appended (read_committed readers see the outcome), or, for a commit with offsets, once those are durable
        (OffsetFetch shows them only then). Tried again later if they could not be made durable; the id's other
        requests wait for it meanwhile."""
        transactional_id = metadata.transactional_id
        self.completing.add(transactional_id)
        commit = metadata.state == PREPARE_COMMIT

        by_group: dict[str, dict] = {}
        for (group, topic, partition), entry in (metadata.offsets.items() if commit else ()):
            by_group.setdefault(group, {})[(topic, partition)] = entry
        # The markers and the offsets wait for one group-commit round together; the offsets are appended only
        # once every marker is, so OffsetFetch never shows them before the commit is visible in the partitions.
        outcome = {"left": 1 + len(by_group), "ok": True}

        def part_durable(ok: bool) -> None:
            outcome["left"] -= 1
            outcome["ok"] &= ok
            if outcome["left"] == 0:
                finished(outcome["ok"])

        def finished(ok: bool) -> None:
            if not ok:
                return self._retry_later(transactional_id)
            self.completing.discard(transactional_id)
            for end_waiter in self.end_waiters.pop(transactional_id, []):
                self._error_only(end_waiter, E.none)
            if self.transactions.get(transactional_id) is metadata:
                completed = metadata.copy()
                completed.transition(COMPLETE_COMMIT if commit else COMPLETE_ABORT)
                self.transactions[transactional_id] = completed
                if commit:
                    self.commits += 1
                else:
                    self.aborts += 1
                # Not waited for: losing it only makes a restart complete the transaction again (see invariants).
                self.state_log.write(completed, self.clock(), lambda flushed, fault=False: None, urgent=False)
            self._run_held(transactional_id)

        if waiter is not None and by_group:
            self.end_waiters.setdefault(transactional_id, []).append(waiter)
        # False: a marker could not be appended (part_durable(False) was called: the completion is retried).
        if self.markers.write(metadata.producer_id, metadata.producer_epoch, commit, metadata.partitions,
                              self.clock(), part_durable):
            for group, entries in by_group.items():
                self._commit_offsets(group, entries, lambda flushed, fault=False: part_durable(flushed))
        if waiter is not None and not by_group:  # the decision is durable: the outcome is certain from here on
            self._error_only(waiter, E.none)

    # -- expiry ---------------------------------------------------------------------------------

    def expire_transactional_ids(self) -> int:
        """Forget the ids without a transaction for transactional_id_expiration_ms (Kafka's
        transactional.id.expiration.ms): Dead while the tombstone is written, gone once it is durable. Returns how
        many began to expire."""
        if self.loading:
            return 0
        horizon = wall_ms() - self.config.transactional_id_expiration_ms
        expiring = [metadata for metadata in self.transactions.values()
                    if (metadata.state == EMPTY or metadata.state in COMPLETED) and not metadata.pending
                    and metadata.transactional_id not in self.completing and metadata.last_update_wall_ms < horizon]
        for metadata in expiring:
            self._expire(metadata)
        return len(expiring)

    def _expire(self, metadata: TransactionMetadata) -> None:
        transactional_id, previous = metadata.transactional_id, metadata.state
        metadata.transition(DEAD)
        metadata.pending = True

        def done(flushed: bool, fault: bool = False) -> None:
            metadata.pending = False
            if flushed:
                if self.transactions.get(transactional_id) is metadata:
                    del self.transactions[transactional_id]
            else:
                metadata.state = previous  # still there: expired again by the next look
            self._run_held(transactional_id)

        self.state_log.delete(transactional_id, self.clock(), done)

    def _retry_later(self, transactional_id: str) -> None:
        log.warning("transaction of %r: its markers or offsets are not durable yet; trying again in %d ms",
                    transactional_id, self.config.marker_retry_ms)
        self.retries.renew(transactional_id, self.clock() + self.config.marker_retry_ms)

    def _retry_completion(self, transactional_id: str) -> None:
        metadata = self.transactions.get(transactional_id)
        if metadata is not None and metadata.state in PREPARED:
            self._complete(metadata)
        else:
            self.completing.discard(transactional_id)
            for end_waiter in self.end_waiters.pop(transactional_id, []):
                self._error_only(end_waiter, E.none)
            self._run_held(transactional_id)

    def _timed_out(self, transactional_id: str) -> None:
        """A transaction open past its timeout: aborted by the node, its producer fenced (the epoch bumped)."""
        self._abort_open(transactional_id, "timed out", self._count_timeout)

    def _count_timeout(self) -> None:
        self.timed_out += 1

    def _abort_open(self, transactional_id: str, why: str, aborted: Callable[[], None] = lambda: None) -> None:
        """Abort an Ongoing transaction, its producer fenced (the epoch bumped). With a write of the id in flight, or
        if the abort's record cannot be written, its timeout timer looks again after marker_retry_ms."""
        current = self.transactions.get(transactional_id)
        if current is None or current.state != ONGOING:
            return
        if current.pending or transactional_id in self.completing:  # a write in flight: look again soon
            self.timeouts.renew(transactional_id, self.clock() + self.config.marker_retry_ms)
            return
        changed = current.copy()
        changed.bump_epoch()  # an exhausted epoch stays: the abort still closes the transaction
        changed.transition(PREPARE_ABORT)
        log.info("transaction of %r (producer %d, timeout %d ms) %s: aborting it", transactional_id,
                 current.producer_id, current.timeout_ms, why)

        def durable(metadata: TransactionMetadata) -> None:
            aborted()
            self._complete(metadata)

        self._persist(current, changed, durable,
                      lambda error: self.timeouts.renew(transactional_id, self.clock() + self.config.marker_retry_ms))
