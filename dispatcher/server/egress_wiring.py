"""The egress gateway of a server, wired to the rest of it: each tenant's egress and confirmation
policy, the dispatcher's audit log, the metrics, and the server's own listening ports (which a
sandbox may never reach through the proxy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dispatcher.config.load import Config
from dispatcher.core.approval.confirmation_policy import ConfirmationPolicy
from dispatcher.core.dispatcher import ToolDispatcher
from dispatcher.egress.networks import OwnEndpoints
from dispatcher.egress.policy import EgressPolicy
from dispatcher.egress.record import NO_OBSERVER as NO_EGRESS_OBSERVER
from dispatcher.server.observability.setup import Observability
from dispatcher.server.sessions.egress import EgressGateway
from dispatcher.server.tenancy.tenants import TenantDirectory

__all__ = ["egress_gateway"]


class _AuditOf:
    """The dispatcher's audit log as the egress proxy records into it."""

    def __init__(self, dispatcher: ToolDispatcher) -> None:
        self._dispatcher = dispatcher

    def record(self, kind: str, **fields: Any) -> None:
        self._dispatcher.audit_record(kind, **fields)


def egress_gateway(
    config: Config,
    dispatcher: ToolDispatcher,
    tenants: TenantDirectory,
    observability: Observability,
    *,
    bound_port: Callable[[], int],
) -> EgressGateway:
    """The egress proxy of a server: its tenants' policies, its audit log and metrics, and its own
    bound ports (never a destination; ``bound_port``: the gRPC port, known once the server binds)."""

    def tenant(tenant_id: str) -> tuple[EgressPolicy, ConfirmationPolicy]:
        try:
            t = tenants.get(tenant_id)
        except KeyError:
            # A server-internal session (an MCP server's discovery sandbox) belongs to no configured
            # tenant: it gets the closed default, no host and no CA bundle.
            return EgressPolicy(), config.policy
        return t.egress, t.policy

    def own() -> OwnEndpoints:
        listens = [_with_port(config.listen, bound_port())]
        metrics = config.observe.metrics_listen
        if metrics is not None:
            listens.append(_with_port(metrics, observability.metrics_port))
        return OwnEndpoints.of(listens)

    metrics = observability.metrics
    return EgressGateway(
        tenant,
        default_policy=config.policy,
        confirmation_timeout=config.dispatcher.confirmation_timeout,
        own=own,
        audit=_AuditOf(dispatcher),
        observer=metrics if metrics is not None else NO_EGRESS_OBSERVER,
    )


def _with_port(listen: str, port: int) -> str:
    """``HOST:PORT`` with the port actually bound (a configured 0 is known only once bound)."""
    host, _, configured = listen.rpartition(":")
    return f"{host}:{port or configured}"
