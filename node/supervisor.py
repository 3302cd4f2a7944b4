"""The supervisor: `shmbroker serve`. Owns the node's shared resources and its child processes.

A loop of signals, as gunicorn's arbiter: wait for a signal (or the next restart due), run its
`handle_<signal>` method, reap children that exited, spawn those whose restart is due.

Invariants:
- Exactly one supervisor per data directory: it holds an fcntl lock on `<data_dir>/.lock`.
- Before any child starts, the supervisor has removed the shared memory left by a crashed run of
  the same instance, recovered every partition log and filled the shared partition table.
- Children are data (`ChildSpec`: role, module, arguments, inherited fds, rows): one timer process, the
  log cleaners (node.cleaner, `cleaner.processes`) and N network workers. Each is forked from the supervisor,
  which imported the children's modules once before the first: a child runs its module's main(argv) at once,
  with only its own fds open, as after an exec, and ends with os._exit. Any child that dies is restarted,
  with a backoff that doubles per quick death and resets after a child has lived long enough.
- A child that cannot boot (exits within `child_boot_window_ms` of its start `child_boot_failures_max`
  times in a row) stops the node with one log line and exit code 1, instead of restarting forever.
- A hung child (its heartbeat in shared memory has not moved for `child_hang_timeout_ms`, or for
  `child_start_timeout_ms` before its loop first turned: shm.heartbeat) is logged, killed with SIGKILL and
  restarted like any child that died. The supervisor looks every `heartbeat_interval_ms`. It kills one hung
  child per two heartbeat intervals, the timer and the cleaners before workers: a child held up on a
  partition lock the hung one holds goes on once that one is killed, and is not taken for hung itself.
- A child dies with the supervisor (PR_SET_PDEATHSIG), so kill -9 of the supervisor never leaves
  orphans holding the port or the rings.
- Children ignore SIGINT: a Ctrl-C in a terminal reaches the whole process group, and the stop order is
  the supervisor's.
- SIGTERM / SIGINT: workers stop accepting and finish in-flight responses within the grace period,
  then the timer stops, then every partition is fsync'd, shared memory is unlinked, exit 0.
- SIGHUP: the config file is read again; if valid, its reloadable sections (node.config.RELOADABLE) replace
  the running ones in the children's config file and the children get SIGHUP to re-read it; an invalid file
  changes nothing (one error line naming the file, key and reason).
- Signals are handled synchronously (blocked, then sigtimedwait), so no handler ever runs in the
  middle of the supervisor's own bookkeeping.
- The port accepts connections only once a worker's loop runs: the supervisor binds the listening sockets, each
  worker puts its own to listen as its loop starts. `serving on` is logged with READY=1.
- systemd (node.sdnotify): STATUS= lines while recovering and starting; READY=1 only once every child's loop
  has turned (its first heartbeat, shm.heartbeat), so the port is served, not only bound; RELOADING=1 then
  READY=1 around a SIGHUP; STOPPING=1 first thing on shutdown. Under WatchdogSec= (WATCHDOG_USEC) it sends
  WATCHDOG=1 every half of it, but only while every child runs and its loop turns (HangWatch): a hung child
  (SIGSTOP, a deadlock) stops the pings and systemd restarts the service.
- Its own row of the stats segment (shm.stats, row 0): restarts and children alive; each child's row and
  heartbeat slot is zeroed before the child starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import gc
import importlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Protocol

from shmbroker.node import config as node_config
from shmbroker.node import sdnotify
from shmbroker.node.child import GarbageCollectorStats
from shmbroker.node.config import NodeConfig
from shmbroker.node.proctitle import set_title
from shmbroker.node.resources import NodeResources
from shmbroker.node.storage import formats
from shmbroker.shm import stats as S
from shmbroker.shm.heartbeat import TIMER_SLOT, HangWatch, cleaner_slot, worker_slot
from shmbroker.shm import instance as shm_instance
from shmbroker.shm.instance import instance_id_for

log = logging.getLogger("shmbroker.supervisor")

SIGNALS = {
    signal.SIGTERM: "handle_term",
    signal.SIGINT: "handle_int",
    signal.SIGCHLD: "handle_chld",
    signal.SIGHUP: "handle_hup",
}
EXIT_CHILD_CANNOT_BOOT = 1
EXIT_IN_USE = 4  # the port or the data directory is taken (node.tools.cli's exit codes)
EXIT_NEWER_FORMAT = 5  # the data directory was written by a newer node (node.storage.formats)


@dataclass(frozen=True)
class ChildSpec:
    """What a child is: its role, the module it runs, its own arguments, the fds it inherits, and its rows in
    the heartbeat table and the stats segment."""

    role: str  # "timer", "worker" or "cleaner"
    index: int
    module: str
    args: tuple[str, ...]
    fds: tuple[int, ...]
    slot: int
    stats_row: int

    @property
    def name(self) -> str:
        return f"{self.role} {self.index}"


@dataclass
class Child:
    spec: ChildSpec
    process: ForkedChild | None = None
    started_at: float = 0.0
    backoff_ms: int = 0
    restart_at: float = 0.0
    restarts: int = 0
    boot_failures: int = 0  # exits in a row within child_boot_window_ms of starting


class Endpoint(Protocol):
    """What the supervisor serves beside the node, given by its caller (node.tools.metrics.MetricsEndpoint):
    started once the node's shared memory exists; stopped at the end, also when it did not start."""

    host: str
    port: int

    def start(self, data_dir: str) -> None: ...  # OSError: it cannot listen

    def stop(self) -> None: ...


