"""CreateAcls, DescribeAcls and DeleteAcls, answered by the worker against the node's ACL store
(node.storage.acls), whatever the authorizer's setting (Kafka keeps ACLs only with an authorizer; this node keeps
them always, so they can be set up before the authorizer is turned on).

Invariants:
- CreateAcls and DeleteAcls need ALTER on the cluster, DescribeAcls DESCRIBE on it (CLUSTER_AUTHORIZATION_FAILED
  for every creation or filter otherwise, as Kafka).
- A creation with a field Kafka does not store (ANY, MATCH, UNKNOWN, an operation its resource type lacks) gets
  INVALID_REQUEST and is not stored; the others of the request are. A change is durable, and every worker sees
  it, before its answer is written (node.storage.acls.AclStore raises the shared change counter).
- A storage fault answers KAFKA_STORAGE_ERROR with its message; nothing half-written is seen.
- v0 requests have no pattern type: LITERAL in creations, and LITERAL in filters (Kafka's v0 semantics).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from kio.static.primitive import i8

from shmbroker.node.storage.acls import (CLUSTER_NAME, AclBinding, AclError, AclFilter, AclStore, Operation,
                                         PatternType, Permission, ResourceType)
from shmbroker.node.storage.faults import storage_faults
from shmbroker.node.storage.records import StorageError
from shmbroker.node.storage.store import PartitionStore
from shmbroker.shm import generations
from shmbroker.workers.api.authorizer import RequestAuthorizer
from shmbroker.workers.api.responses import ZERO_THROTTLE, code, entity, reply
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.outcome import Outcome

log = logging.getLogger("shmbroker.acls")


def _enum(kind: type, value: Any) -> Any:
    try:
        return kind(int(value))
    except ValueError:
        return kind(0)  # UNKNOWN: refused by validation, matches nothing in a filter


def _filter(request_filter: Any) -> AclFilter:
    pattern = getattr(request_filter, "pattern_type_filter", None)
    return AclFilter(_enum(ResourceType, request_filter.resource_type_filter), request_filter.resource_name_filter,
                     PatternType.LITERAL if pattern is None else _enum(PatternType, pattern),
                     request_filter.principal_filter, request_filter.host_filter,
                     _enum(Operation, request_filter.operation), _enum(Permission, request_filter.permission_type))


class AclHandlers:
    def __init__(self, partitions: PartitionStore, authorizer: RequestAuthorizer) -> None:
        self.authorizer = authorizer
        counters = authorizer.counters
        self.store = AclStore(partitions.data_dir,
                              None if counters is None else lambda: counters.bump(generations.ACLS))

    def table(self) -> dict[int, Callable[[Request, Any], Outcome]]:
        return {P.CREATE_ACLS: self.create_acls, P.DESCRIBE_ACLS: self.describe_acls, P.DELETE_ACLS: self.delete_acls}

    def _cluster_allows(self, req: Request, operation: Operation) -> bool:
        return self.authorizer.allows(req, operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def create_acls(self, req: Request, request: Any) -> Outcome:
        def result(error: E.ErrorCode, message: str | None = None) -> Any:
            return entity(req, "AclCreationResult", error_code=error, error_message=message)

        if not self._cluster_allows(req, Operation.ALTER):
            return reply(req, entity(req, "CreateAclsResponse", throttle_time=ZERO_THROTTLE, results=tuple(
                result(E.CLUSTER_AUTHORIZATION_FAILED) for _ in request.creations)))
        results: list[Any] = []
        valid: list[AclBinding] = []
        for creation in request.creations:
            pattern = getattr(creation, "resource_pattern_type", None)
            binding = AclBinding(_enum(ResourceType, creation.resource_type), creation.resource_name,
                                 PatternType.LITERAL if pattern is None else _enum(PatternType, pattern),
                                 creation.principal, creation.host, _enum(Operation, creation.operation),
                                 _enum(Permission, creation.permission_type))
            try:
                binding.validate()
            except AclError as exc:
                results.append(result(E.INVALID_REQUEST, str(exc)))
                continue
            valid.append(binding)
            results.append(None)
        if valid:
            try:
                with storage_faults("the ACL store"):
                    self.store.create(valid)
            except StorageError as exc:
                failed = result(code(exc.error_code), str(exc))
                results = [failed if r is None else r for r in results]
        results = [result(E.NONE) if r is None else r for r in results]
        return reply(req, entity(req, "CreateAclsResponse", throttle_time=ZERO_THROTTLE, results=tuple(results)))

    def describe_acls(self, req: Request, request: Any) -> Outcome:
        def response(error: E.ErrorCode, message: str | None, resources: tuple) -> Outcome:
            return reply(req, entity(req, "DescribeAclsResponse", throttle_time=ZERO_THROTTLE, error_code=error,
                                     error_message=message, resources=resources))

        if not self._cluster_allows(req, Operation.DESCRIBE):
            return response(E.CLUSTER_AUTHORIZATION_FAILED, None, ())
        try:
            with storage_faults("the ACL store"):
                bindings = self.store.list(_filter(request))
        except StorageError as exc:
            return response(code(exc.error_code), str(exc), ())
        except ValueError as exc:  # an unreadable file
            return response(E.UNKNOWN_SERVER_ERROR, f"the ACL store cannot be read: {exc}", ())
        return response(E.NONE, None, self._resources(req, bindings))

    def _resources(self, req: Request, bindings: list[AclBinding]) -> tuple:
        by_resource: dict[tuple, list[AclBinding]] = {}
        for binding in bindings:
            by_resource.setdefault((binding.resource_type, binding.resource_name, binding.pattern_type),
                                   []).append(binding)
        return tuple(entity(req, "DescribeAclsResource", resource_type=i8(rtype), resource_name=name,
                            pattern_type=i8(pattern), acls=tuple(
                                entity(req, "AclDescription", principal=b.principal, host=b.host,
                                       operation=i8(b.operation), permission_type=i8(b.permission))
                                for b in group))
                     for (rtype, name, pattern), group in by_resource.items())

    def delete_acls(self, req: Request, request: Any) -> Outcome:
        def filter_result(error: E.ErrorCode, message: str | None, matching: tuple = ()) -> Any:
            return entity(req, "DeleteAclsFilterResult", error_code=error, error_message=message,
                          matching_acls=matching)

        if not self._cluster_allows(req, Operation.ALTER):
            return reply(req, entity(req, "DeleteAclsResponse", throttle_time=ZERO_THROTTLE, filter_results=tuple(
                filter_result(E.CLUSTER_AUTHORIZATION_FAILED, None) for _ in request.filters)))
        filters = [_filter(f) for f in request.filters]
        try:
            with storage_faults("the ACL store"):
                removed = self.store.delete(filters)
        except StorageError as exc:
            failed = filter_result(code(exc.error_code), str(exc))
            return reply(req, entity(req, "DeleteAclsResponse", throttle_time=ZERO_THROTTLE,
                                     filter_results=tuple(failed for _ in filters)))
        return reply(req, entity(req, "DeleteAclsResponse", throttle_time=ZERO_THROTTLE, filter_results=tuple(
            filter_result(E.NONE, None, tuple(
                entity(req, "DeleteAclsMatchingAcl", error_code=E.NONE, error_message=None,
                       resource_type=i8(b.resource_type), resource_name=b.resource_name, pattern_type=i8(b.pattern_type),
                       principal=b.principal, host=b.host, operation=i8(b.operation),
                       permission_type=i8(b.permission)) for b in matched))
            for matched in removed)))
