"""CreateAcls, DescribeAcls and DeleteAcls against a real node with the authorizer on: the super user manages ACLs
through confluent-kafka's AdminClient and `shmbroker acls` (over SASL, with --command-config), others need ALTER or
DESCRIBE on the cluster, a change made through one worker holds at once for a connection on the other, bad bindings
are INVALID_REQUEST, ACLs survive a restart, and v0 requests (no pattern type) create and match LITERAL
bindings only."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType)

from kio.serial import entity_reader
from kio.static.primitive import i8

from scripts.harness import rawkafka as R
from scripts.harness.nodeproc import CLI, REPO_ROOT, free_port
from tests.test_security_sasl import PASSWORD, SaslNode, with_users
from tests.test_stats_cli import stats_json, wait_for_metric
from tests.waiting import wait_for
from shmbroker.workers.codecs import protocol as P

pytestmark = [pytest.mark.node, pytest.mark.usefixtures("librdkafka_clients_collected")]

SASL_HANDSHAKE, SASL_AUTHENTICATE, DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 17, 36, 29, 30, 31
AUTHORIZER = '\n[authorizer]\nenabled = true\nsuper_users = ["User:admin"]\n'
EVERYTHING = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                              AclPermissionType.ANY)


def admin_for(sasl: SaslNode, user: str) -> AdminClient:
    return AdminClient(sasl.client("SCRAM-SHA-256", user, tls=False))


def outcomes(futures: dict) -> dict:
    """What an AdminClient call's futures came to: each key -> None (done) or the error's name."""
    found = {}
    for key, future in futures.items():
        try:
            future.result(timeout=20)
            found[key] = None
        except KafkaException as exc:
            found[key] = exc.args[0].name()
    return found


def create(admin: AdminClient, *bindings: AclBinding) -> dict:
    """binding -> None (created) or the error's name."""
    return outcomes(admin.create_acls(list(bindings), request_timeout=10))


def describe_error(sasl: SaslNode, user: str) -> str | None:
    """DescribeAcls' error by kafka-python (librdkafka returns an empty list for a refused DescribeAcls)."""
    from kafka.admin import (ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, KafkaAdminClient,
                             ResourcePatternFilter)
    from kafka.admin import ResourceType as KafkaPythonResourceType
    from kafka.errors import KafkaError

    client = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{sasl.sasl_port}", security_protocol="SASL_PLAINTEXT",
                              sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=user,
                              sasl_plain_password=PASSWORD, request_timeout_ms=10_000)
    try:
        client.describe_acls(ACLFilter(principal=None, host=None, operation=ACLOperation.ANY,
                                       permission_type=ACLPermissionType.ANY,
                                       resource_pattern=ResourcePatternFilter(KafkaPythonResourceType.ANY, None,
                                                                              ACLResourcePatternType.ANY)))
        return None
    except KafkaError as exc:
        return type(exc).__name__
    finally:
        client.close()


def topic_read(user: str, name: str = "orders", pattern=ResourcePatternType.LITERAL,
               operation=AclOperation.READ) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, pattern, f"User:{user}", "*", operation, AclPermissionType.ALLOW)


