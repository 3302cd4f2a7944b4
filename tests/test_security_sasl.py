"""SASL against a real node: every mechanism on SASL_PLAINTEXT and SASL_SSL with confluent-kafka, kafka-python and
aiokafka over SASL_SSL, refusals (wrong password, unknown user, requests before the login) answered at once, users
changed by `shmbroker users` under a running node and kept across a restart, re-authentication (KIP-368)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import struct
import subprocess
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from scripts.harness import rawkafka as R
from scripts.harness.nodeproc import CLI, REPO_ROOT, free_port
from tests.test_clients import check_roundtrip, consume_all, create_topic, produce, records_for
from tests.test_hardening import api_versions_ok, closed_by_peer
from tests.test_security_tls import Certificates, listener
from tests.test_stats_cli import stats_json
from tests.waiting import poll, wait_for

pytestmark = pytest.mark.node

SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA = 17, 36, 3
SASL_AUTHENTICATION_FAILED = 58
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
PASSWORD = "s3cret pass"


def users(data_dir, *args: str, password: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "users", *args, "--data-dir", str(data_dir)],
                          cwd=REPO_ROOT, input=password and password + "\n", capture_output=True, text=True,
                          timeout=60)


def add_user(data_dir, name: str, mechanism: str, password: str = PASSWORD) -> None:
    done = users(data_dir, "add", name, "--mechanism", mechanism, "--password-stdin", password=password)
    assert done.returncode == 0, done.stderr


class SaslNode:
    """A node with a SASL_PLAINTEXT and a SASL_SSL listener beside --listen's PLAINTEXT one."""

    def __init__(self, node_factory, tmp_path, workers: int = 1, more: str = "", before_start=None) -> None:
        certs_dir = tmp_path / "certs"
        certs_dir.mkdir(exist_ok=True)
        self.certificates = Certificates(certs_dir)
        self.sasl_port, self.sasl_ssl_port = free_port(), free_port()
        config = (listener("SASL", self.sasl_port, "SASL_PLAINTEXT") + listener("SASLSSL", self.sasl_ssl_port,
                                                                                   "SASL_SSL")
                  + self.certificates.tls_section() + more)
        self.data_dir = tmp_path / "data"
        if before_start is not None:
            before_start(self.data_dir)
        self.node = node_factory(workers=workers, config=config, data_dir=self.data_dir)

    def client(self, mechanism: str, user: str, password: str = PASSWORD, tls: bool = True, **more) -> dict:
        port = self.sasl_ssl_port if tls else self.sasl_port
        return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
                "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
                "ssl.ca.location": self.certificates.ca, **more}


def with_users(*pairs: tuple[str, str]):
    def add(data_dir) -> None:
        for name, mechanism in pairs:
            add_user(data_dir, name, mechanism)
    return add


LOGIN_ATTEMPT_S = 0.25  # login_error asks for metadata this often, looking for a refusal in between


def login_error(config: dict, timeout: float = 10.0) -> tuple[str | None, float]:
    """The first error librdkafka reports for a client of `config` (None: it logged in within `timeout`), and after
    how long: a refused login as soon as librdkafka reports it, any other error once `timeout` is up."""
    errors: list[KafkaError] = []
    started = time.monotonic()
    deadline = started + timeout
    admin = AdminClient({**config, "error_cb": errors.append, "log_level": 0})
    while True:
        try:
            admin.list_topics(timeout=max(0.01, min(LOGIN_ATTEMPT_S, deadline - time.monotonic())))
            return None, time.monotonic() - started
        except KafkaException:
            admin.poll(0)  # the error callback runs in poll()
        if any(error.code() == KafkaError._AUTHENTICATION for error in errors) or time.monotonic() >= deadline:
            break
    if not errors:
        poll(lambda: admin.poll(0.1) is None and errors, 3, 0)
    return (errors[0].str() if errors else "no error reported"), time.monotonic() - started


def raw_frame(sock: socket.socket, api_key: int, version: int, body: bytes, correlation_id: int = 9) -> bytes | None:
    """One request on a raw socket; the response body after the correlation id, None if the node closed it."""
    sock.sendall(R.encode_request(api_key, version, correlation_id, body))
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None
    size = struct.unpack(">i", head)[0]
    body = sock.recv(size, socket.MSG_WAITALL)
    assert struct.unpack_from(">i", body)[0] == correlation_id
    return body[4:]


