"""`shmbroker topics ...` and `shmbroker groups ...`: administration through the Kafka API (confluent-kafka's
AdminClient), so the commands work against any reachable node, or any Kafka-compatible broker.

Lag is what Kafka's tools compute: per partition, the high watermark (ListOffsets) minus the group's committed
offset (OffsetFetch); a partition without a committed offset has no lag figure (shown as "-").

Invariants: every call is bounded by `timeout_s`; the bootstrap address is first reached with a plain TCP connect
bounded by `connect_timeout_s`, so an address nobody listens on is reported at once (librdkafka alone would retry
it for the whole timeout); an unreachable broker raises Unreachable (exit code 3 in the CLI), a broker's error code
raises AdminError with Kafka's error name, and a group that does not exist raises NoSuchGroup.

A consumer-protocol group's epochs (the group's, its target assignment's, each member's) are not in librdkafka's
admin API: they come from one ConsumerGroupDescribe request of this module's own (kio's schema), sent to the
bootstrap broker, which is the coordinator of every group on a shmbroker node. Share groups (KIP-932) are not in
it either: they are listed with a ListGroups v5 (type "share") and described with ShareGroupDescribe and
DescribeShareGroupOffsets (each share-partition's start offset and lag) of the same kind.

A share-partition's records in flight (acquired, or available for redelivery, between its start offset and the end
of its in-flight window) are in no Kafka API's answer. The node writes a share-partition's whole state to its
`__consumer_offsets` at every change (node.timer.groups.share), so the latest record of the share-partition there
is its state in the coordinator's memory: `describe` reads that topic (a Fetch, as any client may) to the high
watermark it found, keeps each of the group's share-partitions' latest record as the node's load does, and counts
with the node's own decoder of that record (node.storage.share_records, versioned: a format it does not know is
told as unknown, never misread). That count is exact as of the read, where a counter of the stats segment would be
as of its last publication. A broker that is not a shmbroker node (or a log not read to its end in `timeout_s`)
gives no count ("-").
"""

from __future__ import annotations

import io
import socket
import struct
import time
import uuid
from dataclasses import dataclass

from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest
from kio.schema.consumer_group_describe.v1.response import ConsumerGroupDescribeResponse
from kio.schema.describe_share_group_offsets.v1.request import (DescribeShareGroupOffsetsRequest,
                                                                 DescribeShareGroupOffsetsRequestGroup)
