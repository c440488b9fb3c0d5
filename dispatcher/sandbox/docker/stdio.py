"""A long-running process inside a session's container, its stdin/stdout attached over ``docker exec``.

For MCP servers with ``run: sandbox``: the process runs as the session's sandbox user, in
``/workspace``, under every limit of the container (network none, pids, memory, grants). Its
stdout feeds a bounded ``StreamReader``; its stderr goes to a callback. ``docker exec`` makes the
process a session leader, so the pid the wrapper records is also its process group: ``kill``
signals the group as the sandbox user (the sandbox may tamper with the pid file, but then it
only signals its own processes). When the container goes (closed, recreated, retired), the
process goes with it and its stdout ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping, Sequence

from dispatcher.sandbox.container.config import WORKSPACE_ROOT
from dispatcher.sandbox.docker.client import DockerAPI
from dispatcher.sandbox.docker.stream import AttachStream, open_attach_stream

log = logging.getLogger(__name__)

# $1 the pid file; then the command and its arguments, exec'd so the recorded pid stays its own.
_WRAPPER = 'echo $$ >"$1" || exit 125; shift; exec "$@"'
_KILL = 'pid=$(cat "$1" 2>/dev/null) && kill -KILL -- "-$pid" 2>/dev/null'


class DockerStdioProcess:
    """One process in a session's container, with its stdio attached."""

    def __init__(self, api: DockerAPI, container_id: str, user: str, pidfile: str, stream: AttachStream):
        self._api = api
        self._container_id = container_id
        self._user = user
        self._pidfile = pidfile
        self._stream = stream
        self.reader = stream.reader
        self.writer = stream.writer
        self.violation: str | None = None
        self._gone = asyncio.Event()

    @classmethod
    async def start(
        cls,
        api: DockerAPI,
        container_id: str,
        user: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        limit: int,
    ) -> DockerStdioProcess:
        """Start ``argv`` in the running container, as ``user``.

        Raises:
            SandboxError: the exec failed.
        """
        pidfile = f"/tmp/.dispatcher-stdio-{uuid.uuid4().hex}"
        exec_id = await api.exec_create(
            container_id,
            ["sh", "-c", _WRAPPER, "dispatcher-stdio", pidfile, *argv],
            stdin=True,
            stdout=True,
            stderr=True,
            tty=False,
            user=user,
            environment=dict(env),
            workdir=WORKSPACE_ROOT,
        )
        sock, leftover = await api.exec_attach(exec_id)
        stream = await open_attach_stream(sock, leftover, exec_id, limit=limit)
        return cls(api, container_id, user, pidfile, stream)

    def stderr_tail(self) -> str:
        """The end of what it wrote to stderr, escaped (it is the sandbox's text)."""
        tail = self._stream.stderr_tail()[-1000:].decode("utf-8", "replace")
        return tail.strip().encode("unicode_escape").decode("ascii")

    async def wait(self) -> None:
        """Return once ``kill``/``close`` ran (the end of its stdout is noticed by the reader)."""
        await self._gone.wait()

    async def kill(self) -> None:
        """SIGKILL its process group inside the container, then drop the attachment."""
        if not self._gone.is_set():
            with contextlib.suppress(Exception):
                await self._api.exec_run(
                    self._container_id, ["sh", "-c", _KILL, "kill", self._pidfile], user=self._user
                )
        self._stream.close()
        self._gone.set()

    async def close(self) -> None:
        """End it: nothing it could still do on a polite close is worth waiting for."""
        await self.kill()
