"""The ACL model and store (node.storage.acls) and the workers' decision cache (workers.api.authorizer): Kafka's
authorizer decisions, filters, durable changes under concurrency, and a change seen through the shared counter."""

from __future__ import annotations

import multiprocessing
import os
from types import SimpleNamespace

import pytest

from shmbroker.node.config import AuthorizerConfig
from shmbroker.node.storage.acls import (CLUSTER_NAME, AclBinding, AclError, AclFilter, AclStore, Authorization,
                                         Operation, PatternType, Permission, ResourceType, read_acls)
from shmbroker.shm import generations
from shmbroker.shm.generations import ChangeCounters
from shmbroker.shm.instance import object_name
from tests.shm_testing import unique_instance_id
from shmbroker.workers.api.authorizer import RequestAuthorizer

T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
O = Operation


def acl(rtype=T, name="orders", pattern=LIT, principal="User:alice", host="*", op=O.READ, perm=ALLOW) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def decide(bindings, principal="User:alice", host="10.0.0.1", op=O.READ, rtype=T, name="orders",
           super_users=(), allow_if_none=False) -> bool:
    return Authorization(bindings, super_users, allow_if_none).allows(principal, host, op, rtype, name)


def test_literal_allow_applies_to_its_principal_operation_and_resource_only() -> None:
    bindings = [acl()]
    assert decide(bindings)
    assert not decide(bindings, principal="User:bob")
    assert not decide(bindings, op=O.WRITE)
    assert not decide(bindings, name="orders2")  # a literal is not a prefix


def test_prefixed_wildcard_resource_and_wildcard_principal_match() -> None:
    assert decide([acl(name="ord", pattern=PRE)], name="orders-eu")
    assert not decide([acl(name="ord", pattern=PRE)], name="xorders")
    assert decide([acl(name="*")], name="anything")
    assert decide([acl(principal="User:*")], principal="User:bob")


def test_host_must_match_unless_wildcard() -> None:
    assert decide([acl(host="10.0.0.1")], host="10.0.0.1")
    assert not decide([acl(host="10.0.0.1")], host="10.0.0.2")


def test_deny_wins_over_allow_from_any_matching_pattern() -> None:
    bindings = [acl(op=O.ALL), acl(name="ord", pattern=PRE, op=O.READ, perm=DENY)]
    assert not decide(bindings, op=O.READ)
    assert decide(bindings, op=O.WRITE)
    assert not decide([acl(), acl(principal="User:*", op=O.ALL, perm=DENY)])


def test_implied_operations_are_kafkas() -> None:
    for granting in (O.READ, O.WRITE, O.DELETE, O.ALTER, O.ALL):
        assert decide([acl(op=granting)], op=O.DESCRIBE), granting
    assert not decide([acl(op=O.CREATE)], op=O.DESCRIBE)
    assert decide([acl(op=O.ALTER_CONFIGS)], op=O.DESCRIBE_CONFIGS)
    assert not decide([acl(op=O.DESCRIBE)], op=O.READ)  # nothing implies upwards
    # a DENY of DESCRIBE does not deny READ (Kafka denies only the operation named, or ALL)
    assert decide([acl(op=O.READ), acl(op=O.DESCRIBE, perm=DENY)], op=O.READ)


def test_no_matching_acl_follows_allow_everyone_and_super_users_pass() -> None:
    other = [acl(name="other")]
    assert not decide(other)
    assert decide(other, allow_if_none=True)
    assert not decide([acl(principal="User:bob", perm=DENY)], allow_if_none=True)  # an ACL matched: no default
    assert decide([acl(perm=DENY, op=O.ALL)], super_users=["User:alice"])


