"""Kafka Connect and MirrorMaker 2 as real JVMs beside the node, for tests/test_connect.py and
"Moving to a Kafka cluster" (docs/migration.md).

- The jars: connect-runtime, connect-file, connect-mirror and their dependencies, copied by Maven from
  scripts/harness/connect/pom.xml into a cache of their own (KAFKA_CACHE/connect-<version>; the pom says why
  Connect is 4.3.1 beside the 4.4.0 broker), fetched with the broker's by `python -m scripts.harness.kafka_peer
  --fetch` (`make kafka`).
- ``ConnectJvm``: one JVM of that classpath running a main class with a properties file, its log (log4j2) in its
  own directory; stopped by its pid with a real signal: ``stop(signal.SIGTERM)`` is Connect's graceful stop (tasks
  stop, offsets are committed, the member leaves its group), ``stop(signal.SIGKILL)`` a crash.
- ``ConnectWorker``: a distributed worker (org.apache.kafka.connect.cli.ConnectDistributed) whose REST listener is on
  a free 127.0.0.1 port; ``start()`` returns once the REST API's health check answers 200 (the herder joined its
  group and read the config topic); ``rest()`` calls the API.
- ``MirrorMakerProcess``: MirrorMaker 2's dedicated driver (org.apache.kafka.connect.mirror.MirrorMaker), what
  Kafka's bin/connect-mirror-maker.sh runs.

Invariants: only 127.0.0.1; every wait is bounded; a JVM dies with the process that started it
(PR_SET_PDEATHSIG) and is stopped by its pid; nothing is written outside the directory it is given.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from scripts.harness.kafka_peer import KAFKA_CACHE, LOG4J2, POM, java, maven_jars
from scripts.harness.nodeproc import LOOPBACK, die_with_parent, free_port

# Tried again at 4.4.0 with a private Maven repository: connect-file, connect-mirror and connect-mirror-client
# resolve neither at 4.4.0 nor at 4.3.2 (connect-runtime, connect-json and connect-transforms do at 4.4.0); runtime,
# json and transforms 4.4.0 with the 4.3.1 plugins resolve, and then FileStreamSourceConnector,
# FileStreamSinkConnector and MirrorSourceConnector all fail version() with NoClassDefFoundError:
# org/apache/kafka/common/utils/AppInfoParser (moved in 4.4.0's clients). tests/test_connect.py on that classpath:
# the 4.4.0 worker starts and makes its topics on the node, its plugin scan logs that error for every connector,
# and creating the FileStreamSource connector answers HTTP 500 with it. So Connect stays whole at 4.3.1. (This
# note is not in the pom: a change of its bytes makes every cache fetch Connect again.)
CONNECT_VERSION = "4.3.1"
CONNECT_POM = POM.parents[1] / "connect" / "pom.xml"
CONNECT_CACHE = KAFKA_CACHE / f"connect-{CONNECT_VERSION}"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
PROBE_INTERVAL_S = 0.2
REST_TIMEOUT_S = 10.0
# C1 alone and the serial collector: a Connect JVM starts in about half the time on two busy cores; no hsperfdata.
JVM_OPTIONS = ("-Xmx384m", "-XX:-UsePerfData", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
               "-Djava.awt.headless=true")


def jars(fetch: bool = True) -> Path:
    """The directory of Connect's jars (Maven fetches them first when missing or made from another pom)."""
    return maven_jars(CONNECT_POM, CONNECT_CACHE, f"connect-runtime-{CONNECT_VERSION}.jar", fetch)


def properties_text(settings: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in settings.items())


class ConnectJvm:
    """One JVM of Connect's classpath running `main_class` with `properties` (a file), logging into `work`."""

    def __init__(self, main_class: str, properties: Path, work: Path) -> None:
        self.main_class = main_class
        self.properties = properties
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self.log_path = self.work / f"{self.main_class.rsplit('.', 1)[-1]}.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def launch(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        log4j = self.work / "log4j2.properties"
        log4j.write_text(LOG4J2.format(path=self.log_path, level="INFO"))
        with open(self.work / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(
                [java(), *JVM_OPTIONS, f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{jars()}/*", self.main_class,
                 str(self.properties)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        self.starts += 1

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send `sig` to the JVM by its pid and wait for it to exit (SIGKILL if it outlasts STOP_TIMEOUT_S);
        its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        return self.proc.returncode

    def log(self, chars: int = 8000) -> str:
        text = ""
        for path in (self.work / "stdout.log", self.log_path):
            with contextlib.suppress(OSError):
                text += path.read_text(errors="replace")[-chars:]
        return text

    def close(self) -> None:
        if self.alive():
            self.stop(signal.SIGKILL)

    def __enter__(self) -> "ConnectJvm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ConnectWorker(ConnectJvm):
    """A distributed Connect worker: `settings` are its worker properties (bootstrap.servers, group.id, the storage
    topics ...); the REST listener's address is added here and kept over restarts (its worker id)."""

    MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectDistributed"

    def __init__(self, settings: dict[str, str], work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.rest_port = free_port()
        self.settings = {**settings, "listeners": f"http://{LOOPBACK}:{self.rest_port}",
                         "rest.advertised.host.name": LOOPBACK}
        properties = work / "worker.properties"
        properties.write_text(properties_text(self.settings))
        super().__init__(self.MAIN_CLASS, properties, work)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.rest_port}"

    def start(self) -> "ConnectWorker":
        """Launch the JVM; return once GET /health answers 200 (KIP-1017: the herder started, the worker joined its
        group and read its config topic; 503 before)."""
        self.launch()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"the Connect worker exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError, urllib.error.HTTPError, ValueError):
                self.rest("GET", "/health")
                return self
            time.sleep(PROBE_INTERVAL_S)
        raise RuntimeError(f"the Connect worker did not serve in {START_TIMEOUT_S}s:\n{self.log()}")

    def rest(self, method: str, path: str, body: Any = None) -> Any:
        """One call of the REST API; its JSON answer (None when empty). urllib.error.HTTPError on an error status."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=REST_TIMEOUT_S) as answer:
            text = answer.read()
        return json.loads(text) if text else None

    def wait_running(self, connector: str, tasks: int = 1, timeout_s: float = 60.0) -> dict:
        """Until `connector` and its `tasks` tasks are RUNNING; its status. A FAILED one raises with its trace."""
        deadline = time.monotonic() + timeout_s
        status: dict = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(urllib.error.HTTPError, OSError):
                status = self.rest("GET", f"/connectors/{connector}/status")
                states = [status["connector"]["state"], *(task["state"] for task in status["tasks"])]
                if "FAILED" in states:
                    raise AssertionError(f"{connector} failed: {json.dumps(status)[:4000]}")
                if len(status["tasks"]) == tasks and set(states) == {"RUNNING"}:
                    return status
            time.sleep(PROBE_INTERVAL_S)
        raise TimeoutError(f"{connector} not running in {timeout_s}s: {status}\n{self.log()}")


class MirrorMakerProcess(ConnectJvm):
    """MirrorMaker 2's dedicated driver running the clusters and flows of an mm2.properties file."""

    MAIN_CLASS = "org.apache.kafka.connect.mirror.MirrorMaker"

    def __init__(self, properties: Path, work: Path) -> None:
        super().__init__(self.MAIN_CLASS, properties, work)

    def start(self) -> "MirrorMakerProcess":
        self.launch()
        return self
