"""The head of a proxy request, read under a byte bound and parsed strictly.

Two forms are taken, and nothing else: ``CONNECT host:port HTTP/1.1`` (HTTPS, git, anything over
TLS) and an absolute-form plain HTTP request, ``GET http://host[:port]/path HTTP/1.1`` (apt's
``http://`` mirrors), which is rewritten to origin-form with the URL's authority as ``Host`` and
``Connection: close``, so one tunnel carries exactly one request to the host that was checked.

Why our own ~150 lines and not a library: proxy.py's ``HttpParser`` is bound to its own event loop
and plugin framework and is lenient by design (it accepts what browsers send); OpenSandbox's egress
sidecar parses no proxy requests at all (it filters DNS and uses nftables plus a transparent
mitmproxy); h11 fits asyncio but parses only the head's syntax, leaves the request target to us
(the part that matters here) and would be a new dependency of the server. Our grammar is narrower
than any of them: CRLF line ends only, no obsolete line folding, no userinfo in the authority
(``http://allowed.example@evil.example/``), no ``Transfer-Encoding`` with ``Content-Length``, a
bounded head and header count.
"""

from __future__ import annotations

import asyncio
import enum
import re
from dataclasses import dataclass
from typing import Protocol

from dispatcher.egress.policy import Reason, Refusal, normalize_host

__all__ = ["MAX_HEAD_BYTES", "ProxyRequest", "RequestKind", "parse_head", "read_head"]

MAX_HEAD_BYTES = 16 << 10
"""A request line and headers larger than this are refused (431)."""
MAX_HEADERS = 100
_CHUNK = 4096
_METHOD = re.compile(rb"^[A-Z]{3,16}$")
_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_TARGET = re.compile(rb"^[\x21-\x7e]+$")
_VALUE = re.compile(rb"^[\t\x20-\x7e\x80-\xff]*$")
_VERSIONS = (b"HTTP/1.1", b"HTTP/1.0")
_HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authorization",
    b"proxy-authenticate",
    b"te",
    b"trailer",
    b"upgrade",
    b"host",
}
"""Not forwarded to the origin: they are about the hop to the proxy (``Host`` is rewritten)."""


class RequestKind(enum.StrEnum):
    CONNECT = "connect"
    FORWARD = "forward"
    """Absolute-form plain HTTP, forwarded in origin-form."""


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    kind: RequestKind
    method: str
    host: str
    """Normalised (``policy.normalize_host``)."""
    port: int
    head: bytes = b""
    """FORWARD: the head to send the origin (origin-form, ``Host``, ``Connection: close``)."""


class HeadReader(Protocol):
    async def read(self, n: int) -> bytes: ...


async def read_head(stream: HeadReader, *, limit: int = MAX_HEAD_BYTES) -> tuple[bytes, bytes]:
    """(the head up to and including its blank line, the bytes read after it).

    The caller bounds the time (a slow sender holds one connection slot, never more).

    Raises:
        Refusal: HEADER_TOO_LARGE (431) past ``limit`` bytes; BAD_REQUEST (400) when the stream
            ends first.
    """
    buffer = bytearray()
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            if end + 4 > limit:
                break
            return bytes(buffer[: end + 4]), bytes(buffer[end + 4 :])
        if len(buffer) >= limit:  # no blank line in ``limit`` bytes: the head is longer
            break
        chunk = await stream.read(min(_CHUNK, limit + 4 - len(buffer)))
        if not chunk:
            raise Refusal(Reason.BAD_REQUEST, "the connection ended before the request head did", status=400)
        buffer += chunk
    raise Refusal(Reason.HEADER_TOO_LARGE, f"request head over {limit} bytes", status=431)


def _bad(detail: str) -> Refusal:
    return Refusal(Reason.BAD_REQUEST, detail, status=400)


