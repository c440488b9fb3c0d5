"""The proxy request parser: the two forms it takes, the rewrite, and what it refuses."""

from __future__ import annotations

import pytest

from dispatcher.egress.policy import Reason, Refusal
from dispatcher.egress.request import RequestKind, parse_head, read_head


def test_connect_takes_host_and_port() -> None:
    req = parse_head(b"CONNECT Pkgs.Example.com:443 HTTP/1.1\r\nHost: pkgs.example.com:443\r\n\r\n")
    assert (req.kind, req.host, req.port) == (RequestKind.CONNECT, "pkgs.example.com", 443)
    v6 = parse_head(b"CONNECT [2001:DB8::1]:8443 HTTP/1.1\r\n\r\n")
    assert (v6.host, v6.port) == ("2001:db8::1", 8443)


def test_absolute_form_is_rewritten_to_origin_form() -> None:
    head = (
        b"GET http://deb.example.org/debian/dists/x?y=1 HTTP/1.1\r\n"
        b"Host: other.example\r\nProxy-Authorization: Basic abc\r\nProxy-Connection: keep-alive\r\n"
        b"Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\nUser-Agent: apt\r\n\r\n"
    )
    req = parse_head(head)
    assert (req.kind, req.method, req.host, req.port) == (RequestKind.FORWARD, "GET", "deb.example.org", 80)
    assert req.head == (
        b"GET /debian/dists/x?y=1 HTTP/1.1\r\nHost: deb.example.org\r\nUser-Agent: apt\r\n"
        b"Connection: close\r\n\r\n"
    )
    assert parse_head(b"GET http://h.example:8080 HTTP/1.0\r\n\r\n").head.startswith(
        b"GET / HTTP/1.1\r\nHost: h.example:8080\r\n"
    )


@pytest.mark.parametrize(
    "head",
    [
        b"CONNECT pkgs.example.com HTTP/1.1\r\n\r\n",  # no port
        b"CONNECT pkgs.example.com:0 HTTP/1.1\r\n\r\n",
        b"CONNECT pkgs.example.com:99999 HTTP/1.1\r\n\r\n",
        b"CONNECT 2001:db8::1:443 HTTP/1.1\r\n\r\n",  # IPv6 without brackets
        b"CONNECT user@pkgs.example.com:443 HTTP/1.1\r\n\r\n",
        b"GET http://allowed.example@evil.example/ HTTP/1.1\r\n\r\n",
        b"GET https://pkgs.example.com/ HTTP/1.1\r\n\r\n",
        b"GET /relative HTTP/1.1\r\n\r\n",
        b"GET http://h.example/#frag HTTP/1.1\r\n\r\n",
        b"GET http://h.example/ HTTP/2\r\n\r\n",
        b"GET  http://h.example/ HTTP/1.1\r\n\r\n",
        b"get http://h.example/ HTTP/1.1\r\n\r\n",
        b"GET http://h.example/ HTTP/1.1\r\nX: a\nY: b\r\n\r\n",  # bare LF
        b"GET http://h.example/ HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
        b"POST http://h.example/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET http://h_.example..org/ HTTP/1.1\r\n\r\n",
        b"GET http://h.example/\x01 HTTP/1.1\r\n\r\n",
    ],
)
def test_malformed_requests_are_400(head: bytes) -> None:
    with pytest.raises(Refusal) as info:
        parse_head(head)
    assert (info.value.reason, info.value.status) == (Reason.BAD_REQUEST, 400)


class _Chunks:
    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)
        self.given = 0

    async def read(self, n: int) -> bytes:
        chunk = self.chunks.pop(0)[:n] if self.chunks else b""
        self.given += len(chunk)
        return chunk


async def test_the_head_is_read_within_its_bound() -> None:
    head, rest = await read_head(_Chunks(b"CONNECT a.b:443 HTTP/1.1\r\n", b"\r\nTLS"), limit=64)
    assert (head, rest) == (b"CONNECT a.b:443 HTTP/1.1\r\n\r\n", b"TLS")
    endless = _Chunks(*[b"X-Pad: " + b"a" * 100 + b"\r\n"] * 1000)
    with pytest.raises(Refusal) as info:
        await read_head(endless, limit=1024)
    assert (info.value.reason, info.value.status) == (Reason.HEADER_TOO_LARGE, 431)
    assert endless.given <= 1024 + 4  # never more than the bound is buffered
    with pytest.raises(Refusal, match="ended before"):
        await read_head(_Chunks(b"CONNECT a.b:443 HTTP/1.1\r\n"), limit=1024)
