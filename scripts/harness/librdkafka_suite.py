"""librdkafka's own test suite (its tests/ directory, built into its `test-runner`) against the node: the tests
that need Apache Kafka's command-line tools (kafka-topics.sh, kafka-acls.sh), in full mode (not -Q).

- The source: librdkafka's tree as a registry ships it. PyPI's confluent-kafka ships the library built, not its
  source; the npm registry's @confluentinc/kafka-javascript carries librdkafka's whole tree (tests/ included) in
  deps/librdkafka. Its newest release bundles librdkafka LIBRDKAFKA_VERSION (2.15.1), one behind the 2.16.0 in
  the venv's confluent-kafka: no registry reached here serves 2.16.0's source (crates.io's rdkafka-sys and Debian's
  librdkafka are older still). `npm pack` fetches it (npm's own cache is ~/.npm).
- The build, once per cache (LIBRDKAFKA_CACHE, default ~/.cache/shmbroker/librdkafka-VERSION, outside the
  checkout): ./configure without SSL, SASL/GSSAPI, curl and zstd (the six tests use none; zlib is kept for their
  gzip cases, lz4 is librdkafka's own copy), `make libs`, `make -C tests test-runner`. It goes into a staging
  directory renamed into place whole, with a stamp of the package and the configure options: an interrupted
  build leaves nothing that looks done; objects and static archives are then removed (the test-runner links the
  shared libraries; 70 MB stay, not 270). 3 minutes of CPU: 8.5 minutes on two busy cores. `make librdkafka` does
  it ahead.
- ``KafkaTools``: the KAFKA_PATH the test-runner's test_kafka_cmd()/test_kafka_topics() call: bin/kafka-*.sh
  scripts that exec each tool's main class on kafka_peer's classpath (a short-lived JVM: C1 only, serial GC).
- ``run_tests``: the test-runner with TESTS=<id>, a test.conf naming the node (bootstrap.servers), BROKERS (what
  kafka-topics.sh gets), TEST_KAFKA_VERSION (the Kafka the node answers as: 4.x, so no test falls back to
  pre-0.10 protocols Kafka 4 dropped), CI=true (as librdkafka's CI: the client's timing checks warn, not fail), in
  a work directory of its own; its own session (process group), killed whole by its id when it outlasts its
  timeout, so no tool JVM it started stays.

Invariants: only 127.0.0.1; every wait bounded; nothing of the suite is written into the checkout.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.harness.kafka_peer import class_sharing, classpath, java
from scripts.harness.nodeproc import die_with_parent

LIBRDKAFKA_VERSION = "2.15.1"
NPM_PACKAGE = "@confluentinc/kafka-javascript@1.10.1"  # its package.json: "librdkafka": "2.15.1"
TREE_IN_PACKAGE = "package/deps/librdkafka"
CONFIGURE_OPTIONS = ("--disable-ssl", "--disable-gssapi", "--disable-curl", "--disable-zstd", "--disable-lz4-ext",
                     "--enable-zlib", "--disable-syslog")
CACHE = Path(os.environ.get("SHMBROKER_LIBRDKAFKA_CACHE",
                            Path.home() / ".cache" / "shmbroker" / f"librdkafka-{LIBRDKAFKA_VERSION}"))
FETCH_TIMEOUT_S = 600.0
BUILD_TIMEOUT_S = 3600.0  # two busy cores: the library and the test-runner took 10-20 minutes here
BUILD_JOBS = 2
STOP_TIMEOUT_S = 10.0
# The Kafka version the node answers as (its ApiVersions are Kafka 4's): test.c picks protocol paths from it.
BROKER_VERSION = "4.4.0"
# A short-lived tool: C1 alone starts it in a third of the time the tiered JIT takes; no hsperfdata in /tmp.
TOOL_JVM_OPTIONS = ("-Xmx256m", "-XX:-UsePerfData", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                    "-Djava.awt.headless=true")
# The kafka-*.sh scripts the tests call, and the main class each runs (as Kafka 4.4's bin/ scripts do).
TOOL_SCRIPTS = {
    "kafka-topics.sh": "org.apache.kafka.tools.TopicCommand",
    "kafka-acls.sh": "org.apache.kafka.tools.AclCommand",
    "kafka-configs.sh": "org.apache.kafka.tools.ConfigCommand",
    "kafka-consumer-groups.sh": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
}


def _stamp_text() -> str:
    return "\n".join([NPM_PACKAGE, LIBRDKAFKA_VERSION, *CONFIGURE_OPTIONS]) + "\n"


def _stamp_digest() -> str:
    return hashlib.sha256(_stamp_text().encode()).hexdigest()


def source_tree() -> Path:
    return CACHE / "librdkafka"


def _built() -> Path | None:
    runner = source_tree() / "tests" / "test-runner"
    stamp = CACHE / "build.sha256"
    return runner if stamp.exists() and stamp.read_text() == _stamp_digest() and runner.exists() else None


def built_runner(build: bool = True) -> Path:
    """librdkafka's tests/test-runner, fetched and built first when the cache lacks it (or holds another build).
    One build at a time per cache (a lock file): a second caller waits for it and takes its result."""
    if (runner := _built()) is not None:
        return runner
    if not build:
        raise FileNotFoundError(f"librdkafka's test-runner is not in {source_tree()}: python -m "
                                "scripts.harness.librdkafka_suite --build")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _built() or _build()


def _build() -> Path:
    tree = source_tree()
    for command in ("npm", "make", "gcc", "g++"):
        if shutil.which(command) is None:
            raise SystemExit(f"{command} is missing: `make sysdeps` installs it")
    print(f"librdkafka_suite: fetching librdkafka {LIBRDKAFKA_VERSION} ({NPM_PACKAGE}) and building its "
          f"test-runner in {tree} (once)", file=sys.stderr, flush=True)
    staging = CACHE / "build.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    packed = subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(staging), NPM_PACKAGE],
                            capture_output=True, text=True, check=True, timeout=FETCH_TIMEOUT_S)
    tarball = staging / packed.stdout.strip().splitlines()[-1]
    with tarfile.open(tarball) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(TREE_IN_PACKAGE + "/")]
        archive.extractall(staging, members=members, filter="data")
    tarball.unlink()
    built = staging / TREE_IN_PACKAGE
    make = ["make", f"-j{BUILD_JOBS}"]
    for step in (["bash", "./configure", *CONFIGURE_OPTIONS], [*make, "libs"], [*make, "-C", "tests", "test-runner"]):
        done = subprocess.run(step, cwd=built, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"librdkafka build step {' '.join(step)} failed:\n{done.stdout[-3000:]}"
                               f"{done.stderr[-3000:]}")
    for leftover in (*built.rglob("*.o"), *built.rglob("*.a")):  # the runner links the shared libraries
        leftover.unlink()
    shutil.rmtree(tree, ignore_errors=True)
    built.rename(tree)  # whole or not at all
    shutil.rmtree(staging, ignore_errors=True)
    (CACHE / "build.sha256").write_text(_stamp_digest())
    return tree / "tests" / "test-runner"


class KafkaTools:
    """A KAFKA_PATH: bin/kafka-*.sh scripts running Kafka 4.4's tools on kafka_peer's classpath."""

    def __init__(self, directory: Path) -> None:
        self.path = directory
        bin_dir = directory / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        jvm = " ".join(shlex.quote(word) for word in (java(), *TOOL_JVM_OPTIONS, *class_sharing(), "-cp", classpath()))
        for script, main_class in TOOL_SCRIPTS.items():
            target = bin_dir / script
            target.write_text(f'#!/bin/sh\nexec {jvm} {main_class} "$@"\n')
            target.chmod(0o755)


@dataclass
class SuiteRun:
    returncode: int
    output: str
    seconds: float
    states: dict[str, str]  # the test-runner's report: each test's state (PASSED, FAILED, SKIPPED, NOT_STARTED...)

    def states_of(self, test_id: str) -> dict[str, str]:
        """The states of the tests whose name starts with `test_id` (0103: 0103_transactions and its _local)."""
        return {name: state for name, state in self.states.items() if name.startswith(test_id + "_")}


def run_tests(tests: str, bootstrap: str, work_dir: Path, timeout_s: float, kafka_tools: KafkaTools,
              extra_env: dict[str, str] | None = None) -> SuiteRun:
    """librdkafka's test-runner with TESTS=`tests` (ids, comma-separated: run side by side) against `bootstrap`,
    in full mode, in `work_dir`; its output (the runner's and its tools'), exit status and report. Killed, with all
    it started, after `timeout_s`."""
    runner = built_runner()
    tree = source_tree()
    work_dir.mkdir(parents=True, exist_ok=True)
    conf = work_dir / "test.conf"
    conf.write_text(f"bootstrap.servers={bootstrap}\n")
    env = {**os.environ, "TESTS": tests, "BROKERS": bootstrap, "KAFKA_PATH": str(kafka_tools.path),
           "TEST_KAFKA_VERSION": BROKER_VERSION, "RDKAFKA_TEST_CONF": str(conf),
           "LD_LIBRARY_PATH": f"{tree / 'src'}:{tree / 'src-cpp'}", **(extra_env or {})}
    # As on librdkafka's CI, wherever it runs: the client's own timing checks warn (two shared cores stretch them),
    # request timeouts and test timeouts are longer. What the tests check of the broker is unchanged.
    env["CI"] = "true"
    log, report = work_dir / "test-runner.log", work_dir / "report.json"
    env["TEST_REPORT"] = str(report)
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(runner)], cwd=work_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            returncode = -signal.SIGKILL
        finally:
            # The runner's session: it, the shells of its system() calls and their tool JVMs.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)
    states: dict[str, str] = {}
    if report.exists():  # JSON as test.c prints it: a test's free text may break it, its states are read alone
        states = dict(re.findall(r'"name": "(\w+)", "state": "(\w+)"', report.read_text(errors="replace")))
    return SuiteRun(returncode, log.read_text(errors="replace"), time.monotonic() - started, states)


def main() -> None:
    parser = argparse.ArgumentParser(description="librdkafka's test suite: fetch and build its test-runner.")
    parser.add_argument("--build", action="store_true", help="fetch and build (once) and exit")
    parser.parse_args()
    runner = built_runner()
    print(f"librdkafka_suite: librdkafka {LIBRDKAFKA_VERSION}'s test-runner: {runner}", file=sys.stderr)


if __name__ == "__main__":
    main()
