"""The gRPC servicer: converts proto <-> domain and maps exceptions to status codes, nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator

from dispatcher.core.approval.broker import Decision
from dispatcher.core.sessions.state import SessionState
from dispatcher.core.transfer import TreeTransfers
from dispatcher.core.types import ToolResultBlock
from dispatcher.sandbox.transfer import AgentTreeTransport
from dispatcher.server.preview.opening import Previews
from dispatcher.server.requests.checks import check_dispatch_request
from dispatcher.server.requests.errors import FailedPrecondition, InvalidRequest
from dispatcher.server.rpc.handlers import Ctx, stream, unary
from dispatcher.server.rpc.inputs import InputParser
from dispatcher.server.rpc.ports import PortRpcs
from dispatcher.server.rpc.processes import ProcessRpcs
from dispatcher.server.rpc.snapshots import SnapshotRpcs
from dispatcher.server.rpc.transfer import TransferHandlers
from dispatcher.server.sessions import policy as session_policy
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
    convert_staged,
    convert_usage,
)


def _decision(value: int) -> Decision:
    """A request's ``decision`` field; only allow and deny are answers."""
    decision = convert.decision_from_pb(value)
    if decision is None:
        raise InvalidRequest("decision: must be DECISION_ALLOW or DECISION_DENY")
    return decision


class DispatcherServicer(ProcessRpcs, PortRpcs, SnapshotRpcs, pb_grpc.ToolDispatcherServicer):
    """Implements dispatcher.v1.ToolDispatcher on top of the session manager: the sessions, their
    calls, approvals and staged changes here; processes, ports and snapshots in their areas'
    mixins (``processes.py``, ``ports.py``, ``snapshots.py``)."""

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

    @unary
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

    @unary
    async def GetSession(self, request: pb.GetSessionRequest, context: Ctx) -> pb.GetSessionResponse:
        entry = self._sessions.get(current_tenant(), request.session_id, touch=False)
        return pb.GetSessionResponse(session=self._session_pb(entry))

    @unary
    async def ListSessions(self, request: pb.ListSessionsRequest, context: Ctx) -> pb.ListSessionsResponse:
        entries = self._sessions.list_for(current_tenant())
        return pb.ListSessionsResponse(sessions=[self._session_pb(e) for e in entries])

    @unary
    async def CloseSession(self, request: pb.CloseSessionRequest, context: Ctx) -> pb.CloseSessionResponse:
        await self._sessions.close(current_tenant(), request.session_id)
        return pb.CloseSessionResponse()

    @unary
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

    @stream
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

    @unary
    async def CancelSessionTools(
        self, request: pb.CancelSessionToolsRequest, context: Ctx
    ) -> pb.CancelSessionToolsResponse:
        await self._sessions.cancel(current_tenant(), request.session_id)
        return pb.CancelSessionToolsResponse()

    @unary
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

    @unary
    async def ResolveConfirmations(
        self, request: pb.ResolveConfirmationsRequest, context: Ctx
    ) -> pb.ResolveConfirmationsResponse:
        decision = _decision(request.decision)
        applied = session_policy.resolve_many(
            self._sessions, current_tenant(), request.session_id, decision, list(request.request_ids)
        )
        return pb.ResolveConfirmationsResponse(applied_request_ids=applied)

    @unary
    async def ApprovePlan(self, request: pb.ApprovePlanRequest, context: Ctx) -> pb.ApprovePlanResponse:
        decision = _decision(request.decision)
        steps, mode = session_policy.decide_plan(
            self._sessions, current_tenant(), request.session_id, decision
        )
        return pb.ApprovePlanResponse(
            steps=[convert_policy.plan_step_to_pb(s) for s in steps],
            approval_mode=convert_policy.mode_to_pb(mode),
        )

    @stream
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

    @unary
    async def ListStagedChanges(
        self, request: pb.ListStagedChangesRequest, context: Ctx
    ) -> pb.ListStagedChangesResponse:
        changes = session_policy.list_staged(self._sessions, current_tenant(), request.session_id)
        return pb.ListStagedChangesResponse(changes=[convert_staged.change_to_pb(c) for c in changes])

    @unary
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

    @unary
    async def DiscardStagedChanges(
        self, request: pb.DiscardStagedChangesRequest, context: Ctx
    ) -> pb.DiscardStagedChangesResponse:
        dropped = await session_policy.discard_staged(
            self._sessions, current_tenant(), request.session_id, list(request.ids)
        )
        return pb.DiscardStagedChangesResponse(discarded_ids=[c.change_id for c in dropped])

    @unary
    async def RenewSession(self, request: pb.RenewSessionRequest, context: Ctx) -> pb.RenewSessionResponse:
        entry = self._sessions.renew(current_tenant(), request.session_id, float(request.ttl_seconds))
        return pb.RenewSessionResponse(session=self._session_pb(entry))

    @unary
    async def PauseSession(self, request: pb.PauseSessionRequest, context: Ctx) -> pb.PauseSessionResponse:
        entry = await self._sessions.pause(current_tenant(), request.session_id)
        return pb.PauseSessionResponse(session=self._session_pb(entry))

    @unary
    async def ResumeSession(self, request: pb.ResumeSessionRequest, context: Ctx) -> pb.ResumeSessionResponse:
        entry = await self._sessions.resume(current_tenant(), request.session_id)
        return pb.ResumeSessionResponse(session=self._session_pb(entry))

    @unary
    async def GetSessionUsage(
        self, request: pb.GetSessionUsageRequest, context: Ctx
    ) -> pb.GetSessionUsageResponse:
        if self._usage is None:
            raise FailedPrecondition("this server measures no usage per session")
        return convert_usage.usage_to_pb(await self._usage.usage(current_tenant(), request.session_id))
