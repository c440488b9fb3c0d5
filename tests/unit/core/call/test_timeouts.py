"""Issue 10 point 3: spec 000's 60 s / 600 s limits, the ``timeouts:`` map, and shell's own limit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dispatcher.config.load import load_config, parse_timeouts
from dispatcher.core import ConfirmationPolicy, DispatcherConfig, Session, ToolDispatcher, ToolUseBlock
from dispatcher.core.call.timeouts import call_timeout
from dispatcher.core.errors import ConfigError
from dispatcher.core.sandbox_api import ExecRequest, ExecResult
from dispatcher.sandbox.fake import FakeSandboxProvider
from dispatcher.tools import BUILTIN_TOOLS
from dispatcher.tools.list_dir import ListDirTool
from dispatcher.tools.read_file import ReadFileTool
from dispatcher.tools.shell import ShellTool
from dispatcher.tools.write_file import WriteFileTool


def test_spec_defaults_60_for_reads_and_writes_600_for_shell() -> None:
    config = DispatcherConfig()
    for tool in (ReadFileTool(), ListDirTool(), WriteFileTool()):
        assert call_timeout(tool.definition, {}, config) == (60.0, 60.0)
    limit, wait = call_timeout(ShellTool.definition, {"command": "true"}, config)
    assert limit == 600.0 and wait == 600.0 + ShellTool.definition.kill_slack_seconds


def test_timeouts_map_overrides_per_tool_and_input_only_shortens() -> None:
    config = DispatcherConfig(timeouts={"shell": 1800.0, "read_file": 5.0})
    assert call_timeout(ReadFileTool.definition, {}, config)[0] == 5.0
    assert call_timeout(WriteFileTool().definition, {}, config)[0] == 60.0
    assert call_timeout(ShellTool.definition, {"command": "x"}, config)[0] == 1800.0
    assert call_timeout(ShellTool.definition, {"command": "x", "timeout_seconds": 2}, config)[0] == 2.0
    short = DispatcherConfig(timeouts={"shell": 30.0})
    assert call_timeout(ShellTool.definition, {"command": "x", "timeout_seconds": 500}, short)[0] == 30.0


def test_timeouts_section_is_validated_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("timeouts: {shell: 900, read_file: 7.5}\n")
    config = load_config(path, home=str(tmp_path / "home"), env={})
    assert dict(config.dispatcher.timeouts) == {"shell": 900.0, "read_file": 7.5}
    assert load_config(None, home=str(tmp_path / "home"), env={}).dispatcher.timeouts == {}
    for bad, where in (
        ([1], "timeouts: must be a mapping"),
        ({"shell": 0}, "timeouts.shell"),
        ({"shell": -1}, "timeouts.shell"),
        ({"shell": 10**9}, "timeouts.shell"),
        ({"shell": "10"}, "timeouts.shell"),
        ({"shell": True}, "timeouts.shell"),
        ({"shell": float("nan")}, "timeouts.shell"),
    ):
        with pytest.raises(ConfigError, match=where):
            parse_timeouts(bad)


@pytest.mark.parametrize(
    ("timeouts", "given", "expected"),
    [({}, None, 600.0), ({"shell": 42.0}, None, 42.0), ({}, 3, 3.0), ({"shell": 42.0}, 100, 42.0)],
)
async def test_shell_runs_under_the_dispatchers_limit(
    tmp_path: Path, timeouts: dict[str, float], given: int | None, expected: float
) -> None:
    """Not a hard-coded 120 s: the sandbox is asked for the call's limit."""
    seen: list[float] = []

    async def handler(request: ExecRequest, on_output: Any, cancel: asyncio.Event) -> ExecResult:
        seen.append(request.timeout)
        return ExecResult(exit_code=0)

    provider = FakeSandboxProvider()
    d = ToolDispatcher(
        provider,
        config=DispatcherConfig(timeouts=timeouts),
        policy=ConfirmationPolicy.preset("autonomous"),
    )
    for factory in BUILTIN_TOOLS:
        d.register(factory)
    session = Session(session_id="s1", workspace_path=str(tmp_path))
    d.open_session(session)
    provider.sandbox_for(session).exec_handler = handler
    input_: dict[str, Any] = {"command": "true"}
    if given is not None:
        input_["timeout_seconds"] = given
    result = await d.dispatch(ToolUseBlock("tu", "shell", input_), session, turn_id="t")
    await d.aclose()
    assert not result.is_error, result
    assert seen == [expected]


async def test_a_timeouts_entry_naming_no_tool_is_refused_at_seal() -> None:
    for timeouts, ok in (({"shell": 5.0}, True), ({"shel": 5.0}, False)):
        d = ToolDispatcher(FakeSandboxProvider(), config=DispatcherConfig(timeouts=timeouts))
        for factory in BUILTIN_TOOLS:
            d.register(factory)
        if ok:
            d.seal()
        else:
            with pytest.raises(ConfigError, match=r"timeouts\.shel: no tool named 'shel'"):
                d.seal()
        await d.aclose()
