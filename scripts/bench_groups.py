"""Group coordination in the live node, with raw-protocol members multiplexed over a few connections (the
broker does not tie members to connections), the load generator on the same cores as the node.

Workloads (each one JSON line with --json, and a table):
- heartbeat: --members members in groups of --group-size join (with the MEMBER_ID_REQUIRED handshake) and
  sync, then each heartbeats once per --heartbeat-ms at its own phase for --seconds. Reported: heartbeat
  response p50/p99/p99.9, heartbeats/s, members that got an error although they kept heartbeating (must be
  0), node CPU by role. Targets: p99 <= 5 ms, none expired.
- rebalance: a group of --rebalance-members, Stable; all rejoin; the time from the last JoinGroup sent until
  every member holds its SyncGroup answer (the leader syncing the assignment as soon as it has the join
  answer). --rebalance-rounds rounds. Target: <= 100 ms.
- failure: a group of --failure-members over --failure-partitions partitions, heartbeating every
  --failure-heartbeat-ms with session --failure-session-ms; one member stops heartbeating; the time until the
  others hold its partitions (rejoined and synced with the bench's own range assignment). Target: session
  timeout + heartbeat interval + 500 ms at most.
- commit: OffsetCommit throughput with 1, 10 and 100 concurrent committers, one commit in flight each (every
  answer waits for its fsync'd group commit): commits/s and latency percentiles.

Only 127.0.0.1; every phase is bounded in time. Usage:
    .venv/bin/python -m scripts.bench_groups [--workload heartbeat|rebalance|failure|commit ...] [--json]
"""

from __future__ import annotations

import argparse
import random
import selectors
import socket
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from kio.static.primitive import i32, i64

from scripts.harness import benchnode
from scripts.harness import rawkafka as R
from scripts.harness.rawkafka import millis as ms, request_body as kio_body, request_entity as nested
from shmbroker.workers.codecs import protocol as P

SCRIPT = "bench_groups"
WORKLOADS = ("heartbeat", "rebalance", "failure", "commit")
JOIN_V, SYNC_V, HEARTBEAT_V, COMMIT_V = 5, 3, 3, 7
MEMBER_ID_REQUIRED, REBALANCE_IN_PROGRESS = 79, 27
TOPIC = "bench-groups"
# Kafka's default initial rebalance delay (3 s) gathers each group's first members into one generation even
# with thousands joining at once; short sessions are allowed for the failure workload.
NODE_CONFIG = "[groups]\nmin_session_timeout_ms = 500\n"
_SIZE = struct.Struct(">i")
_HEARTBEAT_RESPONSE = struct.Struct(">ih")  # v3: throttle_time_ms, error_code


def subscription(topic: str) -> bytes:
    return struct.pack(">hih", 0, 1, len(topic)) + topic.encode() + struct.pack(">i", -1)


def range_assignment(topic: str, partitions: list[int]) -> bytes:
    """A consumer-protocol Assignment v0: one topic with these partitions, no user data."""
    body = struct.pack(">hih", 0, 1, len(topic)) + topic.encode() + struct.pack(">i", len(partitions))
    return body + b"".join(struct.pack(">i", p) for p in partitions) + struct.pack(">i", -1)


def partitions_of(assignment: bytes) -> list[int]:
    if len(assignment) < 6:
        return []
    (topics,) = struct.unpack_from(">i", assignment, 2)
    position, found = 6, []
    for _ in range(topics):
        (size,) = struct.unpack_from(">h", assignment, position)
        position += 2 + size
        (count,) = struct.unpack_from(">i", assignment, position)
        position += 4
        found += list(struct.unpack_from(f">{count}i", assignment, position))
        position += 4 * count
    return found


# --------------------------------------------------------------------------- connections


class Conn:
    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.out = bytearray()
        self.inbuf = bytearray()
        self.waiting: deque[tuple[int, int, int, Callable]] = deque()  # (cid, api, version, callback)
        self.cid = 0


