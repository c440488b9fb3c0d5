"""The real agent as the program of a fake Docker container (``FakeDockerClient.agent_program``).

The fake daemon's scripted agent answers a handful of requests; the contract needs every answer
the real one gives. This runs ``dispatcher/sandbox/agent`` as a subprocess on the host directory
the container has mounted at ``/workspace`` and pumps bytes between it and the exec's stream (or
the server's socket, when started with ``--connect``), so that everything above the daemon (the
Docker sandbox, its guards, the attach stream) is the real code over real answers.

What the fake cannot give: a mount namespace (the agent's root is the host directory, not
``/workspace``) and isolation (its commands run on the host). ``targets.py`` declares both.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from typing import IO

from dispatcher.sandbox.local import AGENT_PATH
from tests.unit.sandbox.fake_containers import STDERR, STDOUT, FakeExec

_STOP_SECONDS = 5.0  # after its input closed, before the agent is killed outright


def run_real_agent(ex: FakeExec) -> None:
    """Serve one agent exec of ``ex.container`` with the real agent (blocks until it ends)."""
    root = ex.container.workspace()
    assert root is not None, "the container has no /workspace mount"
    args = list(ex.cmd[3:])  # after [python, -I, agent path]
    connect: str | None = None
    if "--connect" in args:
        at = args.index("--connect")
        connect = args[at + 1]
        del args[at : at + 2]
    args[args.index("--root") + 1] = root
    env = {key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ}
    proc = subprocess.Popen(
        [sys.executable, "-I", AGENT_PATH, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=root,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    threads: list[threading.Thread] = []
    try:
        link = _connect(ex, connect) if connect is not None else ex.sock
        assert link is not None
        threads = [
            threading.Thread(target=_to_agent, args=(link, proc.stdin), daemon=True),
            threading.Thread(target=_from_agent, args=(ex, proc.stderr, STDERR, None), daemon=True),
        ]
        for thread in threads:
            thread.start()
        _from_agent(ex, proc.stdout, STDOUT, link if connect is not None else None)
    except OSError:
        pass  # the server's socket is gone: as an agent that cannot connect
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for thread in threads[1:]:  # the stderr pump ends with the agent; stdin's with the link
            thread.join(_STOP_SECONDS)
        proc.stdout.close()
        proc.stderr.close()
        if ex.running:
            ex.finish(proc.returncode)


def _connect(ex: FakeExec, target: str) -> socket.socket:
    """The agent's connection to the server's socket, made here (the peer the server checks is
    this process, which the fake daemon reports as the exec's)."""
    mounts = {m["Target"]: m["Source"] for m in ex.container.spec["host_config"]["mounts"]}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(os.path.join(mounts[os.path.dirname(target)], os.path.basename(target)))
    except (KeyError, OSError):
        conn.close()
        raise
    ex.channel = conn
    return conn


def _to_agent(link: socket.socket, stdin: IO[bytes]) -> None:
    """The server's bytes to the agent's stdin; their end (container removed) is the agent's EOF."""
    try:
        while chunk := link.recv(1 << 16):
            stdin.write(chunk)
            stdin.flush()
    except (OSError, ValueError):
        pass
    finally:
        with contextlib.suppress(OSError):
            stdin.close()


def _from_agent(ex: FakeExec, out: IO[bytes], stream: int, raw: socket.socket | None) -> None:
    """The agent's ``out`` to the server: raw on its own socket, else framed on the exec's stream."""
    fd = out.fileno()
    while chunk := os.read(fd, 1 << 16):
        if raw is not None:
            try:
                raw.sendall(chunk)
            except OSError:
                return
        elif not ex.send(stream, chunk):
            return
