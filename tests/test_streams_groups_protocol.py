"""The Streams rebalance protocol (KIP-1071) at the protocol level against a real node, with a raw client: a
topology registered by the first member, the internal topics the node creates for it, active tasks shared with
revocation before assignment, Kafka's error codes (bad topology, unknown member, fenced epoch), the group beside
the other protocols' requests (ListGroups, DescribeGroups, ConsumerGroupDescribe, offsets, DeleteGroups), and
the group kept across a node restart."""

from __future__ import annotations

import datetime
import time

import pytest
from kio.static.primitive import i16, i32, i64, i64Timedelta, u16

from scripts.harness import rawkafka as R
from scripts.harness.nodeproc import NodeProcess
from scripts.harness.rawkafka import millis as ms, request_body as body, request_entity as nested
from tests.test_clients import create_topic
from tests.test_stats_cli import stats_json
from shmbroker.workers.codecs import protocol as P

pytestmark = pytest.mark.node

CONFIG = ("[groups]\nstreams_session_timeout_ms = 1500\nstreams_heartbeat_interval_ms = 100\n"
          "streams_min_session_timeout_ms = 1500\nstreams_min_heartbeat_interval_ms = 100\n"
          "streams_initial_rebalance_delay_ms = 0\n")
NONE, UNKNOWN_MEMBER, INVALID_REQUEST, GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, INVALID_CONFIG = 0, 25, 42, 69, 68, 40
INCONSISTENT_PROTOCOL = 23
FENCED_EPOCH, STALE_EPOCH, INVALID_TOPOLOGY, UNRELEASED_INSTANCE = 110, 113, 130, 111
STALE_TOPOLOGY, MISSING_SOURCE_TOPICS, MISSING_INTERNAL_TOPICS, SHUTDOWN_APPLICATION, ASSIGNMENT_DELAYED = 0, 1, 3, 4, 5
HB, DESCRIBE = P.STREAMS_GROUP_HEARTBEAT, P.STREAMS_GROUP_DESCRIBE


def topic_info(name: str, partitions: int = 0, configs: dict | None = None):
    return nested(HB, 0, "TopicInfo", name=name, partitions=i32(partitions), replication_factor=i16(0),
                  topic_configs=tuple(nested(HB, 0, "KeyValue", key=k, value=v) for k, v in (configs or {}).items()))


def word_count(app: str, source: str = "in", changelog_partitions: int = 0, regex: tuple = ()):
    """Kafka Streams' word count as its client describes it: subtopology 0 reads `source` and writes the
    repartition topic, subtopology 1 reads it and keeps a store with a changelog."""
    repartition, changelog = f"{app}-counts-repartition", f"{app}-counts-changelog"
    return nested(HB, 0, "Topology", epoch=i32(0), subtopologies=(
        nested(HB, 0, "Subtopology", subtopology_id="0", source_topics=(source,), source_topic_regex=regex,
               state_changelog_topics=(), repartition_sink_topics=(repartition,), repartition_source_topics=(),
               copartition_groups=()),
        nested(HB, 0, "Subtopology", subtopology_id="1", source_topics=(), source_topic_regex=(),
               state_changelog_topics=(topic_info(changelog, changelog_partitions, {"cleanup.policy": "compact"}),),
               repartition_sink_topics=(), repartition_source_topics=(topic_info(repartition),),
               copartition_groups=())))