def test_allows_any_is_kafkas_authorize_by_resource_type() -> None:
    auth = Authorization([acl(name="ord", pattern=PRE, op=O.WRITE)], (), False)
    assert auth.allows_any("User:alice", "h", O.WRITE, T)
    assert not auth.allows_any("User:bob", "h", O.WRITE, T)
    assert not auth.allows_any("User:alice", "h", O.WRITE, G)
    denied = Authorization([acl(op=O.WRITE), acl(name="*", op=O.WRITE, perm=DENY)], (), False)
    assert not denied.allows_any("User:alice", "h", O.WRITE, T)
    same = Authorization([acl(op=O.WRITE), acl(op=O.WRITE, perm=DENY)], (), False)
    assert not same.allows_any("User:alice", "h", O.WRITE, T)


@pytest.mark.parametrize("binding", [
    acl(pattern=PatternType.MATCH), acl(pattern=PatternType.ANY), acl(op=O.ANY), acl(perm=Permission.ANY),
    acl(rtype=ResourceType.ANY), acl(rtype=G, op=O.WRITE), acl(rtype=C, name="other", op=O.ALTER),
    acl(principal="alice"), acl(name=""), acl(host=""), acl(rtype=X, op=O.READ),
])
def test_bindings_kafka_does_not_store_are_refused(binding: AclBinding, tmp_path) -> None:
    store = AclStore(str(tmp_path))
    with pytest.raises(AclError):
        store.create([acl(name="good"), binding])
    assert store.list() == []  # nothing of a refused request is stored


def test_store_keeps_each_binding_once_durably_and_filters_as_kafka(tmp_path) -> None:
    changes = []
    store = AclStore(str(tmp_path), lambda: changes.append(1))
    cluster = acl(rtype=C, name=CLUSTER_NAME, op=O.ALTER, principal="User:ops")
    store.create([acl(), acl(), acl(name="ord", pattern=PRE), cluster])
    store.create([acl()])  # already there: no write, no change signalled
    assert len(changes) == 1
    assert sorted(read_acls(store.path)) == sorted([acl(), acl(name="ord", pattern=PRE), cluster])
    assert oct(os.stat(store.path).st_mode & 0o777) == "0o600"

    def flt(rtype=ResourceType.ANY, name=None, pattern=PatternType.ANY, principal=None, op=O.ANY, perm=Permission.ANY):
        return AclFilter(rtype, name, pattern, principal, None, op, perm)

    assert len(store.list(flt())) == 3
    assert store.list(flt(rtype=C)) == [cluster]
    # MATCH: every binding that applies to the named resource (its literal and prefixes of it)
    assert sorted(store.list(flt(rtype=T, name="orders", pattern=PatternType.MATCH))) == sorted(
        [acl(), acl(name="ord", pattern=PRE)])
    assert store.list(flt(rtype=T, name="orders", pattern=LIT)) == [acl()]
    removed = store.delete([flt(rtype=T, pattern=PRE), flt(principal="User:nobody")])
    assert removed == [[acl(name="ord", pattern=PRE)], []]
    assert len(changes) == 2
    assert sorted(store.list()) == sorted([acl(), cluster])


def _add_many(data_dir: str, who: int, count: int) -> None:
    store = AclStore(data_dir)
    for i in range(count):
        store.create([acl(name=f"t{who}-{i}")])


def test_concurrent_changes_from_processes_lose_nothing(tmp_path) -> None:
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_add_many, args=(str(tmp_path), who, 15)) for who in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    assert len(AclStore(str(tmp_path)).list()) == 45


class _Conn:
    def __init__(self, principal: str) -> None:
        self.principal = principal
        self.peer = ("127.0.0.1", 5000)
        self.acl_cache = None


def _request(conn: _Conn, api_key: int = 0):
    return SimpleNamespace(conn=conn, header=SimpleNamespace(api_key=api_key))


