"""Host side of the agent protocol: the core ``Sandbox`` API over one agent link.

``AgentLink`` (agent_link.py) frames requests and replies and breaks on anything untrusted the
agent sends; this adds the operations: workspace files, exec with its kill sequence, processes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from dispatcher.core.sandbox_api import (
    DirListing,
    ExecRequest,
    ExecResult,
    FileOpError,
    FileStat,
    OutputCallback,
    ProcessLimitExhausted,
    SandboxError,
)
from dispatcher.sandbox import replies
from dispatcher.sandbox.agent_link import DEFAULT_MAX_FRAME as DEFAULT_MAX_FRAME
from dispatcher.sandbox.agent_link import KILL_WAIT_SECONDS as KILL_WAIT_SECONDS
from dispatcher.sandbox.agent_link import MAX_HEADER as MAX_HEADER
from dispatcher.sandbox.agent_link import AgentLink, ExecCall, settled
from dispatcher.sandbox.agent_link import AgentUnresponsive as AgentUnresponsive
from dispatcher.sandbox.agent_link import FrameWriter as FrameWriter
from dispatcher.sandbox.agent_link import NotDelivered as NotDelivered


class AgentChannel(AgentLink):
    """Implements ``dispatcher.core.sandbox_api.Sandbox`` by talking to one agent process."""

    # -- WorkspaceFileAPI -------------------------------------------------------------------

    async def read_bytes(
        self, path: str, *, max_bytes: int | None = None, approved: str | None = None
    ) -> bytes:
        """Read at most ``max_bytes`` (``too_large`` if the file is bigger and no cap was asked)."""
        strict = max_bytes is None or max_bytes > self._max_frame
        cap = self._max_frame if max_bytes is None or strict else max(max_bytes, 0)
        header = {"op": "read", "path": path, "max_bytes": cap, "strict": strict}
        reply, body = await self._call(_pinned(header, approved))
        size = self._parse(replies.require, reply, "size", int)
        if len(body) > cap or size < 0:
            raise self._violation("read returned more than was asked")
        return body

    async def read(self, path: str) -> str:
        """Read a UTF-8 text file."""
        data = await self.read_bytes(path)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise FileOpError("decode", f"{path}: not valid UTF-8 text") from None

    def _payload(self, path: str, data: bytes) -> bytes:
        if len(data) > self._max_frame:
            raise FileOpError("too_large", f"{path}: {len(data)} bytes is more than {self._max_frame}")
        return data

    async def write_bytes(
        self, path: str, data: bytes, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        """Atomic replace (temp file in the same directory + rename), keeping the mode; makes parents;
        with ``expect_sha256``, only if the file is still that (checked by the agent before the rename)."""
        header = _expecting(_pinned({"op": "write", "path": path}, approved), expect_sha256)
        await self._call(header, self._payload(path, data))

    async def write(
        self, path: str, content: str, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        """Write text as UTF-8, atomically."""
        await self.write_bytes(path, _encode(path, content), approved=approved, expect_sha256=expect_sha256)

    async def append(self, path: str, content: str) -> None:
        """Append text as UTF-8, creating the file if needed."""
        await self._call({"op": "append", "path": path}, self._payload(path, _encode(path, content)))

    async def exists(self, path: str) -> bool:
        """True if the path exists inside the workspace."""
        reply, _ = await self._call({"op": "exists", "path": path})
        return bool(self._parse(replies.require, reply, "exists", bool))

    async def stat(self, path: str, *, approved: str | None = None) -> FileStat:
        """Kind, size, mode and mtime; symlinks are followed (inside the workspace)."""
        reply, _ = await self._call(_pinned({"op": "stat", "path": path}, approved))
        return self._parse(replies.stat_result, reply, self._root)

    async def list(self, path: str, *, limit: int = 1000, approved: str | None = None) -> DirListing:
        """Up to ``limit`` entries sorted by name; ``truncated`` when more existed."""
        header = {"op": "list", "path": path, "limit": max(limit, 0)}
        reply, body = await self._call(_pinned(header, approved))
        return self._parse(replies.listing, reply, body, max(limit, 0))

    async def delete(self, path: str) -> None:
        """Remove a file, a symlink or an empty directory."""
        await self._call({"op": "delete", "path": path})

    async def resolve(self, path: str) -> str:
        """The real path inside the workspace, relative to it, symlinks followed where the files are."""
        reply, _ = await self._call({"op": "resolve", "path": path})
        return self._parse(replies.relative_path, reply)

    async def patch(
        self, path: str, old: str, new: str, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        """Replace the single occurrence of ``old`` atomically; ``no_match``/``multiple_matches`` else."""
        old_b, new_b = _encode(path, old), _encode(path, new)
        header = _expecting(
            _pinned({"op": "patch", "path": path, "old_len": len(old_b)}, approved), expect_sha256
        )
        await self._call(header, self._payload(path, old_b + new_b))

    # -- processes --------------------------------------------------------------------------

    async def exec(
        self, request: ExecRequest, on_output: OutputCallback, cancel_event: asyncio.Event
    ) -> ExecResult:
        """Run a command, streaming its output; on timeout or cancel: SIGTERM, grace, SIGKILL.

        Raises:
            AgentUnresponsive: the group outlived SIGKILL by ``kill_wait`` or the agent went silent.
            SandboxError: the channel is broken or broke meanwhile.
        """
        self._usable()
        loop = asyncio.get_running_loop()
        started = loop.time()
        if cancel_event.is_set():
            return ExecResult(exit_code=None, cancelled=True)
        stdin = request.stdin
        if stdin is not None and len(stdin) > self._max_frame:
            raise SandboxError(f"stdin of {len(stdin)} bytes is more than {self._max_frame}")
        call = ExecCall(on_output, loop.create_future())
        rid = self._register(call)
        header = {
            "id": rid,
            "op": "exec",
            "command": request.command,
            "cwd": request.cwd,
            "env": dict(request.env),
            "stdin": stdin is not None,
        }
        if request.approved_cwd is not None:
            header["approved_cwd"] = request.approved_cwd
        timed_out = cancelled = killed = False
        try:
            await self._send(header, stdin or b"")
            outcome = await self._wait_first(call, cancel_event, request.timeout)
            if outcome != "done":
                timed_out, cancelled = outcome == "timeout", outcome == "cancel"
                self._post({"op": "signal", "exec_id": rid, "signal": "TERM"})
                if not await settled(call.done, request.grace_seconds):
                    self._post({"op": "signal", "exec_id": rid, "signal": "KILL"})
                    killed = True
                    if not await settled(call.done, self._kill_wait):
                        self._pending.pop(rid, None)
                        raise self._fail(AgentUnresponsive("the command's process group survived SIGKILL"))
            reply = call.done.result()
        finally:
            if self._pending.pop(rid, None) is not None:
                self._post({"op": "signal", "exec_id": rid, "signal": "KILL"})  # abandoned: leave nothing
            if call.done.done() and not call.done.cancelled():
                call.done.exception()  # as in _call: a failed send must not leave it unretrieved
        if call.callback_error is not None:
            raise call.callback_error
        if reply["type"] == "error":
            if reply["code"] == "proc_limit":  # refused before anything ran
                processes = self._parse(replies.require, reply, "processes", int)
                message = replies.error_for(reply)
                raise ProcessLimitExhausted(str(message), processes=max(processes, 0))
            raise replies.error_for(reply)
        return ExecResult(
            exit_code=reply.get("exit_code"),
            signal=reply.get("signal"),
            timed_out=timed_out,
            cancelled=cancelled,
            killed=killed,
            duration_ms=(loop.time() - started) * 1000.0,
        )

    async def _wait_first(
        self, call: ExecCall, cancel_event: asyncio.Event, timeout: float
    ) -> Literal["done", "timeout", "cancel"]:
        watchers: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(cancel_event.wait()),
            asyncio.ensure_future(call.interrupted.wait()),
        ]
        try:
            await asyncio.wait(
                [call.done, *watchers], timeout=max(timeout, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        if call.done.done():
            return "done"
        return "cancel" if cancel_event.is_set() or call.interrupted.is_set() else "timeout"

    async def procs(self, *, kill: bool = False, spare_exec_sessions: bool = False) -> tuple[int, int, int]:
        """(processes commands left running, how many were killed, processes left); ``kill``
        stops and kills them all (the agent's and init's excepted). ``spare_exec_sessions``: leave
        out the processes of sessions the server attached itself (sandboxed MCP servers)."""
        header = {"op": "procs", "kill": kill}
        if spare_exec_sessions:
            header["spare_exec_sessions"] = True
        reply, _ = await self._call(header)
        counts = tuple(
            self._parse(replies.require, reply, key, int) for key in ("processes", "killed", "left")
        )
        if min(counts) < 0:
            raise self._violation("negative process count")
        return counts[0], counts[1], counts[2]


def _pinned(header: dict[str, Any], approved: str | None) -> dict[str, Any]:
    """The request with the approved path, when there is one (the agent then uses exactly it)."""
    if approved is not None:
        header["approved"] = approved
    return header


def _expecting(header: dict[str, Any], expect_sha256: str | None) -> dict[str, Any]:
    """The request with the content the file must still have (review mode), when there is one."""
    if expect_sha256 is not None:
        header["expect_sha256"] = expect_sha256
    return header


def _encode(path: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise FileOpError("decode", f"{path}: text cannot be encoded as UTF-8") from None
