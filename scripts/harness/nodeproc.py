"""The one launcher of a real node, for the tests and the benchmarks: `python -m node.tools.cli serve` as a
subprocess on a free 127.0.0.1 port with its own data dir, stopped with real signals, by pid.

    node = NodeProcess(work_dir, workers=2, config="[topics]\\nnum_partitions = 4\\n").start()
    ... node.bootstrap, node.pids("timer"), node.kill_all() ...
    node.close()          # SIGTERM if still running, leftover shared memory removed, own temp dir removed

Without `work_dir` the node gets a temp dir of its own (config, log, data), removed by close().

Invariants:
- Only 127.0.0.1 is ever used.
- Processes are found and stopped by pid: the supervisor's, and its children's as psutil lists them.
- Every wait is bounded (start_timeout_s, stop_timeout_s). If the process that started the node dies, the
  kernel sends the node SIGTERM (PR_SET_PDEATHSIG), a clean stop.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psutil

from shmbroker.node.config import ANSWER_WATCH_BREACH
from shmbroker.node.storage.log import LOCK_FILE as PARTITION_LOCK_FILE
from shmbroker.node.tools.cli import EXIT_IN_USE  # the port (or the data dir) is taken
from shmbroker.shm import instance as shm_instance

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout whose node runs by default
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
START_PROBE_INTERVAL_S = 0.05
START_PROBE_TIMEOUT_S = 0.5
PAUSE_TIMEOUT_S = 10.0  # stop_when_holding: how long to wait for a child to hold the partition locks wanted
PAUSE_RETRY_S = 0.005
CLI = [sys.executable, "-m", "shmbroker.node.tools.cli"]  # `shmbroker` as this Python runs it
# The supervisor's line once every child's loop turned (its READY=1): start() returns only then, so connections
# made right after it spread over all workers, and every child has its stats row.
READY_LINE = "shmbroker.supervisor: serving on"
# Set by the tests (tests/conftest.py) for a test not marked `node`: any NodeProcess it starts, in its process or
# in a script it runs, refuses with the variable's text, so `make check` (no nodes) cannot start one unseen.
REFUSE_NODES_ENV = "SHMBROKER_TEST_REFUSES_NODES"
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def api_versions_roundtrip(port: int, timeout: float = 2.0) -> bool:
    """True when the node answers an ApiVersions v0 request on `port`."""
    request = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            header = sock.recv(8)
            return len(header) == 8 and struct.unpack(">ii", header)[1] == 1
    except OSError:
        return False


def all_threads_stopped(pid: int) -> bool:
    """Every thread of `pid` is in the stopped state (T), or the process is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = []
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
    except FileNotFoundError:
        return True
    return all(state in ("T", "t") for state in states)


