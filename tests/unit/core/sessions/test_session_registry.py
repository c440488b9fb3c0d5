"""The session registry: states, the one "is it open?" answer, and how listeners are told."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from dispatcher.core import ToolDispatcher, UnknownSessionError
from dispatcher.core.approval.broker import Decision
from dispatcher.core.errors import ToolErrorClass
from dispatcher.core.events.bus import TOOL_CALLED, Event
from dispatcher.core.events.payloads import ToolCalled
from dispatcher.core.sessions.registry import BaseSessionListener, Restoration, SessionRegistry
from dispatcher.core.sessions.session import Session, SessionStatus
from dispatcher.core.sessions.state import PlanStep, SessionState
from dispatcher.core.types import ToolUseBlock
from dispatcher.sandbox.fake import FakeSandboxProvider
from tests.unit.core.toolkit import ALL_TOOLS


class Recorder(BaseSessionListener):
    """Writes what it is told, in order, to a log shared with the other listeners."""

    def __init__(self, name: str, log: list[str], *, fail_on: str = "") -> None:
        self.name = name
        self.log = log
        self.fail_on = fail_on

    def _tell(self, what: str, state: SessionState) -> None:
        self.log.append(f"{self.name}:{what}:{state.session.session_id}:{state.status}")
        if what == self.fail_on:
            raise RuntimeError(f"{self.name} failed on {what}")

    def session_opened(self, state: SessionState) -> None:
        self._tell("opened", state)

    def session_restored(self, state: SessionState, restored: Restoration) -> None:
        self._tell("restored", state)

    def session_closed(self, state: SessionState) -> None:
        self._tell("closed", state)


def _session(sid: str = "s1", tenant: str = "t") -> Session:
    return Session(session_id=sid, workspace_path="/nowhere", tenant_id=tenant)


def _registry(*listeners: BaseSessionListener) -> SessionRegistry:
    registry = SessionRegistry()
    registry.subscribe(*listeners)
    return registry


async def test_a_session_goes_open_closing_closed_and_only_open_is_open() -> None:
    registry = _registry()
    state = registry.open(_session())
    assert state.status is SessionStatus.OPEN
    assert registry.is_open("s1") and registry.get("s1") is state
    assert registry.begin_close("s1") is state
    assert registry.status("s1") is SessionStatus.CLOSING
    assert not registry.is_open("s1")
    with pytest.raises(UnknownSessionError, match="is closed"):  # ended from its first step
        registry.get("s1")
    ended = registry.ended("s1")
    assert ended is not None and ended.status is SessionStatus.CLOSED
    assert registry.find("s1") is state  # closing work still reaches it
    assert registry.count("t") == 1  # it holds its sandbox until closed: still counts for the quota
    registry.finish_close(state)
    assert registry.status("s1") is SessionStatus.CLOSED and registry.find("s1") is None
    with pytest.raises(UnknownSessionError, match="is closed"):
        registry.get("s1")
    with pytest.raises(UnknownSessionError, match="unknown session"):
        registry.get("never")
    assert registry.begin_close("s1") is None


async def test_listeners_are_told_in_order_and_closed_in_reverse_once() -> None:
    log: list[str] = []
    registry = _registry(Recorder("store", log), Recorder("sandbox", log), Recorder("metrics", log))
    state = registry.open(_session())
    registry.begin_close("s1")
    registry.finish_close(state)
    registry.finish_close(state)  # a second closer (shutdown racing a CloseSession) tells no one
    assert log == [
        "store:opened:s1:open",
        "sandbox:opened:s1:open",
        "metrics:opened:s1:open",
        "metrics:closed:s1:closed",
        "sandbox:closed:s1:closed",
        "store:closed:s1:closed",
    ]


async def test_a_listener_failing_on_open_undoes_the_open() -> None:
    log: list[str] = []
    registry = _registry(
        Recorder("store", log), Recorder("sandbox", log, fail_on="opened"), Recorder("m", log)
    )
    with pytest.raises(RuntimeError, match="sandbox failed"):
        registry.open(_session())
    # Those told it opened are told it closed (the store forgets the row it wrote); the rest never heard.
    assert log == ["store:opened:s1:open", "sandbox:opened:s1:open", "store:closed:s1:closed"]
    assert not registry.is_open("s1") and registry.count("t") == 0


async def test_a_listener_failing_on_close_does_not_keep_the_session_or_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: list[str] = []
    registry = _registry(Recorder("store", log), Recorder("sandbox", log, fail_on="closed"))
    state = registry.open(_session())
    with caplog.at_level(logging.ERROR, logger="dispatcher.core.sessions"):
        registry.finish_close(state)
    assert log[-2:] == ["sandbox:closed:s1:closed", "store:closed:s1:closed"]
    assert registry.status("s1") is SessionStatus.CLOSED
    assert "a listener failed on session s1's close" in caplog.text


async def test_restore_is_open_with_stored_data_and_listeners_hear_restored() -> None:
    log: list[str] = []
    registry = _registry(Recorder("store", log))
    old = Event(7, 1.0, "s1", "turn", "tu", ToolCalled("shell", "execute", {}), 0)
    step = PlanStep(1, "turn", "tu", "shell", "execute", "ls", ())
    restored = Restoration(
        create_time=123.0,
        last_seq=7,
        events=(old,),
        remembered={"shell": Decision.ALLOW},
        mode="autonomous",
        plan=(step,),
        container_id="c1",
    )
    state = registry.open(_session(), restored=restored)
    assert log == ["store:restored:s1:open"]  # not "opened": the store must not write it again
    assert state.create_time == 123.0 and state.bus.last_seq == 7
    assert state.broker.remembered("shell") is Decision.ALLOW
    assert (state.mode, state.plan) == ("autonomous", [step])
    async with state.bus.subscribe(after_seq=0) as sub:
        state.bus.close()
        assert [e.seq async for e in sub] == [7]
    with pytest.raises(ValueError, match="already open"):
        registry.open(_session())


async def test_let_go_forgets_without_telling_anyone() -> None:
    log: list[str] = []
    registry = _registry(Recorder("store", log))
    registry.open(_session())
    registry.let_go()
    assert log == ["store:opened:s1:open"] and registry.find("s1") is None


async def test_a_dispatch_arriving_while_the_session_closes_is_cancelled(tmp_path: Path) -> None:
    dispatcher = ToolDispatcher(FakeSandboxProvider())
    for factory in ALL_TOOLS:
        dispatcher.register(factory)
    session = Session(session_id="s1", workspace_path=str(tmp_path))
    bus = dispatcher.open_session(session)
    async with bus.subscribe() as sub:
        slow = asyncio.create_task(dispatcher.dispatch(ToolUseBlock("a", "slow", {"seconds": 30}), session))
        async for event in sub:
            if event.type == TOOL_CALLED:
                break
        state = dispatcher.sessions.begin_close("s1")
        assert state is not None
        late = await dispatcher.dispatch(ToolUseBlock("b", "echo", {"text": "late"}), session)
        assert late.error_class is ToolErrorClass.CANCELLED
        await dispatcher.close_session("s1")
    assert (await slow).error_class is ToolErrorClass.CANCELLED
    with pytest.raises(UnknownSessionError, match="closed"):
        await dispatcher.dispatch(ToolUseBlock("c", "echo", {"text": "later"}), session)
    await dispatcher.aclose()
