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
- With the authorizer on, as Kafka's broker: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and
  TxnOffsetCommit need WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); AddOffsetsToTxn
  and TxnOffsetCommit READ on the group (GROUP_AUTHORIZATION_FAILED); AddPartitionsToTxn WRITE on each topic (one
  refused topic fails the whole request: its partitions TOPIC_AUTHORIZATION_FAILED, the others
  OPERATION_NOT_ATTEMPTED); TxnOffsetCommit READ on each topic (its partitions TOPIC_AUTHORIZATION_FAILED, the
  others committed). ListTransactions lists only, and DescribeTransactions describes only, the ids the principal
  may DESCRIBE, and a description names only the topics it may DESCRIBE. Refusals never reach the coordinator.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, Callable

from kio.static.primitive import i16, i32, i32Timedelta, i64

from shmbroker.node.storage.acls import Operation, ResourceType
from shmbroker.shm import messages as M
from shmbroker.workers.api.groups import failed
from shmbroker.workers.api.responses import ZERO_THROTTLE, code, entity, reply
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.delayed import DocumentTooLarge
from shmbroker.workers.timer_client.outcome import Outcome
from shmbroker.workers.api.family import HandlerFamily

# The first version of each API that may carry PRODUCER_FENCED (KIP-588).
PRODUCER_FENCED_SINCE = {P.INIT_PRODUCER_ID: 4, P.ADD_PARTITIONS_TO_TXN: 2, P.ADD_OFFSETS_TO_TXN: 2, P.END_TXN: 2,
                         P.TXN_OFFSET_COMMIT: 3}
END_TXN_FSYNCS = 3  # the decision, the markers, the offsets: each within transactions.state_write_timeout_ms


def expected_producer(request: Any) -> tuple[int, int] | None:
    """An InitProducerId's own producer id and epoch (v3+, KIP-360; (-1, -1) when it names none, and before v3);
    None when only one of them is given (INVALID_REQUEST, as Kafka answers)."""
    producer_id, epoch = int(getattr(request, "producer_id", -1)), int(getattr(request, "producer_epoch", -1))
    return None if (producer_id == -1) != (epoch == -1) else (producer_id, epoch)


