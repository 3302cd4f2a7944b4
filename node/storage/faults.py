"""Storage faults: the disk errors a node must live through (a full disk, a failing one), told apart from
bugs, and turned into Kafka's KAFKA_STORAGE_ERROR (56) for the request that met them.

One piece for every writer of the data directory: appends, the group-commit fsync, producer snapshots,
retention, recovery, the topic catalog, producer ids, and the offsets log of consumer groups:

    try:
        ...write or fsync...
    except OSError as exc:
        raise storage_fault(exc, "append to t-0") from None   # StorageError(56) if a disk fault, else exc

or `with storage_faults("save of the catalog"): ...` where there is nothing else to do on the way out.

Invariants:
- A disk fault is an OSError whose errno says the storage cannot take the write, now or at all
  (FAULT_ERRNOS: no space, over quota, I/O error, read-only file system, file too large, device gone).
  Any other exception is a bug and passes through untouched (it keeps its traceback).
- Nothing here logs or retries. The caller decides how often to log (a partition logs through its table
  row: one line per partition per interval across the node, see PartitionLog), and a write that failed is
  simply tried again by the next request that needs it: appends resume by themselves once the storage
  takes writes again.
- Writes that must never fault in the middle of a memory store (index entries through a shared mapping:
  a write fault there is SIGBUS, not an error) reserve their blocks first with `reserve` (fallocate),
  which faults cleanly instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Iterator

from shmbroker.node.storage.records import ErrorCode, StorageError

FAULT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG, errno.ENXIO,
                          errno.ENODEV})


def is_storage_fault(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FAULT_ERRNOS


def storage_fault(exc: BaseException, what: str) -> BaseException:
    """The StorageError(KAFKA_STORAGE_ERROR) to raise for a disk fault during `what`; other errors as they are."""
    if not is_storage_fault(exc):
        return exc
    assert isinstance(exc, OSError)
    error = StorageError(ErrorCode.KAFKA_STORAGE_ERROR, f"{what} failed: {exc.strerror or exc}")
    error.errno = exc.errno
    return error


@contextlib.contextmanager
def storage_faults(what: str) -> Iterator[None]:
    """Run the block; a disk fault in it comes out as StorageError(KAFKA_STORAGE_ERROR)."""
    try:
        yield
    except OSError as exc:
        error = storage_fault(exc, what)
        if error is exc:
            raise
        raise error from None


def reserve(path: str, offset: int, length: int) -> None:
    """Allocate the blocks of `path` in [offset, offset + length) (OSError ENOSPC if there is no room), so
    later stores into a shared mapping of that range cannot fault."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.posix_fallocate(fd, offset, length)
    finally:
        os.close(fd)
