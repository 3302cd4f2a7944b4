"""The timer process: the node's single holder of delayed requests, its flusher, and its
authority for topic creation and deletion.

Loop: sleep on the shared semaphore doorbell until the next timer deadline (or a ring, or a
flush); drain every request ring in batches; run the purgatories; send completions back.

Invariants:
- Exactly one live operation per (worker, request id): duplicates (a re-submission after a
  restart, a frame delivered twice after a consumer crash) are ignored.
- Every operation completes once, satisfied or expired, and yields exactly one completion frame
  to its worker; a cancelled operation (its connection closed) yields none.
- Completions that do not fit a worker's ring wait in that worker's outbox, in order, and are
  retried every turn; the timer never blocks on a worker.
- On start it announces itself on every completion ring, so workers re-submit what they wait on.
- Topic changes happen only here: directories and table rows first, then the catalog file
  (atomically), then a layout message to every worker, then the reply to the requester.
- It exits when the supervisor is gone (checked every turn; the sleep is bounded by max_sleep_ms).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from typing import Any

import posix_ipc
from kio.schema.errors import ErrorCode

from node.storage.catalog import CatalogError
from node.cli import setup_logging
from node.config import NodeConfig
from node.timer.delayed import DelayedFetch, DelayedProduce
from node.timer.flusher import Flusher
from node.storage.log import PartitionLog, partition_directory
from node.storage.partitions import Partitions
from node.timer.purgatory import Purgatory
from node.resources import interest_name, ring_config, table_name
from shm import frames as F
from shm import instance as shm_instance
from shm.doorbell import EventfdDoorbell, SemaphoreDoorbell
from shm.ring import RingCorrupt, RingReader, RingWriter, announce_sleep_all, woke_all
from shm.interest import InterestTable, full_fence
from shm.table import PartitionTable
from workers.timer_link import OP_LAYOUT, OP_REPLY, OP_TIMER_STARTED

log = logging.getLogger("shmbroker.timer")


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class TimerProcess:
    def __init__(self, instance: str, config: NodeConfig, worker_bell_fds: list[int], supervisor_pid: int) -> None:
        self.instance = instance
        self.config = config
        self.supervisor_pid = supervisor_pid
        self.table = PartitionTable.attach(table_name(instance))
        self.interest = InterestTable.attach(interest_name(instance))
        self.interest.counts[:] = 0  # the only writer; operations of a dead predecessor are gone
        self.data_dir = os.path.abspath(config.server.data_dir)
        self.partitions = Partitions(self.data_dir, self.table, config.log, config.topics.max_partitions)
        self.bell = SemaphoreDoorbell(shm_instance.timer_doorbell_name(instance))
        rings = ring_config(config)
        self.readers = [RingReader(shm_instance.request_ring_name(instance, i), config=rings, takeover=True)
                        for i in range(len(worker_bell_fds))]
        self.writers = [RingWriter(shm_instance.completion_ring_name(instance, i), EventfdDoorbell(fd),
                                   config=rings, takeover=True)
                        for i, fd in enumerate(worker_bell_fds)]
        self.outbox: list[list[bytes]] = [[] for _ in worker_bell_fds]
        # Completion items (request id, status, error) gathered during one turn, per worker.
        self._done: list[list[tuple[int, int, int]]] = [[] for _ in worker_bell_fds]
        timer = config.timer
        now = monotonic_ms()
        self.fetches = Purgatory("fetch", timer.purge_interval, timer.tick_ms, timer.wheel_size, now)
        self.produces = Purgatory("produce", timer.purge_interval, timer.tick_ms, timer.wheel_size, now)
        self.operations: dict[tuple[int, int], Any] = {}
        self.cancelled: set[tuple[int, int]] = set()
        self.flusher = Flusher(config, self.table, self.bell.ring)
        self.flusher.catalog_version = self.partitions.version
        self.stopping = False

    # -- completions ------------------------------------------------------------------------

    def _complete(self, op: Any, expired: bool) -> None:
        self.operations.pop(op.key, None)
        if isinstance(op, DelayedFetch):
            self.interest.add(op.watch_keys(), -1)
        if op.key in self.cancelled:
            self.cancelled.discard(op.key)
            return
        self._done[op.worker].append((op.request_id, F.Status.EXPIRED if expired else F.Status.SATISFIED, 0))

    def _control(self, worker: int, document: dict) -> None:
        self.outbox[worker].append(F.encode_control(document))

    def _send(self) -> None:
        for worker, items in enumerate(self._done):
            if items:
                self.outbox[worker].append(F.encode_rows(F.Kind.COMPLETION, None, items))
                self._done[worker] = []
        for worker, frames in enumerate(self.outbox):
            if frames:
                written = self.writers[worker].write_many(frames)
                del frames[:written]

    # -- requests ---------------------------------------------------------------------------

    def _watch(self, purgatory: Purgatory, op: Any, deadline_ms: int) -> None:
        if op.key in self.operations:  # a re-submission, or a frame delivered twice
            return
        self.operations[op.key] = op
        if isinstance(op, DelayedFetch):
            # Interest first, then the table check inside try_complete (see shm.interest).
            self.interest.add(op.watch_keys(), +1)
            full_fence()
        purgatory.try_complete_else_watch(op, op.watch_keys(), deadline_ms)

    def _delay_fetch(self, worker: int, frame: memoryview) -> None:
        _, (request_id, deadline_ms, min_bytes), items = F.decode_rows(frame, F.Kind.DELAY_FETCH)
        op = DelayedFetch(worker, request_id, min_bytes, [i[0] for i in items], [i[1] for i in items],
                          self.table, self._complete)
        self._watch(self.fetches, op, deadline_ms)

    def _delay_produce(self, worker: int, frame: memoryview) -> None:
        _, (request_id, deadline_ms), items = F.decode_rows(frame, F.Kind.DELAY_PRODUCE)
        op = DelayedProduce(worker, request_id, [i[0] for i in items], [i[1] for i in items],
                            self.table, self._complete)
        self._mark_dirty(op.watch_keys())
        self._watch(self.produces, op, deadline_ms)

    def _appends(self, frame: memoryview) -> None:
        _, _, items = F.decode_rows(frame, F.Kind.APPEND)
        for row in dict.fromkeys(item[0] for item in items):
            self.fetches.check_and_complete(row)

    def _mark_dirty(self, rows: list[int]) -> None:
        """An acks=all produce waits on `rows`: flush within the group-commit window, or at once
        when enough bytes wait. (Appends nobody waits on are flushed in the background.)"""
        self.flusher.mark_dirty()
        states = [self.table.read(row) for row in rows]
        if sum(s.end_bytes - s.flushed_bytes for s in states) >= self.config.flush.flush_bytes:
            self.flusher.kick()

    def _cancels(self, worker: int, frame: memoryview) -> None:
        _, _, items = F.decode_rows(frame, F.Kind.CANCEL)
        for (request_id,) in items:
            op = self.operations.get((worker, request_id))
            if op is not None:
                self.cancelled.add((worker, request_id))
                op.force_complete()

    def _control_request(self, worker: int, frame: memoryview) -> None:
        doc = F.decode_control(frame)
        request_id = int(doc.get("request_id", 0))
        op = doc.get("op")
        if op == "create_topics":
            outcome = self._create_topics([(str(name), int(count)) for name, count in doc.get("topics", [])])
        elif op == "delete_topics":
            outcome = self._delete_topics([str(name) for name in doc.get("topics", [])])
        else:
            log.warning("unknown control op %r from worker %d", op, worker)
            return
        self._control(worker, {"op": OP_REPLY, "request_id": request_id, "outcome": outcome})

    def _broadcast_layout(self) -> None:
        self.flusher.catalog_version = self.partitions.version
        for worker in range(len(self.writers)):
            self._control(worker, {"op": OP_LAYOUT, "version": self.partitions.version})

    def _create_topics(self, topics: list[tuple[str, int]]) -> dict[str, tuple[int, str | None]]:
        catalog = self.partitions.catalog
        catalog.reload()
        outcome: dict[str, tuple[int, str | None]] = {}
        created = []
        for name, count in topics:
            if name in catalog.topics:  # e.g. two workers auto-creating the same topic: both succeed
                outcome[name] = (0, None)
                continue
            try:
                entry = catalog.add_topic(name, count)
            except CatalogError as exc:
                outcome[name] = (exc.code, str(exc))
                continue
            for partition, row in enumerate(entry.rows):
                PartitionLog.recover(partition_directory(self.data_dir, name, partition), self.table, row,
                                     self.config.log).close()
            created.append(name)
            outcome[name] = (0, None)
        if created:
            catalog.save()
            self.partitions.reload()
            self._broadcast_layout()
            log.info("created topics %s", created)
        return outcome

    def _delete_topics(self, names: list[str]) -> dict[str, tuple[int, str | None]]:
        catalog = self.partitions.catalog
        catalog.reload()
        outcome: dict[str, tuple[int, str | None]] = {}
        doomed = []
        for name in names:
            entry = catalog.topics.get(name)
            if entry is None:
                outcome[name] = (int(ErrorCode.unknown_topic_or_partition), f"unknown topic {name!r}")
                continue
            doomed.append(entry)
            catalog.remove_topic(name)
            outcome[name] = (0, None)
        if doomed:
            catalog.save()  # first forget the topic, so a crash never leaves a catalogued topic half deleted
            for entry in doomed:
                for partition, row in enumerate(entry.rows):
                    plog = PartitionLog(partition_directory(self.data_dir, entry.name, partition), self.table, row,
                                        self.config.log)
                    plog.delete()
            self.partitions.reload()
            self._broadcast_layout()
            log.info("deleted topics %s", [e.name for e in doomed])
        return outcome

    def _handle(self, worker: int, frame: memoryview) -> None:
        kind = F.kind_of(frame)
        if kind == F.Kind.DELAY_FETCH:
            self._delay_fetch(worker, frame)
        elif kind == F.Kind.DELAY_PRODUCE:
            self._delay_produce(worker, frame)
        elif kind == F.Kind.APPEND:
            self._appends(frame)
        elif kind == F.Kind.CANCEL:
            self._cancels(worker, frame)
        elif kind == F.Kind.CONTROL:
            self._control_request(worker, frame)
        else:
            log.warning("unexpected %s frame from worker %d", kind.name, worker)

    # -- loop --------------------------------------------------------------------------------

    def _drain(self) -> None:
        batch = self.config.timer.drain_batch
        for worker, reader in enumerate(self.readers):
            try:
                frames = reader.read_batch(batch)
            except RingCorrupt as exc:
                log.error("request ring of worker %d is corrupt (%s): dropping its content", worker, exc)
                reader.discard_pending()
                continue
            for frame in frames:
                try:
                    self._handle(worker, frame)
                except (F.FrameError, ValueError, KeyError, TypeError) as exc:
                    log.warning("dropping a bad frame from worker %d: %s", worker, exc)
            reader.release()

    def _on_flushed(self) -> None:
        while not self.flusher.flushed.empty():
            for row in self.flusher.flushed.get_nowait():
                self.produces.check_and_complete(row)

    def _sleep_timeout_s(self, now: int) -> float:
        deadlines = [d for d in (self.fetches.next_expiration(), self.produces.next_expiration()) if d is not None]
        cap = self.config.timer.max_sleep_ms
        wait = min([cap] + [max(0, d - now) for d in deadlines])
        return wait / 1000

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True
        self.bell.ring()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.flusher.start()
        for worker in range(len(self.writers)):
            self._control(worker, {"op": OP_TIMER_STARTED, "pid": os.getpid()})
        self._send()
        log.info("timer process ready (%d workers)", len(self.writers))
        while not self.stopping:
            if os.getppid() != self.supervisor_pid:
                log.error("supervisor is gone: exiting")
                break
            timeout = self._sleep_timeout_s(monotonic_ms())
            if any(self.outbox):
                timeout = min(timeout, 0.001)
            if announce_sleep_all(self.readers) and self.flusher.flushed.empty():
                try:
                    self.bell.wait(timeout)
                except posix_ipc.SignalError:
                    pass  # SIGTERM: the handler set `stopping`
            woke_all(self.readers)
            self._drain()
            self._on_flushed()
            now = monotonic_ms()
            self.fetches.advance(now)
            self.produces.advance(now)
            self._send()
        # Let pending acks=all produces see a last flush before going.
        self.flusher.stop(self.config.server.shutdown_grace_ms / 1000)
        self._on_flushed()
        self._send()
        for end in self.readers + self.writers:
            end.close()
        self.partitions.close()
        self.interest.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instance", required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--supervisor-pid", type=int, required=True)
    parser.add_argument("--worker-bell-fds", required=True)
    args = parser.parse_args(argv)
    setup_logging("timer")
    config = NodeConfig.from_json(args.config_json)
    fds = [int(fd) for fd in args.worker_bell_fds.split(",") if fd]
    return TimerProcess(args.instance, config, fds, args.supervisor_pid).run()


if __name__ == "__main__":
    sys.exit(main())
