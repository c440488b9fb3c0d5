"""The one schema: every op and every reply round-trips through both ends' code, byte for byte
what the wire carried before the schema existed (protocol version 4)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher.sandbox.agent import protocol as p
from dispatcher.sandbox.agent.codec import JOIN_BELOW
from dispatcher.sandbox.agent.protocol import (
    PREFIX,
    BadMessage,
    ProtocolError,
    decode_header,
    decode_request,
    encode_frame,
    encode_reply,
    encode_request,
    frame_writes,
    response_head,
)

# (request, the header the host built by hand before protocol.py, its payload)
REQUESTS: list[tuple[p.Request[Any], dict[str, Any], bytes]] = [
    (p.Ping(), {"op": "ping"}, b""),
    (p.Read("a", 10, True), {"op": "read", "path": "a", "max_bytes": 10, "strict": True}, b""),
    (
        p.Read("a", 10, False, approved="b/a"),
        {"op": "read", "path": "a", "max_bytes": 10, "strict": False, "approved": "b/a"},
        b"",
    ),
    (p.Write("a", b"\x00\xff"), {"op": "write", "path": "a"}, b"\x00\xff"),
    (
        p.Write("a", b"x", approved="a", expect_sha256="absent"),
        {"op": "write", "path": "a", "approved": "a", "expect_sha256": "absent"},
        b"x",
    ),
    (p.Append("a", b"more"), {"op": "append", "path": "a"}, b"more"),
    (p.Exists("a"), {"op": "exists", "path": "a"}, b""),
    (p.Stat("a"), {"op": "stat", "path": "a"}, b""),
    (p.Stat("a", approved="x"), {"op": "stat", "path": "a", "approved": "x"}, b""),
    (p.ListDir(".", 5), {"op": "list", "path": ".", "limit": 5}, b""),
    (p.ListDir(".", 0, approved="."), {"op": "list", "path": ".", "limit": 0, "approved": "."}, b""),
    (p.Delete("a"), {"op": "delete", "path": "a"}, b""),
    (p.Resolve("l\udcff"), {"op": "resolve", "path": "l\udcff"}, b""),
    (
        p.Exec("echo", ".", {"A": "1"}),
        {"op": "exec", "command": "echo", "cwd": ".", "env": {"A": "1"}, "stdin": False},
        b"",
    ),
    (
        p.Exec("cat", "d", {}, b"in", approved_cwd="d"),
        {"op": "exec", "command": "cat", "cwd": "d", "env": {}, "stdin": True, "approved_cwd": "d"},
        b"in",
    ),
    (p.Exec("true", stdin=b""), {"op": "exec", "command": "true", "cwd": ".", "env": {}, "stdin": True}, b""),
    (p.SendSignal(3, "TERM"), {"op": "signal", "exec_id": 3, "signal": "TERM"}, b""),
    (p.Procs(), {"op": "procs", "kill": False}, b""),
    (
        p.Procs(kill=True, spare_exec_sessions=True),
        {"op": "procs", "kill": True, "spare_exec_sessions": True},
        b"",
    ),
    # protocol 6: pausing what cannot be frozen
    (p.Pause(True), {"op": "pause", "paused": True}, b""),
    (p.Pause(False), {"op": "pause", "paused": False}, b""),
    (
        p.UntarBegin(".", 10, 100),
        {"op": "untar_begin", "path": ".", "max_files": 10, "max_bytes": 100},
        b"",
    ),
    (p.UntarChunk(4, b"tar"), {"op": "untar_chunk", "upload": 4}, b"tar"),
    (p.UntarEnd(4, True), {"op": "untar_end", "upload": 4, "commit": True}, b""),
    (p.TarBegin("d", 7), {"op": "tar_begin", "path": "d", "max_bytes": 7}, b""),
    (p.TarRead(5), {"op": "tar_read", "download": 5}, b""),
    (p.TarEnd(5), {"op": "tar_end", "download": 5}, b""),
    # protocol 5: the egress tunnels
    (p.TunnelListen(3128), {"op": "tunnel_listen", "port": 3128, "env": {}}, b""),
    (
        p.TunnelListen(0, {"SSL_CERT_FILE": "/c"}),
        {"op": "tunnel_listen", "port": 0, "env": {"SSL_CERT_FILE": "/c"}},
        b"",
    ),
    (p.TunnelSend(2, b"GET"), {"op": "tunnel_data", "conn": 2}, b"GET"),
    (p.TunnelClose(2), {"op": "tunnel_close", "conn": 2}, b""),
    (p.TunnelCredit(2, 4096), {"op": "tunnel_credit", "conn": 2, "credit": 4096}, b""),
    # protocol 9: the host's connections to the sandbox's ports
    (p.TunnelConnect(8000), {"op": "tunnel_connect", "port": 8000}, b""),
    (p.TunnelShut(2), {"op": "tunnel_shut", "conn": 2}, b""),
    # protocol 8: the process table, and exec's leftovers and shell state
    (
        p.Exec("cd d", leave_as="p_1", capture_state=True),
        {
            "op": "exec",
            "command": "cd d",
            "cwd": ".",
            "env": {},
            "stdin": False,
            "leave_as": "p_1",
            "capture_state": True,
        },
        b"",
    ),
    (
        p.ProcStart("p_1", "serve", "app", {"A": "1"}, "toolu_1", 4096),
        {
            "op": "proc_start",
            "process_id": "p_1",
            "command": "serve",
            "cwd": "app",
            "env": {"A": "1"},
            "tool_use_id": "toolu_1",
            "ring_bytes": 4096,
        },
        b"",
    ),
    (
        p.ProcStart("p_2", "x"),
        {"op": "proc_start", "process_id": "p_2", "command": "x", "cwd": ".", "env": {}},
        b"",
    ),
    (p.ProcListRequest(), {"op": "proc_list"}, b""),
    (
        p.ProcRead("p_1", 10, 2.5, 100),
        {"op": "proc_read", "process_id": "p_1", "after": 10, "wait_seconds": 2.5, "max_bytes": 100},
        b"",
    ),
    (p.ProcWatch("p_1", 7), {"op": "proc_watch", "process_id": "p_1", "after": 7}, b""),
    (p.ProcUnwatch(12), {"op": "proc_unwatch", "watch": 12}, b""),
    (p.ProcInput("p_1", b"y\n", True), {"op": "proc_input", "process_id": "p_1", "close": True}, b"y\n"),
    (
        p.ProcSignal("p_1", "KILL", 3.0),
        {"op": "proc_signal", "process_id": "p_1", "signal": "KILL", "grace_seconds": 3.0},
        b"",
    ),
]

INFO = p.ProcInfo(
    "p_1", "serve", ".", 42, "exited", 0, None, 1.5, 2.5, "toolu_1", 300, 100, 4096, False, "background"
)
INFO_HEADER = {
    "process_id": "p_1",
    "command": "serve",
    "cwd": ".",
    "pid": 42,
    "state": "exited",
    "exit_code": 0,
    "signal": None,
    "started": 1.5,
    "ended": 2.5,
    "tool_use_id": "toolu_1",
    "end": 300,
    "first": 100,
    "ring_bytes": 4096,
    "stdin_open": False,
    "origin": "background",
}

# (the request it answers, reply, the header the agent built by hand, its payload)
REPLIES: list[tuple[p.Request[Any], p.Reply, dict[str, Any], bytes]] = [
    (p.Ping(), p.Pong(4), {"type": "result", "version": 4}, b""),
    (p.Read("a", 10, True), p.ReadResult(3, b"abc"), {"type": "result", "size": 3}, b"abc"),
    (p.Write("a", b""), p.Done(), {"type": "result"}, b""),
    (p.Exists("a"), p.ExistsResult(True), {"type": "result", "exists": True}, b""),
    (
        p.Stat("a"),
        p.StatResult("d/a", "file", 3, 0o644, 1.5),
        {"type": "result", "path": "d/a", "kind": "file", "size": 3, "mode": 0o644, "mtime": 1.5},
        b"",
    ),
    (
        p.ListDir(".", 5),
        p.ListResult(True, (p.ListEntry("a", "file", 1), p.ListEntry("l", "symlink", 2, target=""))),
        {"type": "result", "truncated": True},
        json.dumps(
            [
                {"name": "a", "kind": "file", "size": 1},
                {"name": "l", "kind": "symlink", "size": 2, "target": ""},
            ]
        ).encode("ascii"),
    ),
    (p.Resolve("x"), p.ResolveResult("d/x"), {"type": "result", "path": "d/x"}, b""),
    (p.SendSignal(1, "KILL"), p.Delivered(False), {"type": "result", "delivered": False}, b""),
    (
        p.Procs(),
        p.ProcsResult(3, 2, 1),
        {"type": "result", "processes": 3, "killed": 2, "left": 1},
        b"",
    ),
    (p.Pause(True), p.Paused(4), {"type": "result", "processes": 4}, b""),
    (p.UntarBegin(".", 1, 1), p.UploadStarted(9), {"type": "result", "upload": 9}, b""),
    (
        p.UntarEnd(9, True),
        p.UntarResult(2, 1, 10),
        {"type": "result", "files": 2, "directories": 1, "bytes": 10},
        b"",
    ),
    (p.TarBegin(".", 1), p.DownloadStarted(9), {"type": "result", "download": 9}, b""),
    (p.TarRead(9), p.TarChunk(False, b"chunk"), {"type": "result", "eof": False}, b"chunk"),
    (p.TarRead(9), p.TarChunk(True), {"type": "result", "eof": True}, b""),
    (p.Exec("x"), p.Output("stderr", b"oops"), {"type": "output", "stream": "stderr"}, b"oops"),
    (p.Exec("x"), p.Exit(0, None), {"type": "exit", "exit_code": 0, "signal": None}, b""),
    (p.Exec("x"), p.Exit(None, 9), {"type": "exit", "exit_code": None, "signal": 9}, b""),
    (
        p.Exec("x"),
        p.Error("proc_limit", "full", 7),
        {"type": "error", "code": "proc_limit", "message": "full", "processes": 7},
        b"",
    ),
    (
        p.Read("a", 1, True),
        p.Error("ENOENT", "a: gone"),
        {"type": "error", "code": "ENOENT", "message": "a: gone"},
        b"",
    ),
    (p.TunnelListen(0), p.Listening(41234), {"type": "listening", "port": 41234}, b""),
    (p.TunnelListen(0), p.TunnelOpened(1, 7), {"type": "tunnel_open", "conn": 1, "exec_id": 7}, b""),
    (p.TunnelListen(0), p.TunnelOpened(2), {"type": "tunnel_open", "conn": 2}, b""),
    (p.TunnelConnect(80), p.TunnelOpened(3), {"type": "tunnel_open", "conn": 3}, b""),
    (p.TunnelListen(0), p.TunnelData(1, b"HTTP"), {"type": "tunnel_data", "conn": 1}, b"HTTP"),
    (p.TunnelListen(0), p.TunnelEof(1), {"type": "tunnel_eof", "conn": 1}, b""),
    (p.TunnelListen(0), p.TunnelClosed(1), {"type": "tunnel_close", "conn": 1}, b""),
    (p.TunnelListen(0), p.TunnelWindow(1, 65536), {"type": "tunnel_credit", "conn": 1, "credit": 65536}, b""),
    # protocol 8
    (
        p.Exec("x", capture_state=True),
        p.Exit(0, None, ("p_1",), "sub", {"FOO": "bar"}, ("OLD",)),
        {
            "type": "exit",
            "exit_code": 0,
            "signal": None,
            "left": ["p_1"],
            "cwd": "sub",
            "unset": ["OLD"],
            "env": True,
        },
        b'{"FOO": "bar"}',
    ),
    (p.ProcStart("p_1", "serve"), INFO, {"type": "result", **INFO_HEADER}, b""),
    (
        p.ProcListRequest(),
        p.ProcList((INFO,)),
        {"type": "result"},
        json.dumps([INFO_HEADER]).encode("ascii"),
    ),
    (
        p.ProcRead("p_1", 90),
        p.ProcOutput(
            (p.ProcChunk("stdout", 100, b"ab"), p.ProcChunk("stderr", 102, b"c")),
            103,
            10,
            "running",
            None,
            None,
        ),
        {
            "type": "result",
            "pieces": [["stdout", 100, 2], ["stderr", 102, 1]],
            "next": 103,
            "lost": 10,
            "state": "running",
            "exit_code": None,
            "signal": None,
        },
        b"abc",
    ),
    (
        p.ProcWatch("p_1"),
        p.ProcData("stdout", 5, b"hi"),
        {"type": "proc_data", "stream": "stdout", "cursor": 5},
        b"hi",
    ),
    (
        p.ProcWatch("p_1"),
        p.ProcData("stderr", 9, b"x", 4),
        {"type": "proc_data", "stream": "stderr", "cursor": 9, "lost": 4},
        b"x",
    ),
]


def _split(frame: bytes) -> tuple[dict[str, Any], bytes]:
    header_len, payload_len = PREFIX.unpack(frame[: PREFIX.size])
    header = decode_header(frame[PREFIX.size : PREFIX.size + header_len])
    payload = frame[PREFIX.size + header_len :]
    assert len(payload) == payload_len
    return header, payload


def test_every_op_and_every_reply_type_is_covered() -> None:
    assert {request.OP for request, _, _ in REQUESTS} == set(p.REQUESTS)
    replies = {type(reply) for _, reply, _, _ in REPLIES}
    assert replies == {
        cls for cls in vars(p).values() if isinstance(cls, type) and issubclass(cls, p.Reply)
    } - {p.Reply}


def test_a_frame_is_one_write_unless_its_payload_is_large() -> None:
    small = b"s" * (JOIN_BELOW - 1)
    assert frame_writes({"id": 1}, small) == (encode_frame({"id": 1}, small),)
    large = b"l" * JOIN_BELOW
    head, payload = frame_writes({"id": 1}, large)
    assert payload is large  # written as it is, not copied onto its head
    assert head + payload == encode_frame({"id": 1}, large)
    assert _split(head + payload) == ({"id": 1}, large)


@pytest.mark.parametrize(("request_", "header", "payload"), REQUESTS, ids=lambda v: type(v).__name__)
def test_requests_round_trip_host_to_agent_in_the_old_bytes(
    request_: p.Request[Any], header: dict[str, Any], payload: bytes
) -> None:
    frame = encode_request(12, request_)  # the host's side
    assert frame == encode_frame({"id": 12, **header}, payload)  # the wire of protocol version 4
    got_header, got_payload = _split(frame)
    assert decode_request(got_header, got_payload) == request_  # the agent's side


@pytest.mark.parametrize(("request_", "reply", "header", "payload"), REPLIES, ids=lambda v: type(v).__name__)
def test_replies_round_trip_agent_to_host_in_the_old_bytes(
    request_: p.Request[Any], reply: p.Reply, header: dict[str, Any], payload: bytes
) -> None:
    frame = encode_reply(12, reply)  # the agent's side
    assert frame == encode_frame({"id": 12, **header}, payload)
    got_header, got_payload = _split(frame)
    rid, kind = response_head(got_header)  # the host's side, as AgentLink decodes them
    assert (rid, kind) == (12, reply.TYPE)
    decoders: dict[str, type[p.Reply]] = {
        cls.TYPE: cls
        for cls in (
            p.Error,
            p.Output,
            p.Exit,
            p.Listening,
            p.TunnelOpened,
            p.TunnelData,
            p.TunnelEof,
            p.TunnelClosed,
            p.TunnelWindow,
            p.ProcData,
        )
    }
    decoded = (
        request_.decode_reply(got_header, got_payload)
        if kind == "result"
        else decoders[kind].decode(got_header, got_payload)
    )
    assert decoded == reply


@pytest.mark.parametrize(
    ("header", "payload", "message"),
    [
        ({"op": "nope"}, b"", "unknown op 'nope'"),
        ({"op": "read", "path": "a", "max_bytes": True, "strict": False}, b"", "'max_bytes' must be int"),
        ({"op": "read", "path": "a", "max_bytes": -1, "strict": False}, b"", "must not be negative"),
        ({"op": "read", "max_bytes": 1, "strict": False}, b"", "'path' must be str"),
        ({"op": "exists", "path": "a", "approved": "a"}, b"", "field 'approved' is a str, for"),
        ({"op": "patch", "path": "a", "old_len": 1}, b"ab", "unknown op 'patch'"),
        ({"op": "exec", "command": "x", "env": {"A=B": "c"}}, b"", "bad environment variable"),
        ({"op": "exec", "command": "x", "stdin": "yes"}, b"", "'stdin' must be bool"),
        ({"op": "signal", "exec_id": 1, "signal": "HUP"}, b"", "unknown signal 'HUP'"),
        ({"op": "untar_end", "upload": 1}, b"", "'commit' must be bool"),
        ({"op": "pause", "paused": 1}, b"", "'paused' must be bool"),
        ({"op": "pause"}, b"", "'paused' must be bool"),
        ({"op": "proc_start", "process_id": "../x", "command": "x"}, b"", "malformed process id"),
        ({"op": "proc_start", "process_id": "p", "command": "x", "ring_bytes": 0}, b"", "must be positive"),
        ({"op": "proc_read", "process_id": "p", "max_bytes": 0}, b"", "out of bounds"),
        ({"op": "proc_read", "process_id": "p", "wait_seconds": 601}, b"", "out of bounds"),
        ({"op": "proc_signal", "process_id": "p", "signal": "STOP"}, b"", "unknown signal 'STOP'"),
        ({"op": "exec", "command": "x", "leave_as": ""}, b"", "malformed process id"),
        ({"op": "tunnel_data", "conn": 1}, b"", "tunnel data size out of bounds"),
        ({"op": "tunnel_credit", "conn": 1, "credit": 0}, b"", "tunnel credit out of bounds"),
        ({"op": "tunnel_credit", "conn": 1, "credit": 1 << 30}, b"", "tunnel credit out of bounds"),
        (
            {"op": "tunnel_credit", "conn": 1, "credit": p.HOST_WINDOW + 1},
            b"",
            "tunnel credit out of bounds",
        ),
        ({"op": "tunnel_data", "conn": 1}, b"x" * (p.TUNNEL_CHUNK + 1), "tunnel data size out of bounds"),
        ({"op": "tunnel_listen", "port": 70000}, b"", "port out of range"),
        ({"op": "tunnel_connect", "port": 0}, b"", "port out of range"),
        ({"op": "tunnel_connect", "port": 65536}, b"", "port out of range"),
        ({"op": "tunnel_connect", "port": -1}, b"", "must not be negative|port out of range"),
        ({"op": "tunnel_listen", "port": 1, "env": {"A=B": "c"}}, b"", "bad environment variable"),
    ],
)
def test_the_agent_refuses_requests_that_break_the_schema(
    header: dict[str, Any], payload: bytes, message: str
) -> None:
    with pytest.raises(BadMessage, match=message):
        decode_request(header, payload)


@pytest.mark.parametrize(
    ("request_", "header", "payload"),
    [
        (p.Read("a", 2, True), {"type": "result", "size": 3}, b"abc"),  # more than was asked
        (p.Read("a", 9, True), {"type": "result", "size": -1}, b""),
        (
            p.ListDir(".", 1),
            {"type": "result", "truncated": False},
            b'[{"name":"a","kind":"file","size":1},{"name":"b","kind":"file","size":1}]',
        ),
        (
            p.ListDir(".", 5),
            {"type": "result", "truncated": False},
            b'[{"name":"../x","kind":"file","size":1}]',
        ),
        (
            p.Stat("a"),
            {"type": "result", "path": "/etc", "kind": "file", "size": 1, "mode": 0, "mtime": 0},
            b"",
        ),
        (
            p.Stat("a"),
            {"type": "result", "path": "a", "kind": "file", "size": 1, "mode": 0, "mtime": True},
            b"",
        ),
        (p.Resolve("a"), {"type": "result", "path": "a/../b"}, b""),
        (p.Procs(), {"type": "result", "processes": -1, "killed": 0, "left": 0}, b""),
        (p.Pause(False), {"type": "result", "processes": -1}, b""),
        (p.Pause(True), {"type": "result"}, b""),
        (p.UntarEnd(1, True), {"type": "result", "files": 1, "directories": 0}, b""),
        (
            p.ProcRead("p", 0, 0, 2),  # more than was asked
            {"type": "result", "pieces": [["stdout", 0, 3]], "next": 3, "lost": 0, "state": "running"},
            b"abc",
        ),
        (
            p.ProcRead("p", 5),  # not where it was asked
            {"type": "result", "pieces": [["stdout", 0, 3]], "next": 3, "lost": 0, "state": "running"},
            b"abc",
        ),
        (
            p.ProcRead("p"),  # pieces with a gap
            {
                "type": "result",
                "pieces": [["stdout", 0, 1], ["stderr", 5, 2]],
                "next": 7,
                "lost": 0,
                "state": "exited",
            },
            b"abc",
        ),
        (
            p.ProcRead("p"),  # pieces longer than the payload
            {"type": "result", "pieces": [["stdout", 0, 9]], "next": 9, "lost": 0, "state": "exited"},
            b"abc",
        ),
        (p.ProcListRequest(), {"type": "result"}, b'[{"process_id": "p"}]'),
        (p.ProcStart("p", "x"), {"type": "result", **INFO_HEADER, "state": "asleep"}, b""),
        (p.ProcStart("p", "x"), {"type": "result", **INFO_HEADER, "state": "running"}, b""),
    ],
)
def test_the_host_refuses_replies_that_break_the_schema(
    request_: p.Request[Any], header: dict[str, Any], payload: bytes
) -> None:
    with pytest.raises(ProtocolError):
        request_.decode_reply(header, payload)


def test_frames_without_a_usable_id_or_type_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError, match="agent rejected a frame: garbled"):
        response_head({"id": None, "type": "error", "code": "protocol", "message": "garbled"})
    with pytest.raises(ProtocolError, match="integer id"):
        response_head({"id": "1", "type": "result"})
    with pytest.raises(ProtocolError):
        response_head({"id": 1})
    with pytest.raises(ProtocolError):
        p.Exit.decode({"exit_code": 0, "signal": 9})
    with pytest.raises(ProtocolError):
        p.Output.decode({"stream": "stdin"}, b"x")
