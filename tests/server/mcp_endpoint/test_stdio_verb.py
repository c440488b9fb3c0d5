"""``dispatcher mcp``'s session options on the local backend: --keep, --session, --tools."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from tests.mcp_host import REPO, mcp_argv, stdio_session, text_of
from tests.server.conftest import TOKEN_ALPHA, Harness


async def test_keep_then_attach_then_narrow(harness: Harness) -> None:
    client = harness.client()
    async with stdio_session(harness.target, TOKEN_ALPHA, "--workspace", "kept", "--keep") as mcp:
        assert (await mcp.list_tools()).tools
    (kept,) = await client.list_sessions()
    assert kept.workspace == "kept" and kept.labels["dispatcher.mcp"] == "stdio"

    async with stdio_session(
        harness.target, TOKEN_ALPHA, "--session", kept.session_id, "--tools", "read_file"
    ) as mcp:
        assert [t.name for t in (await mcp.list_tools()).tools] == ["read_file"]
        refused = await mcp.call_tool("shell", {"command": "true"})
        assert refused.is_error and "not offered here" in text_of(refused)
    # Attached, not created: it stays.
    assert [s.session_id for s in await client.list_sessions()] == [kept.session_id]

    async with stdio_session(harness.target, TOKEN_ALPHA, "--tools", "read_file,list_dir") as mcp:
        assert {t.name for t in (await mcp.list_tools()).tools} == {"read_file", "list_dir"}
        new = next(s for s in await client.list_sessions() if s.session_id != kept.session_id)
        assert new.capabilities.allowed_tools == frozenset({"read_file", "list_dir"})


async def test_sigterm_closes_the_session_it_created(harness: Harness) -> None:
    env = {**os.environ, "DISPATCHER_TOKEN": TOKEN_ALPHA, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *mcp_argv(harness.target),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stderr is not None
    line = await asyncio.wait_for(proc.stderr.readline(), timeout=30)
    assert b"dispatcher mcp: session ses_" in line, line
    assert len(await harness.client().list_sessions()) == 1
    proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(proc.wait(), timeout=30)
    assert proc.returncode == 0
    assert not await harness.client().list_sessions()
