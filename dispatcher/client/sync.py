"""The blocking client (``DispatcherClient``): one gRPC call per method, streams as iterators."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from dispatcher.client import base
from dispatcher.client.base import ClientBase, DispatchItem, RequestFailed
from dispatcher.client.ports import OpenedPort, opened_port
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


class DispatcherClient(ClientBase):
    """Blocking client; each streaming method returns an iterator that ``cancel()`` on close ends."""

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        home: str | None = None,
        channel: grpc.Channel | None = None,
        timeout: float | None = 30.0,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        super().__init__(token, home)
        self._owns_channel = channel is None
        if channel is None:
            channel = base.open_channel(grpc, target, tls_ca, tls_cert, tls_key)
        self._channel = channel
        self._stub = pb_grpc.ToolDispatcherStub(self._channel)
        self._timeout = timeout

    def __enter__(self) -> DispatcherClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()

    def _unary(self, method: Callable[..., _T], request: Any) -> _T:
        try:
            return method(request, metadata=self._metadata, timeout=self._timeout)
        except grpc.RpcError as err:
            raise RequestFailed.from_rpc_error(err) from None

    def create_session(
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
        """Open a session on ``workspace`` (a name under the tenant's root; created if missing).

        ``mode``: the approval mode (cautious, autonomous, manual, plan, review, audit); ``tools``,
        ``fs`` (``[(path, "r"|"rw")]``) and ``egress_allow`` (host patterns) narrow the tenant's
        capabilities for this session. ``ttl_seconds`` / ``idle_timeout_seconds`` (None: the
        server's; 0: none) and ``on_expire`` (``"close"`` | ``"pause"``) set its clocks;
        ``request_id`` makes the create retry-safe (the same id and request: the same session);
        ``snapshot_id`` starts it from that snapshot (its workspace new or empty, not with
        ``request_id``)."""
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
        return convert.session_from_pb(self._unary(self._stub.CreateSession, req).session)

    def get_session(self, session_id: str) -> SessionInfo:
        return convert.session_from_pb(
            self._unary(self._stub.GetSession, pb.GetSessionRequest(session_id=session_id)).session
        )

    def list_sessions(self) -> list[SessionInfo]:
        resp = self._unary(self._stub.ListSessions, pb.ListSessionsRequest())
        return [convert.session_from_pb(s) for s in resp.sessions]

    def close_session(self, session_id: str) -> None:
        self._unary(self._stub.CloseSession, pb.CloseSessionRequest(session_id=session_id))

    def renew_session(self, session_id: str, ttl_seconds: int) -> SessionInfo:
        """A new expiry ``ttl_seconds`` from now (0: none, if the tenant has no maximum)."""
        req = pb.RenewSessionRequest(session_id=session_id, ttl_seconds=ttl_seconds)
        return convert.session_from_pb(self._unary(self._stub.RenewSession, req).session)

    def session_usage(self, session_id: str) -> SessionUsage:
        """What the session's sandbox uses now (takes about a second: CPU is measured over one)."""
        req = pb.GetSessionUsageRequest(session_id=session_id)
        return convert_usage.usage_from_pb(self._unary(self._stub.GetSessionUsage, req))

    def snapshot_session(self, session_id: str, name: str = "") -> SnapshotInfo:
        """Copy the session's workspace and /tmp (its sandbox frozen for the copy) into a snapshot."""
        req = pb.SnapshotSessionRequest(session_id=session_id, name=name)
        return convert_snapshots.snapshot_from_pb(self._unary(self._stub.SnapshotSession, req))

    def list_snapshots(self) -> list[SnapshotInfo]:
        resp = self._unary(self._stub.ListSnapshots, pb.ListSnapshotsRequest())
        return [convert_snapshots.snapshot_from_pb(s) for s in resp.snapshots]

    def delete_snapshot(self, snapshot_id: str) -> int:
        """Remove the snapshot and its files; returns the bytes freed."""
        req = pb.DeleteSnapshotRequest(snapshot_id=snapshot_id)
        return int(self._unary(self._stub.DeleteSnapshot, req).freed_bytes)

    def fork_session(
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
        resp = self._unary(self._stub.ForkSession, req)
        return [convert_snapshots.fork_result_from_pb(r) for r in resp.results]

    def pause_session(self, session_id: str) -> SessionInfo:
        req = pb.PauseSessionRequest(session_id=session_id)
        return convert.session_from_pb(self._unary(self._stub.PauseSession, req).session)

    def resume_session(self, session_id: str) -> SessionInfo:
        req = pb.ResumeSessionRequest(session_id=session_id)
        return convert.session_from_pb(self._unary(self._stub.ResumeSession, req).session)

    def list_tools(self, session_id: str) -> list[ToolInfo]:
        resp = self._unary(self._stub.ListTools, pb.ListToolsRequest(session_id=session_id))
        return [convert.tool_from_pb(t) for t in resp.tools]

    def tools_for(self, session: str | SessionInfo, format: str) -> list[dict[str, Any]]:
        """The session's tools in a provider's shape (``"anthropic"``, ``"openai"`` or ``"mcp"``),
        ready to pass as that API's ``tools``.

        Raises:
            ValueError: another ``format``.
        """
        return base.definitions(self._unary(self._stub.ListTools, base.list_tools_request(session, format)))

    def dispatch(
        self,
        session_id: str,
        tool_uses: Sequence[ToolUseBlock | tuple[str, Any]],
        *,
        turn_id: str = "",
        ordering: str | None = None,
    ) -> Iterator[DispatchItem]:
        """Events and one ToolResultBlock per tool_use, as they come. Closing the iterator early
        cancels the call (and so its tools)."""
        return self._stream(self._dispatch_call(session_id, tool_uses, turn_id, ordering), base.dispatch_item)

    def call(
        self,
        session_id: str,
        name: str,
        tool_input: Mapping[str, Any] | str,
        *,
        tool_use_id: str | None = None,
        turn_id: str = "",
        on_event: Callable[[Event], None] | None = None,
    ) -> ToolResultBlock:
        """Run one tool and return its result; ``on_event`` sees the call's events as they come."""
        block = ToolUseBlock(tool_use_id or base.new_id(), name, tool_input)
        call = self._dispatch_call(session_id, [block], turn_id, None)
        # Events are converted only for someone who sees them.
        conv = base.dispatch_item if on_event is not None else base.result_item
        return base.only_result(self._stream(call, conv), on_event)

    def watch(self, session_id: str, after_seq: int = 0) -> Iterator[Event]:
        """Every event of the session after ``after_seq`` (history, then live) until it closes."""
        call = self._stub.WatchSession(
            pb.WatchSessionRequest(session_id=session_id, after_seq=after_seq), metadata=self._metadata
        )
        return self._stream(call, lambda r: convert.event_from_pb(r.event))

    def resolve_confirmation(
        self, session_id: str, request_id: str, decision: Decision | bool | str, *, remember: bool = False
    ) -> tuple[bool, Decision]:
        """Answer a confirmation request: (whether this answer decided it, the winning decision)."""
        req = pb.ResolveConfirmationRequest(
            session_id=session_id, request_id=request_id, decision=base.decision(decision), remember=remember
        )
        return base.resolved(self._unary(self._stub.ResolveConfirmation, req))

    def answer(
        self, session_id: str, request_id: str, decision: Decision | bool | str, *, remember: bool = False
    ) -> base.Answer:
        """``resolve_confirmation`` that also says whether the answer is remembered for the tool."""
        req = pb.ResolveConfirmationRequest(
            session_id=session_id, request_id=request_id, decision=base.decision(decision), remember=remember
        )
        return base.answered(self._unary(self._stub.ResolveConfirmation, req))

    def list_staged(self, session_id: str) -> list[StagedChangeInfo]:
        """A review or audit session's staged changes, oldest first, each with its unified diff."""
        resp = self._unary(self._stub.ListStagedChanges, pb.ListStagedChangesRequest(session_id=session_id))
        return [convert_staged.change_from_pb(c) for c in resp.changes]

    def apply_staged(self, session_id: str, ids: Sequence[str] = ()) -> StagedApplyResult:
        """Write staged changes (none listed: all): per file in review mode, all or none in audit."""
        req = pb.ApplyStagedChangesRequest(session_id=session_id, ids=list(ids))
        return convert_staged.apply_result_from_pb(self._unary(self._stub.ApplyStagedChanges, req))

    def discard_staged(self, session_id: str, ids: Sequence[str] = ()) -> list[str]:
        """Drop staged changes (none listed: all); returns the ids dropped."""
        req = pb.DiscardStagedChangesRequest(session_id=session_id, ids=list(ids))
        return list(self._unary(self._stub.DiscardStagedChanges, req).discarded_ids)

    def resolve_confirmations(
        self, session_id: str, decision: Decision | bool | str, request_ids: Sequence[str] = ()
    ) -> list[str]:
        """Answer a batch (none listed: every pending request); returns the ids this answer decided."""
        req = pb.ResolveConfirmationsRequest(
            session_id=session_id, decision=base.decision(decision), request_ids=list(request_ids)
        )
        return list(self._unary(self._stub.ResolveConfirmations, req).applied_request_ids)

    def approve_plan(
        self, session_id: str, decision: Decision | bool | str = True
    ) -> tuple[list[PlanStep], str]:
        """Approve (or deny) a plan-mode session's proposed steps: (the steps, the mode now)."""
        req = pb.ApprovePlanRequest(session_id=session_id, decision=base.decision(decision))
        return base.plan(self._unary(self._stub.ApprovePlan, req))

    def cancel(self, session_id: str) -> None:
        """Cancel every in-flight tool call of the session."""
        self._unary(self._stub.CancelSessionTools, pb.CancelSessionToolsRequest(session_id=session_id))

    def upload(
        self, session_id: str, local_dir: str, dest: str = ".", *, timeout: float | None = None
    ) -> UploadSummary:
        """Copy the tree ``local_dir`` into ``dest`` (a workspace directory, made if missing).

        Raises:
            RequestFailed: e.g. INVALID_ARGUMENT naming a refused member, RESOURCE_EXHAUSTED.
            LocalTreeError: the local tree holds a symlink or a special file.
        """
        return self.upload_tar(session_id, tar_chunks(local_dir), dest, timeout=timeout)

    def upload_tar(
        self, session_id: str, chunks: Iterable[bytes], dest: str = ".", *, timeout: float | None = None
    ) -> UploadSummary:
        """Send a tar stream (any iterable of byte chunks) to be unpacked into ``dest``."""
        failed: list[BaseException] = []
        requests = base.upload_requests(session_id, dest, chunks, failed)
        try:
            resp = self._unary_stream_in(self._stub.UploadFiles, requests, timeout)
        except RequestFailed:
            if failed:  # grpc reports a failing request iterator as UNKNOWN; say what failed
                raise failed[0] from None
            raise
        return base.upload_summary(resp)

    def _unary_stream_in(
        self, method: Callable[..., _T], requests: Iterator[Any], timeout: float | None
    ) -> _T:
        try:
            return method(requests, metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as err:
            raise RequestFailed.from_rpc_error(err) from None

    def download_tar(
        self, session_id: str, path: str = ".", *, timeout: float | None = None
    ) -> Iterator[bytes]:
        """The chunks of a tar of a workspace file or directory, as the server sends them."""
        call = self._stub.DownloadFiles(
            pb.DownloadFilesRequest(session_id=session_id, path=path),
            metadata=self._metadata,
            timeout=timeout,
        )
        return self._stream(call, lambda resp: bytes(resp.chunk))

    def download(
        self, session_id: str, path: str, local_dir: str, *, timeout: float | None = None
    ) -> Extracted:
        """Copy a workspace file or directory into ``local_dir`` (a directory's contents)."""
        return extract_chunks(self.download_tar(session_id, path, timeout=timeout), local_dir)

    def list_processes(self, session_id: str) -> list[ProcessInfo]:
        """The session's background processes, running and the finished ones kept, oldest first."""
        resp = self._unary(self._stub.ListProcesses, pb.ListProcessesRequest(session_id=session_id))
        return [convert_processes.process_from_pb(p) for p in resp.processes]

    def watch_process(
        self, session_id: str, process_id: str, *, after: int = 0, from_end: bool = False
    ) -> Iterator[WatchItem]:
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

    def write_process_input(
        self, session_id: str, process_id: str, data: bytes | str, *, close_stdin: bool = False
    ) -> ProcessInfo:
        """Bytes (a str: its UTF-8) for the process's stdin, then its stdin closed if ``close_stdin``."""
        raw = data.encode() if isinstance(data, str) else data
        req = pb.WriteProcessInputRequest(
            session_id=session_id, process_id=process_id, data=raw, close_stdin=close_stdin
        )
        return convert_processes.process_from_pb((self._unary(self._stub.WriteProcessInput, req)).process)

    def open_port(
        self, session_id: str, port: int, *, expires_in_seconds: int = 0, public: bool = False
    ) -> OpenedPort:
        """Open a sandbox port to the preview gateway (OpenPort): its URL and token (see the
        asyncio client's ``open_port``)."""
        req = pb.OpenPortRequest(
            session_id=session_id, port=port, expires_in_seconds=expires_in_seconds, public=public
        )
        return opened_port(self._unary(self._stub.OpenPort, req))

    def close_port(self, session_id: str, port: int) -> None:
        """Close an open port (ClosePort): its token stops working, its connections are cut."""
        self._unary(self._stub.ClosePort, pb.ClosePortRequest(session_id=session_id, port=port))

    def signal_process(
        self, session_id: str, process_id: str, signal: str = "TERM", *, grace_seconds: float | None = None
    ) -> ProcessInfo:
        """``signal`` (``TERM KILL INT HUP QUIT USR1 USR2``) to the process's whole group; with
        ``grace_seconds``, KILL follows if the group outlives it and the answer waits for its end.

        Raises:
            ValueError: an unknown signal name (nothing is sent).
        """
        req = base.signal_request(session_id, process_id, signal, grace_seconds)
        try:
            resp = self._stub.SignalProcess(
                req, metadata=self._metadata, timeout=base.signal_timeout(self._timeout, grace_seconds)
            )
        except grpc.RpcError as err:
            raise RequestFailed.from_rpc_error(err) from None
        return convert_processes.process_from_pb(resp.process)

    def list_code_contexts(self, session_id: str) -> list[CodeContext]:
        """The session's live ``run_code`` interpreters, oldest first."""
        req = pb.ListCodeContextsRequest(session_id=session_id)
        resp = self._unary(self._stub.ListCodeContexts, req)
        return [convert_processes.code_context_from_pb(c) for c in resp.contexts]

    def remove_code_context(
        self, session_id: str, context: str = "default", *, language: str = "python"
    ) -> CodeContext:
        """End one ``run_code`` interpreter (the next call of that language and context starts a
        fresh one); answers once it is gone.

        Raises:
            RequestFailed: NOT_FOUND (no such live context), INVALID_ARGUMENT.
        """
        req = pb.RemoveCodeContextRequest(session_id=session_id, language=language, context=context)
        resp = self._unary(self._stub.RemoveCodeContext, req)
        return convert_processes.code_context_from_pb(resp.removed)

    @staticmethod
    def _stream(call: Any, conv: Callable[[Any], _T | None]) -> Iterator[_T]:
        try:
            for resp in call:
                item = conv(resp)
                if item is not None:  # an event kind this client does not know: skipped
                    yield item
        except grpc.RpcError as err:
            raise RequestFailed.from_rpc_error(err) from None
        finally:
            call.cancel()  # a no-op when the stream ended; cancels the RPC when abandoned
