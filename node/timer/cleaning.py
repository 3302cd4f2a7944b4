"""Which compacted partition each log cleaner cleans next (Kafka's LogCleanerManager): the timer decides, the
cleaner processes (node.cleaner) do the I/O.

A survey, a chore on the timer's wheel every `cleaner.backoff_ms` (and at once after a cleaning, while logs
are due), runs on the flusher thread: for every compacted partition it reads the dirty section from the
segment list and the cleaner checkpoint (node.storage.cleaner.dirtiness), publishes its dirty ratio and lag
in the partition table's cleaning words, and lists the partitions due: dirty enough (min.cleanable.dirty.ratio)
or with a record older than max.compaction.lag.ms. Back on the timer loop, due partitions go to idle
cleaners, overdue ones first, then the dirtiest (CLEAN over the cleaner's ring); a CLEANED frees the cleaner.

A partition whose cleaning failed (a full disk, a corrupt batch) waits before its next try, twice as long after
each failure in a row (from cleaner.backoff_ms, at most MAX_RETRY_DELAY_MS).

Invariants: a partition is cleaned by at most one cleaner at a time; a cleaner gets one CLEAN at a time; a
cleaner counts as idle only once it said CLEANER_READY (after its start, or in answer to TIMER_STARTED, with
the partition it is still cleaning, if any), so a restarted timer or cleaner loses no work and gives none twice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from shmbroker.node.storage import cleaner as C
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.outbox import Outbox
from shmbroker.shm import messages as M
from shmbroker.shm.table import PartitionTable

log = logging.getLogger("shmbroker.cleaning")
PPM = 1_000_000
MAX_RETRY_DELAY_MS = 300_000


@dataclass(frozen=True)
class Candidate:
    row: int
    topic: str
    partition: int
    overdue: bool
    ratio: float

    @property
    def order(self) -> tuple:
        return (not self.overdue, -self.ratio)


def survey(store: PartitionStore, table: PartitionTable, now_ms: int | None = None) -> list[Candidate]:
    """The compacted partitions due for cleaning, first to clean first (on the flusher thread)."""
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    due = []
    store.reload()
    for row in store.rows():
        topic, partition = store.owner(row)
        config = store.config_of(topic)
        if not config.compacts:
            continue
        try:
            plog = store.log(row)
            dirty = C.dirtiness(plog, now_ms)
        except Exception as exc:  # a partition being deleted, a disk fault: surveyed again next time
            log.debug("cleaning survey skips %s-%d: %s", topic, partition, exc)
            continue
        if dirty is None:
            continue
        table.set_cleaning(row, dirty_ratio_ppm=int(dirty.ratio * PPM), lag_ms=dirty.lag_ms(now_ms))
        if C.due(dirty, config.min_cleanable_dirty_ratio):
            due.append(Candidate(row, topic, partition, dirty.overdue, dirty.ratio))
    return sorted(due, key=lambda c: c.order)


class CleanerScheduler:
    def __init__(self, config: C.CleanerConfig, outbox: Outbox, first_ring: int, cleaners: int,
                 submit: Callable[..., None], table: PartitionTable) -> None:
        self.config = config
        self.outbox = outbox
        self.first_ring = first_ring  # cleaner c talks over ring first_ring + c
        self.submit = submit  # the flusher's: a job on its thread, `then` back on the timer loop
        self.table = table
        self.idle: set[int] = set()
        self.cleaning: dict[int, int] = {}  # cleaner -> row
        self.failed: dict[int, tuple[int, float]] = {}  # row -> (failures in a row, monotonic s of the next try)
        self.queue: list[Candidate] = []
        self._surveying = False
        self.cleanings = 0
        self.failures = 0
        self.cleaners = cleaners

    def is_cleaner(self, ring: int) -> bool:
        return self.first_ring <= ring < self.first_ring + self.cleaners

    def survey_due(self) -> None:
        """The wheel's chore (and after each cleaning): survey the compacted logs on the flusher thread."""
        if self._surveying or not self.cleaners:
            return
        self._surveying = True
        self.submit("cleaning survey", lambda store: survey(store, self.table), then=self._surveyed)

    def _surveyed(self, candidates: list[Candidate] | None) -> None:
        self._surveying = False
        if candidates is not None:
            self.queue = candidates
        self._assign()

    def _assign(self) -> None:
        busy = set(self.cleaning.values())
        now = time.monotonic()
        while self.idle and self.queue:
            candidate = self.queue.pop(0)
            if candidate.row in busy or self.failed.get(candidate.row, (0, 0.0))[1] > now:
                continue
            cleaner = min(self.idle)
            self.idle.discard(cleaner)
            self.cleaning[cleaner] = candidate.row
            busy.add(candidate.row)
            self.outbox.send(self.first_ring + cleaner,
                             M.encode(M.Kind.CLEAN, candidate.row, candidate.partition, candidate.topic))

    # -- the cleaners' messages --------------------------------------------------------------------

    def ready(self, ring: int, message: Any) -> None:
        """CLEANER_READY: a cleaner (re)started, or answers a new timer, with what it is cleaning."""
        cleaner = ring - self.first_ring
        if message.cleaning_row >= 0:
            self.cleaning[cleaner] = message.cleaning_row
            self.idle.discard(cleaner)
        else:
            self.cleaning.pop(cleaner, None)
            self.idle.add(cleaner)
            self._assign()

    def cleaned(self, ring: int, message: Any) -> None:
        """CLEANED: the cleaner is free again; more may be due."""
        cleaner = ring - self.first_ring
        self.cleaning.pop(cleaner, None)
        self.idle.add(cleaner)
        if message.error:
            self.failures += 1
            count = self.failed.get(message.row, (0, 0.0))[0] + 1
            delay_ms = min(self.config.backoff_ms * 2 ** count, MAX_RETRY_DELAY_MS)
            self.failed[message.row] = (count, time.monotonic() + delay_ms / 1000)
        else:
            self.cleanings += 1
            self.failed.pop(message.row, None)
        if self.queue:
            self._assign()
        elif message.swapped:
            self.survey_due()  # what was cleaned may have made room for more: look again now
