"""The controller: the node's single authority for topic creation and deletion, in the timer process.

Invariants:
- Topic changes happen only here: partition directories and table rows first, then the catalog file
  (atomically; see node.storage.store), then a LAYOUT message to every worker, then the requester's
  REPLY. So a worker that hears of a topic finds it complete on disk and in the table.
- The flusher is told the new catalog version before the next flush round looks at the catalog.
"""

from __future__ import annotations

from typing import Any

from node.storage.store import PartitionStore, TopicOutcomes
from node.timer.flusher import Flusher
from node.timer.outbox import Outbox
from shm import messages as M


class Controller:
    def __init__(self, store: PartitionStore, outbox: Outbox, flusher: Flusher) -> None:
        self.store = store
        self.outbox = outbox
        self.flusher = flusher
        flusher.catalog_version = store.version

    def create_topics(self, worker: int, message: Any) -> None:
        topics = [(str(name), int(partitions)) for name, partitions in message.document]
        self._answer(worker, message.request_id, self.store.create_topics(topics))

    def delete_topics(self, worker: int, message: Any) -> None:
        self._answer(worker, message.request_id, self.store.delete_topics([str(name) for name in message.document]))

    def _answer(self, worker: int, request_id: int, outcome: TopicOutcomes) -> None:
        if self.store.version != self.flusher.catalog_version:
            self.flusher.catalog_version = self.store.version
            self.outbox.broadcast(M.encode(M.Kind.LAYOUT, self.store.version))
        self.outbox.send(worker, M.encode(M.Kind.REPLY, request_id, document=outcome))
