"""Apache Kafka 4.4.0 as the peer of the node: the broker users would pick, run on the same machine for the
benchmarks (scripts/bench_report.py) and as the reference of the differential tests.

- The jars: Kafka's broker (kafka_2.13), its tools (kafka-tools) and their dependencies, copied by Maven from
  scripts/harness/kafka/pom.xml into a cache outside the checkout (KAFKA_CACHE, default
  ~/.cache/shmbroker/kafka-4.4.0; Maven's own repository is ~/.m2) on first use and reused while the pom is
  unchanged (a stamp holds its digest; ``maven_jars`` does it for any pom). `python -m scripts.harness.kafka_peer
  --fetch` does it ahead (`make test` does), for Kafka Connect's jars too (scripts/harness/connect_worker.py).
- ``KafkaPeer``: one KRaft node, broker and controller in one JVM, formatted in a temp dir of its own,
  listening on free 127.0.0.1 ports, with a heap that fits this machine (HEAP_MB). ``start()`` returns once a
  Metadata answer lists the broker (it then takes produces); ``close()`` stops it by its pid (SIGTERM, then
  SIGKILL after STOP_TIMEOUT_S) and removes the temp dir: no process and no file stays. The JVM writes no
  hsperfdata (-XX:-UsePerfData).
- Durability, named in every result: ``durability="page-cache"`` is Kafka's default (an append is in the page
  cache when acknowledged, flushed by the OS); ``"fsync"`` sets log.flush.interval.messages=1, an fsync per
  append, the node's acks=all promise.
- ``tool(main_class, *args)``: a Kafka tool's main class on the same classpath (kafka-producer-perf-test is
  org.apache.kafka.tools.ProducerPerformance, and so on).
- Quick JVMs, for the tests (sparkjob.QUICK_JVMS_ENV): C1 only and Kafka's classes mapped from an archive
  (``class_sharing``); ``program(source)`` runs a single-file Java program compiled once.

Invariants: only 127.0.0.1; every wait is bounded; the JVM dies with the process that started it
(PR_SET_PDEATHSIG) and is stopped by its pid.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from scripts.harness import rawkafka
from scripts.harness.nodeproc import LOOPBACK, api_versions_roundtrip, die_with_parent, free_port
from scripts.harness.sparkjob import quick_jvms

KAFKA_VERSION = "4.4.0"
POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"
KAFKA_CACHE = Path(os.environ.get("SHMBROKER_KAFKA_CACHE",
                                  Path.home() / ".cache" / "shmbroker" / f"kafka-{KAFKA_VERSION}"))
HEAP_MB = 512  # the broker's heap: Kafka's default is 1 GB; a single node with test and benchmark loads needs less
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
FETCH_TIMEOUT_S = 900.0
TOOL_TIMEOUT_S = 600.0
TOOL_OUTPUT_CHARS = 4000  # of a failed tool's stdout and stderr each, in the error
PROBE_INTERVAL_S = 0.1
DURABILITIES = ("page-cache", "fsync")
# Kafka's own kafka-run-class.sh settings (G1, 20 ms pauses, headless), and no hsperfdata files in /tmp.
JVM_OPTIONS = ("-XX:-UsePerfData", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true")
# Where the tests ask for quick JVMs (sparkjob.QUICK_JVMS_ENV): C1 only, and Kafka's classes mapped from the class
# archive (class_sharing). Benchmarks run Kafka as above, and bench_report names the options in its notes when
# they were on.
QUICK_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1",)
# The class archive's own warnings (an archive made by another Java runtime is skipped) go to stdout, where tools
# print their answers: silenced.
CLASS_ARCHIVE_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def jvm_options() -> tuple[str, ...]:
    """JVM_OPTIONS, and QUICK_JVM_OPTIONS with class_sharing() where QUICK_JVMS_ENV asks for them."""
    return JVM_OPTIONS + (QUICK_JVM_OPTIONS + class_sharing() if quick_jvms() else ())
LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""


# --------------------------------------------------------------------------- the jars


def maven_jars(pom: Path, cache: Path, marker: str, fetch: bool = True) -> Path:
    """The directory of the jars `pom` names with their dependencies, copied by Maven into `cache`/lib first when
    missing or made from another version of the pom (`cache`/pom.sha256 holds its digest); `marker` is the glob of a
    jar that must be there."""
    lib = cache / "lib"
    stamp = cache / "pom.sha256"
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest and any(lib.glob(marker)):
        return lib
    if not fetch:
        raise FileNotFoundError(f"the jars of {pom} are not in {lib}: python -m scripts.harness.kafka_peer --fetch")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "fetch.lock", "w") as lock:  # processes that find the jars stale at once fetch them once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == digest and any(lib.glob(marker)):
            return lib
        return _fetch(pom, cache, lib, stamp, digest)


def _fetch(pom: Path, cache: Path, lib: Path, stamp: Path, digest: str) -> Path:
    """maven_jars' fetch, under its lock."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SystemExit("Maven (mvn) is missing: `make sysdeps` installs it (Debian package maven)")
    print(f"kafka_peer: fetching the jars of {pom.relative_to(POM.parents[1])} with Maven into {lib} (once)",
          file=sys.stderr, flush=True)
    staging = cache / "lib.partial"
    shutil.rmtree(staging, ignore_errors=True)
    subprocess.run([mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(pom), "dependency:copy-dependencies",
                    "-DincludeScope=runtime", f"-DoutputDirectory={staging}"], check=True, timeout=FETCH_TIMEOUT_S,
                   stdout=sys.stderr)  # Maven's output is progress: a script's stdout is its results (--json)
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)  # whole or not at all: an interrupted fetch leaves only lib.partial
    stamp.write_text(digest)
    return lib