def acls_cli(sasl: SaslNode, properties, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "acls", *args, "--bootstrap",
                           f"127.0.0.1:{sasl.sasl_port}", "--command-config", str(properties), "--json"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


@pytest.fixture
def sasl(node_factory, tmp_path) -> SaslNode:
    return SaslNode(node_factory, tmp_path, workers=2, more=AUTHORIZER,
                    before_start=with_users(("admin", "SCRAM-SHA-256"), ("alice", "SCRAM-SHA-256")))


def test_only_principals_allowed_on_the_cluster_manage_acls_and_changes_hold_at_once(sasl: SaslNode) -> None:
    admin, alice = admin_for(sasl, "admin"), admin_for(sasl, "alice")
    assert set(create(admin, topic_read("alice")).values()) == {None}
    assert create(alice, topic_read("bob")) == {topic_read("bob"): "CLUSTER_AUTHORIZATION_FAILED"}
    assert describe_error(sasl, "alice") == "ClusterAuthorizationFailedError"
    denials = wait_for(lambda: stats_json(sasl.node)["apis"].get("CreateAcls", {}).get("authorization_denials"),
                       what="the refused CreateAcls counted")
    assert denials == 1
    by_principal = wait_for(lambda: [e for e in stats_json(sasl.node)["authorization_denials_by_principal"]
                                     if e["api"] == "CreateAcls"] or None, what="the refusal counted for alice")
    assert by_principal == [{"principal": "User:alice", "api": "CreateAcls", "denials": 1}]
    deleted = alice.delete_acls([EVERYTHING], request_timeout=10)[EVERYTHING]
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
        deleted.result(timeout=20)
    # Granted DESCRIBE on the cluster (by the admin's connection, to whichever worker it went), alice's next
    # request (her own connection) is allowed, with no wait.
    describe_cluster = AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:alice",
                                  "*", AclOperation.DESCRIBE, AclPermissionType.ALLOW)
    assert set(create(admin, describe_cluster).values()) == {None}
    assert describe_error(sasl, "alice") is None
    listed = alice.describe_acls(EVERYTHING, request_timeout=10).result(timeout=20)
    assert sorted(map(str, listed)) == sorted(map(str, [topic_read("alice"), describe_cluster]))
    assert create(alice, topic_read("bob")) == {topic_read("bob"): "CLUSTER_AUTHORIZATION_FAILED"}  # not ALTER
    removed = admin.delete_acls([AclBindingFilter(ResourceType.BROKER, None, ResourcePatternType.ANY, None, None,
                                                  AclOperation.ANY, AclPermissionType.ANY)],
                                request_timeout=10)
    assert [str(b) for f in removed.values() for b in f.result(timeout=20)] == [str(describe_cluster)]
    assert describe_error(sasl, "alice") == "ClusterAuthorizationFailedError"


def test_bindings_kafka_does_not_store_are_invalid_and_the_rest_is_kept(sasl: SaslNode) -> None:
    admin = admin_for(sasl, "admin")
    bad = AclBinding(ResourceType.GROUP, "g", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.WRITE,
                     AclPermissionType.ALLOW)  # groups have no WRITE
    outcome = create(admin, bad, topic_read("alice", "ord", ResourcePatternType.PREFIXED))
    assert outcome == {bad: "INVALID_REQUEST", topic_read("alice", "ord", ResourcePatternType.PREFIXED): None}
    match = AclBindingFilter(ResourceType.TOPIC, "orders-eu", ResourcePatternType.MATCH, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    assert [str(b) for b in admin.describe_acls(match, request_timeout=10).result(timeout=20)] == [
        str(topic_read("alice", "ord", ResourcePatternType.PREFIXED))]


def test_acls_cli_over_sasl_and_acls_survive_a_restart(sasl: SaslNode, tmp_path) -> None:
    properties = tmp_path / "admin.properties"
    properties.write_text("# the super user\nsecurity.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
                          "sasl.username=admin\nsasl.password=s3cret pass\n")
    added = acls_cli(sasl, properties, "add", "--topic", "pay", "--resource-pattern-type", "prefixed",
                     "--allow-principal", "User:alice", "--operation", "read", "--operation", "describe")
    assert added.returncode == 0, added.stderr
    assert {a["operation"] for a in json.loads(added.stdout)} == {"READ", "DESCRIBE"}
    denied = acls_cli(sasl, properties, "add", "--group", "*", "--deny-principal", "User:*", "--operation", "DELETE")
    assert denied.returncode == 0, denied.stderr
    sasl.node.stop()
    metrics_port = free_port()
    sasl.node.start_args = ["--metrics", f"127.0.0.1:{metrics_port}"]
    sasl.node.start()
    listed = acls_cli(sasl, properties, "list")
    assert listed.returncode == 0, listed.stderr
    assert sorted((a["resource_type"], a["resource_name"], a["pattern_type"], a["principal"], a["operation"],
                   a["permission"]) for a in json.loads(listed.stdout)) == [
        ("GROUP", "*", "LITERAL", "User:*", "DELETE", "DENY"),
        ("TOPIC", "pay", "PREFIXED", "User:alice", "DESCRIBE", "ALLOW"),
        ("TOPIC", "pay", "PREFIXED", "User:alice", "READ", "ALLOW")]
    removed = acls_cli(sasl, properties, "remove", "--topic", "pay", "--resource-pattern-type", "prefixed",
                       "--operation", "READ")
    assert removed.returncode == 0 and len(json.loads(removed.stdout)) == 1, removed.stderr
    assert len(json.loads(acls_cli(sasl, properties, "list").stdout)) == 2
    properties.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
                          "sasl.username=alice\nsasl.password=s3cret pass\n")
    refused = acls_cli(sasl, properties, "add", "--topic", "t", "--allow-principal", "User:alice", "--operation", "ALL")
    assert refused.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in refused.stderr

    text = wait_for_metric(metrics_port, 'kafka_security_authorizer_denials_total{request="CreateAcls"',
                           "the denial in /metrics")
    assert 'kafka_server_sasl_logins_total{listener="SASL",mechanism="SCRAM-SHA-256"}' in text
    assert 'kafka_security_authorizer_principal_denials_total{principal="User:alice",request="CreateAcls"} 1.0' in text


