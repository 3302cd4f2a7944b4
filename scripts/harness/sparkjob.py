"""A SparkSession for the scripts (bench_spark.py, report_spark.py) and the Spark tests.

``spark_session(master, scratch_dir, ...)`` starts one with the driver on 127.0.0.1, no UI, its scratch
space (spark.local.dir, java.io.tmpdir, the warehouse) under `scratch_dir`, Python workers running this
interpreter, and a Java 17+ runtime found by ``java_home()``; on exit it stops the session and makes sure
the driver JVM and its Python workers are gone (the JVM exits when its stdin closes; it is waited for and
killed by pid only if it hangs).

Invariants:
- Only processes this helper started are ever killed, by pid.
- The environment variables it sets are restored on exit.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

JVM_EXIT_TIMEOUT_S = 60.0
# For short jobs (tests): the C1 compiler only and serial GC start fastest. Benchmarks leave them out, unless
# QUICK_JVMS_ENV is "1": the tests set it (tests/conftest.py), as their JVMs start often and run briefly on small
# loads, where the C2 compiler's threads cost more CPU than they save; a script then says its figures are not the
# JVM's as users run it.
FAST_START_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto"
QUICK_JVMS_ENV = "SHMBROKER_QUICK_JVMS"


def quick_jvms() -> bool:
    return os.environ.get(QUICK_JVMS_ENV) == "1"
# Always: no hsperfdata files in /tmp.
JVM_OPTIONS = "-XX:-UsePerfData"


def java_version(java: str) -> int:
    try:
        out = subprocess.run([java, JVM_OPTIONS, "-version"], capture_output=True, text=True, timeout=30).stderr
    except OSError:
        return 0
    found = re.search(r'version "(\d+)', out)
    return int(found.group(1)) if found else 0


# Set by the tests (tests/conftest.py) for a test marked neither `node` nor `jvm`: every JVM of the harness (Spark,
# Kafka, its tools, the Java programs) finds its Java here, and refuses with the variable's text.
REFUSE_JVMS_ENV = "SHMBROKER_TEST_REFUSES_JVMS"


def java_home() -> str | None:
    """A Java 17+ home for Spark: JAVA_HOME, the java on PATH, or Debian's Java 17 (make test installs it)."""
    if os.environ.get(REFUSE_JVMS_ENV):
        raise RuntimeError(os.environ[REFUSE_JVMS_ENV])
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(os.path.join(os.environ["JAVA_HOME"], "bin", "java"))
    if shutil.which("java"):
        candidates.append(os.path.realpath(shutil.which("java")))
    candidates += sorted(glob.glob("/usr/lib/jvm/java-*-openjdk-*/bin/java"))
    for java in candidates:
        if java_version(java) >= 17:
            return os.path.dirname(os.path.dirname(java))
    return None


@contextlib.contextmanager
def spark_session(master: str, scratch_dir: str | Path, app_name: str = "shmbroker", fast_start: bool | None = None,
                  conf: dict[str, str] | None = None) -> Iterator[Any]:
    """fast_start: FAST_START_JVM_OPTIONS for the driver (None: where QUICK_JVMS_ENV asks for them)."""
    import psutil

    if fast_start is None:
        fast_start = quick_jvms()
    home = java_home()
    if home is None:
        raise SystemExit("Spark needs a Java 17+ runtime: `make test` installs Debian's openjdk-17-jre-headless")
    scratch = Path(scratch_dir)
    (scratch / "jvm-tmp").mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "JAVA_HOME",
                                            "SPARK_LAUNCHER_OPTS")}
    # SPARK_LAUNCHER_OPTS: the JVM spark-submit runs first to build the driver's command line.
    os.environ.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                      JAVA_HOME=home, SPARK_LAUNCHER_OPTS=JVM_OPTIONS)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    java_options = f"{FAST_START_JVM_OPTIONS + ' ' if fast_start else ''}{JVM_OPTIONS} -Djava.io.tmpdir={scratch / 'jvm-tmp'}"
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.log.level", "ERROR")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.local.dir", str(scratch / "local"))
               .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
               .config("spark.driver.extraJavaOptions", java_options))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except BaseException:
        _restore(saved)
        raise
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
        _restore(saved)
        if alive:
            print(f"sparkjob: killed processes that outlived the Spark JVM: {[p.pid for p in alive]}",
                  file=sys.stderr)


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
