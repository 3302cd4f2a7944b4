"""Consumer-protocol groups (KIP-848) in the live node, with raw-protocol members multiplexed over a few
connections (the coordinator does not tie members to connections), the load generator on the same cores as the
node.

Workloads (each one JSON line with --json, and a table):
- heartbeat: --members members in groups of --group-size join (ConsumerGroupHeartbeat at epoch 0) and reconcile
  until every group is Stable, then each heartbeats once per --heartbeat-ms at its own phase for --seconds, as a
  settled client does (no changed fields). Reported: heartbeat response p50/p99/p99.9, heartbeats/s, members
  answered an error (must be 0), node CPU by role. Target: 10,000 members every 5 s, p99 <= 5 ms.
- rebalance: a Stable group of --rebalance-members; one member joins; the time from its join until every member
  is at the new epoch with its whole target (revocations acknowledged, the newcomer holding its partitions).
  Members heartbeat at the interval of their last answer, as librdkafka and the Java client do: the node's
  --rebalance-heartbeat-ms, or --rebalance-unreleased-heartbeat-ms while a member waits for partitions another
  still holds (0: the node's shortening off, as Kafka); and at once after their assignment changed, as
  librdkafka does. Settled members heartbeat at their own phases. --rebalance-rounds rounds (the newcomer leaves
  between them). Beside it the classic protocol's rebalance of a group of the same size (scripts.bench_groups),
  in the same run. Target: <= 100 ms.

Only 127.0.0.1; every phase is bounded in time. Usage:
    .venv/bin/python -m scripts.bench_consumer_groups [--workload heartbeat|rebalance ...] [--json]
"""

from __future__ import annotations

import argparse
import argparse as _argparse
import random
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from kio.static.primitive import i32

from scripts import bench_groups
from scripts.bench_groups import Conn, Mux
from scripts.harness import benchnode
from scripts.harness import rawkafka as R
from scripts.harness.rawkafka import millis as ms, request_body as kio_body, request_entity as nested
from shmbroker.workers.codecs import protocol as P

SCRIPT = "bench_consumer_groups"
WORKLOADS = ("heartbeat", "rebalance")
HB, HB_V = P.CONSUMER_GROUP_HEARTBEAT, 1
TOPIC = "bench-consumer-groups"
SETUP_WINDOW = 500  # heartbeats in flight while groups form
_ERROR = struct.Struct(">h")  # after the response header's tagged fields (1 byte) and throttle_time (4 bytes)


@dataclass
class Member:
    group: str
    member_id: str
    conn: Conn
    epoch: int = 0
    owned: dict = field(default_factory=dict)  # topic id -> partitions, as the node last assigned them
    error: int = 0
    in_flight: bool = False
    changed_ns: int = 0  # when its assignment last changed
    interval_s: float = 0.0  # the heartbeat interval of its last answer


def progress(line: str) -> None:
    print(f"{SCRIPT}: {line}", file=sys.stderr, flush=True)


