"""Run inside a sandbox (the local backend runs it on the host): one proxy request through
``$HTTPS_PROXY``, printing the proxy's status line and how long it took.

    python3 proxy_client.py connect HOST PORT [hold]   # CONNECT, then echo 'ping' through it
    python3 proxy_client.py get URL                    # an absolute-form GET; prints the body size
"""

from __future__ import annotations

import os
import socket
import sys
import time
from urllib.parse import urlsplit


def _proxy() -> socket.socket:
    proxy = urlsplit(os.environ["HTTPS_PROXY"])
    return socket.create_connection((proxy.hostname or "", proxy.port or 0), timeout=30)


def _head(sock: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return head


def main(argv: list[str]) -> int:
    started = time.monotonic()
    sock = _proxy()
    if argv[0] == "connect":
        host, port = argv[1], argv[2]
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = _head(sock)
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        print(f"status: {status}")
        print(f"seconds: {time.monotonic() - started:.3f}")
        if status.split()[1:2] == ["200"]:
            sock.sendall(b"ping")
            print(f"echo: {sock.recv(100).decode()}", flush=True)
            if argv[3:] == ["hold"]:
                sock.settimeout(None)
                print(f"held until: {sock.recv(100)!r}", flush=True)
        return 0
    url = urlsplit(argv[1])
    sock.sendall(f"GET {argv[1]} HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n\r\n".encode())
    data = _head(sock)
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    print(f"status: {status}")
    print(f"body bytes: {len(body)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
