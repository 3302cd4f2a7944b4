"""The users store: `<data_dir>/users.json`, SASL credentials as SCRAM salted hashes (RFC 5802/7677), never a password.

Each user has one credential per mechanism it was added with: the salt, the iteration count, StoredKey and ServerKey
of SCRAM-SHA-256 or SCRAM-SHA-512; a user added for PLAIN gets a SCRAM-SHA-512 credential under PLAIN. A SCRAM login
is checked against the credential of its mechanism; a PLAIN login against any credential of the user (the password
salted and hashed as the credential says, compared with its StoredKey in constant time).

Invariants:
- A change is a read-modify-write under an exclusive lock on `users.json.lock` (`shmbroker users` against a running
  node, or two at once, never lose each other's change), written durably and atomically (node.storage.durable):
  readers see the old file or the new one, whole. The file is readable by its owner only.
- Readers (`UsersView`) take a change without a restart: they look at the file's identity (inode, size, mtime) at
  most once per `check_interval_s`, and read it again when it changed. A file that cannot be read keeps the last
  good table (one log line); a missing file is an empty table.
- Iteration counts are at least MIN_ITERATIONS (4096, Kafka's default and RFC 7677's minimum for SHA-256).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import time
from dataclasses import dataclass

import orjson
from scramp import ScramMechanism

from shmbroker.node.storage import formats
from shmbroker.node.storage.durable import changing, write_durably

log = logging.getLogger("shmbroker.users")

FILE_NAME = "users.json"
MIN_ITERATIONS = 4096
SCRAM_MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISMS = (*SCRAM_MECHANISMS, "PLAIN")
# The SCRAM credential a PLAIN user is stored as.
PLAIN_STORED_AS = "SCRAM-SHA-512"
FORMAT_VERSION = formats.USERS_FORMAT


class UsersError(ValueError):
    """A name, mechanism or iteration count the store refuses."""


@dataclass(frozen=True)
class Credential:
    mechanism: str  # the SCRAM mechanism whose hash it uses (SCRAM-SHA-256 or SCRAM-SHA-512)
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_json(self) -> dict:
        encode = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
        return {"mechanism": self.mechanism, "salt": encode(self.salt), "iterations": self.iterations,
                "stored_key": encode(self.stored_key), "server_key": encode(self.server_key)}

    @classmethod
    def from_json(cls, document: dict) -> "Credential":
        decode = base64.b64decode
        return cls(document["mechanism"], decode(document["salt"]), int(document["iterations"]),
                   decode(document["stored_key"]), decode(document["server_key"]))

    @classmethod
    def make(cls, mechanism: str, password: str, iterations: int) -> "Credential":
        scram = PLAIN_STORED_AS if mechanism == "PLAIN" else mechanism
        salt, stored_key, server_key, count = ScramMechanism(scram).make_auth_info(password,
                                                                                 iteration_count=iterations)
        return cls(scram, salt, count, stored_key, server_key)

    @classmethod
    def from_salted_password(cls, mechanism: str, salt: bytes, salted_password: bytes, iterations: int) -> "Credential":
        """The credential of a password a client salted itself (AlterUserScramCredentials: Hi(password, salt, i))."""
        algorithm = SCRAM_MECHANISMS[mechanism]
        client_key = hmac.new(salted_password, b"Client Key", algorithm).digest()
        server_key = hmac.new(salted_password, b"Server Key", algorithm).digest()
        return cls(mechanism, salt, iterations, hashlib.new(algorithm, client_key).digest(), server_key)

    def matches(self, password: str) -> bool:
        """Whether `password` is the one this credential was made from (RFC 5802: StoredKey = H(HMAC(Hi(...))))."""
        algorithm = SCRAM_MECHANISMS[self.mechanism]
        salted = hashlib.pbkdf2_hmac(algorithm, password.encode(), self.salt, self.iterations)
        client_key = hmac.new(salted, b"Client Key", algorithm).digest()
        return hmac.compare_digest(hashlib.new(algorithm, client_key).digest(), self.stored_key)


def users_path(data_dir: str) -> str:
    return os.path.join(data_dir, FILE_NAME)


def read_users(path: str) -> dict[str, dict[str, Credential]]:
    """name -> mechanism -> credential; {} for a missing file (OSError, ValueError: an unreadable one)."""
    try:
        with open(path, "rb") as f:
            document = orjson.loads(f.read())
    except FileNotFoundError:
        return {}
    formats.version_of(document, path, "version", FORMAT_VERSION)
    users = document.get("users", {})
    return {name: {mechanism: Credential.from_json(credential) for mechanism, credential in credentials.items()}
            for name, credentials in users.items()}


class UsersStore:
    """Changes to the users of a data directory (`shmbroker users`)."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.path = users_path(data_dir)

    def _change(self, edit) -> object:
        with changing(self.path):
            users = read_users(self.path)
            result = edit(users)
            document = {"version": FORMAT_VERSION, "users": {
                name: {mechanism: credential.to_json() for mechanism, credential in credentials.items()}
                for name, credentials in sorted(users.items())}}
            write_durably(self.path, orjson.dumps(document, option=orjson.OPT_INDENT_2), mode=0o600)
            return result

    def add(self, name: str, mechanism: str, password: str, iterations: int = MIN_ITERATIONS) -> None:
        """Add the user, or replace its credential of `mechanism` (its others stay)."""
        if not name or any(ch in name for ch in ",="):
            raise UsersError(f"user name {name!r}: must be non-empty, without ',' or '='")
        if mechanism not in MECHANISMS:
            raise UsersError(f"mechanism {mechanism!r}: must be one of {', '.join(MECHANISMS)}")
        if iterations < MIN_ITERATIONS:
            raise UsersError(f"iterations: at least {MIN_ITERATIONS}, got {iterations}")
        if not password:
            raise UsersError("the password is empty")
        credential = Credential.make(mechanism, password, iterations)
        self._change(lambda users: users.setdefault(name, {}).__setitem__(mechanism, credential))

    def alter(self, deletions: list[tuple[str, str]], upsertions: list[tuple[str, Credential]]) -> list[str]:
        """Remove the (user, SCRAM mechanism) credentials and set the given ones, in one change; the users of
        deletions that had no such credential (nothing of the change is made for them)."""

        def edit(users: dict[str, dict[str, Credential]]) -> list[str]:
            missing = [name for name, mechanism in deletions if mechanism not in users.get(name, {})]
            for name, mechanism in deletions:
                if name in missing:
                    continue
                del users[name][mechanism]
                if not users[name]:
                    del users[name]
            for name, credential in upsertions:
                if name not in missing:
                    users.setdefault(name, {})[credential.mechanism] = credential
            return missing
        return self._change(edit)  # type: ignore[return-value]

    def scram_iterations(self) -> dict[str, list[tuple[str, int]]]:
        """name -> [(SCRAM mechanism, iterations)] of its SCRAM credentials (not the one a PLAIN user has)."""
        return {name: sorted((m, c.iterations) for m, c in credentials.items() if m in SCRAM_MECHANISMS)
                for name, credentials in sorted(read_users(self.path).items())}

    def delete(self, name: str) -> bool:
        """Remove the user and all its credentials; False if there was none."""
        return bool(self._change(lambda users: users.pop(name, None)))

    def list(self) -> dict[str, list[tuple[str, int]]]:
        """name -> [(mechanism, iterations)]."""
        return {name: sorted((mechanism, credential.iterations) for mechanism, credential in credentials.items())
                for name, credentials in sorted(read_users(self.path).items())}


class UsersView:
    """A running node's view of the users, re-read when the file changed."""

    def __init__(self, data_dir: str, check_interval_s: float, clock=time.monotonic) -> None:
        self.path = users_path(data_dir)
        self.check_interval_s = check_interval_s
        self.clock = clock
        self._identity: tuple | None = None
        self._next_check = 0.0
        self._users: dict[str, dict[str, Credential]] = {}

    def _refresh(self) -> None:
        now = self.clock()
        if now < self._next_check:
            return
        self._next_check = now + self.check_interval_s
        try:
            st = os.stat(self.path)
            identity = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            identity = None
        if identity == self._identity:
            return
        try:
            self._users = read_users(self.path)
            self._identity = identity
        except (OSError, ValueError, KeyError) as exc:
            log.error("cannot read %s: %s (keeping the users read before)", self.path, exc)

    def credential(self, name: str, mechanism: str) -> Credential | None:
        self._refresh()
        return self._users.get(name, {}).get(mechanism)

    def credentials(self, name: str) -> list[Credential]:
        self._refresh()
        return list(self._users.get(name, {}).values())
