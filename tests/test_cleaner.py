"""The log cleaner on real partition logs (node.storage.cleaner): keyed updates and tombstones cleaned to the
latest record of each key with offsets unchanged, compressed and idempotent batches, the offset map's bound,
and the swap: a crash at any step leaves the old set of segments or the new one."""

from __future__ import annotations

import contextlib
import os
import random
import time
from typing import Iterator

import numpy as np
import pytest
from kafka.record.default_records import DefaultRecordBatch

from shmbroker.node.storage import cleaner as C
from shmbroker.node.storage.log import LogConfig, PartitionLog
from shmbroker.node.storage.records import ErrorCode, StorageError, build_batch, parse_header
from shmbroker.node.storage.segment import segment_base_offsets
from tests.record_batches import GZIP

COMPACT = LogConfig(cleanup_policy="compact", segment_bytes=8_000, index_interval_bytes=500, index_max_bytes=4096,
                    delete_retention_ms=3_600_000)
UNLIMITED = C.CleanerConfig(io_max_bytes_per_second=-1, io_buffer_bytes=4096)
HOUR_MS = 3_600_000


pytestmark = pytest.mark.usefixtures("nothing_left_in_dev_shm")


def batch(records: list[tuple[bytes | None, bytes | None]], timestamp: int, compression: int = 0,
          producer: tuple[int, int, int] = (-1, -1, -1)) -> bytes:
    """A v2 batch of (key, value) records; read back with kafka-python's reader, an independent decoder."""
    producer_id, epoch, sequence = producer
    return build_batch(records, timestamp, compression=compression, producer_id=producer_id, producer_epoch=epoch,
                       base_sequence=sequence)


@contextlib.contextmanager
def open_log(tmp_path, table, config: LogConfig = COMPACT) -> Iterator[PartitionLog]:
    """The test's log (recovered from its directory), closed afterwards."""
    plog = PartitionLog.recover(str(tmp_path / "t-0"), table, 0, config)
    try:
        yield plog
    finally:
        plog.close()


def read_all(plog: PartitionLog, start: int | None = None) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record from `start` (default the log start), through the fetch path."""
    state = plog.state()
    offset = state.log_start_offset if start is None else start
    out = []
    while offset < state.log_end_offset:
        fetched = plog.read(offset, 1 << 20)
        if not fetched.size:
            break
        for fd, position, length in fetched.ranges:
            data = os.pread(fd, length, position)
            while data:
                header = parse_header(data)
                for record in DefaultRecordBatch(data[:header.size]):
                    out.append((record.offset, record.key, record.value))
                offset = header.last_offset + 1
                data = data[header.size:]
    return out


def write_updates(plog: PartitionLog, rounds: int, keys: int, timestamp: int, compression: int = 0,
                  deleted: set[int] = frozenset()) -> dict[bytes, tuple[int, bytes | None]]:
    """`rounds` updates of every key, 10 keys a batch; the keys in `deleted` get a tombstone last. Returns
    each key's latest (offset, value)."""
    latest = {}
    for round_ in range(rounds):
        for first in range(0, keys, 10):
            records = [(b"key-%d" % k, b"value-%d-%d" % (k, round_) + b"x" * 50) for k in range(first, first + 10)]
            appended = plog.append(batch(records, timestamp, compression))
            for delta, (key, value) in enumerate(records):
                latest[key] = (appended.base_offset + delta, value)
    for k in sorted(deleted):
        appended = plog.append(batch([(b"key-%d" % k, None)], timestamp, compression))
        latest[b"key-%d" % k] = (appended.base_offset, None)
    return latest


