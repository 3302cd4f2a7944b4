"""Producer id allocation for InitProducerId, unique across workers and across restarts.

Invariants:
- `<data_dir>/producer_ids` holds the next id to hand out, as decimal text; it only grows.
- Allocation holds an fcntl lock on that file (released if the holder dies), and the new value
  is fsync'd before the id is returned, so an id handed out is never handed out again, even
  after kill -9 of every process.
- Ids start at 1000, clear of the -1 "no producer" sentinel and of small hand-picked test ids.
"""

from __future__ import annotations

import fcntl
import os

FILE_NAME = "producer_ids"
FIRST_PRODUCER_ID = 1000


def allocate(data_dir: str) -> int:
    path = os.path.join(data_dir, FILE_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 32, 0).strip()
        next_id = int(raw) if raw.isdigit() else FIRST_PRODUCER_ID
        text = str(next_id + 1).encode().ljust(32)
        os.pwrite(fd, text, 0)
        os.fsync(fd)
        return next_id
    finally:
        os.close(fd)  # closing releases the lock
