"""A session's process memory: the shell state it merges and bounds, last-read cursors and their
bound, what is stored and given back, and following processes' ends again after a restart."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dispatcher.core import Session, ToolDispatcher, ToolUseBlock
from dispatcher.core.events.bus import Event
from dispatcher.core.events.payloads import EventPayload, ProcessExited
from dispatcher.core.process_api import ProcessStart, ShellState
from dispatcher.core.sessions.processes import MAX_CURSORS, MAX_MONITORS, ProcessMemory
from dispatcher.core.sessions.registry import Restoration
from dispatcher.sandbox.fake import FakeSandbox, FakeSandboxProvider
from dispatcher.sandbox.fake.processes import FakeProcesses, Limits
from dispatcher.tools.processes import ProcessListTool
from tests.events import events_of
from tests.polling import until


def memory() -> tuple[ProcessMemory, list[tuple[EventPayload, str]]]:
    published: list[tuple[EventPayload, str]] = []
    return ProcessMemory(lambda payload, tool_use_id: published.append((payload, tool_use_id))), published


def test_shell_states_merge_and_each_change_is_told() -> None:
    mem, _ = memory()
    changes: list[dict[str, Any]] = []
    mem.on_change = lambda: changes.append(mem.to_json())
    assert mem.shell_ended(ShellState(cwd="src", env={"A": "1", "B": "2"})) is None
    mem.shell_ended(ShellState(cwd=None, env={"B": "3"}, unset=("A",)))
    assert mem.shell_start() == ("src", {"B": "3"})
    mem.shell_ended(ShellState(cwd="."))  # the root
    mem.shell_ended(None)  # unknown: nothing changes
    assert mem.shell_start() == (None, {"B": "3"})
    mem.shell_reset(cwd_only=True)
    mem.shell_reset()
    assert mem.shell_start() == (None, {})
    assert [c["cwd"] for c in changes] == ["src", "src", None, None]


def test_last_read_cursors_are_bounded_oldest_forgotten() -> None:
    mem, _ = memory()
    for n in range(MAX_CURSORS + 5):
        mem.read_to(f"p_{n}", n + 1)
    assert len(mem.cursors) == MAX_CURSORS
    assert mem.last_read("p_0") == 0 and mem.last_read(f"p_{MAX_CURSORS + 4}") == MAX_CURSORS + 5


def test_what_is_stored_comes_back_and_a_damaged_state_is_refused() -> None:
    mem, _ = memory()
    mem.shell_ended(ShellState(cwd="a/b", env={"X": "y"}))
    mem.read_to("p_1", 42)
    again, _ = memory()
    again.restore(mem.to_json())
    assert again.shell_start() == ("a/b", {"X": "y"}) and again.last_read("p_1") == 42
    assert again.needs_resume and not mem.needs_resume
    damaged: list[dict[str, Any]] = [{"cwd": 3}, {"env": {"X": 1}}, {"cursors": {"p_1": -1}}, {"cursors": []}]
    for bad in damaged:
        with pytest.raises(ValueError):
            memory()[0].restore(bad)


async def test_a_restored_session_follows_its_running_processes_from_its_first_call(tmp_path: Any) -> None:
    provider = FakeSandboxProvider()
    sandbox = provider.sandboxes["s1"] = FakeSandbox()
    await sandbox.table.start(ProcessStart("p_run", "serve", tool_use_id="tu-old"))
    await sandbox.table.start(ProcessStart("p_done", "true", tool_use_id="tu-old"))
    await sandbox.table.exit("p_done", 0)
    dispatcher = ToolDispatcher(provider)
    try:
        stored = {"cwd": "src", "env": {"A": "1"}, "cursors": {"p_run": 7}}
        state = dispatcher.sessions.open(
            Session("s1", str(tmp_path)),
            restored=Restoration(create_time=time.time(), processes=stored),
        )
        events: list[Event] = []
        state.bus.sink = events.append
        assert (
            state.processes.shell_start() == ("src", {"A": "1"}) and state.processes.last_read("p_run") == 7
        )
        assert state.processes.needs_resume and not state.processes.monitors
        mem, control = await dispatcher.processes("s1")
        assert mem is state.processes and control is sandbox.table
        assert set(mem.monitors) == {"p_run"} and not mem.needs_resume
        await sandbox.table.exit("p_run", 0, signal=None)
        await until(lambda: bool(events_of(events, ProcessExited)), "process.exited")
        (exited,) = events_of(events, ProcessExited)
        assert exited.payload.process_id == "p_run" and exited.tool_use_id == "tu-old"
    finally:
        await dispatcher.aclose()


async def test_a_session_without_a_process_table_resumes_to_nothing(tmp_path: Any) -> None:
    provider = FakeSandboxProvider()
    provider.sandboxes["s1"] = FakeSandbox(has_processes=False)
    dispatcher = ToolDispatcher(provider)
    try:
        state = dispatcher.sessions.open(
            Session("s1", str(tmp_path)), restored=Restoration(create_time=time.time(), processes={})
        )
        await state.processes.resume(provider.sandboxes["s1"].processes)
        assert not state.processes.needs_resume and not state.processes.monitors
    finally:
        await dispatcher.aclose()


async def test_the_first_call_after_a_restart_follows_the_running_processes(tmp_path: Any) -> None:
    provider = FakeSandboxProvider()
    sandbox = provider.sandboxes["s1"] = FakeSandbox()
    await sandbox.table.start(ProcessStart("p_run", "serve", tool_use_id="tu-old"))
    dispatcher = ToolDispatcher(provider)
    dispatcher.register(ProcessListTool, builtin=True)
    try:
        session = Session("s1", str(tmp_path))
        state = dispatcher.sessions.open(session, restored=Restoration(create_time=time.time(), processes={}))
        result = await dispatcher.dispatch(ToolUseBlock("tu-new", "process_list", {}), session)
        assert not result.is_error and set(state.processes.monitors) == {"p_run"}
    finally:
        await dispatcher.aclose()


async def test_exit_monitors_stop_at_their_bound_even_past_the_sandboxs() -> None:
    table = FakeProcesses(Limits(running=MAX_MONITORS + 1, total_ring_bytes=1 << 40))
    mem, published = memory()
    infos = [
        await table.start(ProcessStart(f"p_{n}", "serve", ring_bytes=1024)) for n in range(MAX_MONITORS + 1)
    ]
    for info in infos:
        mem.started(info, table)
    assert len(mem.monitors) == MAX_MONITORS and f"p_{MAX_MONITORS}" not in mem.monitors
    assert len(published) == MAX_MONITORS + 1  # every start is announced; only its end is not followed
    mem.close()
    assert mem.monitors == {}
