"""Bounded memory through gRPC: ids capped, oversized results as results, watch quota (issue 7, point 5)."""

from __future__ import annotations

import asyncio
import copy
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.client import RequestFailed
from dispatcher.core.events.bus import Event
from dispatcher.core.types import ImageBlock, ToolResultBlock, ToolUseBlock
from dispatcher.server.requests.checks import MAX_ID_CHARS, MAX_TOOL_USES
from tests.server.conftest import TOKEN_TINY, Harness, ServerFactory, base_config
from tests.server.helpers import text_of, until


def png(size: int) -> bytes:
    """A valid PNG of about ``size`` bytes (incompressible pixels)."""
    side = int((size / 3) ** 0.5) + 1
    raw = bytearray()
    seed = 1
    for _ in range(side):
        raw.append(0)
        for _ in range(side * 3):
            seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
            raw.append(seed >> 16 & 0xFF)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(bytes(raw), 0))
        + chunk(b"IEND", b"")
    )


async def test_an_oversized_image_is_an_error_result_and_its_siblings_still_arrive(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session("images")
    workspace = Path(session.workspace_path)
    (workspace / "big.png").write_bytes(png(4_700_000))  # over the 4 MiB message limit
    (workspace / "small.png").write_bytes(png(10_000))
    uses = [
        ToolUseBlock("big", "read_file", {"path": "big.png"}),
        ToolUseBlock("small", "read_file", {"path": "small.png"}),
        ToolUseBlock("echo", "echo", {"text": "still here"}),
    ]
    results = {
        i.tool_use_id: i
        async for i in client.dispatch(session.session_id, uses)
        if isinstance(i, ToolResultBlock)
    }
    assert set(results) == {"big", "small", "echo"}
    big = results["big"]
    assert big.is_error and str(big.error_class) == "execution_error"
    assert "too large" in text_of(big) and "image/png" in text_of(big)
    assert isinstance(results["small"].content[0], ImageBlock) and not results["small"].is_error
    assert text_of(results["echo"]) == "still here"


@pytest.mark.parametrize(
    "field",
    ["tool_use_id", "tool_name", "turn_id", "session_id"],
)
async def test_ids_longer_than_the_cap_are_invalid_argument(harness: Harness, field: str) -> None:
    client = harness.client()
    session = await client.create_session()
    long = "x" * (MAX_ID_CHARS + 1)
    tool_use = ToolUseBlock(
        long if field == "tool_use_id" else "u1", long if field == "tool_name" else "echo", {"text": "x"}
    )
    with pytest.raises(RequestFailed) as err:
        await client.call(
            long if field == "session_id" else session.session_id,
            tool_use.name,
            tool_use.input,
            tool_use_id=tool_use.id,
            turn_id=long if field == "turn_id" else "",
        )
    assert err.value.code == "INVALID_ARGUMENT"
    expected = {"tool_use_id": "tool_uses[0].id", "tool_name": "tool_uses[0].name"}.get(field, field)
    assert expected in err.value.details


async def test_a_35_mb_turn_id_is_refused_and_nothing_is_kept(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    for _ in range(3):
        with pytest.raises(RequestFailed) as err:
            await client.call(session.session_id, "echo", {"text": "x"}, turn_id="t" * 3_500_000)
        assert err.value.code == "INVALID_ARGUMENT" and "turn_id" in err.value.details
    assert (await client.get_session(session.session_id)).last_event_seq == 0


async def test_too_many_tool_uses_in_one_dispatch(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    uses = [ToolUseBlock(f"u{i}", "echo", {"text": "x"}) for i in range(MAX_TOOL_USES + 1)]
    with pytest.raises(RequestFailed) as err:
        async for _ in client.dispatch(session.session_id, uses):
            pass
    assert err.value.code == "INVALID_ARGUMENT" and "tool_uses" in err.value.details
    results = [
        i async for i in client.dispatch(session.session_id, uses[:-1]) if isinstance(i, ToolResultBlock)
    ]
    assert len(results) == MAX_TOOL_USES


async def test_a_long_request_id_is_invalid_argument(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    with pytest.raises(RequestFailed) as err:
        await client.resolve_confirmation(session.session_id, "r" * (MAX_ID_CHARS + 1), True)
    assert err.value.code == "INVALID_ARGUMENT" and "request_id" in err.value.details


async def test_watch_stream_quota(make_server: ServerFactory, tmp_path: Path) -> None:
    tenants: list[dict[str, Any]] = copy.deepcopy(base_config(tmp_path)["tenants"])
    tenants[2]["quotas"]["max_watch_streams"] = 2
    harness = await make_server(tenants=tenants)
    tiny = harness.client(TOKEN_TINY)
    session = await tiny.create_session()
    await tiny.call(session.session_id, "echo", {"text": "an event to replay"})

    async def opened() -> tuple[AsyncIterator[Event], Event]:
        stream = tiny.watch(session.session_id)
        return stream, await asyncio.wait_for(anext(stream), 10)  # replayed: the stream is open

    first, _ = await opened()
    second, _ = await opened()
    with pytest.raises(RequestFailed) as err:
        await opened()
    assert err.value.code == "RESOURCE_EXHAUSTED" and "max_watch_streams" in err.value.details
    await first.aclose()  # type: ignore[attr-defined]
    reopened: list[AsyncIterator[Event]] = []

    async def room_again() -> bool:  # the server notices the cancelled stream a moment later
        try:
            reopened.append((await opened())[0])
        except RequestFailed as exc:
            assert exc.code == "RESOURCE_EXHAUSTED"
            return False
        return True

    await until(room_again, "the closed stream's slot to be free", interval=0.02)
    for stream in (second, *reopened):
        await stream.aclose()  # type: ignore[attr-defined]


async def test_cancel_reaches_tool_uses_still_waiting_for_room(harness: Harness) -> None:
    client, watcher = harness.client(), harness.client()
    session = await client.create_session()
    uses = [ToolUseBlock(f"b{i}", "block", {}) for i in range(10)]  # more than the first batch
    results: list[ToolResultBlock] = []

    async def run() -> None:
        async for item in client.dispatch(session.session_id, uses):
            if isinstance(item, ToolResultBlock):
                results.append(item)

    task = asyncio.create_task(run())
    called = 0
    async for event in watcher.watch(session.session_id):
        called += event.type == "tool.called"
        if called == 4:  # the session's concurrency: the rest wait (in the core or for room)
            break
    await client.cancel(session.session_id)
    await asyncio.wait_for(task, 20)
    assert sorted(r.tool_use_id for r in results) == sorted(u.id for u in uses)
    assert {str(r.error_class) for r in results} == {"cancelled"}


def test_default_quotas_and_the_result_budget_follow_the_message_limit(tmp_path: Path) -> None:
    from dispatcher.config.load import load_config
    from dispatcher.config.sections import RESULT_MESSAGE_MARGIN, Quotas
    from dispatcher.core.errors import ConfigError

    assert Quotas() == Quotas(max_sessions=100, max_concurrent_dispatches=32, max_watch_streams=32)
    path = tmp_path / "c.yaml"
    path.write_text("server: {max_message_bytes: 1048576}\n")
    assert load_config(path, env={}).dispatcher.result_budget_bytes == (1 << 20) - RESULT_MESSAGE_MARGIN
    path.write_text("dispatcher: {result_budget_bytes: 4194304}\n")
    with pytest.raises(ConfigError, match=r"dispatcher\.result_budget_bytes"):
        load_config(path, env={})