from kio.schema.describe_share_group_offsets.v1.response import DescribeShareGroupOffsetsResponse
from kio.schema.list_groups.v5.request import ListGroupsRequest
from kio.schema.list_groups.v5.response import ListGroupsResponse
from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest
from kio.schema.share_group_describe.v1.response import ShareGroupDescribeResponse
from kio.schema.request_header.v2.header import RequestHeader
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from confluent_kafka import (ConsumerGroupState, ConsumerGroupTopicPartitions, Consumer, KafkaError, KafkaException,
                             TopicCollection, TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic
import orjson

from shmbroker.node.storage.catalog import topic_id_text
from shmbroker.node.storage.share_records import apply_versioned, recorded_in_flight, share_state_key

OFFSETS_TOPIC = "__consumer_offsets"  # where a shmbroker node keeps the share-partitions' states


class AdminError(RuntimeError):
    """The broker answered with an error."""


class Unreachable(RuntimeError):
    """No broker answered at the bootstrap address."""


class NoSuchGroup(AdminError):
    """The group is not known to the coordinator (Kafka's describe answers it as Dead)."""


def _raise(exc: KafkaException, what: str) -> None:
    error = exc.args[0] if exc.args else None
    name = error.name() if hasattr(error, "name") else str(exc)
    text = error.str() if hasattr(error, "str") else str(exc)
    if name in ("_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN"):
        raise Unreachable(f"{what}: {text}") from None
    raise AdminError(f"{what}: {name}: {text}") from None


def read_client_properties(path: str) -> dict[str, str]:
    """A Kafka tools' `--command-config` file: `key=value` lines of client settings (librdkafka's names:
    security.protocol, sasl.mechanism, sasl.username, sasl.password, ssl.ca.location, ...); '#' starts a comment."""
    settings: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{path}:{number}: expected key=value")
            settings[key.strip()] = value.strip()
    return settings


@dataclass
class Admin:
    bootstrap: str
    timeout_s: float
    connect_timeout_s: float
    client_settings: dict | None = None  # extra client settings (security) from --command-config

    def __post_init__(self) -> None:
        self._reach()
        self._config = {"bootstrap.servers": self.bootstrap, "socket.timeout.ms": int(self.timeout_s * 1000),
                        "socket.connection.setup.timeout.ms": int(self.connect_timeout_s * 1000),
                        "client.id": "shmbroker-cli", **(self.client_settings or {})}
        self.client = AdminClient({**self._config, "logger": _QuietLogger()})

    def _reach(self) -> None:
        """A TCP connect to some bootstrap address within connect_timeout_s, or Unreachable."""
        reasons = []
        for address in self.bootstrap.split(","):
            host, _, port = address.strip().rpartition(":")
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=self.connect_timeout_s).close()
                return
            except OSError as exc:
                reasons.append(f"{address.strip()}: {exc.strerror or 'no answer in %gs' % self.connect_timeout_s}")
        raise Unreachable("; ".join(reasons))

    def _metadata(self):
        try:
            return self.client.list_topics(timeout=self.timeout_s)
        except KafkaException as exc:
            _raise(exc, f"cannot reach {self.bootstrap}")

    def topics(self, include_internal: bool = False) -> list[dict]:
        metadata = self._metadata()
        out = []
        for name in sorted(metadata.topics):
            if name.startswith("__") and not include_internal:
                continue
            topic = metadata.topics[name]
            out.append({"topic": name, "partitions": len(topic.partitions),
                        "error": topic.error.name() if topic.error else None})
        return out

    def describe_topic(self, name: str) -> dict:
        metadata = self._metadata()  # all topics: a Metadata request naming the topic could auto-create it
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None:
            raise AdminError(f"topic {name}: {topic.error.name() if topic and topic.error else 'UNKNOWN_TOPIC_OR_PART'}")
        partitions = []
        with self._consumer() as consumer:
            for pid in sorted(topic.partitions):
                low, high = self._watermarks(consumer, name, pid)
                p = topic.partitions[pid]
                partitions.append({"partition": pid, "leader": p.leader, "replicas": list(p.replicas),
                                   "log_start_offset": low, "high_watermark": high})
        return {"topic": name, "topic_id": self._topic_id(name), "partitions": partitions}

    def _topic_id(self, name: str) -> str | None:
        """The topic's id (KIP-516) in Kafka's text form, None from a broker without topic ids."""
        future = self.client.describe_topics(TopicCollection([name]), request_timeout=self.timeout_s)[name]
        try:
            found = future.result(timeout=self.timeout_s * 2).topic_id
        except KafkaException as exc:
            _raise(exc, f"cannot describe topic {name}")
        if found is None:
            return None
        mask = (1 << 64) - 1
        value = (found.get_most_significant_bits() & mask) << 64 | found.get_least_significant_bits() & mask
        return topic_id_text(uuid.UUID(int=value)) if value else None

    def create_topic(self, name: str, partitions: int) -> None:
        futures = self.client.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                                            operation_timeout=self.timeout_s, request_timeout=self.timeout_s)
        try:
            futures[name].result(timeout=self.timeout_s * 2)
        except KafkaException as exc:
            _raise(exc, f"cannot create topic {name}")

    def delete_topic(self, name: str) -> None:
        futures = self.client.delete_topics([name], operation_timeout=self.timeout_s, request_timeout=self.timeout_s)
        try:
            futures[name].result(timeout=self.timeout_s * 2)
        except KafkaException as exc:
            _raise(exc, f"cannot delete topic {name}")

    def groups(self) -> list[dict]:
        """Every group with its state. ListGroups before v4 carries no states (librdkafka then says UNKNOWN):
        those come from DescribeGroups, as kafka-consumer-groups --list --state does."""
        self._metadata()  # an unreachable broker says so here, rather than as an empty list
        future = self.client.list_consumer_groups(request_timeout=self.timeout_s)
        try:
            result = future.result(timeout=self.timeout_s * 2)
        except KafkaException as exc:
            _raise(exc, "cannot list groups")
        listed = sorted(result.valid, key=lambda g: g.group_id)
        states = {g.group_id: g.state for g in listed if g.state not in (None, ConsumerGroupState.UNKNOWN)}
        unknown = [g.group_id for g in listed if g.group_id not in states]
        if unknown:
            futures = self.client.describe_consumer_groups(unknown, request_timeout=self.timeout_s)
            for group_id, future in futures.items():
                try:
                    states[group_id] = future.result(timeout=self.timeout_s * 2).state
                except KafkaException as exc:
                    _raise(exc, f"cannot describe group {group_id}")
        return [{"group": g.group_id, "state": states[g.group_id].name if g.group_id in states else "UNKNOWN",
                 "simple": bool(g.is_simple_consumer_group)} for g in listed] + self.share_groups()

    def describe_group(self, group_id: str) -> dict:
        """Members and, per partition with a committed offset, its offset, the high watermark and the lag (a
        share group's: per share-partition, its start offset, the high watermark and the lag)."""
        shared = self.describe_share_group(group_id)
        if shared is not None:
            return shared
        futures = self.client.describe_consumer_groups([group_id], request_timeout=self.timeout_s)
        try:
            description = futures[group_id].result(timeout=self.timeout_s * 2)
        except KafkaException as exc:
            _raise(exc, f"cannot describe group {group_id}")
        if description.state == ConsumerGroupState.DEAD:
            raise NoSuchGroup(f"group {group_id} does not exist")
        owners = {}
        members = []
        for member in description.members:
            assigned = [(tp.topic, tp.partition) for tp in (member.assignment.topic_partitions
                                                            if member.assignment else [])]
            target = getattr(member, "target_assignment", None)  # consumer-protocol members (KIP-848) only
            members.append({"member_id": member.member_id, "client_id": member.client_id, "host": member.host,
                            "instance_id": member.group_instance_id,
                            "partitions": [f"{t}-{p}" for t, p in sorted(assigned)],
                            "target": None if target is None else sorted(
                                f"{tp.topic}-{tp.partition}" for tp in target.topic_partitions)})
            for key in assigned:
                owners[key] = member.member_id
        offsets_future = self.client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)],
                                                                 request_timeout=self.timeout_s)
        try:
            committed = offsets_future[group_id].result(timeout=self.timeout_s * 2).topic_partitions
        except KafkaException as exc:
            _raise(exc, f"cannot fetch the offsets of group {group_id}")
        partitions = []
        with self._consumer() as consumer:
            for tp in sorted(committed, key=lambda tp: (tp.topic, tp.partition)):
                _, high = self._watermarks(consumer, tp.topic, tp.partition)
                offset = tp.offset if tp.offset >= 0 else None
                partitions.append({"topic": tp.topic, "partition": tp.partition, "committed_offset": offset,
                                   "high_watermark": high, "lag": None if offset is None else max(0, high - offset),
                                   "member_id": owners.get((tp.topic, tp.partition))})
        group_type = getattr(description, "type", None)
        epochs = self.consumer_group_epochs(group_id) if group_type is not None and group_type.name == "CONSUMER" \
            else None
        for member in members:
            member["member_epoch"] = epochs["members"].get(member["member_id"]) if epochs else None
        return {"group": group_id, "state": description.state.name if description.state else "",
                **({"group_epoch": epochs["group_epoch"], "assignment_epoch": epochs["assignment_epoch"]}
                   if epochs else {}),
                "type": group_type.name.lower() if group_type is not None else "classic",
                "protocol": description.partition_assignor, "members": members, "partitions": partitions,
                "total_lag": sum(p["lag"] or 0 for p in partitions)}

    def consumer_group_epochs(self, group_id: str) -> dict | None:
        """{"group_epoch", "assignment_epoch", "assignor", "members": {member id: epoch}} of a consumer-protocol
        group, or None if the group is not one (or the broker does not speak ConsumerGroupDescribe)."""
        response = self._raw(69, 1, ConsumerGroupDescribeRequest(group_ids=(group_id,),
                                                                 include_authorized_operations=False),
                             ConsumerGroupDescribeResponse)
        if response is None:
            return None
        (group,) = response.groups
        if int(group.error_code):
            return None
        return {"group_epoch": int(group.group_epoch), "assignment_epoch": int(group.assignment_epoch),
                "assignor": group.assignor_name, "members": {m.member_id: int(m.member_epoch) for m in group.members}}

    def share_groups(self) -> list[dict]:
        """The share groups (ListGroups v5, type "share"), or [] if the broker has none or no such API."""
        response = self._raw(16, 5, ListGroupsRequest(states_filter=(), types_filter=("share",)), ListGroupsResponse)
        if response is None or int(response.error_code):
            return []
        return [{"group": g.group_id, "state": g.group_state.upper(), "simple": False, "type": "share"}
                for g in sorted(response.groups, key=lambda g: g.group_id) if g.group_type == "share"]

    def describe_share_group(self, group_id: str) -> dict | None:
        """A share group's members and, per share-partition, its start offset, high watermark, lag and records in
        flight; None if the group is not a share group."""
        described = self._raw(77, 1, ShareGroupDescribeRequest(group_ids=(group_id,),
                                                               include_authorized_operations=False),
                              ShareGroupDescribeResponse)
        if described is None or int(described.groups[0].error_code):
            return None
        group = described.groups[0]
        offsets = self._raw(90, 1, DescribeShareGroupOffsetsRequest(groups=(DescribeShareGroupOffsetsRequestGroup(
            group_id=group_id, topics=None),)), DescribeShareGroupOffsetsResponse)
        members = [{"member_id": m.member_id, "client_id": m.client_id, "host": m.client_host, "instance_id": None,
                    "member_epoch": int(m.member_epoch), "target": None,
                    "partitions": sorted(f"{t.topic_name}-{p}" for t in m.assignment.topic_partitions
                                         for p in t.partitions)} for m in group.members]
        partitions = []
        if offsets is not None and not int(offsets.groups[0].error_code):
            in_flight = self.share_in_flight(group_id)
            with self._consumer() as consumer:
                for topic in sorted(offsets.groups[0].topics, key=lambda t: t.topic_name):
                    for p in sorted(topic.partitions, key=lambda p: p.partition_index):
                        _, high = self._watermarks(consumer, topic.topic_name, int(p.partition_index))
                        start = int(p.start_offset)
                        partitions.append({"topic": topic.topic_name, "partition": int(p.partition_index),
                                           "start_offset": start if start >= 0 else None, "high_watermark": high,
                                           "lag": int(p.lag) if int(p.lag) >= 0 else None,
                                           "in_flight": in_flight.get((topic.topic_name, int(p.partition_index)))})
        return {"group": group_id, "state": group.group_state.upper(), "type": "share",
                "group_epoch": int(group.group_epoch), "assignment_epoch": int(group.assignment_epoch),
                "protocol": group.assignor_name, "members": members, "partitions": partitions,
                "total_lag": sum(p["lag"] or 0 for p in partitions)}

    def share_in_flight(self, group_id: str) -> dict[tuple[str, int], int | None]:
        """(topic, partition) -> records in flight of each of the group's share-partitions, from their latest state
        records in the node's __consumer_offsets (this module's header); {} if the topic cannot be read to its
        end within timeout_s; a partition whose record this node's decoder cannot read maps to None."""
        states: dict = {}
        versions: dict = {}
        deadline = time.monotonic() + self.timeout_s
        with _ClosingConsumer({**self._config, "group.id": "shmbroker-cli-share-states", "enable.auto.commit": False,
                               "enable.partition.eof": True, "logger": _QuietLogger()}) as consumer:
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition(OFFSETS_TOPIC, 0), timeout=self.timeout_s)
            except KafkaException:
                return {}
            consumer.assign([TopicPartition(OFFSETS_TOPIC, 0, low)])
            position = low
            while position < high and time.monotonic() < deadline:
                # A short wait per call: consume() returns at its timeout unless 1000 records came first.
                for message in consumer.consume(1000, timeout=min(0.05, max(0.0, deadline - time.monotonic()))):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            position = high  # the end: records compacted away may leave no offset up to it
                        continue
                    position = message.offset() + 1
                    try:
                        key = share_state_key(orjson.loads(message.key() or b"null"))
                        if key is not None and key[0] == group_id:
                            apply_versioned(key, message.value(), states, versions)
                    except (ValueError, TypeError):
                        continue  # not a record of this format: the node's load skips it too
        if position < high:
            return {}
        counts: dict[tuple[str, int], int | None] = {}
        for (_, topic, partition), state in states.items():
            try:
                counts[(topic, partition)] = recorded_in_flight(state)[1]
            except (ValueError, TypeError, IndexError):
                counts[(topic, partition)] = None
        return counts

    def _raw(self, api_key: int, version: int, request, response_class):
        """One request of this module's own to the bootstrap broker (header v2, flexible versions only); its
        decoded response, or None if the broker is unreachable or answers something else."""
        host, _, port = self.bootstrap.split(",")[0].strip().rpartition(":")
        header = RequestHeader(request_api_key=i16(api_key), request_api_version=i16(version), correlation_id=i32(1),
                               client_id="shmbroker-cli")
        out = io.BytesIO()
        entity_writer(RequestHeader)(out, header)
        entity_writer(type(request))(out, request)
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=self.timeout_s) as sock:
                sock.sendall(struct.pack(">i", len(out.getvalue())) + out.getvalue())
                frame = _receive(sock, struct.unpack(">i", _receive(sock, 4))[0])
        except (OSError, ValueError, struct.error):
            return None
        try:  # after the correlation id, response header v1's (empty) tagged fields: one byte
            response, _ = entity_reader(response_class)(frame, 5)
        except Exception:  # kio's decoding errors have no common base; a broker without the API answers otherwise
            return None
        return response

    def _consumer(self) -> Consumer:
        return _ClosingConsumer({**self._config, "group.id": "shmbroker-cli-watermarks",
                                 "enable.auto.commit": False, "logger": _QuietLogger()})

    def _watermarks(self, consumer: Consumer, topic: str, partition: int) -> tuple[int, int]:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self.timeout_s)
        except KafkaException as exc:
            _raise(exc, f"cannot read the offsets of {topic}-{partition}")
            raise  # unreachable


