"""A process on the server host with its stdio attached: an MCP server run on the host, or in the
local backend's "sandbox" (a workspace directory, no isolation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections import deque
from collections.abc import Mapping

log = logging.getLogger("dispatcher.mcp")

STDERR_TAIL_LINES = 20
_STDERR_LINE_CHARS = 500
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL", "TERM")
"""The server's own environment variables such a process gets; never its tokens or keys."""
_CLOSE_WAIT_SECONDS = 1.0


class StderrTail:
    """The last lines a server wrote to stderr, escaped and bounded, for error messages."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=STDERR_TAIL_LINES)

    def add(self, data: bytes) -> None:
        for raw in data.decode("utf-8", "replace").splitlines():
            line = raw.strip()
            if line:
                self.lines.append(line[:_STDERR_LINE_CHARS].encode("unicode_escape").decode("ascii"))

    def text(self) -> str:
        return " | ".join(self.lines)


class HostProcess:
    """An MCP server run on the server host, as the server's user, in its own process group."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
        self._proc = proc
        self.reader = proc.stdout
        self.writer = proc.stdin
        self.violation: str | None = None
        self._tail = StderrTail()
        self._stderr_pump = asyncio.ensure_future(self._pump_stderr(proc.stderr, name))

    @classmethod
    async def start(
        cls,
        name: str,
        command: str,
        args: tuple[str, ...],
        env: Mapping[str, str],
        cwd: str | None = None,
        *,
        limit: int,
    ) -> HostProcess:
        """Spawn ``command args`` with a minimal environment plus ``env``, in ``cwd`` if given; a line
        of its stdout longer than ``limit`` bytes is a violation.

        Raises:
            OSError: the executable cannot be started.
        """
        environment = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        environment.update(env)
        proc = await asyncio.create_subprocess_exec(
            command,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=environment,
            cwd=cwd,
            start_new_session=True,  # its own process group: a kill ends whatever it started too
            limit=limit,
        )
        return cls(proc, name)

    @property
    def pid(self) -> int:
        return self._proc.pid

    async def _pump_stderr(self, stderr: asyncio.StreamReader, name: str) -> None:
        with contextlib.suppress(ValueError, ConnectionError):
            while chunk := await stderr.read(64 << 10):
                self._tail.add(chunk)
                log.debug("mcp server %s stderr: %r", name, chunk[:1000])

    def stderr_tail(self) -> str:
        return self._tail.text()

    async def wait(self) -> None:
        await self._proc.wait()

    async def kill(self) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()
        await self._proc.wait()
        # The group may outlive its leader (a child that ignored nothing: SIGKILL cannot be ignored).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._stderr_pump), 1.0)
        self._stderr_pump.cancel()

    async def close(self) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                self.writer.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._proc.wait(), _CLOSE_WAIT_SECONDS)
        await self.kill()