def check_latest(plog: PartitionLog, latest: dict, tombstones_kept: bool) -> None:
    records = read_all(plog)
    offsets = [offset for offset, _, _ in records]
    assert offsets == sorted(set(offsets)), "offsets strictly increase"
    expected = {key: entry for key, entry in latest.items() if tombstones_kept or entry[1] is not None}
    # Each live key once, at its latest offset and value; the active segment may hold more recent duplicates.
    active_base = plog.state().active_base_offset
    cleaned = {key: (offset, value) for offset, key, value in records if offset < active_base}
    in_clean_part = {key: entry for key, entry in expected.items() if entry[0] < active_base}
    assert cleaned == in_clean_part
    seen = [key for offset, key, _ in records if offset < active_base]
    assert len(seen) == len(set(seen)), "no key twice in the cleaned segments"


def test_keyed_updates_are_cleaned_to_the_latest_value_with_offsets_kept(tmp_path, table):
    with open_log(tmp_path, table) as plog:
        now = time.time_ns() // 1_000_000
        latest = write_updates(plog, rounds=6, keys=40, timestamp=now, deleted={3, 7})
        plog.roll()
        before = read_all(plog)
        dirty = C.dirtiness(plog, now)
        assert dirty.first_dirty == 0 and dirty.dirty_bytes > 0 and dirty.ratio == 1.0 and C.due(dirty, 0.5)
        result = C.Cleaner(UNLIMITED).clean(plog)
        assert result.swapped and result.cleaned_to == plog.state().active_base_offset
        assert result.records_kept == 40 and result.keys == 40 and result.bytes_reclaimed > 0
        check_latest(plog, latest, tombstones_kept=True)  # tombstones stay for delete.retention.ms
        # Offsets are those the records had; a fetch inside a removed range gets the next record.
        original = {offset: (key, value) for offset, key, value in before}
        assert all(original[offset] == (key, value) for offset, key, value in read_all(plog))
        assert read_all(plog, start=1)[0][0] > 1
        assert C.read_checkpoint(plog.directory) == result.cleaned_to
        assert not os.path.exists(os.path.join(plog.directory, C.CLEANING_DIR))
        # Nothing more to clean until new segments come.
        assert C.dirtiness(plog, now).dirty_bytes == 0
        again = C.Cleaner(UNLIMITED).clean(plog)
        assert not again.swapped and again.records_read == 0


def test_tombstones_go_after_delete_retention_and_compact_delete_applies_both(tmp_path, table):
    config = LogConfig(cleanup_policy="compact,delete", segment_bytes=8_000, index_interval_bytes=500,
                       index_max_bytes=4096, delete_retention_ms=HOUR_MS, retention_ms=10 * HOUR_MS)
    with open_log(tmp_path, table, config) as plog:
        now = time.time_ns() // 1_000_000
        old = now - 2 * HOUR_MS  # older than delete.retention.ms, younger than retention.ms
        latest = write_updates(plog, rounds=3, keys=20, timestamp=old, deleted={0, 5, 19})
        plog.roll()
        C.Cleaner(UNLIMITED).clean(plog)
        check_latest(plog, latest, tombstones_kept=False)
        keys = {key for _, key, _ in read_all(plog)}
        assert not {b"key-0", b"key-5", b"key-19"} & keys and len(keys) == 17
        # retention.ms applies too: once the segments are older than it, they go.
        assert plog.enforce_retention(now + 20 * HOUR_MS) > 0