def test_every_mechanism_on_both_sasl_listeners_carries_records(node_factory, tmp_path):
    sasl = SaslNode(node_factory, tmp_path, workers=2, before_start=with_users(
        *((f"user-{m.lower()}", m) for m in MECHANISMS)))
    create_topic(sasl.node.bootstrap, "secured", 3)
    sent = records_for(1800, "secured")
    for chunk, (tls, mechanism) in enumerate((tls, mechanism) for tls in (False, True) for mechanism in MECHANISMS):
        config = sasl.client(mechanism, f"user-{mechanism.lower()}", tls=tls)
        produce(config.pop("bootstrap.servers"), "secured", sent[chunk * 300:(chunk + 1) * 300], **config)
    # After the login the pre-login bound on a request's size (512 KiB) no longer applies.
    config = sasl.client("PLAIN", "user-plain", tls=False)
    large = {"key": b"large", "value": b"L" * 900_000, "partition": 0}
    produce(config.pop("bootstrap.servers"), "large", [large], **config)
    plain_read = consume_all(sasl.node.bootstrap, "secured", 3, len(sent))
    config = sasl.client("SCRAM-SHA-512", "user-scram-sha-512")
    check_roundtrip(sent, consume_all(config.pop("bootstrap.servers"), "secured", 3, len(sent), **config))
    assert len(plain_read) == len(sent)
    totals = wait_for(lambda: (lambda t: t if t["sasl_logins_plain"] >= 2 else None)(stats_json(sasl.node)["totals"]),
                      5, "the login counters")
    assert totals["sasl_logins_scram_sha_256"] >= 2 and totals["sasl_logins_scram_sha_512"] >= 3
    assert totals["sasl_login_failures_scram_sha_256"] == 0
    # Per listener and mechanism: each of the six producers logged in on its own listener with its mechanism.
    by_listener = {(e["listener"], e["mechanism"]): e for e in stats_json(sasl.node)["sasl_logins"]}
    assert set(by_listener) == {(listener, m) for listener in ("SASL", "SASLSSL") for m in MECHANISMS}
    assert all(e["logins"] >= 1 and e["failures"] == 0 for e in by_listener.values())


@pytest.mark.serial  # closed within 1 s
def test_wrong_passwords_and_unknown_users_are_refused_at_once_with_one_log_line(node_factory, tmp_path):
    sasl = SaslNode(node_factory, tmp_path, before_start=with_users(("alice", "SCRAM-SHA-256"), ("paula", "PLAIN")))
    for config in (sasl.client("SCRAM-SHA-256", "alice", "wrong"), sasl.client("SCRAM-SHA-256", "nobody"),
                   sasl.client("SCRAM-SHA-512", "alice"),  # no SCRAM-SHA-512 credential
                   sasl.client("PLAIN", "paula", "wrong", tls=False), sasl.client("PLAIN", "nobody", tls=False)):
        error, _ = login_error(config, timeout=3)
        assert error is not None and "Authentication failed" in error, (config, error)
    # Raw: the refusal is the SaslAuthenticate answer, at once, and the connection closes after it.
    with socket.create_connection(("127.0.0.1", sasl.sasl_port), timeout=5) as sock:
        handshake = R.decode_response(SASL_HANDSHAKE, 1, raw_frame(sock, SASL_HANDSHAKE, 1, R.request_body(
            SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="PLAIN")))
        assert handshake.error_code == 0 and set(handshake.mechanisms) == set(MECHANISMS)
        started = time.monotonic()
        answer = R.decode_response(SASL_AUTHENTICATE, 2, raw_frame(sock, SASL_AUTHENTICATE, 2, R.request_body(
            SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=b"\0paula\0wrong")))
        assert answer.error_code == SASL_AUTHENTICATION_FAILED
        assert closed_by_peer(sock, timeout=5)
        assert time.monotonic() - started < 1.0
    wait_for(lambda: "authentication failed" in sasl.node.log(), 5, "the failure's log line")
    assert sasl.node.log().count("authentication failed") == 1  # one line per interval, however many failures
    snapshot = stats_json(sasl.node)
    totals = snapshot["totals"]
    assert totals["sasl_login_failures_plain"] >= 2 and totals["sasl_login_failures_scram_sha_256"] >= 2
    failures = {(e["listener"], e["mechanism"]): e["failures"] for e in snapshot["sasl_logins"]}
    # librdkafka tries again and again within login_error's wait: at least one refusal each
    assert failures[("SASLSSL", "SCRAM-SHA-256")] >= 2 and failures[("SASLSSL", "SCRAM-SHA-512")] >= 1
    assert failures[("SASL", "PLAIN")] >= 3 and ("SASLSSL", "PLAIN") not in failures
    # Right password: in.
    assert login_error(sasl.client("PLAIN", "paula", tls=False))[0] is None