class Mux:
    """Requests over many connections; responses come in request order per connection, each handed to its
    callback(body, received_ns)."""

    def __init__(self, host: str, port: int, connections: int) -> None:
        self.selector = selectors.DefaultSelector()
        self.conns = [Conn(host, port) for _ in range(connections)]
        for conn in self.conns:
            self.selector.register(conn.sock, selectors.EVENT_READ, conn)

    def send(self, conn: Conn, api: int, version: int, body: bytes, callback: Callable) -> None:
        conn.cid = (conn.cid + 1) & 0x7FFFFFFF
        conn.out += R.encode_request(api, version, conn.cid, body)
        conn.waiting.append((conn.cid, api, version, callback))

    def send_frame(self, conn: Conn, api: int, version: int, frame: bytearray, callback: Callable) -> None:
        """A pre-encoded request frame; its correlation id is set here."""
        conn.cid = (conn.cid + 1) & 0x7FFFFFFF
        struct.pack_into(">i", frame, 8, conn.cid)
        conn.out += frame
        conn.waiting.append((conn.cid, api, version, callback))

    def pending(self) -> int:
        return sum(len(c.waiting) for c in self.conns)

    def poll(self, timeout: float) -> None:
        for conn in self.conns:
            if conn.out:
                try:
                    sent = conn.sock.send(conn.out)
                    del conn.out[:sent]
                except BlockingIOError:
                    pass
        for key, _ in self.selector.select(timeout):
            conn = key.data
            try:
                data = conn.sock.recv(1 << 20)
            except BlockingIOError:
                continue
            if not data:
                raise RuntimeError("the node closed a connection")
            now = time.monotonic_ns()
            conn.inbuf += data
            while len(conn.inbuf) >= 4:
                (size,) = _SIZE.unpack_from(conn.inbuf)
                if len(conn.inbuf) < 4 + size:
                    break
                frame = bytes(conn.inbuf[4:4 + size])
                del conn.inbuf[:4 + size]
                cid, api, version, callback = conn.waiting.popleft()
                (got,) = _SIZE.unpack_from(frame)
                if got != cid:
                    raise RuntimeError(f"correlation id {got}, expected {cid}")
                callback(frame[4:], now)

    def run_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")
            self.poll(0.01)

    def run_paced(self, members: int, period_ms: int, seconds: float, send: Callable[[int], None],
                  progress: Callable[[str], None]) -> int:
        """Members 0..`members`-1 each send a request every `period_ms` for `seconds` (send(index): member
        index's, now), each at a phase of its own (seeded: the same phases in every run), from 0.1 s on; then
        waits for the last answers. Returns the requests sent; reports progress every 10 s."""
        period_ns = period_ms * 1_000_000
        rng = random.Random(1)
        start = time.monotonic_ns() + 100_000_000
        due = deque(sorted((start + rng.randrange(period_ns), i) for i in range(members)))
        end = start + int(seconds * 1e9)
        sent = 0
        next_report = time.monotonic() + 10
        while True:
            now = time.monotonic_ns()
            if now >= end and not due:
                break
            while due and due[0][0] <= now:
                when, index = due.popleft()
                send(index)
                sent += 1
                if when + period_ns < end:
                    due.append((when + period_ns, index))
            wait = (due[0][0] - time.monotonic_ns()) / 1e9 if due else 0.01
            self.poll(max(0.0, min(wait, 0.005)))
            if time.monotonic() > next_report:
                next_report += 10
                progress(f"  {sent} sent, {self.pending()} unanswered")
        self.run_until(lambda: self.pending() == 0, 30, "the last answers")
        return sent

    def close(self) -> None:
        for conn in self.conns:
            conn.sock.close()
        self.selector.close()


# --------------------------------------------------------------------------- members


@dataclass
class Member:
    group: str
    conn: Conn
    member_id: str = ""
    generation: int = -1
    leader: bool = False
    peers: list[str] = field(default_factory=list)
    assignment: list[int] = field(default_factory=list)
    joined: bool = False
    synced: bool = False
    synced_ns: int = 0
    error: int = 0


