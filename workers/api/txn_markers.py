"""WriteTxnMarkers (api key 27): a COMMIT or ABORT marker written to partitions on a client's request, as Kafka's
KafkaApis.handleWriteTxnMarkersRequest. Kafka's coordinators send it to the partitions' leaders; the node's own
coordinator writes its markers itself (node.timer.transactions.markers), so here it comes from an operator:
Admin.abortTransaction and `kafka-transactions abort` (KIP-664), which close a hanging transaction.

Design: the worker writes the markers itself, as it appends a Produce's batches (PartitionLog.append_marker under
the partition's lock, which every process shares), then waits for their fsync through the timer as an acks=all
Produce does (DELAY_PRODUCE): no ring message of its own. The marker closes the producer's transaction in the
partition, so its last stable offset moves and an ABORT's aborted-transaction index entry is written before the
marker is published; read_committed readers move on.

Invariants:
- ALTER or CLUSTER_ACTION on the cluster is needed (Kafka checks ALTER first, then CLUSTER_ACTION); without
  either, every partition of every marker is CLUSTER_AUTHORIZATION_FAILED and nothing is written.
- Each partition answers: NONE once the marker is fsync'd; UNKNOWN_TOPIC_OR_PARTITION (no such partition);
  INVALID_PRODUCER_EPOCH (the marker's epoch is older than the producer's epoch there); KAFKA_STORAGE_ERROR (a
  disk fault, or the fsync failed); REQUEST_TIMED_OUT (not fsync'd within transactions.state_write_timeout_ms,
  the time the coordinator gives its own markers). A partition of an internal topic (__consumer_offsets, whose
  transactional offsets the timer's group coordinator holds) is INVALID_TOPIC_EXCEPTION: the node completes
  those only through its own coordinator.
- Results are grouped by producer id, as Kafka's response map is (two markers of one producer share an entry).
- The coordinator's state is not touched. If the transactional id still has that transaction open, its own
  marker later finds the partition's transaction already closed and changes nothing there (Kafka leaves that
  case to the operator, as here); a batch the producer writes after the abort opens a new transaction there,
  which the coordinator's marker closes.
- Not done: the coordinator epoch is written into the marker but not checked (the partitions keep none:
  TRANSACTION_COORDINATOR_FENCED is never answered), and v2's transaction_version is taken as the legacy one.
"""

from __future__ import annotations

from typing import Any, Callable

from kio.static.primitive import i32, i64

from shmbroker.node.config import NodeConfig
from shmbroker.node.storage.acls import CLUSTER_NAME, Operation, ResourceType
from shmbroker.node.storage.faults import storage_faults
from shmbroker.node.storage.records import ControlType, StorageError
from shmbroker.node.storage.store import PartitionStore
from shmbroker.shm import messages as M
from shmbroker.workers.api.authorizer import RequestAuthorizer
from shmbroker.workers.api.family import HandlerFamily
from shmbroker.workers.api.responses import code, entity, reply
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.delayed import Completed, DelayedRequests
from shmbroker.workers.timer_client.outcome import Outcome


class TxnMarkerHandlers(HandlerFamily):
    def __init__(self, partitions: PartitionStore, config: NodeConfig, delayed: DelayedRequests,
                 authorizer: RequestAuthorizer | None = None) -> None:
        super().__init__(config, delayed, authorizer)
        self.partitions = partitions

    def table(self) -> dict[int, Callable[[Request, Any], Outcome]]:
        return {P.WRITE_TXN_MARKERS: self.write_txn_markers}

    def _allowed(self, req: Request) -> bool:
        if not self.authorizer.enabled:
            return True
        return (self.authorizer.permits(req, Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME)
                or self.authorizer.allows(req, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME))

    def write_txn_markers(self, req: Request, request: Any) -> Outcome:
        # producer id -> {(topic, partition): error code}, in the order the markers came
        results: dict[int, dict[tuple[str, int], int]] = {}
        waits: dict[tuple[str, int], tuple[int, int]] = {}  # (topic, partition) -> (row, offset to be fsync'd)
        allowed = self._allowed(req)
        for marker in request.markers:
            producer_id = int(marker.producer_id)
            errors = results.setdefault(producer_id, {})
            for topic in marker.topics:
                for index in topic.partition_indexes:
                    key = (topic.name, int(index))
                    if not allowed:
                        errors[key] = E.CLUSTER_AUTHORIZATION_FAILED
                        continue
                    errors[key] = self._write(marker, key, waits)
        if not waits:
            return self._answer(req, results)
        pending = list(waits.values())

        def answer(result: Completed | None = None) -> Outcome:
            failed = result is not None and result.status == M.Status.FAILED
            late_code = result.error_code if failed else E.REQUEST_TIMED_OUT
            table = self.partitions.table
            for errors in results.values():
                for key in errors:
                    wait = waits.get(key)
                    if wait is not None and table.read(wait[0]).flushed_offset < wait[1]:
                        errors[key] = late_code
            return self._answer(req, results)

        table = self.partitions.table
        if all(table.read(row).flushed_offset >= offset for row, offset in pending):
            return answer()
        return self.delayed.delay_produce(req, pending, self.config.transactions.state_write_timeout_ms, answer)

    def _write(self, marker: Any, key: tuple[str, int], waits: dict[tuple[str, int], tuple[int, int]]) -> int:
        """Append one marker to one partition; its error code (NONE: appended, its fsync to wait for)."""
        topic, partition = key
        row = self.partitions.row(topic, partition)
        if row is None:
            return E.UNKNOWN_TOPIC_OR_PARTITION
        if self.partitions.is_internal(topic):
            return E.INVALID_TOPIC_EXCEPTION
        control = ControlType.COMMIT if marker.transaction_result else ControlType.ABORT
        try:
            with storage_faults(f"transaction marker of {topic}-{partition}"):
                appended = self.partitions.log(row).append_marker(
                    int(marker.producer_id), int(marker.producer_epoch), control, int(marker.coordinator_epoch))
        except StorageError as exc:
            return exc.error_code
        self.delayed.appended(row)  # read_committed long polls held at the last stable offset may move on
        self.delayed.wants_flush(row)
        previous = waits.get(key)
        waits[key] = (row, max(appended.last_offset + 1, previous[1] if previous else 0))
        return E.NONE

    def _answer(self, req: Request, results: dict[int, dict[tuple[str, int], int]]) -> Outcome:
        markers = []
        for producer_id, errors in results.items():
            if not errors:
                continue
            by_topic: dict[str, list[Any]] = {}
            for (topic, partition), error in errors.items():
                by_topic.setdefault(topic, []).append(entity(req, "WritableTxnMarkerPartitionResult",
                                                             partition_index=i32(partition), error_code=code(error)))
            markers.append(entity(req, "WritableTxnMarkerResult", producer_id=i64(producer_id), topics=tuple(
                entity(req, "WritableTxnMarkerTopicResult", name=topic, partitions=tuple(parts))
                for topic, parts in by_topic.items())))
        return reply(req, entity(req, "WriteTxnMarkersResponse", markers=tuple(markers)))
