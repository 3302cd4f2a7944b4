"""Client quotas in the live node (KIP-13, KIP-219): real confluent-kafka clients held to their byte rates,
an unlisted client beside them untouched, a fetch quota, both throttling styles at the protocol level,
SIGHUP changing quotas while clients run, and invalid quota configs refused.

How accuracy is judged. Kafka's quota is a rate over its sampled window (window_samples x window_ms, 11 s
here): a new client is judged on at least samples - 1 windows, so it may burst through its first window, and
when those samples expire it may burst again; what the algorithm holds is the bytes per full window. So the
check is the client's bytes over every full window (t - 11 s, t] ending after the first one: their median
within 10% of the quota (a client offering 5x its quota is held to it, and keeps it). The bound above is on
windows of samples - 1 (10 s): the node's own window is always 10 to 11 s long and holds at most 11 s of
quota, so no 10 s hold more than 1.1x plus one request (checked at 1.15x). An 11 s window of the client's
clock has no such bound: it straddles the node's 1 s samples, and an expiring sample's bytes (up to 5 s of
quota here) may be in it twice. Kafka checks a request after admitting it, so one request is the
granularity: the producers use Java's default-sized batches (16 KiB; librdkafka's 1 MB batches are ~9% of an
11 s window at 1 MiB/s).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.harness import rawkafka as R
from tests.test_clients import create_topic
from scripts.harness.nodeproc import CLI

pytestmark = pytest.mark.serial  # see tests/conftest.py: run alone

MIB = 1 << 20
CLIENT = Path(__file__).resolve().parent / "quota_client.py"
JAVA_BATCH_BYTES = 16384
WINDOW_S = 11.0  # window_samples x window_ms of QUOTAS
# How much the unlisted client's median per-second p99 may rise beside the held one (about 2-5 ms alone here).
UNLISTED_P99_SLACK_MS = 20.0
HALF_S_MS = 500  # QUOTAS' samples in the tests that judge a held client over 14 of its windows in 12 s
QUOTAS = f"""
[quotas]
window_samples = 11
window_ms = 1000
[quotas.default]
producer_byte_rate = 0
consumer_byte_rate = 0
[quotas.clients."reporting-job"]
producer_byte_rate = {MIB}
consumer_byte_rate = {2 * MIB}
"""
PRODUCE, FETCH, API_VERSIONS = 0, 1, 18


def start_client(node, tmp_path: Path, mode: str, client_id: str, topic: str, seconds: float, **options) -> tuple:
    out = tmp_path / f"{mode}-{client_id}-{time.monotonic_ns()}.json"
    argv = [sys.executable, str(CLIENT), mode, "--bootstrap", node.bootstrap, "--client-id", client_id,
            "--topic", topic, "--seconds", str(seconds), "--out", str(out)]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return subprocess.Popen(argv), out


def finish(client: tuple, timeout: float = 60) -> dict:
    proc, out = client
    assert proc.wait(timeout=timeout) == 0
    return json.loads(out.read_text())


def run_client(node, tmp_path: Path, mode: str, client_id: str, topic: str, seconds: float, **options) -> dict:
    return finish(start_client(node, tmp_path, mode, client_id, topic, seconds, **options))


def window_rates(events: list, window_s: float, end_s: float, step_s: float = 0.5,
                 first_s: float = WINDOW_S) -> list[float]:
    """Bytes per second over every window (t - window_s, t] for t from the first full window's end (first_s,
    the quota's window) to end_s."""
    rates = []
    t = first_s
    while t <= end_s + 1e-9:
        rates.append(sum(n for at, n in events if t - window_s < at <= t) / window_s)
        t += step_s
    return rates


def assert_held(events: list, seconds: float, quota: float, sample_s: float = WINDOW_S / 11) -> None:
    """Held over the quota's window of 11 samples of sample_s (QUOTAS': 1 s), and over windows a sample shorter."""
    window_s = 11 * sample_s
    rates = window_rates(events, window_s, seconds, first_s=window_s)
    shortest = window_rates(events, window_s - sample_s, seconds, first_s=window_s)
    # The figures, for whoever reads the test's output (pytest -rP): the closing notes quote them.
    print(f"held: median {window_s:g}-s window {statistics.median(rates) / quota:.3f} x quota, "
          f"highest {window_s - sample_s:g}-s window {max(shortest) / quota:.3f} x quota")
    assert abs(statistics.median(rates) - quota) <= 0.10 * quota, [round(r / quota, 3) for r in rates]
    assert max(shortest) <= 1.15 * quota, [round(r / quota, 3) for r in shortest]


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def interval_p99s(run: dict, since: float, start_s: float, end_s: float, interval_s: float) -> list[float]:
    """The p99 latency of each whole interval between start_s and end_s after `since` (time.monotonic()), of the
    intervals with 100 acknowledgements or more."""
    offset = run["start"] - since
    intervals: dict[int, list[float]] = {}
    for (at, _), latency in zip(run["acked"], run["latency_ms"]):
        if start_s <= at + offset < end_s:
            intervals.setdefault(int((at + offset) / interval_s), []).append(latency)
    return [p99(latencies) for latencies in intervals.values() if len(latencies) >= 100]


