"""A TCP server the port tests run inside the sandbox (its source is written to the workspace).

``python3 port_server.py MODE PORTFILE``: listens on ``127.0.0.1`` (any free port, written to
PORTFILE once listening) and serves every connection on a thread:

- ``echo``: sends back what it reads as it reads it, and half-closes once it read the end;
- ``count``: reads to the end, then answers ``got N`` (the peer's half-close reached it, and the
  connection still carries the answer);
- ``sink``: reads nothing until a file ``go`` exists, then reads to the end and answers ``got N``;
- ``http``: an HTTP/1.1 server of the working directory's files (``http.server``).
"""

import http.server
import os
import socket
import sys
import threading
import time


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


def _announce(portfile: str, port: int) -> None:
    with open(portfile + ".tmp", "w") as f:
        f.write(str(port))
    os.rename(portfile + ".tmp", portfile)


def main() -> None:
    mode, portfile = sys.argv[1], sys.argv[2]
    if mode == "http":
        http.server.SimpleHTTPRequestHandler.protocol_version = "HTTP/1.1"
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
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
