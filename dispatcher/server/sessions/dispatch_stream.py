"""One Dispatch call as a stream of domain items: this call's events and one result per tool_use.

Each tool_use runs as its own ``dispatcher.dispatch`` task (the core applies the per-session
concurrency cap), so a result goes out as soon as it is ready rather than when the slowest call ends.

Ordering: a result is always sent after every event of its call. The bus calls the subscription
filter synchronously at publish time, in publish order; the filter here is used as a tap that puts
matching events into this call's queue there and then. A call's result is queued when its dispatch
returns, i.e. after its last event was published, so one FIFO queue gives the right order without
any timing assumption.

Output: the caller gets every byte of its own calls' output. The queue is a paced ``Backlog``
(``core/events/bus.py``): when the client falls ``DEFAULT_MAX_BYTES`` (or ``max_pending`` items)
behind, the bus's ``room`` tells a producing command to wait until the client has read half of it,
and the command's output stops being read meanwhile (``sandbox/agent_link.py``), so the command
slows down, as in a terminal, instead of the caller losing the middle of it. Only past
``PACED_BYTES`` — output that could not wait (a command being stopped) — are deltas skipped and the
gap marked with the bytes it stands for. Watchers (``WatchSession``) are never waited for.

Memory: results are never dropped, so what a client that does not read can make the server hold is
bounded at the start instead. Each running tool_use reserves the most one result may weigh
(``DispatcherConfig.result_budget_bytes``); the next tool_use starts only while the bytes queued for
the client plus those reservations stay within ``pending_bytes`` (one tool_use may always run, so a
call always progresses). Further tool_uses start as the client reads. A session being cancelled or
closed starts them all at once, so that the core cancels them like any other call.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from dispatcher.core import eager
from dispatcher.core.call.ordering import Ordering
from dispatcher.core.dispatcher import ToolDispatcher
from dispatcher.core.errors import ToolErrorClass
from dispatcher.core.events.bus import DEFAULT_MAX_BYTES, Backlog, Event
from dispatcher.core.sessions.session import Session
from dispatcher.core.sessions.state import SessionState
from dispatcher.core.text.result_size import result_bytes
from dispatcher.core.types import TextBlock, ToolResultBlock, ToolUseBlock

log = logging.getLogger("dispatcher.server.dispatch")

Item = Event | ToolResultBlock
PENDING_RESULT_BYTES = 16 << 20
"""Default per Dispatch: bytes of results (and events) held for a client that has not read them."""
PACED_BYTES = 4 * DEFAULT_MAX_BYTES
"""Per Dispatch: bytes of events queued before output that did not wait for the client is skipped."""


class DispatchCall:
    """Runs one DispatchRequest and yields its items; cancelling the iteration cancels the tools."""

    def __init__(
        self,
        dispatcher: ToolDispatcher,
        session: Session,
        turn_id: str,
        tool_uses: Sequence[ToolUseBlock],
        *,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        max_pending: int = 4096,
        pending_bytes: int = PENDING_RESULT_BYTES,
        ordering: Ordering | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._session = session
        self._turn_id = turn_id
        self._tool_uses = tuple(tool_uses)
        self._order = dispatcher.message_order(self._tool_uses, ordering)  # None: the configured one
        self._ids = frozenset(tu.id for tu in tool_uses)
        self._queue: Backlog[ToolResultBlock] = Backlog(max_items=max_pending, paced_bytes=PACED_BYTES)
        self._tasks: dict[str, asyncio.Task[ToolResultBlock]] = {}  # every started one, done or not
        self._spawn = spawn
        self._pending_bytes = pending_bytes
        self._reserve = dispatcher.config.result_budget_bytes
        self._running = 0  # started, result not queued yet
        self._stopped = False  # the client went away: start nothing more

    @property
    def started(self) -> int:
        """How many of the tool_uses have started (the rest wait for the client to read)."""
        return len(self._tasks)

    @property
    def running(self) -> int:
        """How many started tool_uses have no result yet."""
        return self._running

    @property
    def held_bytes(self) -> int:
        """Bytes queued for the client plus those reserved for the results of running tool_uses."""
        return self._queue.bytes + self._running * self._reserve

    def _start_more(self) -> None:
        while len(self._tasks) < len(self._tool_uses) and not self._stopped:
            held = self.held_bytes
            if held and held + self._reserve > self._pending_bytes:
                return  # back-pressure: the next one starts when the client reads
            self._start(self._tool_uses[len(self._tasks)])

    def start_all(self) -> None:
        """Start every tool_use still waiting for room (the session is being cancelled or closed)."""
        while len(self._tasks) < len(self._tool_uses) and not self._stopped:
            self._start(self._tool_uses[len(self._tasks)])

    def _start(self, tu: ToolUseBlock) -> None:
        # Started in message order: a call only ever waits for calls started before it.
        index = len(self._tasks)
        # Its first step runs now (core/eager.py): the events of a call that does not wait are
        # queued before this Dispatch first waits for them, and so is its result, right after
        # them, instead of a loop turn or two later when its task ends.
        started = eager.start(
            self._dispatcher.dispatch(
                tu, self._session, turn_id=self._turn_id, order=self._order, index=index
            ),
            name=f"dispatch:{self._session.session_id}:{tu.id}",
        )
        self._tasks[tu.id] = started.task
        if started.done_now:
            try:
                result = started.outcome()
            except asyncio.CancelledError:
                return  # as a cancelled task: no result (the client is gone or the server stops)
            except Exception as exc:
                self._queue_failure(tu.id, exc)
                return
            self._queue.put(result, result_bytes(result))
            return
        # The id travels with the callback: a task name is for humans, and ids may contain ":".
        started.task.add_done_callback(functools.partial(self._result_ready, tu.id))
        self._running += 1

    def _tap(self, event: Event) -> bool:
        if event.turn_id == self._turn_id and event.tool_use_id in self._ids:
            self._queue.offer(event)
        return False  # nothing for the subscription itself: the queue already has it

    def _pace(self, turn_id: str, tool_use_id: str) -> asyncio.Future[None] | None:
        """The bus's question for a call producing output: wait for this client first?"""
        if turn_id == self._turn_id and tool_use_id in self._ids:
            return self._queue.room()
        return None

    async def items(self) -> AsyncIterator[Item]:
        """Events of this call as they happen and each tool_use's result once it is ready."""
        bus = self._dispatcher.events(self._session.session_id)
        finished = False
        async with bus.subscribe(event_filter=self._tap):
            bus.pace(self._pace)
            try:
                self._start_more()
                remaining = len(self._tool_uses)
                while remaining:
                    item = await self._queue.get()
                    self._start_more()
                    if isinstance(item, ToolResultBlock):
                        remaining -= 1
                        if log.isEnabledFor(logging.DEBUG):
                            log.debug(
                                "result sent",
                                extra={
                                    "session_id": self._session.session_id,
                                    "turn_id": self._turn_id,
                                    "tool_use_id": item.tool_use_id,
                                    "error_class": item.error_class,
                                },
                            )
                    yield item
                finished = True
            finally:
                self._stopped = True
                bus.unpace(self._pace)
                self._queue.release()  # a command waiting for this client goes on
                if not finished:
                    # The client went away (or the server is stopping): cancel what still runs, in a
                    # task of its own because this one is being cancelled.
                    self._spawn(self._abandon())
        if self._queue.skipped:
            log.warning(
                "slow client: skipped output deltas",
                extra={"session_id": self._session.session_id, "dropped": self._queue.skipped},
            )

    def _result_ready(self, tool_use_id: str, task: asyncio.Task[ToolResultBlock]) -> None:
        self._running -= 1
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            result = task.result()
            self._queue.put(result, result_bytes(result))
        else:
            self._queue_failure(tool_use_id, exc)
        self._start_more()

    def _queue_failure(self, tool_use_id: str, exc: BaseException) -> None:
        # The core turns every tool failure into a result; an exception here is a core bug. The
        # caller still gets exactly one result for the tool_use.
        log.error("dispatch raised", exc_info=exc, extra={"session_id": self._session.session_id})
        failed = ToolResultBlock(
            tool_use_id=tool_use_id,
            content=(TextBlock("internal error in the dispatcher (see the server log)"),),
            is_error=True,
            error_class=ToolErrorClass.EXECUTION_ERROR,
        )
        self._queue.put(failed, result_bytes(failed))

    async def _abandon(self) -> None:
        pending = [tid for tid, t in self._tasks.items() if not t.done()]
        if not pending:
            return
        log.info(
            "client went away: cancelling its tool calls",
            extra={"session_id": self._session.session_id, "tool_use_ids": pending},
        )
        await self._dispatcher.cancel_tool_uses(self._session.session_id, pending)
        await asyncio.gather(*(self._tasks[t] for t in pending), return_exceptions=True)


