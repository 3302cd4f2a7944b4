"""What TLS and SASL cost: producer and consumer throughput over SASL_SSL (SCRAM-SHA-512) against PLAINTEXT, and
connection setup with a SCRAM login against a plain connect, measured alternately on one node in one run.

One node (scripts/harness/nodeproc.py, --workers workers) with a PLAINTEXT listener and a SASL_SSL one (a test CA
made by trustme, a SCRAM-SHA-512 user); rounds alternate the two (scripts/harness/abba.py: ABBA order, each ratio
sasl_ssl/plaintext the median of the rounds' own ratios). Each round measures, on each listener in turn:
- producer: a confluent-kafka producer sends --records records of --record-bytes (acks=1, linger 5 ms) to a fresh
  topic: records/s, and the workers' CPU per 1,000 records;
- consumer: a confluent-kafka consumer reads that topic from the start (records by sendfile on PLAINTEXT, by
  read + TLS send on SASL_SSL): records/s;
- connects: for --connect-seconds, one client after another opens a connection and, on SASL_SSL, does the TLS
  handshake and a SCRAM-SHA-512 login (scramp's client), on PLAINTEXT one ApiVersions round trip: connections/s.

    .venv/bin/python -m scripts.bench_security [--runs 4] [--workers 2] [--json]

Only 127.0.0.1 is used; every measurement is bounded in time; the node is stopped by pid.
"""

from __future__ import annotations

import argparse
import socket
import ssl
import struct
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from scramp import ScramClient

from shmbroker.node.storage.users import UsersStore
from scripts.harness import abba, benchnode
from scripts.harness import rawkafka as R
from scripts.harness.nodeproc import LOOPBACK, NodeProcess, free_port

SCRIPT = "bench_security"
USER, PASSWORD, MECHANISM = "bench", "bench-password", "SCRAM-SHA-512"
METRICS = ("producer_records_per_s", "worker_cpu_us_per_1k_records", "consumer_records_per_s", "connects_per_s")
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
TIMEOUT_S = 60.0


class Listeners:
    def __init__(self, work: Path) -> None:
        import trustme  # the test extra's: the module imports with the node's dependencies alone

        ca = trustme.CA()
        self.ca = str(work / "ca.pem")
        self.server = str(work / "server.pem")
        ca.cert_pem.write_to_path(self.ca)
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(self.server)
        self.sasl_ssl_port = free_port()

    def config(self) -> str:
        return (f'[[listeners]]\nname = "SECURE"\naddress = "127.0.0.1:{self.sasl_ssl_port}"\n'
                f'security_protocol = "SASL_SSL"\n[tls]\ncertfile = "{self.server}"\nkeyfile = "{self.server}"\n')

    def client(self, mode: str, node: NodeProcess) -> dict:
        if mode == "plaintext":
            return {"bootstrap.servers": node.bootstrap}
        return {"bootstrap.servers": f"{LOOPBACK}:{self.sasl_ssl_port}", "security.protocol": "SASL_SSL",
                "sasl.mechanism": MECHANISM, "sasl.username": USER, "sasl.password": PASSWORD,
                "ssl.ca.location": self.ca}


def measure_producer(client: dict, topic: str, node: NodeProcess, args: argparse.Namespace) -> dict:
    producer = Producer({**client, "linger.ms": 5, "acks": 1, "batch.size": 256 * 1024})
    value = b"x" * args.record_bytes
    started = time.monotonic()
    with benchnode.CpuMeter(node) as cpu:
        for _ in range(args.records):
            benchnode.produce_when_room(producer, topic, value)
        if producer.flush(TIMEOUT_S):
            raise RuntimeError("the producer did not finish")
    wall = time.monotonic() - started
    return {"producer_records_per_s": args.records / wall,
            "worker_cpu_us_per_1k_records": cpu.fields["worker_cores"] * wall / args.records * 1e9}