class StreamsMember:
    """One streams-protocol member over its own connection; it remembers its epoch and the tasks it owns."""

    def __init__(self, port: int, group: str, member_id: str, topology=None) -> None:
        self.conn = R.RawConnection("127.0.0.1", port)
        self.group, self.member_id = group, member_id
        self.topology = topology if topology is not None else word_count(group)
        self.epoch, self.owned, self.standby = 0, {}, {}

    def heartbeat(self, epoch: int | None = None, topology=None, owned: dict | None = None, **fields):
        epoch = self.epoch if epoch is None else epoch
        owned = self.owned if owned is None else owned
        joining = epoch == 0
        def task_ids(tasks: dict) -> tuple:
            return tuple(nested(HB, 0, "TaskIds", subtopology_id=s, partitions=tuple(map(i32, sorted(ps))))
                         for s, ps in sorted(tasks.items()) if ps) if not joining else ()
        values = dict(group_id=self.group, member_id=self.member_id, member_epoch=i32(epoch),
                      endpoint_information_epoch=i32(0), instance_id=None, rack_id=None,
                      rebalance_timeout=ms(5000 if joining else -1),
                      topology=(topology or self.topology) if joining else None, active_tasks=task_ids(owned),
                      standby_tasks=task_ids(self.standby), warmup_tasks=(), process_id="process-" + self.member_id,
                      user_endpoint=None, client_tags=(), task_offsets=(), task_end_offsets=(),
                      shutdown_application=False)
        values.update(fields)
        response = self.conn.call(HB, 0, body(HB, 0, "StreamsGroupHeartbeatRequest", **values))
        if int(response.error_code) == NONE and epoch >= 0:
            self.epoch = int(response.member_epoch)
            if response.active_tasks is not None:
                self.owned = {t.subtopology_id: set(map(int, t.partitions)) for t in response.active_tasks}
                self.standby = {t.subtopology_id: set(map(int, t.partitions)) for t in response.standby_tasks}
        return response

    def tasks(self) -> list:
        return sorted((s, p) for s, ps in self.owned.items() for p in ps)

    def close(self) -> None:
        self.conn.close()


def describe(port: int, *groups: str):
    with R.RawConnection("127.0.0.1", port) as conn:
        return conn.call(DESCRIBE, 0, body(DESCRIBE, 0, "StreamsGroupDescribeRequest", group_ids=groups,
                                           include_authorized_operations=False)).groups


def statuses(response) -> list:
    return [int(s.status_code) for s in (response.status or ())]


def settle(*members, rounds: int = 10) -> None:
    """Heartbeat every member in turn until no answer changes anything (at most `rounds` rounds)."""
    for _ in range(rounds):
        before = [(m.epoch, m.tasks(), m.standby) for m in members]
        for member in members:
            assert int(member.heartbeat().error_code) == NONE
        if [(m.epoch, m.tasks(), m.standby) for m in members] == before:
            return
    raise AssertionError("the members did not settle")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(tmp_path_factory.mktemp("streams-protocol"), workers=2, config=CONFIG) as started:
        create_topic(started.bootstrap, "in", 4)
        yield started


@pytest.fixture
def members(node):
    made = []

    def make(*args, **kwargs) -> StreamsMember:
        made.append(StreamsMember(node.port, *args, **kwargs))
        return made[-1]

    yield make
    for member in made:
        member.close()


def topic_partitions(node, *names: str) -> dict:
    with R.RawConnection("127.0.0.1", node.port) as conn:
        response = conn.call(P.METADATA, 12, R.metadata_body(list(names), version=12, allow_auto_topic_creation=False))
    return {t.name: len(t.partitions) for t in response.topics if int(t.error_code) == NONE}


def test_the_first_member_registers_the_topology_and_the_node_creates_its_internal_topics(node, members):
    a = members("wc1", "a")
    response = a.heartbeat()
    assert int(response.error_code) == NONE and a.epoch >= 1
    assert MISSING_INTERNAL_TOPICS not in statuses(response)
    # The repartition topic takes its writer's source partitions (4); the changelog its subtopology's tasks.
    assert topic_partitions(node, "wc1-counts-repartition", "wc1-counts-changelog") == {
        "wc1-counts-repartition": 4, "wc1-counts-changelog": 4}
    assert a.tasks() == [(s, p) for s in ("0", "1") for p in range(4)]
    assert int(response.heartbeat_interval.total_seconds() * 1000) == 100
    group, = describe(node.port, "wc1")
    assert int(group.error_code) == NONE and group.group_state == "Stable"
    assert [s.subtopology_id for s in group.topology.subtopologies] == ["0", "1"]
    assert group.topology.subtopologies[1].state_changelog_topics[0].name == "wc1-counts-changelog"
    member, = group.members
    assert member.member_id == "a" and member.process_id == "process-a" and int(member.member_epoch) == a.epoch
    assert sorted((t.subtopology_id, int(p)) for t in member.assignment.active_tasks for p in t.partitions) == \
        a.tasks()


