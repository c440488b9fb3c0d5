"""The gRPC servicer: converts proto <-> domain and maps exceptions to status codes, nothing else."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc

from dispatcher.core.approval.broker import Decision
from dispatcher.core.sessions.state import SessionState
from dispatcher.core.transfer import TreeTransfers
from dispatcher.core.types import ToolResultBlock
from dispatcher.sandbox.transfer import AgentTreeTransport
from dispatcher.server.preview import opening as preview_opening
from dispatcher.server.preview.opening import Previews
from dispatcher.server.requests.checks import check_dispatch_request
from dispatcher.server.requests.errors import FailedPrecondition, InvalidRequest, status_for
from dispatcher.server.rpc.inputs import InputParser
from dispatcher.server.rpc.transfer import TransferHandlers
from dispatcher.server.sessions import code as session_code
from dispatcher.server.sessions import policy as session_policy
from dispatcher.server.sessions import ports as session_ports
from dispatcher.server.sessions import processes as session_processes
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.sessions.ports import PortObserver
from dispatcher.server.sessions.snapshots import Snapshots
from dispatcher.server.sessions.usage import UsageReader
from dispatcher.server.tenancy.auth import current_tenant
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from dispatcher.wire import (
    convert,
    convert_lifecycle,
    convert_policy,
    convert_processes,
    convert_snapshots,
    convert_staged,
    convert_usage,
)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx: TypeAlias = grpc.aio.ServicerContext


def _unary(
    fn: Callable[[Any, Req, Ctx], Awaitable[Resp]],
) -> Callable[[Any, Req, Ctx], Awaitable[Resp]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: Ctx) -> Resp:
        try:
            return await fn(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort(*status_for(exc))
            raise  # unreachable: abort raises

    return wrapper


def _stream(
    fn: Callable[[Any, Req, Ctx], AsyncIterator[Resp]],
) -> Callable[[Any, Req, Ctx], AsyncIterator[Resp]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: Ctx) -> AsyncIterator[Resp]:
        try:
            async for item in fn(self, request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort(*status_for(exc))

    return wrapper


def _decision(value: int) -> Decision:
    """A request's ``decision`` field; only allow and deny are answers."""
    decision = convert.decision_from_pb(value)
    if decision is None:
        raise InvalidRequest("decision: must be DECISION_ALLOW or DECISION_DENY")
    return decision


