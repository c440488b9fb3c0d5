"""The connection handler: one sandbox connection in, a refusal or a relayed tunnel out.

``serve_tunnel`` is the one entry point. The transport (the agent channel's open/data/close frames,
or asyncio sockets in tests) hands it each connection the sandbox's ``127.0.0.1:3128`` listener
accepted, as a ``TunnelStream``, with the session's ``EgressContext``. In order:

1. bounds first: a session at ``max_connections`` open tunnels, or past ``max_bytes``, is refused
   before its request is read;
2. the request head, bounded in bytes and time (``request``);
3. the policy (``policy.decide``): the port, then the session's list, then a remembered answer, then
   ``unknown`` (refuse, or ask a human; an IP literal in a refused range is refused before asking);
4. the name resolved once and every address checked, then a connection to a checked address
   (``resolver``);
5. ``CONNECT``: ``200 Connection established`` and a byte relay; absolute-form HTTP: the request
   in origin-form, then the relay. Both directions count against ``max_bytes``; a tunnel with no
   byte either way for ``idle_timeout`` seconds is closed.

Every refusal is ``403`` (``400``/``408``/``431`` for a malformed request, ``502``/``504`` when the
destination cannot be reached) with the same one line, naming host, why and what is allowed, as
the reason phrase and the body: pip and urllib print the reason phrase of a refused CONNECT.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dispatcher.egress.networks import OwnEndpoints
from dispatcher.egress.policy import EgressPolicy, Reason, Refusal, Verdict, decide, explain, is_ip_literal
from dispatcher.egress.prompt import Ask, PromptBook, PromptVerdict
from dispatcher.egress.record import (
    NO_OBSERVER,
    AuditRecorder,
    Direction,
    EgressAttempt,
    EgressObserver,
    End,
    Outcome,
    report,
)
from dispatcher.egress.request import MAX_HEAD_BYTES, ProxyRequest, RequestKind, read_request
from dispatcher.egress.resolver import (
    Connected,
    Connector,
    Resolver,
    SystemResolver,
    TcpConnector,
    check_addresses,
    connect_checked,
    resolve_checked,
)

__all__ = ["ESTABLISHED", "EgressContext", "EgressLimits", "TunnelStream", "serve_tunnel"]

log = logging.getLogger("dispatcher.egress")

ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
_REASONS_APPROVED = {True: Reason.REMEMBERED, False: Reason.APPROVED}


class TunnelStream(Protocol):
    """One connection the sandbox opened to its proxy port, as the transport carries it."""

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; ``b""`` once the sandbox side has closed or half-closed."""
        ...

    async def write(self, data: bytes) -> None:
        """All of ``data``; returns when the transport's window has taken it (back-pressure)."""
        ...

    async def close(self) -> None:
        """Close both directions; idempotent."""
        ...


@dataclass(frozen=True, slots=True)
class EgressLimits:
    """The bounds that are not config keys, each in its own unit."""

    head_bytes: int = MAX_HEAD_BYTES
    head_timeout: float = 30.0
    """Seconds for the request head to arrive."""
    refused_head_timeout: float = 2.0
    """The same, for a connection that will be refused at a bound: a flood holds little for long."""
    resolve_timeout: float = 10.0
    connect_timeout: float = 10.0
    """Seconds to connect, every checked address tried included."""
    idle_timeout: float = 300.0
    """Seconds a tunnel may carry no byte either way before it is closed."""
    chunk: int = 256 << 10
    """Bytes read from either side at once (the agent channel's ``TUNNEL_CHUNK``: one frame each)."""


@dataclass(slots=True)
class EgressContext:
    """One session's egress: its policy and effective list, its tunnels, quotas and answers."""

    tenant_id: str
    session_id: str
    policy: EgressPolicy
    allow: Sequence[str]
    """The session's effective list (its tenant's, narrowed by the session)."""
    own: OwnEndpoints = field(default_factory=OwnEndpoints)
    resolver: Resolver = field(default_factory=SystemResolver)
    connector: Connector = field(default_factory=TcpConnector)
    audit: AuditRecorder | None = None
    observer: EgressObserver = NO_OBSERVER
    ask: Ask | None = None
    """How an unlisted host is asked about under ``unknown: prompt`` (None: refused)."""
    running_calls: Callable[[], Sequence[str]] = tuple
    """The tool_use ids of the session's calls now running: when the transport cannot tell which
    call's process opened a connection and there is exactly one, it is that one."""
    limits: EgressLimits = field(default_factory=EgressLimits)
    prompts: PromptBook = field(default_factory=PromptBook)
    bytes_used: int = 0
    """Both directions, every tunnel of the session so far."""
    bytes_sent: int = 0
    """From the sandbox, every tunnel of the session so far (its usage)."""
    bytes_received: int = 0
    """To the sandbox."""
    bytes_spent: bool = False
    """A chunk did not fit in ``max_bytes``: the session's tunnels are done."""
    closed: bool = False
    _tunnels: dict[asyncio.Task[None], str | None] = field(default_factory=dict)

    @property
    def open_tunnels(self) -> int:
        return len(self._tunnels)

    def close(self) -> None:
        """The session closed or expired: every tunnel ends and no new one opens."""
        self.closed = True
        for task in list(self._tunnels):
            task.cancel()

    def call_of(self, hint: str | None) -> str | None:
        if hint:
            return hint
        running = self.running_calls()
        return running[0] if len(running) == 1 else None


