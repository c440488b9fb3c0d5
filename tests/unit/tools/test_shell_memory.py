"""A shell that remembers: each ``shell`` call starts where the previous one ended (directory and
exported variables), the input's cwd/env win, ``reset`` forgets, ``tools.shell.persist: false``
remembers nothing; and what a foreground command leaves running becomes the session's process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from dispatcher.core.events.payloads import ProcessExited, ProcessStarted
from dispatcher.core.process_api import ShellState
from dispatcher.core.sandbox_api import ExecRequest, ExecResult, OutputCallback
from dispatcher.core.sessions.processes import MAX_SHELL_ENV_BYTES
from dispatcher.sandbox.fake.processes import Limits
from dispatcher.tools.processes import process_id_for
from dispatcher.tools.shell import ShellTool
from tests.blocks import text_at
from tests.events import events_of
from tests.polling import until
from tests.unit.tools.process_rig import Rig, make_rig

STATES: dict[str, ShellState | None] = {
    "cd sub": ShellState(cwd="sub"),
    "export FOO=bar": ShellState(cwd=None, env={"FOO": "bar"}),
    "cd sub && export A=1 B=2": ShellState(cwd="sub", env={"A": "1", "B": "2"}),
    "unset A": ShellState(cwd=None, unset=("A",)),
    "exec true": None,
}
"""What each command's shell would report (the fake runs no shell)."""


async def remembering(request: ExecRequest, on_output: OutputCallback, cancel: Any) -> ExecResult:
    on_output("stdout", f"ran in {request.cwd}\n".encode())
    state = STATES.get(request.command, ShellState(cwd=request.cwd)) if request.capture_state else None
    return ExecResult(exit_code=0, shell_state=state)


@pytest.fixture
async def rig(tmp_path: Any) -> AsyncIterator[Rig]:
    async with make_rig(tmp_path, dirs={"/workspace/sub", "/workspace/other"}) as r:
        r.sandbox.exec_handler = remembering
        yield r


async def test_cd_and_export_persist_and_the_input_wins_for_its_call(rig: Rig) -> None:
    await rig.call("shell", command="cd sub && export A=1 B=2")
    (first,) = rig.sandbox.execs
    assert first.capture_state and first.cwd == "." and first.leave_as == process_id_for("tu1", salt="left:")
    result = await rig.call("shell", command="pwd")
    assert text_at(result) == "ran in sub\n"
    assert (rig.sandbox.execs[-1].cwd, dict(rig.sandbox.execs[-1].env)) == ("sub", {"A": "1", "B": "2"})
    await rig.call("shell", command="pwd", cwd="other", env={"A": "x"})
    assert (rig.sandbox.execs[-1].cwd, dict(rig.sandbox.execs[-1].env)) == ("other", {"A": "x", "B": "2"})
    await rig.call("shell", command="unset A")
    await rig.call("shell", command="env")
    assert dict(rig.sandbox.execs[-1].env) == {"B": "2"}


async def test_a_command_whose_shell_reports_nothing_keeps_what_was_known(rig: Rig) -> None:
    await rig.call("shell", command="cd sub && export A=1 B=2")
    await rig.call("shell", command="exec true")
    await rig.call("shell", command="pwd")
    assert (rig.sandbox.execs[-1].cwd, dict(rig.sandbox.execs[-1].env)) == ("sub", {"A": "1", "B": "2"})


async def test_reset_starts_from_the_root_and_the_images_environment(rig: Rig) -> None:
    await rig.call("shell", command="cd sub && export A=1 B=2")
    await rig.call("shell", command="pwd", reset=True)
    assert (rig.sandbox.execs[-1].cwd, dict(rig.sandbox.execs[-1].env)) == (".", {})
    await rig.call("shell", command="env")
    assert rig.sandbox.execs[-1].cwd == "."


async def test_a_remembered_directory_that_is_gone_falls_back_to_the_root_with_a_note(rig: Rig) -> None:
    await rig.call("shell", command="cd sub && export A=1 B=2")
    rig.sandbox.dirs.discard("/workspace/sub")
    result = await rig.call("shell", command="pwd")
    assert not result.is_error and text_at(result).startswith("ran in .\n")
    assert "the directory sub the previous command ended in is gone" in text_at(result)
    assert dict(rig.sandbox.execs[-1].env) == {"A": "1", "B": "2"}
    assert rig.state.processes.cwd is None