class DispatcherServicer(pb_grpc.ToolDispatcherServicer):
    """Implements dispatcher.v1.ToolDispatcher on top of the session manager."""

    def __init__(
        self,
        sessions: SessionManager,
        *,
        max_pending_events: int = 4096,
        transfers: TreeTransfers | None = None,
        usage: UsageReader | None = None,
        snapshots: Snapshots | None = None,
        port_observer: PortObserver | None = None,
        previews: Previews | None = None,
    ) -> None:
        self._sessions = sessions
        self._usage = usage
        self._snapshots = snapshots
        self._port_observer = port_observer
        self._previews = previews
        self._max_pending = max_pending_events
        self._inputs = InputParser(sessions.dispatcher.config.max_input_bytes)
        self._transfers = TransferHandlers(
            sessions, transfers or TreeTransfers(sessions.dispatcher, AgentTreeTransport())
        )

    def _session_pb(self, entry: SessionState) -> pb.Session:
        """A session as the RPCs show it, with its open preview ports (never their tokens)."""
        msg = convert.session_to_pb(self._sessions.info(entry))
        if self._previews is not None:
            sid = entry.session.session_id
            for port in self._previews.ports.of_session(sid):
                info = msg.open_ports.add(
                    port=port.port, url=self._previews.url(sid, port.port), public=port.public
                )
                if port.expires is not None:
                    info.expire_time.FromNanoseconds(int(port.expires * 1e9))
        return msg

    @_unary
    async def CreateSession(self, request: pb.CreateSessionRequest, context: Ctx) -> pb.CreateSessionResponse:
        role = convert.role_from_pb(request.role)
        if role is None:
            raise InvalidRequest(f"role: unknown value {request.role}")
        mode = convert_policy.mode_from_pb(request.approval_mode)
        if mode is None:
            raise InvalidRequest(f"approval_mode: unknown value {request.approval_mode}")
        # Not set: the first of the tenant's approval_modes (cautious unless its config says).
        chosen = mode.value if request.approval_mode != pb.APPROVAL_MODE_UNSPECIFIED else None
        try:
            caps = convert_policy.capabilities_from_pb(request.capabilities, request.HasField("capabilities"))
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        try:
            on_expire = convert_lifecycle.on_expire_from_pb(request.on_expire)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        ttl = float(request.ttl_seconds) if request.HasField("ttl_seconds") else None
        idle = float(request.idle_timeout_seconds) if request.HasField("idle_timeout_seconds") else None
        if request.snapshot_id:
            if request.request_id:
                raise InvalidRequest("request_id: not supported with snapshot_id (a retry copies again)")
            entry = await self._snapshots_or_refuse().create_from(
                current_tenant(),
                request.snapshot_id,
                request.workspace,
                {
                    "role": role,
                    "labels": dict(request.labels),
                    "approval_mode": chosen,
                    "capabilities": caps,
                    "ttl_seconds": ttl,
                    "idle_timeout_seconds": idle,
                    "on_expire": on_expire,
                },
            )
            return pb.CreateSessionResponse(session=convert.session_to_pb(self._sessions.info(entry)))
        entry = self._sessions.create(
            current_tenant(),
            request.workspace,
            role,
            dict(request.labels),
            approval_mode=chosen,
            capabilities=caps,
            ttl_seconds=ttl,
            idle_timeout_seconds=idle,
            on_expire=on_expire,
            request_id=request.request_id,
        )
        return pb.CreateSessionResponse(session=self._session_pb(entry))

    @_unary
    async def GetSession(self, request: pb.GetSessionRequest, context: Ctx) -> pb.GetSessionResponse:
        entry = self._sessions.get(current_tenant(), request.session_id, touch=False)
        return pb.GetSessionResponse(session=self._session_pb(entry))

    @_unary
    async def ListSessions(self, request: pb.ListSessionsRequest, context: Ctx) -> pb.ListSessionsResponse:
        entries = self._sessions.list_for(current_tenant())
        return pb.ListSessionsResponse(sessions=[self._session_pb(e) for e in entries])

    @_unary
    async def CloseSession(self, request: pb.CloseSessionRequest, context: Ctx) -> pb.CloseSessionResponse:
        await self._sessions.close(current_tenant(), request.session_id)
        return pb.CloseSessionResponse()

    @_unary
    async def ListTools(self, request: pb.ListToolsRequest, context: Ctx) -> pb.ListToolsResponse:
        try:
            format = convert.tool_format_from_pb(request.format)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        tools = self._sessions.tools(current_tenant(), request.session_id)
        return pb.ListToolsResponse(
            tools=[convert.tool_to_pb(t) for t in tools],
            definitions_json=convert.definitions_json(tools, format) if format is not None else "",
        )

    @_stream
    async def Dispatch(self, request: pb.DispatchRequest, context: Ctx) -> AsyncIterator[pb.DispatchResponse]:
        tenant = current_tenant()
        check_dispatch_request(request.turn_id, [(tu.id, tu.name) for tu in request.tool_uses])
        try:
            ordering = convert.ordering_from_pb(request.ordering)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        entry = self._sessions.get(tenant, request.session_id)
        tool_uses = await self._inputs.tool_uses(tenant.tenant_id, request.tool_uses)
        async with self._sessions.dispatch(
            tenant, entry, request.turn_id, tool_uses, max_pending=self._max_pending, ordering=ordering
        ) as call:
            async for item in call.items():
                if isinstance(item, ToolResultBlock):
                    yield pb.DispatchResponse(result=convert.result_to_pb(item))
                else:
                    yield pb.DispatchResponse(event=convert.event_to_pb(item))

    @_unary
    async def CancelSessionTools(
        self, request: pb.CancelSessionToolsRequest, context: Ctx
    ) -> pb.CancelSessionToolsResponse:
        await self._sessions.cancel(current_tenant(), request.session_id)
        return pb.CancelSessionToolsResponse()

    @_unary
    async def ResolveConfirmation(
        self, request: pb.ResolveConfirmationRequest, context: Ctx
    ) -> pb.ResolveConfirmationResponse:
        decision = _decision(request.decision)
        applied, winner, remembered = self._sessions.resolve(
            current_tenant(), request.session_id, request.request_id, decision, request.remember
        )
        return pb.ResolveConfirmationResponse(
            applied=applied, decision=convert.decision_to_pb(winner), remembered=remembered
        )

    @_unary
    async def ResolveConfirmations(
        self, request: pb.ResolveConfirmationsRequest, context: Ctx
    ) -> pb.ResolveConfirmationsResponse:
        decision = _decision(request.decision)
        applied = session_policy.resolve_many(
            self._sessions, current_tenant(), request.session_id, decision, list(request.request_ids)
        )
        return pb.ResolveConfirmationsResponse(applied_request_ids=applied)

    @_unary
    async def ApprovePlan(self, request: pb.ApprovePlanRequest, context: Ctx) -> pb.ApprovePlanResponse:
        decision = _decision(request.decision)
        steps, mode = session_policy.decide_plan(
            self._sessions, current_tenant(), request.session_id, decision
        )
        return pb.ApprovePlanResponse(
            steps=[convert_policy.plan_step_to_pb(s) for s in steps],
            approval_mode=convert_policy.mode_to_pb(mode),
        )

    @_stream
    async def WatchSession(
        self, request: pb.WatchSessionRequest, context: Ctx
    ) -> AsyncIterator[pb.WatchSessionResponse]:
        async with self._sessions.watch(current_tenant(), request.session_id, request.after_seq) as sub:
            async for event in sub:
                yield pb.WatchSessionResponse(event=convert.event_to_pb(event))

    async def UploadFiles(
        self, request_iterator: AsyncIterator[pb.UploadFilesRequest], context: Ctx
    ) -> pb.UploadFilesResponse:
        return await self._transfers.upload(request_iterator, context)

    async def DownloadFiles(
        self, request: pb.DownloadFilesRequest, context: Ctx
    ) -> AsyncIterator[pb.DownloadFilesResponse]:
        async for item in self._transfers.download(request, context):
            yield item

    @_unary
    async def ListStagedChanges(
        self, request: pb.ListStagedChangesRequest, context: Ctx
    ) -> pb.ListStagedChangesResponse:
        changes = session_policy.list_staged(self._sessions, current_tenant(), request.session_id)
        return pb.ListStagedChangesResponse(changes=[convert_staged.change_to_pb(c) for c in changes])

    @_unary
    async def ApplyStagedChanges(
        self, request: pb.ApplyStagedChangesRequest, context: Ctx
    ) -> pb.ApplyStagedChangesResponse:
        outcome = await session_policy.apply_staged(
            self._sessions, current_tenant(), request.session_id, list(request.ids)
        )
        return pb.ApplyStagedChangesResponse(
            applied_ids=[c.change_id for c in outcome.applied],
            refused=[
                convert_staged.refusal_to_pb(r.change.change_id, r.change.path, r.reason)
                for r in outcome.refused
            ],
        )

    @_unary
    async def DiscardStagedChanges(
        self, request: pb.DiscardStagedChangesRequest, context: Ctx
    ) -> pb.DiscardStagedChangesResponse:
        dropped = await session_policy.discard_staged(
            self._sessions, current_tenant(), request.session_id, list(request.ids)
        )
        return pb.DiscardStagedChangesResponse(discarded_ids=[c.change_id for c in dropped])

    @_unary
    async def RenewSession(self, request: pb.RenewSessionRequest, context: Ctx) -> pb.RenewSessionResponse:
        entry = self._sessions.renew(current_tenant(), request.session_id, float(request.ttl_seconds))
        return pb.RenewSessionResponse(session=self._session_pb(entry))

    @_unary
    async def PauseSession(self, request: pb.PauseSessionRequest, context: Ctx) -> pb.PauseSessionResponse:
        entry = await self._sessions.pause(current_tenant(), request.session_id)
        return pb.PauseSessionResponse(session=self._session_pb(entry))

    @_unary
    async def ResumeSession(self, request: pb.ResumeSessionRequest, context: Ctx) -> pb.ResumeSessionResponse:
        entry = await self._sessions.resume(current_tenant(), request.session_id)
        return pb.ResumeSessionResponse(session=self._session_pb(entry))

    @_unary
    async def ListProcesses(self, request: pb.ListProcessesRequest, context: Ctx) -> pb.ListProcessesResponse:
        infos = await session_processes.list_processes(self._sessions, current_tenant(), request.session_id)
        return pb.ListProcessesResponse(processes=[convert_processes.process_to_pb(i) for i in infos])

    @_stream
    async def WatchProcess(
        self, request: pb.WatchProcessRequest, context: Ctx
    ) -> AsyncIterator[pb.WatchProcessResponse]:
        items = session_processes.watch(
            self._sessions,
            current_tenant(),
            request.session_id,
            request.process_id,
            request.after,
            from_end=request.from_end,
        )
        async for item in items:
            for message in convert_processes.watch_items_to_pb(item):
                yield message

    @_unary
    async def WriteProcessInput(
        self, request: pb.WriteProcessInputRequest, context: Ctx
    ) -> pb.WriteProcessInputResponse:
        info = await session_processes.write_input(
            self._sessions,
            current_tenant(),
            request.session_id,
            request.process_id,
            request.data,
            request.close_stdin,
        )
        return pb.WriteProcessInputResponse(process=convert_processes.process_to_pb(info))

    @_stream
    async def ConnectPort(
        self, request_iterator: AsyncIterator[pb.ConnectPortRequest], context: Ctx
    ) -> AsyncIterator[pb.ConnectPortResponse]:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None or not first.session_id or first.data or first.close_write:
            raise InvalidRequest("the first ConnectPortRequest carries session_id and port, and no data")
        items = session_ports.connect_port(
            self._sessions,
            current_tenant(),
            first.session_id,
            first.port,
            _port_bytes(requests),
            self._port_observer,
        )
        async for item in items:
            if item == "connected":
                yield pb.ConnectPortResponse(connected=True)
            elif item == "eof":
                yield pb.ConnectPortResponse(eof=True)
            else:
                yield pb.ConnectPortResponse(data=item)

    @_unary
    async def OpenPort(self, request: pb.OpenPortRequest, context: Ctx) -> pb.OpenPortResponse:
        opened = await preview_opening.open_port(
            self._sessions,
            self._previews,
            current_tenant(),
            request.session_id,
            request.port,
            request.expires_in_seconds,
            request.public,
        )
        response = pb.OpenPortResponse(url=opened.url, token=opened.token)
        if opened.expire_time is not None:
            response.expire_time.FromNanoseconds(int(opened.expire_time * 1e9))
        return response

    @_unary
    async def ClosePort(self, request: pb.ClosePortRequest, context: Ctx) -> pb.ClosePortResponse:
        await preview_opening.close_port(
            self._sessions, self._previews, current_tenant(), request.session_id, request.port
        )
        return pb.ClosePortResponse()

    @_unary
    async def SignalProcess(self, request: pb.SignalProcessRequest, context: Ctx) -> pb.SignalProcessResponse:
        info = await session_processes.signal(
            self._sessions,
            current_tenant(),
            request.session_id,
            request.process_id,
            convert_processes.signal_from_pb(request.signal),
            request.grace_seconds if request.HasField("grace_seconds") else None,
        )
        return pb.SignalProcessResponse(process=convert_processes.process_to_pb(info))

    @_unary
    async def ListCodeContexts(
        self, request: pb.ListCodeContextsRequest, context: Ctx
    ) -> pb.ListCodeContextsResponse:
        found = await session_code.list_code_contexts(self._sessions, current_tenant(), request.session_id)
        return pb.ListCodeContextsResponse(contexts=[convert_processes.code_context_to_pb(c) for c in found])

    @_unary
    async def RemoveCodeContext(
        self, request: pb.RemoveCodeContextRequest, context: Ctx
    ) -> pb.RemoveCodeContextResponse:
        removed = await session_code.remove_code_context(
            self._sessions, current_tenant(), request.session_id, request.language, request.context
        )
        return pb.RemoveCodeContextResponse(removed=convert_processes.code_context_to_pb(removed))

    @_unary
    async def GetSessionUsage(
        self, request: pb.GetSessionUsageRequest, context: Ctx
    ) -> pb.GetSessionUsageResponse:
        if self._usage is None:
            raise FailedPrecondition("this server measures no usage per session")
        return convert_usage.usage_to_pb(await self._usage.usage(current_tenant(), request.session_id))

    def _snapshots_or_refuse(self) -> Snapshots:
        if self._snapshots is None:
            raise FailedPrecondition("this server keeps no snapshots")
        return self._snapshots

    @_unary
    async def SnapshotSession(self, request: pb.SnapshotSessionRequest, context: Ctx) -> pb.Snapshot:
        info = await self._snapshots_or_refuse().take(current_tenant(), request.session_id, request.name)
        return convert_snapshots.snapshot_to_pb(info)

    @_unary
    async def ListSnapshots(self, request: pb.ListSnapshotsRequest, context: Ctx) -> pb.ListSnapshotsResponse:
        found = self._snapshots_or_refuse().list_for(current_tenant())
        return pb.ListSnapshotsResponse(snapshots=[convert_snapshots.snapshot_to_pb(s) for s in found])

    @_unary
    async def DeleteSnapshot(
        self, request: pb.DeleteSnapshotRequest, context: Ctx
    ) -> pb.DeleteSnapshotResponse:
        freed = await self._snapshots_or_refuse().delete(current_tenant(), request.snapshot_id)
        return pb.DeleteSnapshotResponse(freed_bytes=freed)

    @_unary
    async def ForkSession(self, request: pb.ForkSessionRequest, context: Ctx) -> pb.ForkSessionResponse:
        results = await self._snapshots_or_refuse().fork(
            current_tenant(),
            session_id=request.session_id,
            snapshot_id=request.snapshot_id,
            count=request.count,
            labels=dict(request.labels),
            ttl_seconds=float(request.ttl_seconds) if request.HasField("ttl_seconds") else None,
            idle_timeout_seconds=(
                float(request.idle_timeout_seconds) if request.HasField("idle_timeout_seconds") else None
            ),
        )
        return pb.ForkSessionResponse(
            results=[
                convert_snapshots.fork_result_to_pb(
                    r if isinstance(r, convert_snapshots.ForkFailure) else self._sessions.info(r)
                )
                for r in results
            ]
        )


async def _port_bytes(requests: AsyncIterator[pb.ConnectPortRequest]) -> AsyncIterator[bytes | None]:
    """ConnectPort's later messages as bytes, then None for the half-close."""
    async for request in requests:
        if request.session_id or request.port:
            raise InvalidRequest("only the first ConnectPortRequest carries session_id and port")
        if request.data:
            yield request.data
        if request.close_write:
            yield session_ports.CLOSE_WRITE
            return