def test_two_members_share_the_tasks_with_revocation_before_assignment(members):
    a, b = members("wc2", "a"), members("wc2", "b")
    a.heartbeat()
    assert len(a.tasks()) == 8
    b.heartbeat()
    assert b.tasks() == []  # a owns them all until it says it gave half up
    a.heartbeat()
    assert len(a.tasks()) == 4
    settle(a, b)
    assert len(b.tasks()) == 4 and not set(a.tasks()) & set(b.tasks())
    assert a.epoch == b.epoch
    # b leaves: a takes everything at a new epoch.
    assert int(b.heartbeat(epoch=-1).error_code) == NONE
    settle(a)
    assert len(a.tasks()) == 8


def test_a_topology_that_cannot_work_is_refused(node, members):
    bad = members("wc3", "a", topology=word_count("wc3", changelog_partitions=3))
    response = bad.heartbeat()
    assert int(response.error_code) == INVALID_TOPOLOGY and "Changelog topic" in response.error_message
    regex = members("wc3", "b", topology=word_count("wc3", regex=("in.*",)))
    assert int(regex.heartbeat().error_code) == INVALID_REQUEST
    without = members("wc3", "c")
    response = without.conn.call(HB, 0, body(
        HB, 0, "StreamsGroupHeartbeatRequest", group_id="wc3", member_id="c", member_epoch=i32(0),
        endpoint_information_epoch=i32(0), instance_id=None, rack_id=None, rebalance_timeout=ms(5000),
        topology=None, active_tasks=(), standby_tasks=(), warmup_tasks=(), process_id="p", user_endpoint=None,
        client_tags=(), task_offsets=(), task_end_offsets=(), shutdown_application=False))
    assert int(response.error_code) == INVALID_REQUEST and "Topology must be non-null" in response.error_message
    # The group's topology is set by its first member: another one at the same epoch is refused.
    first = members("wc4", "a")
    assert int(first.heartbeat().error_code) == NONE
    other = members("wc4", "b", topology=word_count("wc4", source="other-in"))
    assert int(other.heartbeat().error_code) == INVALID_REQUEST
    # A refused join leaves nothing behind: no member, no group.
    assert [m.member_id for m in describe(node.port, "wc4")[0].members] == ["a"]
    assert int(describe(node.port, "wc3")[0].error_code) == GROUP_ID_NOT_FOUND


def test_internal_topics_the_node_cannot_create_are_a_status(node, members):
    huge = nested(HB, 0, "Topology", epoch=i32(0), subtopologies=(nested(
        HB, 0, "Subtopology", subtopology_id="0", source_topics=("in",), source_topic_regex=(),
        state_changelog_topics=(topic_info("bad name!"),), repartition_sink_topics=(),
        repartition_source_topics=(topic_info("wc12-huge", 2**31 - 1),), copartition_groups=()),))
    a = members("wc12", "a", topology=huge)
    response = a.heartbeat()
    assert int(response.error_code) == NONE and a.tasks() == []
    status, = response.status
    assert int(status.status_code) == MISSING_INTERNAL_TOPICS and "bad name!" in status.status_detail
    assert topic_partitions(node, "wc12-huge") == {}
    assert int(members("", "a").heartbeat().error_code) == INVALID_REQUEST  # an empty group id
    assert int(a.heartbeat(epoch=-3).error_code) == INVALID_REQUEST
    assert int(a.heartbeat().error_code) == NONE  # the member is still there