def test_worker_sees_a_change_through_the_shared_counter_and_drops_its_cached_decisions(tmp_path) -> None:
    name = object_name(unique_instance_id("acl"), "generations")
    counters = ChangeCounters.create(name)
    try:
        config = AuthorizerConfig(enabled=True, super_users=["User:admin"])
        worker = RequestAuthorizer(config, str(tmp_path), ChangeCounters.attach(name))
        denials = [0] * 100
        worker.denials = denials
        writer = AclStore(str(tmp_path), lambda: counters.bump(generations.ACLS))
        alice = _Conn("User:alice")
        assert not worker.allows(_request(alice, 1), O.READ, T, "orders")
        assert denials[1] == 1
        writer.create([acl()])
        assert worker.allows(_request(alice, 1), O.READ, T, "orders")  # at once: the counter moved
        writer.delete([AclFilter(ResourceType.ANY, None, PatternType.ANY, None, None, O.ANY, Permission.ANY)])
        assert not worker.allows(_request(alice, 1), O.READ, T, "orders")
        assert worker.allows(_request(_Conn("User:admin")), O.ALTER, C, CLUSTER_NAME)
        off = RequestAuthorizer(AuthorizerConfig(enabled=False), str(tmp_path), None)
        assert off.allows(_request(alice), O.ALTER, C, CLUSTER_NAME)
        worker.counters.close()
    finally:
        counters.close()
        ChangeCounters.unlink_name(name)


def test_denials_are_counted_per_principal_and_api_up_to_a_bound(tmp_path) -> None:
    from shmbroker.workers.api.authorizer import MAX_PRINCIPALS_COUNTED, OTHER_PRINCIPALS

    worker = RequestAuthorizer(AuthorizerConfig(enabled=True), str(tmp_path), None)
    alice = _Conn("User:alice")
    assert not worker.allows(_request(alice, 0), O.WRITE, T, "orders")
    assert not worker.allows(_request(alice, 0), O.WRITE, T, "orders")
    assert not worker.allows(_request(alice, 1), O.READ, T, "orders")
    assert worker.permits(_request(alice, 3), O.DESCRIBE, T, "orders") is False  # a listing's filter: not counted
    assert worker.denials_by_principal == {"User:alice": {0: 2, 1: 1}} and worker.denials_counted == 3
    for number in range(MAX_PRINCIPALS_COUNTED + 10):
        assert not worker.allows(_request(_Conn(f"User:u{number}"), 0), O.WRITE, T, "orders")
    assert len(worker.denials_by_principal) == MAX_PRINCIPALS_COUNTED + 1
    assert worker.denials_by_principal[OTHER_PRINCIPALS] == {0: 11}  # alice took one of the named places
    assert worker.denials_by_principal["User:alice"] == {0: 2, 1: 1}


def test_the_produce_check_of_written_topics_follows_changes_and_the_principal_at_once(tmp_path) -> None:
    """topics_not_writable answers from the connection's set of writable topics; an ACL change (the shared
    counter) or another principal on the connection (a re-authentication) must not be answered from it."""
    name = object_name(unique_instance_id("acl"), "generations")
    counters = ChangeCounters.create(name)
    try:
        worker = RequestAuthorizer(AuthorizerConfig(enabled=True), str(tmp_path), ChangeCounters.attach(name))
        worker.denials = [0] * 100
        writer = AclStore(str(tmp_path), lambda: counters.bump(generations.ACLS))
        writer.create([acl(op=O.WRITE)])
        alice = _Conn("User:alice")
        orders, pay = SimpleNamespace(name="orders"), SimpleNamespace(name="pay")
        for _ in range(2):  # the decision, then the connection's set
            assert worker.topics_not_writable(_request(alice), [orders]) == frozenset()
        assert worker.topics_not_writable(_request(alice), [orders, pay]) == {"pay"}
        assert worker.denials[0] == 1
        writer.delete([AclFilter(T, "orders", LIT, None, None, O.ANY, Permission.ANY)])
        assert worker.topics_not_writable(_request(alice), [orders]) == {"orders"}  # at once
        writer.create([acl(op=O.WRITE)])
        assert worker.topics_not_writable(_request(alice), [orders]) == frozenset()
        alice.principal = "User:bob"
        assert worker.topics_not_writable(_request(alice), [orders]) == {"orders"}
        worker.counters.close()
    finally:
        counters.close()
        ChangeCounters.unlink_name(name)
