"""The group coordinator at the protocol level, with a raw client: the error codes Kafka returns for each
misstep, the member-id handshake, rebalances seen through heartbeats, session and rebalance timeouts,
offsets APIs, and bad input that must cost nothing but a clear answer or one closed connection."""

from __future__ import annotations

import functools
import os
import socket
import struct
import time
from typing import Any, Callable

import pytest
from kio.static.primitive import i8, i32, i64

from scripts.harness import rawkafka as R
from scripts.harness.rawkafka import millis as ms, request_body as body, request_entity as nested
from tests.test_clients import create_topic
from shmbroker.workers.codecs import protocol as P

GROUP_CONFIG = "[groups]\ninitial_rebalance_delay_ms = 50\nmin_session_timeout_ms = 500\n"
NONE, UNKNOWN_MEMBER, ILLEGAL_GENERATION, REBALANCING = 0, 25, 22, 27
MEMBER_ID_REQUIRED, INCONSISTENT_PROTOCOL, INVALID_SESSION_TIMEOUT, INVALID_GROUP_ID = 79, 23, 26, 24
NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND, INVALID_REQUEST, FENCED = 68, 69, 42, 82
OFFSET_METADATA_TOO_LARGE, UNKNOWN_TOPIC, SUBSCRIBED, LOADING, COORDINATOR_NOT_AVAILABLE = 12, 3, 86, 14, 15


def subscription(*topics: str) -> bytes:
    """A consumer-protocol Subscription v0: version, topics, user data."""
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return out + struct.pack(">i", -1)


