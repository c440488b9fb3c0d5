"""What the dispatcher keeps per open session (``SessionState``, held by the registry): the calls
in flight that a cancel reaches, the plan it proposed, its staged changes and its clocks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dispatcher.core.approval.broker import ConfirmationBroker
from dispatcher.core.errors import ToolErrorClass
from dispatcher.core.events.bus import EventBus
from dispatcher.core.events.payloads import EventPayload
from dispatcher.core.sessions.clock import SessionClock
from dispatcher.core.sessions.processes import ProcessMemory
from dispatcher.core.sessions.session import Session, SessionStatus
from dispatcher.core.staging.area import StagingArea

__all__ = ["Call", "PlanStep", "SessionState"]


@dataclass(frozen=True, slots=True)
class PlanStep:
    """A call a ``plan`` session proposed instead of running."""

    step: int
    turn_id: str
    tool_use_id: str
    tool_name: str
    side_effect: str
    input_summary: str
    projected_modifications: tuple[str, ...]


@dataclass(eq=False)
class Call:
    """One in-flight tool call."""

    tool_use_id: str
    turn_id: str = ""
    cancel_event: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_reason: ToolErrorClass | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # Callbacks run on cancel: cheaper on the hot path than a task waiting on cancel_event.
    wakers: list[Callable[[], None]] = field(default_factory=list)

    def cancel(self, reason: ToolErrorClass = ToolErrorClass.CANCELLED) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.cancel_event.set()
        for wake in tuple(self.wakers):
            wake()

    async def wait(self, future: asyncio.Future[Any], timeout: float) -> bool:
        """Wait until ``future`` is done, the call is cancelled, or ``timeout``; True if done."""
        if future.done() or self.cancel_event.is_set():
            return future.done()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def wake(*_: object) -> None:
            if not waiter.done():
                waiter.set_result(None)

        future.add_done_callback(wake)
        self.wakers.append(wake)
        timer = loop.call_later(timeout, wake)
        try:
            await waiter
        finally:
            timer.cancel()
            future.remove_done_callback(wake)
            self.wakers.remove(wake)
        return future.done()


@dataclass(eq=False)
class SessionState:
    """One session as the registry (``core/sessions/registry.py``) holds it: its description, where
    it is in its life, and what it carries between calls."""

    session: Session
    bus: EventBus
    semaphore: asyncio.Semaphore
    create_time: float = 0.0
    """Wall-clock seconds when the session was first created (kept across restarts)."""
    status: SessionStatus = SessionStatus.OPEN
    """Changed only by the registry."""
    broker: ConfirmationBroker = field(default_factory=ConfirmationBroker)
    calls: set[Call] = field(default_factory=set)
    cleanups: set[asyncio.Future[Any]] = field(default_factory=set)  # strong refs to background stops
    waiting: set[Callable[[], None]] = field(default_factory=set)
    """Starters of calls accepted but not started yet (a Dispatch whose client reads slowly): run
    before the session's calls are cancelled, so that the cancel reaches those calls too."""
    mode: str = ""
    """The approval mode in force (``core/call/approve.py``): the session's, until an approved plan
    turns ``plan`` into ``autonomous``."""
    plan: list[PlanStep] = field(default_factory=list)
    """The steps a ``plan`` session proposed, in order, until the plan is approved or rejected."""
    staging: StagingArea = field(init=False)
    """Review and audit sessions: writes kept off the disk until a human applies them."""
    clock: SessionClock = field(default_factory=SessionClock)
    """Its TTL and idle clocks (``core/sessions/expiry.py``)."""
    processes: ProcessMemory = field(init=False)
    """Its shell's directory and variables, what its model last read of each process, and who
    announces their ends (``core/sessions/processes.py``)."""

    def __post_init__(self) -> None:
        self.staging = StagingArea(self.session.session_id)
        self.processes = ProcessMemory(self._publish_process_event)
        if not self.mode:
            self.mode = self.session.approval_mode

    def _publish_process_event(self, payload: EventPayload, tool_use_id: str) -> None:
        self.bus.publish(payload, turn_id="", tool_use_id=tool_use_id)
