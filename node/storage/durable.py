"""Small files of a partition's directory written durably, and the offsets kept in such files (the log start
DeleteRecords set, how far the cleaner cleaned).

Invariants: `write_durably` leaves the old file or the new one whole, never a mix, and the new one survives a
crash once it returns (temporary file, fsync, rename over the file, fsync of the directory); on a failure
(a full disk) the temporary file is removed, so it does not take the space of the next attempt. `read_offset` is 0 for a file that is missing or unreadable:
the segments then say what it would have.
"""

from __future__ import annotations

import os


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