class Client:
    def __init__(self, node) -> None:
        self.conn = R.RawConnection("127.0.0.1", node.port)

    def join(self, group: str, member: str = "", version: int = 5, session_ms: int = 5000, rebalance_ms: int = 5000,
             protocols=(("range", subscription("t")),), protocol_type: str = "consumer", instance: str | None = None):
        protos = tuple(nested(P.JOIN_GROUP, version, "JoinGroupRequestProtocol", name=n, metadata=m)
                       for n, m in protocols)
        return self.conn.call(P.JOIN_GROUP, version, body(
            P.JOIN_GROUP, version, "JoinGroupRequest", group_id=group, session_timeout=ms(session_ms),
            rebalance_timeout=ms(rebalance_ms), member_id=member, group_instance_id=instance,
            protocol_type=protocol_type, protocols=protos))

    def send_join(self, group: str, member: str, version: int = 5, session_ms: int = 5000, rebalance_ms: int = 5000):
        protos = (nested(P.JOIN_GROUP, version, "JoinGroupRequestProtocol", name="range", metadata=subscription("t")),)
        return self.conn.send(P.JOIN_GROUP, version, body(
            P.JOIN_GROUP, version, "JoinGroupRequest", group_id=group, session_timeout=ms(session_ms),
            rebalance_timeout=ms(rebalance_ms), member_id=member, group_instance_id=None, protocol_type="consumer",
            protocols=protos))

    def receive(self, api: int, version: int):
        _, _, _, response = self.conn.recv_response()
        return R.decode_response(api, version, response)

    def join_fully(self, group: str, **kwargs):
        first = self.join(group, **kwargs)
        assert first.error_code == MEMBER_ID_REQUIRED, first
        return self.join(group, member=first.member_id, **kwargs)

    def sync(self, group: str, generation: int, member: str, assignments=(), version: int = 3):
        items = tuple(nested(P.SYNC_GROUP, version, "SyncGroupRequestAssignment", member_id=m, assignment=a)
                      for m, a in assignments)
        return self.conn.call(P.SYNC_GROUP, version, body(P.SYNC_GROUP, version, "SyncGroupRequest", group_id=group,
                                                          generation_id=i32(generation), member_id=member,
                                                          group_instance_id=None, assignments=items))

    def heartbeat(self, group: str, generation: int, member: str, version: int = 3):
        return self.conn.call(P.HEARTBEAT, version, body(P.HEARTBEAT, version, "HeartbeatRequest", group_id=group,
                                                         generation_id=i32(generation), member_id=member,
                                                         group_instance_id=None)).error_code

    def leave(self, group: str, *members: str, version: int = 3):
        if version >= 3:
            identities = tuple(nested(P.LEAVE_GROUP, version, "MemberIdentity", member_id=m, group_instance_id=None)
                               for m in members)
            return self.conn.call(P.LEAVE_GROUP, version, body(P.LEAVE_GROUP, version, "LeaveGroupRequest",
                                                               group_id=group, members=identities))
        return self.conn.call(P.LEAVE_GROUP, version, body(P.LEAVE_GROUP, version, "LeaveGroupRequest",
                                                           group_id=group, member_id=members[0]))

    def commit(self, group: str, offsets: dict, generation: int = -1, member: str = "", version: int = 7,
               metadata: str | None = ""):
        topics = {}
        for (topic, partition), offset in offsets.items():
            topics.setdefault(topic, []).append(nested(
                P.OFFSET_COMMIT, version, "OffsetCommitRequestPartition", partition_index=i32(partition),
                committed_offset=i64(offset), committed_leader_epoch=i32(-1), committed_metadata=metadata))
        items = tuple(nested(P.OFFSET_COMMIT, version, "OffsetCommitRequestTopic", name=t, partitions=tuple(ps))
                      for t, ps in topics.items())
        response = self.conn.call(P.OFFSET_COMMIT, version, body(
            P.OFFSET_COMMIT, version, "OffsetCommitRequest", group_id=group, generation_id_or_member_epoch=i32(generation),
            member_id=member, group_instance_id=None, retention_time=i64(-1), topics=items))
        return {(t.name, p.partition_index): int(p.error_code) for t in response.topics for p in t.partitions}

    def fetch_offsets(self, group: str, partitions: dict | None, version: int = 5):
        topics = None if partitions is None else tuple(
            nested(P.OFFSET_FETCH, version, "OffsetFetchRequestTopic", name=t, partition_indexes=tuple(map(i32, ps)))
            for t, ps in partitions.items())
        response = self.conn.call(P.OFFSET_FETCH, version, body(P.OFFSET_FETCH, version, "OffsetFetchRequest",
                                                                group_id=group, topics=topics, require_stable=False))
        return response, {(t.name, p.partition_index): (int(p.committed_offset), p.metadata, int(p.error_code))
                          for t in response.topics for p in t.partitions}

    def describe(self, *groups: str, version: int = 4):
        return self.conn.call(P.DESCRIBE_GROUPS, version, body(P.DESCRIBE_GROUPS, version, "DescribeGroupsRequest",
                                                               groups=groups, include_authorized_operations=False))

    def close(self) -> None:
        self.conn.close()


class ClosingFactory:
    """A test's factory of clients (members, connections): `make`'s arguments, and every client it made is closed
    when the `with` ends (a fixture yields it inside)."""

    def __init__(self, make: Callable[..., Any], node: Any) -> None:
        self.make = make
        self.node = node
        self.made: list[Any] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.made.append(self.make(*args, **kwargs))
        return self.made[-1]

    def __enter__(self) -> ClosingFactory:
        return self

    def __exit__(self, *exc: Any) -> None:
        for client in self.made:
            client.close()


@pytest.fixture
def client_factory(node_factory):
    node = node_factory(workers=2, config=GROUP_CONFIG)
    create_topic(node.bootstrap, "t", 3)
    with ClosingFactory(functools.partial(Client, node), node) as make:
        yield make


