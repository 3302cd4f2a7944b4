"""The controller: the node's single authority for topic administration, in the timer process: topics created and
deleted, partitions added, configs altered (the catalog's only writer), and records deleted.

Each request is a document message (shm.messages) answered by one REPLY: a dict of per-topic (error code,
message) for topics and partitions, a list of per-resource (error code, message) for configs, and a list of
per-partition (error code, low watermark) for records.

Timeouts (CreateTopics, CreatePartitions, DeleteRecords carry the request's deadline): a request that starts
after its deadline is answered REQUEST_TIMED_OUT with nothing done, and one that starts in time is carried out
and answered as it came out. The work itself is one batch (one catalog write for any number of topics), so a
topic reported as timed out never appears behind the client's back; the worker waits past the deadline for
this answer (workers.timer_client.delayed answers by itself only if the timer process is gone).

Invariants:
- Catalog changes happen only here: partition directories and table rows first, then the catalog file
  (atomically; see node.storage.store), then a LAYOUT message to every worker, then the requester's REPLY. So
  a worker that hears of a topic, a partition or a config finds it complete on disk and in the table.
- The flusher is told the new catalog version before the next flush round looks at the catalog.
- Record deletion is I/O (an fsync of the records and of the log-start checkpoint): it runs on the flusher's
  thread as a job, one at a time with retention, and its REPLY is sent from the timer loop when it is done.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from shmbroker.node.config import GroupConfig
from shmbroker.node.storage.records import StorageError
from shmbroker.node.storage.store import PartitionStore, TopicOutcomes
from shmbroker.node.timer.flusher import Flusher
from shmbroker.node.timer.outbox import Outbox
from shmbroker.shm import messages as M

log = logging.getLogger("shmbroker.controller")

TIMED_OUT = (int(ErrorCode.request_timed_out), "the request's timeout passed before the node could start it; "
                                               "nothing was done")


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Controller:
    def __init__(self, store: PartitionStore, outbox: Outbox, flusher: Flusher, groups: GroupConfig) -> None:
        self.store = store
        self.groups = groups  # the node's group settings: the bounds of group configs
        self.outbox = outbox
        self.flusher = flusher
        flusher.catalog_version = store.version

    def create_topics(self, worker: int, message: Any) -> None:
        document = message.document
        topics = [(str(name), int(partitions), dict(configs)) for name, partitions, configs in document["topics"]]
        if monotonic_ms() > message.deadline_ms:
            outcome = {name: TIMED_OUT for name, _, _ in topics}
        else:
            outcome = self.store.create_topics(topics, validate_only=bool(document.get("validate_only")),
                                               existing_ok=not document.get("explicit"))
        self._answer(worker, message, outcome)

    def delete_topics(self, worker: int, message: Any) -> None:
        """The document names each topic, or gives [name, topic id] for one a client named by id (then only the
        topic with that id is deleted: another of that name created since answers UNKNOWN_TOPIC_ID)."""
        names, ids = [], {}
        for item in message.document:
            if isinstance(item, str):
                names.append(item)
            else:
                name, topic_id = str(item[0]), str(item[1])
                names.append(name)
                ids[name] = uuid.UUID(topic_id)
        self._answer(worker, message, self.store.delete_topics(names, ids))

    def create_partitions(self, worker: int, message: Any) -> None:
        document = message.document
        requests = [(str(name), int(total)) for name, total in document["topics"]]
        if monotonic_ms() > message.deadline_ms:
            outcome: TopicOutcomes = {name: TIMED_OUT for name, _ in requests}
        else:
            outcome = self.store.create_partitions(requests, validate_only=bool(document.get("validate_only")))
        self._answer(worker, message, outcome)

    def alter_configs(self, worker: int, message: Any) -> None:
        document = message.document
        resources = [(int(kind), str(name), str(how), changes) for kind, name, how, changes in document["resources"]]
        self._answer(worker, message,
                     self.store.alter_configs(resources, validate_only=bool(document.get("validate_only")),
                                              groups=self.groups))

    def delete_records(self, worker: int, message: Any) -> None:
        wanted = [(str(topic), int(partition), int(offset)) for topic, partition, offset in message.document]
        deadline_ms = message.deadline_ms
        request_id = message.request_id

        def delete(store: PartitionStore) -> list[tuple[int, int]]:
            if monotonic_ms() > deadline_ms:
                return [(TIMED_OUT[0], -1)] * len(wanted)
            store.reload()
            return [_delete_records(store, topic, partition, offset) for topic, partition, offset in wanted]

        def answer(results: list[tuple[int, int]] | None) -> None:
            if results is None:  # the job failed (logged by the flusher)
                results = [(int(ErrorCode.kafka_storage_error), -1)] * len(wanted)
            self.outbox.send(worker, M.encode_reply(request_id, M.Kind.DELETE_RECORDS, results))

        self.flusher.submit("delete records", delete, then=answer)

    def catalog_changed(self) -> None:
        """After a change of the catalog by the timer process (here, or a coordinator's internal topic): the
        flusher's store and the workers reload it."""
        if self.store.version != self.flusher.catalog_version:
            self.flusher.catalog_version = self.store.version
            self.outbox.broadcast(M.encode(M.Kind.LAYOUT, self.store.version))

    def _answer(self, worker: int, message: Any, outcome: Any) -> None:
        self.catalog_changed()
        self.outbox.send(worker, M.encode_reply(message.request_id, message.kind, outcome))


def _delete_records(store: PartitionStore, topic: str, partition: int, offset: int) -> tuple[int, int]:
    """(error code, low watermark) of one partition's DeleteRecords, as Kafka answers it."""
    row = store.row(topic, partition)
    if row is None:
        return int(ErrorCode.unknown_topic_or_partition), -1
    if store.is_internal(topic):
        return int(ErrorCode.invalid_topic_exception), -1
    try:
        return 0, store.log(row).delete_records_before(offset)
    except StorageError as exc:
        return int(exc.error_code), -1
    except OSError as exc:
        log.error("DeleteRecords of %s-%d failed: %s", topic, partition, exc)
        return int(ErrorCode.kafka_storage_error), -1