class Group:
    """Members of one group driven through join and sync."""

    def __init__(self, mux: Mux, name: str, members: list[Member], session_ms: int, rebalance_ms: int,
                 partitions: int) -> None:
        self.mux, self.name, self.members = mux, name, members
        self.session_ms, self.rebalance_ms, self.partitions = session_ms, rebalance_ms, partitions

    def join(self, member: Member) -> None:
        member.joined = member.synced = False
        protocols = (nested(P.JOIN_GROUP, JOIN_V, "JoinGroupRequestProtocol", name="range",
                            metadata=subscription(TOPIC)),)
        body = kio_body(P.JOIN_GROUP, JOIN_V, "JoinGroupRequest", group_id=self.name, session_timeout=ms(self.session_ms),
                        rebalance_timeout=ms(self.rebalance_ms), member_id=member.member_id, group_instance_id=None,
                        protocol_type="consumer", protocols=protocols)
        self.mux.send(member.conn, P.JOIN_GROUP, JOIN_V, body, lambda b, t, m=member: self._joined(m, b))

    def _joined(self, member: Member, body: bytes) -> None:
        response = R.decode_response(P.JOIN_GROUP, JOIN_V, body)
        if int(response.error_code) == MEMBER_ID_REQUIRED:
            member.member_id = response.member_id  # form_groups sends the rejoin once every member has its id
            return
        if int(response.error_code):
            member.error = int(response.error_code)
            return
        member.generation, member.leader = int(response.generation_id), response.leader == response.member_id
        member.peers = [m.member_id for m in response.members]
        member.joined = True
        self.sync(member)

    def sync(self, member: Member) -> None:
        assignments = ()
        if member.leader:  # the bench's own range assignor: consecutive partitions per member
            ids = sorted(member.peers)
            shares = np.array_split(np.arange(self.partitions), len(ids))
            assignments = tuple(nested(P.SYNC_GROUP, SYNC_V, "SyncGroupRequestAssignment", member_id=m,
                                       assignment=range_assignment(TOPIC, share.tolist()))
                                for m, share in zip(ids, shares))
        body = kio_body(P.SYNC_GROUP, SYNC_V, "SyncGroupRequest", group_id=self.name, generation_id=i32(member.generation),
                        member_id=member.member_id, group_instance_id=None, assignments=assignments)
        self.mux.send(member.conn, P.SYNC_GROUP, SYNC_V, body, lambda b, t, m=member: self._synced(m, b, t))

    def _synced(self, member: Member, body: bytes, received_ns: int) -> None:
        response = R.decode_response(P.SYNC_GROUP, SYNC_V, body)
        if int(response.error_code):
            member.error = int(response.error_code)
            return
        member.assignment, member.synced, member.synced_ns = partitions_of(response.assignment), True, received_ns

    def stable(self) -> bool:
        return all(m.synced for m in self.members)

    def heartbeat_frame(self, member: Member) -> bytearray:
        body = kio_body(P.HEARTBEAT, HEARTBEAT_V, "HeartbeatRequest", group_id=self.name,
                        generation_id=i32(member.generation), member_id=member.member_id, group_instance_id=None)
        return bytearray(R.encode_request(P.HEARTBEAT, HEARTBEAT_V, 0, body))


def form_groups(mux: Mux, prefix: str, groups: int, size: int, session_ms: int, rebalance_ms: int, partitions: int,
                timeout_s: float) -> list[Group]:
    made = []
    for g in range(groups):
        members = [Member(f"{prefix}-{g}", mux.conns[(g * size + i) % len(mux.conns)]) for i in range(size)]
        made.append(Group(mux, f"{prefix}-{g}", members, session_ms, rebalance_ms, partitions))
    # Two passes over shared connections (answers come in request order per connection): every member first
    # gets its id (MEMBER_ID_REQUIRED, answered at once), then all rejoin. Rejoining as each id arrives would let
    # an id's answer queue behind another member's rejoin that waits for its join phase.
    for group in made:
        for member in group.members:
            group.join(member)
    mux.run_until(lambda: mux.pending() == 0, timeout_s, "member ids")
    for group in made:
        for member in group.members:
            group.join(member)
    mux.run_until(lambda: all(g.stable() or any(m.error for m in g.members) for g in made), timeout_s, "groups to form")
    errors = [m.error for g in made for m in g.members if m.error]
    if errors:
        raise RuntimeError(f"{len(errors)} members failed to join: errors {sorted(set(errors))}")
    return made


# --------------------------------------------------------------------------- workloads


