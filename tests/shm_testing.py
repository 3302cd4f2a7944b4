"""Helpers shared by the shm tests: unique instances that leave nothing behind, peer processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

from shmbroker.shm.instance import Instance, list_objects, remove_leftovers

PEER = str(Path(__file__).resolve().parent / "ring_peer.py")
PEER_TIMEOUT_S = 60


def unique_instance_id(tag: str = "t") -> str:
    return f"{tag}{os.getpid()}_{uuid.uuid4().hex[:10]}"


@contextmanager
def fresh_instance(tag: str = "t"):
    """An Instance under a unique id; on exit everything of it is unlinked and checked gone."""
    instance = Instance.start(unique_instance_id(tag))
    try:
        yield instance
    finally:
        instance.shutdown()
        assert list_objects(instance.instance_id) == ([], [])


class Peer:
    """A peer process (tests/ring_peer.py) that is always stopped by pid."""

    def __init__(self, *args, pass_fds=()) -> None:
        self.proc = subprocess.Popen([sys.executable, PEER, *map(str, args)], stdout=subprocess.PIPE,
                                     text=True, pass_fds=pass_fds)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def expect_line(self, prefix: str) -> str:
        line = self.proc.stdout.readline()  # the peer prints within seconds or dies (EOF)
        assert line.startswith(prefix), f"peer said {line!r}, expected {prefix!r}"
        return line

    def kill9(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(PEER_TIMEOUT_S)

    def wait_ok(self, timeout: float = PEER_TIMEOUT_S) -> None:
        assert self.proc.wait(timeout) == 0

    def close(self) -> None:
        self.kill9()
        self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cleanup_instance(instance_id: str) -> None:
    """Remove what a killed peer left of its instance (used in finally blocks)."""
    remove_leftovers(instance_id)
