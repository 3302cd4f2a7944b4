"""The timer process's row of the stats segment (shm.stats): what its parts counted, published every interval.

The parts keep their own counters (purgatories, the wheels, the flusher thread, the quota manager, the group
coordinator, the outbox and the request rings); `TimerStats.publish` copies them into the row's counters and
the current gauges, then publishes the row. The only thing measured here is the loop's lateness: how long
after the earliest deadline it planned to wake for it actually woke (p50/p99 of the samples of one interval).

Invariants: nothing here is on a message's path; a publish costs one pass over the parts every
stats.publish_interval_ms; lateness samples are bounded per interval (MAX_LATENESS_SAMPLES).
"""

from __future__ import annotations

from typing import Any

from shmbroker.node.timer.groups.share_partition import AckType
from shmbroker.shm import stats as S

MAX_LATENESS_SAMPLES = 100_000


class TimerStats:
    def __init__(self, writer: S.StatsWriter, interval_ms: int, segment: S.StatsSegment | None = None) -> None:
        self.writer = writer
        self.segment = segment  # where the groups' committed offsets go (its committed offsets area)
        self._committed: dict | None = None  # the last published, to publish only changes
        self._transactions_seen: int | None = None  # the state log's changes when the transactions were published
        self.interval_ns = interval_ms * 1_000_000
        self._next_ns = 0
        self._lateness_us: list[int] = []
        self._frames_received: list[int] = []

    def woke(self, due_ns: int | None, now_ns: int) -> None:
        """After a sleep planned to end at `due_ns` (a deadline; None: no deadline): one lateness sample."""
        if due_ns is not None and now_ns >= due_ns and len(self._lateness_us) < MAX_LATENESS_SAMPLES:
            self._lateness_us.append((now_ns - due_ns) // 1000)

    def received(self, worker: int, frames: int) -> None:
        received = self._frames_received
        while len(received) <= worker:
            received.append(0)
        received[worker] += frames

    def _publish_committed(self, offsets: Any) -> None:
        """The committed offset of every group and partition into the segment, when it changed (and once
        the offsets are loaded: an empty document while loading would read as "nothing committed")."""
        if self.segment is None or offsets.loading:
            return
        committed = {group: [(topic, partition, entry.offset) for (topic, partition), entry in entries.items()]
                     for group, entries in offsets.table.items()}
        if committed != self._committed:
            self.segment.publish_committed(committed)  # readers see whether it was cut
            self._committed = committed

    def _publish_transactions(self, coordinator: Any) -> None:
        """Every transactional id's state into the segment, when a state write ended since the last publish (and
        once loaded)."""
        changes = coordinator.state_log.changes
        if self.segment is None or coordinator.loading or changes == self._transactions_seen:
            return
        self.segment.transactions.publish(coordinator.describe())
        self._transactions_seen = changes

    def due(self, now_ns: int) -> bool:
        return now_ns >= self._next_ns

    def publish(self, timer: Any, now_ns: int) -> None:
        """`timer`: the TimerProcess (not imported: it imports this module)."""
        self._next_ns = now_ns + self.interval_ns
        w = self.writer
        ops, groups = timer.operations, timer.groups
        purgatories = {"fetch": ops.fetches, "produce": ops.produces, "throttle": ops.throttles,
                       "join": groups.joins, "sync": groups.syncs}
        entries = levels = slots = 0
        by_level = [0] * S.MAX_WHEEL_LEVELS
        # The array paths of the fetch and produce purgatories: their figures count as their purgatories'.
        array_paths = {"fetch": ops.fetch_waits, "produce": ops.produce_waits}
        for kind, purgatory in purgatories.items():
            extra = array_paths.get(kind)
            w.set(f"purgatory_{kind}_pending", purgatory.pending + (extra.pending if extra else 0))
            w.set(f"purgatory_{kind}_watched", purgatory.watched + (extra.pending if extra else 0))
            w.set(f"purgatory_{kind}_completed", purgatory.completed + (extra.completed if extra else 0))
            w.set(f"purgatory_{kind}_expired", purgatory.expired + (extra.expired if extra else 0))
            for wheel in (purgatory.timer, extra.timer) if extra else (purgatory.timer,):
                entries, levels = entries + wheel.pending, max(levels, wheel.levels)
                slots += wheel.slots_in_use
                _add_levels(by_level, wheel)
        sessions = groups.sessions
        w.set("purgatory_session_pending", len(sessions))
        w.set("purgatory_session_watched", len(sessions))
        w.set("purgatory_session_expired", sessions.expired)
        entries += sessions.wheel.pending
        slots += sessions.wheel.slots_in_use
        _add_levels(by_level, sessions.wheel)
        w.set("wheel_entries", entries)
        w.set("wheel_levels", levels)
        w.set("wheel_slots", slots)
        for level, count in enumerate(by_level):
            w.set("wheel_entries_by_level", count, level)
        lateness = sorted(self._lateness_us)
        self._lateness_us = []
        w.set("timer_lateness_p50_us", S.percentile(lateness, 0.50))
        w.set("timer_lateness_p99_us", S.percentile(lateness, 0.99))
        w.add("timer_wakeups_late", len(lateness))
        self._publish_committed(groups.offsets)
        flusher = timer.flusher
        w.set("flushes", flusher.rounds)
        w.set("fsyncs", flusher.fsyncs)
        w.set("urgent_fsyncs", flusher.urgent_fsyncs)
        w.set("flush_errors", flusher.errors)
        w.set("fsync_us_total", flusher.fsync_ns_total // 1000)
        w.set("fsync_us_max", flusher.fsync_ns_max // 1000)
        flusher.fsync_ns_max = 0
        w.set("bytes_flushed", flusher.bytes_flushed)
        w.set("throttles", timer.quotas.throttles)
        w.set("throttle_ms_total", timer.quotas.throttle_ms_total)
        w.set("throttled_clients", len(timer.quotas.over_quota))
        w.set("quota_clients", len(timer.quotas.clients))
        w.set("quota_clients_expired", timer.quotas.expired)
        w.set("groups", len(groups.groups))
        w.set("group_members", sum(len(group.members) for group in groups.groups.values()))
        w.set("rebalances", groups.rebalances)
        w.set("consumer_groups", len(groups.consumer.groups))
        w.set("consumer_group_members", sum(len(g.members) for g in groups.consumer.groups.values()))
        w.set("target_assignments", groups.consumer.target_computations)
        w.set("streams_groups", len(groups.streams.groups))
        share = groups.share
        w.set("share_groups", len(share.groups))
        w.set("share_group_members", sum(len(g.members) for g in share.groups.values()))
        w.set("share_member_joins", share.joins)
        w.set("share_partitions", len(share.partitions))
        w.set("share_records_in_flight", sum(p.in_flight() for p in share.partitions.values()))
        w.set("share_records_acquired", share.counted("acquired"))
        w.set("share_redeliveries", share.counted("redelivered"))
        w.set("share_records_archived", share.counted("archived"))
        w.set("share_lock_expiries", share.lock_expiries)
        for kind in AckType:
            w.set(f"share_acknowledged_{kind.name.lower()}", share.acknowledged[kind])
        w.set("streams_group_members", sum(len(g.members) for g in groups.streams.groups.values()))
        transactions = timer.transactions
        w.set("transactions_open", transactions.open_transactions())
        w.set("transactions_committed", transactions.commits)
        w.set("transactions_aborted", transactions.aborts)
        w.set("transactions_timed_out", transactions.timed_out)
        w.set("transaction_markers", transactions.markers.written)
        w.set("transaction_partitions_reconciled", transactions.reconciled)
        w.set("transaction_requests_held", transactions.held.held)
        w.set("transaction_requests_refused", transactions.held.refused)
        self._publish_transactions(transactions)
        capacity = timer.config.rings.capacity
        for worker, writer in enumerate(timer.outbox.writers[:S.MAX_RINGS]):
            w.set("ring_frames_sent", timer.outbox.frames_sent[worker], worker)
            w.set("ring_used_bytes", max(0, capacity - writer.free_bytes()), worker)
            w.set("ring_capacity_bytes", capacity, worker)
        for worker, frames in enumerate(self._frames_received[:S.MAX_RINGS]):
            w.set("ring_frames_received", frames, worker)
        w.publish()


def _add_levels(by_level: list[int], wheel: Any) -> None:
    for level, count in enumerate(wheel.entries_per_level()[:len(by_level)]):
        by_level[level] += count