def progress(line: str) -> None:
    print(f"{SCRIPT}: {line}", file=sys.stderr, flush=True)


def run_heartbeat(args, target, server_cpu_s: Callable[[], float] | None = None) -> dict:
    """`server_cpu_s()`, if given, the server's CPU seconds so far: the row gets what it spent while the members
    heartbeat (server_cpu_s)."""
    mux = Mux(target.host, target.port, args.connections)
    try:
        progress(f"forming {args.members // args.group_size} groups of {args.group_size}")
        groups = form_groups(mux, "heartbeat", args.members // args.group_size, args.group_size, args.session_ms,
                             args.session_ms, 4, args.setup_timeout_s)
        members = [(g, m, g.heartbeat_frame(m)) for g in groups for m in g.members]
        latencies: list[int] = []
        bad: set[int] = set()

        def answered(index: int, sent_ns: int) -> Callable:
            def callback(body: bytes, received_ns: int) -> None:
                _, error = _HEARTBEAT_RESPONSE.unpack_from(body)
                latencies.append(received_ns - sent_ns)
                if error:
                    bad.add(index)
            return callback

        def send(index: int) -> None:
            group, member, frame = members[index]
            mux.send_frame(member.conn, P.HEARTBEAT, HEARTBEAT_V, frame, answered(index, time.monotonic_ns()))

        progress(f"{len(members)} members heartbeating every {args.heartbeat_ms} ms for {args.seconds} s")
        cpu_before = server_cpu_s() if server_cpu_s else None
        with benchnode.CpuMeter(target.node) as meter:
            mux.run_paced(len(members), args.heartbeat_ms, args.seconds, send, progress)
        return benchnode.result_row(SCRIPT, "raw", len(latencies), args.seconds, None, latencies, workload="heartbeat",
                                    members=len(members), groups=len(groups), heartbeat_ms=args.heartbeat_ms,
                                    members_with_errors=len(bad), target_p99_ms=5.0, **meter.fields,
                                    server_cpu_s=round(server_cpu_s() - cpu_before, 3) if server_cpu_s else None)
    finally:
        mux.close()


def run_rebalance(args, target) -> dict:
    # One connection per member, as real consumers have: responses come in request order per connection, so a
    # follower's SyncGroup waiting for the leader must not sit ahead of the leader's own JoinGroup answer.
    mux = Mux(target.host, target.port, args.rebalance_members)
    try:
        [group] = form_groups(mux, "rebalance", 1, args.rebalance_members, args.session_ms, args.session_ms,
                              args.rebalance_members, args.setup_timeout_s)
        times_ms = []
        for round_ in range(args.rebalance_rounds):
            for member in group.members:
                member.synced = False
            # The leader's rejoin starts the rebalance (followers rejoining a Stable group with unchanged
            # metadata would just get the current generation); a follower's heartbeat confirms it has begun.
            leader = next(m for m in group.members if m.leader)
            followers = [m for m in group.members if m is not leader]
            group.join(leader)
            state = {"rebalancing": False}

            def probe() -> None:
                def answered(body: bytes, received_ns: int) -> None:
                    state["rebalancing"] = _HEARTBEAT_RESPONSE.unpack_from(body)[1] == REBALANCE_IN_PROGRESS
                    if not state["rebalancing"]:
                        probe()
                mux.send_frame(followers[0].conn, P.HEARTBEAT, HEARTBEAT_V, group.heartbeat_frame(followers[0]),
                               answered)
            probe()
            mux.run_until(lambda: state["rebalancing"], 30, "the rebalance to begin")
            last_join_sent = 0
            for member in followers:
                group.join(member)
                last_join_sent = time.monotonic_ns()
            mux.run_until(group.stable, args.setup_timeout_s, "the rebalance")
            errors = [m.error for m in group.members if m.error]
            if errors:
                raise RuntimeError(f"rebalance round {round_}: errors {errors[:5]}")
            times_ms.append((max(m.synced_ns for m in group.members) - last_join_sent) / 1e6)
            progress(f"rebalance round {round_ + 1}/{args.rebalance_rounds}: {times_ms[-1]:.1f} ms")
        return benchnode.result_row(SCRIPT, "raw", len(times_ms), sum(times_ms) / 1000, None,
                                    [int(t * 1e6) for t in times_ms], workload="rebalance",
                                    members=args.rebalance_members, rebalance_ms_median=round(float(np.median(times_ms)), 2),
                                    rebalance_ms=[round(t, 2) for t in times_ms], target_ms=100.0)
    finally:
        mux.close()


