"""Listeners and TLS against a real node: [[listeners]] of each kind beside --listen's PLAINTEXT one, Metadata naming
the listener a client came through, confluent-kafka over SSL (records by read + send), mutual TLS, and the hostile
cases: a plaintext client and garbage on a TLS port, a client that stops mid-handshake."""

from __future__ import annotations

import socket
import ssl
import struct
import time

import pytest
import trustme
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from scripts.harness import rawkafka as R
from scripts.harness.nodeproc import free_port
from tests.test_clients import check_roundtrip, consume_all, create_topic, produce, records_for
from tests.test_hardening import api_versions_ok, closed_by_peer
from tests.waiting import wait_for

pytestmark = pytest.mark.node


class Certificates:
    """A CA, the node's certificate for 127.0.0.1, a client certificate and one of a CA the node does not trust."""

    def __init__(self, directory) -> None:
        self.dir = directory
        ca = trustme.CA()
        self.ca = self._write(ca.cert_pem, "ca.pem")
        server = ca.issue_cert("127.0.0.1", "localhost")
        self.server = self._write(server.private_key_and_cert_chain_pem, "server.pem")
        client = ca.issue_cert("client-one@example.com", common_name="client-one")
        self.client_cert = self._write(client.cert_chain_pems[0], "client.pem")
        self.client_key = self._write(client.private_key_pem, "client.key")
        stranger = trustme.CA().issue_cert("stranger@example.com", common_name="stranger")
        self.stranger_cert = self._write(stranger.cert_chain_pems[0], "stranger.pem")
        self.stranger_key = self._write(stranger.private_key_pem, "stranger.key")

    def _write(self, blob, name: str) -> str:
        path = self.dir / name
        blob.write_to_path(str(path))
        return str(path)

    def tls_section(self, mutual: bool = False) -> str:
        return (f'[tls]\ncertfile = "{self.server}"\nkeyfile = "{self.server}"\n'
                + (f'cafile = "{self.ca}"\n' if mutual else ""))


@pytest.fixture
def certificates(tmp_path) -> Certificates:
    directory = tmp_path / "certs"
    directory.mkdir()
    return Certificates(directory)


def listener(name: str, port: int, protocol: str) -> str:
    return f'[[listeners]]\nname = "{name}"\naddress = "127.0.0.1:{port}"\nsecurity_protocol = "{protocol}"\n'


def ssl_client(certificates: Certificates, port: int, **more) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL",
            "ssl.ca.location": certificates.ca, **more}


def tls_api_versions_ok(tls: ssl.SSLSocket) -> bool:
    """One ApiVersions v0 round trip over a TLS socket (which takes no recv flags)."""
    tls.sendall(R.encode_request(R.API_VERSIONS, 0, 7, b""))
    reader = tls.makefile("rb")
    size = struct.unpack(">i", reader.read(4))[0]
    body = reader.read(size)
    return len(body) == size and struct.unpack_from(">ih", body) == (7, 0)


def brokers_named(config: dict) -> list[str]:
    metadata = AdminClient(config).list_topics(timeout=20)
    return [f"{broker.host}:{broker.port}" for broker in metadata.brokers.values()]


def test_each_listener_advertises_its_own_address_and_tls_carries_records(node_factory, certificates):
    tls_port, second_port = free_port(), free_port()
    node = node_factory(workers=2, config=listener("SECURE", tls_port, "SSL") + listener("OTHER", second_port,
                                                                                          "PLAINTEXT")
                        + certificates.tls_section())
    tls = ssl_client(certificates, tls_port)
    assert brokers_named({"bootstrap.servers": node.bootstrap}) == [node.bootstrap]
    assert brokers_named({"bootstrap.servers": f"127.0.0.1:{second_port}"}) == [f"127.0.0.1:{second_port}"]
    assert brokers_named(tls) == [f"127.0.0.1:{tls_port}"]
    create_topic(node.bootstrap, "crossing", 3)
    # Written over TLS, read over plaintext (sendfile) and over TLS (read + send): the same records, in order.
    sent = records_for(3000, "tls")
    produce(f"127.0.0.1:{tls_port}", "crossing", sent, **{k: v for k, v in tls.items() if k != "bootstrap.servers"})
    check_roundtrip(sent, consume_all(node.bootstrap, "crossing", 3, len(sent)))
    check_roundtrip(sent, consume_all(tls["bootstrap.servers"], "crossing", 3, len(sent),
                                      **{k: v for k, v in tls.items() if k != "bootstrap.servers"}))
    # Records near the largest batch, both ways over TLS: requests larger than one read (received into a mapping
    # of their own) and responses larger than one TLS write.
    large = [{"key": f"big{i}".encode(), "value": bytes([i]) * 900_000, "partition": 0} for i in range(4)]
    produce(f"127.0.0.1:{tls_port}", "large", large, **{k: v for k, v in tls.items() if k != "bootstrap.servers"})
    got = consume_all(tls["bootstrap.servers"], "large", 1, len(large),
                      **{k: v for k, v in tls.items() if k != "bootstrap.servers"})
    assert [(m.key(), m.value()) for m in got] == [(r["key"], r["value"]) for r in large]
    # A client that does not trust the node's certificate gets nowhere.
    with pytest.raises(KafkaException):
        AdminClient({**tls, "ssl.ca.location": certificates.stranger_cert, "log_level": 0}).list_topics(timeout=5)


