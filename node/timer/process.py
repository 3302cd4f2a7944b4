"""The timer process: the node's one holder of delayed work. Its parts:

- the loop (`TimerProcess.run`): sleep on the shared semaphore doorbell until the next deadline (of a
  purgatory or a chore) or until a worker rings; drain every request ring in batches and hand each
  message to the part registered for its kind; advance the clocks; send what is due back;
- the delayed-operation service (node.timer.service): long-poll fetches and acks=all produces;
- the controller (node.timer.controller): topic administration (topics, partitions, configs, records);
- the group coordinator (node.timer.groups): consumer groups and their committed offsets;
- the transaction coordinator (node.timer.transactions): transactional ids, their state log and markers;
- the quota manager (node.timer.quotas): clients' byte rates, node-wide, and throttle timers;
- the flusher (node.timer.flusher): group-commit fsync, and the thread the chores run on;
- the chores (node.timer.chores): producer-state snapshots and retention, on a wheel of their own;
- the cleaning scheduler (node.timer.cleaning): which compacted partition each log cleaner cleans next;
- the outbox (node.timer.outbox): everything sent back to the workers.

Invariants:
- Messages come only from shm.messages; a frame that does not decode, comes the wrong way or has no
  handler is dropped with one log line and never stops the loop.
- On start it announces itself on every completion ring (TIMER_STARTED), so workers re-submit what they
  wait on: nothing waits on a purgatory that no longer exists.
- It exits when the supervisor is gone (checked every turn; the sleep is bounded by max_sleep_ms).
- Every turn of the loop beats its heartbeat (shm.heartbeat), and the sleep is also bounded by
  heartbeat_interval_ms, so an idle timer still beats and only a stuck loop stops beating.
- On SIGTERM the flusher gets a last round before the process goes, so acks=all produces waiting on it
  are answered.
- A thread of the flusher's keeps the GIL at most timer.gil_switch_interval_us once the loop asks for it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import Any, Callable

import posix_ipc

from shmbroker.node.child import ConfigReload, child_arguments, close_all, settle_garbage_collector, start_child
from shmbroker.node.config import NodeConfig
from shmbroker.node.proctitle import set_title
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.chores import Chore, ChoreScheduler
from shmbroker.node.timer.cleaning import CleanerScheduler
from shmbroker.node.timer.controller import Controller
from shmbroker.node.timer.flusher import Flusher
from shmbroker.node.timer.groups.coordinator import GroupCoordinator
from shmbroker.node.timer.groups.offsets import OffsetStore
from shmbroker.node.timer.groups.offsets_watch import OffsetsWatch
from shmbroker.node.timer.outbox import Outbox
from shmbroker.node.timer.quotas import QuotaManager
from shmbroker.node.timer.service import DelayedOperations
from shmbroker.node.timer.stats import TimerStats
from shmbroker.node.timer.transactions.coordinator import TransactionCoordinator
from shmbroker.node.timer.transactions.hanging import HangingTransactions
from shmbroker.node.timer.transactions.markers import MarkerWriter
from shmbroker.node.timer.transactions.state_log import TransactionStateLog
from shmbroker.shm import instance as shm_instance
from shmbroker.shm import messages as M
from shmbroker.shm import stats as S
from shmbroker.shm.doorbell import EventfdDoorbell, SemaphoreDoorbell
from shmbroker.shm.heartbeat import HeartbeatTable
from shmbroker.shm.ring import RingCorrupt, RingReader, RingWriter, announce_sleep_all, woke_all
from shmbroker.shm.table import PartitionTable

log = logging.getLogger("shmbroker.timer")


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class TimerProcess:
    def __init__(self, instance: str, config: NodeConfig, worker_bell_fds: list[int], supervisor_pid: int,
                 config_path: str, heartbeat_slot: int, cleaner_bell_fds: list[int] | None = None) -> None:
        self.config = config
        self.supervisor_pid = supervisor_pid
        self.heartbeats = HeartbeatTable.attach(shm_instance.heartbeat_name(instance))
        self.heartbeat = self.heartbeats.heartbeat(heartbeat_slot, os.getpid())
        self.table = PartitionTable.attach(shm_instance.table_name(instance))
        self.store = PartitionStore(os.path.abspath(config.server.data_dir), self.table, config.log,
                                    config.topics.max_partitions, create_threads=config.topics.create_threads)
        self.bell = SemaphoreDoorbell(shm_instance.timer_doorbell_name(instance))
        # The workers' rings, then the log cleaners' (ring index = workers + cleaner).
        bell_fds = [*worker_bell_fds, *(cleaner_bell_fds or [])]
        self.readers = [RingReader(shm_instance.request_ring_name(instance, i), config=config.rings, takeover=True)
                        for i in range(len(bell_fds))]
        self.outbox = Outbox([RingWriter(shm_instance.completion_ring_name(instance, i), EventfdDoorbell(fd),
                                         config=config.rings, takeover=True)
                              for i, fd in enumerate(bell_fds)], config.timer.completion_chunk)
        now = monotonic_ms()
        self.flusher = Flusher(config, self.table, self.bell.ring)
        self.operations = DelayedOperations(config, self.table, self.outbox, self.flusher, now)
        groups = config.groups
        offsets = OffsetStore(self.store, self.operations.wait_flushed, self.flusher.submit,
                              load_bytes_per_turn=groups.offsets_load_bytes_per_turn,
                              load_interval_ms=groups.offsets_load_interval_ms,
                              segment_bytes=groups.offsets_segment_bytes,
                              commit_timeout_ms=groups.offsets_commit_timeout_ms)
        if config.checks.watch_answers:  # tests only: reads of the offsets table checked against its acks
            OffsetsWatch(offsets)
            log.info("answer watch on: every read of the committed offsets is checked")
        self.groups = GroupCoordinator(groups, self.outbox, offsets, self.store, config.timer.wheel,
                                       config.timer.purgatory, now)
        self.controller = Controller(self.store, self.outbox, self.flusher, groups)
        self.groups.streams.catalog_changed = self.controller.catalog_changed  # after it creates internal topics
        txn = config.transactions
        # The coordinator's state records that clients wait for (EndTxn's decision, ...) are synced at once.
        state_log = TransactionStateLog(self.store, self.operations.wait_flushed,
                                        segment_bytes=txn.state_segment_bytes,
                                        load_bytes_per_turn=txn.state_load_bytes_per_turn,
                                        write_timeout_ms=txn.state_write_timeout_ms,
                                        catalog_changed=self.controller.catalog_changed)
        self.markers = MarkerWriter(self.store, self.operations.wait_flushed, txn.state_write_timeout_ms)
        self.flushed_rows: set[int] = set()  # flushed this turn: their markers are prepared after its answers
        self.transactions = TransactionCoordinator(
            txn, self.outbox, state_log, self.markers,
            self.store, self.groups.commit_transaction_offsets, lambda: self.groups.loading, config.timer.wheel, now,
            groups.offset_metadata_max_bytes, member_error=self.groups.transactional_commit_error)
        self.groups.pending_transactional_offsets = self.transactions.pending_offsets
        self.quotas = QuotaManager(config.quotas, self.outbox, now)
        self.reload = ConfigReload(config_path, config, self._apply_config, log)
        self.chores = ChoreScheduler(config.timer.wheel, now, self._run_chore)
        flush = config.flush
        self.chores.every("producer snapshots", flush.producer_snapshot_interval_ms, _write_producer_snapshots, now)
        self.chores.every("retention", flush.retention_check_interval_ms, _enforce_retention, now)
        self.cleaning = CleanerScheduler(config.cleaner, self.outbox, len(worker_bell_fds), len(cleaner_bell_fds or []),
                                         self.flusher.submit, self.table)
        self.chores.every("cleaning survey", config.cleaner.backoff_ms, self.cleaning.survey_due, now, inline=True)
        self.chores.every("offset expiry", groups.offsets_retention_check_interval_ms, self.groups.expire_offsets, now,
                          inline=True)
        self.chores.every("transactional id expiry", txn.remove_expired_interval_ms,
                          self.transactions.expire_transactional_ids, now, inline=True)
        self.hanging = HangingTransactions(self.store, self.transactions.owns,
                                           txn.transaction_max_timeout_ms + txn.hanging_check_interval_ms, monotonic_ms)
        self.chores.every("hanging transactions", txn.hanging_check_interval_ms, self.hanging.sweep, now, inline=True)
        # The array paths of runs of waits (node.timer.fetch_waits, produce_waits): a run's least length, its call.
        self._batch_paths: dict[M.Kind, tuple[int, Callable[[int, list], bool]]] = {
            M.Kind.DELAY_FETCH: (config.timer.fetch_batch_min, self.operations.delay_fetches),
            M.Kind.DELAY_PRODUCE: (config.timer.produce_batch_min, self.operations.delay_produces),
        }
        self.handlers: dict[M.Kind, Callable[[int, Any], None]] = {
            M.Kind.DELAY_FETCH: self.operations.delay_fetch,
            M.Kind.DELAY_PRODUCE: self.operations.delay_produce,
            M.Kind.CANCEL: self.operations.cancel,
            M.Kind.CREATE_TOPICS: self.controller.create_topics,
            M.Kind.DELETE_TOPICS: self.controller.delete_topics,
            M.Kind.CREATE_PARTITIONS: self.controller.create_partitions,
            M.Kind.ALTER_CONFIGS: self.controller.alter_configs,
            M.Kind.DELETE_RECORDS: self.controller.delete_records,
            M.Kind.FLUSH: lambda worker, message: self.flusher.request(),
            **self.groups.handlers,
            **self.transactions.handlers,
            M.Kind.QUOTA_USAGE: self.quotas.usage,
            M.Kind.THROTTLE: self._throttle,
            M.Kind.CLEANER_READY: self._from_cleaner(self.cleaning.ready),
            M.Kind.CLEANED: self._from_cleaner(self.cleaning.cleaned),
        }
        self.stats_segment = S.StatsSegment.attach(shm_instance.stats_name(instance)) if config.stats.enabled else None
        self.stats = (TimerStats(self.stats_segment.writer(S.TIMER_ROW, "timer", 0, os.getpid()),
                                 config.stats.publish_interval_ms, self.stats_segment)
                      if self.stats_segment is not None else None)
        self._due_ms: int | None = None  # the earliest deadline the current sleep waits for
        # The earliest deadline of every timer when the turn began (None: none): a turn advances the clocks only
        # once it is due. A timer armed during the turn is seen by the next turn's sleep, which then does not
        # wait if it is due already (the cost: one turn later, against ~20 wheel calls on every turn).
        self._next_due_ms: int | None = None
        self.stopping = False

    def _from_cleaner(self, handler: Callable[[int, Any], None]) -> Callable[[int, Any], None]:
        def handle(ring: int, message: Any) -> None:
            if not self.cleaning.is_cleaner(ring):
                raise M.MessageError(f"{message.kind.name} from ring {ring}, which is no cleaner's")
            handler(ring, message)
        return handle

    def _throttle(self, worker: int, message: Any) -> None:
        self.quotas.throttled(worker, message)
        self.operations.delay_throttle(worker, message)

    def _run_chore(self, chore: Chore) -> None:
        self.flusher.submit(chore.name, chore.job)

    # -- the loop ---------------------------------------------------------------------------

    def _drain(self) -> None:
        batch = self.config.timer.drain_batch
        for worker, reader in enumerate(self.readers):
            try:
                frames = reader.read_batch(batch)
            except RingCorrupt as exc:
                log.error("request ring of worker %d is corrupt (%s): dropping its content", worker, exc)
                reader.discard_pending()
                continue
            self._dispatch_all(worker, frames)
            reader.release()
            if self.stats is not None and frames:
                self.stats.received(worker, len(frames))

    def _dispatch_all(self, worker: int, frames: list[memoryview]) -> None:
        """Each frame in order, but a run of consecutive frames of one batch path (one-partition DELAY_FETCH
        frames, DELAY_PRODUCE frames) at least that path's minimum long in one call on its array path
        (DelayedOperations.delay_fetches, delay_produces); whatever a path does not take, one by one."""
        run_path, run_start = None, 0  # frames[run_start:index] are all of run_path (None: no batch path)
        for index, frame in enumerate(frames):
            path = _batch_path(frame)
            if path != run_path:
                self._dispatch_run(worker, run_path, frames[run_start:index])
                run_path, run_start = path, index
        self._dispatch_run(worker, run_path, frames[run_start:])

    def _dispatch_run(self, worker: int, path: M.Kind | None, run: list[memoryview]) -> None:
        if path is not None and run:
            least, batch = self._batch_paths[path]
            try:
                if least and len(run) >= least and batch(worker, run):
                    return
            except Exception:  # a bug costs the run's array path, never the timer process: one by one below
                log.exception("the array path of %d %s frames from worker %d failed", len(run), path.name, worker)
        for frame in run:
            self._dispatch(worker, frame)

    def _dispatch(self, worker: int, frame: memoryview) -> None:
        try:
            message = M.decode(frame)
            handler = self.handlers.get(message.kind)
            if handler is None:
                raise M.MessageError(f"no handler for {message.kind.name}")
            handler(worker, message)
        except (M.MessageError, ValueError, KeyError, TypeError) as exc:
            log.warning("dropping a bad frame from worker %d: %s", worker, exc)
        except Exception:  # a bug costs one message, never the timer process
            log.exception("handling a frame from worker %d failed", worker)

    def _on_flushed(self) -> None:
        while not self.flusher.reports.empty():
            report = self.flusher.reports.get_nowait()
            self.operations.flush_failed(report.round, report.failed)
            self.operations.flushed(report.flushed)
            self.flushed_rows.update(report.flushed)
        self.flusher.run_finished()

    def _sleep_timeout_s(self, now: int) -> float:
        # Capped by the heartbeat interval too: an idle timer still beats (shm.heartbeat).
        timeout = min(self.config.timer.max_sleep_ms, self.config.server.heartbeat_interval_ms)
        due = None
        for deadline in (self.operations.next_expiration(), self.chores.next_expiration(),
                         self.groups.next_expiration(), self.quotas.next_expiration(),
                         self.transactions.next_expiration()):
            if deadline is not None:
                due = deadline if due is None else min(due, deadline)
                timeout = min(timeout, max(0, deadline - now))
        self._due_ms = due if due is not None and due - now <= timeout else None
        self._next_due_ms = due
        if self.outbox.pending():  # a full completion ring: try again soon
            timeout = min(timeout, self.config.timer.ring_full_retry_ms)
        return timeout / 1000

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True
        self.bell.ring()

    def _on_hup(self, signum: int, frame: Any) -> None:
        self.reload.on_hup(signum, frame)
        self.bell.ring()

    def _apply_config(self, config: NodeConfig) -> None:
        """A reloaded config (node.child.ConfigReload): its reloadable settings are the quotas."""
        self.config = config
        self.quotas.reconfigure(config.quotas)
        log.info("reloaded quotas")

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_hup)
        sys.setswitchinterval(self.config.timer.gil_switch_interval_us / 1_000_000)
        self.flusher.start()
        self.outbox.broadcast(M.encode(M.Kind.TIMER_STARTED, os.getpid()))
        self.outbox.flush()
        settle_garbage_collector(self.config, None if self.stats is None else self.stats.writer.counts)
        log.info("timer process ready (%d workers, %d cleaners)", self.cleaning.first_ring, self.cleaning.cleaners)
        while not self.stopping:
            self.heartbeat.beat()
            if os.getppid() != self.supervisor_pid:
                log.error("supervisor is gone: exiting")
                break
            now = monotonic_ms()
            timeout = self._sleep_timeout_s(now)
            # The wake-up time goes in the rings' sleeping word: a worker leaves unrung the frames it knows are
            # needed no earlier (shm.ring, "Lazy wakeups"), which this turn drains when it wakes.
            wake_by = now + round(timeout * 1000)
            if announce_sleep_all(self.readers, wake_by) and self.flusher.reports.empty() \
                    and self.flusher.finished.empty():
                try:
                    self.bell.wait(timeout)
                except posix_ipc.SignalError:
                    pass  # SIGTERM: the handler set `stopping`
            woke_all(self.readers)
            if self.stats is not None:
                now_ns = time.monotonic_ns()
                self.stats.woke(None if self._due_ms is None else self._due_ms * 1_000_000, now_ns)
                if self.stats.due(now_ns):
                    self.stats.writer.set("loop_turns", self.heartbeat.beats)
                    self.stats.publish(self, now_ns)
            if self.reload.requested:
                self.reload.reload()
            self._drain()
            self._on_flushed()
            self.groups.turn()
            self.transactions.turn()
            now = monotonic_ms()
            if self._next_due_ms is not None and now >= self._next_due_ms:
                self.operations.advance(now)
                self.groups.advance(now)
                self.transactions.advance(now)
                self.chores.advance(now)
            self.quotas.end_turn(now)
            self.outbox.flush()
            if self.flushed_rows:  # once the turn's answers are out: off their path, ahead of the EndTxns
                self.markers.prepare(self.flushed_rows)
                self.flushed_rows.clear()
        # Let pending acks=all produces see a last flush before going.
        self.flusher.stop(self.config.server.shutdown_grace_ms / 1000)
        self._on_flushed()
        self.outbox.flush()
        close_all(*self.readers, *self.outbox.writers, self.store, self.heartbeats, self.stats_segment)
        return 0


def _batch_path(frame: memoryview) -> M.Kind | None:
    """The array path a frame can take: its kind, or None (a fetch of several partitions takes none; an empty frame
    none either: decode() names what is wrong with it)."""
    if not len(frame):
        return None
    kind = frame[0]
    if kind == M.Kind.DELAY_PRODUCE or (kind == M.Kind.DELAY_FETCH and len(frame) == M.DELAY_FETCH_ONE_BYTES):
        return kind
    return None


def _write_producer_snapshots(store: PartitionStore) -> None:
    """Producer-state snapshots bound the catch-up scan a worker does on its first idempotent batch."""
    store.each_log(lambda plog: plog.write_producer_snapshot(), "producer snapshot")


def _enforce_retention(store: PartitionStore) -> None:
    """Time and size retention of the clients' topics (the offsets log is compacted by its coordinator)."""
    store.each_log(lambda plog: plog.enforce_retention(), "retention", internal=False)


def main(argv: list[str] | None = None) -> int:
    parser = child_arguments()
    parser.add_argument("--worker-bell-fds", required=True)
    parser.add_argument("--cleaner-bell-fds", default="", help="each log cleaner's doorbell (comma-separated)")
    args = parser.parse_args(argv)
    config = start_child("timer", args.config_file)
    set_title("timer")
    fds = [int(fd) for fd in args.worker_bell_fds.split(",") if fd]
    cleaner_fds = [int(fd) for fd in args.cleaner_bell_fds.split(",") if fd]
    return TimerProcess(args.instance, config, fds, args.supervisor_pid, args.config_file, args.heartbeat_slot,
                        cleaner_fds).run()


if __name__ == "__main__":
    sys.exit(main())
