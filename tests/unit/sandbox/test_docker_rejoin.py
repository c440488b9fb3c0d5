"""The host-side parts of re-adopting a runc container: its view of the workspace read through
``/proc/<pid>/root`` without following a link, the identity the waiting agent compares, and the
refusals of a peer that is not the container's agent. Here the "container" is this process (its
root is the host's); the rejoin itself runs against Docker in ``tests/integration``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dispatcher.sandbox.agent.agent import parse_grants
from dispatcher.sandbox.agent.protocol import PROTOCOL_VERSION
from dispatcher.sandbox.docker.agent.rejoin import RejoinRefused, check_peer, identity, numeric_uid
from dispatcher.sandbox.docker.launch import file_seen_from_host, seen_from_host


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


def test_a_peer_that_is_not_the_agent_is_refused() -> None:
    """The peer here is this test process: in this pid namespace, but not the agent's program,
    and (run as anything) its uid is checked against the one asked."""
    a, b = socket.socketpair()
    with a, b:
        me = os.getpid()
        head = [sys.executable, "-I", "/opt/dispatcher/agent.pyz"]
        with pytest.raises(RejoinRefused, match="not the agent"):
            check_peer(a, me, os.getuid(), head)
        with pytest.raises(RejoinRefused, match="runs as uid"):
            check_peer(a, me, os.getuid() + 1, head)
        with open("/proc/self/cmdline", "rb") as f:
            mine = [os.fsdecode(arg) for arg in f.read().split(b"\0")[:2]]
        assert check_peer(a, me, os.getuid(), mine) == me  # its own program: accepted


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
