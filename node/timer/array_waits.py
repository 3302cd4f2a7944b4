"""Delayed operations kept as arrays under one timing wheel: what the timer's batch paths share.

A batch path (node.timer.fetch_waits, node.timer.produce_waits) takes a drain's run of one kind of wait as numpy
arrays: their deadlines go into this class's own wheel in one add_many() call, their payload (worker, request id,
and the kind's own fields) into arrays indexed by the wheel slot of their handle, and `keys` maps each
(worker, request id) to its handle for the O(1) cancel of a request the worker ended itself.

Invariants (after every public call):
- `keys` maps every waiting operation's (worker, request id) to its live wheel handle, and only those: the wheel's
  pending == len(keys); the payload arrays are at least as long as the wheel's slot arrays.
- A payload field is one value per slot, or `columns` values per slot (a 2-D array), widened by `_widen` with
  its fill value.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from shmbroker.node.config import WheelConfig
from shmbroker.node.timer.outbox import Outbox
from shmbroker.node.timer.wheel import SLOT_MASK, TimingWheel, doubled
from shmbroker.shm.table import PartitionTable

PayloadField = tuple[str, Any, int, int]  # name, dtype, fill value, columns (0: one value per slot)


class ArrayWaits:
    """Waits of one kind as arrays under one timing wheel; subclasses declare PAYLOAD and their conditions."""

    PAYLOAD: tuple[PayloadField, ...] = (("worker", np.int64, 0, 0), ("request_id", np.uint64, 0, 0))

    def __init__(self, table: PartitionTable, outbox: Outbox, wheel: WheelConfig, now_ms: int) -> None:
        self.table = table
        self.outbox = outbox
        self.timer = TimingWheel(wheel.tick_ms, wheel.wheel_size, now_ms, initial_capacity=wheel.initial_capacity,
                                 bucket_initial_capacity=wheel.bucket_initial_capacity,
                                 compaction_slack=wheel.compaction_slack)
        self.keys: dict[tuple[int, int], int] = {}  # (worker, request id) -> wheel handle
        self._payload = {name: np.full((self.timer.capacity, columns) if columns else self.timer.capacity, fill, dtype)
                         for name, dtype, fill, columns in self.PAYLOAD}
        # The purgatory's counters: completed before the deadline, and reached it.
        self.completed = 0
        self.expired = 0

    @property
    def pending(self) -> int:
        return self.timer.pending

    def next_expiration(self) -> int | None:
        return self.timer.next_expiration()

    def _keep(self, worker: int, request_ids: np.ndarray, deadlines: np.ndarray) -> np.ndarray:
        """Put waits in the wheel and `keys`; returns their handles (their slots index the rest of the payload)."""
        handles = self.timer.add_many(deadlines)
        slots = handles & SLOT_MASK
        self._fit(self.timer.capacity)
        self._payload["worker"][slots] = worker
        self._payload["request_id"][slots] = request_ids
        self.keys.update(zip(zip([worker] * len(slots), request_ids.tolist()), handles.tolist()))
        return handles

    def _forget(self, workers: np.ndarray, request_ids: np.ndarray) -> tuple[list[int], list[int]]:
        """Drop ended waits from `keys`; returns their workers and request ids as lists."""
        worker_list, id_list = workers.tolist(), request_ids.tolist()
        deque(map(self.keys.__delitem__, zip(worker_list, id_list)), maxlen=0)  # del each key, in C
        return worker_list, id_list

    def _fit(self, capacity: int) -> None:
        """Payload arrays as long as the wheel's slot arrays (they grow by doubling together)."""
        if len(self._payload["worker"]) >= capacity:
            return
        for name, dtype, fill, _ in self.PAYLOAD:
            old = self._payload[name]
            grown = np.full((doubled(len(old), capacity),) + old.shape[1:], fill, dtype)
            grown[:len(old)] = old
            self._payload[name] = grown

    def _widen(self, name: str, columns: int) -> None:
        """A 2-D payload field at least `columns` wide."""
        old = self._payload[name]
        if old.shape[1] >= columns:
            return
        fill = next(fill for field, _, fill, _ in self.PAYLOAD if field == name)
        grown = np.full((len(old), columns), fill, old.dtype)
        grown[:, :old.shape[1]] = old
        self._payload[name] = grown

    def cancel(self, worker: int, request_id: int) -> bool:
        """Drop a waiting operation without an answer; False if none waits under that key."""
        handle = self.keys.pop((worker, request_id), None)
        if handle is None or not self.timer.cancel(handle):
            return False
        self._cancelled(handle & SLOT_MASK)
        self.completed += 1
        return True

    def _cancelled(self, slot: int) -> None:
        """A subclass's own bookkeeping of a cancelled slot."""

    def _complete(self, workers: np.ndarray, request_ids: np.ndarray, statuses: np.ndarray) -> None:
        """One complete_many() per worker (node.timer.outbox: its COMPLETION frames)."""
        if not len(workers):
            return
        if (workers == workers[0]).all():
            self.outbox.complete_many(int(workers[0]), request_ids.tolist(), statuses.tolist())
            return
        for worker in np.unique(workers).tolist():
            mine = workers == worker
            self.outbox.complete_many(worker, request_ids[mine].tolist(), statuses[mine].tolist())

    def describe(self) -> dict[str, Any]:
        return {"pending": self.pending, "completed": self.completed, "expired": self.expired}
