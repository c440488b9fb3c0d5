"""``dispatcher serve`` with custom tools or MCP servers that cannot be registered: a configuration
error naming the entry and exit code 2, never a traceback (issue 10 points 5 and 6)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]


def serve(tmp_path: Path, **config: Any) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"sandbox": {"backend": "local"}, **config}))
    env = {**os.environ, "DISPATCHER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "serve", "--config", str(path), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        env=env,
        # Bounds the wait for its exit, which costs about a second of CPU (imports, mostly mcp's):
        # on a 2-core machine at load 200 that second takes minutes of wall time.
        timeout=600,
        check=False,
    )


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        (["tests.server.bad_tools:fine", "tests.server.bad_tools:builtin_name"], "conflicts with a built-in"),
        (["tests.server.bad_tools:fine", "tests.server.bad_tools:fine"], "already registered"),
        (["tests.server.bad_tools:fine", "tests.server.bad_tools:any_of_schema"], "'anyOf' is not allowed"),
        (
            ["tests.server.bad_tools:fine", "tests.server.bad_tools.raises_on_import:x"],
            "this module is broken",
        ),
        (["tests.server.bad_tools:fine", "tests.server.bad_tools:missing"], "cannot load"),
    ],
)
def test_a_custom_tool_that_cannot_register_exits_2_naming_it(
    tmp_path: Path, tools: list[str], message: str
) -> None:
    done = serve(tmp_path, tools=tools)
    assert done.returncode == 2, done.stderr
    assert "configuration error: tools[1]" in done.stderr and message in done.stderr
    assert "Traceback" not in done.stderr
    # Refused before the home is locked: nothing of a server's state was written there.
    home = tmp_path / "home"
    assert not (home / "state.db").exists() and not (home / "uids.json").exists()


def test_an_mcp_server_that_does_not_start_exits_2_naming_it(tmp_path: Path) -> None:
    done = serve(tmp_path, mcp_servers={"gone": {"command": str(tmp_path / "no-such-server")}})
    assert done.returncode == 2, done.stderr
    assert "configuration error: mcp_servers.gone: cannot start the MCP server" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_mcp_server_that_does_not_speak_mcp_exits_2_with_its_stderr(tmp_path: Path) -> None:
    script = "import sys; print('no mcp here', file=sys.stderr); sys.exit(3)"
    done = serve(tmp_path, mcp_servers={"mute": {"command": sys.executable, "args": ["-c", script]}})
    assert done.returncode == 2, done.stderr
    assert "mcp_servers.mute" in done.stderr and "no mcp here" in done.stderr
    assert "Traceback" not in done.stderr


def test_mcp_servers_config_errors_name_the_key(tmp_path: Path) -> None:
    done = serve(tmp_path, mcp_servers={"Bad-Name": {"command": "x"}})
    assert done.returncode == 2 and "mcp_servers.Bad-Name" in done.stderr
    done = serve(tmp_path, mcp_servers={"ok": {"command": "x", "tools": {"t": {"side_effect": "maybe"}}}})
    assert done.returncode == 2 and "mcp_servers.ok.tools.t.side_effect" in done.stderr
    done = serve(tmp_path, mcp_servers={"ok": {"command": "x", "colour": "red"}})
    assert done.returncode == 2 and "mcp_servers.ok.colour: unknown key" in done.stderr
