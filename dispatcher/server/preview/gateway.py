"""The preview gateway: ``http://{port}-{session_id}.{domain}/…`` to ``127.0.0.1:{port}`` inside
that session's sandbox, through ``Sandbox.connect_port`` (the agent's channel: no port of the
sandbox is published, and nothing but that port of that sandbox is ever reached, whatever the
request says: the target is the Host header's port and session, the address always the sandbox's
loopback).

Why aiohttp for the browser's side: it faces browsers and whatever a tenant sends, so its parser
must be strict and maintained. aiohttp's (llhttp) refuses what makes a request ambiguous between
two parsers (``Content-Length`` with ``Transfer-Encoding``, two different lengths, obs-fold, a
duplicated ``Host``) and oversized lines and headers before we see anything; it is already a
dependency (the Kubernetes backend's attach runs on it), and it carries keep-alive, streamed
bodies and the WebSocket upgrade. h11, the other maintained choice, accepts obs-fold and a
length beside chunked. The sandbox's side is h11: one request per connection to the sandbox,
its response read event by event, so a body of any size streams with backpressure (each chunk is
written to the browser, drained, before the next is read from the sandbox) and server-sent
events pass as they come. A WebSocket is upgraded by the sandbox's server itself: after its 101,
bytes are relayed unchanged both ways.

Refusals are small HTML pages with the reason: 400 (a request whose target is not a path), 401
(no token, a wrong one), 404 (no such open port: unknown, closed or expired, all alike), 502
(nothing listens on the port in the sandbox, or its answer is not HTTP), 503 (the sandbox failed,
or the session's or tenant's connection bound is reached). A wrong token never falls back to
another way of presenting one; tokens never reach a log, the audit log or the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import h11
from aiohttp import web

from dispatcher.core.errors import UnknownSessionError
from dispatcher.core.sandbox_api import PortError, PortStream, SandboxError
from dispatcher.server.preview.ports import HOST_LABEL, OpenPort, OpenPorts
from dispatcher.server.requests.errors import QuotaExceeded, ShuttingDown
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.sessions.ports import PortObserver
from dispatcher.server.tenancy.tenants import Tenant

__all__ = ["COOKIE", "HEADER", "Gateway"]

log = logging.getLogger("dispatcher.server.preview")

HEADER = "X-Dispatcher-Preview-Token"
COOKIE = "dispatcher_preview_token"
CHUNK = 256 * 1024
IDLE_SECONDS = 600.0
"""A request, or a WebSocket, with no byte either way for this long is cut."""
MAX_RESPONSE_HEAD = 64 * 1024
AUDIT_REFUSED = "preview.refused"
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-authenticate",
        "host",
        HEADER.lower(),
    }
)


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Target:
    entry: OpenPort
    host: str


class Gateway:
    """The gateway's HTTP server (``start``/``stop``) and its handler."""

    def __init__(
        self,
        sessions: SessionManager,
        ports: OpenPorts,
        domain: str,
        tenant_of: Callable[[str], Tenant],
        *,
        observer: PortObserver | None = None,
        max_body_bytes: int = 1 << 30,
    ) -> None:
        self._sessions = sessions
        self._tenant_of = tenant_of
        self._ports = ports
        self._domain = domain.lower()
        self._observer = observer
        self._max_body = max_body_bytes
        self._runner: web.ServerRunner | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port``; the bound port."""
        # No access log: a request line may carry ?token= (the one place a token is in a URL).
        server = web.Server(self._handle, max_field_size=8190, max_line_size=8190, access_log=None)
        self._runner = web.ServerRunner(server, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # -- a request ------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            target = self._target(request)
            redirect = self._authorize(request, target.entry)
            if redirect is not None:
                return redirect
            return await self._proxy(request, target.entry)
        except _Refused as refused:
            return _page(refused.status, refused.reason)

    def _target(self, request: web.BaseRequest) -> _Target:
        if not request.raw_path.startswith("/"):
            raise _Refused(400, "The request target must be a path (origin-form), not a URL.")
        host = request.headers.get("Host", "").lower()
        name, _, _port = host.partition(":")
        label, dot, domain = name.partition(".")
        match = HOST_LABEL.fullmatch(label) if dot and domain == self._domain else None
        if match is None:
            raise _Refused(404, f"Not a preview address: expected {{port}}-{{session}}.{self._domain}.")
        port, session_id = int(match.group(1)), match.group(2)
        entry, expired = self._ports.find(session_id, port)
        if entry is None or port > 65535:
            if expired:
                self._refusal(None, session_id, port, "expired")
            raise _Refused(
                404, f"Port {port} of session {session_id} is not open (never, closed or expired)."
            )
        return _Target(entry, host)

    def _authorize(self, request: web.BaseRequest, entry: OpenPort) -> web.StreamResponse | None:
        """None when the request may pass; a redirect that sets the cookie for a good ``?token=``.

        Raises:
            _Refused: 401, no token or a wrong one (never falling back to another way).
        """
        if entry.public:
            return None
        query = request.rel_url.query
        if "token" in query:
            token, how = query.get("token", ""), "query"
        elif HEADER in request.headers:
            token, how = request.headers.get(HEADER, ""), "header"
        elif COOKIE in request.cookies:
            token, how = request.cookies.get(COOKIE, ""), "cookie"
        else:
            self._refusal(entry, entry.session_id, entry.port, "no_token")
            raise _Refused(401, f"This preview needs its token: the {HEADER} header, or ?token= once.")
        if not entry.accepts(token):
            self._refusal(entry, entry.session_id, entry.port, f"wrong_token_{how}")
            raise _Refused(401, "Wrong preview token.")
        if how != "query":
            return None
        rest = [(k, v) for k, v in query.items() if k != "token"]
        location = request.rel_url.path + (f"?{urlencode(rest)}" if rest else "")
        response = web.Response(status=303, headers={"Location": location})
        response.set_cookie(COOKIE, token, httponly=True, samesite="Lax", path="/")
        return response

    def _refusal(self, entry: OpenPort | None, session_id: str, port: int, reason: str) -> None:
        self._sessions.dispatcher.audit_record(
            AUDIT_REFUSED,
            tenant=entry.tenant_id if entry is not None else None,
            session=session_id,
            port=port,
            reason=reason,
        )

    async def _proxy(self, request: web.BaseRequest, entry: OpenPort) -> web.StreamResponse:
        sessions = self._sessions
        try:
            tenant = self._tenant_of(entry.tenant_id)
            state = sessions.get(tenant, entry.session_id)
        except UnknownSessionError:
            raise _Refused(404, f"Session {entry.session_id} has ended.") from None
        outcome = "failed"
        try:
            with sessions.admission.port_slot(tenant, entry.session_id):
                async with sessions.lifecycle.hold(state):
                    sandbox = sessions.dispatcher.sandbox_for(state.session)
                    try:
                        stream = await sandbox.connect_port(entry.port)
                    except PortError:
                        outcome = "refused"
                        raise
                    try:
                        response = await self._exchange(request, entry, stream)
                        outcome = "closed"
                        return response
                    finally:
                        await stream.close()
        except PortError as exc:
            raise _Refused(502, f"Nothing answers on port {entry.port} in the sandbox: {exc}") from None
        except (QuotaExceeded, ShuttingDown) as exc:
            outcome = "refused"
            raise _Refused(503, str(exc)) from None
        except SandboxError as exc:
            raise _Refused(503, f"The sandbox failed: {exc}. Try again.") from None
        finally:
            if self._observer is not None:
                self._observer.port_connection(entry.tenant_id, outcome)

    async def _exchange(
        self, request: web.BaseRequest, entry: OpenPort, stream: PortStream
    ) -> web.StreamResponse:
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_RESPONSE_HEAD)
        headers = _request_headers(request, upgrade)
        await stream.write(
            conn.send(h11.Request(method=request.method, target=request.raw_path, headers=headers))
        )
        sender = asyncio.ensure_future(self._send_body(request, conn, stream, entry, upgrade))
        try:
            event = await _next_event(conn, stream, entry.cut)
            if isinstance(event, h11.InformationalResponse) and event.status_code == 101 and upgrade:
                await sender
                return await self._relay(request, entry, stream, conn, event)
            while isinstance(event, h11.InformationalResponse):  # 100 Continue and the like
                event = await _next_event(conn, stream, entry.cut)
            if not isinstance(event, h11.Response):
                raise _Refused(502, "The server in the sandbox did not answer with HTTP.")
            response = web.StreamResponse(
                status=event.status_code, reason=event.reason.decode("latin-1") or None
            )
            for name, value in event.headers:
                key = name.decode("latin-1")
                if key.lower() not in _HOP:
                    response.headers.add(key, value.decode("latin-1"))
            await response.prepare(request)
            while True:
                try:
                    event = await _next_event(conn, stream, entry.cut)
                except _Refused:  # closed, expired or idle mid-body: the status went out already
                    response.force_close()
                    if request.transport is not None:
                        request.transport.close()
                    return response
                if isinstance(event, h11.Data):
                    self._metered(entry, "out", len(event.data))
                    await response.write(event.data)
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    break
            await response.write_eof()
            return response
        except h11.RemoteProtocolError as exc:
            raise _Refused(502, f"The server in the sandbox broke HTTP: {exc}") from None
        finally:
            if not sender.done():
                sender.cancel()
            with contextlib.suppress(BaseException):
                await sender

    async def _send_body(
        self,
        request: web.BaseRequest,
        conn: h11.Connection,
        stream: PortStream,
        entry: OpenPort,
        upgrade: bool,
    ) -> None:
        if upgrade:
            return
        sent = 0
        async for chunk in request.content.iter_chunked(CHUNK):
            sent += len(chunk)
            if sent > self._max_body:
                raise _Refused(413, "The request body is larger than this gateway carries.")
            self._metered(entry, "in", len(chunk))
            await stream.write(conn.send(h11.Data(data=chunk)))
        await stream.write(conn.send(h11.EndOfMessage()))

    async def _relay(
        self,
        request: web.BaseRequest,
        entry: OpenPort,
        stream: PortStream,
        conn: h11.Connection,
        switched: h11.InformationalResponse,
    ) -> web.StreamResponse:
        """The sandbox's server accepted the upgrade: pass its 101 on, then bytes both ways."""
        response = web.StreamResponse(status=101)
        for name, value in switched.headers:
            response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
        response.force_close()
        await response.prepare(request)
        transport = request.transport
        assert transport is not None
        inbox: asyncio.Queue[bytes] = asyncio.Queue()
        # aiohttp types the parser as its WebSocket reader; any object with feed_data/feed_eof works.
        request.protocol.set_parser(_RawParser(inbox, transport))  # type: ignore[arg-type]
        tail, _ = conn.trailing_data
        if tail:
            self._metered(entry, "out", len(tail))
            transport.write(tail)

        last = [asyncio.get_running_loop().time()]  # the last byte either way

        async def up() -> None:
            while data := await inbox.get():
                last[0] = asyncio.get_running_loop().time()
                self._metered(entry, "in", len(data))
                if inbox.qsize() < 4:
                    transport.resume_reading()
                await stream.write(data)
            await stream.shut_write()

        async def down() -> None:
            while data := await stream.read(CHUNK):
                last[0] = asyncio.get_running_loop().time()
                self._metered(entry, "out", len(data))
                transport.write(data)
                while transport.get_write_buffer_size() > CHUNK * 4:  # the browser is slow
                    await asyncio.sleep(0.01)
                    if transport.is_closing():
                        return
            if transport.can_write_eof():
                transport.write_eof()

        tasks = [
            asyncio.ensure_future(up()),
            asyncio.ensure_future(down()),
            asyncio.ensure_future(entry.cut.wait()),
        ]
        try:
            # Until both directions ended (a half-close is passed on), the port is cut, or nothing
            # moved either way for IDLE_SECONDS.
            pending = set(tasks)
            loop = asyncio.get_running_loop()
            while not tasks[2].done() and not (tasks[0].done() and tasks[1].done()):
                idle_left = last[0] + IDLE_SECONDS - loop.time()
                if idle_left <= 0:
                    break
                _, pending = await asyncio.wait(
                    pending, timeout=idle_left, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            for task in tasks:
                task.cancel()
            transport.close()
        return response

    def _metered(self, entry: OpenPort, direction: str, count: int) -> None:
        if self._observer is not None:
            self._observer.port_bytes(entry.tenant_id, direction, count)


class _RawParser:
    """After the upgrade: every byte from the browser, unparsed, to the relay (reading paused
    while it holds a few chunks: a sandbox that does not read holds the browser)."""

    def __init__(self, inbox: asyncio.Queue[bytes], transport: asyncio.Transport) -> None:
        self._inbox = inbox
        self._transport = transport

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self._inbox.put_nowait(bytes(data))
        if self._inbox.qsize() >= 8:
            self._transport.pause_reading()
        return False, b""

    def feed_eof(self) -> None:
        self._inbox.put_nowait(b"")


def _request_headers(request: web.BaseRequest, upgrade: bool) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = [("Host", request.headers.get("Host", "localhost"))]
    for name, value in request.headers.items():
        key = name.lower()
        if key in _HOP or key == "content-length":
            continue
        if key == "cookie":
            value = _without_our_cookie(value)
            if not value:
                continue
        headers.append((name, value))
    if upgrade:
        headers += [("Connection", "Upgrade"), ("Upgrade", request.headers.get("Upgrade", "websocket"))]
    else:
        headers.append(("Connection", "close"))
        if request.body_exists:
            length = request.headers.get("Content-Length")
            headers.append(
                ("Content-Length", length) if length is not None else ("Transfer-Encoding", "chunked")
            )
    return headers


def _without_our_cookie(value: str) -> str:
    parts = [p.strip() for p in value.split(";")]
    return "; ".join(p for p in parts if p and not p.startswith(f"{COOKIE}="))


async def _next_event(conn: h11.Connection, stream: PortStream, cut: asyncio.Event) -> Any:
    """The next h11 event of the sandbox's answer, reading as needed (cut: the port closed)."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        reading = asyncio.ensure_future(stream.read(CHUNK))
        cutting = asyncio.ensure_future(cut.wait())
        try:
            await asyncio.wait((reading, cutting), timeout=IDLE_SECONDS, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cutting.cancel()
            if not reading.done():
                reading.cancel()
        if cut.is_set():
            raise _Refused(404, "The port was closed.")
        if not reading.done() or reading.cancelled():
            raise _Refused(504, "The server in the sandbox did not answer in time.")
        conn.receive_data(reading.result())


def _page(status: int, reason: str) -> web.Response:
    title = {400: "Bad request", 401: "Token needed", 404: "Not found", 413: "Too large", 502: "Bad gateway",
             503: "Unavailable", 504: "Timed out"}.get(status, "Refused")  # fmt: skip
    body = (
        f"<!doctype html><html><head><meta charset=utf-8><title>{status} {title}</title></head>"
        f"<body><h1>{status} {title}</h1><p>{html.escape(reason)}</p></body></html>\n"
    )
    return web.Response(status=status, text=body, content_type="text/html")