def test_compressed_and_idempotent_batches_keep_their_header_and_producer_state(tmp_path, table):
    with open_log(tmp_path, table) as plog:
        now = time.time_ns() // 1_000_000
        sequence = 0
        for round_ in range(5):
            records = [(b"k%d" % k, b"v%d" % round_) for k in range(8)]
            plog.append(batch(records, now, GZIP, producer=(77, 3, sequence)))
            sequence += len(records)
        plog.roll()
        result = C.Cleaner(UNLIMITED).clean(plog)
        assert result.swapped
        stored = []
        for fd, position, length in plog.read(0, 1 << 20).ranges:
            data = os.pread(fd, length, position)
            while data:
                header = parse_header(data)
                stored.append(header)
                data = data[header.size:]
        # The last batch of producer 77 keeps every record (each key's latest); earlier ones went, empty.
        assert [(h.producer_id, h.producer_epoch, h.base_sequence, h.compression) for h in stored] == [(77, 3, 32, GZIP)]
        assert {key: value for _, key, value in read_all(plog)} == {b"k%d" % k: b"v4" for k in range(8)}
    # After a restart (producer state rebuilt from the cleaned log), a retry of the last batch is a duplicate.
    with open_log(tmp_path, table) as plog:
        retry = plog.append(batch([(b"k%d" % k, b"v4") for k in range(8)], now, GZIP, producer=(77, 3, 32)))
        assert retry.duplicate and retry.base_offset == 32
        with pytest.raises(StorageError) as refused:
            plog.append(batch([(b"k0", b"late")], now, GZIP, producer=(77, 3, 60)))
        assert refused.value.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_producers_last_batch_stays_empty_when_its_records_are_superseded(tmp_path, table):
    with open_log(tmp_path, table) as plog:
        now = time.time_ns() // 1_000_000
        plog.append(batch([(b"a", b"1")], now, producer=(5, 0, 0)))
        plog.append(batch([(b"a", b"2")], now))  # a plain producer supersedes producer 5's only record
        plog.roll()
        assert C.Cleaner(UNLIMITED).clean(plog).swapped
        headers = [parse_header(os.pread(fd, length, position))
                   for fd, position, length in plog.read(0, 1 << 20).ranges]
        first = headers[0]
        assert (first.producer_id, first.base_offset, first.record_count, first.last_offset_delta) == (5, 0, 0, 0)
        assert read_all(plog) == [(1, b"a", b"2")]


def test_list_offsets_by_timestamp_answers_the_records_a_cleaning_kept(tmp_path, table):
    """A cleaned batch keeps its base and last offsets, not every record between them: ListOffsets by timestamp
    and by max timestamp (KIP-734) answer a kept record's own offset, and the batch's max timestamp is its newest
    kept record's, as Kafka's cleaner writes it (tests/test_differential.py compares the first with Kafka)."""
    with open_log(tmp_path, table) as plog:
        now = time.time_ns() // 1_000_000
        plog.append(build_batch([(b"a", b"a0"), (b"b", b"b0"), (b"c", b"c0")], now,
                                timestamp_deltas=[0, 5000, 9000]))  # 0-2: keeps b0 alone
        plog.append(batch([(b"a", b"a1"), (b"c", b"c1")], now + 100))  # 3-4
        plog.roll()
        plog.append(batch([(b"d", b"d0")], now + 200))  # 5, the active segment
        assert C.Cleaner(UNLIMITED).clean(plog).swapped
        assert [offset for offset, _, _ in read_all(plog)] == [1, 3, 4, 5]
        fd, position, length = plog.read(0, 1 << 20).ranges[0]
        first = parse_header(os.pread(fd, length, position))
        assert (first.base_offset, first.last_offset, first.max_timestamp) == (0, 2, now + 5000)
        assert plog.offset_of_max_timestamp() == (1, now + 5000)
        assert plog.offset_for_timestamp(now + 1) == (1, now + 5000)
        assert plog.offset_for_timestamp(now + 5001) is None  # c0, at now + 9000, is gone


def test_keyless_records_are_refused_on_a_compacted_topic(tmp_path, table):
    with open_log(tmp_path, table) as plog:
        with pytest.raises(StorageError) as refused:
            plog.append(batch([(b"k", b"v"), (None, b"no key")], 0))
        assert refused.value.error_code == ErrorCode.INVALID_RECORD
        with pytest.raises(StorageError):
            plog.append(batch([(None, b"no key")], 0, GZIP))
        assert plog.state().log_end_offset == 0