def jars(fetch: bool = True) -> Path:
    """The directory of Kafka's jars, fetched with Maven first when missing or made from another pom."""
    return maven_jars(POM, KAFKA_CACHE, "kafka_2.13-*.jar", fetch)


def java() -> str:
    """A Java 17+ runtime: the one Spark's harness finds (JAVA_HOME, Debian's 17, or java on PATH)."""
    from scripts.harness import sparkjob

    home = sparkjob.java_home()
    if home is None:
        raise SystemExit("Kafka needs a Java 17+ runtime: `make sysdeps` installs one")
    return str(Path(home) / "bin" / "java")


def classpath() -> str:
    return f"{jars()}/*"


# -- quick JVMs: Kafka's classes shared, the tests' Java programs compiled once -------------------------------------
#
# A JVM spends most of a short life loading and verifying classes: a tool's start took 1.0 s of CPU, a broker's
# start with its format 5.2 s. A dynamic class archive (AppCDS, -XX:ArchiveClassesAtExit), dumped at the end of one
# broker's life, holds those classes ready to map: the same tool then takes 0.5 s, the broker 3.1 s. The archive
# belongs to one Java runtime and one set of jars; a JVM may use it only when its classpath starts with
# classpath() (Connect's does not). `make kafka` dumps it (make_class_archive); until then JVMs run without it.
# The tests' single-file Java programs (tests/java/) are compiled once into the cache too: the source launcher
# compiles a program in every JVM it starts (1.2 s of CPU each).


def _runtime_digest(*parts: bytes) -> str:
    """A digest of the Java runtime, the jars (the pom's digest) and `parts`."""
    pom_digest = (KAFKA_CACHE / "pom.sha256").read_bytes() if (KAFKA_CACHE / "pom.sha256").exists() else b""
    return hashlib.sha256(b"\0".join((os.path.realpath(java()).encode(), pom_digest, *parts))).hexdigest()[:16]


def class_archive() -> Path:
    return KAFKA_CACHE / f"classes-{_runtime_digest()}.jsa"


def class_sharing() -> tuple[str, ...]:
    """The options that map Kafka's classes from the class archive, for a JVM on classpath() (none while there is
    no archive)."""
    archive = class_archive()
    return (f"-XX:SharedArchiveFile={archive}", *CLASS_ARCHIVE_QUIET) if archive.exists() else ()


