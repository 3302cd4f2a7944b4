"""`shmbroker transactions ... --bootstrap`: the transactional ids through the Kafka API (ListTransactions v1 to
every broker, DescribeTransactions v0 to each id's coordinator), so the command works against any Kafka-compatible
broker, not only a local node's shared memory. confluent-kafka has no call for these APIs: the requests are kio's,
over a plain socket.

Invariants: every connect and answer is bounded by the caller's timeouts; an unreachable broker raises
node.tools.admin.Unreachable and a broker's error AdminError with Kafka's error name; the entries have the keys the
stats-segment path gives (node.tools.inspect.NodeReader.transactions), None where the Kafka API does not tell
(the last change, the groups). A transaction's start of -1 (Kafka's "none") is read as no start: kio's own reader
refuses negative times, so DescribeTransactions' answer is read with that one field as a plain int64.
"""

from __future__ import annotations

import dataclasses
import io
import socket
import struct
import time
import typing
from typing import Any

from kio.schema.describe_transactions.v0 import request as describe_request
from kio.schema.describe_transactions.v0 import response as describe_response
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4 import request as find_request
from kio.schema.find_coordinator.v4 import response as find_response
from kio.schema.list_transactions.v1 import request as list_request
from kio.schema.list_transactions.v1 import response as list_response
from kio.schema.metadata.v12 import request as metadata_request
from kio.schema.metadata.v12 import response as metadata_response
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i64

from shmbroker.node.tools.admin import AdminError, Unreachable

CLIENT_ID = b"shmbroker-cli"
TRANSACTION_COORDINATOR = 1  # FindCoordinator's key type of a transactional id
_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhih")  # api key, version, correlation id, client id length (header v2, then its tags)


def _with_plain_start_time() -> type:
    """DescribeTransactions v0's response, its transaction_start_time read as the int64 it is on the wire."""

    def derive(cls: type, replaced: dict[str, tuple[Any, Any]]) -> type:
        hints = typing.get_type_hints(cls)
        fields = []
        for f in dataclasses.fields(cls):
            kind, metadata = replaced.get(f.name, (hints[f.name], f.metadata))
            options: dict[str, Any] = {"metadata": metadata}
            if f.default is not dataclasses.MISSING:
                options["default"] = f.default
            fields.append((f.name, kind, dataclasses.field(**options)))
        derived = dataclasses.make_dataclass(cls.__name__, fields, frozen=True, slots=True, kw_only=True)
        for attribute in ("__type__", "__version__", "__flexible__", "__api_key__", "__header_schema__"):
            setattr(derived, attribute, getattr(cls, attribute))
        return derived

    state = derive(describe_response.TransactionState, {"transaction_start_time": (i64, {"kafka_type": "int64"})})
    return derive(describe_response.DescribeTransactionsResponse, {"transaction_states": (tuple[state, ...], {})})


_READ_DESCRIBED = entity_reader(_with_plain_start_time())


class Connection:
    """One broker connection: flexible requests (header v2), their answers in order."""

    def __init__(self, host: str, port: int, timeout_s: float, connect_timeout_s: float) -> None:
        try:
            self.sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        except OSError as exc:
            raise Unreachable(f"{host}:{port}: {exc}") from None
        self.sock.settimeout(timeout_s)
        self.correlation_id = 0

    def call(self, request: Any, read: Any) -> Any:
        self.correlation_id += 1
        body = io.BytesIO()
        entity_writer(type(request))(body, request)
        head = _HEADER.pack(int(request.__api_key__), int(request.__version__), self.correlation_id,
                            len(CLIENT_ID)) + CLIENT_ID + b"\x00"
        frame = head + body.getvalue()
        try:
            self.sock.sendall(_SIZE.pack(len(frame)) + frame)
            (size,) = _SIZE.unpack(self._exactly(_SIZE.size))
            answer = self._exactly(size)
        except OSError as exc:
            raise Unreachable(f"{self.sock.getpeername()}: {exc}") from None
        response, _ = read(answer, _SIZE.size + 1)  # after the correlation id and header v1's tags
        return response

    def _exactly(self, count: int) -> bytes:
        data = bytearray()
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise OSError("the broker closed the connection")
            data += chunk
        return bytes(data)

    def close(self) -> None:
        self.sock.close()