class TransactionHandlers(HandlerFamily):
    """Made with the node's config, the delayed requests' client and the authorizer (HandlerFamily)."""

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

    def _id_allows(self, req: Request, operation: Operation, transactional_id: str) -> bool:
        return self.authorizer.allows(req, operation, ResourceType.TRANSACTIONAL_ID, transactional_id)

    def _topic_allows(self, req: Request, operation: Operation, topic: str) -> bool:
        return self.authorizer.allows(req, operation, ResourceType.TOPIC, topic)

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

        if not self._id_allows(req, Operation.WRITE, request.transactional_id):
            return answer(M.reply_class(M.Kind.INIT_PRODUCER_ID)(int(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED), -1, -1))
        expected = expected_producer(request)
        if expected is None:
            return answer(M.reply_class(M.Kind.INIT_PRODUCER_ID)(int(E.INVALID_REQUEST), -1, -1))
        timeout_ms = int(request.transaction_timeout.total_seconds() * 1000)
        return self._ask(req, M.Kind.INIT_PRODUCER_ID, (timeout_ms, *expected), (request.transactional_id,),
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

        if self.authorizer.enabled:
            if not self._id_allows(req, Operation.WRITE, request.v3_and_below_transactional_id):
                return refuse(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            refused = {name for name, _ in topics if not self._topic_allows(req, Operation.WRITE, name)}
            if refused:
                return answer(M.reply_class(M.Kind.ADD_PARTITIONS_TO_TXN)([
                    (name, [(p, int(E.TOPIC_AUTHORIZATION_FAILED if name in refused
                                    else E.ErrorCode.operation_not_attempted)) for p in partitions])
                    for name, partitions in topics]))
        body = (int(request.v3_and_below_producer_id), int(request.v3_and_below_producer_epoch))
        return self._ask(req, M.Kind.ADD_PARTITIONS_TO_TXN, body, (request.v3_and_below_transactional_id, topics),
                         self.config.timer.control_timeout_ms, answer, refuse)

    def add_offsets_to_txn(self, req: Request, request: Any) -> Outcome:
        def answer(outcome: Any) -> Outcome:
            return reply(req, entity(req, "AddOffsetsToTxnResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=self._code(req, outcome.error)))

        refusal = self._offsets_refusal(req, request)
        if refusal is not None:
            return answer(M.reply_class(M.Kind.ADD_OFFSETS_TO_TXN)(int(refusal)))
        body = (int(request.producer_id), int(request.producer_epoch))
        return self._ask(req, M.Kind.ADD_OFFSETS_TO_TXN, body, (request.transactional_id, request.group_id),
                         self.config.timer.control_timeout_ms, answer,
                         lambda error: answer(M.reply_class(M.Kind.ADD_OFFSETS_TO_TXN)(int(error))))

    def _offsets_refusal(self, req: Request, request: Any) -> E.ErrorCode | None:
        """AddOffsetsToTxn's and TxnOffsetCommit's checks: WRITE on the transactional id, READ on the group."""
        if not self._id_allows(req, Operation.WRITE, request.transactional_id):
            return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        if not self.authorizer.allows(req, Operation.READ, ResourceType.GROUP, request.group_id):
            return E.GROUP_AUTHORIZATION_FAILED
        return None

    # -- EndTxn -----------------------------------------------------------------------------------

    def end_txn(self, req: Request, request: Any) -> Outcome:
        def answer(outcome: Any) -> Outcome:
            return reply(req, entity(req, "EndTxnResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=self._code(req, outcome.error)))

        if not self._id_allows(req, Operation.WRITE, request.transactional_id):
            return answer(M.reply_class(M.Kind.END_TXN)(int(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)))
        body = (int(request.producer_id), int(request.producer_epoch), bool(request.committed))
        timeout_ms = max(self.config.timer.control_timeout_ms,
                         END_TXN_FSYNCS * self.config.transactions.state_write_timeout_ms)
        return self._ask(req, M.Kind.END_TXN, body, (request.transactional_id,), timeout_ms, answer,
                         lambda error: answer(M.reply_class(M.Kind.END_TXN)(int(error))))

    # -- TxnOffsetCommit --------------------------------------------------------------------------

    def txn_offset_commit(self, req: Request, request: Any) -> Outcome:
        topics = [(t.name, [(p.partition_index, int(p.committed_offset), int(getattr(p, "committed_leader_epoch", -1)),
                             p.committed_metadata) for p in t.partitions]) for t in request.topics]
        refused: list = []

        def answer(outcome: Any) -> Outcome:
            answered = [*outcome.topics, *failed(refused, E.TOPIC_AUTHORIZATION_FAILED)]
            return reply(req, entity(req, "TxnOffsetCommitResponse", throttle_time=ZERO_THROTTLE, topics=tuple(
                entity(req, "TxnOffsetCommitResponseTopic", name=name, partitions=tuple(
                    entity(req, "TxnOffsetCommitResponsePartition", partition_index=i32(partition),
                           error_code=self._code(req, error)) for partition, error in partitions))
                for name, partitions in answered)))

        def refuse(error: E.ErrorCode) -> Outcome:
            return answer(M.reply_class(M.Kind.TXN_OFFSET_COMMIT)(failed(topics, error)))

        if self.authorizer.enabled:
            refusal = self._offsets_refusal(req, request)
            if refusal is not None:
                return refuse(refusal)
            allowed = [topic for topic in topics if self._topic_allows(req, Operation.READ, topic[0])]
            refused = [topic for topic in topics if topic not in allowed]
            topics = allowed
            if refused and not topics:
                return answer(M.reply_class(M.Kind.TXN_OFFSET_COMMIT)([]))
        # v3+ (KIP-447) name the consumer's member and generation; v0-2 none (-1, "": nothing to check).
        body = (int(request.producer_id), int(request.producer_epoch), int(getattr(request, "generation_id", -1)))
        fields = (request.transactional_id, request.group_id, topics, getattr(request, "member_id", ""),
                  getattr(request, "group_instance_id", None))
        return self._ask(req, M.Kind.TXN_OFFSET_COMMIT, body, fields, self.config.timer.control_timeout_ms, answer,
                         refuse)

    # -- ListTransactions, DescribeTransactions ----------------------------------------------------

    def list_transactions(self, req: Request, request: Any) -> Outcome:
        states = list(request.state_filters)
        producer_ids = [int(p) for p in request.producer_id_filters]

        pattern = getattr(request, "transactional_id_pattern", None)  # v2 (KIP-1152): a regex the ids match whole
        try:
            matching = re.compile(pattern).fullmatch if pattern else None
        except re.error:
            return reply(req, entity(req, "ListTransactionsResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=E.ErrorCode.invalid_regular_expression, unknown_state_filters=(),
                                     transaction_states=()))

        def answer(outcome: Any) -> Outcome:
            listed = outcome.transactions
            if matching is not None:
                listed = [t for t in listed if matching(t[0])]
            if self.authorizer.enabled:
                listed = [t for t in listed if self._id_allows(req, Operation.DESCRIBE, t[0])]
            return reply(req, entity(req, "ListTransactionsResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=code(outcome.error), unknown_state_filters=tuple(outcome.unknown_states),
                                     transaction_states=tuple(
                                         entity(req, "TransactionState", transactional_id=transactional_id,
                                                producer_id=i64(producer_id), transaction_state=state)
                                         for transactional_id, producer_id, state in listed)))

        duration_ms = int(getattr(request, "duration_filter", -1))
        return self._ask(req, M.Kind.LIST_TRANSACTIONS, (duration_ms,), (states, producer_ids),
                         self.config.timer.control_timeout_ms, answer,
                         lambda error: answer(M.reply_class(M.Kind.LIST_TRANSACTIONS)(int(error))))

    def describe_transactions(self, req: Request, request: Any) -> Outcome:
        ids, refused = list(request.transactional_ids), []
        if self.authorizer.enabled:
            allowed = [i for i in ids if self._id_allows(req, Operation.DESCRIBE, i)]
            ids, refused = allowed, [i for i in ids if i not in allowed]

        def describable(topics: list) -> list:
            if not self.authorizer.enabled:
                return topics
            return [topic for topic in topics if self._topic_allows(req, Operation.DESCRIBE, topic[0])]

        def answer(outcome: Any) -> Outcome:
            described = [*outcome.transactions, *[
                M.DescribedTransaction(int(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED), i, "", 0, 0, 0, 0, [])
                for i in refused]]
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
                                                             for topic, partitions in describable(topics)))
                                         for error, transactional_id, state, timeout_ms, start_ms, producer_id,
                                         producer_epoch, topics in described)))

        def refuse(error: E.ErrorCode) -> Outcome:
            return answer(M.reply_class(M.Kind.DESCRIBE_TRANSACTIONS)(
                [M.DescribedTransaction(int(error), transactional_id, "", 0, 0, 0, 0, []) for transactional_id in ids]))

        if refused and not ids:
            return answer(M.reply_class(M.Kind.DESCRIBE_TRANSACTIONS)([]))
        return self._ask(req, M.Kind.DESCRIBE_TRANSACTIONS, (), (ids,), self.config.timer.control_timeout_ms, answer,
                         refuse)
