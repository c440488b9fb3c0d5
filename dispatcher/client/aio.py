"""The asyncio client (grpc.aio): ``DispatcherClient``'s methods as coroutines and async iterators."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from dispatcher.client import base
from dispatcher.client.base import ClientBase, DispatchItem, RequestFailed
from dispatcher.client.ports import OpenedPort, PortConnection, opened_port
from dispatcher.core.approval.broker import Decision
from dispatcher.core.events.bus import Event
from dispatcher.core.process_api import CodeContext, ProcessInfo
from dispatcher.core.provider_api import SessionUsage
from dispatcher.core.sessions.state import PlanStep
from dispatcher.core.transfer import UploadSummary
from dispatcher.core.types import Role, ToolResultBlock, ToolUseBlock
from dispatcher.trees import Extracted, extract_chunks, tar_chunks
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from dispatcher.wire import convert, convert_processes, convert_snapshots, convert_staged, convert_usage
from dispatcher.wire.convert import SessionInfo, ToolInfo
from dispatcher.wire.convert_processes import WatchItem
from dispatcher.wire.convert_snapshots import ForkFailure, SnapshotInfo
from dispatcher.wire.convert_staged import StagedApplyResult, StagedChangeInfo

_T = TypeVar("_T")


class AsyncDispatcherClient(ClientBase):
    """The same client on grpc.aio; streaming methods are async iterators."""

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        home: str | None = None,
        channel: grpc.aio.Channel | None = None,
        timeout: float | None = 30.0,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        super().__init__(token, home)
        self._owns_channel = channel is None
        if channel is None:
            channel = base.open_channel(grpc.aio, target, tls_ca, tls_cert, tls_key)
        self._channel = channel
        self._stub = pb_grpc.ToolDispatcherStub(self._channel)
        self._timeout = timeout

    async def __aenter__(self) -> AsyncDispatcherClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_channel:
            await self._channel.close()

    async def _unary(self, method: Callable[..., Any], request: Any) -> Any:
        try:
            return await method(request, metadata=self._metadata, timeout=self._timeout)
        except grpc.RpcError as err:
            raise RequestFailed.from_rpc_error(err) from None

    async def create_session(
        self,
        workspace: str = "",
        *,
        role: Role = Role.MAIN,
        labels: Mapping[str, str] | None = None,
        mode: str | None = None,
        tools: Sequence[str] | None = None,
        fs: Sequence[tuple[str, str]] | None = None,
        egress_allow: Sequence[str] | None = None,
        ttl_seconds: int | None = None,
        idle_timeout_seconds: int | None = None,
        on_expire: str | None = None,
        request_id: str = "",
        snapshot_id: str = "",
    ) -> SessionInfo:
        """Open a session; the arguments are ``DispatcherClient.create_session``'s."""
        req = base.create_request(
            workspace,
            role,
            labels,
            mode,
            tools,
            fs,
            egress_allow=egress_allow,
            ttl_seconds=ttl_seconds,
            idle_timeout_seconds=idle_timeout_seconds,
            on_expire=on_expire,
            request_id=request_id,
            snapshot_id=snapshot_id,
        )
        return convert.session_from_pb((await self._unary(self._stub.CreateSession, req)).session)

    async def get_session(self, session_id: str) -> SessionInfo:
        resp = await self._unary(self._stub.GetSession, pb.GetSessionRequest(session_id=session_id))
        return convert.session_from_pb(resp.session)

    async def list_sessions(self) -> list[SessionInfo]:
        resp = await self._unary(self._stub.ListSessions, pb.ListSessionsRequest())
        return [convert.session_from_pb(s) for s in resp.sessions]

    async def close_session(self, session_id: str) -> None:
        await self._unary(self._stub.CloseSession, pb.CloseSessionRequest(session_id=session_id))

    async def renew_session(self, session_id: str, ttl_seconds: int) -> SessionInfo:
        """A new expiry ``ttl_seconds`` from now (0: none, if the tenant has no maximum)."""
        req = pb.RenewSessionRequest(session_id=session_id, ttl_seconds=ttl_seconds)
        return convert.session_from_pb((await self._unary(self._stub.RenewSession, req)).session)

    async def session_usage(self, session_id: str) -> SessionUsage:
        """What the session's sandbox uses now (takes about a second: CPU is measured over one)."""
        req = pb.GetSessionUsageRequest(session_id=session_id)
        return convert_usage.usage_from_pb(await self._unary(self._stub.GetSessionUsage, req))

    async def snapshot_session(self, session_id: str, name: str = "") -> SnapshotInfo:
        """Copy the session's workspace and /tmp (its sandbox frozen for the copy) into a snapshot."""
        req = pb.SnapshotSessionRequest(session_id=session_id, name=name)
        return convert_snapshots.snapshot_from_pb(await self._unary(self._stub.SnapshotSession, req))

    async def list_snapshots(self) -> list[SnapshotInfo]:
        resp = await self._unary(self._stub.ListSnapshots, pb.ListSnapshotsRequest())
        return [convert_snapshots.snapshot_from_pb(s) for s in resp.snapshots]

    async def delete_snapshot(self, snapshot_id: str) -> int:
        """Remove the snapshot and its files; returns the bytes freed."""
        req = pb.DeleteSnapshotRequest(snapshot_id=snapshot_id)
        return int((await self._unary(self._stub.DeleteSnapshot, req)).freed_bytes)

    async def fork_session(
        self,
        session_id: str = "",
        count: int = 1,
        *,
        snapshot_id: str = "",
        labels: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        idle_timeout_seconds: int | None = None,
    ) -> list[SessionInfo | ForkFailure]:
        """``count`` new sessions from the session (or ``snapshot_id``): one result per child, in
        order, a session or why that child was not made."""
        req = pb.ForkSessionRequest(count=count, labels=dict(labels or {}))
        if snapshot_id:
            req.snapshot_id = snapshot_id
        else:
            req.session_id = session_id
        if ttl_seconds is not None:
            req.ttl_seconds = ttl_seconds
        if idle_timeout_seconds is not None:
            req.idle_timeout_seconds = idle_timeout_seconds
        resp = await self._unary(self._stub.ForkSession, req)
        return [convert_snapshots.fork_result_from_pb(r) for r in resp.results]

    async def pause_session(self, session_id: str) -> SessionInfo:
        req = pb.PauseSessionRequest(session_id=session_id)
        return convert.session_from_pb((await self._unary(self._stub.PauseSession, req)).session)

    async def resume_session(self, session_id: str) -> SessionInfo:
        req = pb.ResumeSessionRequest(session_id=session_id)
        return convert.session_from_pb((await self._unary(self._stub.ResumeSession, req)).session)

    async def list_tools(self, session_id: str) -> list[ToolInfo]:
        resp = await self._unary(self._stub.ListTools, pb.ListToolsRequest(session_id=session_id))
        return [convert.tool_from_pb(t) for t in resp.tools]

    async def tools_for(self, session: str | SessionInfo, format: str) -> list[dict[str, Any]]:
        """The session's tools in a provider's shape (``"anthropic"``, ``"openai"`` or ``"mcp"``),
        ready to pass as that API's ``tools``.

        Raises:
            ValueError: another ``format``.
        """
        request = base.list_tools_request(session, format)
        return base.definitions(await self._unary(self._stub.ListTools, request))

    async def dispatch(
        self,
        session_id: str,
        tool_uses: Sequence[ToolUseBlock | tuple[str, Any]],
        *,
        turn_id: str = "",
        ordering: str | None = None,
    ) -> AsyncIterator[DispatchItem]:
        items: AsyncIterator[DispatchItem] = self._stream(
            self._dispatch_call(session_id, tool_uses, turn_id, ordering), base.dispatch_item
        )
        async for item in items:
            yield item

    async def call(
        self,
        session_id: str,
        name: str,
        tool_input: Mapping[str, Any] | str,
        *,
        tool_use_id: str | None = None,
        turn_id: str = "",
        on_event: Callable[[Event], None] | None = None,
    ) -> ToolResultBlock:
        block = ToolUseBlock(tool_use_id or base.new_id(), name, tool_input)
        result: ToolResultBlock | None = None
        call = self._dispatch_call(session_id, [block], turn_id, None)
        # Events are converted only for someone who sees them.
        items: AsyncIterator[DispatchItem] = self._stream(
            call, base.dispatch_item if on_event is not None else base.result_item
        )
        async for item in items:
            if isinstance(item, ToolResultBlock):
                result = item
            elif on_event is not None:
                on_event(item)
        if result is None:
            raise RequestFailed("INTERNAL", "the Dispatch stream ended without a result")
        return result

    async def open_port(
        self, session_id: str, port: int, *, expires_in_seconds: int = 0, public: bool = False
    ) -> OpenedPort:
        """Open a sandbox port to the preview gateway (OpenPort): its URL and token.

        Raises:
            RequestFailed: ``FAILED_PRECONDITION`` (no gateway; public not allowed),
                ``INVALID_ARGUMENT``, ``NOT_FOUND``.
        """
        req = pb.OpenPortRequest(
            session_id=session_id, port=port, expires_in_seconds=expires_in_seconds, public=public
        )
        return opened_port(await self._unary(self._stub.OpenPort, req))

    async def close_port(self, session_id: str, port: int) -> None:
        """Close an open port (ClosePort): its token stops working, its connections are cut.

        Raises:
            RequestFailed: ``NOT_FOUND`` when it is not open.
        """
        await self._unary(self._stub.ClosePort, pb.ClosePortRequest(session_id=session_id, port=port))

    async def connect_port(self, session_id: str, port: int) -> PortConnection:
        """A TCP connection to ``127.0.0.1:port`` in the session's sandbox (ConnectPort); close it
        when done.

        Raises:
            RequestFailed: ``UNAVAILABLE`` (nothing listens there), ``INVALID_ARGUMENT`` (a port
                outside 1-65535), ``NOT_FOUND``, ``RESOURCE_EXHAUSTED``, ``FAILED_PRECONDITION``.
        """
        call = self._stub.ConnectPort(metadata=self._metadata)
        return await PortConnection.open(call, session_id, port)

    async def watch(self, session_id: str, after_seq: int = 0) -> AsyncIterator[Event]:
        call = self._stub.WatchSession(
            pb.WatchSessionRequest(session_id=session_id, after_seq=after_seq), metadata=self._metadata
        )
        async for event in self._stream(call, lambda r: convert.event_from_pb(r.event)):
            yield event

    async def resolve_confirmation(
        self, session_id: str, request_id: str, decision: Decision | bool | str, *, remember: bool = False
    ) -> tuple[bool, Decision]:
        req = pb.ResolveConfirmationRequest(
            session_id=session_id, request_id=request_id, decision=base.decision(decision), remember=remember
        )
        return base.resolved(await self._unary(self._stub.ResolveConfirmation, req))

    async def answer(
        self, session_id: str, request_id: str, decision: Decision | bool | str, *, remember: bool = False
    ) -> base.Answer:
        """``resolve_confirmation`` that also says whether the answer is remembered for the tool."""
        req = pb.ResolveConfirmationRequest(
            session_id=session_id, request_id=request_id, decision=base.decision(decision), remember=remember
        )
        return base.answered(await self._unary(self._stub.ResolveConfirmation, req))

    async def list_staged(self, session_id: str) -> list[StagedChangeInfo]:
        """A review or audit session's staged changes, oldest first, each with its unified diff."""
        resp = await self._unary(
            self._stub.ListStagedChanges, pb.ListStagedChangesRequest(session_id=session_id)
        )
        return [convert_staged.change_from_pb(c) for c in resp.changes]

    async def apply_staged(self, session_id: str, ids: Sequence[str] = ()) -> StagedApplyResult:
        """Write staged changes (none listed: all): per file in review mode, all or none in audit."""
        req = pb.ApplyStagedChangesRequest(session_id=session_id, ids=list(ids))
        return convert_staged.apply_result_from_pb(await self._unary(self._stub.ApplyStagedChanges, req))

    async def discard_staged(self, session_id: str, ids: Sequence[str] = ()) -> list[str]:
        """Drop staged changes (none listed: all); returns the ids dropped."""
        req = pb.DiscardStagedChangesRequest(session_id=session_id, ids=list(ids))
        return list((await self._unary(self._stub.DiscardStagedChanges, req)).discarded_ids)

    async def resolve_confirmations(
        self, session_id: str, decision: Decision | bool | str, request_ids: Sequence[str] = ()
    ) -> list[str]:
        req = pb.ResolveConfirmationsRequest(
            session_id=session_id, decision=base.decision(decision), request_ids=list(request_ids)
        )
        return list((await self._unary(self._stub.ResolveConfirmations, req)).applied_request_ids)

    async def approve_plan(
        self, session_id: str, decision: Decision | bool | str = True
    ) -> tuple[list[PlanStep], str]:
        req = pb.ApprovePlanRequest(session_id=session_id, decision=base.decision(decision))
        return base.plan(await self._unary(self._stub.ApprovePlan, req))

    async def cancel(self, session_id: str) -> None:
        await self._unary(self._stub.CancelSessionTools, pb.CancelSessionToolsRequest(session_id=session_id))

    async def upload(
        self, session_id: str, local_dir: str, dest: str = ".", *, timeout: float | None = None
    ) -> UploadSummary:
        """Copy the tree ``local_dir`` into ``dest``; see ``DispatcherClient.upload``."""
        return await self.upload_tar(session_id, base.in_thread(tar_chunks(local_dir)), dest, timeout=timeout)

    async def upload_tar(
        self,
        session_id: str,
        chunks: AsyncIterable[bytes] | Iterable[bytes],
        dest: str = ".",
        *,
        timeout: float | None = None,
    ) -> UploadSummary:
        """Send a tar stream to be unpacked into ``dest``."""

        async def requests() -> AsyncIterator[pb.UploadFilesRequest]:
            yield pb.UploadFilesRequest(target=pb.UploadFilesTarget(session_id=session_id, path=dest))
            if isinstance(chunks, AsyncIterable):
                async for chunk in chunks:
                    yield pb.UploadFilesRequest(chunk=chunk)
            else:
                for chunk in chunks:
                    yield pb.UploadFilesRequest(chunk=chunk)

        try:
            resp = await self._stub.UploadFiles(requests(), metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as err:
            raise RequestFailed.from_rpc_error(err) from None
        return base.upload_summary(resp)

    def download_tar(
        self, session_id: str, path: str = ".", *, timeout: float | None = None
    ) -> AsyncIterator[bytes]:
        """The chunks of a tar of a workspace file or directory, as the server sends them."""
        call = self._stub.DownloadFiles(
            pb.DownloadFilesRequest(session_id=session_id, path=path),
            metadata=self._metadata,
            timeout=timeout,
        )
        return self._stream(call, lambda resp: bytes(resp.chunk))

    async def download(
        self, session_id: str, path: str, local_dir: str, *, timeout: float | None = None
    ) -> Extracted:
        """Copy a workspace file or directory into ``local_dir``; unpacked on a worker thread."""
        box: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        work = asyncio.ensure_future(asyncio.to_thread(extract_chunks, iter(box.get, None), local_dir))

        def offer(item: bytes | None) -> None:
            while not work.done():
                try:
                    box.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue

        try:
            async for chunk in self.download_tar(session_id, path, timeout=timeout):
                if work.done():
                    break  # the extractor failed; its error is raised below
                await asyncio.to_thread(offer, chunk)
        except BaseException:
            await asyncio.to_thread(offer, None)
            await asyncio.gather(work, return_exceptions=True)
            raise
        await asyncio.to_thread(offer, None)
        return await work

    async def list_processes(self, session_id: str) -> list[ProcessInfo]:
        """The session's background processes, running and the finished ones kept, oldest first."""
        resp = await self._unary(self._stub.ListProcesses, pb.ListProcessesRequest(session_id=session_id))
        return [convert_processes.process_from_pb(p) for p in resp.processes]

    def watch_process(
        self, session_id: str, process_id: str, *, after: int = 0, from_end: bool = False
    ) -> AsyncIterator[WatchItem]:
        """A process's output from cursor ``after`` (``from_end``: only what comes from now), as
        ``OutputChunk``s tagged stdout/stderr, a ``ProcessTruncated`` where bytes were lost, and
        last its ``ProcessInfo`` once it ended; follows live until then.

        Raises:
            RequestFailed: e.g. NOT_FOUND (unknown process), UNAVAILABLE (watch again from the
                last cursor received), RESOURCE_EXHAUSTED (``max_watch_streams``).
        """
        call = self._stub.WatchProcess(
            pb.WatchProcessRequest(
                session_id=session_id, process_id=process_id, after=after, from_end=from_end
            ),
            metadata=self._metadata,
        )
        return self._stream(call, convert_processes.watch_item_from_pb)

    async def write_process_input(
        self, session_id: str, process_id: str, data: bytes | str, *, close_stdin: bool = False
    ) -> ProcessInfo:
        """Bytes (a str: its UTF-8) for the process's stdin, then its stdin closed if ``close_stdin``."""
        raw = data.encode() if isinstance(data, str) else data
        req = pb.WriteProcessInputRequest(
            session_id=session_id, process_id=process_id, data=raw, close_stdin=close_stdin
        )
        return convert_processes.process_from_pb(
            (await self._unary(self._stub.WriteProcessInput, req)).process
        )

    async def signal_process(
        self, session_id: str, process_id: str, signal: str = "TERM", *, grace_seconds: float | None = None
    ) -> ProcessInfo:
        """``signal`` (``TERM KILL INT HUP QUIT USR1 USR2``) to the process's whole group; with
        ``grace_seconds``, KILL follows if the group outlives it and the answer waits for its end.

        Raises:
            ValueError: an unknown signal name (nothing is sent).
        """
        req = base.signal_request(session_id, process_id, signal, grace_seconds)
        try:
            resp = await self._stub.SignalProcess(
                req, metadata=self._metadata, timeout=base.signal_timeout(self._timeout, grace_seconds)
            )
        except grpc.RpcError as err:
            raise RequestFailed.from_rpc_error(err) from None
        return convert_processes.process_from_pb(resp.process)

    async def list_code_contexts(self, session_id: str) -> list[CodeContext]:
        """The session's live ``run_code`` interpreters, oldest first."""
        req = pb.ListCodeContextsRequest(session_id=session_id)
        resp = await self._unary(self._stub.ListCodeContexts, req)
        return [convert_processes.code_context_from_pb(c) for c in resp.contexts]

    async def remove_code_context(
        self, session_id: str, context: str = "default", *, language: str = "python"
    ) -> CodeContext:
        """End one ``run_code`` interpreter (the next call of that language and context starts a
        fresh one); answers once it is gone.

        Raises:
            RequestFailed: NOT_FOUND (no such live context), INVALID_ARGUMENT.
        """
        req = pb.RemoveCodeContextRequest(session_id=session_id, language=language, context=context)
        resp = await self._unary(self._stub.RemoveCodeContext, req)
        return convert_processes.code_context_from_pb(resp.removed)

    @staticmethod
    async def _stream(call: Any, conv: Callable[[Any], _T | None]) -> AsyncIterator[_T]:
        try:
            async for resp in call:
                item = conv(resp)
                if item is not None:  # an event kind this client does not know: skipped
                    yield item
        except grpc.RpcError as err:
            raise RequestFailed.from_rpc_error(err) from None
        finally:
            call.cancel()
