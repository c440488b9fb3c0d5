"""What the blocking and the asyncio clients share: building requests, reading responses, the
channel and its TLS credentials, and ``RequestFailed``."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from dispatcher.config import ENV_TLS_CA, client_token, default_target
from dispatcher.core.approval.broker import Decision
from dispatcher.core.approval.modes import parse_mode
from dispatcher.core.errors import DispatcherError
from dispatcher.core.events.bus import Event
from dispatcher.core.sessions.clock import OnExpire
from dispatcher.core.sessions.state import PlanStep
from dispatcher.core.transfer import UploadSummary
from dispatcher.core.types import Role, ToolResultBlock, ToolUseBlock
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.wire import convert, convert_policy, convert_processes

DispatchItem = Event | ToolResultBlock
_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 30_000),
)


def upload_requests(
    session_id: str, dest: str, chunks: Iterable[bytes], failed: list[BaseException]
) -> Iterator[pb.UploadFilesRequest]:
    yield pb.UploadFilesRequest(target=pb.UploadFilesTarget(session_id=session_id, path=dest))
    try:
        for chunk in chunks:
            yield pb.UploadFilesRequest(chunk=chunk)
    except Exception as exc:
        failed.append(exc)
        raise


def upload_summary(resp: pb.UploadFilesResponse) -> UploadSummary:
    return UploadSummary(files=resp.files, directories=resp.directories, bytes=resp.bytes)


async def in_thread(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
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


def new_id() -> str:
    return f"tu_{secrets.token_hex(8)}"


def tool_use(item: ToolUseBlock | tuple[str, Any]) -> pb.ToolUse:
    block = item if isinstance(item, ToolUseBlock) else ToolUseBlock(new_id(), item[0], item[1])
    return convert.tool_use_to_pb(block)


def decision(value: Decision | bool | str) -> pb.Decision.ValueType:
    if isinstance(value, bool):
        value = Decision.ALLOW if value else Decision.DENY
    return convert.decision_to_pb(Decision(value))


def list_tools_request(session: str | convert.SessionInfo, format: str) -> pb.ListToolsRequest:
    """ListTools for ``session`` (its id, or what ``create_session`` returned) with ``format``.

    Raises:
        ValueError: ``format`` is not ``openai``, ``anthropic`` or ``mcp``.
    """
    session_id = session if isinstance(session, str) else session.session_id
    try:
        value = convert.tool_format_to_pb(format)
    except ValueError:
        raise ValueError(f"format {format!r}: expected 'openai', 'anthropic' or 'mcp'") from None
    return pb.ListToolsRequest(session_id=session_id, format=value)


def definitions(resp: pb.ListToolsResponse) -> list[dict[str, Any]]:
    """The provider-shaped definitions of a ListTools answer."""
    parsed: list[dict[str, Any]] = json.loads(resp.definitions_json)
    return parsed


def dispatch_request(
    session_id: str, tool_uses: Sequence[ToolUseBlock | tuple[str, Any]], turn_id: str, ordering: str | None
) -> pb.DispatchRequest:
    """One assistant message's tool_uses as a DispatchRequest (``ordering`` None: the server's)."""
    return pb.DispatchRequest(
        session_id=session_id,
        turn_id=turn_id,
        tool_uses=[tool_use(t) for t in tool_uses],
        ordering=convert.ordering_to_pb(ordering),
    )


def dispatch_item(resp: pb.DispatchResponse) -> DispatchItem | None:
    if resp.WhichOneof("item") == "result":
        return convert.result_from_pb(resp.result)
    return convert.event_from_pb(resp.event)


def result_item(resp: pb.DispatchResponse) -> ToolResultBlock | None:
    """The result of a response, None for an event: a caller nobody shows events to does not
    convert them."""
    if resp.WhichOneof("item") == "result":
        return convert.result_from_pb(resp.result)
    return None


def create_request(
    workspace: str,
    role: Role,
    labels: Mapping[str, str] | None,
    mode: str | None,
    tools: Sequence[str] | None,
    fs: Sequence[tuple[str, str]] | None,
    *,
    egress_allow: Sequence[str] | None = None,
    ttl_seconds: int | None = None,
    idle_timeout_seconds: int | None = None,
    on_expire: str | None = None,
    request_id: str = "",
    snapshot_id: str = "",
) -> pb.CreateSessionRequest:
    """Every field of CreateSessionRequest; None (or empty) leaves a field to the server's default."""
    req = pb.CreateSessionRequest(
        workspace=workspace,
        role=convert.role_to_pb(role),
        labels=dict(labels or {}),
        request_id=request_id,
        snapshot_id=snapshot_id,
    )
    if mode:
        req.approval_mode = convert_policy.mode_to_pb(parse_mode(mode))
    caps = convert_policy.session_capabilities_to_pb(tools, fs, egress_allow)
    if caps is not None:
        req.capabilities.CopyFrom(caps)
    if ttl_seconds is not None:
        req.ttl_seconds = ttl_seconds
    if idle_timeout_seconds is not None:
        req.idle_timeout_seconds = idle_timeout_seconds
    if on_expire is not None:
        req.on_expire = pb.OnExpire.Value(f"ON_EXPIRE_{OnExpire(on_expire).name}")
    return req


