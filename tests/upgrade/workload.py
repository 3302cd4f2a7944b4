"""The upgrade fixtures' workload and its check: what a node of some version is made to store, and how a node
of today proves it kept every part of it.

`write(bootstrap, features)` runs against a node of any version (the fixture maker, make_fixture.py, points it
at an older commit's node) and returns the manifest: what it stored, in a form `check` compares with what a
node started later on the same data directory answers. Both use only Kafka's API through real clients
(confluent-kafka, and the raw client where a check needs exact bytes: an idempotent producer's retry).

What is stored (each part only where the node that writes it has the feature):
- `orders`: cleanup.policy delete, 2 partitions, 10,000 keyed records from an idempotent producer, a
  retention.ms override; a committed offset of group `upgrade-group` at 5,000 on partition 0.
- `accounts`: cleanup.policy compact (delete on a node without compaction), 2 partitions, 10,000 keyed records
  over 500 keys (the check reads the latest value of each key, as compaction keeps it).
- `clicks`: 1 partition, 2,000 records without keys.
- `payments`: a committed transaction (100 records), an aborted one (50), then a committed one (10); the
  check reads it read_committed and read_uncommitted.
- a raw idempotent producer's last batch on `orders` partition 1: sent again after the upgrade it must be
  answered as a duplicate at its first offset, not appended (the producer state survived).
- ACLs, SCRAM users (where the node has them); client quotas live in the config file kept beside the data.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ConfigResource, NewTopic, ResourcePatternType, ResourceType, ScramMechanism,
                                   UserScramCredentialUpsertion, ScramCredentialInfo)

from scripts.harness import rawkafka

ORDERS, ACCOUNTS, CLICKS, PAYMENTS = "orders", "accounts", "clicks", "payments"
GROUP = "upgrade-group"
KEYED_RECORDS = 10_000
ACCOUNT_KEYS = 500
KEYLESS_RECORDS = 2_000
TOPIC_CONFIGS = {
    ORDERS: {"cleanup.policy": "delete", "retention.ms": "604800000"},
    ACCOUNTS: {"cleanup.policy": "compact"},
    CLICKS: {},
    PAYMENTS: {},
}
PARTITIONS = {ORDERS: 2, ACCOUNTS: 2, CLICKS: 1, PAYMENTS: 1}
COMMITTED_OFFSETS = {(ORDERS, 0): 5000, (ORDERS, 1): 4000}
USERS = {"alice": ("SCRAM-SHA-256", 4096), "bob": ("SCRAM-SHA-512", 8192)}
ACLS = [  # (resource type, name, pattern, principal, operation, permission)
    ("TOPIC", ORDERS, "LITERAL", "User:alice", "READ", "ALLOW"),
    ("TOPIC", "pay", "PREFIXED", "User:bob", "WRITE", "DENY"),
    ("GROUP", GROUP, "LITERAL", "User:alice", "READ", "ALLOW"),
]
TIMEOUT_S = 30.0
IDEMPOTENT_BATCH_RECORDS = 5
PRODUCE_VERSION = 8
INIT_PRODUCER_ID_VERSION = 1


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# --------------------------------------------------------------------------- write


def write(bootstrap: str, features: set[str]) -> dict[str, Any]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    configs = {name: dict(config) for name, config in TOPIC_CONFIGS.items()}
    if "compaction" not in features:
        configs[ACCOUNTS]["cleanup.policy"] = "delete"
    topics = [NewTopic(name, PARTITIONS[name], 1, config=configs[name]) for name in configs]
    for future in admin.create_topics(topics, request_timeout=TIMEOUT_S).values():
        future.result(TIMEOUT_S)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(KEYED_RECORDS):
        producer.produce(ORDERS, key=f"order-{i}", value=f"order value {i}", partition=i % 2)
        producer.produce(ACCOUNTS, key=f"account-{i % ACCOUNT_KEYS}", value=f"balance {i}",
                         partition=(i % ACCOUNT_KEYS) % 2)
        if i % 1000 == 0:
            producer.poll(0)
    for i in range(KEYLESS_RECORDS):
        producer.produce(CLICKS, value=f"click {i}", partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    manifest: dict[str, Any] = {"features": sorted(features), "topic_configs": configs}
    manifest["duplicate"] = _raw_idempotent_batch(bootstrap)
    if "transactions" in features:
        _transactions(bootstrap)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in COMMITTED_OFFSETS.items()],
                    asynchronous=False)
    consumer.close()
    if "acls" in features:
        for future in admin.create_acls([_binding(*acl) for acl in ACLS], request_timeout=TIMEOUT_S).values():
            future.result(TIMEOUT_S)
    if "users" in features:
        upserts = [UserScramCredentialUpsertion(user, ScramCredentialInfo(getattr(ScramMechanism, m.replace("-", "_")),
                                                                          iterations), f"{user}-secret".encode())
                   for user, (m, iterations) in USERS.items()]
        for future in admin.alter_user_scram_credentials(upserts, request_timeout=TIMEOUT_S).values():
            future.result(TIMEOUT_S)
    manifest["records"] = read_everything(bootstrap)
    return manifest


def _transactions(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "upgrade-txn", "linger.ms": 5})
    producer.init_transactions(TIMEOUT_S)
    for count, commit in ((100, True), (50, False), (10, True)):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(PAYMENTS, key=f"payment-{i}", value=f"{'committed' if commit else 'aborted'} {i}",
                             partition=0)
        if commit:
            producer.commit_transaction(TIMEOUT_S)
        else:
            producer.flush(TIMEOUT_S)
            producer.abort_transaction(TIMEOUT_S)


def _raw_idempotent_batch(bootstrap: str) -> dict[str, Any]:
    """An idempotent producer's batch sent through the raw client: its producer id, epoch, sequence and bytes,
    to be sent again after the upgrade."""
    host, port = bootstrap.rsplit(":", 1)
    with rawkafka.RawConnection(host, int(port)) as conn:
        answer = conn.call(rawkafka.INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION,
                           rawkafka.request_body(rawkafka.INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION,
                                                 "InitProducerIdRequest", transactional_id=None,
                                                 transaction_timeout=rawkafka.millis(60000)))
        assert answer.error_code == 0, answer
        producer_id, epoch = int(answer.producer_id), int(answer.producer_epoch)
        first_offset = None
        for sequence in range(0, 3 * IDEMPOTENT_BATCH_RECORDS, IDEMPOTENT_BATCH_RECORDS):
            batch = rawkafka.build_record_batch(
                [f"raw {sequence + i}".encode() for i in range(IDEMPOTENT_BATCH_RECORDS)],
                [f"raw-{sequence + i}".encode() for i in range(IDEMPOTENT_BATCH_RECORDS)],
                producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)
            first_offset = produce(conn, batch)
        return {"topic": ORDERS, "partition": 1, "producer_id": producer_id, "epoch": epoch,
                "batch": base64.b64encode(batch).decode(), "base_offset": first_offset}


def produce(conn: rawkafka.RawConnection, batch: bytes) -> int:
    """Send one batch to orders/1 with acks=-1; its base offset (raises on an error code)."""
    body = rawkafka.produce_body({ORDERS: {1: batch}}, acks=-1, version=PRODUCE_VERSION)
    answer = conn.call(rawkafka.PRODUCE, PRODUCE_VERSION, body)
    partition = answer.responses[0].partition_responses[0]
    assert partition.error_code == 0, partition
    return int(partition.base_offset)


def _binding(kind: str, name: str, pattern: str, principal: str, operation: str, permission: str) -> AclBinding:
    return AclBinding(ResourceType[kind], name, ResourcePatternType[pattern], principal, "*",
                      AclOperation[operation], AclPermissionType[permission])


# --------------------------------------------------------------------------- read


def read_everything(bootstrap: str) -> dict[str, Any]:
    """Per topic and partition what a reader sees: for delete-policy topics every record (offset, key, value)
    as a digest and count; for the compacted one the latest value per key; for the transactional one both
    isolation levels."""
    seen: dict[str, Any] = {}
    for isolation in ("read_committed", "read_uncommitted"):
        for (topic, partition), rows in _consume(bootstrap, isolation).items():
            name = f"{topic}/{partition}"
            if topic == ACCOUNTS:
                latest: dict[str, str] = {}
                for _, key, value in rows:
                    latest[key] = value
                view = {"keys": len(latest), "digest": digest([f"{k}={v}" for k, v in sorted(latest.items())])}
            else:
                view = {"count": len(rows), "first": rows[0][0] if rows else None,
                        "last": rows[-1][0] if rows else None,
                        "digest": digest([f"{o}:{k}:{v}" for o, k, v in rows])}
            if topic == PAYMENTS or isolation == "read_committed":
                seen[name if topic != PAYMENTS else f"{name}/{isolation}"] = view
    return seen


def _consume(bootstrap: str, isolation: str) -> dict[tuple[str, int], list[tuple[int, str | None, str]]]:
    partitions = [(topic, partition) for topic, count in PARTITIONS.items() for partition in range(count)]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"upgrade-reader-{time.time_ns()}",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "enable.partition.eof": True})
    try:
        ends = {}
        for topic, partition in partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), TIMEOUT_S)
            ends[(topic, partition)] = high
        consumer.assign([TopicPartition(t, p, 0) for t, p in partitions])  # 0: the log start at least
        rows: dict[tuple[str, int], list] = {tp: [] for tp in partitions}
        done: set[tuple[str, int]] = set()
        deadline = time.monotonic() + 2 * TIMEOUT_S
        while len(done) < len(partitions) and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                where = (message.topic(), message.partition())
                if message.error():
                    if message.error().code() == -191:  # _PARTITION_EOF
                        if message.offset() >= ends[where] or isolation == "read_committed":
                            done.add(where)
                        continue
                    raise KafkaException(message.error())
                key = message.key().decode() if message.key() is not None else None
                rows[where].append((message.offset(), key, message.value().decode()))
        assert len(done) == len(partitions), f"read {done} of {partitions} in {2 * TIMEOUT_S}s"
        return rows
    finally:
        consumer.close()


def state(bootstrap: str, features: set[str], topic_configs: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Everything else a node keeps: topics with their config overrides, committed offsets, ACLs, users."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=TIMEOUT_S)
    found: dict[str, Any] = {"topics": {name: len(metadata.topics[name].partitions)
                                        for name in PARTITIONS if name in metadata.topics}}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in topic_configs]
    configs = {}
    for resource, future in admin.describe_configs(resources, request_timeout=TIMEOUT_S).items():
        entries = future.result(TIMEOUT_S)
        configs[resource.name] = {key: entries[key].value for key in topic_configs[resource.name]}
    found["configs"] = configs
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition(t, p) for t, p in COMMITTED_OFFSETS], TIMEOUT_S)
    finally:
        consumer.close()
    found["offsets"] = {f"{tp.topic}/{tp.partition}": tp.offset for tp in committed}
    if "acls" in features:
        everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                      AclOperation.ANY, AclPermissionType.ANY)
        bindings = admin.describe_acls(everything, request_timeout=TIMEOUT_S).result(TIMEOUT_S)
        found["acls"] = sorted([b.restype.name, b.name, b.resource_pattern_type.name, b.principal,
                                b.operation.name, b.permission_type.name] for b in bindings)
    if "users" in features:
        described = admin.describe_user_scram_credentials(list(USERS), request_timeout=TIMEOUT_S)
        if isinstance(described, dict):  # confluent-kafka gives one future per user
            described = {user: future.result(TIMEOUT_S) for user, future in described.items()}
        else:
            described = described.result(TIMEOUT_S)
        found["users"] = {user: sorted([info.mechanism.name.replace("_", "-"), info.iterations]
                                       for info in description.scram_credential_infos)
                          for user, description in described.items()}
    return found


def expected_state(features: set[str], topic_configs: dict[str, dict[str, str]]) -> dict[str, Any]:
    """What `state` must find on a node started on a data directory the workload wrote."""
    found: dict[str, Any] = {
        "topics": PARTITIONS,
        "configs": topic_configs,
        "offsets": {f"{t}/{p}": o for (t, p), o in COMMITTED_OFFSETS.items()},
    }
    if "acls" in features:
        found["acls"] = sorted(list(acl[:3]) + list(acl[3:]) for acl in ACLS)
    if "users" in features:
        found["users"] = {user: [[mechanism, iterations]] for user, (mechanism, iterations) in USERS.items()}
    return found
