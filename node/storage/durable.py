"""Small files of a partition's directory written durably, and the offsets kept in such files (the log start
DeleteRecords set, how far the cleaner cleaned); the lock of a small file's read-modify-write (the users, the ACLs).

Invariants: `write_durably` leaves the old file or the new one whole, never a mix, and the new one survives a
crash once it returns (temporary file, fsync, rename over the file, fsync of the directory); on a failure
(a full disk) the temporary file is removed, so it does not take the space of the next attempt. `read_offset` is 0 for a file that is missing or unreadable:
the segments then say what it would have.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Iterator


def write_durably(path: str, data: bytes, sync_directory: bool = True, mode: int = 0o644) -> None:
    """`data` in place of `path`'s content (a new file gets `mode`); without sync_directory a crash may leave the
    old file (for a file whose loss costs only time)."""
    temporary = f"{path}.tmp.{os.getpid()}"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    if sync_directory:
        fsync_directory(os.path.dirname(path))


@contextlib.contextmanager
def changing(path: str) -> Iterator[None]:
    """Held while `path` is read, changed and written back: an exclusive lock on `path`.lock (owner-only), which
    every process changing the file takes (its directory is made first)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_offset(path: str, offset: int) -> None:
    write_durably(path, f"{offset}\n".encode())


def read_offset(path: str) -> int:
    try:
        with open(path) as f:
            return max(0, int(f.read().strip()))
    except (OSError, ValueError):
        return 0