def make_class_archive() -> Path:
    """The class archive, dumped by a broker that starts, serves a topic's creation, produce and fetch, and
    stops (once per runtime and jars; a second caller finds it made)."""
    archive = class_archive()
    if archive.exists():
        return archive
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    print(f"kafka_peer: dumping Kafka's classes into {archive} (once)", file=sys.stderr, flush=True)
    with KafkaPeer(archive_to=partial) as peer, rawkafka.RawConnection(LOOPBACK, peer.port) as conn:
        conn.call(rawkafka.CREATE_TOPICS, 4, rawkafka.create_topics_body({"class-archive": 1}))
        conn.call(rawkafka.PRODUCE, 8, rawkafka.produce_body({"class-archive": {0: rawkafka.make_batch(10, 100)}}))
        conn.call(rawkafka.FETCH, 11, rawkafka.fetch_body({"class-archive": {0: 0}}, max_wait_ms=0))
    if not partial.exists():
        raise RuntimeError(f"the broker stopped without dumping its classes into {partial}")
    partial.replace(archive)  # whole or not at all
    return archive


def program(source: Path) -> list[str]:
    """`-cp` and the main class that run the single-file Java program `source` (its first class is named after
    the file) on classpath(), compiled once into the cache for this runtime and these jars; the compiled classes
    come after the jars on the classpath, so the class archive serves it too."""
    digest = _runtime_digest(source.read_bytes())
    target = KAFKA_CACHE / "programs" / f"{source.stem}-{digest}"
    if not (target / f"{source.stem}.class").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / ".compile.lock", "w") as lock:  # tests side by side compile it once
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (target / f"{source.stem}.class").exists():
                partial = target.with_suffix(".partial")
                shutil.rmtree(partial, ignore_errors=True)
                # javac as the source launcher runs it: the runtime's own jdk.compiler module (no JDK needed). Its
                # classpath is a program argument here, which no launcher expands: the jars one by one.
                javac = [java(), *JVM_OPTIONS, *QUICK_JVM_OPTIONS, "-m", "jdk.compiler/com.sun.tools.javac.Main"]
                jar_list = os.pathsep.join(str(jar) for jar in sorted(jars().glob("*.jar")))
                done = subprocess.run([*javac, "-nowarn", "-d", str(partial), "-cp", jar_list, str(source)],
                                      capture_output=True, text=True, timeout=TOOL_TIMEOUT_S,
                                      preexec_fn=die_with_parent)
                if done.returncode != 0:
                    raise RuntimeError(f"javac {source} exited {done.returncode}:\n{done.stdout}{done.stderr}")
                partial.rename(target)
    return ["-cp", f"{classpath()}{os.pathsep}{target}", source.stem]


