"""Make an upgrade fixture: run some commit's node through the workload (tests/upgrade/workload.py), stop it
with SIGTERM, and keep its data directory and config as tests/upgrade/fixtures/NAME/ (data.tar.gz and
manifest.json), for tests/upgrade/test_upgrade.py to start today's node on.

    python -m tests.upgrade.make_fixture 2f80f5e           # a worktree and venv of that commit are made
    python -m tests.upgrade.make_fixture HEAD --checkout .  # this checkout's node, its own venv

The older node runs from a git worktree of the commit (in a temp dir, removed after) with a venv made by
its own `make venv`; the workload's clients are this checkout's. Run it whenever a format the node keeps
changes, before the change lands: the fixture of the last version that wrote the old format stays.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from scripts.harness import rawkafka
from scripts.harness.nodeproc import NodeProcess
from tests.upgrade import workload

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
END_TXN, CREATE_ACLS, ALTER_USER_SCRAM_CREDENTIALS = 26, 30, 51
SETUP_TIMEOUT_S = 900


def node_command(checkout: Path) -> list[str]:
    """How that checkout's node is started: its venv's Python on its CLI module (shmbroker.node.tools.cli since
    the packages are installed under shmbroker; node.tools.cli before; node.cli before the tools moved)."""
    if "shmbroker.node.tools.cli" in (checkout / "pyproject.toml").read_text():
        module = "shmbroker.node.tools.cli"
    else:
        module = "node.tools.cli" if (checkout / "node" / "tools" / "cli.py").exists() else "node.cli"
    return [str(checkout / ".venv" / "bin" / "python"), "-m", module]


def config_for(checkout: Path) -> str:
    """A config of the sections that checkout's node knows: client quotas, and the authorizer (ACLs kept, the
    workload's plaintext connections a super user) where it has one."""
    source = (checkout / "node" / "config.py").read_text()
    text = "[topics]\nnum_partitions = 2\n"
    if "class QuotaLimits" in source:
        text += "\n[quotas.clients.quota-client]\nproducer_byte_rate = 1048576\nconsumer_byte_rate = 2097152\n"
    if "class AuthorizerConfig" in source:
        text += ('\n[authorizer]\nenabled = true\nsuper_users = ["User:ANONYMOUS"]\n'
                 "allow_everyone_if_no_acl_found = true\n")
    return text


def features_of(node: NodeProcess, checkout: Path, config: str) -> set[str]:
    with rawkafka.RawConnection("127.0.0.1", node.port) as conn:
        answer = conn.call(rawkafka.API_VERSIONS, 3, rawkafka.api_versions_body(3))
    keys = {int(api.api_key) for api in answer.api_keys}
    features = set()
    if CREATE_ACLS in keys and "[authorizer]" in config:
        features.add("acls")
    if END_TXN in keys:
        features.add("transactions")
    if ALTER_USER_SCRAM_CREDENTIALS in keys:
        features.add("users")
    if (checkout / "node" / "storage" / "cleaner.py").exists():  # the log cleaner came with compacted topics
        features.add("compaction")
    return features


def make(checkout: Path, name: str, commit: str) -> Path:
    config = config_for(checkout)
    with tempfile.TemporaryDirectory(prefix="shmbroker-fixture-") as work:
        node = NodeProcess(Path(work), workers=1, config=config, repo=checkout, command=node_command(checkout),
                           wait_ready=False)
        node.start()
        try:
            features = features_of(node, checkout, config)
            manifest = workload.write(node.bootstrap, features)
            configs = manifest["topic_configs"]
            manifest["state"] = workload.state(node.bootstrap, features, configs)
            assert manifest["state"] == workload.expected_state(features, configs), manifest["state"]
        finally:
            code = node.stop()
        assert code == 0, node.log()
        target = FIXTURES / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=9) as tar:
            tar.add(node.data_dir, arcname="data")
            tar.add(node.config_path, arcname="node.toml")
        (target / "data.tar.gz").write_bytes(buffer.getvalue())
        manifest.update({"commit": commit, "made": datetime.date.today().isoformat(), "config": config})
        (target / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commit", help="the commit whose node writes the fixture")
    parser.add_argument("--checkout", type=Path, help="run this checkout (with its .venv) instead of a worktree")
    parser.add_argument("--name", help="the fixture's folder (default: the commit's date and short hash)")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", args.commit], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.strip()
    day = subprocess.run(["git", "show", "-s", "--format=%cs", commit], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout.strip()
    name = args.name or f"{day}-{commit}"
    if args.checkout:
        checkout = args.checkout.resolve()
        subprocess.run(["make", "venv"], cwd=checkout, check=True, timeout=SETUP_TIMEOUT_S)
        print(make(checkout, name, commit))
        return
    scratch = Path(tempfile.mkdtemp(prefix="shmbroker-old-"))
    checkout = scratch / commit
    try:
        subprocess.run(["git", "worktree", "add", "--detach", str(checkout), commit], cwd=REPO, check=True)
        print(f"make_fixture: setting up {commit}'s venv", file=sys.stderr, flush=True)
        subprocess.run(["make", "venv"], cwd=checkout, check=True, timeout=SETUP_TIMEOUT_S,
                       env={**os.environ, "MAKEFLAGS": ""})
        print(make(checkout, name, commit))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(checkout)], cwd=REPO)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
