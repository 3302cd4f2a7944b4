"""Request handlers of the transaction APIs: InitProducerId with a transactional.id, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, TxnOffsetCommit (FindCoordinator key type 1 is answered in workers.api.groups).

The node is the coordinator of every transactional.id, and the coordinator lives in the timer process
(node.timer.transactions): each handler turns its request into the kind's typed message (shm.messages), waits
for the coordinator's REPLY through DelayedRequests, and builds the response of the request's API version.

Invariants:
- Every request gets its response: the coordinator's, or, if the timer process never answers, an error the
  client retries on (COORDINATOR_NOT_AVAILABLE).
- KIP-588: the request versions before the one that brought PRODUCER_FENCED get INVALID_PRODUCER_EPOCH in its
  place (AddPartitionsToTxn, AddOffsetsToTxn and EndTxn before v2, TxnOffsetCommit before v3, InitProducerId
  before v4), as Kafka answers them.
- An EndTxn waits long enough for the coordinator's three fsyncs (decision, markers, offsets).
"""

from __future__ import annotations

import datetime
from typing import Any, Callable

from kio.static.primitive import i16, i32, i32Timedelta, i64

from node.config import NodeConfig
from shm import messages as M
from workers.api.responses import ZERO_THROTTLE, code, entity, reply
from workers.codecs import errors as E
from workers.codecs import protocol as P
from workers.connection import Request
from workers.timer_client.delayed import DelayedRequests, DocumentTooLarge
from workers.timer_client.outcome import Outcome
from workers.api.authorizer import RequestAuthorizer

# The first version of each API that may carry PRODUCER_FENCED (KIP-588).
PRODUCER_FENCED_SINCE = {P.INIT_PRODUCER_ID: 4, P.ADD_PARTITIONS_TO_TXN: 2, P.ADD_OFFSETS_TO_TXN: 2, P.END_TXN: 2,
                         P.TXN_OFFSET_COMMIT: 3}
END_TXN_FSYNCS = 3  # the decision, the markers, the offsets: each within transactions.state_write_timeout_ms