def parse_head(head: bytes) -> ProxyRequest:
    """The request ``head`` (from ``read_head``) as a proxy request.

    Raises:
        Refusal: BAD_REQUEST (400) naming what is wrong.
    """
    if not head.endswith(b"\r\n\r\n"):
        raise _bad("the request head must end with a blank line")
    lines = head[:-4].split(b"\r\n")
    if any(b"\n" in line or b"\r" in line for line in lines):
        raise _bad("line ends must be CRLF")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _METHOD.match(parts[0]) or parts[2] not in _VERSIONS:
        raise _bad("expected a request line like 'CONNECT host:443 HTTP/1.1'")
    method, target, _version = parts
    if not _TARGET.match(target):
        raise _bad("the request target has characters a URL may not")
    headers = _headers(lines[1:])
    if method == b"CONNECT":
        host, port = _authority(target, default_port=None)
        return ProxyRequest(RequestKind.CONNECT, "CONNECT", host, port)
    return _forward(method, target, headers)


def _headers(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    if len(lines) > MAX_HEADERS:
        raise _bad(f"more than {MAX_HEADERS} headers")
    out = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise _bad("a header line must be 'Name: value' (no folding)")
        value = value.strip(b" \t")
        if not _VALUE.match(value):
            raise _bad(f"header {name.decode()!r} has a control character")
        out.append((name, value))
    return out


def _authority(authority: bytes, *, default_port: int | None) -> tuple[str, int]:
    text = authority.decode("ascii")
    if "@" in text:
        raise _bad("no user information in the authority")
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise _bad(f"bad IPv6 authority {text!r}")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:
        raise _bad("an IPv6 address must be in brackets")
    else:
        host, colon, port_text_ = text.partition(":")
        port_text = port_text_ if colon else None
    if port_text is None:
        if default_port is None:
            raise _bad("CONNECT needs host:port")
        port = default_port
    elif port_text.isdigit() and len(port_text) <= 5 and 0 < int(port_text) <= 65535:
        port = int(port_text)
    else:
        raise _bad(f"bad port in {text!r}")
    try:
        return normalize_host(host), port
    except ValueError as exc:
        raise _bad(str(exc)) from None


def _forward(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> ProxyRequest:
    lowered = target.lower()
    if lowered.startswith(b"https://"):
        raise _bad("an https:// URL goes through CONNECT; set HTTPS_PROXY")
    if not lowered.startswith(b"http://"):
        raise _bad("a proxy request needs an absolute http:// URL or CONNECT")
    rest = target[len(b"http://") :]
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if b"#" in path:
        raise _bad("no fragment in a request target")
    if not path.startswith(b"/"):
        path = b"/" + path
    host, port = _authority(authority, default_port=80)
    names = {name.lower() for name, _ in headers}
    if b"transfer-encoding" in names and b"content-length" in names:
        raise _bad("Transfer-Encoding and Content-Length together")
    listed = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    kept = [(n, v) for n, v in headers if n.lower() not in _HOP_BY_HOP and n.lower() not in listed]
    shown_host = f"[{host}]" if ":" in host else host
    authority_out = shown_host if port == 80 else f"{shown_host}:{port}"
    out = [method + b" " + path + b" HTTP/1.1", b"Host: " + authority_out.encode("ascii")]
    out += [n + b": " + v for n, v in kept]
    out.append(b"Connection: close")
    return ProxyRequest(
        RequestKind.FORWARD, method.decode("ascii"), host, port, b"\r\n".join(out) + b"\r\n\r\n"
    )


async def read_request(stream: HeadReader, *, limit: int, timeout: float) -> tuple[ProxyRequest, bytes]:
    """``read_head`` then ``parse_head``, within ``timeout`` seconds.

    Raises:
        Refusal: as those two; BAD_REQUEST (408) when the head does not arrive in time.
    """
    try:
        async with asyncio.timeout(timeout):
            head, rest = await read_head(stream, limit=limit)
    except TimeoutError:
        raise Refusal(Reason.BAD_REQUEST, f"no request head within {timeout:g} s", status=408) from None
    return parse_head(head), rest
