"""Node.js packages for the framework tests: installed from the npm registry into the frameworks cache
(tests/frameworks/cache.py, outside the checkout), once per package spec, reused by later runs and checkouts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.frameworks.cache import install_home, installed, mark_installed

NPM_TIMEOUT_S = 300
REGISTRY_UNREACHABLE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ECONNRESET", "ENETUNREACH")
NODE_MISSING = "make test installs nodejs and npm; run through make"


def have_node() -> bool:
    return shutil.which("node") is not None and shutil.which("npm") is not None


def node_version() -> tuple[int, ...]:
    """The installed Node.js version, e.g. (20, 20, 2)."""
    done = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30, check=True)
    return tuple(int(part) for part in done.stdout.strip().lstrip("v").split("."))


def node_modules(name: str, package: str) -> Path:
    """A node_modules directory with `package` installed from the npm registry (once; reused while the package
    spec is the same). Skips the test when the registry cannot be reached."""
    with install_home(f"npm-{name}", package) as home:
        if not installed(home, package):
            _install(home, package)
    return home / "node_modules"


def _install(home: Path, package: str) -> None:
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    try:
        done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(home),
                               package], capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm install {package}: the registry did not answer in {NPM_TIMEOUT_S}s")
    if done.returncode != 0 and any(code in done.stderr for code in REGISTRY_UNREACHABLE):
        pytest.skip(f"npm install {package}: the registry is unreachable:\n{done.stderr[-2000:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    mark_installed(home, package)
