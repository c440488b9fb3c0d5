"""``Sandbox.exec``: output, exit codes, cwd/env/stdin, and the kill sequence on timeout and
cancellation, as the interface exposes them (``ExecResult``'s flags)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from dispatcher.core.errors import WorkspaceEscapeError
from tests.contract.helpers import code_of, run, sh
from tests.contract.targets import Capability, Target, host_secret


async def test_a_cancel_set_before_the_call_runs_nothing(target: Target) -> None:
    """Holds without a shell: the fake's handler must not be called either."""
    cancel = asyncio.Event()
    cancel.set()
    ran = await run(target, "echo ran > ran.txt", cancel=cancel)
    assert ran.result.cancelled and ran.result.exit_code is None and not ran.result.timed_out
    assert ran.stdout == b""
    assert not await target.sandbox.exists("ran.txt")


async def test_a_cwd_outside_the_workspace_is_an_escape(target: Target) -> None:
    for cwd in ("..", "/etc", "a/../.."):
        with pytest.raises(WorkspaceEscapeError):
            await run(target, "pwd", cwd=cwd)


async def test_a_link_on_an_approved_cwd_is_changed_and_nothing_runs(target: Target) -> None:
    await target.sandbox.write("other/keep.txt", "x")
    await target.link("d", "other")  # where the approved directory "d" was
    assert await code_of(run(target, "echo ran > ran.txt", cwd="d", approved_cwd="d")) == "changed"
    assert not await target.sandbox.exists("other/ran.txt")


async def test_an_approved_cwd_is_where_the_command_runs(target: Target) -> None:
    target.require(Capability.COMMANDS)
    await target.sandbox.write("v2/f.txt", "x")
    await target.link("cur", "v2")
    ran = await run(target, "pwd -P; ls", cwd="cur", approved_cwd="v2")
    pwd, listed = ran.stdout.decode().splitlines()
    assert pwd.endswith("/v2") and listed == "f.txt"


async def test_output_and_exit_codes(target: Target) -> None:
    target.require(Capability.COMMANDS)
    ok = await run(target, "echo out; echo err >&2")
    assert (ok.result.exit_code, ok.result.signal, ok.stdout, ok.stderr) == (0, None, b"out\n", b"err\n")
    failed = await run(target, "echo partial; exit 3")
    assert (failed.result.exit_code, failed.stdout) == (3, b"partial\n")
    assert not (failed.result.timed_out or failed.result.cancelled or failed.result.killed)
    assert failed.result.duration_ms > 0


async def test_a_command_killed_by_a_signal_has_no_exit_code(target: Target) -> None:
    target.require(Capability.COMMANDS)
    ran = await run(target, "kill -TERM $$")
    assert (ran.result.exit_code, ran.result.signal) == (None, signal.SIGTERM)
    assert not (ran.result.timed_out or ran.result.cancelled or ran.result.killed)


async def test_cwd_env_and_stdin(target: Target) -> None:
    target.require(Capability.COMMANDS)
    await target.sandbox.write("sub/dir/f.txt", "x")
    ran = await run(
        target, 'pwd; ls; echo "$GREETING"; cat', cwd="sub/dir", env={"GREETING": "hi"}, stdin=b"in\n"
    )
    pwd, listed, greeting, stdin = ran.stdout.decode().splitlines()
    assert pwd.endswith("/sub/dir") and (listed, greeting, stdin) == ("f.txt", "hi", "in")
    if target.has(Capability.ROOT_PATHS):
        assert pwd == target.path("sub/dir")


async def test_the_default_cwd_is_the_workspace_and_files_are_shared(target: Target) -> None:
    target.require(Capability.COMMANDS)
    await sh(target, "mkdir -p made && printf 'by a command' > made/f.txt")
    assert await target.sandbox.read("made/f.txt") == "by a command"
    await target.sandbox.write("api.txt", "by the API")
    assert await sh(target, "cat api.txt") == b"by the API"


async def test_large_output_arrives_whole_and_in_order(target: Target) -> None:
    target.require(Capability.COMMANDS)
    ran = await run(target, "i=0; while [ $i -lt 2000 ]; do printf '%0499d\\n' $i; i=$((i+1)); done")
    lines = ran.stdout.decode().splitlines()
    assert len(ran.stdout) == 2000 * 500 and [int(line) for line in lines] == list(range(2000))


async def test_the_servers_environment_does_not_reach_commands(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    target.require(Capability.COMMANDS)
    monkeypatch.setenv("DISPATCHER_CONTRACT_SECRET", "leaked")
    ran = await run(target, 'echo "[${DISPATCHER_CONTRACT_SECRET:-}]"')
    assert ran.stdout == b"[]\n"


async def test_a_missing_cwd_fails_the_call(target: Target) -> None:
    target.require(Capability.COMMANDS)
    assert await code_of(run(target, "pwd", cwd="no/such/dir")) == "ENOENT"


async def test_a_timeout_terminates_the_group_and_keeps_the_output(target: Target) -> None:
    target.require(Capability.COMMANDS)
    started = time.monotonic()
    ran = await run(target, "echo before; sleep 30 & sleep 30; echo never", timeout=0.5, grace=1.0)
    result = ran.result
    assert result.timed_out and not result.cancelled and not result.killed
    assert (result.exit_code, result.signal) == (None, signal.SIGTERM)
    assert ran.stdout == b"before\n"
    assert time.monotonic() - started < 10


async def test_a_command_ignoring_sigterm_is_killed_after_the_grace(target: Target) -> None:
    target.require(Capability.COMMANDS)
    started = time.monotonic()
    ran = await run(target, "trap '' TERM; echo armed; sleep 30", timeout=0.5, grace=0.5)
    assert ran.result.timed_out and ran.result.killed and ran.result.exit_code is None
    assert ran.stdout == b"armed\n"
    assert time.monotonic() - started < 10


async def test_cancel_terminates_a_running_command(target: Target) -> None:
    target.require(Capability.COMMANDS)
    cancel, printed = asyncio.Event(), asyncio.Event()
    call = asyncio.ensure_future(
        run(target, "echo going; sleep 30", cancel=cancel, started=printed, grace=1.0)
    )
    await asyncio.wait_for(printed.wait(), 30)
    cancel.set()
    ran = await asyncio.wait_for(call, 10)
    assert ran.result.cancelled and not ran.result.timed_out and ran.result.exit_code is None
    assert ran.stdout == b"going\n"


async def test_nothing_of_a_killed_group_is_left_running(target: Target) -> None:
    target.require(Capability.COMMANDS)
    await run(target, "(sleep 2; echo late > late.txt) & sleep 30", timeout=0.3, grace=0.3)
    ran = await run(target, "sleep 2.5; test -e late.txt && echo left || echo gone")
    assert ran.stdout == b"gone\n"


async def test_commands_are_isolated_from_the_host_unless_declared_otherwise(
    target: Target, tmp_path: Path
) -> None:
    target.require(Capability.COMMANDS)
    secret = host_secret(tmp_path)
    ran = await run(target, f"cat {secret}")
    if target.has(Capability.ISOLATION):
        assert ran.result.exit_code != 0 and b"top secret" not in ran.stdout
    else:  # what the declaration means: the host is there
        assert ran.stdout == b"top secret\n"