def test_the_offset_map_bound_cleans_a_prefix_and_the_next_cleaning_the_rest(tmp_path, table):
    with open_log(tmp_path, table) as plog:
        now = time.time_ns() // 1_000_000
        for segment in range(4):  # 4 segments of 30 distinct keys each, twice
            for repeat in range(2):
                plog.append(batch([(b"s%d-%d" % (segment, k), b"v%d" % repeat) for k in range(30)], now))
            plog.roll()
        bases = segment_base_offsets(plog.directory)
        small = C.CleanerConfig(io_max_bytes_per_second=-1, dedupe_buffer_bytes=C.MAP_ENTRY_BYTES * 70)
        first = C.Cleaner(small).clean(plog)
        assert first.keys == 60 and first.cleaned_to == bases[2]
        second = C.Cleaner(small).clean(plog)
        assert second.first_dirty == first.cleaned_to and second.cleaned_to == plog.state().active_base_offset
        values = {key: value for _, key, value in read_all(plog)}
        assert len(values) == 120 and set(values.values()) == {b"v1"}


@pytest.mark.parametrize("crash_after", ["staging written", "manifest written", "log renamed", "swapped"])
def test_a_crash_during_the_swap_leaves_the_old_set_or_the_new_one(tmp_path, table, crash_after):
    now = time.time_ns() // 1_000_000
    with open_log(tmp_path, table) as plog:
        latest = write_updates(plog, rounds=4, keys=30, timestamp=now)
        plog.roll()
        before = read_all(plog)
        segments = [s for s in plog.segments[:-1]]
        staging = os.path.join(plog.directory, C.CLEANING_DIR)
        cleaner = C.Cleaner(UNLIMITED)
        # The cleaning's steps up to the swap, by hand, then a "crash": the process's state is dropped.
        os.mkdir(staging)
        result = C.CleanResult()
        dirty = C.dirtiness(plog, now)
        offset_map, cleaned_to = cleaner._build_map(plog, segments, dirty, result)
        groups = cleaner._rewrite(plog, segments, cleaned_to, offset_map, now, staging, result)
        assert groups
        if crash_after != "staging written":
            C.write_manifest(staging, groups)
        if crash_after == "log renamed":  # the first group's files in place, the replaced ones not yet unlinked
            for suffix in C.SEGMENT_SUFFIXES:
                name = f"{groups[0].base:020d}{suffix}"
                os.replace(os.path.join(staging, name), os.path.join(plog.directory, name))
        if crash_after == "swapped":
            C.finish_swap(plog.directory)
    with open_log(tmp_path, table) as plog:  # recovery
        assert not os.path.exists(os.path.join(plog.directory, C.CLEANING_DIR))
        if crash_after == "staging written":
            assert read_all(plog) == before
        else:
            check_latest(plog, latest, tombstones_kept=True)
        # A new cleaning finishes the job either way.
        C.Cleaner(UNLIMITED).clean(plog)
        check_latest(plog, latest, tombstones_kept=True)


def stage_cleaning(plog, now: int):
    """Roll, then write the cleaned replacements of the closed segments into the staging directory, unswapped."""
    plog.roll()
    staging = os.path.join(plog.directory, C.CLEANING_DIR)
    os.mkdir(staging)
    cleaner = C.Cleaner(UNLIMITED)
    segments = plog.segments[:-1]
    result = C.CleanResult()
    offset_map, cleaned_to = cleaner._build_map(plog, segments, C.dirtiness(plog, now), result)
    return staging, cleaner._rewrite(plog, segments, cleaned_to, offset_map, now, staging, result)


def test_a_cleaner_killed_in_a_committed_swap_is_finished_by_the_next_cleaning_not_undone(tmp_path, table):
    with open_log(tmp_path, table) as plog:
        now = time.time_ns() // 1_000_000
        latest = write_updates(plog, rounds=4, keys=30, timestamp=now)
        staging, groups = stage_cleaning(plog, now)
        C.write_manifest(staging, groups)
        for suffix in C.SEGMENT_SUFFIXES:  # killed half way through the renames
            name = f"{groups[0].base:020d}{suffix}"
            os.replace(os.path.join(staging, name), os.path.join(plog.directory, name))
        C.Cleaner(UNLIMITED).clean(plog)  # the node runs on: no recovery, the next cleaning comes
        check_latest(plog, latest, tombstones_kept=True)
        assert not os.path.exists(staging)