def tool(main_class: str, *args: str, timeout: float = TOOL_TIMEOUT_S, heap_mb: int = 256, check: bool = True,
         stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run one of Kafka's tools (its main class) on the fetched classpath, `stdin` its input; its output
    captured. `check`: a non-zero exit raises RuntimeError with the end of the tool's output (what it said)."""
    done = subprocess.run([java(), f"-Xmx{heap_mb}m", *jvm_options(), "-cp", classpath(), main_class, *args],
                          capture_output=True, text=True, timeout=timeout, input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL, preexec_fn=die_with_parent)
    if check and done.returncode != 0:
        raise RuntimeError(f"{main_class} {' '.join(args)} exited {done.returncode}:\n"
                           f"{done.stdout[-TOOL_OUTPUT_CHARS:]}{done.stderr[-TOOL_OUTPUT_CHARS:]}")
    return done


class ToolRunner:
    """Kafka's tools run one after another in one JVM (kafka/ToolRunner.java): `run` answers as `tool` does, for a
    tool that reads no standard input, without a JVM start per run (the shutdown hooks a tool adds run when it
    returns, as at the end of a JVM of its own). Close it (or use it as a context manager): its
    JVM is stopped by pid."""

    SOURCE = Path(__file__).resolve().parent / "kafka" / "ToolRunner.java"

    def __init__(self, heap_mb: int = 256) -> None:
        self.errors = tempfile.TemporaryFile()  # the JVM's own (a tool's error is captured with its output)
        # java.lang opened to the runner: it finds the shutdown hooks a tool added (ToolRunner.java).
        self.proc = subprocess.Popen([java(), f"-Xmx{heap_mb}m", *jvm_options(), "--add-opens",
                                      "java.base/java.lang=ALL-UNNAMED", *program(self.SOURCE)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
                                     preexec_fn=die_with_parent)

    def run(self, main_class: str, *args: str, timeout: float = TOOL_TIMEOUT_S,
            check: bool = True) -> subprocess.CompletedProcess:
        words = [main_class, *args]
        if any(ch in word for word in words for ch in "\t\n"):
            raise ValueError(f"a tab or line break in {words}")
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(("\t".join(words) + "\n").encode())
        self.proc.stdin.flush()
        answer: list[Any] = []
        reader = threading.Thread(target=lambda: answer.append(self._answer()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not answer:
            self.close()
            raise subprocess.TimeoutExpired([main_class, *args], timeout)
        status, out, err = answer[0]
        done = subprocess.CompletedProcess([main_class, *args], status, out, err)
        if check:
            done.check_returncode()
        return done

    def _answer(self) -> tuple[int, str, str]:
        assert self.proc.stdout is not None
        head = self.proc.stdout.readline().decode()
        if not head.startswith("EXIT "):
            self.errors.seek(0)
            raise RuntimeError(f"the tool runner ended: {head!r} {self.errors.read().decode()[-3000:]}")
        status, out_bytes, err_bytes = (int(word) for word in head.split()[1:])
        return status, self.proc.stdout.read(out_bytes).decode(), self.proc.stdout.read(err_bytes).decode()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        for stream in (self.proc.stdin, self.proc.stdout, self.errors):
            if stream is not None:
                stream.close()

    def __enter__(self) -> "ToolRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------- the broker


def new_cluster_id() -> str:
    """A random cluster id as Kafka's Uuid.randomUuid() makes one: URL-safe base64 of 16 random bytes, never
    starting with "-" (the storage tool's argument parser would take such an id for an option)."""
    while (cluster_id := base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()).startswith("-"):
        pass
    return cluster_id


class KafkaPeer:
    """One Apache Kafka node (KRaft, broker and controller in one JVM) on free loopback ports."""

    def __init__(self, durability: str = "page-cache", heap_mb: int = HEAP_MB, partitions: int = 1,
                 settings: dict[str, str] | None = None, archive_to: Path | None = None) -> None:
        """archive_to: the broker dumps the classes it loaded there as it stops (make_class_archive)."""
        if durability not in DURABILITIES:
            raise ValueError(f"durability: one of {DURABILITIES}, got {durability!r}")
        self.durability = durability
        self.heap_mb = heap_mb
        self.partitions = partitions
        self.settings = dict(settings or {})
        self.archive_to = archive_to
        self.port = 0
        self.work: Path | None = None
        self.proc: subprocess.Popen | None = None
        # Start-up, in seconds: formatting the storage (a JVM of its own), then from launching the broker until its
        # first ApiVersions answer and until a Metadata answer lists it (it takes produces from then on).
        self.format_s: float | None = None
        self.first_answer_s: float | None = None
        self.serving_s: float | None = None

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        assert self.work is not None
        return self.work / "server.log"

    def properties(self, controller_port: int) -> dict[str, str]:
        assert self.work is not None
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{LOOPBACK}:{controller_port}",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.work / "logs"),
            "num.partitions": str(self.partitions),
            # One node: every internal topic with one replica.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        if self.durability == "fsync":
            settings["log.flush.interval.messages"] = "1"
        settings.update(self.settings)
        return settings

    def start(self) -> "KafkaPeer":
        self.work = Path(tempfile.mkdtemp(prefix="shmbroker-kafka-"))
        self.port = free_port()
        controller_port = free_port()
        while controller_port == self.port:
            controller_port = free_port()
        config = self.work / "server.properties"
        config.write_text("".join(f"{key}={value}\n" for key, value in self.properties(controller_port).items()))
        log4j = self.work / "log4j2.properties"
        log4j.write_text(LOG4J2.format(path=self.log_path, level="INFO"))
        options = (*JVM_OPTIONS, *QUICK_JVM_OPTIONS) if self.archive_to else jvm_options()
        dump = (f"-XX:ArchiveClassesAtExit={self.archive_to}",) if self.archive_to else ()
        jvm = [java(), f"-Xms{self.heap_mb // 2}m", f"-Xmx{self.heap_mb}m", *options,
               f"-Dlog4j2.configurationFile={log4j}", f"-Dkafka.logs.dir={self.work}", "-cp", classpath()]
        cluster_id = new_cluster_id()
        started = time.monotonic()
        formatted = subprocess.run([*jvm, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)],
                                   capture_output=True, text=True, timeout=START_TIMEOUT_S, preexec_fn=die_with_parent)
        if formatted.returncode != 0:
            self.close()
            raise RuntimeError(f"kafka storage format failed: {formatted.stdout[-2000:]}{formatted.stderr[-2000:]}")
        self.format_s = time.monotonic() - started
        with open(self.work / "stdout.log", "wb") as out:
            self.proc = subprocess.Popen([jvm[0], *dump, *jvm[1:], "kafka.Kafka", str(config)], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        try:
            self._wait_serving()
        except BaseException:
            self.close()
            raise
        print(f"kafka_peer: Kafka {KAFKA_VERSION} pid {self.proc.pid} on {self.bootstrap} ({self.durability})",
              file=sys.stderr, flush=True)
        return self

    def _wait_serving(self) -> None:
        """Until a Metadata answer lists this broker: before that, the broker is fenced and refuses produces."""
        assert self.proc is not None
        launched = time.monotonic()
        deadline = launched + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kafka exited with {self.proc.returncode}:\n{self.log()}")
            if self.first_answer_s is None and api_versions_roundtrip(self.port, timeout=1.0):
                self.first_answer_s = time.monotonic() - launched
            if self.first_answer_s is not None and self._brokers() > 0:
                self.serving_s = time.monotonic() - launched
                return
            time.sleep(PROBE_INTERVAL_S)
        raise RuntimeError(f"kafka did not serve in {START_TIMEOUT_S}s:\n{self.log()}")

    def _brokers(self) -> int:
        try:
            with rawkafka.RawConnection(LOOPBACK, self.port, timeout_s=2.0) as conn:
                answer = conn.call(rawkafka.METADATA, 8, rawkafka.metadata_body([], version=8))
            return len(answer.brokers)
        except (OSError, rawkafka.RawProtocolError):
            return 0

    def log(self, chars: int = 6000) -> str:
        text = ""
        for path in (self.work / "stdout.log", self.log_path) if self.work else ():
            with contextlib.suppress(OSError):
                text += path.read_text(errors="replace")[-chars:]
        return text

    def processes(self) -> list[psutil.Process]:
        """The JVM (and anything it started), for CPU and memory accounting."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        return []

    def close(self) -> None:
        """Stop the JVM by its pid (SIGTERM: Kafka's controlled shutdown; SIGKILL if it outlasts STOP_TIMEOUT_S)
        and remove the temp dir."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)
            self.work = None

    def __enter__(self) -> "KafkaPeer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="Apache Kafka as the node's peer: fetch its jars, or run one.")
    parser.add_argument("--fetch", action="store_true", help="fetch the jars with Maven (once) and exit")
    parser.add_argument("--durability", choices=DURABILITIES, default="page-cache")
    args = parser.parse_args()
    lib = jars()
    if args.fetch:
        from scripts.harness import connect_worker

        make_class_archive()
        print(f"kafka_peer: Apache Kafka {KAFKA_VERSION} in {lib}, Kafka Connect {connect_worker.CONNECT_VERSION} in "
              f"{connect_worker.jars()}", file=sys.stderr)
        return
    with KafkaPeer(args.durability) as peer:
        print(f"Kafka on {peer.bootstrap}; Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            peer.proc.wait()


if __name__ == "__main__":
    main()