class TransactionHandlers:
    def __init__(self, config: NodeConfig, delayed: DelayedRequests,
                 authorizer: RequestAuthorizer | None = None) -> None:
        self.config = config
        self.delayed = delayed
        self.authorizer = authorizer or RequestAuthorizer.open_to_all()

    def table(self) -> dict[int, Callable[[Request, Any], Outcome]]:
        return {
            P.ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            P.ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn,
            P.END_TXN: self.end_txn,
            P.TXN_OFFSET_COMMIT: self.txn_offset_commit,
            P.LIST_TRANSACTIONS: self.list_transactions,
            P.DESCRIBE_TRANSACTIONS: self.describe_transactions,
        }

    def _code(self, req: Request, error: int) -> E.ErrorCode:
        """The error as the request's version knows it (see the invariants)."""
        if error == E.ErrorCode.producer_fenced and \
                req.header.api_version < PRODUCER_FENCED_SINCE.get(req.header.api_key, 0):
            return E.ErrorCode.invalid_producer_epoch
        return code(error)

    def _ask(self, req: Request, kind: M.Kind, body: tuple, fields: tuple, timeout_ms: int,
             answer: Callable[[Any], Outcome], refuse: Callable[[E.ErrorCode], Outcome]) -> Outcome:
        try:
            frame = M.encode(kind, 0, req.header.api_version, *body, *fields)
            return self.delayed.ask(req, frame, timeout_ms, lambda reply_: refuse(E.ErrorCode.coordinator_not_available)
                                    if reply_ is None else answer(reply_.answer))
        except DocumentTooLarge:
            return refuse(E.INVALID_REQUEST)

    # -- InitProducerId -------------------------------------------------------------------------

    def init_producer_id(self, req: Request, request: Any) -> Outcome:
        def answer(outcome: Any) -> Outcome:
            return reply(req, entity(req, "InitProducerIdResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=self._code(req, outcome.error), producer_id=i64(outcome.producer_id),
                                     producer_epoch=i16(outcome.producer_epoch)))

        timeout_ms = int(request.transaction_timeout.total_seconds() * 1000)
        return self._ask(req, M.Kind.INIT_PRODUCER_ID, (timeout_ms,), (request.transactional_id,),
                         self.config.timer.control_timeout_ms, answer,
                         lambda error: answer(M.reply_class(M.Kind.INIT_PRODUCER_ID)(int(error), -1, -1)))

    # -- AddPartitionsToTxn, AddOffsetsToTxn --------------------------------------------------------

    def add_partitions_to_txn(self, req: Request, request: Any) -> Outcome:
        topics = [(t.name, [int(p) for p in t.partitions]) for t in request.v3_and_below_topics]

        def answer(outcome: Any) -> Outcome:
            return reply(req, entity(req, "AddPartitionsToTxnResponse", throttle_time=ZERO_THROTTLE,
                                     results_by_topic_v3_and_below=tuple(
                                         entity(req, "AddPartitionsToTxnTopicResult", name=name,
                                                results_by_partition=tuple(
                                                    entity(req, "AddPartitionsToTxnPartitionResult",
                                                           partition_index=i32(partition),
                                                           partition_error_code=self._code(req, error))
                                                    for partition, error in partitions))
                                         for name, partitions in outcome.topics)))

        def refuse(error: E.ErrorCode) -> Outcome:
            return answer(M.reply_class(M.Kind.ADD_PARTITIONS_TO_TXN)(
                [(name, [(p, int(error)) for p in partitions]) for name, partitions in topics]))

        body = (int(request.v3_and_below_producer_id), int(request.v3_and_below_producer_epoch))
        return self._ask(req, M.Kind.ADD_PARTITIONS_TO_TXN, body, (request.v3_and_below_transactional_id, topics),
                         self.config.timer.control_timeout_ms, answer, refuse)

    def add_offsets_to_txn(self, req: Request, request: Any) -> Outcome:
        def answer(outcome: Any) -> Outcome:
            return reply(req, entity(req, "AddOffsetsToTxnResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=self._code(req, outcome.error)))

        body = (int(request.producer_id), int(request.producer_epoch))
        return self._ask(req, M.Kind.ADD_OFFSETS_TO_TXN, body, (request.transactional_id, request.group_id),
                         self.config.timer.control_timeout_ms, answer,
                         lambda error: answer(M.reply_class(M.Kind.ADD_OFFSETS_TO_TXN)(int(error))))

    # -- EndTxn -----------------------------------------------------------------------------------

    def end_txn(self, req: Request, request: Any) -> Outcome:
        def answer(outcome: Any) -> Outcome:
            return reply(req, entity(req, "EndTxnResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=self._code(req, outcome.error)))

        body = (int(request.producer_id), int(request.producer_epoch), bool(request.committed))
        timeout_ms = max(self.config.timer.control_timeout_ms,
                         END_TXN_FSYNCS * self.config.transactions.state_write_timeout_ms)
        return self._ask(req, M.Kind.END_TXN, body, (request.transactional_id,), timeout_ms, answer,
                         lambda error: answer(M.reply_class(M.Kind.END_TXN)(int(error))))

    # -- TxnOffsetCommit --------------------------------------------------------------------------

    def txn_offset_commit(self, req: Request, request: Any) -> Outcome:
        topics = [(t.name, [(p.partition_index, int(p.committed_offset), int(getattr(p, "committed_leader_epoch", -1)),
                             p.committed_metadata) for p in t.partitions]) for t in request.topics]

        def answer(outcome: Any) -> Outcome:
            return reply(req, entity(req, "TxnOffsetCommitResponse", throttle_time=ZERO_THROTTLE, topics=tuple(
                entity(req, "TxnOffsetCommitResponseTopic", name=name, partitions=tuple(
                    entity(req, "TxnOffsetCommitResponsePartition", partition_index=i32(partition),
                           error_code=self._code(req, error)) for partition, error in partitions))
                for name, partitions in outcome.topics)))

        def refuse(error: E.ErrorCode) -> Outcome:
            return answer(M.reply_class(M.Kind.TXN_OFFSET_COMMIT)(
                [(name, [(p[0], int(error)) for p in partitions]) for name, partitions in topics]))

        body = (int(request.producer_id), int(request.producer_epoch))
        return self._ask(req, M.Kind.TXN_OFFSET_COMMIT, body, (request.transactional_id, request.group_id, topics),
                         self.config.timer.control_timeout_ms, answer, refuse)

    # -- ListTransactions, DescribeTransactions ----------------------------------------------------

    def list_transactions(self, req: Request, request: Any) -> Outcome:
        states = list(request.state_filters)
        producer_ids = [int(p) for p in request.producer_id_filters]

        def answer(outcome: Any) -> Outcome:
            return reply(req, entity(req, "ListTransactionsResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=code(outcome.error), unknown_state_filters=tuple(outcome.unknown_states),
                                     transaction_states=tuple(
                                         entity(req, "TransactionState", transactional_id=transactional_id,
                                                producer_id=i64(producer_id), transaction_state=state)
                                         for transactional_id, producer_id, state in outcome.transactions)))

        duration_ms = int(getattr(request, "duration_filter", -1))
        return self._ask(req, M.Kind.LIST_TRANSACTIONS, (duration_ms,), (states, producer_ids),
                         self.config.timer.control_timeout_ms, answer,
                         lambda error: answer(M.reply_class(M.Kind.LIST_TRANSACTIONS)(int(error))))

    def describe_transactions(self, req: Request, request: Any) -> Outcome:
        ids = list(request.transactional_ids)

        def answer(outcome: Any) -> Outcome:
            return reply(req, entity(req, "DescribeTransactionsResponse", throttle_time=ZERO_THROTTLE,
                                     transaction_states=tuple(
                                         entity(req, "TransactionState", error_code=code(error),
                                                transactional_id=transactional_id, transaction_state=state,
                                                transaction_timeout=i32Timedelta.parse(
                                                    datetime.timedelta(milliseconds=timeout_ms)),
                                                transaction_start_time=datetime.datetime.fromtimestamp(
                                                    start_ms / 1000, datetime.timezone.utc),
                                                producer_id=i64(producer_id), producer_epoch=i16(producer_epoch),
                                                topics=tuple(entity(req, "TopicData", topic=topic,
                                                                    partitions=tuple(i32(p) for p in partitions))
                                                             for topic, partitions in topics))
                                         for error, transactional_id, state, timeout_ms, start_ms, producer_id,
                                         producer_epoch, topics in outcome.transactions)))

        def refuse(error: E.ErrorCode) -> Outcome:
            return answer(M.reply_class(M.Kind.DESCRIBE_TRANSACTIONS)(
                [M.DescribedTransaction(int(error), transactional_id, "", 0, 0, 0, 0, []) for transactional_id in ids]))

        return self._ask(req, M.Kind.DESCRIBE_TRANSACTIONS, (), (ids,), self.config.timer.control_timeout_ms, answer,
                         refuse)
