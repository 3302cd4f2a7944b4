"""The workers' side of the authorizer: may this connection's principal, from its host, do this operation on this
resource? Answered from a copy of the ACLs (node.storage.acls.Authorization) and a per-connection cache.

Invariants:
- Off (`[authorizer] enabled = false`), every check is allowed and costs one attribute test.
- The copy is current as of the ACL change counter in shared memory (shm.generations.ACLS): every check compares
  the counter with the value the copy was loaded at, and reloads the file when it moved. A CreateAcls or
  DeleteAcls answered by any worker raises the counter after its change is durable, so a request read after
  that answer is checked against the new ACLs in every worker; there is no ring round trip per request.
- A connection's cache maps (operation, resource type, name) to the decision for its principal and host, and keeps
  the topics it may WRITE as a set of names (what every Produce asks: `topics_not_writable` tests the names alone);
  it is dropped when the copy is reloaded (the copy's epoch) or the principal changes, and bounded (cleared when
  full).
- A refusal counts in `authorization_denials` per API key and in `denials_by_principal` per principal and API key
  (at most MAX_PRINCIPALS_COUNTED principals by name, the rest under OTHER_PRINCIPALS), with one rate-limited log
  line naming the principal; `permits` decides the same without counting (Kafka's checks that filter a listing,
  logIfDenied = false).
- `operations` is KIP-430's bitfield of the operations the resource type supports that the principal may do:
  every supported one when the authorizer is off (what Kafka reports without an authorizer).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable

from shmbroker.node.config import AuthorizerConfig
from shmbroker.node.storage.acls import (CLUSTER_NAME, OPERATIONS_OF, Authorization, Operation, ResourceType, acls_path,
                                         read_acls)
from shmbroker.shm import generations
from shmbroker.shm.generations import ChangeCounters
from shmbroker.workers.api.responses import NOT_REQUESTED
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.connection import Request

log = logging.getLogger("shmbroker.authorizer")

DENIAL_LOG_INTERVAL_S = 10.0  # at most one "denied" log line per principal this often
# Principals counted by name per worker (bounded: a client picks its user name); later ones count together.
MAX_PRINCIPALS_COUNTED = 256
OTHER_PRINCIPALS = "(others)"
NOTHING_DENIED: frozenset[str] = frozenset()
_ACLS = generations.ACLS  # read on every check: a module constant, not an attribute lookup
# The operations KIP-430's authorized operations report per resource type (Kafka's supported operations: ALL aside).
SUPPORTED_OPERATIONS = {rtype: tuple(sorted(op for op in ops if op != Operation.ALL))
                        for rtype, ops in OPERATIONS_OF.items()}


class RequestAuthorizer:
    def __init__(self, config: AuthorizerConfig, data_dir: str, counters: ChangeCounters | None) -> None:
        self.enabled = config.enabled
        self.config = config
        self.path = acls_path(data_dir)
        self.counters = counters
        self._counter = counters.view if counters is not None else None  # the shared words, read per check
        self.cache_entries = config.cache_entries_per_connection
        self.denials: list[int] | None = None  # the worker's stats counts (+ api key), when it keeps stats
        self.denials_offset = 0
        self.denials_by_principal: dict[str, dict[int, int]] = {}  # principal -> api key -> refusals
        self.denials_counted = 0  # refusals so far: publishers compare it to see whether the dict moved
        self._loaded_at = -1  # the change counter the copy was loaded at
        self._epoch = 0  # raised on every reload: connections' caches of another epoch are stale
        self._authorization = Authorization((), config.super_users, config.allow_everyone_if_no_acl_found)
        self._logged: dict[str, float] = {}

    @classmethod
    def open_to_all(cls) -> "RequestAuthorizer":
        """An authorizer that is off (handlers built without one)."""
        return cls(AuthorizerConfig(), "", None)

    def reconfigure(self, config: AuthorizerConfig) -> None:
        """A reloaded config: super users and the no-ACL default take effect now."""
        self.enabled = config.enabled
        self.config = config
        self.cache_entries = config.cache_entries_per_connection
        self._loaded_at = -1

    def authorization(self) -> Authorization:
        """The decisions from the current ACLs (reloaded when the change counter moved)."""
        counter = self._counter[_ACLS] if self._counter is not None else 0
        if counter != self._loaded_at:
            try:
                bindings = read_acls(self.path)
            except (OSError, ValueError, KeyError) as exc:
                log.error("cannot read %s: %s (keeping the ACLs read before)", self.path, exc)
                bindings = None
            if bindings is not None:
                self._authorization = Authorization(bindings, self.config.super_users,
                                                    self.config.allow_everyone_if_no_acl_found)
            self._loaded_at = counter
            self._epoch += 1
        return self._authorization

    def allows(self, req: Request, operation: Operation, resource_type: ResourceType, name: str,
               count_denial: bool = True) -> bool:
        """count_denial False: a refusal the API expects and answers otherwise (Kafka's logIfDenied = false, e.g.
        CREATE on the cluster before CREATE on the topic, or a listing's filter) is neither counted nor logged."""
        if not self.enabled:
            return True
        # The hot path, written out (a Produce checks each topic): the copy current, the connection's cache hit.
        conn = req.conn
        cache = conn.acl_cache
        if (cache is not None and cache[0] == self._epoch and cache[1] == conn.principal
                and (self._counter is None or self._counter[_ACLS] == self._loaded_at)):
            allowed = cache[2].get((operation, resource_type, name))
            if allowed is None:
                allowed = self._decide(req, operation, resource_type, name)
        else:
            allowed = self._decide(req, operation, resource_type, name)
        if not allowed and count_denial:
            self._denied(req, req.conn.principal or "", operation, resource_type, name)
        return allowed

    def topics_not_writable(self, req: Request, topics: Iterable[Any]) -> frozenset[str]:
        """The names of `topics` (items with a `name`) the principal may not WRITE: empty when it may write all.
        A Produce asks this for every request, so its hit is a set test per topic and one counter read."""
        conn = req.conn
        cache = conn.acl_cache
        if (cache is not None and cache[0] == self._epoch and cache[1] == conn.principal
                and (self._counter is None or self._counter[_ACLS] == self._loaded_at)):
            writable = cache[3]
            for topic in topics:
                if topic.name not in writable:
                    break
            else:
                return NOTHING_DENIED
        denied = NOTHING_DENIED
        for topic in topics:
            if not self.allows(req, Operation.WRITE, ResourceType.TOPIC, topic.name):
                denied = denied | {topic.name}
        return denied

    def permits(self, req: Request, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        """`allows` without counting or logging a refusal."""
        return self.allows(req, operation, resource_type, name, count_denial=False)

    def operations(self, req: Request, resource_type: ResourceType, name: str) -> int:
        """KIP-430's authorized operations of a resource: the bitfield (1 << AclOperation code) of the operations
        its type has that the principal may do on it; with the authorizer off, all of them (Kafka without one)."""
        supported = SUPPORTED_OPERATIONS[resource_type]
        if not self.enabled:
            return sum(1 << op for op in supported)
        return sum(1 << op for op in supported if self._decide(req, op, resource_type, name))

    def split(self, req: Request, operation: Operation, resource_type: ResourceType,
              names: list[str]) -> tuple[list[str], list[str]]:
        """(the names the principal may `operation`, the others), each in the order given; with the authorizer
        off, every name allowed."""
        if not self.enabled:
            return names, []
        allowed, refused = [], []
        for name in names:
            (allowed if self.allows(req, operation, resource_type, name) else refused).append(name)
        return allowed, refused

    def group_operations(self, req: Request, request: Any) -> Callable[[int, str], int]:
        """operations(error, group): the authorized_operations a describe answers for a group (KIP-430),
        NOT_REQUESTED unless the request asks (include_authorized_operations) and the group has no error."""
        requested = getattr(request, "include_authorized_operations", False)

        def operations(error: int, group: str) -> int:
            if not requested or error != E.NONE:
                return NOT_REQUESTED
            return self.operations(req, ResourceType.GROUP, group)
        return operations

    def cluster_operations(self, req: Request, requested: bool) -> int:
        """The cluster_authorized_operations of Metadata v8-10 and DescribeCluster: NOT_REQUESTED unless asked;
        as Kafka, 0 for a principal that may not DESCRIBE the cluster."""
        if not requested:
            return NOT_REQUESTED
        if not self.permits(req, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return 0
        return self.operations(req, ResourceType.CLUSTER, CLUSTER_NAME)

    def _decide(self, req: Request, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        authorization = self.authorization()
        conn = req.conn
        principal = conn.principal or ""
        cache = conn.acl_cache
        if cache is None or cache[0] != self._epoch or cache[1] != principal or len(cache[2]) >= self.cache_entries:
            cache = conn.acl_cache = (self._epoch, principal, {}, set())
        decisions = cache[2]
        key = (operation, resource_type, name)
        allowed = decisions.get(key)
        if allowed is None:
            allowed = decisions[key] = authorization.allows(principal, _host(conn), operation, resource_type, name)
            if allowed and operation == Operation.WRITE and resource_type == ResourceType.TOPIC:
                cache[3].add(name)
        return allowed

    def allows_any(self, req: Request, operation: Operation, resource_type: ResourceType) -> bool:
        """May the principal do `operation` on some resource of the type (Kafka's authorizeByResourceType)."""
        if not self.enabled:
            return True
        return self.authorization().allows_any(req.conn.principal or "", _host(req.conn), operation, resource_type)

    def _denied(self, req: Request, principal: str, operation: Operation, resource_type: ResourceType,
                name: str) -> None:
        api_key = req.header.api_key
        if self.denials is not None:
            self.denials[self.denials_offset + api_key] += 1
        by_principal = self.denials_by_principal
        counts = by_principal.get(principal)
        if counts is None:
            counts = by_principal.setdefault(principal if len(by_principal) < MAX_PRINCIPALS_COUNTED
                                             else OTHER_PRINCIPALS, {})
        counts[api_key] = counts.get(api_key, 0) + 1
        self.denials_counted += 1
        now = time.monotonic()
        if now >= self._logged.get(principal, 0.0):
            if len(self._logged) > 1024:
                self._logged.clear()
            self._logged[principal] = now + DENIAL_LOG_INTERVAL_S
            log.info("denied %s %s on %s %r from %s (api %d; further denials of this principal are counted, "
                     "logged again in %.0f s)", principal, operation.name, resource_type.name, name, _host(req.conn),
                     req.header.api_key, DENIAL_LOG_INTERVAL_S)


def _host(conn) -> str:
    peer = conn.peer
    return peer[0] if isinstance(peer, tuple) and peer else "*"
