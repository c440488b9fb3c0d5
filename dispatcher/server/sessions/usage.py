"""What each session uses (``GetSessionUsage``), and every tenant's sessions summed for the metrics.

The sandbox backend measures a session's container and workspace (``SandboxProvider.usage``); the
server's egress proxy adds what it relayed for it. The metrics carry per-tenant sums only: a series
per session would grow without bound as sessions come and go.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from dispatcher.core.provider_api import SandboxProvider, SessionUsage, UsageUnsupported
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.server.requests.errors import FailedPrecondition, SandboxUnavailable
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.tenancy.tenants import Tenant

__all__ = ["TenantUsage", "UsageReader"]

log = logging.getLogger("dispatcher.server.sessions.usage")

SAMPLE_SECONDS = 15.0
"""How often the metrics' per-tenant sums are measured (a sample costs about a second per few
sessions of the daemon's time, so not at every scrape)."""

SAMPLE_CONCURRENCY = 2
"""Sessions measured at once by a metrics sample: each holds one of the Docker client's threads for
about a second, and launches need those threads too."""


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """One tenant's sessions summed (the metrics' per-tenant gauges)."""

    cpu_percent: float = 0.0
    memory_bytes: int = 0
    disk_bytes: int = 0
    pids: int = 0
    sessions: int = 0

    def plus(self, used: SessionUsage) -> TenantUsage:
        return TenantUsage(
            self.cpu_percent + used.cpu_percent,
            self.memory_bytes + used.memory_bytes,
            self.disk_bytes + used.disk_bytes,
            self.pids + used.pids,
            self.sessions + 1,
        )


class UsageReader:
    """Answers ``GetSessionUsage`` and samples every session for the metrics."""

    def __init__(
        self,
        sessions: SessionManager,
        provider: SandboxProvider,
        traffic: Callable[[str], tuple[int, int]] = lambda _sid: (0, 0),
    ) -> None:
        """``traffic``: a session id's bytes sent and received through the egress proxy."""
        self._sessions = sessions
        self._provider = provider
        self._traffic = traffic

    async def usage(self, tenant: Tenant, session_id: str) -> SessionUsage:
        """The tenant's session's usage now (asking does not count as its activity).

        Raises:
            UnknownSessionError: no such session of this tenant.
            FailedPrecondition: the sandbox backend measures no usage (the message says why).
            SandboxUnavailable: the backend did not answer.
        """
        state = self._sessions.get(tenant, session_id, touch=False)
        return await self._measure(state.session)

    async def _measure(self, session: Session) -> SessionUsage:
        try:
            used = await self._provider.usage(session)
        except UsageUnsupported as exc:
            raise FailedPrecondition(str(exc)) from exc
        except SandboxError as exc:
            raise SandboxUnavailable(f"the session's usage could not be read: {exc}; retry") from exc
        sent, received = self._traffic(session.session_id)
        return dataclasses.replace(used, egress_bytes_sent=sent, egress_bytes_received=received)

    async def by_tenant(self) -> Mapping[str, TenantUsage]:
        """Every open session measured (a few at a time) and summed per tenant; a session whose
        usage cannot be read is left out (logged)."""
        gate = asyncio.Semaphore(SAMPLE_CONCURRENCY)
        states = list(self._sessions.registry)
        totals: dict[str, TenantUsage] = {}

        async def one(session: Session) -> None:
            async with gate:
                try:
                    used = await self._measure(session)
                except (FailedPrecondition, SandboxUnavailable) as exc:
                    log.debug("usage of session %s not sampled: %s", session.session_id, exc)
                    return
            totals[session.tenant_id] = totals.get(session.tenant_id, TenantUsage()).plus(used)

        await asyncio.gather(*(one(s.session) for s in states), return_exceptions=True)
        return totals

    async def sample_forever(
        self,
        tenants: Iterable[str],
        report: Callable[[str, TenantUsage], None],
        interval: float = SAMPLE_SECONDS,
    ) -> None:
        """Every ``interval``: every tenant of ``tenants`` summed and reported (zeros for one with
        no session), until cancelled; a failed sample is logged and the next one comes."""
        names = tuple(tenants)
        while True:
            try:
                totals = await self.by_tenant()
            except Exception as exc:  # one failed sample must not stop the sampler
                log.warning("sampling sessions' usage failed: %s", exc)
                totals = None
            if totals is not None:
                for tenant in names:
                    report(tenant, totals.get(tenant, TenantUsage()))
            await asyncio.sleep(interval)
