"""The Spark tests' one SparkSession (per test session): local[2], loopback only, no UI, JVM options for a
fast start, small shuffles, its scratch space in a pytest temp dir; at the end the session stops, the JVM
and its Python workers exit (scripts/harness/sparkjob.py) and the scratch dir is removed."""

from __future__ import annotations

import shutil

import psutil
import pytest

from scripts.harness import sparkjob


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("spark")
    family: list[psutil.Process] = []
    try:
        with sparkjob.spark_session("local[2]", scratch, app_name="shmbroker-tests", fast_start=True,
                                    conf={"spark.sql.shuffle.partitions": "2",
                                          "spark.default.parallelism": "2"}) as session:
            jvm = psutil.Process(session.sparkContext._gateway.proc.pid)
            family.append(jvm)
            yield session
            family.extend(jvm.children(recursive=True))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # The JVM and every Python worker it started are gone.
    assert [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