def test_unknown_members_and_fenced_epochs(members):
    a, b = members("wc5", "a"), members("wc5", "b")
    a.heartbeat()
    settle(a, b)
    assert a.epoch >= 2
    stranger = members("wc5", "stranger")
    assert int(stranger.heartbeat(epoch=3).error_code) == UNKNOWN_MEMBER
    assert int(members("nobody", "x").heartbeat(epoch=1).error_code) == UNKNOWN_MEMBER
    assert int(a.heartbeat(epoch=a.epoch + 5).error_code) == FENCED_EPOCH
    # Its previous epoch is accepted only with tasks within its assignment (it missed an answer), not with b's.
    everything = {"0": set(range(4)), "1": set(range(4))}
    assert int(a.heartbeat(epoch=a.epoch - 1, owned=everything).error_code) == FENCED_EPOCH
    # Owned tasks outside the topology are an invalid request.
    assert int(a.heartbeat(owned={"7": {0}}).error_code) == INVALID_REQUEST
    assert int(a.heartbeat().error_code) == NONE


def test_a_static_member_keeps_its_tasks_while_it_is_away(members):
    a, b = members("wc9", "a"), members("wc9", "b")
    assert int(a.heartbeat(instance_id="ia").error_code) == NONE
    settle(a, b)
    tasks, epoch = a.tasks(), a.epoch
    assert int(a.heartbeat(epoch=-2, instance_id="ia").error_code) == NONE
    settle(b)
    assert len(b.tasks()) == 4  # a's tasks wait for it
    back = members("wc9", "a-again")
    response = back.heartbeat(instance_id="ia", process_id="process-a")  # the tasks of its instance, same epoch
    assert int(response.error_code) == NONE and back.tasks() == tasks and back.epoch == epoch
    thief = members("wc9", "a-thief")
    assert int(thief.heartbeat(instance_id="ia").error_code) == UNRELEASED_INSTANCE


def test_endpoints_stale_topologies_and_shutdown_requests_reach_every_member(members):
    a, b = members("wc10", "a"), members("wc10", "b")
    endpoint = nested(HB, 0, "Endpoint", host="a.example", port=u16(7070))
    a.heartbeat(user_endpoint=endpoint)
    settle(a, b)
    response = b.heartbeat()  # b's endpoint epoch (0) is behind the group's: the partitions of a's tasks
    published, = response.partitions_by_user_endpoint
    assert (published.user_endpoint.host, int(published.user_endpoint.port)) == ("a.example", 7070)
    a_partitions = sorted((p.topic, int(i)) for p in published.active_partitions for i in p.partitions)
    wanted = {("in" if s == "0" else "wc10-counts-repartition", p) for s, p in a.tasks()}
    assert a_partitions == sorted(wanted)
    current = int(response.endpoint_information_epoch)
    assert b.heartbeat(endpoint_information_epoch=i32(current)).partitions_by_user_endpoint is None
    # A member of an older topology epoch is told so; a shutdown request reaches every member.
    newer = nested(HB, 0, "Topology", epoch=i32(1), subtopologies=word_count("wc11").subtopologies)
    c, d = members("wc11", "c", topology=newer), members("wc11", "d")
    c.heartbeat()
    assert STALE_TOPOLOGY in statuses(d.heartbeat())
    assert int(c.heartbeat(shutdown_application=True).error_code) == NONE
    assert SHUTDOWN_APPLICATION in statuses(d.heartbeat())


def test_missing_source_topics_are_a_status_and_no_tasks(node, members):
    a = members("wc6", "a", topology=word_count("wc6", source="wc6-in"))
    response = a.heartbeat()
    assert int(response.error_code) == NONE and MISSING_SOURCE_TOPICS in statuses(response) and a.tasks() == []
    assert describe(node.port, "wc6")[0].group_state == "NotReady"
    create_topic(node.bootstrap, "wc6-in", 2)
    response = a.heartbeat()
    assert statuses(response) == [] and a.tasks() == [(s, p) for s in ("0", "1") for p in range(2)]


