"""Record batch v2 layout and the produce-time validator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmbroker.node.storage.records import (BATCH_HEADER_DTYPE, BATCH_HEADER_SIZE, INT32_MAX, ErrorCode, StorageError,
                                            build_batch, iter_batches, iter_records, last_sequence, parse_header,
                                            record_timestamps, stored_batch_is_valid, set_producer, uncompressed,
                                            validate_client_batch)
from tests.record_batches import GZIP, edit, make_batch, opaque_compressed_batch

MAX = 1 << 20


def error_code(batch, max_bytes=MAX) -> int:
    with pytest.raises(StorageError) as caught:
        validate_client_batch(batch, max_bytes)
    return caught.value.error_code


ORACLE_RECORDS = [(b"k0", b"v0"), (None, b"v1"), (b"k2", None), (b"", b"x" * 300)]
ORACLE_HEADERS = [[("h", b"1")], [], [("a", None), ("b", b"")], [("long", b"y" * 200)]]
ORACLE_DELTAS = [0, 5, 2, 9]


def kafka_python_batch(producer=(-1, -1, -1), codec=0) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, codec, 0, *producer, 1 << 30)
    for delta, ((key, value), headers, timestamp_delta) in enumerate(zip(ORACLE_RECORDS, ORACLE_HEADERS, ORACLE_DELTAS)):
        builder.append(delta, 1000 + timestamp_delta, key, value, headers)
    return bytes(builder.build())


def records_area(batch: bytes) -> bytes:
    return bytes(uncompressed(batch, parse_header(batch))[0][BATCH_HEADER_SIZE:])


@pytest.mark.parametrize("producer", [(-1, -1, -1), (7, 2, 10)])
def test_the_builder_writes_what_kafka_python_writes(producer):
    """kafka-python's builder is the independent oracle of build_batch, and so of every batch the tests build
    with it: null keys and values, headers, timestamps and producer fields, byte for byte."""
    ours = build_batch(ORACLE_RECORDS, 1000, timestamp_deltas=ORACLE_DELTAS, headers=ORACLE_HEADERS,
                       producer_id=producer[0], producer_epoch=producer[1], base_sequence=producer[2])
    assert ours == kafka_python_batch(producer)


def test_a_compressed_batch_is_the_uncompressed_one_compressed():
    """gzip output differs between libraries, so the oracle compares what both decompress to."""
    ours = build_batch(ORACLE_RECORDS, 1000, timestamp_deltas=ORACLE_DELTAS, headers=ORACLE_HEADERS, compression=GZIP)
    theirs = kafka_python_batch(codec=GZIP)
    assert parse_header(ours).compression == parse_header(theirs).compression == GZIP
    assert records_area(ours) == records_area(theirs) == kafka_python_batch()[BATCH_HEADER_SIZE:]


def test_a_producer_stamp_keeps_the_batch_valid():
    batch = bytearray(build_batch([(None, b"a"), (None, b"b")], 1000))
    set_producer(batch, 9, 1, 40)
    header = validate_client_batch(batch, MAX)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9, 1, 40)


def test_iter_batches_yields_the_whole_batches_of_a_record_set():
    first, second = make_batch(count=2), edit(make_batch(count=3), 0, ">q", 2)
    record_set = first + second + make_batch(count=4)[:-1]
    assert [(position, header.base_offset, header.record_count) for position, header in iter_batches(record_set)] \
        == [(0, 0, 2), (len(first), 2, 3)]
    assert list(iter_batches(edit(first, 8, ">i", 10))) == []  # a length too short for a header
    assert list(iter_batches(b"")) == []


def test_valid_batch_header_matches_builder():
    batch = make_batch(count=4, timestamp=5000, producer_id=7, epoch=2, sequence=10)
    header = validate_client_batch(batch, MAX)
    assert (header.base_offset, header.magic, header.record_count, header.last_offset_delta) == (0, 2, 4, 3)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 10)
    assert header.last_sequence == 13 and header.size == len(batch)
    assert (header.base_timestamp, header.max_timestamp) == (5000, 5003)
    numpy_header = np.frombuffer(batch, dtype=BATCH_HEADER_DTYPE, count=1)[0]
    assert numpy_header["record_count"] == 4 and numpy_header["crc"] == header.crc


def test_memoryview_input_is_accepted():
    batch = make_batch()
    assert validate_client_batch(memoryview(bytearray(batch)), MAX).record_count == 3


@pytest.mark.parametrize("codec", [2, 3, 4])
def test_compressed_batches_pass_without_decompression(codec):
    assert validate_client_batch(opaque_compressed_batch(codec), MAX).compression == codec


def test_gzip_batch_passes():
    assert validate_client_batch(make_batch(count=20, compression=GZIP), MAX).compression == GZIP


def test_rejections_carry_kafka_error_codes():
    good = make_batch(count=3)
    assert error_code(good[:40]) == ErrorCode.CORRUPT_MESSAGE  # shorter than a header
    assert error_code(good[:-1]) == ErrorCode.CORRUPT_MESSAGE  # truncated
    assert error_code(good + good) == ErrorCode.INVALID_RECORD  # two batches
    assert error_code(good, max_bytes=len(good) - 1) == ErrorCode.MESSAGE_TOO_LARGE
    assert error_code(edit(good, 16, ">b", 1, fix_crc=False)) == ErrorCode.INVALID_RECORD  # magic 1
    assert error_code(edit(good, 16, ">b", 3, fix_crc=False)) == ErrorCode.CORRUPT_MESSAGE  # unknown magic
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF
    assert error_code(bytes(flipped)) == ErrorCode.CORRUPT_MESSAGE  # CRC mismatch
    assert error_code(edit(good, 0, ">q", 5)) == ErrorCode.INVALID_RECORD  # base offset not 0
    assert error_code(edit(good, 23, ">i", 5)) == ErrorCode.INVALID_RECORD  # lastOffsetDelta + 1 != count
    assert error_code(edit(edit(good, 57, ">i", 0), 23, ">i", -1)) == ErrorCode.INVALID_RECORD  # zero records
    assert error_code(edit(good, 21, ">h", 7)) == ErrorCode.CORRUPT_MESSAGE  # codec 7
    assert error_code(edit(good, 21, ">h", 0x20)) == ErrorCode.INVALID_RECORD  # control batch
    assert error_code(edit(good, 21, ">h", 0x10)) == ErrorCode.INVALID_RECORD  # transactional
    assert error_code(edit(edit(good, 43, ">q", 9), 51, ">h", 0)) == ErrorCode.INVALID_RECORD  # pid, no seq
    many = edit(edit(good, 57, ">i", 1000), 23, ">i", 999)
    assert error_code(many) == ErrorCode.CORRUPT_MESSAGE  # more records than bytes allow


def test_sequence_wraps_like_kafka():
    assert last_sequence(0, 4) == 4
    assert last_sequence(INT32_MAX, 0) == INT32_MAX
    assert last_sequence(INT32_MAX, 1) == 0
    assert last_sequence(INT32_MAX - 1, 3) == 1
    assert last_sequence(-1, 3) == -1


def test_stored_batch_check_uses_expected_offset_and_crc():
    batch = edit(make_batch(), 0, ">q", 42, fix_crc=False)  # the CRC does not cover baseOffset
    assert stored_batch_is_valid(batch, 42)
    assert not stored_batch_is_valid(batch, 41)
    assert not stored_batch_is_valid(batch[:-3], 42)


def test_record_timestamps_of_uncompressed_batch():
    batch = make_batch(count=5, timestamp=10_000)
    assert record_timestamps(batch, parse_header(batch)) == [10_000, 10_001, 10_002, 10_003, 10_004]
    gzipped = make_batch(count=5, compression=GZIP)
    assert record_timestamps(gzipped, parse_header(gzipped)) is None


def _validate_never_crashes(data: bytes):
    try:
        header = validate_client_batch(data, 4096)
    except StorageError as error:
        assert error.error_code in {2, 10, 43, 87}
    else:
        assert header.size == len(data) and header.record_count > 0


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data):
    _validate_never_crashes(data)


@settings(max_examples=400, deadline=None, database=None)
@given(st.integers(0, 400), st.binary(min_size=1, max_size=8), st.booleans(), st.integers(0, 500))
def test_fuzz_mutated_real_batches(position, patch, fix_crc, cut):
    from tests.record_batches import recrc

    batch = bytearray(make_batch(count=3, timestamp=1000))
    position %= len(batch)
    batch[position : position + len(patch)] = patch
    data = bytes(batch[: max(0, len(batch) - cut % 50)])
    if fix_crc and len(data) > 21:
        data = recrc(data)
    _validate_never_crashes(data)
    if len(data) >= 61:
        stored_batch_is_valid(data, 0)  # must not raise either
        header = parse_header(data)
        record_timestamps(data, header)


@pytest.mark.parametrize("log_append_time", [True, False])
def test_a_record_count_the_bytes_cannot_hold_sizes_no_work(log_append_time):
    """A header claiming 2**31 - 1 records in a 3-record batch (as the fuzz tests make, with the CRC fixed)
    must not build a list of that many timestamps: found when such a batch took 23 GB in a CI run."""
    import struct

    from tests.record_batches import recrc

    batch = bytearray(make_batch(count=3, timestamp=1000))
    huge = 2**31 - 1
    struct.pack_into(">h", batch, 21, struct.unpack_from(">h", batch, 21)[0] | (0x08 if log_append_time else 0))
    struct.pack_into(">i", batch, 23, huge - 1)  # lastOffsetDelta
    struct.pack_into(">i", batch, 57, huge)  # recordCount
    data = recrc(bytes(batch))
    header = parse_header(data)
    assert header.record_count == huge
    assert record_timestamps(data, header) is None
    with pytest.raises(StorageError) as caught:
        list(iter_records(data, header))
    assert caught.value.error_code == ErrorCode.CORRUPT_MESSAGE
    with pytest.raises(StorageError) as caught:
        validate_client_batch(data, 1 << 20)
    assert caught.value.error_code == ErrorCode.CORRUPT_MESSAGE