class _ClosingConsumer(Consumer):
    def __enter__(self) -> "_ClosingConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class AclSpec:
    """What `shmbroker acls` names: a resource (None name: any, in list and remove) and the entries' fields."""

    resource_type: str  # TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID, or ANY (list/remove)
    resource_name: str | None
    pattern_type: str  # LITERAL, PREFIXED, or ANY/MATCH (list/remove)
    principal: str | None
    host: str | None
    operations: tuple[str, ...]  # names of Kafka's AclOperation; () in list/remove: any
    permission: str  # ALLOW, DENY, or ANY (list/remove)


# confluent-kafka names Kafka's CLUSTER resource type (4) BROKER.
_CONFLUENT_RESOURCE_TYPE = {"CLUSTER": "BROKER"}


def _acl_enums():
    from confluent_kafka.admin import AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    class ResourceTypes:
        def __getitem__(self, name: str):
            return ResourceType[_CONFLUENT_RESOURCE_TYPE.get(name, name)]
    return ResourceTypes(), ResourcePatternType, AclOperation, AclPermissionType


def _acl_document(binding) -> dict:
    resource_type = {v: k for k, v in _CONFLUENT_RESOURCE_TYPE.items()}.get(binding.restype.name, binding.restype.name)
    return {"resource_type": resource_type, "resource_name": binding.name,
            "pattern_type": binding.resource_pattern_type.name, "principal": binding.principal,
            "host": binding.host, "operation": binding.operation.name, "permission": binding.permission_type.name}


