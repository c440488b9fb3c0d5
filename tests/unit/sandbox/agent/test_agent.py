"""The agent as a process: its codec, and how it answers good, bad and concurrent requests."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.sandbox.agent.protocol import (
    CHUNK,
    MAX_HEADER,
    PREFIX,
    PROTOCOL_VERSION,
    ProtocolError,
    decode_header,
    decode_prefix,
    encode_frame,
)
from dispatcher.sandbox.agent.workspace import OpError, Workspace
from dispatcher.sandbox.local import AGENT_PATH
from tests.polling import until_sync

DEADLINE = 5.0


class AgentProcess:
    """Drives a real agent over its pipes, with a deadline on every read."""

    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, AGENT_PATH, "--root", str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        self._buffer = bytearray()

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        self.send_raw(encode_frame(header, payload))

    def _read_exact(self, n: int) -> bytes | None:
        deadline = time.monotonic() + DEADLINE
        while len(self._buffer) < n:
            left = deadline - time.monotonic()
            assert left > 0, "agent did not answer in time"
            ready, _, _ = select.select([self._fd], [], [], left)
            if ready:
                chunk = os.read(self._fd, 1 << 20)
                if not chunk:
                    return None
                self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def recv(self) -> tuple[dict[str, Any], bytes]:
        prefix = self._read_exact(PREFIX.size)
        assert prefix is not None, "agent closed stdout"
        header_len, payload_len = decode_prefix(prefix, max_header=MAX_HEADER, max_payload=1 << 30)
        header = decode_header(self._read_exact(header_len) or b"")
        payload = self._read_exact(payload_len) if payload_len else b""
        assert payload is not None
        return header, payload

    def call(self, header: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        self.send(header, payload)
        return self.recv()

    def at_eof(self) -> bool:
        return self._read_exact(1) is None

    def close(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        code = self.proc.wait(timeout=DEADLINE)
        self.proc.stdout.close()
        return code


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    root = tmp_path / "ws"
    root.mkdir()
    proc = AgentProcess(root)
    yield proc
    if proc.proc.poll() is None:
        proc.close()
    elif proc.proc.stdout is not None:
        proc.proc.stdout.close()
        assert proc.proc.stdin is not None
        proc.proc.stdin.close()


# -- codec ------------------------------------------------------------------------------------


def test_frame_round_trip_keeps_binary_payload() -> None:
    payload = bytes(range(256)) * 3
    frame = encode_frame({"id": 1, "op": "write", "path": "ä.bin"}, payload)
    header_len, payload_len = decode_prefix(frame[:8], max_header=100, max_payload=1000)
    assert decode_header(frame[8 : 8 + header_len]) == {"id": 1, "op": "write", "path": "ä.bin"}
    assert frame[8 + header_len :] == payload and payload_len == len(payload)


@pytest.mark.parametrize(
    ("prefix", "why"),
    [
        (PREFIX.pack(10_000, 0), "header length"),
        (PREFIX.pack(0, 0), "header length"),
        (PREFIX.pack(10, 5000), "payload length"),
        (b"\x00\x00", "short"),
    ],
)
def test_prefix_bounds_are_enforced(prefix: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        decode_prefix(prefix, max_header=1000, max_payload=1000)


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b'"x"', b"\xff\xfe", b'{"a": NaN}', b"[" * 100_000])
def test_bad_headers_raise_protocol_error(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_header(raw)


# -- requests ---------------------------------------------------------------------------------


def test_ping_answers_with_protocol_version(agent: AgentProcess) -> None:
    header, _ = agent.call({"id": 7, "op": "ping"})
    assert header == {"id": 7, "type": "result", "version": PROTOCOL_VERSION}


def test_version_flag_prints_the_protocol_version() -> None:
    ran = subprocess.run(
        [sys.executable, AGENT_PATH, "--version"], capture_output=True, text=True, timeout=30
    )
    assert ran.returncode == 0 and ran.stdout.strip() == f"dispatcher-agent protocol {PROTOCOL_VERSION}"


def test_malformed_header_gets_error_and_agent_keeps_serving(agent: AgentProcess) -> None:
    raw = b"{not json"
    agent.send_raw(PREFIX.pack(len(raw), 0) + raw)
    header, _ = agent.recv()
    assert header["id"] is None and header["code"] == "protocol"
    agent.send_raw(PREFIX.pack(6, 0) + b"[1, 2]")
    assert agent.recv()[0]["code"] == "protocol"
    assert agent.call({"id": 1, "op": "ping"})[0]["type"] == "result"


@pytest.mark.parametrize(
    ("request_header", "expected_id"),
    [
        ({"op": "ping"}, None),
        ({"id": "1", "op": "ping"}, None),
        ({"id": True, "op": "ping"}, None),
        ({"id": 3, "op": "launch_missiles"}, 3),
        ({"id": 4, "op": "read", "path": 5, "max_bytes": 10, "strict": False}, 4),
        ({"id": 5, "op": "read", "path": "a", "max_bytes": "10", "strict": False}, 5),
        ({"id": 6, "op": "exec", "command": ["ls"]}, 6),
        ({"id": 7, "op": "exec", "command": "true", "env": {"A": 1}}, 7),
        ({"id": 8, "op": "exec", "command": "true", "env": {"A=B": "c"}}, 8),
        ({"id": 9, "op": "signal", "exec_id": 1, "signal": "HUP"}, 9),
        ({"id": 10, "op": "patch", "path": "a", "old_len": 99}, 10),
        ({"id": 11, "op": "read", "path": "a", "max_bytes": -1, "strict": False}, 11),
        ({"id": 12, "op": "list", "path": ".", "limit": -5}, 12),
    ],
)
def test_bad_requests_get_bad_request_errors(
    agent: AgentProcess, request_header: dict[str, Any], expected_id: int | None
) -> None:
    header, _ = agent.call(request_header)
    assert header["type"] == "error" and header["id"] == expected_id
    assert header["code"] == "bad_request"
    assert agent.call({"id": 99, "op": "ping"})[0]["type"] == "result"


def test_oversized_length_prefix_is_fatal(agent: AgentProcess) -> None:
    agent.send_raw(PREFIX.pack(MAX_HEADER + 1, 0))
    header, _ = agent.recv()
    assert header["code"] == "protocol"
    assert agent.at_eof()
    assert agent.proc.wait(timeout=DEADLINE) == 2


def test_truncated_frame_then_eof_ends_agent(agent: AgentProcess) -> None:
    agent.send_raw(PREFIX.pack(50, 0) + b'{"id": 1')
    assert agent.close() == 2


def test_clean_eof_exits_zero(agent: AgentProcess) -> None:
    assert agent.close() == 0


def test_write_then_read_round_trips_every_byte(agent: AgentProcess) -> None:
    data = bytes(range(256)) * 100
    assert agent.call({"id": 1, "op": "write", "path": "d/b.bin"}, data)[0]["type"] == "result"
    header, body = agent.call(
        {"id": 2, "op": "read", "path": "d/b.bin", "max_bytes": 1 << 20, "strict": True}
    )
    assert header["size"] == len(data) and body == data


def test_error_messages_name_the_path_as_given_not_the_host_path(agent: AgentProcess, tmp_path: Path) -> None:
    header, _ = agent.call({"id": 1, "op": "read", "path": "nope.txt", "max_bytes": 10, "strict": False})
    assert header["code"] == "ENOENT"
    assert "nope.txt" in header["message"] and str(tmp_path) not in header["message"]
    header, _ = agent.call({"id": 2, "op": "stat", "path": "../../etc"})
    assert header["code"] == "escape" and str(tmp_path) not in header["message"]


def _collect_exec(agent: AgentProcess, rid: int) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
    chunks: list[tuple[str, bytes]] = []
    while True:
        header, payload = agent.recv()
        assert header["id"] == rid
        if header["type"] == "output":
            chunks.append((header["stream"], payload))
        else:
            return chunks, header


def test_exec_streams_output_in_bounded_chunks(agent: AgentProcess) -> None:
    agent.send({"id": 1, "op": "exec", "command": "head -c 300000 /dev/zero; echo oops >&2; exit 4"})
    chunks, end = _collect_exec(agent, 1)
    assert end == {"id": 1, "type": "exit", "exit_code": 4, "signal": None}
    assert all(0 < len(data) <= CHUNK for _, data in chunks)
    assert sum(len(data) for stream, data in chunks if stream == "stdout") == 300_000
    assert b"".join(data for stream, data in chunks if stream == "stderr") == b"oops\n"


def test_exec_reports_death_by_signal(agent: AgentProcess) -> None:
    agent.send({"id": 1, "op": "exec", "command": "kill -9 $$"})
    _, end = _collect_exec(agent, 1)
    assert end["exit_code"] is None and end["signal"] == 9


def test_requests_run_concurrently_with_a_running_command(agent: AgentProcess) -> None:
    agent.send({"id": 1, "op": "exec", "command": "while [ ! -e flag ]; do sleep 0.01; done; echo released"})
    # The command blocks until the flag exists; the agent must still answer in the meantime.
    assert agent.call({"id": 2, "op": "ping"})[0]["id"] == 2
    agent.send({"id": 3, "op": "write", "path": "flag"}, b"")
    # Once the flag exists the command may finish before the write's reply is sent: frames of
    # the two requests can interleave in either order.
    by_id: dict[int, list[tuple[dict[str, Any], bytes]]] = {1: [], 3: []}
    while not (by_id[3] and by_id[1] and by_id[1][-1][0]["type"] == "exit"):
        header, payload = agent.recv()
        by_id[header["id"]].append((header, payload))
    assert [h["type"] for h, _ in by_id[3]] == ["result"]
    assert [(h["stream"], p) for h, p in by_id[1][:-1]] == [("stdout", b"released\n")]
    assert by_id[1][-1][0]["exit_code"] == 0


def test_signal_reaches_the_whole_process_group(agent: AgentProcess) -> None:
    agent.send({"id": 1, "op": "exec", "command": "sleep 30 & sleep 30 & echo started; wait"})
    header, payload = agent.recv()
    assert (header["type"], payload) == ("output", b"started\n")
    reply, _ = agent.call({"id": 2, "op": "signal", "exec_id": 1, "signal": "TERM"})
    assert reply == {"id": 2, "type": "result", "delivered": True}
    _, end = _collect_exec(agent, 1)
    assert end["signal"] == 15 or end["exit_code"] == 143


def test_signal_read_before_its_exec_has_a_thread_is_kept_for_it(agent: AgentProcess) -> None:
    # Both frames in one write: the reader reads the signal before a thread has taken the exec up
    # (as when a timeout fires on a busy machine). It must not be lost: the command dies by it.
    exec_frame = encode_frame({"id": 1, "op": "exec", "command": "sleep 30"}, b"")
    agent.send_raw(exec_frame + encode_frame({"id": 2, "op": "signal", "exec_id": 1, "signal": "TERM"}, b""))
    by_id: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    while not (by_id[2] and by_id[1]):
        header, _ = agent.recv()
        by_id[header["id"]].append(header)
    assert by_id[2] == [{"id": 2, "type": "result", "delivered": True}]
    assert by_id[1] == [{"id": 1, "type": "exit", "exit_code": None, "signal": 15}]


def test_signal_for_unknown_exec_is_not_delivered(agent: AgentProcess) -> None:
    reply, _ = agent.call({"id": 5, "op": "signal", "exec_id": 1234, "signal": "KILL"})
    assert reply["delivered"] is False


def test_eof_kills_running_commands(agent: AgentProcess) -> None:
    agent.send({"id": 1, "op": "exec", "command": "echo $$; exec sleep 30"})
    _, payload = agent.recv()
    pid = int(payload)
    assert agent.close() == 0
    until_sync(lambda: not _alive(pid), "the command to die with the agent", timeout=DEADLINE)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_eof_kills_background_children_of_finished_commands(agent: AgentProcess) -> None:
    agent.send({"id": 1, "op": "exec", "command": "sleep 30 >/dev/null 2>&1 & echo $!"})
    chunks, end = _collect_exec(agent, 1)
    assert end["exit_code"] == 0
    child = int(b"".join(data for _, data in chunks))
    assert _alive(child)
    assert agent.close() == 0
    until_sync(lambda: not _alive(child), "the background child to die with the agent", timeout=DEADLINE)


def test_post_open_check_catches_a_path_swapped_after_resolution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Simulates a symlink swapped in between realpath() and open(): resolve() says "inside",
    # the file actually opened is outside, and /proc/self/fd tells the truth.
    root = tmp_path / "ws"
    root.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    ws = Workspace(str(root))
    monkeypatch.setattr(ws, "resolve", lambda path: str(secret))
    open_fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OpError) as info:
        ws.read("inside.txt", 100, False)
    assert info.value.code == "escape"
    with pytest.raises(OpError):
        ws.write("inside.txt", b"pwned")
    assert secret.read_text() == "top secret"
    assert len(os.listdir("/proc/self/fd")) == open_fds  # nothing leaked, nothing closed twice
