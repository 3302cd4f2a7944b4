"""What users install: the wheel `pip wheel .` builds, installed into a fresh venv and run from a directory
outside the checkout; and `make install-service` into a root directory of its own, its unit verified against
the installed paths and its ExecStart line run by hand as the service user it created.

Each round trip goes through kcat, as a user's first try would.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from scripts.harness.nodeproc import NodeProcess, api_versions_roundtrip, free_port, shadowing_folders, shm_leftovers
from shmbroker.shm.instance import instance_id_for

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("node", "shm", "workers", "clients")  # installed as shmbroker.<folder> (setup.py)
CONNECTOR = "pyspark_shmbroker"
PIP_TIMEOUT_S = 600
KCAT_TIMEOUT_S = 60
START_TIMEOUT_S = 60

# `make wheel` builds in the checkout (its build/ and egg-info, which no other test reads): the module's one wheel
# fixture builds it once, as this file's tests run in one pytest-xdist worker (tests/conftest.py's groups).
pytestmark = [pytest.mark.node,
              pytest.mark.skipif(shutil.which("kcat") is None, reason="make test installs kcat; run through make")]


def _clean_env() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH pointing at the checkout, no active venv."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def _run(args: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=_clean_env(), **kwargs)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def work():
    """A directory outside the checkout that another user may enter (the service user runs from it)."""
    path = Path(tempfile.mkdtemp(prefix="shmbroker-install-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def wheel(work) -> Path:
    """The wheel as `make wheel` builds it (pip, isolated build from this checkout's sources)."""
    out = work / "dist"
    _run(["make", "-C", REPO, "wheel", f"WHEEL_DIR={out}"], timeout=PIP_TIMEOUT_S)
    wheels = sorted(out.glob("shmbroker-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _packages_in_checkout() -> set[str]:
    """Every package of the checkout by its installed name."""
    found = set()
    for top in (*FOLDERS, CONNECTOR):
        for root, dirs, files in os.walk(REPO / top):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
            if any(f.endswith(".py") for f in files):
                name = ".".join(Path(root).relative_to(REPO).parts)
                found.add(name if top == CONNECTOR else f"shmbroker.{name}")
    return found


def _kcat_round_trip(bootstrap: str, topic: str) -> None:
    lines = "".join(f"record {i}\n" for i in range(5))
    _run(["kcat", "-b", bootstrap, "-P", "-t", topic], input=lines, timeout=KCAT_TIMEOUT_S)
    got = _run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q"], timeout=KCAT_TIMEOUT_S)
    assert got.stdout == lines


def test_wheel_carries_every_package_and_no_tests(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    in_wheel = {str(Path(n).parent).replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert in_wheel == _packages_in_checkout()
    assert not [n for n in names if n.startswith(("tests/", "scripts/"))]
    assert [n for n in names if re.fullmatch(r"shmbroker/shm/_ringops\.cpython-.*\.so", n)], "no compiled shm._ringops"
    assert [n for n in names if re.fullmatch(r"shmbroker/workers/codecs/_header\.cpython-.*\.so", n)], \
        "no compiled workers.codecs._header"
    assert not [n for n in names if n.split("/")[0] in FOLDERS], "a package installed under its folder's bare name"
    assert not [n for n in names if n.endswith(".c")]


def test_wheel_in_a_fresh_venv_serves_kcat(wheel, work):
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", venv], timeout=PIP_TIMEOUT_S)
    _run([venv / "bin" / "pip", "install", "--quiet", wheel], timeout=PIP_TIMEOUT_S)
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    # A user's own modules named node, shm, workers and clients, where the node and the user's programs start:
    # neither imports them.
    shadowing_folders(elsewhere)
    # The installed tree, not the checkout, is what imports.
    probe = ("import shmbroker.node.storage, shmbroker.shm._ringops, shmbroker.workers.codecs._header, "
             "shmbroker.clients.priority; "
             "print(shmbroker.node.storage.__file__)")
    where = _run([venv / "bin" / "python", "-c", probe], cwd=elsewhere, timeout=60).stdout
    assert str(venv) in where and str(REPO) not in where, where

    node = NodeProcess(elsewhere, workers=2, command=[str(venv / "bin" / "shmbroker")], cwd=elsewhere,
                       env={"PYTHONPATH": ""})
    try:
        node.start()
        _kcat_round_trip(node.bootstrap, "from-the-wheel")
        assert node.stop() == 0
        assert "Traceback" not in node.log(), node.log()
    finally:
        node.close()
    assert node.leftovers() == []


def _exec_start(unit_text: str) -> list[str]:
    line = next(line for line in unit_text.splitlines() if line.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").split()


def test_install_service_into_a_root_starts_as_the_service_user(wheel, work):
    if os.getuid() != 0:
        pytest.skip("make install-service runs as root")
    for tool in ("systemd-sysusers", "systemd-tmpfiles", "systemd-analyze", "systemctl", "setpriv"):
        assert shutil.which(tool), f"{tool} is missing: `make test` installs it (Debian packages systemd, util-linux)"
    root = work / "root"
    port = free_port()
    # A config already there is kept: this one moves the node to a free port.
    (root / "etc" / "shmbroker").mkdir(parents=True)
    (root / "etc" / "shmbroker" / "shmbroker.toml").write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {port}\nworkers = 1\n')
    _run(["make", "-C", REPO, "install-service", f"ROOT={root}", f"WHEEL_DIR={wheel.parent}"], timeout=PIP_TIMEOUT_S)

    # The user and the directories, made in the root.
    entry = next(line.split(":") for line in (root / "etc" / "passwd").read_text().splitlines()
                 if line.startswith("shmbroker:"))
    uid, gid = int(entry[2]), int(entry[3])
    state = root / "var" / "lib" / "shmbroker"
    assert (state / "data").stat().st_uid == uid and stat.S_IMODE(state.stat().st_mode) == 0o750
    assert (root / "etc" / "systemd" / "system" / "multi-user.target.wants" / "shmbroker.service").is_symlink()

    # The unit verifies against the installed paths (resolved inside the root; the system's own units and its
    # kill, which ExecReload names, copied in as a host has them).
    unit = root / "etc" / "systemd" / "system" / "shmbroker.service"
    shutil.copytree("/usr/lib/systemd/system", root / "usr" / "lib" / "systemd" / "system", symlinks=True)
    (root / "usr" / "bin").mkdir(exist_ok=True)
    shutil.copy2(os.path.realpath("/bin/kill"), root / "usr" / "bin" / "kill")
    (root / "bin").symlink_to("usr/bin")
    verified = subprocess.run(["systemd-analyze", "verify", f"--root={root}", "shmbroker.service"],
                              capture_output=True, text=True, timeout=120, cwd=work)
    assert verified.returncode == 0 and verified.stderr.strip() == "", verified.stderr
    argv = _exec_start(unit.read_text())
    assert argv[0] == "/opt/shmbroker/.venv/bin/shmbroker" and (root / argv[0].lstrip("/")).exists()

    # The ExecStart line, by hand, as the service user, as systemd would run it (its directories in the
    # environment, WorkingDirectory=, UMask=).
    env = {**_clean_env(), "CONFIGURATION_DIRECTORY": str(root / "etc" / "shmbroker"), "STATE_DIRECTORY": str(state)}
    argv = [str(root) + a if a.startswith("/") else a for a in argv]
    argv = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], a) for a in argv]
    # The unit's working directory holds folders named like the repository's (a user's, an operator's): the
    # service's processes do not import them.
    shadowing_folders(state)
    for path in state.rglob("*"):
        os.chown(path, uid, gid)
    # The user exists only in the root's passwd: setpriv takes its numeric ids.
    log = open(work / "service.log", "wb")
    proc = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv], cwd=state,
                            env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: os.umask(0o027))
    try:
        assert _wait_answering(proc, port), (work / "service.log").read_text()
        _kcat_round_trip(f"127.0.0.1:{port}", "from-the-service")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (work / "service.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    text = (work / "service.log").read_text()
    assert "Traceback" not in text, text
    assert (state / "data" / ".lock").stat().st_uid == uid
    assert shm_leftovers(instance_id_for(str(state / "data"), port)) == []


def _wait_answering(proc: subprocess.Popen, port: int) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if api_versions_roundtrip(port, timeout=0.5):
            return True
        time.sleep(0.1)
    return False
