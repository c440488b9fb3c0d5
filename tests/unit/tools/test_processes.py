"""The process tools and ``shell {background: true}`` through the dispatcher, over the fake
sandbox's process table: ids, cursors per session, lost bytes, stdin, stops, bounds, the
``process.started``/``process.exited`` events, and what cancel and close do to processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dispatcher.core import ConfirmationPolicy, ToolErrorClass
from dispatcher.core.approval.broker import Decision
from dispatcher.core.events.payloads import ProcessExited, ProcessStarted, ToolConfirmationRequested
from dispatcher.core.sandbox_api import ExecRequest, ExecResult, OutputCallback
from dispatcher.sandbox.fake.processes import Limits
from dispatcher.tools.processes import MAX_READ_BYTES, MAX_WAIT_SECONDS, process_id_for
from tests.blocks import text_at
from tests.events import events_of
from tests.polling import until
from tests.unit.core.toolkit import next_event
from tests.unit.tools.process_rig import Rig, make_rig


@pytest.fixture
async def rig(tmp_path: Any) -> AsyncIterator[Rig]:
    async with make_rig(tmp_path) as r:
        yield r


async def test_background_answers_at_once_with_an_id_from_the_call_and_says_how_to_read(rig: Rig) -> None:
    result = await rig.call("shell", "tu-bg", command="python3 app.py", background=True)
    process_id = process_id_for("tu-bg")
    assert not result.is_error and result.metadata["process_id"] == process_id
    assert process_id.startswith("p_") and len(process_id) == 10
    assert "process_output" in text_at(result) and result.command_executed == "python3 app.py"
    proc = rig.table.get(process_id)
    assert (proc.command, proc.tool_use_id, proc.state, proc.origin) == (
        "python3 app.py",
        "tu-bg",
        "running",
        "background",
    )
    (started,) = events_of(rig.events, ProcessStarted)
    assert started.tool_use_id == "tu-bg" and started.turn_id == ""
    assert (started.payload.process_id, started.payload.command, started.payload.origin) == (
        process_id,
        "python3 app.py",
        "background",
    )


async def test_a_retried_background_call_starts_one_process_and_announces_it_once(rig: Rig) -> None:
    first = await rig.background("serve", "tu-same")
    again = await rig.background("serve", "tu-same")
    assert first == again and len(await rig.table.list()) == 1 and len(rig.table.starts) == 2
    assert len(events_of(rig.events, ProcessStarted)) == 1


async def test_another_calls_process_on_the_short_id_moves_this_one_to_a_longer_id(rig: Rig) -> None:
    short = process_id_for("tu-x")
    assert rig.table.adopt(short, "something else", ".", "tu-other") is not None
    taken = await rig.background("serve", "tu-x")
    assert taken == process_id_for("tu-x", 1) and taken != short


async def test_output_reads_on_from_where_the_model_last_read_each_stream_marked(rig: Rig) -> None:
    pid = await rig.background()
    await rig.table.output(pid, "stdout", b"GET / 200\n")
    first = await rig.call("process_output", process_id=pid)
    assert text_at(first).startswith("[stdout]\nGET / 200\n") and "running" in text_at(first)
    assert first.metadata["next"] == 10 and first.metadata["stdout_bytes"] == 10
    await rig.table.output(pid, "stderr", b"warning\n")
    second = await rig.call("process_output", process_id=pid)
    assert text_at(second).startswith("[stderr]\nwarning\n") and "GET" not in text_at(second)
    assert second.metadata["next"] == 18 and second.metadata["after"] == 10
    nothing = await rig.call("process_output", process_id=pid)
    assert "(no new output)" in text_at(nothing) and nothing.metadata["next"] == 18
    whole = await rig.call("process_output", process_id=pid, after=0, max_bytes=12)
    assert text_at(whole).startswith("[stdout]\nGET / 200\n[stderr]\nwa\n") and "call again" in text_at(whole)
    assert rig.state.processes.last_read(pid) == 12


async def test_bytes_the_ring_dropped_are_counted_never_a_silent_gap(tmp_path: Any) -> None:
    async with make_rig(tmp_path, Limits(ring_bytes=100)) as rig:
        pid = await rig.background()
        await rig.table.output(pid, "stdout", b"a" * 250 + b"END")
        result = await rig.call("process_output", process_id=pid)
        assert result.metadata["lost"] == 153 and result.metadata["next"] == 253
        assert text_at(result).startswith("[... 153 bytes lost") and "a" * 97 + "END" in text_at(result)


async def test_a_waiting_read_answers_with_output_that_comes_meanwhile(rig: Rig) -> None:
    pid = await rig.background()
    reading = asyncio.ensure_future(rig.call("process_output", process_id=pid, wait_seconds=MAX_WAIT_SECONDS))
    await until(lambda: any(c.tool_use_id.startswith("tu") for c in rig.state.calls), "the read to start")
    await asyncio.sleep(0)
    await rig.table.output(pid, "stdout", b"listening on :8000\n")
    assert "listening on :8000" in text_at(await reading)


async def test_the_end_is_read_and_announced_with_the_starting_call(rig: Rig) -> None:
    pid = await rig.background("make test", "tu-make")
    await rig.table.output(pid, "stdout", b"1 failed\n")
    await rig.table.exit(pid, 3)
    await until(lambda: bool(events_of(rig.events, ProcessExited)), "process.exited")
    (exited,) = events_of(rig.events, ProcessExited)
    assert exited.tool_use_id == "tu-make" and exited.turn_id == ""
    assert (exited.payload.state, exited.payload.exit_code, exited.payload.output_bytes) == ("exited", 3, 9)
    result = await rig.call("process_output", process_id=pid)
    assert "exited (exit code 3)" in text_at(result) and result.metadata["exit_code"] == 3
    assert rig.state.processes.monitors == {}


async def test_input_reaches_stdin_and_a_closed_stdin_is_an_error_saying_so(rig: Rig) -> None:
    pid = await rig.background("python3 -i")
    written = await rig.call("process_input", process_id=pid, data="print(1)\n")
    assert not written.is_error and written.metadata["bytes"] == 9
    assert rig.table.consume(pid) == b"print(1)\n"
    closed = await rig.call("process_input", process_id=pid, data="", close_stdin=True)
    assert not closed.is_error and closed.metadata["stdin_open"] is False
    refused = await rig.call("process_input", process_id=pid, data="more\n")
    assert refused.is_error and "takes no more input" in text_at(refused)


async def test_a_flood_of_stdin_hits_its_bound_with_a_clear_error(tmp_path: Any) -> None:
    async with make_rig(tmp_path, Limits(stdin_bytes=16)) as rig:
        pid = await rig.background("cat")
        assert not (await rig.call("process_input", process_id=pid, data="x" * 16)).is_error
        flood = await rig.call("process_input", process_id=pid, data="y")
        assert (
            flood.is_error and flood.reason == "quota" and "bytes of input it has not read" in text_at(flood)
        )


async def test_stop_terms_then_kills_and_output_stays_readable(rig: Rig) -> None:
    polite, stubborn = await rig.background("serve"), await rig.background("stubborn")
    await rig.table.output(polite, "stdout", b"bye\n")
    stopped = await rig.call("process_stop", process_id=polite)
    assert not stopped.is_error and stopped.metadata["state"] == "killed" and "SIGTERM" in text_at(stopped)
    rig.table.ignore(stubborn, "TERM")
    killed = await rig.call("process_stop", process_id=stubborn, grace_seconds=0.01)
    assert "signal 9" in text_at(killed) and rig.table.get(stubborn).signals == ["TERM", "KILL"]
    assert "bye" in text_at(await rig.call("process_output", process_id=polite, after=0))
    nudged = await rig.call("process_stop", process_id=polite, signal="USR1")
    assert not nudged.is_error


async def test_list_shows_each_process_its_state_and_what_is_unread(rig: Rig) -> None:
    assert text_at(await rig.call("process_list")) == "no processes in this session"
    a, b = await rig.background("serve"), await rig.background("sleep 100")
    await rig.table.output(a, "stdout", b"12345")
    await rig.call("process_output", process_id=a, max_bytes=2)
    await rig.table.exit(b, 0)
    listing = await rig.call("process_list")
    line_a, line_b = text_at(listing).splitlines()
    assert line_a.startswith(f"{a}  running") and "3 unread" in line_a and line_a.endswith("$ serve")
    assert line_b.startswith(f"{b}  exited (exit code 0)")
    assert listing.metadata == {"processes": 2, "running": 1}


async def test_refusals_are_error_results_saying_what_to_do(rig: Rig) -> None:
    unknown = await rig.call("process_output", process_id="p_nope")
    assert unknown.is_error and unknown.error_class is ToolErrorClass.EXECUTION_ERROR
    assert "no process p_nope" in text_at(unknown) and "process_list" in text_at(unknown)
    rig.sandbox.has_processes = False
    unsupported = await rig.call("process_list")
    assert unsupported.is_error and "no process table" in text_at(unsupported)


async def test_the_running_bound_is_an_error_and_monitors_never_outnumber_it(tmp_path: Any) -> None:
    async with make_rig(tmp_path, Limits(running=3)) as rig:
        pids = [await rig.background(f"serve {n}") for n in range(3)]
        refused = await rig.call("shell", command="serve 4", background=True)
        assert refused.is_error and refused.reason == "quota"
        assert "3 processes are running" in text_at(refused) and "process_stop" in text_at(refused)
        assert set(rig.state.processes.monitors) == set(pids)
        for pid in pids:
            await rig.table.exit(pid, 0)
        await until(lambda: not rig.state.processes.monitors, "the monitors to end")


@pytest.mark.parametrize(
    "tool_input",
    [
        {"process_id": "p_1", "wait_seconds": MAX_WAIT_SECONDS + 1},
        {"process_id": "p_1", "max_bytes": MAX_READ_BYTES + 1},
        {"process_id": "p_1", "max_bytes": 0},
        {"process_id": "p 1"},
    ],
)
async def test_reads_are_bounded_by_their_schema(rig: Rig, tool_input: dict[str, Any]) -> None:
    result = await rig.call("process_output", **tool_input)
    assert result.is_error and result.error_class is ToolErrorClass.VALIDATION_ERROR


async def test_stop_takes_only_the_listed_signals_and_a_bounded_grace(rig: Rig) -> None:
    for bad in ({"signal": "STOP"}, {"grace_seconds": 61}):
        result = await rig.call("process_stop", process_id="p_1", **bad)
        assert result.is_error and result.error_class is ToolErrorClass.VALIDATION_ERROR


async def test_cancelling_the_sessions_calls_leaves_its_background_processes_running(rig: Rig) -> None:
    started = asyncio.Event()

    async def slow(request: ExecRequest, on_output: OutputCallback, cancel: asyncio.Event) -> ExecResult:
        started.set()
        await cancel.wait()
        return ExecResult(exit_code=None, cancelled=True)

    pid = await rig.background("serve")
    rig.sandbox.exec_handler = slow
    foreground = asyncio.ensure_future(rig.call("shell", command="sleep 100"))
    await started.wait()
    await rig.dispatcher.cancel_session_tools("s1")
    assert (await foreground).error_class is ToolErrorClass.CANCELLED
    assert rig.table.get(pid).state == "running" and rig.table.get(pid).signals == []
    assert pid in rig.state.processes.monitors


async def test_closing_the_session_kills_its_processes_and_stops_their_monitors(rig: Rig) -> None:
    pid = await rig.background("serve")
    monitors = dict(rig.state.processes.monitors)
    await rig.dispatcher.close_session("s1")
    assert rig.table.get(pid).state == "killed" and rig.table.get(pid).signals == ["KILL"]
    assert rig.state.processes.monitors == {}
    await asyncio.gather(*monitors.values(), return_exceptions=True)
    assert all(task.done() for task in monitors.values())


async def test_a_background_start_is_asked_about_as_execute_showing_the_command(tmp_path: Any) -> None:
    async with make_rig(tmp_path, policy=ConfirmationPolicy()) as rig:
        async with rig.state.bus.subscribe() as sub:
            denied = asyncio.ensure_future(rig.call("shell", command="python3 app.py", background=True))
            asked = (await next_event(sub, ToolConfirmationRequested)).payload
            assert asked.side_effect == "execute" and "python3 app.py" in asked.input_summary
            assert "background" in asked.input_summary
            rig.dispatcher.resolve_confirmation("s1", asked.request_id, Decision.DENY)
            assert (await denied).error_class is ToolErrorClass.USER_DENIED
            assert await rig.table.list() == ()
            allowed = asyncio.ensure_future(rig.call("shell", command="python3 app.py", background=True))
            again = (await next_event(sub, ToolConfirmationRequested)).payload
            rig.dispatcher.resolve_confirmation("s1", again.request_id, Decision.ALLOW)
            assert not (await allowed).is_error and len(await rig.table.list()) == 1
        reading = await rig.call("process_list")
        assert not reading.is_error  # READ: not asked
