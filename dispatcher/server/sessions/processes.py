"""The RPCs about a session's background processes: ListProcesses, WatchProcess, WriteProcessInput
and SignalProcess, on the session's ``ProcessControl`` (``core/process_api.py``).

Tenancy as for every session RPC: another tenant's session does not exist. Each operation asks the
sandbox, so a paused session is resumed first (``lifecycle.hold``), as a Dispatch, a transfer or
ApplyStagedChanges does: a frozen agent would not answer. A watch holds the session only while it
starts (checking the process exists); after that, watching is not activity, as WatchSession's.

A watch is one of the tenant's ``max_watch_streams`` (with WatchSession's) and ends when the server
drains or the session ends. It asks its sandbox for the next item only once the previous one went
out to the client, so a client that does not read makes the server hold one item, never a queue:
the rest waits in the process's bounded ring, and a reader that falls behind it is told how much
it lost.

Reading the list and starting a watch count as activity, as ListStagedChanges does; a client's
signal and stdin writes are audited (the caller is the approver, as for staged changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

from dispatcher.core.errors import UnknownSessionError
from dispatcher.core.events.bus import Event
from dispatcher.core.process_api import (
    PROCESS_SIGNALS,
    OutputChunk,
    ProcessControl,
    ProcessError,
    ProcessInfo,
)
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.server.requests.checks import check_id
from dispatcher.server.requests.errors import InvalidRequest, SandboxUnavailable, ShuttingDown
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.tenancy.tenants import Tenant

log = logging.getLogger("dispatcher.server.sessions.processes")

MAX_GRACE_SECONDS = 600.0
"""SignalProcess's ``grace_seconds``, as the sandbox's process table bounds it."""
AUDIT_SIGNAL = "process.signal"
"""Audit record of a client's SignalProcess (the caller is the approver, as for staged changes)."""
AUDIT_INPUT = "process.input"
"""Audit record of a client's WriteProcessInput: how many bytes, never the bytes."""


async def process_control(sessions: SessionManager, session_id: str) -> ProcessControl:
    """The session's process table: the one way these RPCs reach it (through the core, which
    knows the session's sandbox).

    Raises:
        ProcessError: ``unsupported``: its sandbox has none.
    """
    _, control = await sessions.dispatcher.processes(session_id)
    return control


def _check_process_id(process_id: str) -> None:
    if not process_id:
        raise InvalidRequest("process_id: required (ListProcesses gives the session's)")
    check_id("process_id", process_id)


async def list_processes(
    sessions: SessionManager, tenant: Tenant, session_id: str
) -> tuple[ProcessInfo, ...]:
    """ListProcesses: running and kept finished processes, oldest first.

    Raises:
        UnknownSessionError: no such session for this tenant.
        ProcessError: ``unsupported``, the sandbox has no process table.
        SandboxUnavailable: the sandbox failed.
    """
    state = sessions.get(tenant, session_id)
    control = await process_control(sessions, session_id)
    async with sessions.lifecycle.hold(state), sandbox_errors():
        return await control.list()


async def write_input(
    sessions: SessionManager, tenant: Tenant, session_id: str, process_id: str, data: bytes, close: bool
) -> ProcessInfo:
    """WriteProcessInput: ``data`` for the process's stdin (buffered in the sandbox up to its
    bound), then closed if ``close``.

    Raises:
        UnknownSessionError, ProcessError (``no_process``, ``not_running``, ``too_large``,
        ``unsupported``), SandboxUnavailable.
    """
    state = sessions.get(tenant, session_id)
    _check_process_id(process_id)
    control = await process_control(sessions, session_id)
    async with sessions.lifecycle.hold(state), sandbox_errors():
        info = await control.write_input(process_id, data, close=close)
    sessions.dispatcher.audit_record(
        AUDIT_INPUT,
        tenant=tenant.tenant_id,
        session=session_id,
        process=process_id,
        bytes=len(data),
        close_stdin=close,
    )
    return info


async def signal(
    sessions: SessionManager,
    tenant: Tenant,
    session_id: str,
    process_id: str,
    signal_name: str | None,
    grace_seconds: float | None,
) -> ProcessInfo:
    """SignalProcess: ``signal_name`` to the process's group (None: a value this server does not
    know), KILL after ``grace_seconds`` if given.

    Raises:
        InvalidRequest: an unknown signal, a grace outside 0..600 seconds.
        UnknownSessionError, ProcessError (``no_process``, ``unsupported``), SandboxUnavailable.
    """
    state = sessions.get(tenant, session_id)
    _check_process_id(process_id)
    if signal_name not in PROCESS_SIGNALS:
        raise InvalidRequest(f"signal: unknown value; one of {', '.join(PROCESS_SIGNALS)}")
    if grace_seconds is not None and not (
        math.isfinite(grace_seconds) and 0 <= grace_seconds <= MAX_GRACE_SECONDS
    ):
        raise InvalidRequest(f"grace_seconds: from 0 to {MAX_GRACE_SECONDS:g}, got {grace_seconds!r}")
    control = await process_control(sessions, session_id)
    async with sessions.lifecycle.hold(state), sandbox_errors():
        info = await control.signal(process_id, signal_name, grace_seconds=grace_seconds)
    sessions.dispatcher.audit_record(
        AUDIT_SIGNAL,
        tenant=tenant.tenant_id,
        session=session_id,
        process=process_id,
        signal=signal_name,
        grace_seconds=grace_seconds,
        state=info.state,
    )
    log.info(
        "process signalled",
        extra={"tenant_id": tenant.tenant_id, "session_id": session_id, "process_id": process_id},
    )
    return info


