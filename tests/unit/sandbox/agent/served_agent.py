"""An agent served in this process over a socket pair, driven with the protocol's own messages."""

from __future__ import annotations

import socket
import threading
from typing import IO, Any, cast

from dispatcher.sandbox.agent.agent import Agent
from dispatcher.sandbox.agent.protocol import (
    PREFIX,
    Error,
    Request,
    decode_header,
    decode_prefix,
    encode_request,
)

DEADLINE = 10.0


class Link:
    """The host's end: requests out, frames in, each read under a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.settimeout(DEADLINE)
        self._next = 0

    def send(self, request: Request[Any]) -> int:
        self._next += 1
        self.sock.sendall(encode_request(self._next, request))
        return self._next

    def _exact(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the agent closed the channel"
            data += chunk
        return bytes(data)

    def recv(self) -> tuple[dict[str, Any], bytes]:
        header_len, payload_len = decode_prefix(
            self._exact(PREFIX.size), max_header=1 << 20, max_payload=1 << 30
        )
        header = decode_header(self._exact(header_len))
        return header, self._exact(payload_len) if payload_len else b""

    def call(self, request: Request[Any]) -> Any:
        """The reply that ends ``request`` (or its ``Error``), decoded as the host decodes it."""
        rid = self.send(request)
        header, payload = self.recv()
        assert header["id"] == rid, header
        if header["type"] == "error":
            return Error.decode(header)
        return request.decode_reply(header, payload)

    def frames(self, rid: int) -> list[tuple[dict[str, Any], bytes]]:
        """Every frame of a streaming request up to the one that ends it (an exit or a result)."""
        got = []
        while True:
            header, payload = self.recv()
            assert header["id"] == rid, header
            got.append((header, payload))
            if header["type"] in ("exit", "result", "error"):
                return got


class Served:
    """An ``Agent`` serving one end of a socket pair on a thread; ``link`` is the other end."""

    def __init__(self, root: str, **options: Any) -> None:
        ours, theirs = socket.socketpair()
        self._theirs = theirs
        self._files = (theirs.makefile("rb"), theirs.makefile("wb"))
        self.agent = Agent(root, cast("IO[bytes]", self._files[1]), **options)
        self.link = Link(ours)
        self._thread = threading.Thread(
            target=self.agent.serve, args=(self._files[0],), name="served-agent", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """End the channel (the agent shuts down as on the end of its stdin) and wait for it."""
        self.link.sock.close()
        self._thread.join(DEADLINE)
        for f in self._files:
            f.close()
        self._theirs.close()
        assert not self._thread.is_alive()