class DispatchScope:
    """One Dispatch call of a session for an ``async with`` block: admitted (one of the tenant's
    dispatch slots held), the session held busy (resumed first if paused), and the call known to
    the session, so that a cancel or a close starts its tool_uses still waiting for the client to
    read and so reaches them too. A class rather than a generator: every Dispatch enters one."""

    __slots__ = ("_admitted", "_call", "_held", "_make", "_state")

    def __init__(
        self,
        admitted: AbstractAsyncContextManager[None],
        held: AbstractAsyncContextManager[None],
        state: SessionState,
        make: Callable[[], DispatchCall],
    ) -> None:
        self._admitted = admitted
        self._held = held
        self._state = state
        self._make = make
        self._call: DispatchCall | None = None

    async def __aenter__(self) -> DispatchCall:
        await self._admitted.__aenter__()
        try:
            await self._held.__aenter__()
            try:
                call = self._make()
            except BaseException:
                await self._held.__aexit__(None, None, None)
                raise
        except BaseException:
            await self._admitted.__aexit__(None, None, None)
            raise
        self._state.waiting.add(call.start_all)
        self._call = call
        return call

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._call is not None:
            self._state.waiting.discard(self._call.start_all)
        try:
            await self._held.__aexit__(*exc_info)
        finally:
            await self._admitted.__aexit__(*exc_info)