def test_member_id_handshake_leader_sync_and_heartbeat(client_factory):
    c = client_factory()
    first = c.join("g")
    assert first.error_code == MEMBER_ID_REQUIRED and first.member_id and first.generation_id == -1
    joined = c.join("g", member=first.member_id)
    assert joined.error_code == NONE and joined.generation_id == 1 and joined.leader == first.member_id
    assert joined.protocol_name == "range" and [m.member_id for m in joined.members] == [first.member_id]
    assert joined.members[0].metadata == subscription("t")
    synced = c.sync("g", 1, first.member_id, [(first.member_id, b"assignment-bytes")])
    assert synced.error_code == NONE and synced.assignment == b"assignment-bytes"
    assert c.heartbeat("g", 1, first.member_id) == NONE
    old = c.join("g-old", version=3)  # before KIP-394: no MEMBER_ID_REQUIRED round
    assert old.error_code == NONE and old.member_id and old.generation_id == 1


def test_wrong_generation_unknown_member_and_bad_join_requests(client_factory):
    c = client_factory()
    joined = c.join_fully("g")
    member = joined.member_id
    c.sync("g", 1, member, [(member, b"a")])
    assert c.heartbeat("g", 2, member) == ILLEGAL_GENERATION
    assert c.sync("g", 7, member).error_code == ILLEGAL_GENERATION
    assert c.commit("g", {("t", 0): 5}, generation=3, member=member) == {("t", 0): ILLEGAL_GENERATION}
    assert c.heartbeat("g", 1, "nobody") == UNKNOWN_MEMBER
    assert c.sync("g", 1, "nobody").error_code == UNKNOWN_MEMBER
    assert c.heartbeat("no-such-group", 1, member) == UNKNOWN_MEMBER
    assert c.join("g", member="nobody").error_code == UNKNOWN_MEMBER
    assert c.join("fresh", member="nobody").error_code == UNKNOWN_MEMBER
    assert c.join("g", protocols=(("roundrobin", b""),)).error_code == INCONSISTENT_PROTOCOL
    assert c.join("g", protocol_type="connect").error_code == INCONSISTENT_PROTOCOL
    assert c.join("g", session_ms=100).error_code == INVALID_SESSION_TIMEOUT
    assert c.join("").error_code == INVALID_GROUP_ID
    assert c.heartbeat("g", 1, member) == NONE, "none of that disturbed the group"


def test_heartbeats_during_a_rebalance_and_a_member_that_never_rejoins(client_factory):
    a, b = client_factory(), client_factory()
    first = a.join_fully("g", rebalance_ms=1500)
    a.sync("g", 1, first.member_id, [(first.member_id, b"x")])
    pending = b.join("g", rebalance_ms=1500)
    assert pending.error_code == MEMBER_ID_REQUIRED
    b.send_join("g", pending.member_id, rebalance_ms=1500)  # the join phase now waits for a to rejoin
    deadline = time.monotonic() + 5
    while a.heartbeat("g", 1, first.member_id) != REBALANCING:
        assert time.monotonic() < deadline, "a heartbeat must tell the old member to rejoin"
        time.sleep(0.05)
    # a never rejoins: after the rebalance timeout b alone forms generation 2 and a is gone.
    joined = b.receive(P.JOIN_GROUP, 5)
    assert joined.error_code == NONE and joined.generation_id == 2 and joined.leader == pending.member_id
    assert [m.member_id for m in joined.members] == [pending.member_id]
    assert a.heartbeat("g", 1, first.member_id) == UNKNOWN_MEMBER


def test_both_members_rejoin_and_the_non_leader_waits_for_the_leaders_assignment(client_factory):
    a, b = client_factory(), client_factory()
    first = a.join_fully("g")
    a.sync("g", 1, first.member_id, [(first.member_id, b"all")])
    second_id = b.join("g").member_id
    b.send_join("g", second_id)
    while a.heartbeat("g", 1, first.member_id) != REBALANCING:
        time.sleep(0.02)
    rejoined = a.join("g", member=first.member_id)
    other = b.receive(P.JOIN_GROUP, 5)
    assert rejoined.generation_id == other.generation_id == 2
    assert rejoined.leader == first.member_id and len(rejoined.members) == 2 and other.members == ()
    b.conn.send(P.SYNC_GROUP, 3, body(P.SYNC_GROUP, 3, "SyncGroupRequest", group_id="g", generation_id=i32(2),
                                      member_id=second_id, group_instance_id=None, assignments=()))
    time.sleep(0.2)  # the non-leader's SyncGroup waits in the coordinator until the leader's arrives
    led = a.sync("g", 2, first.member_id, [(first.member_id, b"half-a"), (second_id, b"half-b")])
    assert led.error_code == NONE and led.assignment == b"half-a"
    waited = b.receive(P.SYNC_GROUP, 3)
    assert waited.error_code == NONE and waited.assignment == b"half-b"