class Driver:
    """Sends members' heartbeats and applies the answers."""

    def __init__(self, mux: Mux, rebalance_timeout_ms: int) -> None:
        self.mux, self.rebalance_timeout_ms = mux, rebalance_timeout_ms

    def heartbeat(self, member: Member, then: Callable[[Member, bool], None] | None = None, leave: bool = False) -> None:
        joining = member.epoch == 0
        owned = () if joining else tuple(
            nested(HB, HB_V, "TopicPartitions", topic_id=topic, partitions=tuple(map(i32, sorted(parts))))
            for topic, parts in sorted(member.owned.items()))
        body = kio_body(HB, HB_V, "ConsumerGroupHeartbeatRequest", group_id=member.group, member_id=member.member_id,
                        member_epoch=i32(-1 if leave else member.epoch), instance_id=None, rack_id=None,
                        rebalance_timeout=ms(self.rebalance_timeout_ms if joining else -1),
                        subscribed_topic_names=(TOPIC,) if joining else None, server_assignor=None,
                        topic_partitions=owned)
        member.in_flight = True

        def answered(response_body: bytes, received_ns: int) -> None:
            member.in_flight = False
            response = R.decode_response(HB, HB_V, response_body)
            member.error = int(response.error_code)
            changed = False
            if not member.error and not leave:
                member.epoch = int(response.member_epoch)
                member.interval_s = response.heartbeat_interval.total_seconds()
                if response.assignment is not None:
                    owned_now = {t.topic_id: set(map(int, t.partitions)) for t in response.assignment.topic_partitions}
                    changed = owned_now != member.owned
                    member.owned = owned_now
                    if changed:
                        member.changed_ns = received_ns
            if then is not None:
                then(member, changed)

        self.mux.send(member.conn, HB, HB_V, body, answered)

    def acknowledging_frame(self, member: Member) -> bytearray:
        """A member's heartbeat after its assignment or epoch changed: its epoch and what it now owns."""
        owned = tuple(nested(HB, HB_V, "TopicPartitions", topic_id=topic, partitions=tuple(map(i32, sorted(parts))))
                      for topic, parts in sorted(member.owned.items()))
        body = kio_body(HB, HB_V, "ConsumerGroupHeartbeatRequest", group_id=member.group, member_id=member.member_id,
                        member_epoch=i32(member.epoch), instance_id=None, rack_id=None, rebalance_timeout=ms(-1),
                        subscribed_topic_names=None, server_assignor=None, topic_partitions=owned)
        return bytearray(R.encode_request(HB, HB_V, 0, body))

    def steady_frame(self, member: Member) -> bytearray:
        """A settled member's heartbeat: its epoch, nothing changed (null fields)."""
        body = kio_body(HB, HB_V, "ConsumerGroupHeartbeatRequest", group_id=member.group, member_id=member.member_id,
                        member_epoch=i32(member.epoch), instance_id=None, rack_id=None, rebalance_timeout=ms(-1),
                        subscribed_topic_names=None, server_assignor=None, topic_partitions=None)
        return bytearray(R.encode_request(HB, HB_V, 0, body))


def settled(members: list[Member], partitions: int) -> bool:
    epochs = {m.epoch for m in members}
    held = [p for m in members for parts in m.owned.values() for p in parts]
    return len(epochs) == 1 and len(held) == partitions == len(set(held))


def settle(driver: Driver, groups: list[list[Member]], partitions: int, timeout_s: float) -> None:
    """Heartbeat every member in rounds (each acknowledging what it owns) until every group is Stable."""
    deadline = time.monotonic() + timeout_s
    rounds = 0
    while not all(settled(g, partitions) for g in groups):
        rounds += 1
        if time.monotonic() > deadline:
            raise RuntimeError("groups did not settle")
        for group in groups:  # at most SETUP_WINDOW in flight: a burst of joins is not what is measured
            for member in group:
                driver.mux.run_until(lambda: driver.mux.pending() < SETUP_WINDOW, timeout_s, "heartbeat answers")
                driver.heartbeat(member)
        driver.mux.run_until(lambda: driver.mux.pending() == 0, timeout_s, "heartbeat answers")
        errors = {m.error for g in groups for m in g if m.error}
        if errors:
            raise RuntimeError(f"round {rounds}: members answered errors {sorted(errors)}")


