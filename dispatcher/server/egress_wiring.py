"""The egress gateway of a server, wired to the rest of it: each tenant's egress and confirmation
policy, the dispatcher's audit log, the metrics, and the server's own listening ports (which a
sandbox may never reach through the proxy)."""

from __future__ import annotations

from collections.abc import Callable

from dispatcher.config.load import Config
from dispatcher.core.approval.confirmation_policy import ConfirmationPolicy
from dispatcher.core.audit import AuditSink
from dispatcher.egress.networks import OwnEndpoints
from dispatcher.egress.policy import EgressPolicy
from dispatcher.egress.record import NO_OBSERVER as NO_EGRESS_OBSERVER
from dispatcher.server.observability.setup import Observability
from dispatcher.server.sessions.egress import EgressGateway
from dispatcher.server.tenancy.tenants import TenantDirectory

__all__ = ["egress_gateway"]


def egress_gateway(
    config: Config,
    audit: AuditSink | None,
    tenants: TenantDirectory,
    observability: Observability,
    *,
    bound_port: Callable[[], int],
) -> EgressGateway:
    """The egress proxy of a server: its tenants' policies, the audit log its dispatcher writes too
    (None: none), its metrics, and its own bound ports (never a destination; ``bound_port``: the
    gRPC port, known once the server binds)."""

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
        audit=audit,
        observer=metrics if metrics is not None else NO_EGRESS_OBSERVER,
    )


def _with_port(listen: str, port: int) -> str:
    """``HOST:PORT`` with the port actually bound (a configured 0 is known only once bound)."""
    host, _, configured = listen.rpartition(":")
    return f"{host}:{port or configured}"