def test_session_expiry_removes_a_silent_member(client_factory):
    a = client_factory()
    joined = a.join_fully("g", session_ms=600)
    a.sync("g", 1, joined.member_id, [(joined.member_id, b"x")])
    time.sleep(1.5)  # no heartbeat for more than the session timeout
    assert a.heartbeat("g", 1, joined.member_id) == UNKNOWN_MEMBER
    assert a.describe("g").groups[0].group_state == "Empty"


def test_leave_group_of_known_and_unknown_members(client_factory):
    a = client_factory()
    joined = a.join_fully("g")
    a.sync("g", 1, joined.member_id, [(joined.member_id, b"x")])
    response = a.leave("g", joined.member_id, "ghost")
    assert response.error_code == NONE
    assert [(m.member_id, int(m.error_code)) for m in response.members] == [(joined.member_id, NONE),
                                                                             ("ghost", UNKNOWN_MEMBER)]
    assert a.leave("g", "ghost", version=1).error_code == UNKNOWN_MEMBER
    assert a.leave("never-was", "ghost", version=0).error_code == UNKNOWN_MEMBER
    assert a.describe("g").groups[0].group_state == "Empty"


def test_offsets_commit_fetch_describe_list_delete(client_factory):
    c = client_factory()
    assert c.commit("solo", {("t", 0): 10, ("t", 1): 20}, metadata="meta") == {("t", 0): NONE, ("t", 1): NONE}
    _, fetched = c.fetch_offsets("solo", {"t": [0, 1, 2]})
    assert fetched == {("t", 0): (10, "meta", NONE), ("t", 1): (20, "meta", NONE), ("t", 2): (-1, "", NONE)}
    everything, fetched_all = c.fetch_offsets("solo", None)
    assert everything.error_code == NONE and set(fetched_all) == {("t", 0), ("t", 1)}
    _, unknown = c.fetch_offsets("nobody-committed", {"t": [0]})
    assert unknown == {("t", 0): (-1, "", NONE)}, "an unknown group answers -1, not an error"
    assert c.commit("solo", {("t", 0): 11}, metadata="x" * 5000) == {("t", 0): OFFSET_METADATA_TOO_LARGE}
    assert c.commit("solo", {("nope", 0): 1, ("t", 9): 1}) == {("nope", 0): UNKNOWN_TOPIC, ("t", 9): UNKNOWN_TOPIC}
    # Lag as Kafka tools compute it: the high watermark (ListOffsets latest) minus the committed offset.
    R_end = c.conn.call(R.LIST_OFFSETS, 5, R.list_offsets_body({"t": [0]}, timestamp=-1)).topics[0].partitions[0]
    assert int(R_end.offset) == 0 and fetched[("t", 0)][0] == 10

    joined = c.join_fully("busy")
    c.sync("busy", 1, joined.member_id, [(joined.member_id, b"x")])
    listed = c.conn.call(P.LIST_GROUPS, 2, body(P.LIST_GROUPS, 2, "ListGroupsRequest"))
    assert {(g.group_id, g.protocol_type) for g in listed.groups} >= {("solo", ""), ("busy", "consumer")}
    described = {g.group_id: g for g in c.describe("busy", "solo", "ghost").groups}
    busy = described["busy"]
    assert busy.group_state == "Stable" and busy.protocol_data == "range" and busy.protocol_type == "consumer"
    assert [m.member_id for m in busy.members] == [joined.member_id]
    assert busy.members[0].member_assignment == b"x" and busy.members[0].client_id == R.DEFAULT_CLIENT_ID
    assert described["solo"].group_state == "Empty" and described["ghost"].group_state == "Dead"
    # v6 (KIP-1043): a group that is not there is GROUP_ID_NOT_FOUND, with Kafka's message.
    described = {g.group_id: g for g in c.describe("busy", "ghost", version=6).groups}
    assert (int(described["ghost"].error_code), described["ghost"].error_message, described["ghost"].group_state) \
        == (GROUP_ID_NOT_FOUND, "Group ghost not found.", "")
    assert (int(described["busy"].error_code), described["busy"].error_message, described["busy"].group_state) == (
        NONE, None, "Stable")

    deleted = c.conn.call(P.DELETE_GROUPS, 1, body(P.DELETE_GROUPS, 1, "DeleteGroupsRequest",
                                                   groups_names=("busy", "solo", "ghost")))
    assert {r.group_id: int(r.error_code) for r in deleted.results} == {
        "busy": NON_EMPTY_GROUP, "solo": NONE, "ghost": GROUP_ID_NOT_FOUND}
    _, gone = c.fetch_offsets("solo", {"t": [0]})
    assert gone == {("t", 0): (-1, "", NONE)}


