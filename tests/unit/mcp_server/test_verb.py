"""``dispatcher mcp``'s own refusals, before it reaches any server: exit 2 with what to fix."""

from __future__ import annotations

import pytest

from dispatcher.cli import main


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--session", "s_1", "--mode", "cautious"], "--workspace and --mode are for a new session"),
        (["--session", "s_1", "--workspace", "w"], "--workspace and --mode are for a new session"),
        (["--tools", ","], "--tools names no tool"),
        (["--mode", "yolo"], "unknown approval mode 'yolo'"),
    ],
)
def test_bad_options_are_usage_errors(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp", *argv]) == 2
    assert said in capsys.readouterr().err
