"""The shared segments' header: a segment is attached only as what it was created as, of this layout version."""

from __future__ import annotations

import os

import posix_ipc
import pytest

from shmbroker.shm.segment import HEADER_BYTES, Layout, Segment, unlink_segment
from tests.record_batches import unique_shm_name

ROW_BYTES = 16
LAYOUT = Layout("a test table", magic=0x5453_4554, version=2, sizes=("rows", "row_bytes"),
                fixed={"row_bytes": ROW_BYTES}, bytes_for=lambda rows, row_bytes: HEADER_BYTES + rows * row_bytes)


def test_attach_sees_the_sizes_it_was_created_with():
    name = unique_shm_name("segment")
    created = Segment.create(name, LAYOUT, rows=3)
    try:
        assert created.sizes == {"rows": 3, "row_bytes": ROW_BYTES} and len(created.memory) == HEADER_BYTES + 48
        created.memory[HEADER_BYTES] = 7
        attached = Segment.attach(name, LAYOUT, writable=False)
        assert attached.sizes == created.sizes and attached.memory[HEADER_BYTES] == 7
        attached.close()
        with pytest.raises(posix_ipc.ExistentialError):
            Segment.create(name, LAYOUT, rows=3)
    finally:
        created.close()
        created.unlink()
    assert not unlink_segment(name) and name[1:] not in os.listdir("/dev/shm")


@pytest.mark.parametrize("other", [
    Layout("another table", magic=0x5453_4555, version=2, sizes=LAYOUT.sizes, bytes_for=LAYOUT.bytes_for),
    Layout("a newer table", magic=LAYOUT.magic, version=3, sizes=LAYOUT.sizes, bytes_for=LAYOUT.bytes_for),
    Layout("wider rows", magic=LAYOUT.magic, version=2, sizes=LAYOUT.sizes, fixed={"row_bytes": 32},
           bytes_for=LAYOUT.bytes_for),
    Layout("a larger table", magic=LAYOUT.magic, version=2, sizes=LAYOUT.sizes,
           bytes_for=lambda rows, row_bytes: LAYOUT.bytes_for(rows + 1, row_bytes)),
])
def test_attach_refuses_another_layout(other):
    name = unique_shm_name("segment")
    created = Segment.create(name, LAYOUT, rows=3)
    try:
        with pytest.raises(ValueError, match="is not"):
            Segment.attach(name, other)
    finally:
        created.close()
        created.unlink()
