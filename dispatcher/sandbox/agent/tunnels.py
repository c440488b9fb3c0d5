"""The sandbox's side of the tunnels: the egress proxy's listener on its loopback, whose
connections travel to the server over the agent's channel (``protocol.py``: ``tunnel_listen`` and
the tunnel frames), and the connections the server opens to a port of that loopback
(``tunnel_connect``: a preview or a port-forward), carried with the same frames and windows.

The server decides everything (policy, names, the outbound connection); the agent only carries
bytes. One thread serves the listener and every connection with a selector, so a flood of
connections costs no pid (threads take pids like processes do) and a stalled one blocks none of
the others. Each connection sends at most its window (``HOST_WINDOW``) ahead of the server's
credit, and the agent holds at most a window (``SANDBOX_WINDOW``) of the server's bytes per
connection, so neither end buffers without bound.

The server's bytes arrive on the reader thread, which writes them to the connection's socket
itself (never blocking: the socket is non-blocking) while nothing of that connection waits; what
the socket does not take waits in ``pending`` for the tunnel thread, which writes it once the
socket is writable. A download thus costs no hand-over between threads. A lock per connection
orders the two threads' writes and the socket's close. Everything else from the server (credit,
close) is queued for the tunnel thread, which a byte on a socket pair wakes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import selectors
import socket
import sys
import threading
import time
from collections import deque
from typing import Any

from .peers import ancestry, peer_pid
from .processes import Commands
from .protocol import (
    HOST_WINDOW,
    MAX_CONNECTS,
    MAX_TUNNELS,
    SANDBOX_WINDOW,
    TUNNEL_CHUNK,
    Error,
    Listening,
    Send,
    TunnelClose,
    TunnelClosed,
    TunnelConnect,
    TunnelCredit,
    TunnelData,
    TunnelEof,
    TunnelListen,
    TunnelOpened,
    TunnelSend,
    TunnelShut,
    TunnelWindow,
)
from .workspace import OpError

CLOSE_FLUSH_SECONDS = 10.0
"""How long a connection the server closed may take to accept the bytes still owed to it."""
_CREDIT_STEP = SANDBOX_WINDOW // 2
"""Bytes handed on before the server is told: a credit frame per half window, not per chunk. It
never stalls the server: a server out of window has a whole window here, so it gets credit as
soon as half of that is written."""


def proxy_env(port: int) -> dict[str, str]:
    """What tells pip, npm, git, curl, apt and urllib to use the proxy.

    ``PIP_RETRIES=1``: pip retries a refused ``CONNECT`` like a network failure, five times with
    backoff (7.5 s); one immediate retry keeps a real blip survivable and a refusal under a second.
    """
    url = f"http://127.0.0.1:{port}"
    env = {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
    env.update(NO_PROXY="localhost,127.0.0.1", no_proxy="localhost,127.0.0.1", PIP_RETRIES="1")
    return env


class _Conn:
    """One connection: accepted from the sandbox, or connected for the server (``connected``)."""

    def __init__(self, conn: int, sock: socket.socket, rid: int | None = None) -> None:
        self.conn = conn
        self.sock = sock
        self.rid = rid  # a connected one's request, its frames' id (None: the listener's)
        self.connecting = 0  # the port its connect() to is under way (0: none): writable means done
        self.window = HOST_WINDOW  # bytes we may still send to the server
        self.reading = True  # until the sandbox side half-closed
        self.shut = False  # the server half-closed: shut our writing once pending is written
        self.shut_done = False
        self.closing_since: float | None = None  # the server closed it: flush, then close
        self.events = 0
        # Shared by the reader thread and the tunnel thread, under ``lock``:
        self.lock = threading.Lock()
        self.pending: deque[memoryview] = deque()  # the server's bytes not yet written to the socket
        self.written = 0  # written since the last credit we gave
        self.closed = False  # the socket is closed: nothing may be written to it any more

    def write(self, data: memoryview) -> int | None:
        """Queue ``data`` and write what the socket takes of the queue, without blocking; the
        bytes to credit the server with now (None: the socket failed, the tunnel thread drops it).
        Under ``lock``."""
        pending = self.pending
        if data:
            pending.append(data)
        while pending and not self.closed:
            try:
                n = self.sock.send(pending[0])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                return None
            self.written += n
            if n < len(pending[0]):  # the socket is full: the rest waits for it, uncopied
                pending[0] = pending[0][n:]
                break
            pending.popleft()
        if self.written >= _CREDIT_STEP:
            credit, self.written = self.written, 0
            return credit
        return 0


class Tunnels:
    """The listener and its connections; ``listen`` starts them, the other handlers feed them."""

    def __init__(self, send: Send, commands: Commands) -> None:
        self._send = send
        self._commands = commands
        self._rid: int | None = None
        self._listener: socket.socket | None = None
        self._inbox: queue.SimpleQueue[tuple[str, int, Any]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._conns: dict[int, _Conn] = {}
        self._connected = 0  # how many of ``_conns`` the server opened (``connect``)
        self._next = 1
        self._running = False  # the tunnel thread was started
        self._stopped = False
        self._shut = False  # shutdown() ran (once is enough)
        self._woken = False  # a wake-up byte is on its way: later posts need not send another

    # -- the reader thread's side -----------------------------------------------------------

    def listen(self, rid: int, request: TunnelListen) -> None:
        """Bind, answer ``listening``, and start the tunnel thread; the request stays open.

        Listening again re-homes the listener to this request: a server attached again to this
        agent (a Kubernetes Pod's stdin stays open across a server restart) takes it over, and the
        connections the previous server served are closed.
        """
        if self._rid is not None:
            if request.port not in (0, self._port()):
                raise OpError("bad_request", f"the agent already listens for tunnels on port {self._port()}")
            self._commands.add_env(request.env)
            self._post("rehome", 0, rid)
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", request.port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            name = errno.errorcode.get(exc.errno or 0, "EIO")
            raise OpError(name, f"cannot listen on 127.0.0.1:{request.port}: {exc.strerror}") from None
        port = sock.getsockname()[1]
        self._listener, self._rid = sock, rid
        self._commands.add_env({**proxy_env(port), **request.env})
        self._post("listen", 0, sock)
        self._start()
        self._send(rid, Listening(port))

    def connect(self, rid: int, request: TunnelConnect) -> None:
        """Have the tunnel thread connect to ``127.0.0.1:port``; it answers on ``rid``."""
        if self._shut:
            raise OpError("bad_request", "the agent is shutting down")
        self._post("connect", 0, (rid, request.port))
        self._start()

    def _start(self) -> None:
        if self._running:
            return
        self._running = True
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        threading.Thread(target=self._run, name="tunnels", daemon=True).start()

    def _port(self) -> int:
        assert self._listener is not None
        port: int = self._listener.getsockname()[1]
        return port

    def data(self, rid: int, request: TunnelSend) -> None:
        """Write the bytes now, as far as the socket takes them (see the module's docstring)."""
        c = self._conns.get(request.conn)
        if c is None:
            return  # closed on our side meanwhile: its late frames are dropped
        with c.lock:
            if c.closed:
                return
            waiting = bool(c.pending)  # then the tunnel thread already waits for room
            credit = c.write(memoryview(request.data))
            left = bool(c.pending)
        if credit:
            self._emit(TunnelWindow(c.conn, credit), c)
        if credit is None or (left and not waiting):
            self._post("flush", c.conn, None)  # the tunnel thread waits for room, or drops it

    def close(self, rid: int, request: TunnelClose) -> None:
        self._post("close", request.conn, None)

    def shut(self, rid: int, request: TunnelShut) -> None:
        self._post("shut", request.conn, None)

    def credit(self, rid: int, request: TunnelCredit) -> None:
        self._post("credit", request.conn, request.credit)

    def shutdown(self) -> None:
        if self._shut:
            return
        self._shut = self._stopped = True
        self._post("stop", 0, None)
        if not self._running:  # no tunnel thread ever ran to close these
            for sock in (self._wake_r, self._wake_w):
                sock.close()
            self._sel.close()

    def _post(self, what: str, conn: int, value: Any) -> None:
        self._inbox.put((what, conn, value))
        if self._woken:  # the tunnel thread has not drained the inbox since: it will see this
            return
        self._woken = True
        with contextlib.suppress(OSError):  # full: a wake-up is already pending
            self._wake_w.send(b"\0")

    # -- the tunnel thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopped:
                timeout = 1.0 if any(c.closing_since for c in self._conns.values()) else None
                for key, mask in self._sel.select(timeout):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._drain_inbox()
                    else:
                        self._serve(key.data, mask)
                self._expire_closing()
        except Exception as exc:  # never silently: the host sees connections fail, this says why
            print(f"agent: tunnel thread failed: {exc!r}", file=sys.stderr)
        finally:
            for c in list(self._conns.values()):
                with c.lock:
                    c.closed = True
                    c.sock.close()
            if self._listener is not None:
                self._listener.close()
            while True:  # connects never served: their requests still wait for an answer
                try:
                    what, _, value = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if what == "connect":
                    self._send(value[0], Error("internal", "the agent's tunnels stopped"))
            for sock in (self._wake_r, self._wake_w):
                sock.close()
            self._sel.close()

    def _emit(self, reply: Any, c: _Conn | None = None) -> None:
        """Send a frame of ``c`` (None: of the listener) on its request's id."""
        rid = c.rid if c is not None and c.rid is not None else self._rid
        assert rid is not None
        if not self._send(rid, reply):
            self._stopped = True  # nobody reads the channel any more

    def _accept(self) -> None:
        assert self._listener is not None
        while len(self._conns) - self._connected < MAX_TUNNELS:  # the listener's own, apart
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: try again on the next connection
                print(f"agent: tunnel accept failed: {exc!r}", file=sys.stderr)
                return
            sock.setblocking(False)
            c = _Conn(self._next, sock)
            self._next += 1
            self._conns[c.conn] = c
            pid = peer_pid(sock)
            exec_id = self._commands.exec_of(ancestry(pid)) if pid is not None else None
            self._emit(TunnelOpened(c.conn, exec_id))
            self._update(c)
        # Full: stop accepting until one closes (the rest wait in the backlog).
        self._sel.unregister(self._listener)

    def _drain_inbox(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        # After the bytes are read, before the queue is: a post from now on sends a byte again,
        # and one that saw the flag still set was queued before a byte still unread.
        self._woken = False
        while True:
            try:
                what, conn, value = self._inbox.get_nowait()
            except queue.Empty:
                return
            if what == "stop":
                self._stopped = True
                return
            if what == "listen":
                try:
                    self._sel.get_key(value)
                except KeyError:  # (a dropped connection may have registered it already)
                    self._sel.register(value, selectors.EVENT_READ, None)
                continue
            if what == "rehome":
                for old in list(self._conns.values()):
                    self._drop(old)  # told on the previous request, which nobody reads now
                self._rid = value
                self._emit(Listening(self._port()))
                continue
            if what == "connect":
                self._connect(*value)
                continue
            c = self._conns.get(conn)
            if c is None:
                continue  # closed on our side meanwhile: its late frames are dropped
            if what == "flush":
                self._flush(c)
            elif what == "credit":
                c.window = min(c.window + value, HOST_WINDOW)
            elif what == "close":
                c.reading = False
                c.closing_since = time.monotonic()
                self._flush(c)
            elif what == "shut" and c.rid is not None:
                c.shut = True
                self._flush(c)
            if c.conn in self._conns:
                self._update(c)

    def _connect(self, rid: int, port: int) -> None:
        """Connect to ``127.0.0.1:port`` without blocking; ``tunnel_open`` once it is connected."""
        if self._connected >= MAX_CONNECTS:
            self._send(rid, Error("too_many", f"{MAX_CONNECTS} connections to the sandbox's ports are open"))
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(("127.0.0.1", port))
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self._refuse(rid, port, code)
            return
        c = _Conn(self._next, sock, rid)
        self._next += 1
        self._conns[c.conn] = c
        self._connected += 1
        if code == 0:
            self._emit(TunnelOpened(c.conn), c)
        else:
            c.connecting = port
            self._sel.register(sock, selectors.EVENT_WRITE, c)
            c.events = selectors.EVENT_WRITE
            return
        self._update(c)

    def _refuse(self, rid: int, port: int, code: int) -> None:
        name = errno.errorcode.get(code, "EIO")
        self._send(rid, Error(name, f"cannot connect to 127.0.0.1:{port}: {os.strerror(code)}"))

    def _connected_now(self, c: _Conn) -> None:
        """A connect under way finished: open, or refused (then the connection never was)."""
        port, c.connecting = c.connecting, 0
        code = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self._conns.pop(c.conn, None)
            self._connected -= 1
            self._sel.unregister(c.sock)
            c.sock.close()
            assert c.rid is not None
            self._refuse(c.rid, port, code)
            return
        self._emit(TunnelOpened(c.conn), c)
        self._update(c)

    def _serve(self, c: _Conn, mask: int) -> None:
        if c.connecting:
            self._connected_now(c)
            return
        if mask & selectors.EVENT_WRITE:
            self._flush(c)
        if c.conn in self._conns and mask & selectors.EVENT_READ and c.reading and c.window > 0:
            try:
                data = c.sock.recv(min(TUNNEL_CHUNK, c.window))
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                self._drop(c)
                return
            if data == b"":
                c.reading = False
                self._emit(TunnelEof(c.conn), c)
                if c.shut_done:  # both sides are done: nothing more to carry
                    self._drop(c)
                    return
            elif data:
                c.window -= len(data)
                self._emit(TunnelData(c.conn, data), c)
        if c.conn in self._conns:
            self._update(c)

    def _flush(self, c: _Conn) -> None:
        with c.lock:
            credit = c.write(memoryview(b""))
            done = c.closing_since is not None and not c.pending
            pending = bool(c.pending)
        if credit is None:
            self._drop(c)
            return
        if credit:
            self._emit(TunnelWindow(c.conn, credit), c)
        if done:
            self._drop(c, shutdown=True)
        elif c.shut and not c.shut_done and not pending:
            c.shut_done = True
            with contextlib.suppress(OSError):
                c.sock.shutdown(socket.SHUT_WR)
            if not c.reading:  # the sandbox side had ended already
                self._drop(c)

    def _update(self, c: _Conn) -> None:
        with c.lock:
            writing = bool(c.pending)
        events = (selectors.EVENT_READ if c.reading and c.window > 0 else 0) | (
            selectors.EVENT_WRITE if writing else 0
        )
        if events == c.events:
            return
        if c.events and events:
            self._sel.modify(c.sock, events, c)
        elif events:
            self._sel.register(c.sock, events, c)
        else:
            self._sel.unregister(c.sock)
        c.events = events

    def _drop(self, c: _Conn, *, shutdown: bool = False) -> None:
        """Forget a connection and tell the server it is gone (``shutdown``: after what it sent)."""
        if self._conns.pop(c.conn, None) is None:
            return
        if c.rid is not None:
            self._connected -= 1
        if c.events:
            self._sel.unregister(c.sock)
            c.events = 0
        with c.lock:  # not while the reader thread writes to it
            c.closed = True
            if shutdown:
                with contextlib.suppress(OSError):
                    c.sock.shutdown(socket.SHUT_WR)
            c.sock.close()
        self._emit(TunnelClosed(c.conn), c)
        if self._listener is not None:
            try:
                self._sel.get_key(self._listener)
            except KeyError:  # it was full: accept again
                self._sel.register(self._listener, selectors.EVENT_READ, None)

    def _expire_closing(self) -> None:
        now = time.monotonic()
        for c in list(self._conns.values()):
            if c.closing_since is not None and now - c.closing_since > CLOSE_FLUSH_SECONDS:
                self._drop(c)
