"""The ACLs of a node (`<data_dir>/acls.json`) and the decision Kafka's authorizer makes from them.

An ACL binding is Kafka's: a resource pattern (resource type, name, pattern type LITERAL or PREFIXED; the literal
name "*" is every resource of its type) and an entry (principal "User:NAME" or "User:*", host or "*", operation,
ALLOW or DENY). `Authorization.allows` decides as Kafka's AclAuthorizer does:
1. a super user is allowed everything;
2. the bindings that match the resource are those of its type whose pattern is the literal name, the literal
   "*", or a prefix of the name; when none match, the answer is `allow_everyone_if_no_acl_found`;
3. a matching DENY for the principal (or User:*), the host (or *) and the operation (or ALL) refuses;
4. else a matching ALLOW for the operation, ALL, or an operation that implies it allows: READ, WRITE, DELETE and
   ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS;
5. else it is refused.
`allows_any` answers "may the principal do OP on some resource of this type" (Kafka's authorizeByResourceType,
which lets a producer that may WRITE a topic be idempotent without IDEMPOTENT_WRITE on the cluster).

Invariants of the store:
- A change is a read-modify-write under an exclusive lock on `acls.json.lock`, written durably and atomically
  (node.storage.durable): readers see the old set or the new one, whole; a binding is stored once however often
  it is created. After the write, under the lock, the change counter in shared memory (shm.generations.ACLS) is
  raised, so every worker reloads before its next check.
- A missing file is no ACLs; an unreadable one keeps a reader's last good set (one log line).
"""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass
from typing import Callable, Iterable

import orjson

from shmbroker.node.storage import formats
from shmbroker.node.storage.durable import changing, write_durably

log = logging.getLogger("shmbroker.acls")

FILE_NAME = "acls.json"
FORMAT_VERSION = formats.ACLS_FORMAT
WILDCARD = "*"  # the literal resource name of every resource of a type; the host and principal name of any
WILDCARD_PRINCIPAL = "User:*"


class ResourceType(enum.IntEnum):  # Kafka's AclResourceType codes
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):  # Kafka's PatternType codes (ANY and MATCH only in filters)
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):  # Kafka's AclOperation codes (ANY only in filters)
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):  # Kafka's AclPermissionType codes (ANY only in filters)
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"  # the one name of the cluster resource

# The operations an ALLOW of each key also grants (Kafka's implied operations).
_IMPLYING: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE,
                                   Operation.ALTER, Operation.ALL}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.ALL}),
}

