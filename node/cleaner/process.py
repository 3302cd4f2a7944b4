"""A log cleaner process (`cleaner.processes` of them under the supervisor): it cleans, one at a time, the
compacted partitions the timer process hands it (CLEAN), dirtiest first, and says what each cleaning did
(CLEANED). The timer chooses; the cleaner does the I/O (node.storage.cleaner), at its rate limit.

Its loop: beat the heartbeat, publish its stats row, wait on its doorbell for the timer's messages (at most a
heartbeat interval), then handle them: CLEAN (clean the partition, answer CLEANED), LAYOUT (reload the
catalog: topic configs change the cleaning), TIMER_STARTED (a new timer process: say CLEANER_READY again).

Invariants:
- Every CLEAN gets a CLEANED, with the error when the cleaning failed; a failed or abandoned cleaning leaves
  the log as it was (node.storage.cleaner's swap is the only change it makes).
- A cleaning beats the heartbeat between chunks, so a long one is not taken for a hang; SIGTERM abandons it
  between chunks and the process exits; so does the supervisor's death.
- It starts by saying CLEANER_READY: the timer hands a restarted cleaner work again.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import time
from typing import Any

from shmbroker.node.child import ConfigReload, child_arguments, close_all, settle_garbage_collector, start_child
from shmbroker.node.config import NodeConfig
from shmbroker.node.logging_setup import RateLimitedLog
from shmbroker.node.proctitle import set_title
from shmbroker.node.storage.cleaner import Cleaner, CleanResult, IoLimiter
from shmbroker.node.storage.store import PartitionStore
from shmbroker.shm import instance as shm_instance
from shmbroker.shm import messages as M
from shmbroker.shm import stats as S
from shmbroker.shm.heartbeat import HeartbeatTable
from shmbroker.shm.table import PartitionTable
from shmbroker.shm.timer_link import TimerLink

log = logging.getLogger("shmbroker.cleaner")
FAILURE_LOG_INTERVAL_S = 600.0  # one line per partition per interval about failed cleanings
RESULT_COUNTERS = {"cleaner_bytes_read": "bytes_read", "cleaner_bytes_written": "bytes_written",
                   "cleaner_bytes_reclaimed": "bytes_reclaimed", "cleaner_records_read": "records_read",
                   "cleaner_records_kept": "records_kept", "cleaner_tombstones_dropped": "tombstones_dropped"}


class Abandoned(Exception):
    """The cleaning stops: the process is stopping."""


class CleanerProcess:
    def __init__(self, instance: str, index: int, ring_index: int, config: NodeConfig, bell_fd: int,
                 supervisor_pid: int, config_path: str, heartbeat_slot: int, stats_row: int) -> None:
        self.index = index
        self.config = config
        self.reload = ConfigReload(config_path, config, self._apply_config, log)
        self.supervisor_pid = supervisor_pid
        self.heartbeats = HeartbeatTable.attach(shm_instance.heartbeat_name(instance))
        self.heartbeat = self.heartbeats.heartbeat(heartbeat_slot, os.getpid())
        self.table = PartitionTable.attach(shm_instance.table_name(instance))
        self.store = PartitionStore(os.path.abspath(config.server.data_dir), self.table, config.log,
                                    config.topics.max_partitions)
        self.link = TimerLink(instance, ring_index, config.rings, bell_fd)
        self.stats_segment = S.StatsSegment.attach(shm_instance.stats_name(instance)) if config.stats.enabled else None
        self.stats = (self.stats_segment.writer(stats_row, "cleaner", index, os.getpid())
                      if self.stats_segment is not None else None)
        self.limiter = IoLimiter(config.cleaner.io_max_bytes_per_second)
        self.cleaner = Cleaner(config.cleaner, self.limiter, progress=self._between_chunks)
        self.cleaning_row = -1
        self.failure_log = RateLimitedLog(log, FAILURE_LOG_INTERVAL_S)  # a full disk fails every try: one line
        self.stopping = False
        self._next_publish = 0.0

    # -- signals and liveness -------------------------------------------------------------------

    def _on_term(self, signum: int, frame: Any) -> None:
        self.stopping = True
        self.link.bell.ring()  # the poll is retried after a handler (PEP 475): wake it, not a heartbeat later

    def _apply_config(self, config: NodeConfig) -> None:
        self.config = config

    def _between_chunks(self) -> None:
        self.heartbeat.beat()
        self._publish_stats()
        if self.stopping or os.getppid() != self.supervisor_pid:
            raise Abandoned()

    def _publish_stats(self, force: bool = False) -> None:
        if self.stats is None:
            return
        now = time.monotonic()
        if force or now >= self._next_publish:
            self.stats.set("cleaner_busy", 1 if self.cleaning_row >= 0 else 0)
            self.stats.set("cleaner_io_sleep_ms", int(self.limiter.slept_s * 1000))
            self.stats.add("loop_turns")
            self.stats.publish()
            self._next_publish = now + self.config.stats.publish_interval_ms / 1000

    # -- messages -------------------------------------------------------------------------------

    def _ready(self) -> None:
        self.link.send(M.encode(M.Kind.CLEANER_READY, os.getpid(), self.cleaning_row))
        self.link.flush()

    def _handle(self, message: Any) -> None:
        if message.kind == M.Kind.CLEAN:
            self._clean(message)
        elif message.kind == M.Kind.LAYOUT:
            self.store.reload()
        elif message.kind == M.Kind.TIMER_STARTED:
            self._ready()

    def _clean(self, message: Any) -> None:
        row, topic, partition = message.row, message.topic, message.partition
        self.cleaning_row = row
        self._publish_stats(force=True)
        result, error = CleanResult(), ""
        try:
            self.store.reload()
            if self.store.row(topic, partition) != row:
                raise LookupError(f"{topic}-{partition} is not row {row} any more")
            result = self.cleaner.clean(self.store.log(row))
        except Abandoned:
            error = "abandoned: the cleaner is stopping"
        except Exception as exc:  # a bug or a fault costs this cleaning, never the process
            error = f"{type(exc).__name__}: {exc}"
            self.failure_log.warning((topic, partition), "cleaning %s-%d failed (the log stays as it was; the "
                                     "node tries again later): %s", topic, partition, error)
        self.cleaning_row = -1
        self._account(row, result, error)
        self.link.send(M.encode(M.Kind.CLEANED, row, partition, topic, error, result.swapped, result.first_dirty,
                                result.cleaned_to, result.bytes_read, result.bytes_written, result.bytes_reclaimed,
                                result.records_read, result.records_kept, result.tombstones_dropped, result.keys,
                                int(result.seconds * 1000)))
        self.link.flush()
        if not error:  # as Kafka's cleaner, a line for every cleaning, one that removed nothing too
            log.info("cleaned %s-%d: %d records of %d kept, %.1f MB read, %.1f MB reclaimed, %d keys, %.3f s%s",
                     topic, partition, result.records_kept, result.records_read, result.bytes_read / (1 << 20),
                     result.bytes_reclaimed / (1 << 20), result.keys, result.seconds,
                     "" if result.swapped else " (nothing to remove)")

    def _account(self, row: int, result: CleanResult, error: str) -> None:
        now_ms = time.time_ns() // 1_000_000
        stats = self.table.cleaning(row)
        if error:
            self.table.set_cleaning(row, errors=stats.errors + 1)
        else:
            self.table.set_cleaning(row, last_run_ms=now_ms, bytes_cleaned=stats.bytes_cleaned + result.bytes_read,
                                    bytes_reclaimed=stats.bytes_reclaimed + result.bytes_reclaimed)
        if self.stats is not None:
            self.stats.add("cleaner_errors" if error else "cleanings")
            for counter, attribute in RESULT_COUNTERS.items():
                self.stats.add(counter, getattr(result, attribute))
            self.stats.set("cleaner_last_run_ms", now_ms)
            self._publish_stats(force=True)

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGHUP, self.reload.on_hup)
        self._ready()
        settle_garbage_collector(self.config, None if self.stats is None else self.stats.counts)
        # Its start at the priority of the node's other processes (a busy machine would hold it back, and the
        # node's READY=1 with it); its cleanings at the cleaner's own (node.storage.cleaner's `nice`, `scheduling`).
        os.nice(self.config.cleaner.nice)
        if self.config.cleaner.scheduling == "idle":
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        log.info("cleaner %d ready", self.index)
        interval_s = self.config.server.heartbeat_interval_ms / 1000
        poller = select.poll()
        poller.register(self.link.doorbell_fd, select.POLLIN)
        while not self.stopping:
            self.heartbeat.beat()
            self._publish_stats()
            if os.getppid() != self.supervisor_pid:
                log.error("supervisor is gone: exiting")
                break
            if self.reload.requested:
                self.reload.reload()
            if self.link.announce_sleep():
                try:
                    poller.poll(interval_s * 1000)
                except InterruptedError:
                    pass
            self.link.woke()
            self.link.drain_doorbell()
            for message in self.link.receive():
                if self.stopping:
                    break
                self._handle(message)
            self.link.flush()
        close_all(self.link, self.store, self.table, self.heartbeats, self.stats_segment)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = child_arguments()
    parser.add_argument("--ring-index", type=int, required=True, help="its rings' index (after the workers')")
    parser.add_argument("--bell-fd", type=int, required=True, help="its doorbell eventfd, which the timer rings")
    parser.add_argument("--stats-row", type=int, required=True)
    args = parser.parse_args(argv)
    config = start_child(f"cleaner-{args.index}", args.config_file)
    set_title(f"cleaner {args.index}")
    return CleanerProcess(args.instance, args.index, args.ring_index, config, args.bell_fd, args.supervisor_pid,
                          args.config_file, args.heartbeat_slot, args.stats_row).run()


if __name__ == "__main__":
    sys.exit(main())