def test_producer_held_to_its_quota_and_an_unlisted_client_beside_it_is_untouched(node_factory, tmp_path):
    """The unlisted client runs alone, then beside the held one (12 s), then alone again. Its latency is
    judged by the median of its p99s per half second (655 acknowledgements each), alone against beside: this
    2-core machine is shared, and a few noisy intervals would otherwise decide the comparison. QUOTAS with
    samples of 500 ms: a 5.5 s window, so the held client's 12 s judge it over 14 windows (at 1 s samples, 20 s
    for 19 windows of 11 s)."""
    node = node_factory(workers=2, config=QUOTAS.replace("window_ms = 1000", f"window_ms = {HALF_S_MS}"))
    create_topic(node.bootstrap, "held", partitions=1)
    create_topic(node.bootstrap, "free", partitions=1)
    alone_s, held_s, interval_s = 4, 12, HALF_S_MS / 1000
    started = time.monotonic()
    unlisted = start_client(node, tmp_path, "produce", "unlisted", "free", alone_s + held_s + alone_s + 1,
                            rate=MIB // 4, value_bytes=200, linger_ms=1, batch_bytes=JAVA_BATCH_BYTES)
    time.sleep(max(0.0, started + alone_s - time.monotonic()))
    held = finish(start_client(node, tmp_path, "produce", "reporting-job", "held", held_s, rate=5 * MIB,
                               batch_bytes=JAVA_BATCH_BYTES))
    held_end = held["start"] - started + held_s
    unlisted = finish(unlisted)

    assert_held(held["acked"], held["seconds"], MIB, sample_s=interval_s)
    assert max(held["throttle_ms"]) > 0  # librdkafka saw throttle_time_ms in the responses
    # The unlisted client keeps its throughput (all it offered was acknowledged, never throttled) and latency.
    assert sum(n for _, n in unlisted["acked"]) >= 0.97 * unlisted["offered_bytes"]
    assert max(unlisted["throttle_ms"], default=0) == 0
    alone = (interval_p99s(unlisted, started, 1, alone_s, interval_s)
             + interval_p99s(unlisted, started, held_end + 1, held_end + 1 + alone_s, interval_s))
    beside = interval_p99s(unlisted, started, alone_s + 1, held_end, interval_s)
    assert len(alone) >= 12 and len(beside) >= 18
    print(f"unlisted client: median p99 per half second {statistics.median(alone):.2f} ms alone, "
          f"{statistics.median(beside):.2f} ms beside the held one")
    # Throttling holds only the held client's responses: a throttle that held the worker would add its delay to
    # every client there. A ratio bound (1.2x) flaked on a shared 2-vCPU machine (1 run of 3 alone, at 1.3x), so
    # the test bounds the rise, not the ratio.
    assert statistics.median(beside) <= statistics.median(alone) + UNLISTED_P99_SLACK_MS, (beside, alone)


def test_consumer_held_to_its_fetch_quota(node_factory, tmp_path):
    """QUOTAS with samples of 500 ms: a 5.5 s window, so 12 s of reading judge it over 14 windows (at 1 s
    samples it took 20 s for 19 windows of 11 s). A fetch (64 KiB) is 0.6% of a 5 s window at 2 MiB/s."""
    node = node_factory(workers=2, config=QUOTAS.replace("window_ms = 1000", f"window_ms = {HALF_S_MS}"))
    create_topic(node.bootstrap, "backlog", partitions=1)
    # 2 MiB/s for 12 s plus the first window's burst: more than the consumer may read in the run.
    run_client(node, tmp_path, "produce", "loader", "backlog", 3, rate=30 * MIB)
    consumer = run_client(node, tmp_path, "consume", "reporting-job", "backlog", 12,
                          fetch_partition_bytes=4 * JAVA_BATCH_BYTES)
    assert_held(consumer["consumed"], consumer["seconds"], 2 * MIB, sample_s=0.5)
    assert max(consumer["throttle_ms"]) > 0


# -- the two throttling styles (KIP-219), at the protocol level -------------------------------------------

TINY = """
[quotas]
window_samples = 11
window_ms = 100
[quotas.clients."tiny"]
producer_byte_rate = 10000
consumer_byte_rate = 10000
"""
FULL_WINDOW_MS = 1100  # the longest throttle of TINY: its whole window


def produce_version_throttle(node, version: int) -> tuple[float, int, float]:
    """Produce 50 kB as "tiny" (5x its quota over the shortest window): (seconds until the response,
    its throttle_time_ms, seconds until the next request on the connection is answered)."""
    with R.RawConnection("127.0.0.1", node.port, client_id="tiny") as conn:
        conn.call(API_VERSIONS, 3, R.api_versions_body(3))
        body = R.produce_body({"tiny": {0: R.make_batch(50, 1000)}})
        started = time.monotonic()
        response = conn.call(PRODUCE, version, body)
        answered = time.monotonic() - started
        assert response.responses[0].partition_responses[0].error_code == 0
        started = time.monotonic()
        conn.call(API_VERSIONS, 3, R.api_versions_body(3))
        return answered, response.throttle_time.total_seconds() * 1000, time.monotonic() - started


def test_old_produce_versions_get_their_response_held_new_ones_a_muted_connection(node_factory):
    node = node_factory(workers=1, config=TINY)
    create_topic(node.bootstrap, "tiny", partitions=1)
    answered, throttle_ms, next_answered = produce_version_throttle(node, 5)
    assert throttle_ms == FULL_WINDOW_MS
    assert answered >= 0.9 * FULL_WINDOW_MS / 1000 and next_answered < 0.5
    time.sleep(2 * FULL_WINDOW_MS / 1000)  # the rate falls back under the quota
    answered, throttle_ms, next_answered = produce_version_throttle(node, 8)
    assert throttle_ms > 0
    assert answered < 0.5 and next_answered >= 0.9 * throttle_ms / 1000


@pytest.mark.parametrize("version", [4, 11])
def test_a_throttled_fetch_has_no_records_and_waits_its_throttle(node_factory, version):
    node = node_factory(workers=1, config=TINY)
    create_topic(node.bootstrap, "tiny", partitions=1)
    with R.RawConnection("127.0.0.1", node.port, client_id="loader") as conn:
        conn.call(PRODUCE, 8, R.produce_body({"tiny": {0: R.make_batch(50, 1000)}}))
    with R.RawConnection("127.0.0.1", node.port, client_id="tiny") as conn:
        fetch = R.fetch_body({"tiny": {0: 0}}, max_wait_ms=0, version=version)
        first = R.parse_fetch_response(version, conn.request(FETCH, version, fetch))
        assert first.record_count > 0  # within quota when asked: charged 50 kB, 5x the quota
        started = time.monotonic()
        second = R.parse_fetch_response(version, conn.request(FETCH, version, fetch))
        answered = time.monotonic() - started
        assert second.record_count == 0 and second.throttle_time_ms > 0
        started = time.monotonic()
        conn.call(API_VERSIONS, 3, R.api_versions_body(3))
        next_answered = time.monotonic() - started
    if version >= 8:
        assert answered < 0.5 and next_answered >= 0.9 * second.throttle_time_ms / 1000
    else:
        assert answered >= 0.9 * second.throttle_time_ms / 1000 and next_answered < 0.5


# -- configuration ----------------------------------------------------------------------------------------

def acked_rate(run: dict, since: float, start_s: float, end_s: float) -> float:
    """Bytes per second acknowledged between start_s and end_s after `since` (time.monotonic(), a clock the
    client process shares)."""
    offset = run["start"] - since
    return sum(n for at, n in run["acked"] if start_s < at + offset <= end_s) / (end_s - start_s)


def test_sighup_changes_quotas_while_clients_run(node_factory, tmp_path):
    quota = MIB // 2
    limited = f"""
[quotas]
window_samples = 11
window_ms = 100
[quotas.clients."reporting-job"]
producer_byte_rate = {quota}
"""
    node = node_factory(workers=2, config=limited)
    create_topic(node.bootstrap, "changing", partitions=1)
    client = start_client(node, tmp_path, "produce", "reporting-job", "changing", 16, rate=4 * quota,
                          batch_bytes=JAVA_BATCH_BYTES)
    started = time.monotonic()

    def reload_at(offset_s: float, config: str) -> None:
        time.sleep(max(0.0, started + offset_s - time.monotonic()))
        node.config_path.write_text(config)
        os.kill(node.proc.pid, signal.SIGHUP)

    # Each limited phase is judged over several of its 1.1-s windows: a throttle may take up to a whole window
    # (Kafka's sawtooth), so one second of a phase can fall to a fraction of the quota and the next catch up.
    # Each phase is judged over 3-4 s, 3 windows or more.
    reload_at(6, limited.replace(f"producer_byte_rate = {quota}", "producer_byte_rate = 0"))
    reload_at(8.5, limited.replace(f"producer_byte_rate = {quota}", "producer_byte_rate = -1"))  # refused
    reload_at(10, limited)
    run = finish(client)
    assert "quotas.clients.reporting-job.producer_byte_rate: must be 0 (unlimited)" in node.log()
    per_second = [round(acked_rate(run, started, second, second + 1) / quota, 2) for second in range(16)]
    assert abs(acked_rate(run, started, 2, 6) - quota) <= 0.15 * quota, per_second  # limited
    # Unlimited: what it offers (4x) and more (its backlog); the refused file changed nothing.
    assert acked_rate(run, started, 7, 10) >= 3.5 * quota, per_second
    assert abs(acked_rate(run, started, 12, 16) - quota) <= 0.15 * quota, per_second  # limited again
    assert node.alive()


@pytest.mark.parametrize("body, message", [
    ('[quotas.clients."reporting-job"]\nproducer_byte_rate = -5\n',
     "quotas.clients.reporting-job.producer_byte_rate: must be 0 (unlimited) or a positive byte rate, got -5"),
    ('[quotas.clients."reporting-job"]\nproducer_byte_rte = 5\n',
     "unknown setting quotas.clients.reporting-job.producer_byte_rte"),
    ("[quotas]\nwindow_samples = 1\n", "quotas.window_samples: must be at least 2, got 1"),
    ('[quotas.default]\nconsumer_byte_rate = "fast"\n', "quotas.default.consumer_byte_rate must be int, got 'fast'"),
    ("[quotas.clients]\nreporting-job = 5\n", "quotas.clients.reporting-job must be a table"),
])
def test_an_invalid_quota_config_is_refused_with_file_key_and_reason(tmp_path, body, message):
    config = tmp_path / "bad.toml"
    config.write_text(body)
    result = subprocess.run([*CLI, "serve", "--config", str(config), "--listen",
                             "127.0.0.1:1", "--data-dir", str(tmp_path / "data")],
                            capture_output=True, text=True, timeout=30, cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode != 0
    assert f"{config}:2: {message}" in result.stdout + result.stderr  # file:line: key: reason
    assert not (tmp_path / "data").exists()


def test_idle_client_ids_are_forgotten_and_come_back_afresh(node_factory):
    """Clients that come and go do not grow the timer's memory: a client id idle for idle_client_expiry_ms is
    dropped from the quota manager (the stats say how many it measures and how many it forgot)."""
    from confluent_kafka import Producer

    from tests.test_stats_cli import stats_json

    node = node_factory(workers=1, config="[stats]\npublish_interval_ms = 100\n[quotas]\nidle_client_expiry_ms = 1500\n"
                                          f"[quotas.default]\nproducer_byte_rate = {10 * MIB}\n")
    create_topic(node.bootstrap, "visits", partitions=1)

    def visit(client_id: str) -> None:
        producer = Producer({"bootstrap.servers": node.bootstrap, "client.id": client_id, "linger.ms": 0})
        for _ in range(5):
            producer.produce("visits", value=b"v" * 100)
        assert producer.flush(30) == 0

    def totals_when(condition, what: str) -> dict:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            totals = stats_json(node)["totals"]
            if condition(totals):
                return totals
            time.sleep(0.2)
        raise AssertionError(f"no {what} in 30 s: {totals}")

    for i in range(5):
        visit(f"visitor-{i}")
    totals_when(lambda t: t["quota_clients"] == 5, "5 measured clients")
    totals = totals_when(lambda t: t["quota_clients"] == 0, "expiry of the idle clients")
    assert totals["quota_clients_expired"] == 5
    visit("visitor-0")  # back: measured afresh
    totals = totals_when(lambda t: t["quota_clients"] == 1, "the returning client")
    assert totals["quota_clients_expired"] == 5
