"""The background-process and code-context RPCs: a session's processes listed, watched, written to
and signalled (``sessions/processes.py``), its code contexts listed and removed (``sessions/code.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from dispatcher.server.rpc.handlers import Ctx, RpcArea, stream, unary
from dispatcher.server.sessions import code as session_code
from dispatcher.server.sessions import processes as session_processes
from dispatcher.server.tenancy.auth import current_tenant
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.wire import convert_processes


class ProcessRpcs(RpcArea):
    """ListProcesses, WatchProcess, WriteProcessInput, SignalProcess, ListCodeContexts and
    RemoveCodeContext."""

    @unary
    async def ListProcesses(self, request: pb.ListProcessesRequest, context: Ctx) -> pb.ListProcessesResponse:
        infos = await session_processes.list_processes(self._sessions, current_tenant(), request.session_id)
        return pb.ListProcessesResponse(processes=[convert_processes.process_to_pb(i) for i in infos])

    @stream
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

    @unary
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

    @unary
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

    @unary
    async def ListCodeContexts(
        self, request: pb.ListCodeContextsRequest, context: Ctx
    ) -> pb.ListCodeContextsResponse:
        found = await session_code.list_code_contexts(self._sessions, current_tenant(), request.session_id)
        return pb.ListCodeContextsResponse(contexts=[convert_processes.code_context_to_pb(c) for c in found])

    @unary
    async def RemoveCodeContext(
        self, request: pb.RemoveCodeContextRequest, context: Ctx
    ) -> pb.RemoveCodeContextResponse:
        removed = await session_code.remove_code_context(
            self._sessions, current_tenant(), request.session_id, request.language, request.context
        )
        return pb.RemoveCodeContextResponse(removed=convert_processes.code_context_to_pb(removed))
