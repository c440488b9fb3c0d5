"""The MCP stdio transport: what a (possibly tenant-controlled) server sends is bounded and parsed
without holding the event loop."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from dispatcher.mcp import transport


class _Process:
    """An MCP process whose stdout is a StreamReader the test feeds."""

    def __init__(self) -> None:
        self.reader = asyncio.StreamReader(limit=transport.SANDBOX_MAX_MESSAGE_BYTES)
        self.writer = None
        self.violation: str | None = None
        self.killed = False

    def stderr_tail(self) -> str:
        return ""

    async def wait(self) -> None:
        return None

    async def kill(self) -> None:
        self.killed = True

    async def close(self) -> None:
        await self.kill()


def _notification(size: int) -> bytes:
    message = {
        "jsonrpc": "2.0",
        "method": "notifications/message",
        "params": {"level": "info", "data": "x" * size},
    }
    return json.dumps(message).encode() + b"\n"


async def test_a_large_message_is_parsed_off_the_event_loop_and_a_small_one_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[tuple[int, bool]] = []
    parse = transport._parse

    def recording_parse(line: bytes) -> object:
        threads.append((len(line), threading.current_thread() is threading.main_thread()))
        return parse(line)

    monkeypatch.setattr(transport, "_parse", recording_parse)
    process = _Process()
    small, big = _notification(100), _notification(transport.INLINE_BYTES * 4)
    process.reader.feed_data(small + big + b"not json\n" + small)
    process.reader.feed_eof()
    ended = asyncio.Event()
    received = []
    async with transport.message_streams(process, "fx", ended) as (read, _write):  # type: ignore[arg-type]
        async with asyncio.timeout(10):
            async for item in read:
                received.append(item)
    assert [len(m.message.params["data"]) for m in received] == [100, transport.INLINE_BYTES * 4, 100]  # type: ignore[union-attr, index]
    assert threads == [(len(small), True), (len(big), False), (len(b"not json\n"), True), (len(small), True)]
    assert ended.is_set() and not process.killed


async def test_a_line_over_the_limit_ends_the_process_with_a_violation() -> None:
    process = _Process()
    process.reader.feed_data(b"[" * (transport.SANDBOX_MAX_MESSAGE_BYTES + 10) + b"\n")
    process.reader.feed_eof()
    ended = asyncio.Event()
    async with transport.message_streams(process, "fx", ended) as (read, _write):  # type: ignore[arg-type]
        async with asyncio.timeout(10):
            received = [item async for item in read]
    assert received == []
    assert process.killed and process.violation is not None and "longer than its limit" in process.violation
    assert ended.is_set()