def signal_request(
    session_id: str, process_id: str, signal: str, grace_seconds: float | None
) -> pb.SignalProcessRequest:
    """A SignalProcess request; ``signal`` by name (``TERM``, ``SIGTERM``, any case).

    Raises:
        ValueError: not a signal the service sends, naming those it does.
    """
    req = pb.SignalProcessRequest(
        session_id=session_id, process_id=process_id, signal=convert_processes.signal_to_pb(signal)
    )
    if grace_seconds is not None:
        req.grace_seconds = grace_seconds
    return req


def signal_timeout(timeout: float | None, grace_seconds: float | None) -> float | None:
    """A SignalProcess with a grace answers once the group is empty: wait that long, and more."""
    if timeout is None or grace_seconds is None:
        return timeout
    return max(timeout, grace_seconds + timeout)


def plan(resp: pb.ApprovePlanResponse) -> tuple[list[PlanStep], str]:
    steps = [convert_policy.plan_step_from_pb(s) for s in resp.steps]
    return steps, str(convert_policy.mode_from_pb(resp.approval_mode) or "cautious")


def resolved(resp: pb.ResolveConfirmationResponse) -> tuple[bool, Decision]:
    return resp.applied, convert.decision_from_pb(resp.decision) or Decision.DENY


@dataclass(frozen=True, slots=True)
class Answer:
    """What a ResolveConfirmation did (``answer``): whether this answer decided the request, the
    winning decision, and whether it is remembered for the tool for the rest of the session."""

    applied: bool
    decision: Decision
    remembered: bool


def answered(resp: pb.ResolveConfirmationResponse) -> Answer:
    applied, decision = resolved(resp)
    return Answer(applied, decision, resp.remembered)


def only_result(items: Iterator[DispatchItem], on_event: Callable[[Event], None] | None) -> ToolResultBlock:
    result: ToolResultBlock | None = None
    for item in items:
        if isinstance(item, ToolResultBlock):
            result = item
        elif on_event is not None:
            on_event(item)
    if result is None:
        raise RequestFailed("INTERNAL", "the Dispatch stream ended without a result")
    return result


class ClientBase:
    """The bearer token both clients send (argument, else ``DISPATCHER_TOKEN`` or the home's file)."""

    _stub: Any  # the generated stub over the subclass's channel (sync or grpc.aio)

    def __init__(self, token: str | None, home: str | None) -> None:
        token = token if token is not None else client_token(home)
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()

    def _dispatch_call(
        self,
        session_id: str,
        tool_uses: Sequence[ToolUseBlock | tuple[str, Any]],
        turn_id: str,
        ordering: str | None,
    ) -> Any:
        """The Dispatch call (a response iterator: sync or grpc.aio, as the stub is)."""
        return self._stub.Dispatch(
            dispatch_request(session_id, tool_uses, turn_id, ordering), metadata=self._metadata
        )


def credentials(
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


def open_channel(
    api: Any, target: str | None, tls_ca: str | None, tls_cert: str | None, tls_key: str | None
) -> Any:
    """A channel from ``api`` (``grpc`` or ``grpc.aio``: same call shapes), TLS when a CA is known."""
    creds = credentials(tls_ca, tls_cert, tls_key)
    addr = target or default_target()
    if creds is None:
        return api.insecure_channel(addr, options=_CHANNEL_OPTIONS)
    return api.secure_channel(addr, creds, options=_CHANNEL_OPTIONS)
