"""The server's MCP endpoint (config ``mcp_endpoint``): MCP's streamable HTTP transport, one
dispatcher session per MCP session.

Each MCP session is a ``SessionBridge`` over its own gRPC client of this same server, on loopback,
carrying the bearer token that opened it: authentication, tenancy, quotas and policy are the gRPC
side's, unchanged. The endpoint adds what only it can know: which token owns an MCP session (a
request with another gets 404, as if it did not exist), how many MCP sessions a tenant holds
(``max_sessions_per_tenant``, then 429), and when a session ends (DELETE, or idle past
``idle_timeout_seconds``: its dispatcher session is closed then, unless ``keep_sessions``).

Protocol revisions: sessions are a handshake-era notion (2025-11-25 and earlier); 2026-07-28 made
every HTTP request self-contained, with nothing to hang a sandbox's life on. A 2026-07-28 request
is answered with ``UNSUPPORTED_PROTOCOL_VERSION`` naming the handshake versions, which the SDKs'
``auto`` mode takes as "fall back to initialize". ``dispatcher mcp`` (stdio) serves both.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import mcp_types as mt
import uvicorn
from mcp.server.runner import serve_loop
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.transport_security import (
    DEFAULT_MAX_REQUEST_BODY_SIZE,
    RequestBodyLimitMiddleware,
    TransportSecuritySettings,
)
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from dispatcher.client.aio import AsyncDispatcherClient
from dispatcher.client.base import RequestFailed
from dispatcher.config.sections import McpEndpointSection
from dispatcher.core.approval.modes import parse_mode
from dispatcher.mcp_server.bridge import SessionBridge

log = logging.getLogger("dispatcher.mcp_server.http")

Authenticate = Callable[[str | None], str | None]
"""An ``Authorization`` header value to the tenant id of its token; None: no valid token."""
HTTP_LABEL = "dispatcher.mcp"
_STATUS_FOR = {
    "NOT_FOUND": 404,
    "INVALID_ARGUMENT": 400,
    "RESOURCE_EXHAUSTED": 429,
    "PERMISSION_DENIED": 403,
    "UNAVAILABLE": 503,  # the server is stopping
}


@dataclass(frozen=True, slots=True)
class Opening:
    """What the URL's query asks of a new MCP session."""

    session_id: str | None = None
    workspace: str = "default"
    mode: str | None = None
    tools: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, query: str) -> Opening:
        """Raises: ValueError with what is wrong, for the client to fix its URL."""
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(query, keep_blank_values=True).items()}
        unknown = set(q) - {"session", "workspace", "mode", "tools"}
        if unknown:
            raise ValueError(
                f"unknown query parameter(s) {', '.join(sorted(unknown))}: "
                "expected workspace, mode, tools (a,b) or session"
            )
        if q.get("session") and ("workspace" in q or "mode" in q):
            raise ValueError("workspace and mode are for a new session, not with session=")
        if q.get("mode"):
            parse_mode(q["mode"])  # the client checks it too, but would say so with a traceback
        tools = tuple(t for t in q.get("tools", "").split(",") if t) or None
        if "tools" in q and tools is None:
            raise ValueError("tools= names no tool (expected e.g. tools=read_file,shell)")
        return cls(q.get("session") or None, q.get("workspace") or "default", q.get("mode") or None, tools)