async def test_a_given_cwd_that_is_missing_stays_the_calls_error(rig: Rig) -> None:
    result = await rig.call("shell", command="pwd", cwd="nowhere")
    assert result.is_error and "no such directory" in text_at(result)


async def test_background_starts_where_the_shell_is_with_its_variables(rig: Rig) -> None:
    await rig.call("shell", command="cd sub && export A=1 B=2")
    pid = await rig.background("serve")
    (start,) = rig.table.starts
    assert (start.cwd, dict(start.env), start.process_id) == ("sub", {"A": "1", "B": "2"}, pid)


async def test_a_background_start_in_a_remembered_directory_that_is_gone_starts_at_the_root(
    rig: Rig,
) -> None:
    await rig.call("shell", command="cd sub")
    rig.sandbox.dirs.discard("/workspace/sub")
    result = await rig.call("shell", command="serve", background=True)
    assert not result.is_error and "the directory sub the previous command ended in is gone" in text_at(
        result
    )
    assert rig.table.get(result.metadata["process_id"]).cwd == "."
    missing = await rig.call("shell", command="serve", background=True, cwd="nowhere")
    assert missing.is_error and "no such directory" in text_at(missing)


async def test_an_environment_too_large_to_remember_is_not_and_the_model_is_told(rig: Rig) -> None:
    big = "x" * (MAX_SHELL_ENV_BYTES // 2)
    STATES["export BIG"] = ShellState(cwd=None, env={"BIG1": big, "BIG2": big})
    try:
        result = await rig.call("shell", command="export BIG")
    finally:
        del STATES["export BIG"]
    assert "its variables were not remembered" in text_at(result)
    assert rig.state.processes.env == {}


async def test_without_persistence_nothing_is_captured_or_remembered(tmp_path: Any) -> None:
    async with make_rig(tmp_path, shell_persist=False, dirs={"/workspace/sub"}) as rig:
        rig.sandbox.exec_handler = remembering
        await rig.call("shell", command="cd sub")
        await rig.call("shell", command="pwd")
        assert [(e.cwd, e.capture_state) for e in rig.sandbox.execs] == [(".", False), (".", False)]
        assert rig.state.processes.cwd is None


async def test_what_a_foreground_command_leaves_running_is_named_and_announced(tmp_path: Any) -> None:
    async with make_rig(tmp_path, Limits(running=1)) as rig:

        async def leaves(request: ExecRequest, on_output: OutputCallback, cancel: Any) -> ExecResult:
            assert request.leave_as is not None
            # As the agent does: the record of what a command left names no call.
            taken = rig.table.adopt(request.leave_as, request.command, request.cwd, None)
            return ExecResult(exit_code=0, left=(request.leave_as,) if taken else ())

        rig.sandbox.exec_handler = leaves
        result = await rig.call("shell", "tu-fg", command="python3 app.py &")
        pid = process_id_for("tu-fg", salt="left:")
        assert text_at(result).endswith(f"[left 1 process running: {pid}; read it with process_output]")
        assert result.metadata["left_processes"] == [pid] and not result.is_error
        (started,) = events_of(rig.events, ProcessStarted)
        assert (started.payload.process_id, started.payload.origin, started.tool_use_id) == (
            pid,
            "left",
            "tu-fg",
        )
        assert pid in rig.state.processes.monitors
        full = await rig.call("shell", "tu-2", command="python3 other.py &")
        assert "left" not in text_at(full)  # the table was full: nothing was taken
        await rig.table.exit(pid, None)
        await until(lambda: bool(events_of(rig.events, ProcessExited)), "process.exited")
        assert events_of(rig.events, ProcessExited)[0].tool_use_id == "tu-fg"


def test_the_description_says_what_persists_and_what_does_not() -> None:
    remembering, forgetting = (
        ShellTool().definition.description,
        ShellTool(persist=False).definition.description,
    )
    assert "cd and export persist; functions, aliases" in remembering and "jobs do not" in remembering
    assert "do not carry over" in forgetting and "cd and export persist" not in forgetting
    assert "pkill -f" in remembering and "background: true" in remembering
