"""The agent's socket listener: only the process started is accepted, nothing is left behind, and
the real agent serves its protocol on the socket (``--connect``) or says why it cannot."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from dispatcher.sandbox.agent.protocol import CONNECT_FAILED
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.docker.agent.listener import SOCKET_DIR, SOCKET_NAME, AgentSockets

REPO = Path(__file__).resolve().parents[3]
AGENT_DIR = REPO / "dispatcher" / "sandbox" / "agent"
CONNECT = (
    "import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); time.sleep(30)"
)


def _connector(path: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", CONNECT, path])


def _pid(pid: int) -> Callable[[], Awaitable[int]]:
    async def known() -> int:
        return pid

    return known


async def _never() -> None:
    await asyncio.Event().wait()


async def test_only_the_expected_process_is_accepted_and_nothing_is_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sockets = AgentSockets(str(tmp_path / "agent"))
    listener = sockets.listen()
    path = os.path.join(listener.source, SOCKET_NAME)
    assert stat.S_IMODE(os.stat(sockets.root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(listener.source).st_mode) == 0o711
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    assert listener.mount == {
        "Type": "bind",
        "Source": listener.source,
        "Target": SOCKET_DIR,
        "ReadOnly": True,
        "BindOptions": {"Propagation": "rprivate"},
    }
    stranger = _connector(path)
    agent = None
    ended = asyncio.ensure_future(_never())
    try:
        # The stranger connects first; the agent only once the stranger has been turned away.
        await asyncio.sleep(0.3)
        agent = _connector(path)
        conn = await asyncio.wait_for(listener.accept(_pid(agent.pid), ended), 10)
        assert conn is not None
        conn.close()
    finally:
        ended.cancel()
        for proc in (stranger, agent):
            if proc is not None:
                proc.kill()
                proc.wait()
    assert f"from pid {stranger.pid} (expected the agent, pid {agent.pid})" in caplog.text
    # The socket is gone; the directory stays with its container, and goes with it.
    assert os.listdir(sockets.root) == [listener.name] and os.listdir(listener.source) == []
    sockets.made("c1", listener)
    sockets.forget("c1")
    assert os.listdir(sockets.root) == []
    sockets.close()
    assert not os.path.exists(sockets.root)


async def test_a_process_that_ends_without_connecting_gives_none(tmp_path: Path) -> None:
    sockets = AgentSockets(str(tmp_path / "agent"))
    listener = sockets.listen()
    ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    ended.set_result(None)
    assert await listener.accept(_pid(os.getpid()), ended) is None
    assert os.listdir(listener.source) == []  # no socket left to connect to
    sockets.discard(listener)  # its container was never made
    assert os.listdir(sockets.root) == []
    sockets.close()


def test_a_long_state_path_still_binds_and_leftovers_are_swept(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "agent"  # more than sockaddr_un's 108 bytes
    sockets = AgentSockets(str(deep))
    listener = sockets.listen()
    assert stat.S_ISSOCK(os.stat(os.path.join(listener.source, SOCKET_NAME)).st_mode)
    sockets.discard(listener)
    sockets.close()
    crashed = deep / "0123456789abcdef"  # what a server killed while an agent started leaves
    crashed.mkdir(parents=True)
    (crashed / SOCKET_NAME).write_bytes(b"")
    alive = deep / "fedcba9876543210"  # a container that still exists names this one
    alive.mkdir()
    again = AgentSockets(str(deep))  # the next run of the server
    again.known("c1", "fedcba9876543210")  # a container that still exists, as listed
    again.known("c2", "../../etc")  # never a path: not a name the server gives
    again.sweep()
    assert os.listdir(deep) == ["fedcba9876543210"]
    again.close()


async def test_a_restarted_server_listens_again_in_a_containers_directory(tmp_path: Path) -> None:
    first = AgentSockets(str(tmp_path / "agent"))
    made = first.listen()
    made.close()  # its agent came and went (the server stopped)
    first.close()
    second = AgentSockets(str(tmp_path / "agent"))
    assert second.relisten("c1") is None  # not listed with a directory (made without one)
    second.known("c1", "../../etc")  # never a path
    assert second.relisten("c1") is None
    second.known("c1", "0" * 16)  # gone
    assert second.relisten("c1") is None
    second.known("c1", made.name)
    listener = second.relisten("c1")
    assert listener is not None and listener.source == made.source
    agent = _connector(os.path.join(listener.source, SOCKET_NAME))
    ended = asyncio.ensure_future(_never())
    try:
        conn = await asyncio.wait_for(listener.accept(_pid(agent.pid), ended), 10)
        assert conn is not None
        conn.close()
    finally:
        ended.cancel()
        agent.kill()
        agent.wait()
    second.forget("c1")
    assert os.listdir(second.root) == []
    disabled = AgentSockets(str(tmp_path / "agent"), enabled=False)
    disabled.known("c1", made.name)
    assert disabled.relisten("c1") is None
    second.close()


def test_a_root_open_to_others_is_made_private(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    sockets = AgentSockets(str(root))
    sockets.discard(sockets.listen())
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    sockets.close()


async def test_the_agent_serves_on_the_socket(tmp_path: Path) -> None:
    sockets = AgentSockets(str(tmp_path / "agent"))
    listener = sockets.listen()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "hello.txt").write_text("hi")
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        str(AGENT_DIR),
        "--root",
        str(workspace),
        "--connect",
        os.path.join(listener.source, SOCKET_NAME),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert agent.stdout is not None
    ended = asyncio.ensure_future(agent.stdout.read())  # b"" once the agent ends
    try:
        conn = await asyncio.wait_for(listener.accept(_pid(agent.pid), ended), 30)
        assert conn is not None
        reader, writer = await asyncio.open_unix_connection(sock=conn)
        channel = AgentChannel(reader, writer, workspace_root=str(workspace))
        assert await channel.ping(timeout=10) > 0
        assert await channel.read("hello.txt") == "hi"
        assert not ended.done()  # the exec's stdout stays open while the agent runs...
        await channel.close()
        writer.close()
        assert await asyncio.wait_for(ended, 10) == b""  # ... and ends with it
        assert await agent.wait() == 0
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()


def test_an_agent_that_cannot_connect_says_so_and_exits_3(tmp_path: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-I", str(AGENT_DIR), "--root", str(tmp_path), "--connect", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ran.returncode == CONNECT_FAILED
    assert f"cannot connect to {tmp_path / 'none'}" in ran.stderr


async def test_a_start_cancelled_after_a_connection_closes_it(tmp_path: Path) -> None:
    sockets = AgentSockets(str(tmp_path / "agent"))
    listener = sockets.listen()
    path = os.path.join(listener.source, SOCKET_NAME)
    asked = asyncio.Event()

    async def slow_pid() -> int:  # the daemon is slow to say whose exec it is
        asked.set()
        await asyncio.Event().wait()
        return 0

    loop = asyncio.get_running_loop()
    peer = socket.socket(socket.AF_UNIX)
    peer.setblocking(False)
    await loop.sock_connect(peer, path)
    accepting = asyncio.ensure_future(listener.accept(slow_pid, asyncio.ensure_future(_never())))
    await asyncio.wait_for(asked.wait(), 10)

    accepting.cancel()  # the server stops (or the pool drains) while the agent starts
    with pytest.raises(asyncio.CancelledError):
        await accepting

    # The accepted connection was closed, not left to the garbage collector: the peer sees EOF.
    assert await asyncio.wait_for(loop.sock_recv(peer, 1), 10) == b""
    peer.close()
    assert not os.path.exists(path)  # and the listener is gone
    sockets.close()
