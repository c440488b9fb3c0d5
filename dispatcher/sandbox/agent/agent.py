"""In-sandbox agent: runs commands and workspace file operations for the dispatcher.

Run as ``python3 -I agent.pyz --root /workspace`` (``sandbox_images/build.sh`` packs this package
into that zipapp) or ``python3 -I dispatcher/sandbox/agent --root DIR`` (the local backend runs the
directory). Requests arrive on stdin, responses leave on stdout, diagnostics go to stderr. Stdlib
only: it runs in any image with python3 >= 3.9.

This module reads frames and routes each request by its type (``protocol.py`` is the schema) to
the part that serves it: the workspace's file operations, commands (``processes.py``), the
process table (``table.py``), uploads and downloads (``transfers.py``), the egress tunnels
(``tunnels.py``). Each request runs on a worker thread started with the agent, or, for what never
blocks, on the reader thread; answers are written under one lock, on the channel the request came
from only. When the channel ends in a sandbox container, the agent waits for the next agent (or
the restarted server) to hand it a new channel (``handover.py``) instead of exiting.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import IO, Any, cast

from .handover import Channel, Successors, follow, hand_over, waiting_name
from .processes import Commands
from .protocol import (
    CHUNK,
    CONNECT_FAILED,
    MAX_HEADER,
    MAX_PAYLOAD,
    PREFIX,
    PROTOCOL_VERSION,
    Append,
    BadMessage,
    Delete,
    Done,
    Error,
    Exec,
    Exists,
    ExistsResult,
    ListDir,
    ListResult,
    Pause,
    Ping,
    Pong,
    ProcInput,
    ProcList,
    ProcListRequest,
    ProcRead,
    Procs,
    ProcSignal,
    ProcStart,
    ProcUnwatch,
    ProcWatch,
    ProtocolError,
    Read,
    ReadResult,
    Reply,
    Request,
    Resolve,
    ResolveResult,
    Send,
    SendSignal,
    Stat,
    TarBegin,
    TarEnd,
    TarRead,
    TunnelClose,
    TunnelConnect,
    TunnelCredit,
    TunnelListen,
    TunnelSend,
    TunnelShut,
    UntarBegin,
    UntarChunk,
    UntarEnd,
    Write,
    decode_header,
    decode_prefix,
    decode_request,
    handover_identity,
    parse_grants,
    reply_writes,
    request_id,
)
from .table import Limits, ProcessTable
from .transfers import Transfers
from .tunnels import Tunnels
from .workers import EXEC_WORKERS, EXEC_WORKERS_MAX, FILE_WORKERS, FILE_WORKERS_MAX, Workers
from .workspace import OpError, Workspace, os_error

Handler = Callable[[int, Any], "Reply | None"]
"""Serves one request (given its id); returns the answer, or None when it sends its own."""
READER, FILES, COMMANDS = "reader", "files", "commands"
"""Where a request runs: on the reader thread (it never blocks), a file-op worker, a command's."""


def _paths(handler: Handler) -> Handler:
    """``handler`` with an ``OSError`` answered as its errno, naming the request's path as given."""

    def guarded(rid: int, request: Any) -> Reply | None:
        try:
            return handler(rid, request)
        except OSError as exc:
            raise os_error(exc, getattr(request, "path", ".")) from None

    return guarded


def file_ops(ws: Workspace) -> dict[type[Request[Any]], Handler]:
    """The handlers of the workspace's file operations."""

    def read(rid: int, r: Read) -> ReadResult:
        data, size = ws.read(r.path, r.max_bytes, r.strict, r.approved)
        return ReadResult(size, data)

    def write(rid: int, r: Write) -> Done:
        ws.write(r.path, r.data, r.approved, r.expect_sha256)
        return Done()

    def append(rid: int, r: Append) -> Done:
        ws.append(r.path, r.data)
        return Done()

    def delete(rid: int, r: Delete) -> Done:
        ws.delete(r.path)
        return Done()

    def listing(rid: int, r: ListDir) -> ListResult:
        entries, truncated = ws.list(r.path, r.limit, r.approved)
        return ListResult(truncated, tuple(entries))

    ops: dict[type[Request[Any]], Handler] = {
        Read: read,
        Write: write,
        Append: append,
        Exists: lambda rid, r: ExistsResult(ws.exists(r.path)),
        Stat: lambda rid, r: ws.stat(r.path, r.approved),
        ListDir: listing,
        Delete: delete,
        Resolve: lambda rid, r: ResolveResult(ws.resolve_exact(r.path)),
    }
    return {op: _paths(handler) for op, handler in ops.items()}