def test_nothing_but_api_versions_and_sasl_is_served_before_the_login(node_factory, tmp_path):
    sasl = SaslNode(node_factory, tmp_path)
    with socket.create_connection(("127.0.0.1", sasl.sasl_port), timeout=5) as sock:
        assert api_versions_ok(sock)
        assert raw_frame(sock, METADATA, 8, R.metadata_body(None)) is None  # closed
    wait_for(lambda: "api 3 before authentication" in sasl.node.log(), 5, "the close's log line")
    # Before the login a request may be at most sasl.server_max_receive_size (512 KiB) large; after it, as usual.
    with socket.create_connection(("127.0.0.1", sasl.sasl_port), timeout=5) as sock:
        sock.sendall(struct.pack(">i", 600_000) + b"\0" * 1000)
        assert closed_by_peer(sock, timeout=5)
    wait_for(lambda: "request size 600000 outside 0..524288" in sasl.node.log(), 5, "the oversize close's line")
    # A SaslHandshake on a PLAINTEXT listener is out of place: ILLEGAL_SASL_STATE, as Kafka answers.
    with socket.create_connection(("127.0.0.1", sasl.node.port), timeout=5) as sock:
        handshake = R.decode_response(SASL_HANDSHAKE, 1, raw_frame(sock, SASL_HANDSHAKE, 1, R.request_body(
            SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="PLAIN")))
        assert handshake.error_code == 34


def test_users_change_under_a_running_node_and_survive_its_restart(node_factory, tmp_path):
    sasl = SaslNode(node_factory, tmp_path)
    config = sasl.client("SCRAM-SHA-512", "carol")
    assert login_error(config, timeout=3)[0] is not None
    add_user(sasl.data_dir, "carol", "SCRAM-SHA-512")
    listed = users(sasl.data_dir, "list")
    assert listed.returncode == 0 and "carol" in listed.stdout and "SCRAM-SHA-512 (4096 iterations)" in listed.stdout
    assert PASSWORD not in (sasl.data_dir / "users.json").read_text()  # salted hashes only
    assert login_error(config)[0] is None  # no restart
    sasl.node.stop()
    sasl.node.start()
    assert login_error(config)[0] is None
    assert users(sasl.data_dir, "delete", "carol").returncode == 0
    error, _ = login_error(config, timeout=3)
    assert error is not None and "Authentication failed" in error
    refused = users(sasl.data_dir, "add", "dave", "--mechanism", "SCRAM-SHA-256", "--password-stdin", "--iterations",
                    "100", password="x")
    assert refused.returncode == 2 and "at least 4096" in refused.stderr


def test_kafka_python_and_aiokafka_over_sasl_ssl(node_factory, tmp_path):
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.helpers import create_ssl_context
    from kafka import KafkaProducer

    sasl = SaslNode(node_factory, tmp_path, before_start=with_users(("kp", "SCRAM-SHA-512"), ("aio", "SCRAM-SHA-256")))
    create_topic(sasl.node.bootstrap, "py", 1)
    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{sasl.sasl_ssl_port}", security_protocol="SASL_SSL",
                             sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="kp", sasl_plain_password=PASSWORD,
                             ssl_cafile=sasl.certificates.ca, ssl_check_hostname=False)
    for i in range(200):
        producer.send("py", value=f"v{i}".encode())
    producer.flush(30)
    producer.close()

    async def consume() -> list[bytes]:
        consumer = AIOKafkaConsumer(bootstrap_servers=f"127.0.0.1:{sasl.sasl_ssl_port}", security_protocol="SASL_SSL",
                                    sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="aio",
                                    sasl_plain_password=PASSWORD, enable_auto_commit=False,
                                    ssl_context=create_ssl_context(cafile=sasl.certificates.ca))
        await consumer.start()
        try:
            partition = TopicPartition("py", 0)
            consumer.assign([partition])
            await consumer.seek_to_beginning(partition)
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(got) < 200 and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                got += [record.value for records in batches.values() for record in records]
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(consume()) == [f"v{i}".encode() for i in range(200)]


