"""A user's own Spark job, run as a user runs it: the venv's Python on a script of its own, the venv not
activated, no PYTHONPATH, its own SparkSession (local[1], loopback only), reading records a real node got
from librdkafka through `spark.read.format("shmbroker")`.

- From a directory outside the checkout, with PYSPARK_PYTHON the venv's Python, Spark's Python worker
  finds the source by itself (pkgutil over sys.path: the install must be path-based) and the rows come
  back, although the job's folder and that directory hold packages of the user's named node, shm, workers
  and clients.
- Without the venv activated and PYSPARK_PYTHON unset, Spark's Python workers run `python3` on PATH, a
  Python without the connector's dependencies: the read fails with the connector's message naming what is
  missing, that Python and the fix (not Spark's DATA_SOURCE_NOT_FOUND). Every module of the connector
  that needs a dependency fails with that message in such a Python; the package itself imports there, as
  Spark's lookup of data sources needs.

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
import venv
from pathlib import Path

import psutil
import pytest
from spark_testing import create_topic, produce

from scripts.harness import sparkjob
from scripts.harness.nodeproc import free_port, shadowing_folders

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


def run_user_job(tmp_path: Path, bootstrap: str, topic: str, cwd: Path, shadowed: bool = False,
                 **settings: str) -> dict:
    """Run USER_JOB with the venv's Python from `cwd` in user_env(settings); returns its JSON answer once
    it, its JVM and its Python workers are gone. `shadowed`: the job's folder and `cwd` hold the user's own
    packages named like the repository's folders (node, shm, workers, clients), which raise on import."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    if shadowed:
        shadowing_folders(job_dir)
        shadowing_folders(cwd)
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
    # The job and its directory have packages named node, shm, workers and clients of their own: the connector
    # imports the node's (shmbroker.node...), not them.
    answer = run_user_job(tmp_path, node.bootstrap, "orders", outside, shadowed=True, PYSPARK_PYTHON=VENV_PYTHON)
    # A finder-hook editable install: the lookup in Spark's Python worker misses the package, the read
    # fails with DATA_SOURCE_NOT_FOUND.
    assert "error" not in answer, answer["error"][:3000]
    got = sorted(answer["rows"], key=lambda row: (row[2], row[3], row[4]))
    assert got == as_rows(produced)


@pytest.fixture
def bare_python(tmp_path) -> Path:
    """A Python with nothing installed (a venv of the base interpreter, no pip): like the system python3,
    it lacks the connector's dependencies. Its bin holds python and python3."""
    venv.create(tmp_path / "bare", with_pip=False, symlinks=True)
    python = tmp_path / "bare" / "bin" / "python3"
    lacks = subprocess.run([python, "-c", "import kio"], capture_output=True, text=True, timeout=60)
    assert lacks.returncode != 0 and "No module named 'kio'" in lacks.stderr, lacks
    return python


def the_fix() -> str:
    """The PYSPARK_PYTHON the message suggests: the checkout's venv where there is one."""
    checkout_venv = REPO / ".venv" / "bin" / "python"
    return f"PYSPARK_PYTHON={checkout_venv if checkout_venv.exists() else '<venv>/bin/python'}"


def checkout_listing() -> list[str]:
    """The checkout's top level, without what tests run beside this one (pytest-xdist) make there: setuptools'
    build/ and egg-info of `make wheel`, the npm packages of .frameworks/."""
    return sorted(name for name in os.listdir(REPO)
                  if name not in ("build", ".frameworks") and not name.endswith(".egg-info"))


@pytest.mark.jvm  # Spark's own, for the user's job
def test_a_worker_python_without_the_dependencies_fails_saying_how_to_run_spark(tmp_path, bare_python):
    # The user runs the venv's Python on a job in the checkout without activating the venv: `python3` on
    # PATH (here the bare Python) runs Spark's Python workers, and sees the checkout through its cwd.
    # The read fails before it contacts a broker, so none listens on the port.
    listing = checkout_listing()
    path = os.pathsep.join([str(bare_python.parent), os.environ.get("PATH", "")])
    answer = run_user_job(tmp_path, f"127.0.0.1:{free_port()}", "orders", REPO, PATH=path)
    error = answer.get("error", "")
    # Before the connector said what to do: the lookup's import error only in a log warning, and the read
    # failing with DATA_SOURCE_NOT_FOUND.
    assert "DATA_SOURCE_NOT_FOUND" not in error, error[:3000]
    assert "pyspark_shmbroker needs kio, cramjam, crc32c, numpy, pyarrow" in error, error[:3000]
    assert f"which the Python {bare_python} lacks" in error
    assert "activate that venv" in error and the_fix() in error
    assert checkout_listing() == listing  # the job left nothing in the checkout


def test_each_module_needing_a_dependency_names_the_fix_in_a_python_without_them(tmp_path, bare_python):
    # What Spark's workers have on their path: the checkout (cwd or PYTHONPATH) and pyspark's own zips.
    import pyspark

    zips = sorted(str(z) for z in (Path(pyspark.__file__).parent / "python" / "lib").glob("*.zip"))
    assert len(zips) == 2, zips  # pyspark.zip and py4j's
    modules = ("options", "offsets", "records", "producer", "reader", "writer")
    probe = f"""
import json, importlib
import pyspark_shmbroker
out = {{"name": pyspark_shmbroker.DefaultSource.name()}}
for module in {modules!r}:
    try:
        importlib.import_module("pyspark_shmbroker." + module)
        out[module] = None
    except ModuleNotFoundError as error:
        out[module] = [error.name, str(error)]
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *zips])
    done = subprocess.run([bare_python, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]  # the package imports with pyspark alone
    found = json.loads(done.stdout)
    assert found.pop("name") == "shmbroker"
    for module, (name, message) in found.items():
        assert name == "kio", module
        assert message.startswith("pyspark_shmbroker needs kio, cramjam, crc32c, numpy, pyarrow, which the Python "
                                  f"{bare_python} lacks. "), (module, message)
        assert the_fix() in message, (module, message)