class ChildCannotBoot(Exception):
    pass


class DataDirInUse(Exception):
    pass


class Supervisor:
    def __init__(self, config: NodeConfig, reload: Callable[[], NodeConfig] | None = None,
                 metrics: Endpoint | None = None) -> None:
        self.config = config
        self.metrics = metrics  # the Prometheus endpoint (the CLI's `--metrics`), None: off
        self.reload = reload  # reads the config file again (SIGHUP); None: nothing to reload from
        self.runtime_path = ""
        self.data_dir = os.path.abspath(config.server.data_dir)
        self.instance = instance_id_for(self.data_dir, config.server.port)
        self.children: list[Child] = []
        self.stopping = False
        self._lock_fd: int | None = None
        self.listeners: list[socket.socket] = []  # every listening socket (closed on stop)
        self.listen_sockets: list[list[socket.socket]] = []  # by worker: its socket of each listener
        self.resources: NodeResources | None = None
        self.entry_points: dict[str, Callable[[list[str]], int]] = {}  # a child module's main, by module name
        self.hangs: HangWatch | None = None
        self._next_hang_kill = 0.0  # kill_hung: no kill before this (monotonic s), after the last one
        self.stats: S.StatsWriter | None = None
        self.ready = False  # READY=1 sent
        self.watchdog_s = _watchdog_interval_s()  # None: no WatchdogSec=
        self.next_watchdog = 0.0
        self._watchdog_withheld = False

    # -- start ---------------------------------------------------------------------------

    def _lock_data_dir(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        fd = os.open(os.path.join(self.data_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise DataDirInUse(f"{self.data_dir} is in use by another node")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk: the pid is only informative, the lock is what counts
            log.warning("cannot write the pid into %s/.lock: %s", self.data_dir, exc)
        self._lock_fd = fd

    def _listen(self, count: int) -> list[list[socket.socket]]:
        """For each listener ([[listeners]]), one socket per worker in one SO_REUSEPORT group: by worker, its
        socket of each listener in the config's order. Bound here and put to listen by its worker once its
        loop runs (workers.worker), so a port accepts connections only when a worker can serve them (a bound
        socket that does not listen refuses them; clients retry). The kernel spreads new connections over the
        listening ones (one shared socket would let whichever worker wakes first take them all). The supervisor
        keeps them open, so connections waiting in a dead worker's backlog are accepted by its replacement, not
        reset."""
        by_worker: list[list[socket.socket]] = [[] for _ in range(count)]
        for listener in self.config.listener_list():
            address = node_config.split_address(listener.address)
            # SO_REUSEPORT would let a second node on the same port join our group and take half the
            # connections: a plain bind first fails with EADDRINUSE if anyone holds the port.
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
            for sockets in by_worker:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self.listeners.append(sock)  # closed by stop(), also when a later bind fails
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind(address)
                sock.setblocking(False)
                sock.set_inheritable(True)
                sockets.append(sock)
        return by_worker

    def _child_specs(self) -> list[ChildSpec]:
        assert self.resources is not None
        bells = [bell.fileno() for bell in self.resources.worker_bells]
        cleaner_bells = [bell.fileno() for bell in self.resources.cleaner_bells]
        timer = ChildSpec("timer", 0, "shmbroker.node.timer.process",
                          ("--worker-bell-fds", ",".join(map(str, bells)),
                           "--cleaner-bell-fds", ",".join(map(str, cleaner_bells))),
                          (*bells, *cleaner_bells), TIMER_SLOT, S.TIMER_ROW)
        receiving = [inbox.receiving.fileno() for inbox in self.resources.inboxes]
        sending = [inbox.sending.fileno() for inbox in self.resources.inboxes]
        workers = []
        for i in range(len(bells)):
            listen_fds = [sock.fileno() for sock in self.listen_sockets[i]]
            args: tuple[str, ...] = ("--worker-bell-fds", ",".join(map(str, bells)),
                                     *(arg for fd in listen_fds for arg in ("--listen-fd", str(fd))))
            fds: tuple[int, ...] = (*bells, *listen_fds)
            if receiving:  # a worker inherits its own inbox's receiving end and the others' sending ends
                args += ("--inbox-fd", str(receiving[i]), "--worker-inbox-fds", ",".join(map(str, sending)))
                fds += (receiving[i], *(fd for peer, fd in enumerate(sending) if peer != i))
            workers.append(ChildSpec("worker", i, "shmbroker.workers.worker", args, fds, worker_slot(i),
                                     S.worker_row(i)))
        # A log cleaner: the rings of index workers + c, its own doorbell (node.cleaner).
        cleaners = [ChildSpec("cleaner", c, "shmbroker.node.cleaner.process",
                              ("--ring-index", str(len(bells) + c), "--bell-fd", str(fd),
                               "--stats-row", str(S.cleaner_row(len(bells), c))), (fd,),
                              cleaner_slot(len(bells), c), S.cleaner_row(len(bells), c))
                    for c, fd in enumerate(cleaner_bells)]
        return [timer] + workers + cleaners

    def spawn(self, child: Child) -> None:
        spec = child.spec
        argv = ["--instance", self.instance,
                "--index", str(spec.index),
                "--config-file", self.runtime_path,
                "--heartbeat-slot", str(spec.slot),
                "--supervisor-pid", str(os.getpid()), *spec.args]
        assert self.resources is not None
        self.resources.child_starting(spec.slot)
        self.resources.stats.reset(spec.stats_row)
        main = self.entry_points[spec.module]
        sys.stdout.flush()  # what is buffered is written once, by the supervisor, not again by the child
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_forked_child(spec, main, argv)  # never returns
        child.process = ForkedChild(pid)
        child.started_at = time.monotonic()
        if self.hangs is not None:
            self.hangs.started(spec.slot, child.started_at)
        log.info("started %s as pid %d", spec.name, child.process.pid)

    def start(self) -> None:
        formats.check(self.data_dir)  # before the lock file is written: a refused directory stays as it was
        self._lock_data_dir()
        formats.upgrade(self.data_dir, formats.check(self.data_dir))
        workers = self.config.server.worker_count()
        self.listen_sockets = self._listen(workers)  # first: a taken port fails before anything is created
        sdnotify.notify(f"STATUS=recovering the partitions in {self.data_dir}")
        self.resources = NodeResources.create(self.instance, self.config, self.data_dir)
        # After the instance's start, which clears a crashed run's leftovers (this file among them).
        self.runtime_path = node_config.write_runtime(self.config, shm_instance.config_path(self.instance))
        server = self.config.server
        if server.child_hang_timeout_ms > 0:
            self.hangs = HangWatch(self.resources.heartbeats, server.child_hang_timeout_ms,
                                   server.child_start_timeout_ms)
        self.stats = self.resources.stats.writer(S.SUPERVISOR_ROW, "supervisor", 0, os.getpid())
        GarbageCollectorStats(self.stats.counts).install()
        sdnotify.notify(f"STATUS=starting the timer and {workers} workers")
        self.children = [Child(spec) for spec in self._child_specs()]
        self.entry_points = {spec.module: importlib.import_module(spec.module).main for spec in
                             (child.spec for child in self.children)}
        for child in self.children:
            self.spawn(child)

    # -- run -----------------------------------------------------------------------------

    def run(self) -> int:
        signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNALS))
        try:
            server = self.config.server
            try:
                self.start()
            except DataDirInUse as exc:
                log.error("cannot start: %s", exc)
                print(f"shmbroker: {exc}", file=sys.stderr)
                return EXIT_IN_USE
            except formats.FormatError as exc:  # nothing was written: the directory stays as it was
                log.error("cannot start: %s", exc)
                print(f"shmbroker: {exc}", file=sys.stderr)
                return EXIT_NEWER_FORMAT if isinstance(exc, formats.NewerFormat) else 1
            except OSError as exc:
                log.error("cannot start on %s:%d: %s", server.host, server.port, exc)
                in_use = exc.errno == errno.EADDRINUSE
                print(f"shmbroker: cannot listen on {server.host}:{server.port}: "
                      f"{'the port is in use' if in_use else exc.strerror or exc}", file=sys.stderr)
                return EXIT_IN_USE if in_use else 1
            if self.metrics is not None:
                host, port = self.metrics.host, self.metrics.port
                try:
                    self.metrics.start(self.data_dir)
                except OSError as exc:
                    print(f"shmbroker: cannot serve metrics on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
                    self.stop()
                    return EXIT_IN_USE if exc.errno == errno.EADDRINUSE else 1
                log.info("metrics on http://%s:%d/metrics", host, port)
            code = 0
            try:
                while not self.stopping:
                    info = signal.sigtimedwait(set(SIGNALS), self._next_wakeup_s())
                    if info is not None:
                        getattr(self, SIGNALS[signal.Signals(info.si_signo)])()
                    self.reap()
                    self.kill_hung()
                    self.spawn_due()
                    self.tend()
            except ChildCannotBoot as exc:
                log.error("%s: stopping the node", exc)
                code = EXIT_CHILD_CANNOT_BOOT
            self.stop()
            return code
        finally:
            self._release()

    def tend(self) -> None:
        """Every wakeup: READY=1 once every child turned its loop, the watchdog ping, this process's stats row."""
        if self.stopping:
            return
        now = time.monotonic()
        if not self.ready and all(c.process is not None and self.resources.heartbeats.beats(c.spec.slot)
                                  for c in self.children):
            self.ready = True
            server = self.config.server
            log.info("serving on %s:%d (instance %s, data %s)", server.host, server.port, self.instance, self.data_dir)
            sdnotify.notify(f"READY=1\nSTATUS=serving on {server.host}:{server.port}\nMAINPID={os.getpid()}")
        if self.watchdog_s is not None and self.ready and now >= self.next_watchdog:
            # Withheld: look again soon, so a child back on its feet resumes the pings well before WatchdogSec.
            self.next_watchdog = now + (self.watchdog_s if self._watchdog(now) else self.watchdog_s / 10)
        if self.stats is not None:
            self.stats.set("children_alive", sum(1 for c in self.children
                                                 if c.process is not None and c.process.poll() is None))
            self.stats.set("child_restarts", sum(c.restarts for c in self.children))
            self.stats.add("loop_turns")
            self.stats.publish()

    def _watchdog(self, now: float) -> bool:
        """WATCHDOG=1 only while every child runs and turns its loop; otherwise withhold it (one log line).
        True if the ping was sent."""
        # A child not running, or (re)started and not yet turned its loop (a replaced hung child), counts as down.
        down = [c.spec.name for c in self.children if c.process is None or c.process.poll() is not None
                or not self.resources.heartbeats.beats(c.spec.slot)]
        stuck = self.hangs.stuck(now) if self.hangs is not None else []
        if not down and not stuck:
            if self._watchdog_withheld:
                log.info("watchdog: every child turns again")
            self._watchdog_withheld = False
            sdnotify.notify("WATCHDOG=1")
            return True
        if not self._watchdog_withheld:
            by_slot = {c.spec.slot: c.spec.name for c in self.children}
            hung = [f"{by_slot.get(s.slot, s.slot)} (pid {s.pid}, silent {s.silent_ms} ms)" for s in stuck]
            log.error("watchdog: withholding WATCHDOG=1: %s", "; ".join(
                [f"{name} not running" for name in down] + [f"{h} stopped turning its loop" for h in hung]))
        self._watchdog_withheld = True
        return False

    def handle_term(self) -> None:
        log.info("SIGTERM: stopping")
        self.stopping = True

    def handle_int(self) -> None:
        log.info("SIGINT: stopping")
        self.stopping = True

    def handle_chld(self) -> None:
        pass  # reap() runs after every signal

    def handle_hup(self) -> None:
        if self.reload is None:
            log.info("SIGHUP: no config file to reload")
            return
        sdnotify.notify("RELOADING=1")
        try:
            new = self.reload()
        except node_config.ConfigError as exc:
            log.error("SIGHUP: config not reloaded: %s", exc)
        else:
            merged, ignored = node_config.reloaded(self.config, new)
            if ignored:
                log.warning("SIGHUP: changes to %s take effect at the next restart", ", ".join(ignored))
            if merged != self.config:
                self.config = merged
                node_config.write_runtime(merged, self.runtime_path)
                for child in self.children:
                    if child.process is not None and child.process.poll() is None:
                        child.process.send_signal(signal.SIGHUP)
                log.info("SIGHUP: reloaded %s", ", ".join(node_config.RELOADABLE))
        sdnotify.notify("READY=1")

    def _next_wakeup_s(self) -> float:
        now = time.monotonic()
        pending = [c.restart_at - now for c in self.children if c.process is None]
        # Look at the children at least this often: a SIGCHLD can be merged with another one.
        poll_ms = self.config.server.supervisor_poll_ms
        if self.hangs is not None:
            poll_ms = min(poll_ms, self.config.server.heartbeat_interval_ms)
        if self.watchdog_s is not None:
            pending.append(self.next_watchdog - now)
        if not self.ready:
            pending.append(_READY_POLL_S)
        return max(0.0, min(pending + [poll_ms / 1000]))

    def reap(self) -> None:
        """Note children that exited and schedule their restart; raise ChildCannotBoot for one that
        keeps dying at start."""
        server = self.config.server
        now = time.monotonic()
        for child in self.children:
            if child.process is None or child.process.poll() is None:
                continue
            lived_ms = (now - child.started_at) * 1000
            child.boot_failures = child.boot_failures + 1 if lived_ms < server.child_boot_window_ms else 0
            if child.boot_failures >= server.child_boot_failures_max:
                raise ChildCannotBoot(f"{child.spec.name} exited {child.boot_failures} times within "
                                      f"{server.child_boot_window_ms} ms of starting (last exit code "
                                      f"{child.process.returncode}); see its log lines above")
            if lived_ms >= server.restart_backoff_reset_ms:
                child.backoff_ms = 0
            child.backoff_ms = min(max(child.backoff_ms * 2, server.restart_backoff_min_ms),
                                   server.restart_backoff_max_ms)
            log.warning("%s (pid %d) exited with %s; restarting in %d ms", child.spec.name,
                        child.process.pid, child.process.returncode, child.backoff_ms)
            child.process = None
            child.restart_at = now + child.backoff_ms / 1000
            if self.hangs is not None:
                self.hangs.forget(child.spec.slot)
            if self.resources is not None:
                self.resources.child_exited(child.spec.role, child.spec.index, child.spec.slot)

    def kill_hung(self) -> None:
        """SIGKILL a child whose loop stopped turning; reap() restarts it once it is gone.

        One child at a time, then none for two heartbeat intervals: a child waiting on a partition lock that the
        hung one holds (a worker appending behind a timer stopped in a flush) stopped turning as long ago, and
        beats again once the kill frees the lock. Of the children stuck at once the timer and the cleaners go
        first, as they take partition locks for work of their own (flushes, snapshots, markers, cleanings); then
        the one silent longest."""
        now = time.monotonic()
        if self.hangs is None or now < self._next_hang_kill:
            return
        by_slot = {c.spec.slot: c for c in self.children if c.process is not None}
        stalls = [stall for stall in self.hangs.stuck(now)
                  if stall.slot in by_slot and by_slot[stall.slot].process.poll() is None]
        if not stalls:
            return
        stall = min(stalls, key=lambda s: (by_slot[s.slot].spec.role == "worker", -s.silent_ms))
        child = by_slot[stall.slot]
        what = "has not started its loop" if stall.booting else "has not turned its loop"
        log.error("%s (pid %d) %s for %d ms (heartbeat stuck at %d): killing it (SIGKILL) to restart it",
                  child.spec.name, child.process.pid, what, stall.silent_ms, stall.beats)
        if self.watchdog_s is not None and self.ready:
            # Withheld now, while the stall is still listed: a replacement that turns its loop within one ping
            # interval would otherwise leave the hang unseen by the watchdog.
            self._watchdog(now)
            self.next_watchdog = now + self.watchdog_s / 10
        self.hangs.forget(stall.slot)
        child.process.kill()
        self._next_hang_kill = now + 2 * self.config.server.heartbeat_interval_ms / 1000

    def spawn_due(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.process is None and now >= child.restart_at:
                child.restarts += 1
                self.spawn(child)

    # -- stop ----------------------------------------------------------------------------

    def _terminate(self, children: list[Child], grace_s: float) -> None:
        for child in children:
            if child.process is not None and child.process.poll() is None:
                if child.spec.role == "cleaner":
                    _normal_scheduling(child.process.pid)
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in children:
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time: killing", child.spec.name)
                child.process.kill()
                child.process.wait()

    def stop(self) -> None:
        sdnotify.notify("STOPPING=1\nSTATUS=stopping: finishing in-flight requests, then the final fsync")
        grace_s = self.config.server.shutdown_grace_ms / 1000
        for listener in self.listeners:
            listener.close()
        # Workers first (they finish what clients wait on), the cleaners (a cleaning in flight is abandoned: the
        # log stays as it was), the timer last (its last group commit).
        self._terminate([c for c in self.children if c.spec.role in ("worker", "cleaner")], grace_s)
        self._terminate([c for c in self.children if c.spec.role == "timer"], grace_s)
        if self.resources is not None:
            self.resources.flush_all()
        log.info("stopped")

    def _release(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
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
_WAIT_POLL_S = 0.005  # ForkedChild.wait with a timeout: how often it looks (as subprocess.Popen.wait does)
_READY_POLL_S = 0.02  # how often the supervisor looks for the children's first heartbeats before READY=1


def _watchdog_interval_s() -> float | None:
    """Half of systemd's WatchdogSec= (WATCHDOG_USEC), if the watchdog is meant for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    try:
        return max(0.001, int(usec) / 2_000_000)
    except ValueError:
        log.warning("WATCHDOG_USEC=%r is not a number: no watchdog pings", usec)
        return None


class ForkedChild:
    """A child forked by the supervisor, with the part of subprocess.Popen's face the supervisor uses: its pid,
    `returncode` once reaped (negative: the signal that killed it), poll, wait, send_signal, kill."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            while self.returncode is None:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(_WAIT_POLL_S)
        return self.returncode

    def send_signal(self, signo: int) -> None:
        if self.returncode is None:  # not reaped, so the pid is still ours (a zombie at worst)
            os.kill(self.pid, signo)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _run_forked_child(spec: ChildSpec, main: Callable[[list[str]], int], argv: list[str]) -> None:
    """The child's side of spawn, right after the fork: the child's module was imported once, by the supervisor,
    so a child starts in milliseconds and shares those pages with it. It keeps only its own fds, as after an
    exec; its exit skips the supervisor's interpreter teardown (os._exit), which is not the child's to run."""
    code = 1
    try:
        _child_setup()
        set_title(spec.name)  # until the child names itself; recognised by its role from the first moment
        _close_fds_except({0, 1, 2, *spec.fds})
        gc.callbacks.clear()  # the supervisor's stats hook counts into the supervisor's row
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _close_fds_except(keep: set[int]) -> None:
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = max(low, fd + 1)
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _normal_scheduling(pid: int) -> None:
    """A cleaner runs at SCHED_IDLE (the cleaner's `scheduling`): on a busy machine it gets no CPU to stop, and the
    timer stops only after it. Best effort: a process without the right keeps the cleaner as it is."""
    with contextlib.suppress(OSError):
        if os.sched_getscheduler(pid) == os.SCHED_IDLE:
            os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))


def _child_setup() -> None:
    """Runs first in the child: our blocked signals are not the child's; a terminal's Ctrl-C, which reaches the
    whole process group, is the supervisor's alone (it stops the children in order; a child still starting
    would die of it with a traceback); and a child must not outlive a supervisor killed with -9 (it would hold
    the port and the rings)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(SIGNALS))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def serve(config: NodeConfig, reload: Callable[[], NodeConfig] | None = None,
          metrics: Endpoint | None = None) -> int:
    return Supervisor(config, reload, metrics).run()