def test_sessions_end_after_connections_max_reauth_ms_and_clients_log_in_again(node_factory, tmp_path):
    sasl = SaslNode(node_factory, tmp_path, more="[sasl]\nconnections_max_reauth_ms = 1500\n",
                    before_start=with_users(("rita", "SCRAM-SHA-256")))
    create_topic(sasl.node.bootstrap, "reauth", 1)
    time.sleep(1.0)  # the stats rows are published every 500 ms: the topic's creation counted before the baseline
    before = stats_json(sasl.node)["totals"]
    errors: list[str] = []
    producer = Producer({**sasl.client("SCRAM-SHA-256", "rita"), "linger.ms": 5,
                         "error_cb": lambda err: errors.append(err.str())})
    delivered = []
    started = time.monotonic()
    while time.monotonic() - started < 6:
        producer.produce("reauth", b"x", on_delivery=lambda err, msg: delivered.append(err))
        producer.poll(0.05)
    assert producer.flush(30) == 0
    time.sleep(1.0)  # published
    totals = stats_json(sasl.node)["totals"]
    assert errors == [] and len(delivered) > 50 and all(err is None for err in delivered)
    # Logged in again on the same connections: more logins than connections (6 s of sessions of 1.5 s).
    logins = totals["sasl_logins_scram_sha_256"] - before["sasl_logins_scram_sha_256"]
    accepted = totals["connections_accepted"] - before["connections_accepted"]
    assert logins >= accepted + 2, (logins, accepted)
    # A raw client that does not log in again is closed at its first request after the session ended.
    with socket.create_connection(("127.0.0.1", sasl.sasl_port), timeout=5) as sock:
        R.decode_response(SASL_HANDSHAKE, 1, raw_frame(sock, SASL_HANDSHAKE, 1, R.request_body(
            SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="SCRAM-SHA-256")))
        from scramp import ScramClient

        client = ScramClient(["SCRAM-SHA-256"], "rita", PASSWORD)
        first = R.decode_response(SASL_AUTHENTICATE, 2, raw_frame(sock, SASL_AUTHENTICATE, 2, R.request_body(
            SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=client.get_client_first().encode())))
        client.set_server_first(first.auth_bytes.decode())
        final = R.decode_response(SASL_AUTHENTICATE, 2, raw_frame(sock, SASL_AUTHENTICATE, 2, R.request_body(
            SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=client.get_client_final().encode())))
        assert final.error_code == 0 and final.session_lifetime.total_seconds() == 1.5
        client.set_server_final(final.auth_bytes.decode())
        assert raw_frame(sock, METADATA, 8, R.metadata_body([])) is not None
        time.sleep(1.7)
        assert raw_frame(sock, METADATA, 8, R.metadata_body([])) is None


def test_sasl_handshake_v0_takes_bare_tokens(node_factory, tmp_path):
    sasl = SaslNode(node_factory, tmp_path, before_start=with_users(("vera", "PLAIN")))
    for password, served in ((PASSWORD, True), ("wrong", False)):
        with socket.create_connection(("127.0.0.1", sasl.sasl_port), timeout=5) as sock:
            handshake = R.decode_response(SASL_HANDSHAKE, 0, raw_frame(sock, SASL_HANDSHAKE, 0, R.request_body(
                SASL_HANDSHAKE, 0, "SaslHandshakeRequest", mechanism="PLAIN")))
            assert handshake.error_code == 0
            token = f"\0vera\0{password}".encode()
            sock.sendall(len(token).to_bytes(4, "big") + token)  # no request header: a bare token (Kafka's v0)
            if served:
                assert sock.recv(4, socket.MSG_WAITALL) == b"\0\0\0\0"  # an empty server token: logged in
                assert raw_frame(sock, METADATA, 8, R.metadata_body([])) is not None
            else:
                assert closed_by_peer(sock, timeout=5)


@pytest.mark.skipif(shutil.which("node") is None or shutil.which("npm") is None,
                    reason="make test installs nodejs and npm; run through make")
def test_kafkajs_over_sasl_ssl_with_each_mechanism(node_factory, tmp_path):
    from tests.test_transactions import FRAMEWORKS, KAFKAJS, node_modules

    modules = node_modules("kafkajs", KAFKAJS)
    sasl = SaslNode(node_factory, tmp_path, before_start=with_users(*((f"js-{m.lower()}", m) for m in MECHANISMS)))
    bootstrap = f"127.0.0.1:{sasl.sasl_ssl_port}"

    def run(topic: str, mechanism: str, user: str, password: str) -> dict:
        done = subprocess.run(["node", str(FRAMEWORKS / "kafkajs_sasl.js"), bootstrap, topic, mechanism.lower(), user,
                               password, sasl.certificates.ca], capture_output=True, text=True, timeout=90,
                              env={**os.environ, "NODE_PATH": str(modules)})
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    for mechanism in MECHANISMS:
        create_topic(sasl.node.bootstrap, f"js-{mechanism.lower()}", 1)
        assert run(f"js-{mechanism.lower()}", mechanism, f"js-{mechanism.lower()}", PASSWORD) == {"high": 50}
    assert run("js-plain", "SCRAM-SHA-256", "js-scram-sha-256", "wrong") == {"error": "KafkaJSSASLAuthenticationError"}