class TransactionsApi:
    def __init__(self, bootstrap: str, timeout_s: float, connect_timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
        self.bootstrap = (host, int(port))

    def _connect(self, host: str, port: int) -> Connection:
        return Connection(host, port, self.timeout_s, self.connect_timeout_s)

    def _brokers(self) -> list[tuple[str, int]]:
        conn = self._connect(*self.bootstrap)
        try:
            answer = conn.call(metadata_request.MetadataRequest(topics=(), allow_auto_topic_creation=False,
                                                                include_topic_authorized_operations=False),
                               entity_reader(metadata_response.MetadataResponse))
        finally:
            conn.close()
        return [(b.host, int(b.port)) for b in answer.brokers]

    def _coordinator(self, transactional_id: str) -> tuple[str, int]:
        conn = self._connect(*self.bootstrap)
        try:
            answer = conn.call(find_request.FindCoordinatorRequest(key_type=i8(TRANSACTION_COORDINATOR),
                                                                   coordinator_keys=(transactional_id,)),
                               entity_reader(find_response.FindCoordinatorResponse))
        finally:
            conn.close()
        (found,) = answer.coordinators
        _check(found.error_code, f"FindCoordinator for {transactional_id!r}")
        return found.host, int(found.port)

    def list(self) -> list[dict]:
        """Every transactional id of every broker, described, open transactions first."""
        listed: dict[tuple[str, int], list[str]] = {}
        for broker in self._brokers():
            conn = self._connect(*broker)
            try:
                answer = conn.call(list_request.ListTransactionsRequest(), entity_reader(list_response.ListTransactionsResponse))
            finally:
                conn.close()
            _check(answer.error_code, f"ListTransactions at {broker[0]}:{broker[1]}")
            listed[broker] = [t.transactional_id for t in answer.transaction_states]
        described = []
        for broker, ids in listed.items():
            if ids:
                described += self._describe_at(broker, ids)
        return sorted(described, key=lambda t: (t["start_ms"] < 0, t["transactional_id"]))

    def describe(self, transactional_id: str) -> dict | None:
        """The id's state at its coordinator; None if the coordinator does not know it."""
        found = self._describe_at(self._coordinator(transactional_id), [transactional_id])
        return found[0] if found else None

    def _describe_at(self, broker: tuple[str, int], ids: list[str]) -> list[dict]:
        conn = self._connect(*broker)
        try:
            answer = conn.call(describe_request.DescribeTransactionsRequest(transactional_ids=tuple(ids)),
                               _READ_DESCRIBED)
        finally:
            conn.close()
        now = time.time_ns() // 1_000_000
        out = []
        for t in answer.transaction_states:
            if t.error_code == ErrorCode.transactional_id_not_found:
                continue
            _check(t.error_code, f"DescribeTransactions of {t.transactional_id!r}")
            start_ms = int(t.transaction_start_time)
            out.append({"transactional_id": t.transactional_id, "state": t.transaction_state,
                        "producer_id": int(t.producer_id), "producer_epoch": int(t.producer_epoch),
                        "timeout_ms": int(t.transaction_timeout.total_seconds() * 1000), "start_ms": start_ms,
                        "last_update_ms": None, "groups": None,
                        "partitions": [{"topic": topic.topic, "partition": int(p)}
                                       for topic in t.topics for p in topic.partitions],
                        "duration_ms": max(0, now - start_ms) if start_ms >= 0 else None})
        return out


def _check(error: ErrorCode, what: str) -> None:
    if error != ErrorCode.none:
        raise AdminError(f"{what}: {error.name.upper()}")
