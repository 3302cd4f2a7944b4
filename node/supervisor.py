"""The supervisor: `shmbroker serve`. Owns the node's shared resources and its child processes.

Invariants:
- Exactly one supervisor per data directory: it holds an fcntl lock on `<data_dir>/.lock`.
- Before any child starts, the supervisor has removed the shared memory left by a crashed run of
  the same instance, recovered every partition log and filled the shared partition table.
- Children: one timer process and N network workers. Any child that dies is restarted, with a
  backoff that doubles per quick death and resets after a child has lived long enough.
- A child dies with the supervisor (PR_SET_PDEATHSIG), so kill -9 of the supervisor never leaves
  orphans holding the port or the rings.
- SIGTERM / SIGINT: workers stop accepting and finish in-flight responses within the grace period,
  then the timer stops, then every partition is fsync'd, shared memory is unlinked, exit 0.
- Signals are handled synchronously (blocked, then sigtimedwait), so no handler ever runs in the
  middle of the supervisor's own bookkeeping.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from node import sdnotify
from node.config import NodeConfig
from node.resources import NodeResources, instance_id_for

log = logging.getLogger("shmbroker.supervisor")

_HANDLED = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP}


@dataclass
class Child:
    role: str  # "timer" or "worker"
    index: int
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    backoff_ms: int = 0
    restart_at: float = 0.0
    restarts: int = 0


class Supervisor:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.data_dir = os.path.abspath(config.server.data_dir)
        self.instance = instance_id_for(self.data_dir, config.server.port)
        self.children: list[Child] = []
        self.stopping = False
        self._lock_fd: int | None = None
        self.listeners: list[socket.socket] = []
        self.resources: NodeResources | None = None

    # -- start ---------------------------------------------------------------------------

    def _lock_data_dir(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        fd = os.open(os.path.join(self.data_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise SystemExit(f"shmbroker: {self.data_dir} is in use by another node")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _listen(self, count: int) -> list[socket.socket]:
        """One listening socket per worker in one SO_REUSEPORT group: the kernel spreads new
        connections over the workers (one shared socket would let whichever worker wakes first
        take them all). The supervisor keeps them open, so connections waiting in a dead worker's
        backlog are accepted by its replacement, not reset."""
        server = self.config.server
        # SO_REUSEPORT would let a second node on the same port join our group and take half the
        # connections: a plain bind first fails with EADDRINUSE if anyone holds the port.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((server.host, server.port))
        sockets = []
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((server.host, server.port))
            sock.listen(server.listen_backlog)
            sock.setblocking(False)
            sock.set_inheritable(True)
            sockets.append(sock)
        return sockets

    def _spawn(self, child: Child) -> None:
        assert self.resources is not None
        module = "node.timer.process" if child.role == "timer" else "workers.worker"
        extra_args, fds = self.resources.child_args(child.role, child.index)
        args = [sys.executable, "-m", module,
                "--instance", self.instance,
                "--index", str(child.index),
                "--config-json", self.config.to_json().decode(),
                "--supervisor-pid", str(os.getpid())] + extra_args
        if child.role == "worker":
            listen_fd = self.listeners[child.index].fileno()
            args += ["--listen-fd", str(listen_fd)]
            fds = fds + [listen_fd]
        # Children must not inherit our blocked signal mask.
        child.process = subprocess.Popen(args, pass_fds=fds, close_fds=True,
                                         preexec_fn=_child_setup, cwd=os.getcwd())
        child.started_at = time.monotonic()
        log.info("started %s %d as pid %d", child.role, child.index, child.process.pid)

    def start(self) -> None:
        self._lock_data_dir()
        workers = self.config.server.worker_count()
        self.listeners = self._listen(workers)  # first: a taken port fails before anything is created
        self.resources = NodeResources.create(self.instance, self.config, self.data_dir)
        self.children = [Child("timer", 0)] + [Child("worker", i) for i in range(workers)]
        for child in self.children:
            self._spawn(child)

    # -- run -----------------------------------------------------------------------------

    def run(self) -> int:
        signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        try:
            try:
                self.start()
            except OSError as exc:
                log.error("cannot start on %s:%d: %s", self.config.server.host, self.config.server.port, exc)
                return 1
            sdnotify.notify(f"READY=1\nSTATUS=serving on {self.config.server.host}:{self.config.server.port}\nMAINPID={os.getpid()}")
            log.info("serving on %s:%d (instance %s, data %s)", self.config.server.host,
                     self.config.server.port, self.instance, self.data_dir)
            while not self.stopping:
                timeout = self._next_restart_delay()
                info = signal.sigtimedwait(_HANDLED, timeout)
                if info is not None and info.si_signo in (signal.SIGTERM, signal.SIGINT):
                    log.info("signal %d: stopping", info.si_signo)
                    self.stopping = True
                    break
                self._reap_and_restart()
            self.stop()
            return 0
        finally:
            self._release()

    def _next_restart_delay(self) -> float:
        now = time.monotonic()
        pending = [c.restart_at - now for c in self.children if c.process is None]
        # Poll at least once a second: a SIGCHLD can be merged with another one.
        return max(0.0, min(pending + [1.0]))

    def _reap_and_restart(self) -> None:
        server = self.config.server
        now = time.monotonic()
        for child in self.children:
            if child.process is not None and child.process.poll() is not None:
                lived_ms = (now - child.started_at) * 1000
                if lived_ms >= server.restart_backoff_reset_ms:
                    child.backoff_ms = 0
                child.backoff_ms = min(max(child.backoff_ms * 2, server.restart_backoff_min_ms),
                                       server.restart_backoff_max_ms)
                log.warning("%s %d (pid %d) exited with %s; restarting in %d ms", child.role, child.index,
                            child.process.pid, child.process.returncode, child.backoff_ms)
                child.process = None
                child.restart_at = now + child.backoff_ms / 1000
            if child.process is None and now >= child.restart_at:
                child.restarts += 1
                self._spawn(child)

    # -- stop ----------------------------------------------------------------------------

    def _terminate(self, children: list[Child], grace_s: float) -> None:
        for child in children:
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in children:
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s %d did not stop in time: killing", child.role, child.index)
                child.process.kill()
                child.process.wait()

    def stop(self) -> None:
        sdnotify.notify("STOPPING=1")
        grace_s = self.config.server.shutdown_grace_ms / 1000
        for listener in self.listeners:
            listener.close()
        self._terminate([c for c in self.children if c.role == "worker"], grace_s)
        self._terminate([c for c in self.children if c.role == "timer"], grace_s)
        if self.resources is not None:
            self.resources.flush_all()
        log.info("stopped")

    def _release(self) -> None:
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                child.process.kill()
                child.process.wait()
        if self.resources is not None:
            self.resources.unlink()
            self.resources = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


_PR_SET_PDEATHSIG = 1


def _child_setup() -> None:
    """Runs in the child before exec: our blocked signals are not the child's; and a child must
    not outlive a supervisor killed with -9 (it would hold the port and the rings)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def serve(config: NodeConfig) -> int:
    return Supervisor(config).run()
