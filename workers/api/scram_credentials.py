"""DescribeUserScramCredentials and AlterUserScramCredentials: the SCRAM users of the node's users store
(node.storage.users), as Kafka's broker answers them.

Invariants:
- Describe needs DESCRIBE on the cluster, Alter needs ALTER (CLUSTER_AUTHORIZATION_FAILED otherwise: Describe's
  top-level error, every user of an Alter).
- Describe lists the SCRAM credentials (mechanism, iterations) of the named users, or of all users when none are
  named; an unknown user is RESOURCE_NOT_FOUND, a user named twice DUPLICATE_RESOURCE. Credentials of PLAIN users
  are not SCRAM credentials and are not listed.
- Alter answers once per user. A user is refused whole (nothing of it changes) when it is named more than once,
  whatever the mechanisms (DUPLICATE_RESOURCE, as Kafka 4's controller: two mechanisms of a user take two
  requests), or when any of its entries is: a mechanism other than SCRAM-SHA-256/512
  (UNSUPPORTED_SASL_MECHANISM), an empty name or iterations outside [4096, 16384] (UNACCEPTABLE_CREDENTIAL), a
  deletion of a credential it does not have (RESOURCE_NOT_FOUND). The other users' changes are made in one durable
  change of the store, which workers read again within `sasl.users_check_interval_ms`.
- The client salts the password (Hi(password, salt, i)); the store keeps StoredKey and ServerKey, never it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from kio.static.primitive import i8, i32

from shmbroker.node.storage.acls import CLUSTER_NAME, Operation, ResourceType
from shmbroker.node.storage.faults import storage_faults
from shmbroker.node.storage.records import StorageError
from shmbroker.node.storage.users import MIN_ITERATIONS, Credential, UsersStore
from shmbroker.workers.api.authorizer import RequestAuthorizer
from shmbroker.workers.api.responses import ZERO_THROTTLE, code, entity, reply
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.outcome import Outcome

MAX_ITERATIONS = 16384  # Kafka's ScramMechanism maximum
MECHANISM_BY_CODE = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}  # Kafka's ScramMechanism codes
DUPLICATE_MESSAGE = "A user credential cannot be altered twice in the same request"  # Kafka's words
CODE_BY_MECHANISM = {name: number for number, name in MECHANISM_BY_CODE.items()}


class ScramCredentialHandlers:
    def __init__(self, data_dir: str, authorizer: RequestAuthorizer) -> None:
        self.store = UsersStore(data_dir)
        self.authorizer = authorizer

    def table(self) -> dict[int, Callable[[Request, Any], Outcome]]:
        return {P.DESCRIBE_USER_SCRAM_CREDENTIALS: self.describe, P.ALTER_USER_SCRAM_CREDENTIALS: self.alter}

    def describe(self, req: Request, request: Any) -> Outcome:
        def response(error: E.ErrorCode, message: str | None, results: tuple = ()) -> Outcome:
            return reply(req, entity(req, "DescribeUserScramCredentialsResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=error, error_message=message, results=results))

        def result(name: str, error: E.ErrorCode, message: str | None, credentials=()) -> Any:
            return entity(req, "DescribeUserScramCredentialsResult", user=name, error_code=error,
                          error_message=message, credential_infos=tuple(
                              entity(req, "CredentialInfo", mechanism=i8(CODE_BY_MECHANISM[m]), iterations=i32(n))
                              for m, n in credentials))

        def refused(error: E.ErrorCode, message: str) -> Outcome:
            """The error at the top and for every user named (Kafka's error response; librdkafka (2.x) crashes on a
            named user missing from the results)."""
            return response(error, message, tuple(result(name, error, message)
                                                  for name in dict.fromkeys(u.name for u in request.users or ())))

        if not self.authorizer.allows(req, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return refused(E.CLUSTER_AUTHORIZATION_FAILED,
                           "DESCRIBE on the cluster is needed to describe SCRAM credentials")
        try:
            with storage_faults("the users store"):
                users = self.store.scram_iterations()
        except StorageError as exc:
            return refused(code(exc.error_code), str(exc))
        except (ValueError, KeyError) as exc:
            return refused(E.UNKNOWN_SERVER_ERROR, f"the users store cannot be read: {exc}")

        if not request.users:
            return response(E.NONE, None, tuple(result(name, E.NONE, None, credentials)
                                                for name, credentials in users.items() if credentials))
        counts = Counter(user.name for user in request.users)
        results = []
        for name in dict.fromkeys(user.name for user in request.users):
            if counts[name] > 1:
                results.append(result(name, E.DUPLICATE_RESOURCE, "the user is named more than once"))
            elif not users.get(name):
                results.append(result(name, E.RESOURCE_NOT_FOUND, f"no SCRAM credential of user {name!r}"))
            else:
                results.append(result(name, E.NONE, None, users[name]))
        return response(E.NONE, None, tuple(results))

    def alter(self, req: Request, request: Any) -> Outcome:
        names = list(dict.fromkeys([d.name for d in request.deletions] + [u.name for u in request.upsertions]))

        def response(errors: dict[str, tuple[E.ErrorCode, str | None]]) -> Outcome:
            return reply(req, entity(req, "AlterUserScramCredentialsResponse", throttle_time=ZERO_THROTTLE, results=tuple(
                entity(req, "AlterUserScramCredentialsResult", user=name, error_code=errors.get(name, (E.NONE, None))[0],
                       error_message=errors.get(name, (E.NONE, None))[1]) for name in names)))

        if not self.authorizer.allows(req, Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
            # With a message: librdkafka (2.x) frees an unset one of a failed user (a crash of the client).
            refused = (E.CLUSTER_AUTHORIZATION_FAILED, "ALTER on the cluster is needed to alter SCRAM credentials")
            return response({name: refused for name in names})
        errors: dict[str, tuple[E.ErrorCode, str]] = {}
        entries = [(entry.name, int(entry.mechanism)) for entry in (*request.deletions, *request.upsertions)]
        named = Counter(name for name, _ in entries)
        for name, mechanism in entries:
            if named[name] > 1:  # as Kafka's controller (ScramControlManager), whatever the mechanisms
                errors.setdefault(name, (E.DUPLICATE_RESOURCE, DUPLICATE_MESSAGE))
            elif mechanism not in MECHANISM_BY_CODE:
                errors.setdefault(name, (E.UNSUPPORTED_SASL_MECHANISM, f"mechanism {mechanism}: SCRAM-SHA-256 (1) "
                                                                       "or SCRAM-SHA-512 (2)"))
            elif not name:
                errors.setdefault(name, (E.UNACCEPTABLE_CREDENTIAL, "the user name is empty"))
        for upsertion in request.upsertions:
            if not MIN_ITERATIONS <= int(upsertion.iterations) <= MAX_ITERATIONS:
                errors.setdefault(upsertion.name, (E.UNACCEPTABLE_CREDENTIAL, f"iterations must be within "
                                                   f"[{MIN_ITERATIONS}, {MAX_ITERATIONS}]"))
            elif not upsertion.salt or not upsertion.salted_password:
                errors.setdefault(upsertion.name, (E.UNACCEPTABLE_CREDENTIAL, "an empty salt or salted password"))
        deletions = [(d.name, MECHANISM_BY_CODE[int(d.mechanism)]) for d in request.deletions if d.name not in errors]
        upsertions = [(u.name, Credential.from_salted_password(MECHANISM_BY_CODE[int(u.mechanism)], bytes(u.salt),
                                                               bytes(u.salted_password), int(u.iterations)))
                      for u in request.upsertions if u.name not in errors]
        if deletions or upsertions:
            try:
                with storage_faults("the users store"):
                    missing = self.store.alter(deletions, upsertions)
            except StorageError as exc:
                failed = (code(exc.error_code), str(exc))
                return response({name: errors.get(name, failed) for name in names})
            except (ValueError, KeyError) as exc:
                failed = (E.UNKNOWN_SERVER_ERROR, f"the users store cannot be read: {exc}")
                return response({name: errors.get(name, failed) for name in names})
            for name in missing:
                errors[name] = (E.RESOURCE_NOT_FOUND, "no such credential to delete")
        return response(errors)

