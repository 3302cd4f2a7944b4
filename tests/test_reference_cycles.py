"""The requests of long-lived clients leave no reference cycles in the node's processes.

Reference counting frees what a request built as soon as its response is sent, unless it is in a cycle: then
only a garbage collection frees it, and that collection's pause stalls every request the process holds. With
10,000 KIP-848 members heartbeating every 5 s, the cycles each heartbeat left made a worker's young
collections take 45-86 ms, and the heartbeats' p99 rose from about 10 ms to about 30 ms
(scripts/bench_consumer_groups --workload heartbeat).

Here collections are made frequent (`server.gc_young_threshold`) so that the processes' stats rows count what
they freed (`gc_collected`) while real clients heartbeat, join, sync, commit and fetch offsets, produce and
consume. Each worker and the timer must free at most a small bound of objects per request: one cycle left
per heartbeat is some ten objects each.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from confluent_kafka import Consumer

from tests.test_clients import create_topic, produce
from tests.test_consumer_groups_protocol import CONFIG as CONSUMER_GROUP_CONFIG
from tests.test_consumer_groups_protocol import Member
from scripts.harness.nodeproc import CLI

REPO = Path(__file__).resolve().parent.parent
CONFIG = (CONSUMER_GROUP_CONFIG + "[server]\ngc_young_threshold = 200\n[stats]\npublish_interval_ms = 100\n")
STEADY_HEARTBEATS = 400
CLIENT_SECONDS = 6.0
FREED_PER_REQUEST_MAX = 0.5  # a cycle left by every request frees some ten objects per request


def snapshot(node) -> dict:
    done = subprocess.run([*CLI, "stats", "--data-dir", str(node.data_dir),
                           "--json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def requests_read(document: dict) -> int:
    return sum(api["requests"] for api in document["apis"].values())


def gc_by_process(document: dict) -> dict[tuple, tuple[int, int]]:
    """(role, index) -> (collections, objects freed) of the workers and the timer."""
    return {(p["role"], p["index"]): (sum(p["gc_collections"]), p.get("gc_collected", 0))
            for p in document["processes"] if p["role"] in ("worker", "timer")}


def consume_in_a_group(bootstrap: str, topic: str, protocol: str, seconds: float) -> int:
    """A confluent-kafka consumer of the group protocol `protocol` that commits every 100 ms; records read."""
    config = {"bootstrap.servers": bootstrap, "group.id": f"cycles-{protocol}", "auto.offset.reset": "earliest",
              "group.protocol": protocol, "auto.commit.interval.ms": 100}
    if protocol == "classic":
        config.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 100})
    consumer = Consumer(config)
    consumer.subscribe([topic])
    got, deadline = 0, time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is not None and not msg.error():
                got += 1
    finally:
        consumer.close()
    return got


def test_heartbeats_joins_commits_and_fetches_leave_no_cycles_for_the_collector(node_factory):
    node = node_factory(workers=2, config=CONFIG)
    create_topic(node.bootstrap, "t", 6)
    produce(node.bootstrap, "t", [{"value": b"v%d" % i, "key": b"k%d" % (i % 50)} for i in range(500)])
    member = Member(node, "cycles-raw", "cycles-raw-member")
    try:
        assert int(member.heartbeat().error_code) == 0
        before = snapshot(node)
        for _ in range(STEADY_HEARTBEATS):
            assert int(member.heartbeat().error_code) == 0
        for protocol in ("classic", "consumer"):
            assert consume_in_a_group(node.bootstrap, "t", protocol, CLIENT_SECONDS) == 500
        time.sleep(0.3)  # a publish interval and then some
        after = snapshot(node)
    finally:
        member.close()
    requests = requests_read(after) - requests_read(before)
    assert requests >= STEADY_HEARTBEATS + 100
    gc_before, gc_after = gc_by_process(before), gc_by_process(after)
    collections = {key: gc_after[key][0] - gc_before[key][0] for key in gc_after}
    freed = {key: gc_after[key][1] - gc_before[key][1] for key in gc_after}
    assert collections[("timer", 0)] > 0 and sum(n for (role, _), n in collections.items() if role == "worker") > 0, \
        f"a process ran no collection, so nothing was measured: {collections}"
    for key, objects in freed.items():
        assert objects <= FREED_PER_REQUEST_MAX * requests, (
            f"{key}: {objects} objects freed by {collections[key]} collections over {requests} requests")
