"""Python client of the dispatcher service; hides the generated stubs behind domain objects.

Sync::

    with DispatcherClient() as client:                 # 127.0.0.1:50051, token from ~/.dispatcher/token
        session = client.create_session("demo")
        result = client.call(session.session_id, "read_file", {"path": "README.md"})
        for item in client.dispatch(session.session_id, [ToolUseBlock("t1", "shell", {"command": "ls"})]):
            ...                                        # Event ... then ToolResultBlock

Async: ``AsyncDispatcherClient`` has the same methods as coroutines / async iterators.

The target defaults to ``DISPATCHER_LISTEN`` (else 127.0.0.1:50051); the token to ``DISPATCHER_TOKEN``
(else ``<DISPATCHER_HOME or ~/.dispatcher>/token``); TLS is used when a CA file is given
(``tls_ca=`` or ``DISPATCHER_TLS_CA``), with ``tls_cert``/``tls_key`` for mutual TLS. Request failures raise ``RequestFailed`` carrying
the gRPC status name; tool failures are results with ``is_error``.
"""

from __future__ import annotations

import asyncio
import os
import queue
import secrets
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from dispatcher.config import ENV_TLS_CA, client_token, default_target
from dispatcher.core.approval import PlanStep, parse_mode
from dispatcher.core.dispatcher import Decision
from dispatcher.core.errors import DispatcherError
from dispatcher.core.events import Event
from dispatcher.core.transfer import UploadSummary
from dispatcher.core.types import Role, ToolResultBlock, ToolUseBlock
from dispatcher.trees import Extracted, LocalTreeError, extract_chunks, tar_chunks
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from dispatcher.wire import convert, convert_policy
from dispatcher.wire.convert import SessionInfo, ToolInfo

__all__ = [
    "AsyncDispatcherClient",
    "Decision",
    "DispatcherClient",
    "Event",
    "Extracted",
    "LocalTreeError",
    "RequestFailed",
    "Role",
    "SessionInfo",
    "ToolInfo",
    "ToolResultBlock",
    "ToolUseBlock",
    "UploadSummary",
]

DispatchItem = Event | ToolResultBlock
_T = TypeVar("_T")
_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 30_000),
)


def _upload_requests(
    session_id: str, dest: str, chunks: Iterable[bytes], failed: list[BaseException]
) -> Iterator[pb.UploadFilesRequest]:
    yield pb.UploadFilesRequest(target=pb.UploadFilesTarget(session_id=session_id, path=dest))
    try:
        for chunk in chunks:
            yield pb.UploadFilesRequest(chunk=chunk)
    except Exception as exc:
        failed.append(exc)
        raise


def _summary(resp: pb.UploadFilesResponse) -> UploadSummary:
    return UploadSummary(files=resp.files, directories=resp.directories, bytes=resp.bytes)