class Agent:
    """Reads requests, runs each where its route says, writes responses under one lock."""

    def __init__(
        self,
        root: str,
        out: IO[bytes],
        grants: list[tuple[str, str]] | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.ws = Workspace(root, grants)
        self._out = self._first_out = out
        self._out_lock = threading.Lock()
        self._channel = 0
        """Counts the channels served: a request's answers go out on its own channel only."""
        self._local = threading.local()  # the channel of the request a worker thread serves
        self.successors: Successors | None = None
        """Where to wait for the next channel once this one ends (``handover.py``); None: exit."""
        self._links: list[socket.socket] = []  # successors' links, open while this agent lives
        # Started now, while pids are free: a request is never refused for want of a thread.
        self._pool = Workers("file-op", FILE_WORKERS, FILE_WORKERS_MAX)
        self._exec_pool = Workers("exec", EXEC_WORKERS, EXEC_WORKERS_MAX)
        self.table = ProcessTable(limits)
        self.commands = Commands(self.ws, self.send, self._exec_pool, self.table)
        self._routes = self._channel_routes()

    def _channel_routes(self) -> dict[type[Request[Any]], tuple[str, Handler]]:
        """The routes, with the parts that belong to one channel made anew for it."""
        send = self._send_on(self._channel)
        self.transfers = t = Transfers(self.ws, send)
        self.tunnels = tn = Tunnels(send, self.commands)
        pt = self.table
        return {
            Ping: (READER, lambda rid, r: Pong(PROTOCOL_VERSION)),
            SendSignal: (READER, self.commands.signal),
            Exec: (READER, self._exec),
            Procs: (FILES, self.commands.procs),
            Pause: (FILES, self.commands.pause),
            **{op: (FILES, handler) for op, handler in file_ops(self.ws).items()},
            UntarBegin: (FILES, _paths(t.untar_begin)),
            UntarChunk: (READER, t.untar_chunk),
            UntarEnd: (FILES, _paths(t.untar_end)),
            TarBegin: (FILES, _paths(t.tar_begin)),
            TarRead: (READER, t.tar_read),
            TarEnd: (READER, t.tar_end),
            # The egress proxy's listener: tunnel frames are queued for its thread, never block.
            TunnelListen: (READER, tn.listen),
            TunnelSend: (READER, tn.data),
            TunnelClose: (READER, tn.close),
            TunnelCredit: (READER, tn.credit),
            # Connections the server opens to the sandbox's ports (previews, port-forwards).
            TunnelConnect: (READER, tn.connect),
            TunnelShut: (READER, tn.shut),
            # The process table: what may wait (for output, a grace period) takes a command's thread.
            ProcStart: (FILES, self.commands.start),
            ProcListRequest: (READER, lambda rid, r: ProcList(tuple(pt.records()))),
            ProcRead: (COMMANDS, lambda rid, r: pt.read(r)),
            ProcWatch: (READER, self._watch),
            ProcUnwatch: (READER, lambda rid, r: pt.unwatch(r.watch)),
            ProcInput: (READER, lambda rid, r: pt.write(r.process_id, r.data, r.close)),
            ProcSignal: (COMMANDS, lambda rid, r: pt.signal(r.process_id, r.signal, r.grace_seconds)),
        }

    def _watch(self, rid: int, request: ProcWatch) -> None:
        """Register the watch at once (its ``proc_unwatch`` may follow), then follow on a thread."""
        self.table.begin_watch(rid, request.process_id)

        def stream(rid: int, r: ProcWatch) -> Reply | None:
            return self.table.watch(rid, r, self.send)

        if not self._exec_pool.try_submit(self._guarded, self._channel, rid, stream, request):
            self.table.unwatch(rid)
            self.commands.no_process(rid)

    def _exec(self, rid: int, request: Exec) -> None:
        """Make the exec addressable at once (its ``signal`` may follow before a thread is free:
        read in order, a signal never finds no exec), then run it on a command's thread."""
        self.commands.begin(rid)
        if not self._exec_pool.try_submit(self._guarded, self._channel, rid, self.commands.run, request):
            self.commands.end(rid)
            self.commands.no_process(rid)

    def _send_on(self, channel: int) -> Send:
        """``send`` for threads of one channel's own (transfers, tunnels): silent once it ended."""

        def send(rid: int | None, reply: Reply) -> bool:
            return channel == self._channel and self.send(rid, reply)

        return send

    def send(self, rid: int | None, reply: Reply) -> bool:
        """Write one frame; blocks while the host is slow, which back-pressures commands. A
        request of a channel that ended is answered nowhere (its ids mean nothing on the next)."""
        channel = getattr(self._local, "channel", None)
        if channel is not None and channel != self._channel:
            return False
        writes = reply_writes(rid, reply)
        with self._out_lock:
            try:
                for data in writes:
                    self._out.write(data)
                self._out.flush()
            except (OSError, ValueError):
                return False
        return True

    def serve(self, inp: IO[bytes]) -> int:
        """Handle requests until stdin closes, then on each channel a successor hands over (when
        ``successors`` is set); returns the exit status."""
        clean_eof = False
        first = inp, self._out  # the caller's; those of handed-over channels are ours to close
        try:
            while True:
                code = self._serve_channel(inp)
                clean_eof = code == 0
                self._end_channel()
                taken = self._next_channel() if clean_eof else None
                if taken is None:
                    return code
                ended, inp = inp, taken.inp
                if ended not in first:
                    ended.close()
        finally:
            # In a container, the container bounds what is left; on a host, nothing may outlive us.
            self.shutdown(keep_background=clean_eof and self.commands.in_container)
            for stream in (inp, self._out):
                if stream not in first:
                    with contextlib.suppress(OSError, ValueError):
                        stream.close()

    def _end_channel(self) -> None:
        """What the channel's requests still run ends with it (their answers have nowhere to go)."""
        self._channel += 1
        self.tunnels.shutdown()
        self.commands.end_channel()
        self.table.end_watches()

    def _next_channel(self) -> Channel | None:
        """The channel a successor hands over, once one does; None: this agent exits."""
        if self.successors is None:
            return None
        taken = self.successors.wait()
        if taken is None:
            return None
        self._links.append(taken.successor)
        self.commands.spare(taken.pid)
        with self._out_lock:
            ended, self._out = self._out, taken.out
        if ended is not self._first_out:
            with contextlib.suppress(OSError, ValueError):
                ended.close()
        self._routes = self._channel_routes()
        return taken

    def _serve_channel(self, inp: IO[bytes]) -> int:
        """Handle requests until ``inp`` ends; 0 at a clean end."""
        while True:
            prefix = inp.read(PREFIX.size)
            if not prefix:
                return 0
            try:
                header_len, payload_len = decode_prefix(
                    prefix, max_header=MAX_HEADER, max_payload=MAX_PAYLOAD
                )
            except ProtocolError as exc:
                self.send(None, Error("protocol", str(exc)))
                return 2  # lengths are garbage, so the stream cannot be resynchronised
            raw = inp.read(header_len)
            payload = inp.read(payload_len) if payload_len else b""
            if len(raw) != header_len or len(payload) != payload_len:
                return 2
            try:
                header = decode_header(raw)
            except ProtocolError as exc:
                self.send(None, Error("protocol", str(exc)))
                continue
            try:
                self.dispatch(header, payload)
            except Exception as exc:  # e.g. no thread could start: this request fails, not the agent
                rid = request_id(header)
                print(f"agent: request {rid!r} could not start: {exc!r}", file=sys.stderr)
                self.send(rid, Error("internal", type(exc).__name__))

    def shutdown(self, keep_background: bool = False) -> None:
        """Kill every running command (its answer has nowhere to go).

        ``keep_background``: spare what finished commands left running in the background
        (``cmd &``). So it is on a clean end of stdin in a sandbox container: the server went away
        (restarted) and a new agent will take over the container, or the server is removing the
        container anyway.
        """
        # Nothing still running answers now: a command killed here is not reported as having
        # exited by a signal, so the server sees the agent go (its sandbox stopped), as it did.
        self._channel += 1
        self.tunnels.shutdown()
        self.commands.shutdown(keep_background)
        self._pool.shutdown()
        for link in self._links:  # the successors standing for this agent end with it
            link.close()
        if self.successors is not None:
            self.successors.close()

    def dispatch(self, header: dict[str, Any], payload: bytes) -> None:
        """Route one request; never raises."""
        rid = request_id(header)
        if rid is None:
            self.send(None, Error("bad_request", "missing id"))
            return
        try:
            request = decode_request(header, payload)
        except BadMessage as exc:
            self.send(rid, Error("bad_request", str(exc)))
            return
        where, handler = self._routes[type(request)]
        channel = self._channel
        if where == READER:
            self._guarded(channel, rid, handler, request)
        elif where == FILES:
            self._pool.submit(self._guarded, channel, rid, handler, request)
        elif not self._exec_pool.try_submit(self._guarded, channel, rid, handler, request):
            self._guarded(channel, rid, self.commands.no_process, request)

    def _guarded(self, channel: int, rid: int, handler: Handler, request: Request[Any]) -> None:
        self._local.channel = channel
        try:
            self._answer(rid, handler, request)
        finally:
            self._local.channel = None

    def _answer(self, rid: int, handler: Handler, request: Request[Any]) -> None:
        try:
            reply = handler(rid, request)
        except OpError as exc:
            self.send(rid, exc.reply())
        except Exception as exc:
            print(f"agent: request {rid} failed: {exc!r}", file=sys.stderr)
            self.send(rid, Error("internal", type(exc).__name__))
        else:
            if reply is not None:
                self.send(rid, reply)


def parse_limits(raw: str | None) -> Limits | None:
    """The ``--process-limits`` JSON (an object of ``Limits`` fields) as limits; None: defaults."""
    if raw is None:
        return None
    items = json.loads(raw)
    known = set(Limits.__dataclass_fields__)
    if not isinstance(items, dict) or not set(items) <= known:
        raise ValueError(f"expected an object with some of {sorted(known)}")
    if not all(type(v) is int and v > 0 for v in items.values()):
        raise ValueError("every limit is a positive integer")
    return Limits(**items)


PIPE_BYTES = 1 << 20
"""The capacity asked for the channel's pipes (Linux's default for an unprivileged process may
grant up to 1 MiB): a 64 KiB pipe (the default) splits every large frame into several writes and
wake-ups at both ends."""


def widen_pipe(fd: int) -> None:
    """Ask for a larger pipe buffer; a socket, a tty or a refusal leaves it as it is."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


SOCKET_BYTES = 1 << 20
"""The send and receive buffers asked for the channel's socket (the kernel caps them)."""


def connect(path: str) -> socket.socket:
    """A stream socket connected to the server's listener at ``path``.

    Raises:
        OSError: nothing listens there (or may not be reached).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BYTES)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve the protocol for one workspace root, on stdin/stdout or on the server's
    unix socket (``--connect``)."""
    parser = argparse.ArgumentParser(prog="agent", description="dispatcher sandbox agent")
    parser.add_argument(
        "--version", action="version", version=f"dispatcher-agent protocol {PROTOCOL_VERSION}"
    )
    parser.add_argument("--root", required=True, help="workspace root that every path must stay under")
    parser.add_argument("--grants", help='JSON list of {"path": prefix, "mode": "r" | "rw"}; omit: all')
    parser.add_argument("--process-limits", help="JSON object of process table bounds (table.Limits)")
    parser.add_argument(
        "--connect",
        metavar="SOCKET",
        help="serve on this unix socket, where the server listens, instead of stdin/stdout",
    )
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        print(f"agent: root {args.root!r} is not a directory", file=sys.stderr)
        return 2
    try:
        grants = parse_grants(args.grants)
        limits = parse_limits(args.process_limits)
    except ValueError as exc:
        print(f"agent: --grants or --process-limits: {exc}", file=sys.stderr)
        return 2
    # Who this agent is, as a waiting one compares it (JSON, as it travels).
    identity = handover_identity(args.root, grants)
    waiting = waiting_name(args.root)
    if args.connect is not None:
        try:
            sock = connect(args.connect)
        except OSError as exc:
            print(f"agent: cannot connect to {args.connect}: {exc.strerror or exc}", file=sys.stderr)
            return CONNECT_FAILED
        link = hand_over(waiting, identity, sock.fileno(), sock.fileno())
        if link is not None:  # an earlier agent with a process table serves this channel
            sock.close()
            return follow(link)
        inp = cast("IO[bytes]", sock.makefile("rb", buffering=CHUNK))
        out = cast("IO[bytes]", sock.makefile("wb", buffering=CHUNK))
        # The exec's pipes stay open (private, close-on-exec copies) until this process ends:
        # their end is how the server learns that the agent is gone.
        held: tuple[int, ...] = (os.dup(0), os.dup(1))
    else:
        link = hand_over(waiting, identity, 0, 1)
        if link is not None:  # an earlier agent with a process table serves this channel
            return follow(link)
        # Keep private copies of the protocol fds and point 0/1 elsewhere, so a stray print or an
        # inherited descriptor can never write into (or read from) the protocol stream.
        inp = os.fdopen(os.dup(0), "rb", buffering=CHUNK)
        out = os.fdopen(os.dup(1), "wb", buffering=CHUNK)
        for stream in (inp, out):
            widen_pipe(stream.fileno())
        held = ()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)  # exit through serve()'s cleanup, killing commands
    agent = Agent(args.root, out, grants, limits)
    if agent.commands.in_container:  # on a host, nothing outlives its server's channel
        agent.successors = Successors(waiting, identity)
    try:
        return agent.serve(inp)
    finally:
        for fd in held:
            os.close(fd)
