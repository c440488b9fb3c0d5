"""Issue 34's run_code "done when", through gRPC on a Docker session with the default image: a
variable lives to the next call, a matplotlib figure comes back as a PNG of the figure's size,
an error names the cell's line, an endless cell is interrupted with the context kept, JavaScript
keeps its variables, restart forgets, two contexts are apart, the RPCs list and remove them, and
closing the session leaves no interpreter."""

from __future__ import annotations

import struct
import time
from typing import Any

import docker
import pytest

from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.events.bus import Event
from dispatcher.core.events.payloads import ToolOutputDelta
from dispatcher.core.types import ImageBlock, ToolResultBlock, ToolUseBlock
from tests.integration.helpers import containers_of
from tests.server.conftest import Harness
from tests.server.helpers import text_of

pytestmark = pytest.mark.docker


async def run(client: AsyncDispatcherClient, sid: str, code: str, **input: Any) -> ToolResultBlock:
    return await client.call(sid, "run_code", {"code": code, **input})


def ok(result: ToolResultBlock) -> str:
    assert not result.is_error, text_of(result)
    return text_of(result)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def test_run_code_on_docker(docker_harness: Harness, docker_client: docker.DockerClient) -> None:
    client = docker_harness.client()
    sid = (await client.create_session()).session_id
    # x = 41, then x + 1
    assert ok(await run(client, sid, "x = 41")) == "(no output)"
    result = await run(client, sid, "x + 1")
    assert ok(result) == "42" and result.metadata["execution_count"] == 2
    # a figure: 4 x 3 inches at 100 dpi is 400 x 300 pixels
    code = (
        "import matplotlib.pyplot as plt\nplt.figure(figsize=(4, 3), dpi=100)\nplt.plot([1, 2, 3], [1, 4, 9])"
    )
    result = await run(client, sid, code)
    images = [b for b in result.content if isinstance(b, ImageBlock)]
    assert len(images) == 1 and images[0].media_type == "image/png", text_of(result)
    assert png_size(images[0].data) == (400, 300)
    assert "image/png" in result.metadata["mime_types"]
    # 1/0 names the cell's line
    result = await run(client, sid, "y = 1\n1/0")
    assert result.is_error and result.metadata["error"]["name"] == "ZeroDivisionError"
    assert 'File "<cell 4>", line 2' in text_of(result)
    # an endless cell with a 2 s limit: interrupted within 3 s, x kept
    started = time.monotonic()
    result = await run(client, sid, "while True: pass", timeout_seconds=2)
    elapsed = time.monotonic() - started
    assert result.is_error and result.metadata["interrupted"] is True, text_of(result)
    assert "KeyboardInterrupt" in text_of(result) and elapsed <= 3.0, elapsed
    assert ok(await run(client, sid, "x")) == "41"
    # javascript keeps its variables too
    ok(await run(client, sid, "var n = 20; const m = 1;", language="javascript"))
    assert ok(await run(client, sid, "n * 2 + m + 1", language="javascript")) == "42"
    # two contexts do not see each other's variables
    ok(await run(client, sid, "x = 'other'", context="second"))
    assert ok(await run(client, sid, "x", context="second")) == "'other'"
    assert ok(await run(client, sid, "x")) == "41"
    # the RPCs see three; restart forgets
    listed = await client.list_code_contexts(sid)
    assert sorted((c.language, c.name) for c in listed) == [
        ("javascript", "default"),
        ("python", "default"),
        ("python", "second"),
    ]
    result = await run(client, sid, "x", restart=True)
    assert result.metadata["error"]["name"] == "NameError" and "restarted" in text_of(result)
    removed = await client.remove_code_context(sid, "second")
    assert removed.name == "second"
    result = await run(client, sid, "x", context="second")
    assert result.metadata["error"]["name"] == "NameError"
    # what a cell prints streams to the caller as tool.output_delta
    use = ToolUseBlock("tu_stream", "run_code", {"code": "print('streamed'); 7"})
    items = [item async for item in client.dispatch(sid, [use])]
    deltas = [
        i.payload.text for i in items if isinstance(i, Event) and isinstance(i.payload, ToolOutputDelta)
    ]
    assert "".join(deltas) == "streamed\n"
    assert isinstance(items[-1], ToolResultBlock) and text_of(items[-1]) == "streamed\n[value]\n7"
    # the interpreters are processes of the container; closing the session ends them with it
    instance = docker_harness.server.provider.instance  # type: ignore[attr-defined]
    (container,) = containers_of(docker_client, instance)
    top = container.top(ps_args="-eo pid,args")["Processes"]
    assert any("python3 -I -u -c" in row[-1] for row in top) and any("node -e" in row[-1] for row in top)
    await client.close_session(sid)
    assert containers_of(docker_client, instance) == []
