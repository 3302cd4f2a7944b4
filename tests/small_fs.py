"""Small real filesystems for disk-full tests: a tmpfs of a given size, and an ext4 image on a loop device
whose backing file lives on a small tmpfs (the thin-provisioned disk: writes land in the page cache, then
fsync fails with EIO once the backing store is full). Mounting needs root; the tests skip without it.

Everything mounted here is unmounted (and the loop device detached) on the way out, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

MiB = 1 << 20


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout.strip()


def require_mounting() -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")


def _unmount(path: Path) -> None:
    for _ in range(50):
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=60).returncode == 0:
            return
        subprocess.run(["sync"], timeout=60)
    _run("umount", "-l", str(path))  # still busy after every retry: detach it, it goes when unused


@contextlib.contextmanager
def tmpfs(path: Path, size_bytes: int, inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of `size_bytes` (and at most `inodes` files and directories) mounted at `path` (created)."""
    require_mounting()
    path.mkdir(parents=True, exist_ok=True)
    limit = f",nr_inodes={inodes}" if inodes else ""
    _run("mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755{limit}", "tmpfs", str(path))
    try:
        yield path
    finally:
        _unmount(path)


@contextlib.contextmanager
def ext4_on_thin_storage(path: Path, fs_bytes: int, backing_bytes: int) -> Iterator[Path]:
    """ext4 of `fs_bytes` at `path`, stored in a sparse image on a tmpfs of only `backing_bytes`: ext4 accepts
    writes until the backing store is full, then its writeback (and fsync) fails with EIO."""
    require_mounting()
    if not (shutil.which("losetup") and shutil.which("mkfs.ext4")) or not os.path.exists("/dev/loop-control"):
        pytest.skip("needs loop devices (losetup) and mkfs.ext4")
    backing = path.with_name(path.name + "-backing")
    with tmpfs(backing, backing_bytes):
        image = backing / "disk.img"
        with open(image, "wb") as file:
            file.truncate(fs_bytes)
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image))
        device = _run("losetup", "--find", "--show", str(image))
        try:
            path.mkdir(parents=True, exist_ok=True)
            _run("mount", "-t", "ext4", "-o", "errors=continue", device, str(path))
            try:
                yield path
            finally:
                _unmount(path)
        finally:
            subprocess.run(["losetup", "-d", device], capture_output=True, timeout=60)


def fill(directory: Path, name: str = "filler", chunk_bytes: int = 64 * 1024) -> Path:
    """Write a file until the filesystem is full; returns it (delete it to free the space)."""
    path = directory / name
    chunk = b"\xa5" * chunk_bytes
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError:
                if chunk_bytes <= 512:
                    break
                chunk_bytes //= 8
                chunk = chunk[:chunk_bytes]
    finally:
        os.close(fd)
    return path


def ballast(directory: Path, name: str, size_bytes: int) -> Path:
    """A file of `size_bytes` (really allocated): delete it later to give that space back."""
    path = directory / name
    with open(path, "wb") as file:
        file.write(b"\x5a" * size_bytes)
    return path