def test_a_streams_group_beside_the_other_protocols(node, members):
    a = members("wc7", "a")
    a.heartbeat()
    with R.RawConnection("127.0.0.1", node.port) as conn:
        listed = conn.call(P.LIST_GROUPS, 5, body(P.LIST_GROUPS, 5, "ListGroupsRequest", states_filter=(),
                                                  types_filter=("streams",)))
        assert "wc7" in {g.group_id for g in listed.groups}
        assert {g.group_type for g in listed.groups} == {"streams"}
        described = conn.call(P.DESCRIBE_GROUPS, 5, body(P.DESCRIBE_GROUPS, 5, "DescribeGroupsRequest",
                                                         groups=("wc7",), include_authorized_operations=False))
        assert int(described.groups[0].error_code) == GROUP_ID_NOT_FOUND
        consumer = conn.call(P.CONSUMER_GROUP_DESCRIBE, 1, body(
            P.CONSUMER_GROUP_DESCRIBE, 1, "ConsumerGroupDescribeRequest", group_ids=("wc7",),
            include_authorized_operations=False))
        assert int(consumer.groups[0].error_code) == GROUP_ID_NOT_FOUND
        assert "not a consumer group" in consumer.groups[0].error_message

        def commit(epoch: int) -> int:
            response = conn.call(P.OFFSET_COMMIT, 9, body(
                P.OFFSET_COMMIT, 9, "OffsetCommitRequest", group_id="wc7", generation_id_or_member_epoch=i32(epoch),
                member_id="a", group_instance_id=None,
                retention_time=i64Timedelta.parse(datetime.timedelta(milliseconds=-1)),
                topics=(nested(P.OFFSET_COMMIT, 9, "OffsetCommitRequestTopic", name="in", partitions=(nested(
                    P.OFFSET_COMMIT, 9, "OffsetCommitRequestPartition", partition_index=i32(0),
                    committed_offset=i64(7), committed_leader_epoch=i32(-1), committed_metadata=""),)),)))
            return int(response.topics[0].partitions[0].error_code)

        assert commit(a.epoch + 1) == STALE_EPOCH
        assert commit(a.epoch) == NONE
        # A group is one protocol's: a consumer heartbeat and a classic join are refused while it has members.
        consumer_join = conn.call(P.CONSUMER_GROUP_HEARTBEAT, 1, body(
            P.CONSUMER_GROUP_HEARTBEAT, 1, "ConsumerGroupHeartbeatRequest", group_id="wc7", member_id="c",
            member_epoch=i32(0), instance_id=None, rack_id=None, rebalance_timeout=ms(5000),
            subscribed_topic_names=("in",), subscribed_topic_regex=None, server_assignor=None, topic_partitions=()))
        assert int(consumer_join.error_code) == GROUP_ID_NOT_FOUND
        classic_join = conn.call(P.JOIN_GROUP, 7, body(
            P.JOIN_GROUP, 7, "JoinGroupRequest", group_id="wc7", session_timeout=ms(10_000),
            rebalance_timeout=ms(10_000), member_id="", group_instance_id=None, protocol_type="consumer",
            protocols=(nested(P.JOIN_GROUP, 7, "JoinGroupRequestProtocol", name="range", metadata=b""),)))
        assert int(classic_join.error_code) == INCONSISTENT_PROTOCOL

        def delete() -> int:
            response = conn.call(P.DELETE_GROUPS, 2, body(P.DELETE_GROUPS, 2, "DeleteGroupsRequest",
                                                          groups_names=("wc7",)))
            return int(response.results[0].error_code)

        assert delete() == NON_EMPTY_GROUP
        assert int(a.heartbeat(epoch=-1).error_code) == NONE
        assert delete() == NONE
    assert int(describe(node.port, "wc7")[0].error_code) == GROUP_ID_NOT_FOUND