def run_failure(args, target) -> dict:
    detections = []
    for round_ in range(args.failure_rounds):
        mux = Mux(target.host, target.port, args.failure_members)
        try:
            [group] = form_groups(mux, f"failure-{round_}", 1, args.failure_members, args.failure_session_ms,
                                  args.failure_session_ms, args.failure_partitions, args.setup_timeout_s)
            victim, others = group.members[0], group.members[1:]
            orphaned = set(victim.assignment)
            stopped_ns = time.monotonic_ns()
            next_beat = time.monotonic()
            rejoining: set[int] = set()

            def beat(member: Member, index: int) -> None:
                frame = group.heartbeat_frame(member)

                def answered(body: bytes, received_ns: int) -> None:
                    _, error = _HEARTBEAT_RESPONSE.unpack_from(body)
                    if error == REBALANCE_IN_PROGRESS and index not in rejoining:
                        rejoining.add(index)
                        member.leader = False
                        group.join(member)
                mux.send_frame(member.conn, P.HEARTBEAT, HEARTBEAT_V, frame, answered)

            def taken() -> bool:
                held = {p for m in others if m.synced for p in m.assignment}
                return len(rejoining) == len(others) and all(m.synced for m in others) and orphaned <= held

            deadline = time.monotonic() + args.failure_session_ms / 1000 * 4 + 10
            while not taken():
                if time.monotonic() > deadline:
                    raise RuntimeError("the others never took the silent member's partitions")
                if time.monotonic() >= next_beat:
                    next_beat += args.failure_heartbeat_ms / 1000
                    for index, member in enumerate(others):
                        if index not in rejoining:
                            beat(member, index)
                mux.poll(0.005)
            detected_ms = (max(m.synced_ns for m in others) - stopped_ns) / 1e6
            detections.append(detected_ms)
            progress(f"failure round {round_ + 1}/{args.failure_rounds}: partitions taken over after "
                     f"{detected_ms:.0f} ms")
        finally:
            mux.close()
    target_ms = args.failure_session_ms + args.failure_heartbeat_ms + 500
    return benchnode.result_row(SCRIPT, "raw", len(detections), sum(detections) / 1000, None,
                                [int(d * 1e6) for d in detections], workload="failure",
                                members=args.failure_members, session_ms=args.failure_session_ms,
                                heartbeat_ms=args.failure_heartbeat_ms, detection_ms_median=round(float(np.median(detections)), 1),
                                detection_ms=[round(d, 1) for d in detections], target_ms=target_ms)


def run_commit(args, target, committers: int) -> dict:
    benchnode.create_topic(target.host, target.port, TOPIC, 4)
    mux = Mux(target.host, target.port, committers)
    latencies: list[int] = []
    errors = 0
    try:
        end = time.monotonic() + args.commit_seconds

        def commit(index: int, offset: int) -> None:
            conn = mux.conns[index]
            partition = (nested(P.OFFSET_COMMIT, COMMIT_V, "OffsetCommitRequestPartition", partition_index=i32(index % 4),
                                committed_offset=i64(offset), committed_leader_epoch=i32(-1), committed_metadata=""),)
            body = kio_body(P.OFFSET_COMMIT, COMMIT_V, "OffsetCommitRequest", group_id=f"committer-{index}",
                            generation_id_or_member_epoch=i32(-1), member_id="", group_instance_id=None,
                            topics=(nested(P.OFFSET_COMMIT, COMMIT_V, "OffsetCommitRequestTopic", name=TOPIC,
                                           partitions=partition),))
            sent = time.monotonic_ns()

            def answered(response_body: bytes, received_ns: int) -> None:
                nonlocal errors
                response = R.decode_response(P.OFFSET_COMMIT, COMMIT_V, response_body)
                errors += sum(1 for t in response.topics for p in t.partitions if int(p.error_code))
                latencies.append(received_ns - sent)
                if time.monotonic() < end:
                    commit(index, offset + 1)
            mux.send(conn, P.OFFSET_COMMIT, COMMIT_V, body, answered)

        with benchnode.CpuMeter(target.node) as meter:
            started = time.monotonic()
            for index in range(committers):
                commit(index, 1)
            mux.run_until(lambda: time.monotonic() >= end and mux.pending() == 0, args.commit_seconds + 60,
                          "the commits")
            seconds = time.monotonic() - started
        progress(f"commit with {committers} committers: {len(latencies) / seconds:.0f} commits/s")
        return benchnode.result_row(SCRIPT, "raw", len(latencies), seconds, None, latencies, workload="commit",
                                    committers=committers, errors=errors, **meter.fields)
    finally:
        mux.close()


