"""Client quotas as the API describes them: DescribeClientQuotas, answered from the node's `[quotas]` config.

The node's quotas are its config (node.config.QuotaConfig, reloaded on SIGHUP): byte rates per client id and a
default for every other client id, Kafka's entity types "client-id" (a name, or the default: no name) only. So the
entities are `{client-id: NAME}` for each `[quotas.clients."NAME"]` and `{client-id: default}` for
`[quotas.default]`, each with its non-zero `producer_byte_rate` and `consumer_byte_rate`; an entity whose rates are
all zero (unlimited) has no quota and is not listed, as Kafka lists only entities with a value.

A filter's components match as Kafka's ClientQuotaFilter: EXACT a name, DEFAULT the default entity, SPECIFIED any
named entity (not the default); a component of another entity type (user, ip) matches nothing here. Strict: an
entity's types must be exactly the components'; else it must have at least those. DESCRIBE_CONFIGS on the cluster
is needed (else CLUSTER_AUTHORIZATION_FAILED).

AlterClientQuotas is not served (quotas change in the config file and a SIGHUP): ApiVersions does not list it, so
Kafka's admin client says the node does not support it.
"""

from __future__ import annotations

from typing import Any, Callable

from kio.static.primitive import f64

from shmbroker.node.config import NodeConfig, QuotaLimits
from shmbroker.node.storage.acls import CLUSTER_NAME, Operation, ResourceType
from shmbroker.workers.api.authorizer import RequestAuthorizer
from shmbroker.workers.api.responses import ZERO_THROTTLE, entity, reply
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.outcome import Outcome

CLIENT_ID = "client-id"
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
RATE_KEYS = ("producer_byte_rate", "consumer_byte_rate")


class ClientQuotaHandlers:
    def __init__(self, config: Callable[[], NodeConfig], authorizer: RequestAuthorizer | None = None) -> None:
        self.config = config  # the current config (quotas reload on SIGHUP)
        self.authorizer = authorizer or RequestAuthorizer.open_to_all()

    def table(self) -> dict[int, Callable[[Request, Any], Outcome]]:
        return {P.DESCRIBE_CLIENT_QUOTAS: self.describe_client_quotas}

    def describe_client_quotas(self, req: Request, request: Any) -> Outcome:
        if not self.authorizer.allows(req, Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
            return reply(req, entity(req, "DescribeClientQuotasResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=E.CLUSTER_AUTHORIZATION_FAILED, error_message=None, entries=None))
        quotas = self.config().quotas
        entries = []
        for name, limits in [(None, quotas.default), *sorted(quotas.clients.items())]:
            values = _values(limits)
            if values and _matches(request.components, request.strict, name):
                entries.append(entity(req, "EntryData", entity=(
                    entity(req, "EntityData", entity_type=CLIENT_ID, entity_name=name),), values=tuple(
                    entity(req, "ValueData", key=key, value=f64(value)) for key, value in values)))
        return reply(req, entity(req, "DescribeClientQuotasResponse", throttle_time=ZERO_THROTTLE, error_code=E.NONE,
                                 error_message=None, entries=tuple(entries)))


def _values(limits: QuotaLimits) -> list[tuple[str, float]]:
    return [(key, float(getattr(limits, key))) for key in RATE_KEYS if getattr(limits, key)]


def _matches(components: Any, strict: bool, name: str | None) -> bool:
    """Whether the entity {client-id: name} (None: the default) passes a filter."""
    if strict and any(component.entity_type != CLIENT_ID for component in components):
        return False
    for component in components:
        if component.entity_type != CLIENT_ID:
            return False  # this entity has no component of that type
        match_type = int(component.match_type)
        if match_type == MATCH_EXACT and component.match != name:
            return False
        if match_type == MATCH_DEFAULT and name is not None:
            return False
        if match_type == MATCH_SPECIFIED and name is None:
            return False
    return not strict or bool(components)