def test_offset_fetch_v8_answers_each_group_of_one_request(client_factory):
    """KIP-709: one OffsetFetch for several groups, each answered as v7 answers one: its named partitions, or
    every partition it committed (topics null); a group nobody committed for answers -1s."""
    c = client_factory()
    assert c.commit("g1", {("t", 0): 10, ("t", 1): 20}) == {("t", 0): NONE, ("t", 1): NONE}
    assert c.commit("g2", {("t", 2): 7}, metadata="m2") == {("t", 2): NONE}

    def group(name: str, partitions: list[int] | None):
        topics = None if partitions is None else (nested(P.OFFSET_FETCH, 8, "OffsetFetchRequestTopics", name="t",
                                                         partition_indexes=tuple(map(i32, partitions))),)
        return nested(P.OFFSET_FETCH, 8, "OffsetFetchRequestGroup", group_id=name, topics=topics)

    response = c.conn.call(P.OFFSET_FETCH, 8, body(P.OFFSET_FETCH, 8, "OffsetFetchRequest", groups=(
        group("g1", [0, 1]), group("g2", None), group("nobody", [0]), group("g1", None))))
    answers = [(g.group_id, int(g.error_code), sorted((t.name, p.partition_index, int(p.committed_offset), p.metadata,
                                                       int(p.error_code)) for t in g.topics for p in t.partitions))
               for g in response.groups]
    assert answers == [("g1", NONE, [("t", 0, 10, "", NONE), ("t", 1, 20, "", NONE)]),
                       ("g2", NONE, [("t", 2, 7, "m2", NONE)]),
                       ("nobody", NONE, [("t", 0, -1, "", NONE)]),
                       ("g1", NONE, [("t", 0, 10, "", NONE), ("t", 1, 20, "", NONE)])]
    many = c.conn.call(P.OFFSET_FETCH, 8, body(P.OFFSET_FETCH, 8, "OffsetFetchRequest", groups=tuple(
        group(f"g{i % 3}", [2]) for i in range(200))))
    assert [int(p.committed_offset) for g in many.groups for t in g.topics for p in t.partitions] == [
        {0: -1, 1: -1, 2: 7}[i % 3] for i in range(200)]


