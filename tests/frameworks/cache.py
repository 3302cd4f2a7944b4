"""Where the framework tests' installs live: outside the checkout (SHMBROKER_FRAMEWORKS_CACHE, default
~/.cache/shmbroker/frameworks), one directory per framework and exact spec, so a fresh clone on a machine that ran
the tests before reuses them, as it reuses Kafka's jars and librdkafka's build. A directory is complete when its
stamp file names its spec; one install at a time per directory (a lock file): tests side by side and other
checkouts wait for it and take its result."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

CACHE = Path(os.environ.get("SHMBROKER_FRAMEWORKS_CACHE", Path.home() / ".cache" / "shmbroker" / "frameworks"))
STAMP = ".installed"


@contextlib.contextmanager
def install_home(name: str, spec: str) -> Iterator[Path]:
    """The directory of `name` installed from `spec` (whatever names what is installed: a requirement and the
    interpreter, an npm package), held under its lock while the caller checks or makes it."""
    home = CACHE / f"{name}-{hashlib.sha256(spec.encode()).hexdigest()[:16]}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield home


def installed(home: Path, spec: str) -> bool:
    stamp = home / STAMP
    return stamp.exists() and stamp.read_text() == spec


def mark_installed(home: Path, spec: str) -> None:
    (home / STAMP).write_text(spec)