def test_a_swap_is_refused_when_retention_changed_the_segments_meanwhile(tmp_path, table):
    with open_log(tmp_path, table) as plog:
        now = time.time_ns() // 1_000_000
        write_updates(plog, rounds=4, keys=30, timestamp=now)
        staging, groups = stage_cleaning(plog, now)
        plog.delete_records_before(plog.segments[1].base_offset)  # the first segment goes meanwhile
        before = read_all(plog)
        assert plog.replace_segments(staging, groups) is False
        assert read_all(plog) == before


def test_key_hashes_tell_keys_apart_and_the_map_keeps_the_latest():
    rng = random.Random(7)
    keys = [b"", b"a", b"b", b"ab", b"ba", b"a" * 8, b"a" * 9, b"a" * 7 + b"b", b"\x00", b"\x00\x00"]
    keys += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))) for _ in range(2000)]
    keys = list(dict.fromkeys(keys))
    data = b"".join(keys)
    arena = np.frombuffer(data + bytes(16), dtype=np.uint8)
    lengths = np.array([len(k) for k in keys], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    h1, h2 = C.key_hashes(arena, starts, lengths)
    assert len(set(zip(h1.tolist(), h2.tolist()))) == len(keys)
    # The same key anywhere hashes the same.
    shifted = np.frombuffer(b"zz" + data + bytes(16), dtype=np.uint8)
    assert np.array_equal(C.key_hashes(shifted, starts + 2, lengths)[0], h1)
    offsets = np.arange(len(keys), dtype=np.int64)
    first = C.OffsetMap().merged(h1, h2, offsets)
    later = first.merged(h1[:5], h2[:5], offsets[:5] + 10_000)
    assert len(later) == len(keys)
    got = later.latest(h1, h2)
    assert got[:5].tolist() == (offsets[:5] + 10_000).tolist() and got[5:].tolist() == offsets[5:].tolist()
    assert later.latest(np.array([123], np.uint64), np.array([456], np.uint64)).tolist() == [-1]


def test_the_map_tells_apart_keys_that_share_their_first_hash():
    # Few first hashes, so most keys share one with others, their entries interleaved: the map keeps each
    # key's latest offset, as a dict does, through several merges.
    rng = np.random.default_rng(11)
    offset_map, expected, offset = C.OffsetMap(), {}, 0
    for _ in range(5):
        n = int(rng.integers(1, 400))
        h1 = rng.integers(0, 6, n).astype(np.uint64)
        h2 = rng.integers(0, 5, n).astype(np.uint64)
        offsets = np.arange(offset, offset + n, dtype=np.int64)
        offset += n
        offset_map = offset_map.merged(h1, h2, offsets)
        expected.update(zip(zip(h1.tolist(), h2.tolist()), offsets.tolist()))
        assert len(offset_map) == len(expected)
        probe1 = rng.integers(0, 7, 300).astype(np.uint64)
        probe2 = rng.integers(0, 6, 300).astype(np.uint64)
        assert offset_map.latest(probe1, probe2).tolist() == [
            expected.get(key, -1) for key in zip(probe1.tolist(), probe2.tolist())]


def test_the_io_limiter_holds_the_rate():
    clock = [0.0]
    slept = []
    limiter = C.IoLimiter(1000, window_s=0.1, clock=lambda: clock[0], sleep=lambda s: slept.append(s))
    for _ in range(10):
        limiter.spent(500)
    assert abs(sum(slept) - 5.0) < 0.2  # 5000 bytes at 1000 bytes/s, no time passing on their own