@dataclass(slots=True)
class _Attempt:
    call: str | None
    started: float = field(default_factory=time.monotonic)
    host: str = ""
    port: int = 0
    method: str = ""
    address: str | None = None
    outcome: Outcome = Outcome.ALLOWED
    reason: Reason = Reason.LISTED
    bytes_out: int = 0
    bytes_in: int = 0
    end: End | None = None

    def finished(self, ctx: EgressContext) -> EgressAttempt:
        return EgressAttempt(
            tenant=ctx.tenant_id,
            session_id=ctx.session_id,
            tool_use_id=self.call,
            host=self.host,
            port=self.port,
            address=self.address,
            outcome=self.outcome,
            reason=self.reason.value,
            bytes_out=self.bytes_out,
            bytes_in=self.bytes_in,
            seconds=time.monotonic() - self.started,
            method=self.method,
            end=self.end,
        )


async def serve_tunnel(stream: TunnelStream, ctx: EgressContext, *, tool_use_id: str | None = None) -> None:
    """Serve one sandbox connection to its end; never raises but ``CancelledError``.

    ``tool_use_id``: the call whose process opened the connection, when the transport knows it.
    """
    task = asyncio.current_task()
    assert task is not None
    attempt = _Attempt(ctx.call_of(tool_use_id))
    ctx._tunnels[task] = attempt.call
    connected: Connected | None = None
    try:
        try:
            # Over a bound, the head is still read (bounded in time), so that the refusal names the
            # host and arrives as an answer, not as a reset of a connection with unread bytes.
            over = _over_bounds(ctx)
            try:
                request, rest = await read_request(
                    stream,
                    limit=ctx.limits.head_bytes,
                    timeout=ctx.limits.refused_head_timeout if over else ctx.limits.head_timeout,
                )
            except Refusal:
                if over is not None:
                    raise over from None
                raise
            attempt.host, attempt.port, attempt.method = request.host, request.port, request.method
            if over is not None:
                raise over
            attempt.reason = await _decide(ctx, request, attempt.call)
            addresses = await resolve_checked(
                request.host,
                request.port,
                resolver=ctx.resolver,
                networks=ctx.policy.deny_networks,
                own=ctx.own,
                timeout=ctx.limits.resolve_timeout,
            )
            connected = await connect_checked(
                addresses, request.port, connector=ctx.connector, timeout=ctx.limits.connect_timeout
            )
        except Refusal as refusal:
            attempt.outcome = Outcome.FAILED if refusal.status != 403 else Outcome.REFUSED
            attempt.reason = refusal.reason
            await _refuse(stream, ctx, attempt, refusal)
            return
        attempt.address = str(connected.address)
        if request.kind is RequestKind.CONNECT:
            await stream.write(ESTABLISHED)
            first = rest
        else:
            first = request.head + rest
        attempt.end = await _relay(stream, connected, ctx, attempt, first)
    except asyncio.CancelledError:
        attempt.end = End.CANCELLED
        raise
    except Exception as exc:  # a transport failure ends this tunnel, never the server
        attempt.end = End.ERROR
        log.warning("egress tunnel failed: %r", exc, extra={"session_id": ctx.session_id})
    finally:
        ctx._tunnels.pop(task, None)
        if connected is not None:
            connected.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.shield(stream.close())
        report(attempt.finished(ctx), ctx.audit, ctx.observer)


def _over_bounds(ctx: EgressContext) -> Refusal | None:
    """The refusal of a connection that arrives when the session is closed or at a bound."""
    if ctx.closed:
        return Refusal(Reason.CONNECTIONS_QUOTA, "the session is closed")
    limit = ctx.policy.max_connections
    if ctx.open_tunnels > limit:  # this connection is already counted
        return Refusal(Reason.CONNECTIONS_QUOTA, f"{limit} connections are open")
    if ctx.bytes_spent or ctx.bytes_used >= ctx.policy.max_bytes:
        return Refusal(Reason.BYTES_QUOTA, f"{ctx.policy.max_bytes} bytes relayed")
    return None