def print_table(rows: list[dict]) -> None:
    print(f"\n{'workload':12} {'setting':24} {'result':44} target")
    for row in rows:
        w = row["workload"]
        if w == "heartbeat":
            setting = f"{row['members']} members / {row['groups']} groups"
            result = f"p50 {row['p50_ms']} ms p99 {row['p99_ms']} ms, {row['records_per_s']:.0f}/s, errors {row['members_with_errors']}"
            goal = "p99 <= 5 ms, 0 errors"
        elif w == "rebalance":
            setting, result, goal = f"{row['members']} members", f"median {row['rebalance_ms_median']} ms", "<= 100 ms"
        elif w == "failure":
            setting = f"session {row['session_ms']} ms, hb {row['heartbeat_ms']} ms"
            result, goal = f"median {row['detection_ms_median']} ms", f"<= {row['target_ms']} ms"
        else:
            setting = f"{row['committers']} committers"
            result, goal = f"{row['records_per_s']:.0f} commits/s, p99 {row['p99_ms']} ms", ""
        print(f"{w:12} {setting:24} {result:44} {goal}")


def group_bench_parser(script: str, description: str, workloads: Sequence[str], heartbeat_ms: int,
                       rebalance_rounds: int, setup_timeout_s: float) -> argparse.ArgumentParser:
    """The command line both group benchmarks (this one, the classic protocol's, and bench_consumer_groups,
    KIP-848's) start with: the node's options, the workloads, the heartbeating members and the rebalancing
    group, with each one's defaults."""
    parser = argparse.ArgumentParser(prog=f"python -m scripts.{script}", description=description.split("\n\n")[0])
    benchnode.add_common_arguments(parser, default_seconds=60)
    parser.add_argument("--workload", action="append", choices=workloads)
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--group-size", type=int, default=10)
    parser.add_argument("--heartbeat-ms", type=int, default=heartbeat_ms)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rebalance-members", type=int, default=100)
    parser.add_argument("--rebalance-rounds", type=int, default=rebalance_rounds)
    parser.add_argument("--setup-timeout-s", type=float, default=setup_timeout_s)
    return parser


def main(argv=None) -> int:
    parser = group_bench_parser(SCRIPT, __doc__, WORKLOADS, heartbeat_ms=1000, rebalance_rounds=10,
                                setup_timeout_s=120.0)
    parser.add_argument("--session-ms", type=int, default=30_000)
    parser.add_argument("--failure-members", type=int, default=5)
    parser.add_argument("--failure-partitions", type=int, default=10)
    parser.add_argument("--failure-session-ms", type=int, default=3000)
    parser.add_argument("--failure-heartbeat-ms", type=int, default=300)
    parser.add_argument("--failure-rounds", type=int, default=3)
    parser.add_argument("--committers", type=int, action="append", help="default: 1, 10 and 100")
    parser.add_argument("--commit-seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    with benchnode.node_for(args, config_toml=NODE_CONFIG) as target:
        rows = benchnode.run_workloads(args.workload or WORKLOADS, {
            "heartbeat": lambda: [run_heartbeat(args, target)],
            "rebalance": lambda: [run_rebalance(args, target)],
            "failure": lambda: [run_failure(args, target)],
            "commit": lambda: [run_commit(args, target, c) for c in (args.committers or [1, 10, 100])]}, args.json)
    if not args.json:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