def test_a_plaintext_client_and_garbage_on_a_tls_port_cost_one_connection_each(node_factory, certificates):
    tls_port = free_port()
    node = node_factory(workers=1, config=listener("SECURE", tls_port, "SSL") + certificates.tls_section())
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", tls_port), timeout=5) as plain:
        assert not api_versions_ok(plain, timeout=5)  # a Kafka request is no ClientHello
    with socket.create_connection(("127.0.0.1", tls_port), timeout=5) as garbage:
        garbage.sendall(b"\x16\x03\x01\x00\x05hello" + bytes(range(256)) * 4)
        assert closed_by_peer(garbage, timeout=5)
    assert time.monotonic() - started < 5  # refused at once, not by a timeout
    wait_for(lambda: node.log().count("TLS handshake failed") >= 1, 5, "the handshake failure's log line")
    assert node.log().count("TLS handshake failed") == 1  # one line per interval, however many clients
    assert brokers_named(ssl_client(certificates, tls_port)) == [f"127.0.0.1:{tls_port}"]  # the worker serves on
    with socket.create_connection(("127.0.0.1", node.port), timeout=5) as plain:
        assert api_versions_ok(plain)


def test_a_client_that_stops_mid_handshake_is_closed_by_the_request_timeout_and_holds_nothing(node_factory,
                                                                                              certificates):
    tls_port = free_port()
    node = node_factory(workers=1, config=listener("SECURE", tls_port, "SSL") + certificates.tls_section()
                        + "[server]\nrequest_timeout_ms = 1500\n")
    stalled = socket.create_connection(("127.0.0.1", tls_port), timeout=5)
    # The first bytes of a ClientHello, then nothing: the worker waits for the rest without blocking.
    stalled.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    started = time.monotonic()
    # Meanwhile the same (only) worker serves a whole TLS session and plaintext clients.
    assert brokers_named(ssl_client(certificates, tls_port)) == [f"127.0.0.1:{tls_port}"]
    with socket.create_connection(("127.0.0.1", node.port), timeout=5) as plain:
        assert api_versions_ok(plain)
    assert closed_by_peer(stalled, timeout=10)
    waited = time.monotonic() - started
    stalled.close()
    assert 1.0 <= waited < 6, waited
    wait_for(lambda: "request_timeout_ms" in node.log(), 5, "the timeout's log line")


def test_mutual_tls_admits_certificates_the_ca_verifies_only(node_factory, certificates):
    tls_port = free_port()
    node = node_factory(workers=1, config=listener("SECURE", tls_port, "SSL") + certificates.tls_section(mutual=True))
    signed = ssl_client(certificates, tls_port, **{"ssl.certificate.location": certificates.client_cert,
                                                  "ssl.key.location": certificates.client_key})
    assert brokers_named(signed) == [f"127.0.0.1:{tls_port}"]
    for refused in (ssl_client(certificates, tls_port),  # no certificate
                    ssl_client(certificates, tls_port, **{"ssl.certificate.location": certificates.stranger_cert,
                                                         "ssl.key.location": certificates.stranger_key})):
        with pytest.raises(KafkaException):
            AdminClient({**refused, "log_level": 0}).list_topics(timeout=5)
    # Python's ssl as a second client: with the signed certificate the handshake completes and Kafka is served.
    context = ssl.create_default_context(cafile=certificates.ca)
    context.load_cert_chain(certificates.client_cert, certificates.client_key)
    with socket.create_connection(("127.0.0.1", tls_port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls_api_versions_ok(tls)
    wait_for(lambda: "TLS handshake failed" in node.log(), 5, "the refused certificate's log line")


def test_listeners_config_with_listen_and_its_errors(tmp_path):
    from shmbroker.node import config as node_config

    path = tmp_path / "node.toml"
    path.write_text(listener("SECURE", 9443, "SASL_SSL") + '[tls]\ncertfile = "c.pem"\nkeyfile = "k.pem"\n')
    settled = node_config.load(str(path), {"server.host": "127.0.0.1", "server.port": 9100})
    assert [(item.name, item.address, item.security_protocol) for item in settled.listeners] == [
        ("PLAINTEXT", "127.0.0.1:9100", "PLAINTEXT"), ("SECURE", "127.0.0.1:9443", "SASL_SSL")]
    assert node_config.NodeConfig.from_json(settled.to_json()) == settled
    alone = node_config.load(str(path))
    assert [item.name for item in alone.listeners] == ["SECURE"] and alone.server.port == 9443
    for text, complaint in ((listener("A", 1, "TLS"), "security_protocol"),
                            (listener("A", 1, "SSL"), "tls.certfile"),
                            (listener("A", 1, "PLAINTEXT") + listener("A", 2, "PLAINTEXT"), "two listeners")):
        path.write_text(text)
        with pytest.raises(node_config.ConfigError, match=complaint):
            node_config.load(str(path))


def test_requests_behind_a_large_one_in_the_same_tls_record_are_served(node_factory, certificates):
    """A request larger than one read is received up to its last byte; the bytes TLS decrypted past it (the next
    request, sent in the same write) wait inside TLS, where epoll cannot see them: they are read in the same turn."""
    tls_port = free_port()
    node_factory(workers=1, config=listener("SECURE", tls_port, "SSL") + certificates.tls_section())
    context = ssl.create_default_context(cafile=certificates.ca)
    batch = R.make_batch(3, 100_000)  # ~300 KB: more than one read (server.recv_bytes)
    with socket.create_connection(("127.0.0.1", tls_port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(R.produce_request("behind", 0, batch, correlation_id=1)
                        + R.encode_request(R.API_VERSIONS, 0, 2, b""))
            reader = tls.makefile("rb")
            for expected in (1, 2):
                size = struct.unpack(">i", reader.read(4))[0]
                assert struct.unpack_from(">i", reader.read(size))[0] == expected
