"""Issue 22 item 6: ``dispatcher config-check`` runs the validation ``dispatcher serve`` runs, with
the tool registry built, and reports every problem in one pass; ``serve`` refuses the same file with
the same lines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.server.config.test_serve_config_errors import REPO, serve

MISTAKES: dict[str, Any] = {
    "timeouts": {"shel": 100},
    "tool_confirmation": {
        "per_tool": {"raed_file": "auto", "egress": "deny"},
        "always_prompt": ["wirte_file"],
        "modes": {"autonomous": {"per_tool": {"shelll": "prompt"}}},
    },
    "tenants": [
        {
            "id": "acme",
            "token_sha256": "a" * 64,
            "tools": ["read_file", "shel"],
            "fs": [{"path": "src", "mode": "rw"}, {"path": "../etc"}],
        }
    ],
}
EXPECTED = (
    "timeouts: no tool named 'shel'",
    "tool_confirmation.per_tool: no tool named 'raed_file'",
    "tool_confirmation.always_prompt: no tool named 'wirte_file'",
    "tool_confirmation.modes.autonomous.per_tool: no tool named 'shelll'",
    "tenants[0].tools: no tool named 'shel'",
)


def config_check(tmp_path: Path, *extra: str, **config: Any) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump({"sandbox": {"backend": "local"}, **config}))
    env = {**os.environ, "DISPATCHER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "config-check", str(path), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_config_check_reports_every_unknown_tool_name_in_one_run(tmp_path: Path) -> None:
    fixed = {**MISTAKES, "tenants": [{**MISTAKES["tenants"][0], "fs": [{"path": "src", "mode": "rw"}]}]}
    done = config_check(tmp_path, **fixed)
    assert done.returncode == 2, done.stdout + done.stderr
    for line in EXPECTED:
        assert line in done.stderr, (line, done.stderr)
    known = (
        "glob, grep, list_dir, patch_file, process_input, process_list, process_output, process_stop, "
        "read_file, run_code, shell, write_file"
    )
    assert f"known: {known}" in done.stderr
    assert "'egress'" not in done.stderr  # the egress questions' name is one a policy may use
    # serve refuses the same file with the same lines, before it starts anything.
    served = serve(tmp_path, listen="127.0.0.1:0", **fixed)
    assert served.returncode == 2, served.stderr
    for line in EXPECTED:
        assert line in served.stderr, (line, served.stderr)


def test_a_grant_leaving_the_workspace_is_an_error_naming_it(tmp_path: Path) -> None:
    done = config_check(tmp_path, **MISTAKES)
    assert done.returncode == 2
    assert "tenants[0].fs[1].path: '../etc' leaves the workspace" in done.stderr, done.stderr
    served = serve(tmp_path, **MISTAKES)
    assert served.returncode == 2 and "tenants[0].fs[1].path" in served.stderr


def test_a_key_failing_its_own_check_does_not_hide_the_tool_names(tmp_path: Path) -> None:
    # The grant fails on its own; the unknown tool names are still reported in the same run.
    done = config_check(tmp_path, **MISTAKES)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    for line in ("tenants[0].fs[1].path: '../etc' leaves the workspace", *EXPECTED):
        assert sum(line in shown for shown in lines) == 1, (line, done.stderr)
    # A second tenant stays tenants[1] although the first one's key was dropped to check the rest.
    second = {"id": "b", "token_sha256": "b" * 64, "tools": ["nope"]}
    done = config_check(tmp_path, tenants=[MISTAKES["tenants"][0], second])
    assert done.returncode == 2 and "tenants[1].tools: no tool named 'nope'" in done.stderr, done.stderr


def test_cross_key_mistakes_and_tool_names_come_in_one_run(tmp_path: Path) -> None:
    tenants = [
        {"id": "a", "token_sha256": "a" * 64, "tools": ["nope"]},
        {"id": "a", "token_sha256": "a" * 64},
    ]
    done = config_check(tmp_path, tenants=tenants, timeouts={"shel": 5})
    assert done.returncode == 2
    for line in (
        "tenants[1].id: duplicate tenant id 'a'",
        "tenants[1].token_sha256: token already belongs to another tenant",
        "timeouts: no tool named 'shel'",
        "tenants[0].tools: no tool named 'nope'",
    ):
        assert line in done.stderr, (line, done.stderr)


def test_custom_and_configured_mcp_tool_names_are_known(tmp_path: Path) -> None:
    done = config_check(
        tmp_path,
        tools=["tests.server.tools:make_echo_tool"],
        mcp_servers={"notes": {"command": "notes-mcp", "tools": {"delete_note": {"side_effect": "write"}}}},
        timeouts={"echo": 5, "mcp_notes_delete_note": 5, "mcp_notes_whatever": 5},
        tool_confirmation={"always_prompt": ["mcp_notes_delete_note", "echo"]},
    )
    assert done.returncode == 0, done.stderr
    unknown = config_check(tmp_path, timeouts={"mcp_other_x": 5})
    assert unknown.returncode == 2 and "timeouts: no tool named 'mcp_other_x'" in unknown.stderr


def test_images_runs_serves_image_preflight(tmp_path: Path) -> None:
    if shutil.which("docker") is None and not Path("/var/run/docker.sock").exists():
        pytest.skip("no Docker daemon here")
    done = config_check(
        tmp_path, "--images", sandbox={"backend": "docker", "image": "dispatcher-no-such-image:never"}
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "sandbox.image:" in done.stderr and "dispatcher-no-such-image:never" in done.stderr
    # Without --images, Docker is not contacted and the file is valid.
    assert config_check(tmp_path, sandbox={"backend": "docker", "image": "x:y"}).returncode == 0
