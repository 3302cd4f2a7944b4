"""Run a real node for tests: `shmbroker serve` as a subprocess on a free loopback port with a
temporary data dir; stop it with real signals, by pid; check it left nothing behind."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import psutil

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def api_versions_roundtrip(port: int, timeout: float = 2.0) -> bool:
    """True when the node answers an ApiVersions v0 request on `port`."""
    request = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            header = sock.recv(8)
            return len(header) == 8 and struct.unpack(">ii", header)[1] == 1
    except OSError:
        return False


class NodeProcess:
    def __init__(self, tmp_path: Path, workers: int = 1, config: str = "", port: int | None = None,
                 data_dir: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.tmp_path = tmp_path
        self.workers = workers
        self.port = port or free_port()
        self.data_dir = data_dir or tmp_path / "data"
        self.config_path = tmp_path / "node.toml"
        self.config_path.write_text(config)
        self.log_path = tmp_path / f"node-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.env = env

    @property
    def instance(self) -> str:
        from shm.instance import instance_id_for
        return instance_id_for(str(self.data_dir), self.port)

    def leftovers(self) -> list[str]:
        return shm_leftovers(self.instance)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "NodeProcess":
        args = [sys.executable, "-m", "node.cli", "serve", "--config", str(self.config_path),
                "--listen", self.bootstrap, "--data-dir", str(self.data_dir), "--workers", str(self.workers)]
        log = open(self.log_path, "ab")
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent,
                                     env=env)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}:\n{self.log()}")
            if api_versions_roundtrip(self.port, timeout=0.5):
                return self
            time.sleep(0.05)
        self.kill_all()
        raise RuntimeError(f"node did not answer in {START_TIMEOUT_S}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except OSError:
            return ""

    def children(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def pids(self, role: str) -> list[int]:
        """Pids of children by role: 'worker' or 'timer'."""
        module = "workers.worker" if role == "worker" else "node.timer.process"
        found = []
        for child in self.children():
            try:
                if module in child.cmdline():
                    found.append(child.pid)
            except psutil.NoSuchProcess:
                pass
        return found

    def wait_for_pids(self, role: str, count: int, exclude: set[int] = frozenset(), timeout: float = 20.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = [p for p in self.pids(role) if p not in exclude]
            if len(pids) >= count:
                return pids
            time.sleep(0.05)
        raise AssertionError(f"no {count} {role} processes in {timeout}s:\n{self.log()}")

    def stop(self) -> int:
        """SIGTERM and wait: the clean shutdown path. Returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise AssertionError(f"node did not stop in {STOP_TIMEOUT_S}s:\n{self.log()}")

    def kill_all(self) -> None:
        """kill -9 the supervisor and every child, by pid."""
        if self.proc is None:
            return
        victims = self.children()
        for pid in [self.proc.pid] + [c.pid for c in victims]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        psutil.wait_procs(victims, timeout=STOP_TIMEOUT_S)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def shm_leftovers(instance: str = "") -> list[str]:
    """Names in /dev/shm of one node instance (or of every shmbroker instance)."""
    stem = f"shmbroker-{instance}"
    try:
        return sorted(name for name in os.listdir("/dev/shm") if stem in name)
    except FileNotFoundError:
        return []
