"""``ProcessControl`` over a sandbox's agent, written once for every agent-backed sandbox.

How a process op reaches a live agent differs per sandbox (``ProcessHost``): the container one
holds the container busy for the op, bounds it with the op timeout (plus the wait or grace the op
itself asks for) and stops a container whose agent did not answer; the local one starts its
agent on demand. What is the same everywhere is here:

- **Nothing is launched to find nothing.** Only ``start`` starts a sandbox; listing a session
  whose sandbox does not run answers no process, and any other op ``no_process``. A container
  a restarted server is to re-adopt is re-adopted first (its processes still run).
- **A sandbox that was replaced took its processes with it.** The table lives in the agent, so a
  recreated container (or a restarted local agent) starts empty; ``no_process`` then says so, and
  why the previous one went, rather than only "unknown id".
- **Streams do not hold the sandbox busy.** A watch or a wait may last hours: it takes the live
  channel and lets go of the sandbox, so its idle and lifetime rules still apply (a running
  process keeps a sandbox from idling anyway); a sandbox removed under it ends it with an error.
- **``wait`` costs the same whatever the process prints.** It asks the agent for the table
  (``proc_list``, answered inline by the agent's reader, no thread held there) every
  ``WAIT_POLL_MIN``..``WAIT_POLL_MAX`` seconds, backing off while nothing ends, one poller for all
  of a sandbox's waiters: records only, never output, so a process printing 50 MB costs it
  nothing more. A ``proc_read`` waiting for the end would take one of the agent's 32 command
  threads per waited process for as long as it runs.
- **Paused.** A frozen sandbox answers nothing; short ops are refused by the host (``paused``),
  waits resume polling once it is thawed, and a watch just gets no output meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

from dispatcher.core.process_api import (
    OutputChunk,
    ProcessError,
    ProcessInfo,
    ProcessOutput,
    ProcessStart,
)
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.agent_link import KILL_WAIT_SECONDS
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.processes.calls import MAX_WAIT_SECONDS, no_process

log = logging.getLogger(__name__)
T = TypeVar("T")

WAIT_POLL_MIN = 0.05
"""The first pause between two looks at the table of a sandbox with waiters, after one ended."""
WAIT_POLL_MAX = 1.0
"""The longest pause between two looks: how late at most an end is noticed."""
LOOK_TIMEOUT = 30.0
"""How long one look may take (the agent answers it inline; a frozen one does not)."""


class ProcessHost(Protocol):
    """How one sandbox reaches its agent for process ops."""

    @property
    def generation(self) -> int:
        """How many times the session's sandbox was replaced (each took its processes with it)."""
        ...

    @property
    def last_removal(self) -> str | None:
        """Why the last one was replaced, if it was."""
        ...

    async def process_op(
        self, what: str, op: Callable[[AgentChannel], Awaitable[T]], *, launch: bool, extra_seconds: float
    ) -> T | None:
        """``op`` on the live agent channel, guarded as the sandbox guards its calls, allowed
        ``extra_seconds`` beyond the op timeout; None when the sandbox does not run and
        ``launch`` is False (then no process exists)."""
        ...

    async def process_channel(self) -> AgentChannel | None:
        """The live channel for a long stream (watch, wait), not counted as a call; None when the
        sandbox does not run (nothing is launched)."""
        ...

    async def thawed(self) -> None:
        """Return once the session is not paused."""
        ...


