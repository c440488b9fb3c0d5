"""ConnectPort: one raw TCP connection from a client to ``127.0.0.1:PORT`` in a session's sandbox,
through ``Sandbox.connect_port`` (the agent's channel; nothing of the sandbox is published).

Only ever the port of that session's sandbox: the request names a port (1-65535), never a host,
and the agent connects to its own loopback. Tenancy as for every session RPC: another tenant's
session does not exist.

Flow control end to end: the client's bytes go to the sandbox one message at a time, the next
read from the client only once the sandbox's window took the last (a sandbox that does not read
stops the client's stream, gRPC's own window then holds the client); the sandbox's bytes go out one
chunk at a time, the next read only once gRPC took the last. So a connection buffers a window
each way in the server, whatever either end does.

Bounds: the tenant's ``max_port_connections`` and the session's
``max_port_connections_per_session``; a connection with no byte either way for ``IDLE_SECONDS``
is closed; the server's drain and the session's end (close, expiry) close it. It holds the
session busy while open (a paused session is resumed first), as a transfer does. One audit record
per connection, at its end, with what it carried (counts, never bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from dispatcher.core.events.bus import Event
from dispatcher.core.sandbox_api import PortStream, SandboxError, check_port
from dispatcher.server.requests.errors import SandboxUnavailable
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.tenancy.tenants import Tenant

__all__ = ["AUDIT_CONNECT", "CLOSE_WRITE", "Connected", "PortObserver", "connect_port"]

log = logging.getLogger("dispatcher.server.sessions.ports")

IDLE_SECONDS = 600.0
"""A connection with no byte either way for this long is closed (a forgotten forward holds its
session busy and a connection slot)."""
READ_CHUNK = 256 * 1024
"""The largest ``data`` message sent to the client (a tunnel frame's worth)."""
AUDIT_CONNECT = "port.connect"
"""Audit record of a ConnectPort, written at its end: the port, the outcome, the byte counts."""

CLOSE_WRITE = None
"""What the client's stream yields for its half-close."""
Connected = Literal["connected"]
Eof = Literal["eof"]


class PortObserver(Protocol):
    """What the metrics are told (labels: configured tenants, closed sets)."""

    def port_connection(self, tenant: str, outcome: str) -> None:
        """A connection ended (``closed``, ``idle``, ``refused``, ``failed``)."""

    def port_bytes(self, tenant: str, direction: str, count: int) -> None:
        """``in``: to the sandbox, ``out``: from it."""


@dataclass
class _Tally:
    to_sandbox: int = 0
    from_sandbox: int = 0
    last: float = 0.0  # monotonic time of the last byte either way

    def moved(self) -> None:
        self.last = time.monotonic()


async def connect_port(
    sessions: SessionManager,
    tenant: Tenant,
    session_id: str,
    port: int,
    incoming: AsyncIterator[bytes | None],
    observer: PortObserver | None = None,
) -> AsyncIterator[Connected | Eof | bytes]:
    """ConnectPort after its first message: ``connected``, then the sandbox's bytes, then ``eof``
    once its side half-closed; ends once both sides did (or on idle, drain, the session's end).
    ``incoming``: the client's later messages, bytes or ``CLOSE_WRITE``.

    Raises:
        UnknownSessionError, QuotaExceeded, ShuttingDown.
        PortError: ``bad_port``, ``refused`` (nothing listens), ``unsupported``, ``too_many``.
        SandboxUnavailable: the sandbox failed while connecting.
    """
    state = sessions.get(tenant, session_id)
    check_port(port)
    tally = _Tally()
    outcome = "failed"
    bus = sessions.dispatcher.events(session_id)
    try:
        with sessions.admission.port_slot(tenant, session_id) as stop:
            async with (
                sessions.lifecycle.hold(state),
                bus.subscribe(event_filter=_no_event) as session_events,  # ends when the session does
            ):
                sandbox = sessions.dispatcher.sandbox_for(state.session)
                try:
                    stream = await sandbox.connect_port(port)
                except SandboxError as exc:
                    raise SandboxUnavailable(f"the session's sandbox failed: {exc}; try again") from exc
                except Exception:
                    outcome = "refused"
                    raise
                try:
                    tally.moved()
                    yield "connected"
                    ends = (
                        asyncio.ensure_future(stop.wait()),
                        asyncio.ensure_future(anext(session_events, None)),
                    )
                    try:
                        async for item in _carry(stream, incoming, tally, ends):
                            if isinstance(item, bytes) and observer is not None:
                                observer.port_bytes(tenant.tenant_id, "out", len(item))
                            yield item
                        outcome = "idle" if tally.last == 0.0 else "closed"
                    finally:
                        for end in ends:
                            end.cancel()
                finally:
                    await stream.close()
    finally:
        if observer is not None:
            observer.port_connection(tenant.tenant_id, outcome)
            if tally.to_sandbox:
                observer.port_bytes(tenant.tenant_id, "in", tally.to_sandbox)
        sessions.dispatcher.audit_record(
            AUDIT_CONNECT,
            tenant=tenant.tenant_id,
            session=session_id,
            port=port,
            outcome=outcome,
            bytes_to_sandbox=tally.to_sandbox,
            bytes_from_sandbox=tally.from_sandbox,
        )


async def _carry(
    stream: PortStream,
    incoming: AsyncIterator[bytes | None],
    tally: _Tally,
    ends: tuple[asyncio.Future[Any], ...],
) -> AsyncIterator[Eof | bytes]:
    """The sandbox's bytes (then ``eof``) while the client's go the other way; returns once both
    sides half-closed, or on idle (``tally.last`` then 0) or one of ``ends``."""
    pump = asyncio.ensure_future(_pump(stream, incoming, tally))
    reading: asyncio.Future[bytes] | None = asyncio.ensure_future(stream.read(READ_CHUNK))
    try:
        while reading is not None or not pump.done():
            waits: set[asyncio.Future[Any]] = {pump, *ends}
            if reading is not None:
                waits.add(reading)
            idle_left = tally.last + IDLE_SECONDS - time.monotonic()
            done, _ = await asyncio.wait(
                waits, timeout=max(idle_left, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
            if any(end in done for end in ends):
                return
            if reading is not None and reading in done:
                data = reading.result()
                if not data:
                    reading = None
                    yield "eof"
                    continue
                tally.from_sandbox += len(data)
                tally.moved()
                yield data
                reading = asyncio.ensure_future(stream.read(READ_CHUNK))
            if pump.done():
                pump.result()  # the client's stream failed: its error ends the call
            if not done and time.monotonic() - tally.last >= IDLE_SECONDS:
                tally.last = 0.0
                return
    finally:
        for task in (pump, reading):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


async def _pump(stream: PortStream, incoming: AsyncIterator[bytes | None], tally: _Tally) -> None:
    """The client's bytes to the sandbox, until its half-close or its stream's end (the same
    for the sandbox: what follows a half-close is never read)."""
    async for item in incoming:
        if item is CLOSE_WRITE:
            break
        if item:
            try:
                await stream.write(item)
            except ConnectionResetError:
                return  # the sandbox's side is gone: its end comes through ``read``
            tally.to_sandbox += len(item)
            tally.moved()
    await stream.shut_write()


def _no_event(event: Event) -> bool:
    """The subscription only waits for its bus to close (the session's end)."""
    return False
