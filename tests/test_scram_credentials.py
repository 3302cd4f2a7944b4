"""DescribeUserScramCredentials and AlterUserScramCredentials against a real node (confluent-kafka's AdminClient):
a user created through the API logs in, its credential is listed with its iterations and deleted again, a
non-super user is refused with the authorizer on, and Kafka's per-user errors (a user changed twice in one request,
whatever the mechanisms, is DUPLICATE_RESOURCE, as Kafka 4's controller answers)."""

from __future__ import annotations

import socket
import time

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
                                   UserScramCredentialUpsertion)

from scripts.harness import rawkafka as R
from tests.test_acls_api import AUTHORIZER, admin_for, outcomes
from tests.test_security_sasl import SaslNode, login_error, raw_frame, with_users

pytestmark = [pytest.mark.node, pytest.mark.usefixtures("librdkafka_clients_collected")]

DESCRIBE_SCRAM = 50
CLUSTER_AUTHORIZATION_FAILED = 31


def test_users_made_through_the_api_log_in_are_listed_and_deleted(node_factory, tmp_path) -> None:
    sasl = SaslNode(node_factory, tmp_path, workers=2, more=AUTHORIZER,
                    before_start=with_users(("admin", "SCRAM-SHA-256"), ("alice", "SCRAM-SHA-256"),
                                            ("plain", "PLAIN")))
    admin = admin_for(sasl, "admin")
    made = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"carol pw"),
        UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"dave pw"),
        # Two changes of one user in a request, whatever their mechanisms: Kafka's controller refuses the user.
        UserScramCredentialUpsertion("eve", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"eve pw"),
        UserScramCredentialUpsertion("eve", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"eve pw"),
    ], request_timeout=10)
    assert outcomes(made) == {"carol": None, "dave": "UNACCEPTABLE_CREDENTIAL", "eve": "DUPLICATE_RESOURCE"}
    deadline = time.monotonic() + 5  # workers read the store again within sasl.users_check_interval_ms
    while login_error(sasl.client("SCRAM-SHA-512", "carol", "carol pw", tls=False), timeout=3)[0] is not None:
        assert time.monotonic() < deadline, "carol cannot log in"
    assert login_error(sasl.client("SCRAM-SHA-256", "dave", "dave pw", tls=False), timeout=3)[0] is not None

    described = admin.describe_user_scram_credentials(["carol", "nobody"], request_timeout=10)
    carol = described["carol"].result(timeout=20)
    assert [(info.mechanism, info.iterations) for info in carol.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_512, 8192)]
    with pytest.raises(KafkaException, match="RESOURCE_NOT_FOUND"):
        described["nobody"].result(timeout=20)
    everyone = admin.describe_user_scram_credentials(request_timeout=10).result(timeout=20)
    assert sorted(everyone) == ["admin", "alice", "carol"]  # "plain" has no SCRAM credential, "eve" none made

    alice = admin_for(sasl, "alice")
    refused = alice.alter_user_scram_credentials([UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_512)],
                                                 request_timeout=10)
    assert outcomes(refused) == {"carol": "CLUSTER_AUTHORIZATION_FAILED"}
    # Refused describes by a raw request (librdkafka 2.x crashes on a DescribeUserScramCredentials error), from the
    # anonymous principal of the plaintext listener.
    body = R.request_body(DESCRIBE_SCRAM, 0, "DescribeUserScramCredentialsRequest",
                          users=(R.request_entity(DESCRIBE_SCRAM, 0, "UserName", name="carol"),))
    with socket.create_connection(("127.0.0.1", sasl.node.port), timeout=10) as sock:
        answer = R.decode_response(DESCRIBE_SCRAM, 0, raw_frame(sock, DESCRIBE_SCRAM, 0, body))
    assert answer.error_code == CLUSTER_AUTHORIZATION_FAILED
    assert [(r.user, r.error_code, r.credential_infos) for r in answer.results] == [
        ("carol", CLUSTER_AUTHORIZATION_FAILED, ())]

    deleted = admin.alter_user_scram_credentials([
        UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_512),
        UserScramCredentialDeletion("alice", ScramMechanism.SCRAM_SHA_512),  # alice has SCRAM-SHA-256 only
    ], request_timeout=10)
    assert outcomes(deleted) == {"carol": None, "alice": "RESOURCE_NOT_FOUND"}
    deadline = time.monotonic() + 5
    while login_error(sasl.client("SCRAM-SHA-512", "carol", "carol pw", tls=False), timeout=3)[0] is None:
        assert time.monotonic() < deadline, "carol still logs in"
    assert login_error(sasl.client("SCRAM-SHA-256", "alice", tls=False))[0] is None  # untouched