def raw_login(sasl: SaslNode, user: str) -> R.RawConnection:
    """A raw connection to the SASL_PLAINTEXT listener, logged in as `user` with PLAIN (the same users store)."""
    conn = R.RawConnection("127.0.0.1", sasl.sasl_port)
    assert conn.call(SASL_HANDSHAKE, 1, R.request_body(SASL_HANDSHAKE, 1, "SaslHandshakeRequest",
                                                       mechanism="PLAIN")).error_code == 0
    assert conn.call(SASL_AUTHENTICATE, 2, R.request_body(
        SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=f"\0{user}\0{PASSWORD}".encode())).error_code == 0
    return conn


def v0(api_key: int, class_name: str, **fields) -> Any:
    """An ACL API's v0 request entity, by the node's own declarations of v0 (kio has none)."""
    return P.build_entity(getattr(P.request_schema(api_key, 0), class_name), **fields)


def call_v0(conn: R.RawConnection, api_key: int, request: Any) -> Any:
    body = conn.request(api_key, 0, R.encode_body(request))
    return entity_reader(P.response_class(api_key, 0))(body, 0)[0]


def test_v0_requests_create_find_and_delete_literal_bindings_only(sasl: SaslNode) -> None:
    """v0 has no pattern type: its creations are LITERAL and its filters match LITERAL bindings only (Kafka's
    default of 3 for the field), so a PREFIXED binding made by a newer client is neither listed nor deleted."""
    admin = admin_for(sasl, "admin")
    prefixed = topic_read("alice", "orders", ResourcePatternType.PREFIXED)
    assert create(admin, prefixed) == {prefixed: None}
    any_topic = {"resource_type_filter": i8(ResourceType.TOPIC.value), "resource_name_filter": None,
                 "principal_filter": None, "host_filter": None, "operation": i8(AclOperation.ANY.value),
                 "permission_type": i8(AclPermissionType.ANY.value)}
    conn = raw_login(sasl, "admin")
    try:
        created = call_v0(conn, CREATE_ACLS, v0(CREATE_ACLS, "CreateAclsRequest", creations=(v0(
            CREATE_ACLS, "AclCreation", resource_type=i8(ResourceType.TOPIC.value), resource_name="orders",
            principal="User:alice", host="*", operation=i8(AclOperation.READ.value),
            permission_type=i8(AclPermissionType.ALLOW.value)),)))
        assert [int(r.error_code) for r in created.results] == [0]
        described = call_v0(conn, DESCRIBE_ACLS, v0(DESCRIBE_ACLS, "DescribeAclsRequest", **any_topic))
        assert int(described.error_code) == 0
        assert [(r.resource_name, [(a.principal, a.operation) for a in r.acls]) for r in described.resources] == [
            ("orders", [("User:alice", AclOperation.READ.value)])]
        deleted = call_v0(conn, DELETE_ACLS, v0(DELETE_ACLS, "DeleteAclsRequest", filters=(
            v0(DELETE_ACLS, "DeleteAclsFilter", **any_topic),)))
        assert [[(m.resource_name, int(m.error_code)) for m in r.matching_acls] for r in deleted.filter_results] == [
            [("orders", 0)]]
    finally:
        conn.close()
    # What stays is the PREFIXED binding; the one v0 made was LITERAL.
    assert [str(b) for b in admin.describe_acls(EVERYTHING, request_timeout=10).result(timeout=20)] == [str(prefixed)]