async def _in_thread(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """A blocking iterator (local file reads) stepped on a worker thread."""
    while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
        yield chunk


class RequestFailed(DispatcherError):
    """The server refused a request (a gRPC status other than OK); ``code`` is e.g. ``NOT_FOUND``."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> RequestFailed:
        code = err.code() if hasattr(err, "code") else None
        details = err.details() if hasattr(err, "details") else str(err)
        return cls(code.name if code is not None else "UNKNOWN", details or "")


def _new_id() -> str:
    return f"tu_{secrets.token_hex(8)}"


def _tool_use(item: ToolUseBlock | tuple[str, Any]) -> pb.ToolUse:
    block = item if isinstance(item, ToolUseBlock) else ToolUseBlock(_new_id(), item[0], item[1])
    return convert.tool_use_to_pb(block)


def _decision(value: Decision | bool | str) -> pb.Decision.ValueType:
    if isinstance(value, bool):
        value = Decision.ALLOW if value else Decision.DENY
    return convert.decision_to_pb(Decision(value))


def _item(resp: pb.DispatchResponse) -> DispatchItem:
    if resp.WhichOneof("item") == "result":
        return convert.result_from_pb(resp.result)
    return convert.event_from_pb(resp.event)


def _create_request(
    workspace: str,
    role: Role,
    labels: Mapping[str, str] | None,
    mode: str | None,
    tools: Sequence[str] | None,
    fs: Sequence[tuple[str, str]] | None,
) -> pb.CreateSessionRequest:
    req = pb.CreateSessionRequest(
        workspace=workspace, role=convert.role_to_pb(role), labels=dict(labels or {})
    )
    if mode:
        req.approval_mode = convert_policy.mode_to_pb(parse_mode(mode))
    caps = convert_policy.session_capabilities_to_pb(tools, fs)
    if caps is not None:
        req.capabilities.CopyFrom(caps)
    return req


def _plan(resp: pb.ApprovePlanResponse) -> tuple[list[PlanStep], str]:
    steps = [convert_policy.plan_step_from_pb(s) for s in resp.steps]
    return steps, str(convert_policy.mode_from_pb(resp.approval_mode) or "cautious")


def _resolved(resp: pb.ResolveConfirmationResponse) -> tuple[bool, Decision]:
    return resp.applied, convert.decision_from_pb(resp.decision) or Decision.DENY


def _only_result(items: Iterator[DispatchItem], on_event: Callable[[Event], None] | None) -> ToolResultBlock:
    result: ToolResultBlock | None = None
    for item in items:
        if isinstance(item, ToolResultBlock):
            result = item
        elif on_event is not None:
            on_event(item)
    if result is None:
        raise RequestFailed("INTERNAL", "the Dispatch stream ended without a result")
    return result


class _Base:
    def __init__(self, token: str | None, home: str | None) -> None:
        token = token if token is not None else client_token(home)
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()


def _credentials(
    tls_ca: str | None, tls_cert: str | None, tls_key: str | None
) -> grpc.ChannelCredentials | None:
    """TLS credentials when a CA is given (argument, else ``DISPATCHER_TLS_CA``); None for plaintext."""
    tls_ca = tls_ca or os.environ.get(ENV_TLS_CA)
    if not tls_ca:
        return None
    with open(tls_ca, "rb") as fh:
        root = fh.read()
    chain = key = None
    if tls_cert and tls_key:
        with open(tls_cert, "rb") as fh:
            chain = fh.read()
        with open(tls_key, "rb") as fh:
            key = fh.read()
    return grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=chain)


def _open_channel(
    api: Any, target: str | None, tls_ca: str | None, tls_cert: str | None, tls_key: str | None
) -> Any:
    """A channel from ``api`` (``grpc`` or ``grpc.aio``: same call shapes), TLS when a CA is known."""
    creds = _credentials(tls_ca, tls_cert, tls_key)
    addr = target or default_target()
    if creds is None:
        return api.insecure_channel(addr, options=_CHANNEL_OPTIONS)
    return api.secure_channel(addr, creds, options=_CHANNEL_OPTIONS)


class DispatcherClient(_Base):
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
            channel = _open_channel(grpc, target, tls_ca, tls_cert, tls_key)
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
    ) -> SessionInfo:
        """Open a session on ``workspace`` (a name under the tenant's root; created if missing).

        ``mode``: the approval mode (cautious, autonomous, manual, plan, review, audit); ``tools``
        and ``fs`` (``[(path, "r"|"rw")]``) narrow the tenant's capabilities for this session."""
        req = _create_request(workspace, role, labels, mode, tools, fs)
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

    def list_tools(self, session_id: str) -> list[ToolInfo]:
        resp = self._unary(self._stub.ListTools, pb.ListToolsRequest(session_id=session_id))
        return [convert.tool_from_pb(t) for t in resp.tools]

    def dispatch(
        self, session_id: str, tool_uses: Sequence[ToolUseBlock | tuple[str, Any]], *, turn_id: str = ""
    ) -> Iterator[DispatchItem]:
        """Events and one ToolResultBlock per tool_use, as they come. Closing the iterator early
        cancels the call (and so its tools)."""
        req = pb.DispatchRequest(
            session_id=session_id, turn_id=turn_id, tool_uses=[_tool_use(t) for t in tool_uses]
        )
        call = self._stub.Dispatch(req, metadata=self._metadata)
        return self._stream(call, _item)

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
        block = ToolUseBlock(tool_use_id or _new_id(), name, tool_input)
        return _only_result(self.dispatch(session_id, [block], turn_id=turn_id), on_event)

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
            session_id=session_id, request_id=request_id, decision=_decision(decision), remember=remember
        )
        return _resolved(self._unary(self._stub.ResolveConfirmation, req))

    def resolve_confirmations(
        self, session_id: str, decision: Decision | bool | str, request_ids: Sequence[str] = ()
    ) -> list[str]:
        """Answer a batch (none listed: every pending request); returns the ids this answer decided."""
        req = pb.ResolveConfirmationsRequest(
            session_id=session_id, decision=_decision(decision), request_ids=list(request_ids)
        )
        return list(self._unary(self._stub.ResolveConfirmations, req).applied_request_ids)

    def approve_plan(
        self, session_id: str, decision: Decision | bool | str = True
    ) -> tuple[list[PlanStep], str]:
        """Approve (or deny) a plan-mode session's proposed steps: (the steps, the mode now)."""
        req = pb.ApprovePlanRequest(session_id=session_id, decision=_decision(decision))
        return _plan(self._unary(self._stub.ApprovePlan, req))

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
        requests = _upload_requests(session_id, dest, chunks, failed)
        try:
            resp = self._unary_stream_in(self._stub.UploadFiles, requests, timeout)
        except RequestFailed:
            if failed:  # grpc reports a failing request iterator as UNKNOWN; say what failed
                raise failed[0] from None
            raise
        return _summary(resp)

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

    @staticmethod
    def _stream(call: Any, conv: Callable[[Any], _T]) -> Iterator[_T]:
        try:
            for resp in call:
                yield conv(resp)
        except grpc.RpcError as err:
            raise RequestFailed.from_rpc_error(err) from None
        finally:
            call.cancel()  # a no-op when the stream ended; cancels the RPC when abandoned


class AsyncDispatcherClient(_Base):
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
            channel = _open_channel(grpc.aio, target, tls_ca, tls_cert, tls_key)
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
    ) -> SessionInfo:
        req = _create_request(workspace, role, labels, mode, tools, fs)
        return convert.session_from_pb((await self._unary(self._stub.CreateSession, req)).session)

    async def get_session(self, session_id: str) -> SessionInfo:
        resp = await self._unary(self._stub.GetSession, pb.GetSessionRequest(session_id=session_id))
        return convert.session_from_pb(resp.session)

    async def list_sessions(self) -> list[SessionInfo]:
        resp = await self._unary(self._stub.ListSessions, pb.ListSessionsRequest())
        return [convert.session_from_pb(s) for s in resp.sessions]

    async def close_session(self, session_id: str) -> None:
        await self._unary(self._stub.CloseSession, pb.CloseSessionRequest(session_id=session_id))

    async def list_tools(self, session_id: str) -> list[ToolInfo]:
        resp = await self._unary(self._stub.ListTools, pb.ListToolsRequest(session_id=session_id))
        return [convert.tool_from_pb(t) for t in resp.tools]

    async def dispatch(
        self, session_id: str, tool_uses: Sequence[ToolUseBlock | tuple[str, Any]], *, turn_id: str = ""
    ) -> AsyncIterator[DispatchItem]:
        req = pb.DispatchRequest(
            session_id=session_id, turn_id=turn_id, tool_uses=[_tool_use(t) for t in tool_uses]
        )
        call = self._stub.Dispatch(req, metadata=self._metadata)
        async for item in self._stream(call, _item):
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
        block = ToolUseBlock(tool_use_id or _new_id(), name, tool_input)
        result: ToolResultBlock | None = None
        async for item in self.dispatch(session_id, [block], turn_id=turn_id):
            if isinstance(item, ToolResultBlock):
                result = item
            elif on_event is not None:
                on_event(item)
        if result is None:
            raise RequestFailed("INTERNAL", "the Dispatch stream ended without a result")
        return result

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
            session_id=session_id, request_id=request_id, decision=_decision(decision), remember=remember
        )
        return _resolved(await self._unary(self._stub.ResolveConfirmation, req))

    async def resolve_confirmations(
        self, session_id: str, decision: Decision | bool | str, request_ids: Sequence[str] = ()
    ) -> list[str]:
        req = pb.ResolveConfirmationsRequest(
            session_id=session_id, decision=_decision(decision), request_ids=list(request_ids)
        )
        return list((await self._unary(self._stub.ResolveConfirmations, req)).applied_request_ids)

    async def approve_plan(
        self, session_id: str, decision: Decision | bool | str = True
    ) -> tuple[list[PlanStep], str]:
        req = pb.ApprovePlanRequest(session_id=session_id, decision=_decision(decision))
        return _plan(await self._unary(self._stub.ApprovePlan, req))

    async def cancel(self, session_id: str) -> None:
        await self._unary(self._stub.CancelSessionTools, pb.CancelSessionToolsRequest(session_id=session_id))

    async def upload(
        self, session_id: str, local_dir: str, dest: str = ".", *, timeout: float | None = None
    ) -> UploadSummary:
        """Copy the tree ``local_dir`` into ``dest``; see ``DispatcherClient.upload``."""
        return await self.upload_tar(session_id, _in_thread(tar_chunks(local_dir)), dest, timeout=timeout)

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
        return _summary(resp)

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

    @staticmethod
    async def _stream(call: Any, conv: Callable[[Any], _T]) -> AsyncIterator[_T]:
        try:
            async for resp in call:
                yield conv(resp)
        except grpc.RpcError as err:
            raise RequestFailed.from_rpc_error(err) from None
        finally:
            call.cancel()