def run_heartbeat(args, target, server_cpu_s: Callable[[], float] | None = None) -> dict:
    """`server_cpu_s()`, if given, the server's CPU seconds so far: the row gets what it spent while the members
    heartbeat (server_cpu_s)."""
    mux = Mux(target.host, target.port, args.connections)
    driver = Driver(mux, args.rebalance_timeout_ms)
    try:
        count = args.members // args.group_size
        groups = [[Member(f"hb-{g}", f"hb-{g}-{i}", mux.conns[(g * args.group_size + i) % len(mux.conns)])
                   for i in range(args.group_size)] for g in range(count)]
        progress(f"{count} groups of {args.group_size} joining and settling")
        started = time.monotonic()
        settle(driver, groups, args.partitions, args.setup_timeout_s)
        progress(f"settled in {time.monotonic() - started:.1f} s")
        members = [m for g in groups for m in g]
        steady = [driver.steady_frame(m) for m in members]
        frames = list(steady)  # each member's next heartbeat: steady, or acknowledging a new assignment
        latencies: list[int] = []
        bad: set[int] = set()
        error_codes: dict[int, int] = {}

        def answered(index: int, sent_ns: int) -> Callable:
            def callback(body: bytes, received_ns: int) -> None:
                latencies.append(received_ns - sent_ns)
                if code := _ERROR.unpack_from(body, 5)[0]:
                    bad.add(index)
                    error_codes[code] = error_codes.get(code, 0) + 1
                    return
                # As a client: a new epoch or assignment (Kafka may move a settled group to a new epoch when its
                # target assignment is computed again) is taken, and acknowledged by the next heartbeat.
                member, response = members[index], R.decode_response(HB, HB_V, body)
                if int(response.member_epoch) != member.epoch or response.assignment is not None:
                    member.epoch = int(response.member_epoch)
                    if response.assignment is not None:
                        member.owned = {t.topic_id: set(map(int, t.partitions))
                                        for t in response.assignment.topic_partitions}
                    frames[index] = driver.acknowledging_frame(member)
                    steady[index] = driver.steady_frame(member)
                else:
                    frames[index] = steady[index]
            return callback

        def send(index: int) -> None:
            mux.send_frame(members[index].conn, HB, HB_V, frames[index], answered(index, time.monotonic_ns()))

        progress(f"{len(members)} members heartbeating every {args.heartbeat_ms} ms for {args.seconds} s")
        cpu_before = server_cpu_s() if server_cpu_s else None
        with benchnode.CpuMeter(target.node) as meter:
            mux.run_paced(len(members), args.heartbeat_ms, args.seconds, send, progress)
        return benchnode.result_row(SCRIPT, "raw", len(latencies), args.seconds, None, latencies, workload="heartbeat",
                                    protocol="consumer", members=len(members), groups=count,
                                    heartbeat_ms=args.heartbeat_ms, members_with_errors=len(bad),
                                    error_codes=error_codes, target_p99_ms=5.0, **meter.fields,
                                    server_cpu_s=round(server_cpu_s() - cpu_before, 3) if server_cpu_s else None)
    finally:
        mux.close()


def run_rebalance(args, target) -> dict:
    size = args.rebalance_members
    mux = Mux(target.host, target.port, size + 1)  # a connection per member, as real consumers have
    driver = Driver(mux, args.rebalance_timeout_ms)
    try:
        group = [Member("rebalance", f"rb-{i}", mux.conns[i]) for i in range(size)]
        settle(driver, [group], args.rebalance_partitions, args.setup_timeout_s)
        times_ms = []
        phases = random.Random(848)  # the same phases in every run
        for round_ in range(args.rebalance_rounds):
            newcomer = Member("rebalance", f"rb-new-{round_}", mux.conns[size])
            everyone = group + [newcomer]
            # Settled members heartbeat at their own phases, as a group's consumers do; the newcomer starts now.
            started = time.monotonic()
            last_sent = {m.member_id: started - phases.uniform(0, m.interval_s) for m in group}

            def send(member: Member) -> None:
                last_sent[member.member_id] = time.monotonic()
                driver.heartbeat(member, react)

            def react(member: Member, changed: bool) -> None:
                if changed:  # acknowledge at once what it now owns, as librdkafka does
                    send(member)

            joined_ns = time.monotonic_ns()
            send(newcomer)
            deadline = time.monotonic() + args.setup_timeout_s
            while not (settled(everyone, args.rebalance_partitions) and newcomer.owned and newcomer.epoch > 0):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rebalance round {round_} did not settle")
                now = time.monotonic()
                for member in everyone:
                    if not member.in_flight and now >= last_sent[member.member_id] + member.interval_s:
                        send(member)
                mux.poll(0.001)
                errors = [m.error for m in everyone if m.error]
                if errors:
                    raise RuntimeError(f"rebalance round {round_}: errors {errors[:5]}")
            times_ms.append((max(m.changed_ns for m in everyone) - joined_ns) / 1e6)
            progress(f"rebalance round {round_ + 1}/{args.rebalance_rounds}: {times_ms[-1]:.1f} ms")
            mux.run_until(lambda: mux.pending() == 0, 30, "answers")
            driver.heartbeat(newcomer, leave=True)  # the next round starts from the same group
            mux.run_until(lambda: mux.pending() == 0, 30, "the newcomer's leave")
            settle(driver, [group], args.rebalance_partitions, args.setup_timeout_s)
        return benchnode.result_row(SCRIPT, "raw", len(times_ms), sum(times_ms) / 1000, None,
                                    [int(t * 1e6) for t in times_ms], workload="rebalance", protocol="consumer",
                                    members=size, heartbeat_ms=args.rebalance_heartbeat_ms,
                                    unreleased_heartbeat_ms=args.rebalance_unreleased_heartbeat_ms,
                                    rebalance_ms_median=round(float(np.median(times_ms)), 2),
                                    rebalance_ms=[round(t, 2) for t in times_ms], target_ms=100.0)
    finally:
        mux.close()


