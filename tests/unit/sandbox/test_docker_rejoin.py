"""The host-side parts of re-adopting a runc container: its view of the workspace read through
``/proc/<pid>/root`` without following a link, the identity the waiting agent compares, and the
refusals of a peer that is not the container's agent. Here the "container" is this process (its
root is the host's); the rejoin itself runs against Docker in ``tests/integration``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dispatcher.sandbox.agent.protocol import PROTOCOL_VERSION, parse_grants
from dispatcher.sandbox.docker.agent.rejoin import (
    RejoinRefused,
    _on_own_thread,
    check_peer,
    identity,
    numeric_uid,
)
from dispatcher.sandbox.docker.host_view import file_seen_from_host, in_container, seen_from_host
from tests.polling import until


def _identity(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path), st.st_dev, st.st_ino


def test_the_directory_seen_at_a_target_is_compared_by_device_and_inode(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    assert seen_from_host(os.getpid(), [_identity(ws)])
    expected = _identity(ws)
    ws.rename(tmp_path / "moved")  # renamed, and another put at its path
    ws.mkdir()
    assert not seen_from_host(os.getpid(), [expected])
    assert not seen_from_host(os.getpid(), [(str(tmp_path / "missing"), *expected[1:])])


def test_a_link_on_the_way_to_a_target_is_not_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "ws").mkdir(parents=True)
    (tmp_path / "via").symlink_to(real)
    _, dev, ino = _identity(real / "ws")
    assert seen_from_host(os.getpid(), [(str(real / "ws"), dev, ino)])
    assert not seen_from_host(os.getpid(), [(str(tmp_path / "via" / "ws"), dev, ino)])


def test_a_file_is_seen_only_as_a_regular_file_reached_without_links(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("x")
    (tmp_path / "link.pem").symlink_to(tmp_path / "ca.pem")
    (tmp_path / "dir.pem").mkdir()
    assert file_seen_from_host(os.getpid(), str(tmp_path / "ca.pem"))
    assert not file_seen_from_host(os.getpid(), str(tmp_path / "link.pem"))
    assert not file_seen_from_host(os.getpid(), str(tmp_path / "dir.pem"))
    assert not file_seen_from_host(os.getpid(), str(tmp_path / "none.pem"))
    assert not file_seen_from_host(2**22 + 12345, str(tmp_path / "ca.pem"))  # no such process


def test_the_identity_is_what_the_agent_parses_from_its_arguments() -> None:
    assert identity([]) == {"version": PROTOCOL_VERSION, "root": "/workspace", "grants": None}
    raw = json.dumps([{"path": "src/", "mode": "r"}, {"path": ".", "mode": "rw"}])
    expected = json.loads(json.dumps(parse_grants(raw)))
    assert identity(["--grants", raw]) == {
        "version": PROTOCOL_VERSION,
        "root": "/workspace",
        "grants": expected,
    }


def test_only_a_numeric_user_is_rejoined() -> None:
    assert numeric_uid("1000:1000") == 1000
    assert numeric_uid("1001") == 1001
    assert numeric_uid("sandbox") is None
    assert numeric_uid("sandbox:1000") is None


_PEER = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1].encode("latin-1").decode("unicode_escape"))
time.sleep(30)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_peer_in_the_containers_pid_namespace_is_checked_for_uid_and_program() -> None:
    """The "container" is a pid namespace of its own whose init connects to us: accepted only with
    the uid and the command line asked for."""
    name = f"\0dispatcher-rejoin-test/{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(name)
        listening.listen(1)
        listening.settimeout(10)
        shown = name.encode("unicode_escape").decode("latin-1")
        peer = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-c", _PEER, shown])
        try:
            conn, _ = listening.accept()
            with conn:
                pid = _peer_pid(conn)
                head = [sys.executable, "-c"]
                assert check_peer(conn, pid, 0, head) == pid
                with pytest.raises(RejoinRefused, match="runs as uid 0, not 1000"):
                    check_peer(conn, pid, 1000, head)
                with pytest.raises(RejoinRefused, match="not the agent"):
                    check_peer(conn, pid, 0, [sys.executable, "-I", "/opt/dispatcher/agent.pyz"])
                with pytest.raises(RejoinRefused, match="not in the container"):
                    check_peer(conn, os.getpid(), 0, head)  # another "container": the server's own
        finally:
            peer.kill()
            peer.wait()


def _peer_pid(conn: socket.socket) -> int:
    pid: int = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    return pid


def test_a_peer_in_the_servers_own_pid_namespace_is_refused() -> None:
    a, b = socket.socketpair()
    with a, b, open("/proc/self/cmdline", "rb") as f:
        mine = [os.fsdecode(arg) for arg in f.read().split(b"\0")[:2]]
        with pytest.raises(RejoinRefused, match="not in the container"):
            check_peer(a, os.getpid(), os.getuid(), mine)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_peer_outside_the_containers_pid_namespace_is_refused() -> None:
    """The "container" is a process in a pid namespace of its own; this process, the peer, is not
    in it."""
    other = subprocess.Popen(["unshare", "--pid", "--fork", "sleep", "30"])
    try:
        child = 0
        for _ in range(200):
            kids = Path(f"/proc/{other.pid}/task/{other.pid}/children").read_text().split()
            if kids:
                child = int(kids[0])
                break
            time.sleep(0.01)
        assert child and os.readlink(f"/proc/{child}/ns/pid") != os.readlink("/proc/self/ns/pid")
        a, b = socket.socketpair()
        with a, b, open("/proc/self/cmdline", "rb") as f:
            mine = [os.fsdecode(arg) for arg in f.read().split(b"\0")[:2]]
            with pytest.raises(RejoinRefused, match="not in the container"):
                check_peer(a, child, os.getuid(), mine)
    finally:
        other.kill()
        other.wait()


def test_a_process_outside_any_container_is_not_taken_for_one() -> None:
    assert not in_container(os.getpid(), "0" * 64)  # the server's own pid namespace
    assert not in_container(2**22 + 12345, "0" * 64)  # no such process


async def test_a_channel_joined_after_its_caller_gave_up_is_let_go() -> None:
    """A rejoin cancelled (the server stops) while its thread still connects: what the thread
    brings back is closed, so the agent sees its channel end and waits again."""
    release = threading.Event()
    discarded: list[object] = []
    brought = object()

    def slow() -> object:
        release.wait(5)
        return brought

    task = asyncio.ensure_future(_on_own_thread(slow, discarded.append))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    await until(lambda: discarded == [brought], "the late result to be discarded")