def test_offset_delete_refuses_subscribed_topics(client_factory):
    c = client_factory()
    create_topic(client_factory.node.bootstrap, "other", 1)
    joined = c.join_fully("g")
    c.sync("g", 1, joined.member_id, [(joined.member_id, b"x")])
    assert c.commit("g", {("t", 0): 3, ("other", 0): 4}, generation=1, member=joined.member_id) == {
        ("t", 0): NONE, ("other", 0): NONE}

    def delete(group, topic):
        request = body(P.OFFSET_DELETE, 0, "OffsetDeleteRequest", group_id=group, topics=(
            nested(P.OFFSET_DELETE, 0, "OffsetDeleteRequestTopic", name=topic, partitions=(
                nested(P.OFFSET_DELETE, 0, "OffsetDeleteRequestPartition", partition_index=i32(0)),)),))
        response = c.conn.call(P.OFFSET_DELETE, 0, request)
        return int(response.error_code), [int(p.error_code) for t in response.topics for p in t.partitions]

    assert delete("g", "t") == (NONE, [SUBSCRIBED]), "the members subscribe to t"
    assert delete("g", "other") == (NONE, [NONE])
    assert delete("ghost", "t") == (GROUP_ID_NOT_FOUND, [])
    _, left = c.fetch_offsets("g", None)
    assert set(left) == {("t", 0)}


def test_find_coordinator_and_advertised_versions(client_factory):
    c = client_factory()
    node = client_factory.node
    for version in (0, 1, 2):
        response = c.conn.call(P.FIND_COORDINATOR, version, body(P.FIND_COORDINATOR, version, "FindCoordinatorRequest",
                                                                 key="any-group", key_type=i8(0)))
        assert int(response.error_code) == NONE and response.node_id == 0 and response.port == node.port
    transactional = c.conn.call(P.FIND_COORDINATOR, 2, body(P.FIND_COORDINATOR, 2, "FindCoordinatorRequest",
                                                            key="tx", key_type=i8(1)))
    assert int(transactional.error_code) == NONE and transactional.port == node.port  # the transaction coordinator
    batched = c.conn.call(P.FIND_COORDINATOR, 6, body(P.FIND_COORDINATOR, 6, "FindCoordinatorRequest", key_type=i8(2),
                                                      coordinator_keys=("share-group:topic:0",)))
    (share,) = batched.coordinators  # a share-partition's (KIP-932): the node's, as every coordinator
    assert int(share.error_code) == NONE and share.node_id == 0 and share.port == node.port
    other = c.conn.call(P.FIND_COORDINATOR, 6, body(P.FIND_COORDINATOR, 6, "FindCoordinatorRequest", key_type=i8(3),
                                                    coordinator_keys=("k",)))
    (unknown,) = other.coordinators
    assert (int(unknown.error_code), unknown.node_id) == (INVALID_REQUEST, -1) and "key type 3" in unknown.error_message
    versions = c.conn.call(R.API_VERSIONS, 3, R.api_versions_body(3))
    advertised = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in versions.api_keys}
    assert {key: advertised[key] for key in (10, 11, 14, 12, 13, 8, 9, 16, 15, 42, 47, 68, 69)} == {
        10: (0, 6), 11: (0, 8), 14: (0, 5), 12: (0, 4), 13: (0, 5), 8: (2, 9), 9: (1, 9), 16: (0, 5), 15: (0, 6),
        42: (0, 2), 47: (0, 0), 68: (0, 1), 69: (0, 1)}


def test_huge_or_malformed_member_metadata_costs_nothing(client_factory):
    c = client_factory()
    huge = c.join("g", protocols=(("range", os.urandom(3 << 20)),))
    assert huge.error_code == INVALID_REQUEST and huge.generation_id == -1
    garbage = c.join_fully("g2", protocols=(("range", b"\xff\x00garbage"),))
    assert garbage.error_code == NONE and garbage.members[0].metadata == b"\xff\x00garbage"
    c.sync("g2", 1, garbage.member_id, [(garbage.member_id, b"")])
    # A truncated JoinGroup body: that connection is closed with one log line; the node serves on.
    with socket.create_connection(("127.0.0.1", client_factory.node.port), timeout=10) as raw:
        frame = R.encode_request(P.JOIN_GROUP, 5, 1, b"\x00\x01g\x00")
        raw.sendall(frame)
        assert raw.recv(4096) == b""
    assert c.heartbeat("g2", 1, garbage.member_id) == NONE
    assert "Traceback" not in client_factory.node.log()
