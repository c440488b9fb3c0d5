"""The Go bench client (bench/go_client) against a live ``dispatcher serve``: Go speaks the contract.

Runs where ``go`` is on PATH. ``make test`` (scripts/test.sh) builds the client first, installing
Debian's toolchain when it is missing (a cold build compiles grpc-go from source: about a minute);
a bare ``pytest`` on a machine without Go skips this module and says how to get it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.client import DispatcherClient
from dispatcher.config import hash_token
from tests.server.serve_process import REPO, ServeProcess, start_serve

TOKEN = "go-token-0123456789abcdef"

pytestmark = [
    pytest.mark.skipif(
        shutil.which("go") is None,
        reason="no `go` on PATH (bash scripts/build_go_client.sh installs it; a cold build takes ~1 min)",
    ),
    pytest.mark.timeout(600),  # a cold build under a loaded machine
]


@pytest.fixture(scope="module")
def go_client() -> Path:
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "build_go_client.sh")], capture_output=True, text=True, timeout=540
    )
    if built.returncode == 3:  # the script's "toolchain missing and not installable"
        pytest.skip(built.stderr.strip().splitlines()[-1])
    assert built.returncode == 0, built.stderr[-2000:]
    return Path(built.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("go")
    (tmp / "ws" / "go").mkdir(parents=True)
    (tmp / "ws" / "go" / "4k.txt").write_bytes(b"x" * 4095 + b"\n")
    config = {
        "sandbox": {"backend": "local"},
        "log": {"format": "json", "level": "info"},
        "tool_confirmation": {"default": {"EXECUTE": "auto"}},
        "tenants": [{"id": "go", "token_sha256": hash_token(TOKEN), "workspace_root": str(tmp / "ws")}],
    }
    sp = start_serve(tmp, data=config)
    yield sp
    sp.close()


def _run(binary: Path, target: str, *args: str, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DISPATCHER_TOKEN": token}
    return subprocess.run(
        [str(binary), f"-target={target}", "-workspace=go", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_go_client_runs_tools_and_closes_its_session(go_client: Path, server: ServeProcess) -> None:
    for tool, tool_input in (("shell", {"command": "true"}), ("read_file", {"path": "4k.txt"})):
        run = _run(go_client, server.target, f"-tool={tool}", f"-input={json.dumps(tool_input)}", "-n=3")
        assert run.returncode == 0, run.stderr
        report = json.loads(run.stdout)
        assert report["tool"] == tool and report["session_id"].startswith("ses_")
        assert len(report["samples_ms"]) == 3 and all(s > 0 for s in report["samples_ms"])
    with DispatcherClient(server.target, token=TOKEN) as client:
        assert client.list_sessions() == []  # each run closed the session it made


def test_go_client_fails_on_an_error_result_or_a_bad_token(go_client: Path, server: ServeProcess) -> None:
    failed = _run(go_client, server.target, "-tool=shell", '-input={"command": "exit 3"}', "-n=1")
    assert failed.returncode == 1 and failed.stdout == ""
    assert "ERROR_CLASS_EXECUTION_ERROR (tool_failed)" in failed.stderr
    refused = _run(go_client, server.target, "-n=1", token="not-the-token-0123456789")
    assert refused.returncode == 1 and "Unauthenticated" in refused.stderr


def test_go_client_lists_processes_and_gets_not_found_for_unknown_ones(
    go_client: Path, server: ServeProcess
) -> None:
    run = _run(go_client, server.target, "-processes")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["unknown_session"] == "NotFound"
    if report["processes"] == -1:  # a backend without a process table says so, for every process RPC
        assert "process table" in report["unsupported"] and report["unknown_process"] == "FailedPrecondition"
    else:
        assert report["processes"] == 0 and report["unknown_process"] == "NotFound"
    with DispatcherClient(server.target, token=TOKEN) as client:
        assert client.list_sessions() == []


def test_go_client_gets_the_tools_in_each_providers_shape(go_client: Path, server: ServeProcess) -> None:
    names: dict[str, list[str]] = {}
    for format in ("anthropic", "openai", "mcp"):
        run = _run(go_client, server.target, f"-tools={format}")
        assert run.returncode == 0, run.stderr
        tools = json.loads(run.stdout)
        names[format] = [t["function"]["name"] if format == "openai" else t["name"] for t in tools]
    assert names["anthropic"] == names["openai"] == names["mcp"]
    assert {"glob", "grep", "read_file", "shell"} <= set(names["anthropic"])
    wrong = _run(go_client, server.target, "-tools=gemini")
    assert wrong.returncode == 1 and "expected openai, anthropic or mcp" in wrong.stderr
    with DispatcherClient(server.target, token=TOKEN) as client:
        assert client.list_sessions() == []