def run_classic_rebalance(args, target) -> dict:
    """The classic protocol's rebalance of a group of the same size, by scripts.bench_groups."""
    classic = _argparse.Namespace(rebalance_members=args.rebalance_members, rebalance_rounds=args.rebalance_rounds,
                                  session_ms=30_000, setup_timeout_s=args.setup_timeout_s)
    row = bench_groups.run_rebalance(classic, target)
    return {**row, "script": SCRIPT, "protocol": "classic"}


def print_table(rows: list[dict]) -> None:
    print(f"\n{'workload':10} {'protocol':9} {'setting':28} {'result':44} target")
    for row in rows:
        if row["workload"] == "heartbeat":
            setting = f"{row['members']} members / {row['groups']} groups"
            result = (f"p50 {row['p50_ms']} ms p99 {row['p99_ms']} ms, {row['records_per_s']:.0f}/s, "
                      f"errors {row['members_with_errors']}")
            goal = "p99 <= 5 ms, 0 errors"
        else:
            setting, goal = f"{row['members']} members", "<= 100 ms"
            if row["protocol"] == "consumer":
                setting += f", hb {row['heartbeat_ms']}/{row['unreleased_heartbeat_ms']} ms"
            result = f"median {row['rebalance_ms_median']} ms"
        print(f"{row['workload']:10} {row['protocol']:9} {setting:28} {result:44} {goal}")


def main(argv=None) -> int:
    parser = bench_groups.group_bench_parser(SCRIPT, __doc__, WORKLOADS, heartbeat_ms=5000, rebalance_rounds=5,
                                             setup_timeout_s=300.0)
    parser.add_argument("--partitions", type=int, default=10, help="of the topic every group subscribes to")
    parser.add_argument("--rebalance-timeout-ms", type=int, default=60_000)
    parser.add_argument("--rebalance-partitions", type=int, default=200)
    parser.add_argument("--rebalance-heartbeat-ms", type=int, default=50)
    parser.add_argument("--rebalance-unreleased-heartbeat-ms", type=int, default=5,
                        help="the node's interval for a member waiting for partitions (0: off, as Kafka); "
                             "default a tenth of the interval, as the node's defaults (500 of 5000)")
    args = parser.parse_args(argv)
    workloads = args.workload or WORKLOADS
    # Sessions outlive the bench's setup; the node's heartbeat interval is what the rebalance members use.
    config = ("[groups]\nmin_session_timeout_ms = 500\nconsumer_session_timeout_ms = 600000\n"
              "consumer_max_session_timeout_ms = 600000\nconsumer_min_heartbeat_interval_ms = 1\n"
              f"consumer_max_heartbeat_interval_ms = {max(15_000, args.rebalance_heartbeat_ms)}\n"
              f"consumer_heartbeat_interval_ms = {args.rebalance_heartbeat_ms}\n"
              f"consumer_unreleased_heartbeat_interval_ms = {args.rebalance_unreleased_heartbeat_ms}\n")
    with benchnode.node_for(args, config_toml=config) as target:
        partitions = max(args.partitions, args.rebalance_partitions)
        benchnode.create_topic(target.host, target.port, TOPIC, partitions)
        args.partitions = args.rebalance_partitions = partitions
        rows = benchnode.run_workloads(workloads, {
            "heartbeat": lambda: [run_heartbeat(args, target)],
            "rebalance": lambda: [run_rebalance(args, target), run_classic_rebalance(args, target)]}, args.json)
    if not args.json:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