class AclAdmin:
    """ACLs through CreateAcls, DescribeAcls and DeleteAcls (confluent-kafka's AdminClient)."""

    def __init__(self, admin: Admin) -> None:
        self.admin = admin

    def _result(self, future, what: str):
        try:
            return future.result(timeout=self.admin.timeout_s * 2)
        except KafkaException as exc:
            _raise(exc, what)

    def add(self, spec: AclSpec) -> list[dict]:
        from confluent_kafka.admin import AclBinding
        rtype, pattern, operation, permission = _acl_enums()
        bindings = [AclBinding(rtype[spec.resource_type], spec.resource_name, pattern[spec.pattern_type],
                               spec.principal, spec.host or "*", operation[op], permission[spec.permission])
                    for op in spec.operations]
        futures = self.admin.client.create_acls(bindings, request_timeout=self.admin.timeout_s)
        for binding, future in futures.items():
            self._result(future, f"cannot create ACL {binding}")
        return [_acl_document(b) for b in bindings]

    def _filters(self, spec: AclSpec) -> list:
        from confluent_kafka.admin import AclBindingFilter
        rtype, pattern, operation, permission = _acl_enums()
        return [AclBindingFilter(rtype[spec.resource_type], spec.resource_name, pattern[spec.pattern_type],
                                 spec.principal, spec.host, operation[op], permission[spec.permission])
                for op in (spec.operations or ("ANY",))]

    def list(self, spec: AclSpec) -> list[dict]:
        found = []
        for acl_filter in self._filters(spec):
            future = self.admin.client.describe_acls(acl_filter, request_timeout=self.admin.timeout_s)
            found += [_acl_document(b) for b in self._result(future, "cannot describe ACLs")]
        return sorted(found, key=lambda d: tuple(d.values()))

    def remove(self, spec: AclSpec) -> list[dict]:
        futures = self.admin.client.delete_acls(self._filters(spec), request_timeout=self.admin.timeout_s)
        removed = []
        for future in futures.values():
            removed += [_acl_document(b) for b in self._result(future, "cannot delete ACLs")]
        return sorted(removed, key=lambda d: tuple(d.values()))


class _QuietLogger:
    """librdkafka's log lines (connection refused, retries) would bury the one clear message the CLI prints."""

    def log(self, *args, **kwargs) -> None:
        pass

    def __getattr__(self, name):
        return self.log


def _receive(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ValueError("connection closed")
        data += chunk
    return bytes(data)