# The operations each resource type has (Kafka's ResourceType operations); others are INVALID_REQUEST.
OPERATIONS_OF: dict[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset({Operation.ALL, Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE,
                                   Operation.ALTER, Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS,
                                   Operation.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({Operation.ALL, Operation.READ, Operation.DESCRIBE, Operation.DELETE,
                                   Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
    ResourceType.CLUSTER: frozenset({Operation.ALL, Operation.CREATE, Operation.CLUSTER_ACTION,
                                     Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE,
                                     Operation.ALTER, Operation.DESCRIBE}),
    ResourceType.TRANSACTIONAL_ID: frozenset({Operation.ALL, Operation.DESCRIBE, Operation.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({Operation.ALL, Operation.DESCRIBE}),
    ResourceType.USER: frozenset({Operation.ALL, Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS}),
}


def implying(operation: Operation) -> frozenset[Operation]:
    """The operations whose ALLOW grants `operation` (itself and ALL at least)."""
    return _IMPLYING.get(operation) or frozenset({operation, Operation.ALL})


class AclError(ValueError):
    """A binding the store refuses (Kafka answers it INVALID_REQUEST)."""


@dataclass(frozen=True, order=True)
class AclBinding:
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def validate(self) -> None:
        """AclError unless every field is a concrete value Kafka stores (no ANY, MATCH or UNKNOWN)."""
        operations = OPERATIONS_OF.get(self.resource_type)
        if operations is None:
            raise AclError(f"resource type {self.resource_type.name} cannot have ACLs")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise AclError(f"pattern type {self.pattern_type.name}: must be LITERAL or PREFIXED")
        if not self.resource_name:
            raise AclError("the resource name is empty")
        if self.resource_type == ResourceType.CLUSTER and (self.resource_name != CLUSTER_NAME
                                                          or self.pattern_type != PatternType.LITERAL):
            raise AclError(f"the cluster resource is the literal {CLUSTER_NAME!r}")
        if self.operation not in operations:
            raise AclError(f"operation {self.operation.name} does not apply to {self.resource_type.name}")
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            raise AclError(f"permission {self.permission.name}: must be ALLOW or DENY")
        kind, _, name = self.principal.partition(":")
        if not kind or not name:
            raise AclError(f"principal {self.principal!r}: must be TYPE:NAME, e.g. User:alice")
        if not self.host:
            raise AclError("the host is empty (use '*' for any)")

    def to_json(self) -> list:
        return [self.resource_type.name, self.resource_name, self.pattern_type.name, self.principal, self.host,
                self.operation.name, self.permission.name]

    @classmethod
    def from_json(cls, item: list) -> "AclBinding":
        rtype, name, pattern, principal, host, operation, permission = item
        return cls(ResourceType[rtype], name, PatternType[pattern], principal, host, Operation[operation],
                   Permission[permission])


@dataclass(frozen=True)
class AclFilter:
    """DescribeAcls' and DeleteAcls' filter: None names and ANY codes match everything; pattern type MATCH matches
    the bindings that would apply to the named resource (its literal, the wildcard, and prefixes of it)."""

    resource_type: ResourceType
    resource_name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    def matches(self, binding: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and binding.resource_type != self.resource_type:
            return False
        if self.operation != Operation.ANY and binding.operation != self.operation:
            return False
        if self.permission != Permission.ANY and binding.permission != self.permission:
            return False
        if self.principal is not None and binding.principal != self.principal:
            return False
        if self.host is not None and binding.host != self.host:
            return False
        if self.pattern_type == PatternType.MATCH:
            if self.resource_name is None:
                return True
            return _pattern_covers(binding, self.resource_name)
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and binding.pattern_type != self.pattern_type:
            return False
        return self.resource_name is None or binding.resource_name == self.resource_name


def _pattern_covers(binding: AclBinding, name: str) -> bool:
    if binding.pattern_type == PatternType.LITERAL:
        return binding.resource_name == name or binding.resource_name == WILDCARD
    return name.startswith(binding.resource_name)


class Authorization:
    """Decisions from one set of bindings (immutable; a change of ACLs makes a new one)."""

    def __init__(self, bindings: Iterable[AclBinding], super_users: Iterable[str],
                 allow_everyone_if_no_acl_found: bool) -> None:
        self.super_users = frozenset(super_users)
        self.allow_if_none = allow_everyone_if_no_acl_found
        # Per resource type: literal name -> bindings, and the prefixed ones (few, scanned).
        self._literal: dict[ResourceType, dict[str, list[AclBinding]]] = {}
        self._prefixed: dict[ResourceType, list[AclBinding]] = {}
        for binding in bindings:
            if binding.pattern_type == PatternType.LITERAL:
                self._literal.setdefault(binding.resource_type, {}).setdefault(binding.resource_name, []).append(
                    binding)
            else:
                self._prefixed.setdefault(binding.resource_type, []).append(binding)

    def _matching(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        literal = self._literal.get(resource_type, {})
        found = list(literal.get(name, ()))
        if name != WILDCARD:
            found.extend(literal.get(WILDCARD, ()))
        found.extend(b for b in self._prefixed.get(resource_type, ()) if name.startswith(b.resource_name))
        return found

    def allows(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
               name: str) -> bool:
        if principal in self.super_users:
            return True
        bindings = self._matching(resource_type, name)
        if not bindings:
            return self.allow_if_none
        granting = implying(operation)
        allowed = False
        for binding in bindings:
            if binding.principal not in (principal, WILDCARD_PRINCIPAL) or binding.host not in (host, WILDCARD):
                continue
            if binding.permission == Permission.DENY:
                if binding.operation in (operation, Operation.ALL):
                    return False
            elif binding.operation in granting:
                allowed = True
        return allowed

    def allows_any(self, principal: str, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        """Whether some resource of the type allows the operation: an ALLOW for it not cancelled by a DENY of the
        same pattern or of every resource ("*")."""
        if principal in self.super_users:
            return True
        bindings = [b for names in self._literal.get(resource_type, {}).values() for b in names]
        bindings += self._prefixed.get(resource_type, ())
        if not bindings:
            return self.allow_if_none
        granting = implying(operation)
        mine = [b for b in bindings if b.principal in (principal, WILDCARD_PRINCIPAL) and b.host in (host, WILDCARD)]
        denied = {(b.pattern_type, b.resource_name) for b in mine
                  if b.permission == Permission.DENY and b.operation in (operation, Operation.ALL)}
        if (PatternType.LITERAL, WILDCARD) in denied:
            return False
        return any(b.permission == Permission.ALLOW and b.operation in granting
                   and (b.pattern_type, b.resource_name) not in denied for b in mine)


def acls_path(data_dir: str) -> str:
    return os.path.join(data_dir, FILE_NAME)


def read_acls(path: str) -> list[AclBinding]:
    """The bindings of the file; [] for a missing file (OSError, ValueError, KeyError: an unreadable one)."""
    try:
        with open(path, "rb") as f:
            document = orjson.loads(f.read())
    except FileNotFoundError:
        return []
    formats.version_of(document, path, "version", FORMAT_VERSION)
    return [AclBinding.from_json(item) for item in document.get("acls", [])]


class AclStore:
    """Changes to the ACLs of a data directory; `changed` is called under the lock once a change is durable."""

    def __init__(self, data_dir: str, changed: Callable[[], None] | None = None) -> None:
        self.data_dir = data_dir
        self.path = acls_path(data_dir)
        self.changed = changed

    def _change(self, edit: Callable[[list[AclBinding]], object]) -> object:
        with changing(self.path):
            bindings = read_acls(self.path)
            before = list(bindings)
            result = edit(bindings)
            if bindings != before:
                document = {"version": FORMAT_VERSION, "acls": [b.to_json() for b in sorted(set(bindings))]}
                write_durably(self.path, orjson.dumps(document, option=orjson.OPT_INDENT_2), mode=0o600)
                if self.changed is not None:
                    self.changed()
            return result

    def create(self, bindings: list[AclBinding]) -> None:
        """Store the bindings (each validated first: AclError names the first bad one, and nothing is stored)."""
        for binding in bindings:
            binding.validate()

        def add(current: list[AclBinding]) -> None:
            present = set(current)
            for binding in bindings:
                if binding not in present:
                    present.add(binding)
                    current.append(binding)
        self._change(add)

    def delete(self, filters: list[AclFilter]) -> list[list[AclBinding]]:
        """Remove the bindings each filter matches; per filter, the bindings it removed."""

        def remove(current: list[AclBinding]) -> list[list[AclBinding]]:
            removed = [[b for b in current if f.matches(b)] for f in filters]
            gone = {b for matched in removed for b in matched}
            current[:] = [b for b in current if b not in gone]
            return removed
        return self._change(remove)  # type: ignore[return-value]

    def list(self, acl_filter: AclFilter | None = None) -> list[AclBinding]:
        bindings = read_acls(self.path)
        return sorted(b for b in bindings if acl_filter is None or acl_filter.matches(b))
