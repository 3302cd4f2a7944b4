"""The systemd side: the unit passes `systemd-analyze verify`, and the supervisor speaks sd_notify to a test
NOTIFY_SOCKET as systemd expects: READY=1 only once a client gets an answer, STATUS= while starting, WATCHDOG=1
every half of WATCHDOG_USEC while every child turns its loop, none while a child is stopped (SIGSTOP) until the
supervisor replaced it, RELOADING=1 then READY=1 on SIGHUP, STOPPING=1 on SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from scripts.harness.nodeproc import NodeProcess, api_versions_roundtrip

pytestmark = pytest.mark.serial  # see tests/conftest.py: run alone

REPO = Path(__file__).resolve().parent.parent
WATCHDOG_USEC = 400_000  # pings every 0.2 s
HANG_TIMEOUT_MS = 800


def test_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: `make test` installs it (Debian package systemd)"
    unit = (REPO / "systemd" / "shmbroker.service").read_text()
    # The unit names the installed venv; verify checks that ExecStart exists, so point it at this checkout's.
    installed = "/opt/shmbroker/.venv/bin/shmbroker"
    assert installed in unit
    here = Path(sys.executable).parent / "shmbroker"
    (tmp_path / "shmbroker.service").write_text(unit.replace(installed, str(here)))
    done = subprocess.run([analyze, "verify", str(tmp_path / "shmbroker.service")], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    for needed in ("Type=notify", "WatchdogSec=", "ExecReload=", "KillMode=mixed",
                   "Restart=on-failure", "RemoveIPC=no", "ProtectSystem=strict", "StateDirectory=shmbroker",
                   "ConfigurationDirectory=shmbroker", "LimitNOFILE=", "TimeoutStopSec="):
        assert needed in unit
    for snippet in ("shmbroker.sysusers", "shmbroker.tmpfiles"):
        assert (REPO / "systemd" / snippet).read_text().strip()


class NotifyListener:
    """A NOTIFY_SOCKET: records (time, message) of every datagram; on READY=1 it tries a Kafka request at once."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self.port = 0
        self.ready_answered: list[bool] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            text = data.decode()
            received = time.monotonic()
            # The round trip comes first, so whoever sees READY=1 in `messages` sees its outcome too.
            if "READY=1" in text.split("\n") and self.port:
                self.ready_answered.append(api_versions_roundtrip(self.port, timeout=0.5))
            self.messages.append((received, text))

    def count(self, state: str, since: float = 0.0) -> int:
        return sum(1 for when, text in self.messages if when >= since and state in text.split("\n"))

    def wait_for(self, state: str, since: float = 0.0, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.count(state, since):
                return
            time.sleep(0.02)
        raise AssertionError(f"no {state} in {timeout}s: {self.messages}")

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.mark.node
def test_notify_ready_watchdog_reload_stop():
    short = tempfile.mkdtemp(prefix="smb-sd-", dir="/tmp")  # AF_UNIX paths are short
    listener = NotifyListener(os.path.join(short, "notify"))
    config_text = f"[server]\nchild_hang_timeout_ms = {HANG_TIMEOUT_MS}\nheartbeat_interval_ms = 100\n"
    (Path(short) / "node").mkdir()
    node = NodeProcess(Path(short) / "node", workers=2, config=config_text,
                       env={"NOTIFY_SOCKET": os.path.join(short, "notify"), "WATCHDOG_USEC": str(WATCHDOG_USEC)})
    listener.port = node.port
    try:
        node.start()
        listener.wait_for("READY=1")
        assert listener.ready_answered and all(listener.ready_answered), listener.messages
        statuses = [text for _, text in listener.messages if text.startswith("STATUS=")]
        assert any("recovering" in s for s in statuses) and any("starting" in s for s in statuses)
        first_ready = next(when for when, text in listener.messages if "READY=1" in text.split("\n"))
        assert listener.count("WATCHDOG=1") == 0 or min(
            when for when, text in listener.messages if text == "WATCHDOG=1") >= first_ready

        # Pings every half of WATCHDOG_USEC while all is well.
        start = time.monotonic()
        time.sleep(1.5)
        assert listener.count("WATCHDOG=1", since=start) >= 4

        # A stopped worker: once silent for the hang timeout the supervisor replaces it (SIGKILL and a restart,
        # server.child_hang_timeout_ms); until the replacement turns its loop the pings are withheld, then resume.
        worker = node.pids("worker")[0]
        os.kill(worker, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 10
            while worker in node.pids("worker") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert worker not in node.pids("worker"), node.log()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGCONT)
        replaced = time.monotonic()
        listener.wait_for("WATCHDOG=1", since=replaced, timeout=10)
        log = node.log()
        assert "stopped turning its loop" in log or "has not turned its loop" in log, log
        assert "withholding WATCHDOG=1" in log, log

        # SIGHUP: RELOADING=1, then READY=1 again.
        hup = time.monotonic()
        node.proc.send_signal(signal.SIGHUP)
        listener.wait_for("RELOADING=1", since=hup)
        listener.wait_for("READY=1", since=hup)

        # SIGTERM: STOPPING=1 first, then a clean exit.
        term = time.monotonic()
        assert node.stop() == 0
        listener.wait_for("STOPPING=1", since=term, timeout=5)
        assert "Traceback" not in node.log(), node.log()
    finally:
        node.close()
        listener.close()
        shutil.rmtree(short, ignore_errors=True)
    assert node.leftovers() == []
