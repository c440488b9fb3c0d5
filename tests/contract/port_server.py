"""A TCP server the port tests run inside the sandbox (its source is written to the workspace).

``python3 port_server.py MODE PORTFILE``: listens on ``127.0.0.1`` (any free port, written to
PORTFILE once listening) and serves every connection on a thread:

- ``echo``: sends back what it reads as it reads it, and half-closes once it read the end;
- ``count``: reads to the end, then answers ``got N`` (the peer's half-close reached it, and the
  connection still carries the answer);
- ``sink``: reads nothing until a file ``go`` exists, then reads to the end and answers ``got N``;
- ``http``: an HTTP/1.1 server of the working directory's files (``http.server``), which also
  echoes WebSocket messages on ``/ws`` (text and binary, in order).
"""

import base64
import hashlib
import http.server
import os
import socket
import sys
import threading
import time
from typing import Any


def serve(conn: socket.socket, mode: str) -> None:
    with conn:
        if mode == "echo":
            while data := conn.recv(1 << 16):
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
            return
        if mode == "sink":
            while not os.path.exists("go"):
                time.sleep(0.02)
        total = 0
        while data := conn.recv(1 << 16):
            total += len(data)
        conn.sendall(b"got %d" % total)


class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are written apart: no delayed-ACK stall

    def do_POST(self) -> None:
        """Answer the body's length and SHA-256 (read as it comes: chunked or with a length)."""
        digest, total = hashlib.sha256(), 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while size := int(self.rfile.readline().split(b";")[0], 16):
                data = self.rfile.read(size)
                digest.update(data)
                total += len(data)
                self.rfile.readline()
            self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length", "0"))
            while left:
                data = self.rfile.read(min(left, 1 << 16))
                digest.update(data)
                total += len(data)
                left -= len(data)
        body = f"{total} {digest.hexdigest()}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/ticks":  # a stream that never ends (server-sent events' shape)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(6000):
                line = f"data: tick {i}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
                time.sleep(0.05)
            return
        if self.path != "/ws" or self.headers.get("Upgrade", "").lower() != "websocket":
            super().do_GET()
            return
        key = self.headers["Sec-WebSocket-Key"].encode()
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        self.end_headers()
        self.wfile.flush()
        echo_frames(self.rfile, self.wfile)
        self.close_connection = True


def echo_frames(rfile: Any, wfile: Any) -> None:
    """Echo every data frame (unmasked, as a server sends); answer a close and stop."""
    while head := rfile.read(2):
        opcode, size = head[0] & 0x0F, head[1] & 0x7F
        if size == 126:
            size = int.from_bytes(rfile.read(2), "big")
        elif size == 127:
            size = int.from_bytes(rfile.read(8), "big")
        mask = rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(rfile.read(size)))
        if size < 126:
            out = bytes([0x80 | opcode, size])
        elif size < 1 << 16:
            out = bytes([0x80 | opcode, 126]) + size.to_bytes(2, "big")
        else:
            out = bytes([0x80 | opcode, 127]) + size.to_bytes(8, "big")
        wfile.write(out + data)
        wfile.flush()
        if opcode == 8:
            return


def _announce(portfile: str, port: int) -> None:
    with open(portfile + ".tmp", "w") as f:
        f.write(str(port))
    os.rename(portfile + ".tmp", portfile)


def main() -> None:
    mode, portfile = sys.argv[1], sys.argv[2]
    if mode == "http":
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        _announce(portfile, httpd.server_address[1])
        httpd.serve_forever()
        return
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if mode == "sink":  # small kernel buffers: the stall comes early (accepted sockets inherit it)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    _announce(portfile, server.getsockname()[1])
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn, mode), daemon=True).start()


if __name__ == "__main__":
    main()
