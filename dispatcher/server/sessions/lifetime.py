"""A session's clocks as a tenant may ask for them: the server's defaults filled in, never past the
tenant's maximum TTL (``max_session_ttl_seconds``), at create and on renew; that maximum also
bounds the session's whole life (``Lifetime.max_life_seconds``): renewed or paused and resumed,
it never lives longer. The clocks themselves
run in the core (``session_clock.py``, ``lifecycle.py``)."""

from __future__ import annotations

from dispatcher.core.sessions.clock import Lifetime, OnExpire, check_clock, check_ttl
from dispatcher.server.requests.errors import InvalidRequest
from dispatcher.server.tenancy.tenants import Tenant

__all__ = ["check_tenant_ttl", "requested_lifetime"]


def requested_lifetime(
    default: Lifetime, tenant: Tenant, ttl: float | None, idle: float | None, on_expire: OnExpire | None
) -> Lifetime:
    """The clocks asked for, ``default``'s filled in, within the tenant's maximum TTL.

    Raises:
        InvalidRequest: naming the maximum.
    """
    maximum = tenant.max_session_ttl_seconds
    if ttl is None:
        ttl = default.ttl_seconds
        if maximum and (ttl == 0 or ttl > maximum):
            ttl = maximum  # the server's default never exceeds the tenant's maximum
    if idle is not None:
        try:
            check_clock(idle, what="idle_timeout_seconds")
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
    check_tenant_ttl(tenant, ttl)
    return Lifetime(
        ttl,
        default.idle_timeout_seconds if idle is None else idle,
        on_expire or default.on_expire,
        maximum or 0.0,  # the maximum bounds the session's whole life, pauses and renewals included
    )


def check_tenant_ttl(tenant: Tenant, ttl: float) -> None:
    """Refuse a TTL the tenant may not have.

    Raises:
        InvalidRequest: ``ttl`` is above the tenant's maximum (naming it) or not a valid TTL.
    """
    try:
        check_ttl(ttl, tenant.max_session_ttl_seconds)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
