"""``dispatcher mcp``'s session options on the local backend: --keep, --session, --tools."""

from __future__ import annotations

import os
import signal
import sys

import anyio

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
    async with await anyio.open_process([sys.executable, *mcp_argv(harness.target)], env=env) as proc:
        assert proc.stderr is not None
        said = b""
        with anyio.fail_after(30):
            while b"\n" not in said:
                said += await proc.stderr.receive()
        assert b"dispatcher mcp: session ses_" in said, said
        assert len(await harness.client().list_sessions()) == 1
        proc.send_signal(signal.SIGTERM)  # stdin still open: the signal alone must end it
        with anyio.fail_after(30):
            assert await proc.wait() == 0
    assert not await harness.client().list_sessions()