@dataclass(eq=False)
class _Entry:
    tenant: str
    token_sha256: str
    transport: StreamableHTTPServerTransport
    bridge: SessionBridge
    created: bool
    done: anyio.Event = field(default_factory=anyio.Event)


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: it would take SIGTERM from the server, which stops
    the endpoint itself (``aclose``) after its graceful drain."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class McpEndpoint:
    """The streamable HTTP endpoint, served by uvicorn on the server's event loop."""

    def __init__(
        self,
        settings: McpEndpointSection,
        grpc_target: str,
        authenticate: Authenticate,
        *,
        max_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_SIZE,
    ) -> None:
        """``max_body_bytes``: the largest request body read (a larger one is 413, unread)."""
        self.settings = settings
        self._max_body = max_body_bytes
        self._target = grpc_target
        self._authenticate = authenticate
        self._sessions: dict[str, _Entry] = {}
        self._opening: Counter[str] = Counter()
        self._tg: anyio.abc.TaskGroup | None = None
        self._runner: asyncio.Task[None] | None = None
        self._uvicorn: _Uvicorn | None = None
        self.port = 0

    def sessions_of(self, tenant: str) -> int:
        """MCP sessions ``tenant`` holds open now."""
        return sum(1 for e in self._sessions.values() if e.tenant == tenant)

    async def start(self) -> int:
        """Bind and serve; returns the bound port.

        Raises:
            OSError: the listen address cannot be bound.
        """
        host, _, port = self.settings.listen.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, int(port)))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        app = RequestBodyLimitMiddleware(self._app, self._max_body)
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self._uvicorn = _Uvicorn(config)
        ready = asyncio.Event()
        self._runner = asyncio.create_task(self._run(sock, ready), name="mcp-endpoint")
        await ready.wait()
        return self.port

    async def _run(self, sock: socket.socket, ready: asyncio.Event) -> None:
        assert self._uvicorn is not None
        async with anyio.create_task_group() as tg:
            self._tg = tg
            ready.set()
            await self._uvicorn.serve(sockets=[sock])
            tg.cancel_scope.cancel()  # uvicorn stopped: the sessions' loops end (aclose closed them)

    async def aclose(self) -> None:
        """End every MCP session (closing the dispatcher sessions they created), then stop serving."""
        for sid, entry in list(self._sessions.items()):
            await self._end(sid, entry)
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._runner is not None:
            await asyncio.gather(self._runner, return_exceptions=True)

    # --- HTTP --------------------------------------------------------------------------------------

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.settings.path:
            await _error(404, mt.INVALID_REQUEST, f"not found: the MCP endpoint is {self.settings.path}")(
                scope, receive, send
            )
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        authorization = headers.get("authorization")
        tenant = self._authenticate(authorization)
        if tenant is None:
            response = _error(
                401, mt.INVALID_REQUEST, "missing or unknown bearer token (Authorization: Bearer ...)"
            )
            response.headers["WWW-Authenticate"] = 'Bearer realm="dispatcher"'
            await response(scope, receive, send)
            return
        assert authorization is not None
        token = authorization.strip().partition(" ")[2].strip()
        version = headers.get(MCP_PROTOCOL_VERSION_HEADER.lower())
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            await _unsupported(version)(scope, receive, send)
            return
        digest = hashlib.sha256(token.encode("utf-8")).hexdigest()
        sid = headers.get(MCP_SESSION_ID_HEADER.lower())
        if sid is not None:
            entry = self._sessions.get(sid)
            if entry is None or entry.token_sha256 != digest:
                await _error(404, mt.INVALID_REQUEST, "Session not found")(scope, receive, send)
                return
            await entry.transport.handle_request(scope, receive, send)
            if entry.transport.is_terminated:  # DELETE: the client ended it
                await self._end(sid, entry)
            return
        await self._open(scope, receive, send, tenant, token, digest)

    async def _open(
        self, scope: Scope, receive: Receive, send: Send, tenant: str, token: str, digest: str
    ) -> None:
        try:
            opening = Opening.parse(scope.get("query_string", b"").decode("latin-1"))
        except ValueError as exc:
            await _error(400, mt.INVALID_PARAMS, str(exc))(scope, receive, send)
            return
        # Counted from the check on, while its session is made (no await between the check and
        # the count): openings of other tenants, and of this one, do not wait for each other.
        if self.sessions_of(tenant) + self._opening[tenant] >= self.settings.max_sessions_per_tenant:
            await _error(
                429,
                mt.INVALID_REQUEST,
                f"tenant {tenant!r} holds {self.settings.max_sessions_per_tenant} MCP sessions "
                "(mcp_endpoint.max_sessions_per_tenant): end one (HTTP DELETE) or let one go idle",
            )(scope, receive, send)
            return
        self._opening[tenant] += 1
        try:
            made = await self._bridge(opening, token)
            if isinstance(made, RequestFailed):
                status = _STATUS_FOR.get(made.code, 502)
                await _error(status, mt.INVALID_PARAMS, f"{made.code}: {made.details}")(scope, receive, send)
                return
            bridge = made
            mcp_sid = uuid.uuid4().hex
            transport = StreamableHTTPServerTransport(
                mcp_session_id=mcp_sid,
                security_settings=_security(self.settings.listen),
                idle_timeout=self.settings.idle_timeout_seconds,
            )
            entry = _Entry(tenant, digest, transport, bridge, created=not opening.session_id)
            self._sessions[mcp_sid] = entry
        finally:
            self._opening[tenant] -= 1
        assert self._tg is not None
        answered: list[int] = []

        async def watched(message: Any) -> None:
            if message["type"] == "http.response.start":
                answered.append(message["status"])
            await send(message)

        try:
            await self._tg.start(self._serve, mcp_sid, entry)
            await transport.handle_request(scope, receive, watched)
        finally:
            # Only an initialize opens a session: anything else refused leaves nothing behind.
            if not answered or answered[0] >= 400 or transport.is_terminated:
                with anyio.CancelScope(shield=True):
                    await self._end(mcp_sid, entry)

    async def _bridge(self, opening: Opening, token: str) -> SessionBridge | RequestFailed:
        """A bridge to the session the URL names, or to a new one; the server's refusal otherwise."""
        client = AsyncDispatcherClient(self._target, token=token)
        try:
            if opening.session_id:
                info = await client.get_session(opening.session_id)
            else:
                info = await client.create_session(
                    opening.workspace, mode=opening.mode, tools=opening.tools, labels={HTTP_LABEL: "http"}
                )
        except RequestFailed as exc:
            await client.close()
            return exc
        except BaseException:
            await client.close()
            raise
        return SessionBridge(client, info.session_id, tools=opening.tools)

    async def _serve(
        self,
        mcp_sid: str,
        entry: _Entry,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        server = entry.bridge.server()
        try:
            async with entry.transport.connect() as (read, write):
                task_status.started()
                scope = entry.transport.idle_scope or anyio.CancelScope()
                with scope:
                    await serve_loop(server, read, write, lifespan_state={}, session_id=mcp_sid)
                if scope.cancelled_caught:
                    log.info("MCP session idle: ended", extra={"session_id": entry.bridge.session_id})
        except Exception:
            log.exception("MCP session failed", extra={"session_id": entry.bridge.session_id})
        finally:
            with anyio.CancelScope(shield=True):
                await self._end(mcp_sid, entry)

    async def _end(self, mcp_sid: str, entry: _Entry) -> None:
        """Forget the MCP session, cancel its held calls, close the dispatcher session it created."""
        if self._sessions.pop(mcp_sid, None) is None:
            await entry.done.wait()
            return
        try:
            if not entry.transport.is_terminated:
                await entry.transport.terminate()
            await entry.bridge.aclose()
            if entry.created and not self.settings.keep_sessions:
                try:
                    await entry.bridge.client.close_session(entry.bridge.session_id)
                except RequestFailed as exc:
                    log.info("closing an MCP session's dispatcher session: %s", exc)
            await entry.bridge.client.close()
        finally:
            entry.done.set()


def grpc_target(listen: str, port: int) -> str:
    """Where the endpoint reaches this server's gRPC port: loopback for a wildcard listen."""
    host = listen.rpartition(":")[0]
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host in ("[::]", "::"):
        host = "[::1]"
    return f"{host}:{port}"


def _security(listen: str) -> TransportSecuritySettings | None:
    """DNS-rebinding protection on loopback, as the SDK does for its own apps."""
    host = listen.rpartition(":")[0].strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1"):
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


def _error(status: int, code: int, message: str) -> JSONResponse:
    body = mt.JSONRPCError(jsonrpc="2.0", id=None, error=mt.ErrorData(code=code, message=message))
    return JSONResponse(body.model_dump(mode="json", by_alias=True, exclude_none=True), status_code=status)


def _unsupported(version: str) -> JSONResponse:
    data: Mapping[str, Any] = {"supported": list(HANDSHAKE_PROTOCOL_VERSIONS), "requested": version}
    error = mt.ErrorData(
        code=mt.UNSUPPORTED_PROTOCOL_VERSION,
        message=(
            f"protocol version {version} is not served over HTTP here: this endpoint keeps one "
            "sandbox session per MCP session, which needs the initialize handshake (2025-11-25 or "
            "earlier); `dispatcher mcp` over stdio speaks 2026-07-28"
        ),
        data=dict(data),
    )
    body = mt.JSONRPCError(jsonrpc="2.0", id=None, error=error)
    return JSONResponse(body.model_dump(mode="json", by_alias=True, exclude_none=True), status_code=400)
