"""Host side of the agent protocol: the core ``Sandbox`` API over one framed byte stream.

Everything the agent sends is untrusted. Frames are size-bounded and every field is
type-checked; any violation, or the stream ending, breaks the channel: pending and future calls
fail with ``SandboxError`` and the owner (the Docker or local backend) replaces the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

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
from dispatcher.sandbox.agent.agent import PREFIX, ProtocolError, decode_header, decode_prefix, encode_frame

log = logging.getLogger(__name__)

DEFAULT_MAX_FRAME = 32 << 20  # largest payload either way: caps file reads and writes
MAX_HEADER = 64 << 10  # agent headers are small; bulk data travels in payloads
KILL_WAIT_SECONDS = 2.0  # after SIGKILL, how long the group may take before the agent is given up
_T = TypeVar("_T")


class AgentUnresponsive(SandboxError):
    """The agent, or a process group it runs, no longer responds; stop and recreate the sandbox."""


class NotDelivered(SandboxError):
    """The channel was already broken when a request was to be sent: nothing of it ran."""


class FrameWriter(Protocol):
    """The byte sink towards the agent (an ``asyncio.StreamWriter`` fits)."""

    def write(self, data: bytes) -> Any: ...

    async def drain(self) -> None: ...

    def close(self) -> Any: ...


@dataclass(eq=False)
class _Call:
    future: asyncio.Future[tuple[dict[str, Any], bytes]]


@dataclass(eq=False)
class _ExecCall:
    on_output: OutputCallback
    done: asyncio.Future[dict[str, Any]]
    interrupted: asyncio.Event = field(default_factory=asyncio.Event)
    callback_error: BaseException | None = None


class AgentChannel:
    """Implements ``dispatcher.core.sandbox_api.Sandbox`` by talking to one agent process."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: FrameWriter,
        *,
        workspace_root: str = "/workspace",
        max_frame: int = DEFAULT_MAX_FRAME,
        kill_wait: float = KILL_WAIT_SECONDS,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._root = workspace_root.rstrip("/") or "/"
        self._max_frame = max_frame
        self._kill_wait = kill_wait
        self._pending: dict[int, _Call | _ExecCall] = {}
        self._next_id = 1
        self._failure: SandboxError | None = None
        self._read_task: asyncio.Task[None] | None = None

    @property
    def workspace_root(self) -> str:
        return self._root

    @property
    def broken(self) -> bool:
        """True once the channel failed or was closed; every call will raise ``SandboxError``."""
        return self._failure is not None

    # -- plumbing ---------------------------------------------------------------------------

    def _fail(self, error: SandboxError, *, quiet: bool = False) -> SandboxError:
        """Break the channel (first failure wins) and fail everything still waiting."""
        if self._failure is None:
            self._failure = error
            if not quiet:
                log.warning("agent channel broken: %s", error)
        pending, self._pending = self._pending, {}
        for call in pending.values():
            waiter = call.future if isinstance(call, _Call) else call.done
            if not waiter.done():
                waiter.set_exception(self._failure)
        return self._failure

    def _usable(self) -> None:
        if self._failure is not None:
            raise NotDelivered(str(self._failure)) from self._failure
        if self._read_task is None:
            self._read_task = asyncio.get_running_loop().create_task(self._read_loop())

    def _register(self, call: _Call | _ExecCall) -> int:
        rid = self._next_id
        self._next_id += 1
        self._pending[rid] = call
        return rid

    async def _send(self, header: Mapping[str, Any], payload: bytes = b"") -> None:
        try:
            self._writer.write(encode_frame(header, payload))
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            raise self._fail(SandboxError(f"cannot write to the agent: {exc}")) from exc

    def _post(self, header: Mapping[str, Any]) -> None:
        """Send without waiting for buffer space or an answer (signals must not block)."""
        if self._failure is not None:
            return
        rid = self._next_id
        self._next_id += 1  # the agent's answer arrives as a late reply and is ignored
        try:
            self._writer.write(encode_frame({"id": rid, **header}))
        except (OSError, RuntimeError) as exc:
            self._fail(SandboxError(f"cannot write to the agent: {exc}"))

    async def _read_loop(self) -> None:
        try:
            while True:
                prefix = await self._reader.readexactly(PREFIX.size)
                header_len, payload_len = decode_prefix(
                    prefix, max_header=MAX_HEADER, max_payload=self._max_frame
                )
                header = decode_header(await self._reader.readexactly(header_len))
                payload = await self._reader.readexactly(payload_len) if payload_len else b""
                self._deliver(header, payload)
        except asyncio.IncompleteReadError:
            self._fail(SandboxError("the agent closed the channel"))
        except ProtocolError as exc:
            self._fail(SandboxError(f"agent protocol violation: {exc}"))
        except asyncio.CancelledError:
            self._fail(SandboxError("the channel was closed"), quiet=True)
            raise
        except Exception as exc:  # a failed read must never leave callers waiting forever
            self._fail(SandboxError(f"reading from the agent failed: {exc!r}"))

    def _deliver(self, header: dict[str, Any], payload: bytes) -> None:
        kind = replies.require(header, "type", str)
        rid = header.get("id")
        if kind == "error":
            replies.check_error(header)
            if rid is None:
                raise ProtocolError(f"agent rejected a frame: {header['message'][: replies.MAX_MESSAGE]}")
        if type(rid) is not int:
            raise ProtocolError("response without an integer id")
        call = self._pending.get(rid)
        if call is None:
            if 0 < rid < self._next_id:
                return  # a late answer to a call nobody waits for any more
            raise ProtocolError(f"response to request {rid}, which was never sent")
        if isinstance(call, _Call):
            if kind not in ("result", "error"):
                raise ProtocolError(f"unexpected {kind!r} frame for a file request")
            del self._pending[rid]
            if not call.future.done():  # a cancelled caller's future may already be done
                call.future.set_result((header, payload))
            return
        if kind == "output":
            self._deliver_output(call, replies.output_stream(header, payload), payload)
            return
        if kind == "exit":
            replies.check_exit(header)
        elif kind != "error":
            raise ProtocolError(f"unexpected {kind!r} frame for a command")
        del self._pending[rid]
        if not call.done.done():
            call.done.set_result(header)

    def _deliver_output(self, call: _ExecCall, stream: Literal["stdout", "stderr"], payload: bytes) -> None:
        if call.callback_error is not None:
            return
        try:
            call.on_output(stream, payload)
        except Exception as exc:  # the consumer's bug: stop the command, report after it is gone
            call.callback_error = exc
            call.interrupted.set()

    async def _call(self, header: Mapping[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        self._usable()
        future: asyncio.Future[tuple[dict[str, Any], bytes]] = asyncio.get_running_loop().create_future()
        rid = self._register(_Call(future))
        try:
            await self._send({"id": rid, **header}, payload)
            reply, body = await future
        finally:
            self._pending.pop(rid, None)
            if future.done() and not future.cancelled():
                # A failed send failed this future too (``_fail``); its error is the one raised.
                # Marked as seen, or the garbage collector logs it later, from any thread.
                future.exception()
        if reply["type"] == "error":
            raise replies.error_for(reply)
        return reply, body

    async def request(self, header: Mapping[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        """One request and its single answer, for ops without a method here (tree transfers).

        Raises:
            FileOpError, WorkspaceEscapeError, ToolPermissionDenied: the agent's error answer.
            SandboxError: the channel is broken.
        """
        return await self._call(header, payload)

    def violation(self, what: str) -> SandboxError:
        """Break the channel over an answer that broke the protocol, and return the error."""
        return self._violation(what)

    def _violation(self, what: str) -> SandboxError:
        return self._fail(SandboxError(f"agent protocol violation: {what}"))

    def _parse(self, parser: Callable[..., _T], *args: Any) -> _T:
        """Run a reply parser; a reply it rejects breaks the channel."""
        try:
            return parser(*args)
        except ProtocolError as exc:
            raise self._violation(str(exc)) from None

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

    async def write_bytes(self, path: str, data: bytes, *, approved: str | None = None) -> None:
        """Atomic replace (temp file in the same directory + rename), keeping the mode; makes parents."""
        await self._call(_pinned({"op": "write", "path": path}, approved), self._payload(path, data))

    async def write(self, path: str, content: str, *, approved: str | None = None) -> None:
        """Write text as UTF-8, atomically."""
        await self.write_bytes(path, _encode(path, content), approved=approved)

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

    async def patch(self, path: str, old: str, new: str, *, approved: str | None = None) -> None:
        """Replace the single occurrence of ``old`` atomically; ``no_match``/``multiple_matches`` else."""
        old_b, new_b = _encode(path, old), _encode(path, new)
        header = {"op": "patch", "path": path, "old_len": len(old_b)}
        await self._call(_pinned(header, approved), self._payload(path, old_b + new_b))

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
        call = _ExecCall(on_output, loop.create_future())
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
                if not await _settled(call.done, request.grace_seconds):
                    self._post({"op": "signal", "exec_id": rid, "signal": "KILL"})
                    killed = True
                    if not await _settled(call.done, self._kill_wait):
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
        self, call: _ExecCall, cancel_event: asyncio.Event, timeout: float
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

    async def procs(self, *, kill: bool = False) -> tuple[int, int, int]:
        """(processes commands left running, how many were killed, processes left); ``kill``
        stops and kills them all (the agent's and init's excepted)."""
        reply, _ = await self._call({"op": "procs", "kill": kill})
        counts = tuple(
            self._parse(replies.require, reply, key, int) for key in ("processes", "killed", "left")
        )
        if min(counts) < 0:
            raise self._violation("negative process count")
        return counts[0], counts[1], counts[2]

    async def ping(self, timeout: float = 5.0) -> int:
        """Round-trip to the agent; returns the protocol version it speaks.

        Raises:
            AgentUnresponsive: no answer within ``timeout`` (the channel is then broken).
        """
        try:
            reply, _ = await asyncio.wait_for(self._call({"op": "ping"}), timeout)
        except TimeoutError:
            raise self._fail(AgentUnresponsive(f"no answer to ping within {timeout} s")) from None
        version: int = self._parse(replies.require, reply, "version", int)
        return version

    def abort(self, reason: str) -> None:
        """Break the channel now (its container is gone); pending calls fail with ``reason``."""
        self._fail(SandboxError(reason))

    async def close(self) -> None:
        """Break the channel, close the writer and stop reading; idempotent."""
        self._fail(SandboxError("the channel was closed"), quiet=True)
        with contextlib.suppress(Exception):
            self._writer.close()
            wait_closed = getattr(self._writer, "wait_closed", None)
            if wait_closed is not None:
                await asyncio.wait_for(wait_closed(), 1.0)
        task, self._read_task = self._read_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _settled(future: asyncio.Future[Any], timeout: float) -> bool:
    if not future.done():
        await asyncio.wait([future], timeout=max(timeout, 0.0))
    return future.done()


def _pinned(header: dict[str, Any], approved: str | None) -> dict[str, Any]:
    """The request with the approved path, when there is one (the agent then uses exactly it)."""
    if approved is not None:
        header["approved"] = approved
    return header


def _encode(path: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise FileOpError("decode", f"{path}: text cannot be encoded as UTF-8") from None