class AgentProcesses:
    """Implements ``core.process_api.ProcessControl`` over a sandbox's agent (``ProcessHost``)."""

    def __init__(self, host: ProcessHost) -> None:
        self._host = host
        self._seen: dict[str, int] = {}
        """Ids seen here, with the sandbox generation they were seen in (for ``no_process``)."""
        self._groups: dict[str, int] = {}
        """The process groups of the processes last seen running."""
        self._waiters: dict[str, list[asyncio.Future[ProcessInfo]]] = {}
        self._poller: asyncio.Task[None] | None = None

    # -- what was seen, and where it went ----------------------------------------------------

    def _saw(self, *records: ProcessInfo) -> None:
        generation = self._host.generation
        for record in records:
            self._seen[record.process_id] = generation
            if record.running:
                self._groups[record.process_id] = record.pid
            else:
                self._groups.pop(record.process_id, None)
        if len(self._seen) > 4096:  # ids of long-gone sandboxes first; bounded either way
            for key in sorted(self._seen, key=self._seen.__getitem__)[: len(self._seen) - 4096]:
                del self._seen[key]

    def saw_left(self, process_ids: tuple[str, ...]) -> None:
        """Ids a foreground command left running (``ExecResult.left``): known from now on."""
        for process_id in process_ids:
            self._seen[process_id] = self._host.generation

    def forget_groups(self) -> tuple[int, ...]:
        """The process groups last seen running, forgotten now (their agent is gone: a sandbox
        with nothing else to bound them kills them, ``LocalSandbox``)."""
        groups, self._groups = tuple(self._groups.values()), {}
        return groups

    def gone(self, process_id: str) -> ProcessError:
        """``no_process`` for ``process_id``, saying whether the sandbox was replaced meanwhile."""
        host = self._host
        why = f" ({host.last_removal})" if host.last_removal else ""
        seen = self._seen.get(process_id)
        if seen is not None and seen < host.generation:
            return ProcessError(
                "no_process",
                f"process {process_id!r} is gone: the session's sandbox was removed since it"
                f" started{why}, and its processes ended with it; the next call gets a fresh"
                " sandbox (the workspace is intact): start it again if it is still needed",
            )
        if host.generation:
            return no_process(
                process_id,
                f" (the session's sandbox was removed{why}: processes started before that are gone)",
            )
        return no_process(process_id)

    async def _op(
        self,
        process_id: str | None,
        what: str,
        op: Callable[[AgentChannel], Awaitable[T]],
        *,
        launch: bool = False,
        extra_seconds: float = 0.0,
    ) -> T | None:
        try:
            return await self._host.process_op(what, op, launch=launch, extra_seconds=extra_seconds)
        except ProcessError as exc:
            if exc.code == "no_process" and process_id is not None:
                raise self.gone(process_id) from None
            raise

    # -- ProcessControl ------------------------------------------------------------------------

    async def start(self, request: ProcessStart) -> ProcessInfo:
        """See ``ProcessControl.start``: the sandbox is started if it does not run."""
        info = await self._op(None, "process start", lambda ch: ch.start_process(request), launch=True)
        assert info is not None  # launched
        self._saw(info)
        return info

    async def list(self) -> tuple[ProcessInfo, ...]:
        """See ``ProcessControl.list``; a sandbox that does not run has none (none is launched)."""
        records = await self._op(None, "process list", lambda ch: ch.list_processes())
        if records is None:
            return ()
        self._saw(*records)
        return records

    async def read(
        self, process_id: str, *, after: int = 0, wait_seconds: float = 0.0, max_bytes: int = 64 * 1024
    ) -> ProcessOutput:
        """See ``ProcessControl.read`` (``wait_seconds`` at most 600, ``max_bytes`` 1 MiB)."""
        wait = min(max(wait_seconds, 0.0), MAX_WAIT_SECONDS)
        output = await self._op(
            process_id,
            "process read",
            lambda ch: ch.read_process(process_id, after=after, wait_seconds=wait, max_bytes=max_bytes),
            extra_seconds=wait,
        )
        if output is None:
            raise self.gone(process_id)
        return output

    async def write_input(self, process_id: str, data: bytes, *, close: bool = False) -> ProcessInfo:
        """See ``ProcessControl.write_input``."""
        info = await self._op(
            process_id, "process input", lambda ch: ch.write_process_input(process_id, data, close=close)
        )
        if info is None:
            raise self.gone(process_id)
        return info

    async def signal(
        self, process_id: str, signal: str, *, grace_seconds: float | None = None
    ) -> ProcessInfo:
        """See ``ProcessControl.signal`` (``grace_seconds`` at most 600)."""
        grace = None if grace_seconds is None else min(max(grace_seconds, 0.0), MAX_WAIT_SECONDS)
        info = await self._op(
            process_id,
            "process signal",
            lambda ch: ch.signal_process(process_id, signal, grace_seconds=grace),
            extra_seconds=0.0 if grace is None else grace + KILL_WAIT_SECONDS,
        )
        if info is None:
            raise self.gone(process_id)
        return info

    async def watch(self, process_id: str, *, after: int = 0) -> AsyncIterator[OutputChunk | ProcessInfo]:
        """See ``ProcessControl.watch``; bounded for a slow consumer (``AgentChannel.watch_process``)."""
        channel = await self._host.process_channel()
        if channel is None:
            raise self.gone(process_id)
        stream = channel.watch_process(process_id, after=after)
        try:
            async for item in stream:
                yield item
        except ProcessError as exc:
            if exc.code == "no_process":
                raise self.gone(process_id) from None
            raise
        finally:
            await stream.aclose()

    async def wait(self, process_id: str) -> ProcessInfo:
        """See ``ProcessControl.wait``: the record once it ended (polled, see the module).

        Raises:
            ProcessError: ``no_process``: unknown, forgotten, or its sandbox went.
        """
        future: asyncio.Future[ProcessInfo] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(process_id, []).append(future)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        try:
            return await future
        finally:
            waiting = self._waiters.get(process_id)
            if waiting is not None:
                with contextlib.suppress(ValueError):
                    waiting.remove(future)
                if not waiting:
                    del self._waiters[process_id]

    async def _poll(self) -> None:
        """Look at the table until no waiter is left, backing off while nothing ends."""
        delay = WAIT_POLL_MIN
        try:
            while self._waiters:
                await self._host.thawed()
                ended = await self._look()
                delay = WAIT_POLL_MIN if ended else min(delay * 2, WAIT_POLL_MAX)
                if self._waiters:
                    await asyncio.sleep(delay)
        except Exception as exc:  # no waiter may be left waiting on a poller that is gone
            log.exception("the process waiter failed")
            self._fail_all(exc if isinstance(exc, ProcessError) else SandboxError(f"waiting failed: {exc!r}"))

    def _fail_all(self, error: Exception) -> None:
        for futures in self._waiters.values():
            for future in futures:
                if not future.done():
                    future.set_exception(error)

    async def _look(self) -> bool:
        """One look; True when a waiter was answered."""
        channel: AgentChannel | None = None
        try:
            channel = await self._host.process_channel()
            records = (
                None if channel is None else await asyncio.wait_for(channel.list_processes(), LOOK_TIMEOUT)
            )
        except TimeoutError:  # paused meanwhile, or a busy agent: the next look asks again
            return False
        except ProcessError as exc:
            if exc.code == "unsupported":
                raise
            records = None
        except SandboxError as exc:
            if channel is not None and not channel.broken:
                log.warning("cannot look at the process table: %s", exc)
                return False
            records = None  # its agent died: its processes are gone with it
        if records is not None:
            self._saw(*records)
        by_id = {} if records is None else {r.process_id: r for r in records}
        answered = False
        for process_id, futures in list(self._waiters.items()):
            record = by_id.get(process_id)
            if record is not None and record.running:
                continue
            for future in futures:
                if future.done():
                    continue
                if record is None:
                    future.set_exception(self.gone(process_id))
                else:
                    future.set_result(record)
                answered = True
        return answered

    def close(self) -> None:
        """Stop looking (the sandbox is closing); waiters get ``SandboxError``."""
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
        self._fail_all(SandboxError("the session's sandbox was closed"))