def die_with_parent() -> None:
    """In the child before exec: SIGTERM the node (a clean stop) if the process that started it dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class NodeProcess:
    def __init__(self, work_dir: Path | str | None = None, workers: int = 1, config: str = "",
                 port: int | None = None, data_dir: Path | str | None = None, env: dict[str, str] | None = None,
                 announce: bool = False, repo: Path | str = REPO_ROOT, wait_ready: bool = True,
                 command: list[str] | None = None, cwd: Path | str | None = None) -> None:
        self._own_dir = work_dir is None
        self.work_dir = Path(tempfile.mkdtemp(prefix="shmbroker-node-") if work_dir is None else work_dir)
        self.workers = workers
        self.port = port or free_port()
        self._port_chosen = port is None  # by free_port(): another may take it before the node binds it
        self._started_once = False  # later starts keep the port clients know
        self.data_dir = Path(data_dir) if data_dir is not None else self.work_dir / "data"
        self.config_path = self.work_dir / "node.toml"
        self.config_path.write_text(config)
        self.log_path = self.work_dir / f"node-{self.port}.log"
        self.env = env
        self.repo = Path(repo)  # the checkout whose node runs (another one's, to compare checkouts)
        # What runs `serve`: this Python's node.tools.cli by default, or an installed `shmbroker` (a wheel's venv),
        # from `cwd` (the checkout by default).
        self.command = command or CLI
        self.cwd = Path(cwd) if cwd is not None else self.repo
        self.wait_ready = wait_ready  # False: return once a worker answers (a checkout whose children log no ready line)
        self.announce = announce  # print "nodeproc: node pid ... on ..., data ..." to stderr once it answers
        self.proc: subprocess.Popen | None = None
        self.start_args: list[str] = []  # more `shmbroker serve` arguments (e.g. --metrics HOST:PORT)

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def instance(self) -> str:
        return shm_instance.instance_id_for(str(self.data_dir), self.port)

    def start(self) -> "NodeProcess":
        if os.environ.get(REFUSE_NODES_ENV):
            raise RuntimeError(os.environ[REFUSE_NODES_ENV])
        args = [*self.command, "serve", "--config", str(self.config_path),
                "--listen", self.bootstrap, "--data-dir", str(self.data_dir), "--workers", str(self.workers),
                *self.start_args]
        env = {**os.environ, **self.env} if self.env else None
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        # The kernel sends PDEATHSIG when the *thread* that forked exits: a node (re)started from a helper
        # thread (a test that kills and restarts it in the background) would be stopped as that thread ends.
        in_main_thread = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.cwd, env=env, preexec_fn=die_with_parent if in_main_thread else None)
        ready_lines = [READY_LINE] if self.wait_ready else []
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self.proc.returncode == EXIT_IN_USE and self._port_chosen and not self._started_once:
                    # Between free_port() and the node's bind, another process (a test beside this one, a
                    # client's outgoing connection) took the port: one retry on a new one.
                    self._port_chosen = False
                    self.port = free_port()
                    return self.start()
                raise RuntimeError(f"node exited with {self.proc.returncode}:\n{self.log()}")
            if self._logged_since(log_start, ready_lines) and api_versions_roundtrip(self.port,
                                                                                      timeout=START_PROBE_TIMEOUT_S):
                self._started_once = True
                if self.announce:
                    print(f"nodeproc: node pid {self.proc.pid} on {self.bootstrap}, data {self.data_dir}",
                          file=sys.stderr, flush=True)
                return self
            time.sleep(START_PROBE_INTERVAL_S)
        self.kill_all()
        raise RuntimeError(f"node did not answer in {START_TIMEOUT_S}s:\n{self.log()}")

    def _logged_since(self, offset: int, lines: list[str]) -> bool:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
        except OSError:
            return False
        return all(line in text for line in lines)

    def log(self, chars: int = 20000) -> str:
        """The last `chars` characters of the node's log (-1: all of it)."""
        try:
            text = self.log_path.read_text(errors="replace")
            return text if chars < 0 else text[-chars:]
        except OSError:
            return ""

    # -- processes ---------------------------------------------------------------------------

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def children(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def pids(self, role: str = "") -> list[int]:
        """Pids of the children of a role ('worker', 'timer'); all children when empty."""
        found = []
        for child in self.children():
            with contextlib.suppress(psutil.Error):
                # Its title (setproctitle: "shmbroker: worker 1 ..."), set by the supervisor's fork at once.
                if not role or " ".join(child.cmdline()).startswith(f"shmbroker: {role}"):
                    found.append(child.pid)
        return found

    def memory(self) -> dict[str, int]:
        """Memory of the whole node (supervisor and every child), in bytes: the sum of each process's RSS
        (shared pages, such as the rings, counted once per process that maps them) and of its PSS (shared
        pages split between the processes that map them: the node's real share of RAM)."""
        totals = {"rss_bytes": 0, "pss_bytes": 0, "processes": 0}
        if self.proc is None:
            return totals
        for pid in [self.proc.pid, *(child.pid for child in self.children())]:
            with contextlib.suppress(psutil.Error):
                info = psutil.Process(pid).memory_full_info()
                totals["rss_bytes"] += info.rss
                totals["pss_bytes"] += getattr(info, "pss", info.rss)
                totals["processes"] += 1
        return totals

    def partition_locks_held_by(self, pid: int) -> list[str]:
        """The partitions (directory names) whose lock `pid` holds now: its open partition lock files
        (node.storage.log.LOCK_FILE) under the data dir whose fdinfo lists a lock (an OFD lock shows there, on the
        file description that took it; /proc/locks gives no pid for one)."""
        held = []
        data_dir = os.path.realpath(self.data_dir)
        with contextlib.suppress(FileNotFoundError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if (os.path.basename(target) != PARTITION_LOCK_FILE
                            or os.path.dirname(os.path.dirname(target)) != data_dir):
                        continue
                    with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                        if any(line.startswith("lock:") for line in info):
                            held.append(os.path.basename(os.path.dirname(target)))
                except FileNotFoundError:  # closed meanwhile
                    continue
        return held

    def stop_outside_partition_locks(self, pid: int, timeout_s: float = PAUSE_TIMEOUT_S) -> None:
        """SIGSTOP a child at a moment when it holds no partition lock, for a test that stops one process to show
        the others go on without it. A process stopped while holding a partition's lock (the timer's flusher
        publishing a flushed offset, a producer snapshot, a marker's catch-up) holds up every append to that
        partition, and the worker making it, until it runs again or the supervisor replaces it as hung
        (node.storage.log: the lock is the appends' one writer)."""
        self.stop_when_holding(pid, lambda held: not held, timeout_s)

    def stop_when_holding(self, pid: int, wanted: Callable[[list[str]], bool],
                          timeout_s: float = PAUSE_TIMEOUT_S) -> None:
        """SIGSTOP a child at a moment when `wanted(the partition locks it holds)` is true, checked once every
        thread of it stopped; else SIGCONT and again, for up to timeout_s (AssertionError then, the child
        running)."""
        deadline = time.monotonic() + timeout_s
        held: list[str] = []
        while True:
            os.kill(pid, signal.SIGSTOP)
            while not (stopped := all_threads_stopped(pid)) and time.monotonic() < deadline:
                time.sleep(PAUSE_RETRY_S)  # SIGSTOP is delivered thread by thread
            if stopped:
                held = self.partition_locks_held_by(pid)
                if wanted(held):
                    return
            os.kill(pid, signal.SIGCONT)  # never left stopped but for the caller
            if time.monotonic() > deadline:
                raise AssertionError(f"pid {pid} was not stopped in {timeout_s}s holding the partition locks "
                                     f"wanted (the last ones seen held: {held})")
            time.sleep(PAUSE_RETRY_S)

    def wait_for_pids(self, role: str, count: int, exclude: set[int] = frozenset(), timeout: float = 20.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = [p for p in self.pids(role) if p not in exclude]
            if len(pids) >= count:
                return pids
            time.sleep(0.05)
        raise AssertionError(f"no {count} {role} processes in {timeout}s:\n{self.log()}")

    # -- stopping ----------------------------------------------------------------------------

    def stop(self) -> int:
        """SIGTERM and wait: the clean shutdown path. Returns the exit code. A node that ignores SIGTERM
        for STOP_TIMEOUT_S is killed (its whole tree) and AssertionError raised."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise AssertionError(f"node did not stop in {STOP_TIMEOUT_S}s:\n{self.log()}")
        self.assert_no_breach()
        return code

    def breaches(self) -> list[str]:
        """The lines of the node's log where its answer watch (checks.watch_answers) saw a breach of Kafka's rules."""
        return [line for line in self.log(chars=-1).splitlines() if ANSWER_WATCH_BREACH in line]

    def assert_no_breach(self) -> None:
        found = self.breaches()
        if found:
            raise AssertionError(f"the node's answer watch saw {len(found)} breaches:\n" + "\n".join(found[:20]))

    def kill_all(self) -> None:
        """kill -9 the supervisor and every child, by pid."""
        if self.proc is None:
            return
        victims = self.children()
        for pid in [self.proc.pid] + [c.pid for c in victims]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        psutil.wait_procs(victims, timeout=STOP_TIMEOUT_S)

    def leftovers(self) -> list[str]:
        return shm_leftovers(self.instance)

    def close(self) -> None:
        """Stop the node if it runs, remove what a hard kill left in /dev/shm, and the node's own temp dir."""
        try:
            if self.alive():
                code = self.stop()
                if code != 0:
                    print(f"nodeproc: node exited with {code}:\n{self.log(4000)}", file=sys.stderr)
            with contextlib.suppress(shm_instance.InstanceBusy):
                removed = shm_instance.remove_leftovers(self.instance)
                if removed:
                    print(f"nodeproc: removed leftover shared memory {removed}", file=sys.stderr)
            self.assert_no_breach()  # a node killed, not stopped, is checked here
        finally:
            if self._own_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "NodeProcess":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.close()


SHADOWING_NAMES = ("node", "shm", "workers", "clients")  # the repository's folders: generic names a user may have


def shadowing_folders(directory: Path | str) -> None:
    """Packages named like the repository's folders in `directory`, each raising on import: a program started
    there that imports one of them instead of the node's own code fails."""
    for name in SHADOWING_NAMES:
        package = Path(directory) / name
        package.mkdir(exist_ok=True)
        message = f"the user's own {name}/ was imported"
        (package / "__init__.py").write_text(f"raise ImportError({message!r})\n")


def shm_leftovers(instance: str = "") -> list[str]:
    """Names in /dev/shm of one node instance (or of every shmbroker instance)."""
    stem = f"shmbroker-{instance}"
    try:
        return sorted(name for name in os.listdir("/dev/shm") if stem in name)
    except FileNotFoundError:
        return []