async def watch(
    sessions: SessionManager,
    tenant: Tenant,
    session_id: str,
    process_id: str,
    after: int,
    *,
    from_end: bool = False,
) -> AsyncIterator[OutputChunk | ProcessInfo]:
    """WatchProcess: the process's output from cursor ``after`` (``from_end``: from its newest
    byte), chunks as they come, then its record once it ended and every byte went out.

    Raises:
        InvalidRequest: ``after`` past the process's output so far.
        QuotaExceeded: the tenant already has ``max_watch_streams`` open.
        UnknownSessionError, ProcessError (``no_process``, ``unsupported``).
        SandboxUnavailable: the sandbox ended the watch before the process ended (the message
            names the cursor to watch again from).
        ShuttingDown: the server is draining (likewise).
        UnknownSessionError: also when the session closed or expired during the watch.
    """
    sessions.admission.check_open()
    state = sessions.get(tenant, session_id, touch=False)  # watching is not activity
    _check_process_id(process_id)
    control = await process_control(sessions, session_id)
    bus = sessions.dispatcher.events(session_id)
    async with (
        sessions.admission.watch_slot(tenant) as stop,
        bus.subscribe(event_filter=_no_event) as session_events,  # ends when the session does
    ):
        async with sessions.lifecycle.hold(state), sandbox_errors():
            info = _find(await control.list(), process_id)
        if after > info.end and not from_end:
            raise InvalidRequest(
                f"after: {after} is past {process_id}'s output, which ends at cursor {info.end} so far"
            )
        cursor = info.end if from_end else after
        draining = asyncio.ensure_future(stop.wait())
        closing = asyncio.ensure_future(anext(session_events, None))
        try:
            async with contextlib.aclosing(
                _follow(control, process_id, cursor, (draining, closing))
            ) as items:
                async for item in items:
                    if isinstance(item, ProcessInfo):
                        yield item
                        return
                    cursor = item.cursor + len(item.data)
                    yield item
        finally:
            draining.cancel()
            closing.cancel()
        if stop.is_set():
            raise ShuttingDown(f"the server is shutting down; watch {process_id} again from cursor {cursor}")
        if closing.done():
            raise UnknownSessionError(f"session {session_id!r} closed; its processes ended with it")
        raise SandboxUnavailable(
            f"the watch of {process_id} ended before the process did (its sandbox stopped or was "
            f"paused); watch again from cursor {cursor}"
        )


def _no_event(event: Event) -> bool:
    """A subscription that only waits for its bus to close takes no event (holds no memory)."""
    return False


def _find(processes: tuple[ProcessInfo, ...], process_id: str) -> ProcessInfo:
    for info in processes:
        if info.process_id == process_id:
            return info
    raise ProcessError("no_process", f"no process {process_id!r} in this session (ListProcesses lists them)")


async def _follow(
    control: ProcessControl, process_id: str, after: int, ends: Sequence[asyncio.Future[Any]]
) -> AsyncGenerator[OutputChunk | ProcessInfo, None]:
    """``control.watch`` item by item, each asked for once the one before was taken; ends early
    when one of ``ends`` is done, on a record of a process still running (the sandbox ended the
    watch), and closes the watch however it ends (the client left: its cancellation lands here)."""
    items = control.watch(process_id, after=after)
    try:
        while True:
            step: asyncio.Future[OutputChunk | ProcessInfo | None] = asyncio.ensure_future(anext(items, None))
            try:
                await asyncio.wait((step, *ends), return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not step.done():
                    step.cancel()
                    await asyncio.gather(step, return_exceptions=True)
            if step.cancelled():
                return
            try:
                item = step.result()
            except SandboxError as exc:
                log.warning("watch of %s ended by its sandbox: %s", process_id, exc)
                return
            if item is None or (isinstance(item, ProcessInfo) and item.running):
                return
            yield item
            if isinstance(item, ProcessInfo):
                return
    finally:
        if isinstance(items, AsyncGenerator):  # the contract's watch: closing it stops it
            await items.aclose()


@contextlib.asynccontextmanager
async def sandbox_errors() -> AsyncIterator[None]:
    """A sandbox failure during a process request as the client's UNAVAILABLE (a refusal, a
    ``ProcessError``, passes as it is)."""
    try:
        yield
    except SandboxError as exc:
        raise SandboxUnavailable(f"the session's sandbox failed: {exc}; try again") from exc
