"""The ``mcp_servers:`` section: defaults, per-tool overrides, and errors that name the key."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core.errors import ConfigError
from dispatcher.core.types import SideEffect
from dispatcher.mcp.config import parse_mcp_servers


def test_defaults_and_overrides() -> None:
    (server,) = parse_mcp_servers(
        {"notes": {"command": "notes-mcp", "side_effect": "READ", "tools": {"rm": {"side_effect": "write"}}}}
    )
    assert server.run == "host" and server.tool_name("rm") == "mcp_notes_rm"
    assert server.side_effect_of("rm") is SideEffect.WRITE
    assert server.side_effect_of("search") is SideEffect.READ
    assert not server.always_prompt_of("rm")
    (default,) = parse_mcp_servers({"x": {"command": "x"}})
    assert default.side_effect_of("anything") is SideEffect.EXECUTE  # unknown tools may do anything


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"Bad": {"command": "x"}}, "mcp_servers.Bad"),
        ({"a" * 33: {"command": "x"}}, "mcp_servers.aaaa"),
        ({"ok": {}}, "mcp_servers.ok.command"),
        ({"ok": {"command": "x", "args": "-v"}}, "mcp_servers.ok.args"),
        ({"ok": {"command": "x", "args": [1]}}, "mcp_servers.ok.args[0]"),
        ({"ok": {"command": "x", "env": {"A-B": "1"}}}, "mcp_servers.ok.env.A-B"),
        ({"ok": {"command": "x", "env": {"A": 1}}}, "mcp_servers.ok.env.A"),
        ({"ok": {"command": "x", "run": "cloud"}}, "mcp_servers.ok.run"),
        ({"ok": {"command": "x", "side_effect": "lots"}}, "mcp_servers.ok.side_effect"),
        ({"ok": {"command": "x", "always_prompt": "yes"}}, "mcp_servers.ok.always_prompt"),
        ({"ok": {"command": "x", "timeout_seconds": 0}}, "mcp_servers.ok.timeout_seconds"),
        ({"ok": {"command": "x", "tools": {"t": {"mode": "x"}}}}, "mcp_servers.ok.tools.t.mode"),
        (
            {"ok": {"command": "x", "tools": {"t": {"always_prompt": 1}}}},
            "mcp_servers.ok.tools.t.always_prompt",
        ),
        ({"ok": {"command": "x", "colour": "red"}}, "mcp_servers.ok.colour"),
        (["x"], "mcp_servers"),
    ],
)
def test_errors_name_the_key(section: Any, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_mcp_servers(section)
    assert str(info.value).startswith(key)