async def _decide(ctx: EgressContext, request: ProxyRequest, call: str | None) -> Reason:
    """Why the destination may be reached.

    Raises:
        Refusal: why it may not.
    """
    host, port = request.host, request.port
    decision = decide(ctx.policy, ctx.allow, host, port, ctx.prompts.allowed)
    if decision.verdict is Verdict.ALLOW:
        return decision.reason
    if decision.verdict is Verdict.REFUSE or ctx.ask is None:
        raise Refusal(decision.reason)
    if is_ip_literal(host):  # nobody is asked about an address that would be refused anyway
        check_addresses([ipaddress.ip_address(host)], port, ctx.policy.deny_networks, ctx.own)
    answer = await ctx.prompts.ask(ctx.ask, host, port, call)
    if answer.verdict is PromptVerdict.ALLOW:
        return _REASONS_APPROVED[answer.remember]
    raise Refusal(Reason.PROMPT_TIMEOUT if answer.verdict is PromptVerdict.TIMEOUT else Reason.PROMPT_DENIED)


async def _refuse(stream: TunnelStream, ctx: EgressContext, attempt: _Attempt, refusal: Refusal) -> None:
    text = explain(
        refusal.reason,
        attempt.host,
        attempt.port,
        allow=list(ctx.allow),
        ports=ctx.policy.ports,
        detail=refusal.detail,
    )
    body = (text + "\n").encode("utf-8", "replace")
    phrase = text.encode("ascii", "replace")
    head = (
        b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n" % (refusal.status, phrase, len(body))
    )
    with contextlib.suppress(Exception):  # the sandbox may be gone already
        await stream.write(head + body)


async def _relay(
    stream: TunnelStream, connected: Connected, ctx: EgressContext, attempt: _Attempt, first: bytes
) -> End:
    """Bytes both ways until the destination closes, the tunnel idles, or the quota is spent."""
    loop = asyncio.get_running_loop()
    last = [loop.time()]
    limits = ctx.limits

    def take(data: bytes, direction: Direction) -> bytes:
        """What of ``data`` the quota lets through (the part that fits, then ``spent``)."""
        room = ctx.policy.max_bytes - ctx.bytes_used
        if len(data) > room:
            ctx.bytes_spent = True
            data = data[: max(room, 0)]  # relayed up to the quota, whatever the chunk size
        n = len(data)
        ctx.bytes_used += n
        last[0] = loop.time()
        if direction is Direction.OUT:
            attempt.bytes_out += n
            ctx.bytes_sent += n
        else:
            attempt.bytes_in += n
            ctx.bytes_received += n
        if n:
            ctx.observer.egress_bytes(ctx.tenant_id, direction.value, n)
        return data

    async def outbound() -> None:
        writer = connected.writer
        data = first
        while True:
            if data:
                allowed = take(data, Direction.OUT)
                if allowed:
                    writer.write(allowed)
                    await writer.drain()
                if ctx.bytes_spent:
                    raise _QuotaSpent
            data = await stream.read(limits.chunk)
            if not data:
                break
        if writer.can_write_eof():
            writer.write_eof()

    async def inbound() -> None:
        while data := await connected.reader.read(limits.chunk):
            allowed = take(data, Direction.IN)
            if allowed:
                await stream.write(allowed)
            if ctx.bytes_spent:
                raise _QuotaSpent

    async def idle() -> None:
        while (remaining := last[0] + limits.idle_timeout - loop.time()) > 0:
            await asyncio.sleep(remaining)

    out_task = asyncio.ensure_future(outbound())
    in_task = asyncio.ensure_future(inbound())
    idle_task = asyncio.ensure_future(idle())
    pending: set[asyncio.Future[None]] = {out_task, in_task, idle_task}
    try:
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = task.exception()
                if isinstance(exc, _QuotaSpent):
                    return End.BYTES_QUOTA
                if exc is not None:
                    raise exc
            if idle_task in done:
                return End.IDLE
            if in_task in done:  # the destination is done: so is the tunnel
                return End.CLOSED
            # The sandbox half-closed: the answer may still be coming.
    finally:
        for task in (out_task, in_task, idle_task):
            task.cancel()
        await asyncio.gather(out_task, in_task, idle_task, return_exceptions=True)


class _QuotaSpent(Exception):
    """The session's ``max_bytes`` would be passed."""
