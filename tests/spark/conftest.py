"""The Spark tests' one SparkSession (per test session): local[2], loopback only, no UI, JVM options for a
fast start, its scratch space in a pytest temp dir; at the end the session stops, the JVM exits (its
stdin closes, then it is waited for, and killed by pid only if it hangs) and nothing of it is left."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import subprocess
import sys

import psutil
import pytest

JVM_EXIT_TIMEOUT_S = 60.0
# Fast start for short test jobs: the C1 compiler only, serial GC, class data sharing; no hsperfdata in /tmp.
FAST_START_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto -XX:-UsePerfData"


def java_home() -> str | None:
    """A Java 17+ home for Spark: JAVA_HOME, the java on PATH, or Debian's Java 17 (make test installs it)."""
    def version_of(java: str) -> int:
        try:
            out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
        except OSError:
            return 0
        found = re.search(r'version "(\d+)', out)
        return int(found.group(1)) if found else 0

    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(os.path.join(os.environ["JAVA_HOME"], "bin", "java"))
    if shutil.which("java"):
        candidates.append(os.path.realpath(shutil.which("java")))
    candidates += sorted(glob.glob("/usr/lib/jvm/java-*-openjdk-*/bin/java"))
    for java in candidates:
        if version_of(java) >= 17:
            return os.path.dirname(os.path.dirname(java))
    return None


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    home = java_home()
    assert home, "Spark needs a Java 17+ runtime: `make test` installs Debian's openjdk-17-jre-headless"
    scratch = tmp_path_factory.mktemp("spark")
    (scratch / "jvm-tmp").mkdir()
    saved = {k: os.environ.get(k) for k in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "JAVA_HOME")}
    os.environ.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                      JAVA_HOME=home)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("shmbroker-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.local.dir", str(scratch / "local"))
               .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
               .config("spark.driver.extraJavaOptions",
                       f"{FAST_START_JVM_OPTIONS} -Djava.io.tmpdir={scratch / 'jvm-tmp'}")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    gateway = SparkContext._gateway
    jvm = psutil.Process(gateway.proc.pid)
    try:
        yield session
    finally:
        family = [jvm] + jvm.children(recursive=True)
        session.stop()
        with contextlib.suppress(Exception):
            gateway.shutdown()
        gateway.proc.stdin.close()  # the JVM exits when its stdin closes
        try:
            gateway.proc.wait(timeout=JVM_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            jvm.kill()
            gateway.proc.wait(timeout=JVM_EXIT_TIMEOUT_S)
        _, alive = psutil.wait_procs(family, timeout=JVM_EXIT_TIMEOUT_S)
        for process in alive:  # Python workers that outlived the JVM: by pid
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(alive, timeout=JVM_EXIT_TIMEOUT_S)
        SparkContext._gateway = None
        SparkContext._jvm = None
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(scratch, ignore_errors=True)
        assert not alive, f"processes of the Spark JVM outlived it: {alive}"