def measure_consumer(client: dict, topic: str, args: argparse.Namespace) -> dict:
    consumer = Consumer({**client, "group.id": "bench-security", "enable.auto.commit": False,
                         "fetch.max.bytes": 16 << 20})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = 0
    started = time.monotonic()
    while got < args.records and time.monotonic() - started < TIMEOUT_S:
        got += sum(1 for message in consumer.consume(10_000, 0.5) if not message.error())
    wall = time.monotonic() - started
    consumer.close()
    if got < args.records:
        raise RuntimeError(f"the consumer read {got} of {args.records}")
    return {"consumer_records_per_s": got / wall}


def _answer(sock, api_key: int, version: int, body: bytes) -> object:
    sock.sendall(R.encode_request(api_key, version, 1, body))
    reader = sock.makefile("rb")
    size = struct.unpack(">i", reader.read(4))[0]
    return R.decode_response(api_key, version, reader.read(size)[4:])


def connect_once(mode: str, port: int, context: ssl.SSLContext | None) -> None:
    with socket.create_connection((LOOPBACK, port), timeout=10) as raw:
        if mode == "plaintext":
            _answer(raw, R.API_VERSIONS, 0, b"")
            return
        with context.wrap_socket(raw, server_hostname=LOOPBACK) as tls:
            _answer(tls, SASL_HANDSHAKE, 1, R.request_body(SASL_HANDSHAKE, 1, "SaslHandshakeRequest",
                                                           mechanism=MECHANISM))
            scram = ScramClient([MECHANISM], USER, PASSWORD)
            first = _answer(tls, SASL_AUTHENTICATE, 2, R.request_body(
                SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=scram.get_client_first().encode()))
            scram.set_server_first(first.auth_bytes.decode())
            final = _answer(tls, SASL_AUTHENTICATE, 2, R.request_body(
                SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=scram.get_client_final().encode()))
            if final.error_code:
                raise RuntimeError(f"login refused: {final.error_code}")
            scram.set_server_final(final.auth_bytes.decode())


def measure_connects(mode: str, port: int, context: ssl.SSLContext, args: argparse.Namespace) -> dict:
    count = 0
    started = time.monotonic()
    while time.monotonic() - started < args.connect_seconds:
        connect_once(mode, port, context)
        count += 1
    return {"connects_per_s": count / (time.monotonic() - started)}


def main(argv: list[str] | None = None) -> int:
    parser = abba.ab_parser(SCRIPT, __doc__, 4, "rounds: each load on each listener", "one JSON document on stdout")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--connect-seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.records < 1 or args.connect_seconds <= 0:
        parser.error("--runs, --records and --connect-seconds must be positive")
    rounds = abba.AlternatingRounds("sasl_ssl", "plaintext", args.runs)
    with tempfile.TemporaryDirectory(prefix="bench-security-") as work_dir:
        work = Path(work_dir)
        listeners = Listeners(work)
        UsersStore(str(work / "data")).add(USER, MECHANISM, PASSWORD)
        node = NodeProcess(work, workers=args.workers, config=listeners.config(), data_dir=work / "data",
                           announce=True).start()
        context = ssl.create_default_context(cafile=listeners.ca)
        try:
            for round_index, mode in rounds.steps():
                topic = f"bench-{mode}-{round_index}"
                client = listeners.client(mode, node)
                values = measure_producer(client, topic, node, args)
                values |= measure_consumer(client, topic, args)
                port = node.port if mode == "plaintext" else listeners.sasl_ssl_port
                values |= measure_connects(mode, port, context, args)
                rounds.record(round_index, mode, values)
                abba.log_step(SCRIPT, round_index, mode, values)
        finally:
            node.stop()
    report = {"script": SCRIPT, "workers": args.workers, "records": args.records, "record_bytes": args.record_bytes,
              "metrics": {metric: rounds.compare(metric, 2) for metric in METRICS}}
    abba.print_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