def test_a_silent_member_is_fenced_when_its_session_ends(node, members):
    a, b = members("wc8", "a"), members("wc8", "b")
    a.heartbeat()
    settle(a, b)
    deadline = time.monotonic() + 10
    while len(b.tasks()) < 8 and time.monotonic() < deadline:  # a says nothing: after 1.5 s b has it all
        assert int(b.heartbeat().error_code) == NONE
        time.sleep(0.1)
    assert len(b.tasks()) == 8
    assert int(a.heartbeat().error_code) == UNKNOWN_MEMBER


def test_standby_tasks_follow_the_groups_configs_which_survive_a_restart(node, members):
    """KIP-1071's group configs on the GROUP resource (streams.num.standby.replicas, streams.heartbeat.interval.ms,
    streams.session.timeout.ms, streams.initial.rebalance.delay.ms), through confluent-kafka's admin client:
    checked against the node's bounds (INVALID_CONFIG), used at the group's next heartbeat. With one standby
    replica, each of two processes holds the other's stateful tasks (subtopology 1, the one with a changelog) as
    standby, in the heartbeat answers and in StreamsGroupDescribe; back to none, the standbys are revoked. Configs
    and standbys survive a node restart."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    client = AdminClient({"bootstrap.servers": node.bootstrap})

    def alter(group: str, op=AlterConfigOpType.SET, **values) -> int | None:
        entries = [ConfigEntry(name.replace("_", "."), value, incremental_operation=op)
                   for name, value in values.items()]
        resource = ConfigResource("group", group, incremental_configs=entries)
        try:
            client.incremental_alter_configs([resource])[resource].result(timeout=30)
            return None
        except KafkaException as exc:
            return exc.args[0].code()

    def described(group: str) -> dict:
        resource = ConfigResource("group", group)
        return {n: (e.value, e.source) for n, e in client.describe_configs([resource])[resource].result(timeout=30)
                .items() if n.startswith("streams.")}

    assert alter("sb", streams_num_standby_replicas="3") == INVALID_CONFIG  # above group.streams.max.standby.replicas
    assert alter("sb", streams_num_standby_replicas="-1") == INVALID_CONFIG
    assert alter("sb", streams_num_standby_replicas="one") == INVALID_CONFIG
    assert alter("sb", streams_session_timeout_ms="1499") == INVALID_CONFIG  # below its min (1500 here)
    assert alter("sb", streams_session_timeout_ms="60001") == INVALID_CONFIG  # above Kafka's max
    assert alter("sb", streams_heartbeat_interval_ms="15001") == INVALID_CONFIG  # above Kafka's max
    assert alter("sb", streams_heartbeat_interval_ms="1500") == INVALID_CONFIG  # not below the session (1500)
    assert alter("sb", streams_initial_rebalance_delay_ms="-1") == INVALID_CONFIG
    assert alter("sb", streams_num_warmup_replicas="1") == INVALID_CONFIG  # Kafka's; the node has no warm-ups
    # A delay for one group (the node's is 0 here): its first member waits, told so.
    assert alter("sb-delayed", streams_initial_rebalance_delay_ms="60000") is None
    delayed = members("sb-delayed", "d", topology=word_count("sb-delayed"))
    assert statuses(delayed.heartbeat()) == [ASSIGNMENT_DELAYED] and delayed.tasks() == []
    assert alter("sb", streams_num_standby_replicas="1", streams_heartbeat_interval_ms="200",
                 streams_session_timeout_ms="3000") is None  # before the group exists
    assert described("sb") == {"streams.num.standby.replicas": ("1", 8), "streams.heartbeat.interval.ms": ("200", 8),
                               "streams.session.timeout.ms": ("3000", 8),  # GROUP_CONFIG
                               "streams.initial.rebalance.delay.ms": ("0", 4)}  # STATIC_BROKER_CONFIG

    a, b = members("sb", "a"), members("sb", "b")  # processes "process-a" and "process-b"
    assert a.heartbeat().heartbeat_interval.total_seconds() == 0.2
    b.heartbeat()
    settle(a, b)
    assert sorted(a.owned) == sorted(b.owned) == ["0", "1"] and len(a.tasks()) == len(b.tasks()) == 4
    assert a.standby == {"1": b.owned["1"]} and b.standby == {"1": a.owned["1"]}  # stateless "0": none

    def assignments(group_id: str) -> dict:
        group, = describe(node.port, group_id)
        assert int(group.error_code) == NONE

        def tasks(ids) -> dict:
            return {t.subtopology_id: set(map(int, t.partitions)) for t in ids}
        return {m.member_id: (tasks(m.assignment.standby_tasks), tasks(m.target_assignment.standby_tasks))
                for m in group.members}
    assert assignments("sb") == {"a": (a.standby, a.standby), "b": (b.standby, b.standby)}

    # The configs outlive the node; so do the members' standby tasks (in the group's snapshot).
    node.stop()
    node.start()
    client = AdminClient({"bootstrap.servers": node.bootstrap})
    assert described("sb")["streams.num.standby.replicas"] == ("1", 8)
    assert assignments("sb") == {"a": (a.standby, a.standby), "b": (b.standby, b.standby)}
    for member in (a, b):
        member.conn.close()
        member.conn = R.RawConnection("127.0.0.1", node.port)

    epoch = a.epoch
    assert alter("sb", op=AlterConfigOpType.DELETE, streams_num_standby_replicas="") is None  # the node's 0
    settle(a, b)
    assert a.epoch > epoch and a.standby == b.standby == {} and len(a.tasks()) == len(b.tasks()) == 4
    assert assignments("sb") == {"a": ({}, {}), "b": ({}, {})}


def test_the_initial_rebalance_delay_and_a_restart_that_keeps_the_group(tmp_path):
    # A session longer than the test: the members are silent while the stats are read and the node restarts.
    config = ("[groups]\nstreams_session_timeout_ms = 60000\nstreams_initial_rebalance_delay_ms = 500\n"
              "[stats]\npublish_interval_ms = 100\n")
    with NodeProcess(tmp_path, workers=1, config=config) as node:
        create_topic(node.bootstrap, "in", 2)
        a = StreamsMember(node.port, "kept", "a", topology=word_count("kept"))
        b = StreamsMember(node.port, "kept", "b", topology=word_count("kept"))
        try:
            started = time.monotonic()
            delayed = [a.heartbeat(), b.heartbeat()]  # both in the delay: no tasks yet
            assert [statuses(r) for r in delayed] == [[ASSIGNMENT_DELAYED]] * 2 and a.tasks() == b.tasks() == []
            time.sleep(max(0.0, started + 0.6 - time.monotonic()))
            a.heartbeat()
            b.heartbeat()  # each gets its share at once: nothing had to move
            assert len(a.tasks()) == len(b.tasks()) == 2 and a.epoch == b.epoch
            assert statuses(a.heartbeat()) == []
            epoch, tasks = a.epoch, a.tasks()
        finally:
            a.close()
            b.close()
        deadline = time.monotonic() + 10
        while (totals := stats_json(node)["totals"])["streams_groups"] != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (totals["streams_groups"], totals["streams_group_members"]) == (1, 2)
        node.stop()
        node.start()
        group, = describe(node.port, "kept")
        assert int(group.error_code) == NONE and sorted(m.member_id for m in group.members) == ["a", "b"]
        assert int(group.group_epoch) >= epoch and group.topology is not None
        a = StreamsMember(node.port, "kept", "a", topology=word_count("kept"))
        try:
            a.epoch, a.owned = epoch, {s: {p for t, p in tasks if t == s} for s, _ in tasks}
            response = a.heartbeat()  # it goes on at its epoch, with its tasks
            assert int(response.error_code) == NONE and a.epoch == epoch
        finally:
            a.close()
