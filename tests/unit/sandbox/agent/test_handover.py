"""Surviving the server: an agent whose channel ends waits with its process table, and the next
agent hands it its channel; the processes never noticed, their output of the gap is all there."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid
from pathlib import Path

from dispatcher.sandbox.agent import protocol as p
from dispatcher.sandbox.agent.handover import Successors, hand_over
from dispatcher.sandbox.agent.process import group_alive as _group_alive
from tests.polling import until_sync

from .served_agent import DEADLINE, Link, Served

IDENTITY = {"version": p.PROTOCOL_VERSION, "root": "/workspace", "grants": None}


def _successor(name: str, identity: dict[str, object] = IDENTITY) -> tuple[Link | None, socket.socket | None]:
    """What a new agent does first: offer its channel (here, a socket pair's end) to a waiting one."""
    ours, theirs = socket.socketpair()
    with theirs:
        taken = hand_over(name, identity, theirs.fileno(), theirs.fileno())
    if taken is None:
        ours.close()
        return None, None
    return Link(ours), taken


def _successor_soon(name: str) -> tuple[Link, socket.socket]:
    """``_successor`` once the agent whose channel just ended waits."""
    got: list[tuple[Link | None, socket.socket | None]] = []

    def offered() -> bool:
        got.append(_successor(name))
        return got[-1][0] is not None

    until_sync(offered, "a waiting agent", timeout=DEADLINE)
    link, taken = got[-1]
    assert link is not None and taken is not None
    return link, taken


def _listening(name: str) -> bool:
    """Whether an agent waits at ``name`` (a probe that sends nothing, which it refuses)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(name)
        except OSError:
            return False
    return True


def _read_all(link: Link, process_id: str, until: bytes) -> bytes:
    got, after = b"", 0
    while until not in got:
        out = link.call(p.ProcRead(process_id, after, wait_seconds=DEADLINE))
        got, after = got + b"".join(c.data for c in out.chunks), out.next
    return got


def test_a_successor_takes_over_the_channel_and_the_table(tmp_path: Path) -> None:
    name = f"\0dispatcher-agent-test/{uuid.uuid4().hex}"
    served = Served(str(tmp_path))
    served.agent.successors = Successors(name, IDENTITY, adopt_stderr=False)
    info = served.link.call(p.ProcStart("p_1", "echo before; read line; echo after $line; sleep 30"))
    assert _read_all(served.link, "p_1", b"before\n") == b"before\n"
    served.link.sock.close()  # the server died; the agent waits with its table
    link, taken = _successor_soon(name)
    try:
        assert link.call(p.Ping()).version == p.PROTOCOL_VERSION
        [record] = link.call(p.ProcListRequest()).processes
        assert (record.process_id, record.pid, record.state) == ("p_1", info.pid, "running")
        link.call(p.ProcInput("p_1", b"again\n"))
        assert _read_all(link, "p_1", b"after again\n") == b"before\nafter again\n"
        # The exec path works on the new channel too, with ids that start again at 1.
        rid = link.send(p.Exec("echo fresh"))
        frames = link.frames(rid)
        assert frames[0][1] == b"fresh\n" and frames[-1][0]["exit_code"] == 0
    finally:
        waiting, served.agent.successors = served.agent.successors, None  # the next end is the last
        link.sock.close()
        served.close()
        assert waiting is not None
        waiting.close()
        assert taken.recv(1) == b""  # the successor learns that the agent it stood for ended
        taken.close()
    until_sync(lambda: not _group_alive(info.pid), "the group to die with the agent", timeout=DEADLINE)


def test_another_agent_is_refused_and_serves_on_its_own(tmp_path: Path) -> None:
    name = f"\0dispatcher-agent-test/{uuid.uuid4().hex}"
    served = Served(str(tmp_path))
    served.agent.successors = Successors(name, IDENTITY, adopt_stderr=False)
    served.link.call(p.ProcStart("p_1", "sleep 30"))
    served.link.sock.close()
    try:
        until_sync(lambda: _listening(name), "the agent to wait", timeout=DEADLINE)
        other = {**IDENTITY, "version": p.PROTOCOL_VERSION + 1}
        assert _successor(name, other) == (None, None)
        link, taken = _successor_soon(name)  # the right one is still taken
    finally:
        waiting, served.agent.successors = served.agent.successors, None
    link.sock.close()
    served.close()
    taken.close()
    assert waiting is not None
    waiting.close()


def test_an_agent_with_an_empty_table_waits_too(tmp_path: Path) -> None:
    """Every agent in a container waits, so a restarted server always has one to rejoin."""
    name = f"\0dispatcher-agent-test/{uuid.uuid4().hex}"
    served = Served(str(tmp_path))
    served.agent.successors = Successors(name, IDENTITY, adopt_stderr=False)
    assert served.link.call(p.Ping()).version == p.PROTOCOL_VERSION
    served.link.sock.close()  # the server died with nothing running
    link, taken = _successor_soon(name)
    try:
        assert link.call(p.Ping()).version == p.PROTOCOL_VERSION
        assert link.call(p.ProcListRequest()).processes == ()
    finally:
        waiting, served.agent.successors = served.agent.successors, None
        link.sock.close()
        served.close()
        assert waiting is not None
        waiting.close()
        taken.close()


_OFFER = """
import json, socket, sys
name, identity = sys.argv[1].encode("latin-1").decode("unicode_escape"), sys.argv[2]
a, b = socket.socketpair()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
s.connect(name)
try:  # the agent may hang up before the descriptors are even sent
    socket.send_fds(s, [identity.encode()], [b.fileno(), b.fileno(), 2])
    print(s.recv(5).decode() or "refused")
except OSError:
    print("refused")
"""


def test_a_peer_with_a_pid_running_another_program_is_refused(tmp_path: Path) -> None:
    """Only the agent's own program, or a peer from outside the container's pid namespace (the
    server: pid 0 and root, as the container sees it) is handed the channel. A root process with
    a pid, running something else (here, on the host, this test's child), is refused even with
    the right identity."""
    name = f"\0dispatcher-agent-test/{uuid.uuid4().hex}"
    served = Served(str(tmp_path))
    served.agent.successors = Successors(name, IDENTITY, adopt_stderr=False)
    served.link.sock.close()
    try:
        until_sync(lambda: _listening(name), "the agent to wait", timeout=DEADLINE)
        argv = [
            sys.executable,
            "-c",
            _OFFER,
            name.encode("unicode_escape").decode("latin-1"),
            json.dumps(IDENTITY),
        ]
        answer = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE, check=True)
        assert answer.stdout.strip() == "refused"
        link, taken = _successor_soon(name)  # the agent still waits for the right one
    finally:
        waiting, served.agent.successors = served.agent.successors, None
    link.sock.close()
    served.close()
    taken.close()
    assert waiting is not None
    waiting.close()
