"""A user's own Spark job, run as a user runs it: the venv's Python on a script of its own, the venv not
activated, no PYTHONPATH, its own SparkSession (local[1], loopback only), reading records a real node got
from librdkafka through `spark.read.format("shmbroker")`.

- From a directory outside the checkout, with PYSPARK_PYTHON the venv's Python, Spark's Python worker
  finds the source by itself (pkgutil over sys.path: the install must be path-based) and the rows come
  back.

Invariants of every run: the job's JVM and the Python workers it started are gone afterwards (checked by
pid, killed by pid only if they outlive the job); the job's TMPDIR is left empty.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from spark_testing import create_topic, produce

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import sparkjob  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = sys.executable  # the tests run with the venv's Python (make test)
JOB_TIMEOUT_S = 180.0
EXIT_TIMEOUT_S = 60.0

# The user's job. It prints one JSON line (the rows, or the error the read raised), then waits for a line on
# stdin before it stops Spark, so the test can list the JVM and its Python workers while they run.
USER_JOB = """\
import json
import sys

from pyspark.sql import SparkSession

bootstrap, topic, scratch = sys.argv[1:]


def hex_or_none(data):
    return None if data is None else bytes(data).hex()


spark = (SparkSession.builder.master("local[1]").appName("user-job")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.memory", "512m")
         .config("spark.local.dir", scratch)
         .config("spark.sql.warehouse.dir", scratch + "/warehouse")
         .config("spark.driver.extraJavaOptions", "%(java_options)s -Djava.io.tmpdir=" + scratch)
         .getOrCreate())
try:
    df = (spark.read.format("shmbroker")
          .option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", topic)
          .load())
    rows = [[hex_or_none(r.key), hex_or_none(r.value), r.topic, r.partition, r.offset,
             round(r.timestamp.timestamp() * 1000), r.timestampType] for r in df.collect()]
    print(json.dumps({"rows": rows}), flush=True)
except Exception as error:
    print(json.dumps({"error": str(error)}), flush=True)
sys.stdin.readline()
spark.stop()
""" % {"java_options": f"{sparkjob.FAST_START_JVM_OPTIONS} {sparkjob.JVM_OPTIONS}"}


def user_env(temp: Path, **settings: str) -> dict[str, str]:
    """A user's shell: no PYTHONPATH, no venv activated (its bin not on PATH), no Spark settings of the test
    session's own SparkSession; then Java 17, loopback only, and `settings`."""
    venv_bin = str(Path(VENV_PYTHON).parent)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith(("PYSPARK_", "SPARK_"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    home = sparkjob.java_home()
    assert home is not None, "Spark needs a Java 17+ runtime: make sysdeps installs one"
    env.update(JAVA_HOME=home, SPARK_LOCAL_IP="127.0.0.1", SPARK_LAUNCHER_OPTS=sparkjob.JVM_OPTIONS,
               TMPDIR=str(temp), **settings)
    return env


def run_user_job(tmp_path: Path, bootstrap: str, topic: str, cwd: Path, **settings: str) -> dict:
    """Run USER_JOB with the venv's Python from `cwd` in user_env(settings); returns its JSON answer once
    it, its JVM and its Python workers are gone."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    script = job_dir / "user_job.py"
    script.write_text(USER_JOB)
    scratch = tmp_path / "spark-scratch"
    temp = tmp_path / "job-tmp"
    scratch.mkdir()
    temp.mkdir()
    stderr_path = job_dir / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        job = subprocess.Popen([VENV_PYTHON, str(script), bootstrap, topic, str(scratch)], cwd=cwd,
                               env=user_env(temp, **settings), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=stderr, text=True)
    family: list[psutil.Process] = []
    try:
        answer: list[str] = []
        reader = threading.Thread(target=lambda: answer.append(job.stdout.readline()), daemon=True)
        reader.start()
        reader.join(JOB_TIMEOUT_S)
        assert answer and answer[0], f"the job gave no answer:\n{stderr_path.read_text()[-5000:]}"
        # The JVM (spark-submit execs java) and every Python worker it started, while Spark runs.
        family = psutil.Process(job.pid).children(recursive=True)
        names = [p.name() for p in family]
        assert "java" in names, names
        job.stdin.write("\n")
        job.stdin.close()
        assert job.wait(timeout=JOB_TIMEOUT_S) == 0, stderr_path.read_text()[-5000:]
        _, alive = psutil.wait_procs(family, timeout=EXIT_TIMEOUT_S)
        assert [p.pid for p in alive] == [], "processes of the job outlived it"
    finally:
        # By pid: the job, and what it had started (listed now if it never answered).
        if job.poll() is None:
            family += psutil.Process(job.pid).children(recursive=True)
            job.kill()
            job.wait(timeout=EXIT_TIMEOUT_S)
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(family, timeout=EXIT_TIMEOUT_S)
        job.stdout.close()
    assert list(temp.iterdir()) == []
    return json.loads(answer[0])


def as_rows(produced) -> list[list]:
    """What the job prints for each record, ordered by topic, partition and offset as produce() returns them."""
    return [[None if r.key is None else r.key.hex(), None if r.value is None else r.value.hex(), r.topic,
             r.partition, r.offset, r.timestamp_ms, 0] for r in produced]


@pytest.mark.node
def test_a_user_job_outside_the_checkout_finds_the_source_and_reads(node_factory, tmp_path):
    node = node_factory(workers=1)
    create_topic(node.bootstrap, "orders", 2)
    # Keyless records, a tombstone and an empty value among them.
    values = [b"order-%d" % i for i in range(10)]
    values[4], values[7] = None, b""
    produced = produce(node.bootstrap, "orders", [{"key": b"k%d" % i if i % 3 else None, "value": value,
                                                   "partition": i % 2} for i, value in enumerate(values)])
    outside = tmp_path / "home"
    outside.mkdir()
    assert REPO not in outside.parents
    answer = run_user_job(tmp_path, node.bootstrap, "orders", outside, PYSPARK_PYTHON=VENV_PYTHON)
    # A finder-hook editable install: the lookup in Spark's Python worker misses the package, the read
    # fails with DATA_SOURCE_NOT_FOUND.
    assert "error" not in answer, answer["error"][:3000]
    got = sorted(answer["rows"], key=lambda row: (row[2], row[3], row[4]))
    assert got == as_rows(produced)
