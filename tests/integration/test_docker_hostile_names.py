"""Hostile paths and names in a real sandbox (issue 7, points 11 and 13).

A 1,500-level path is a plain tool error that leaves the container and the session's other calls
alone; list_dir shows one entry per line whatever the sandbox names its files.
"""

from __future__ import annotations

import asyncio
from typing import Any

import docker
import pytest

from dispatcher.core.sandbox_api import FileOpError, Sandbox
from dispatcher.core.sessions.session import Session
from dispatcher.core.types import TextBlock, Tool, ToolOutput
from dispatcher.sandbox.container.sandbox import ContainerSandbox
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from dispatcher.tools import ListDirTool, WriteFileTool
from tests.integration.helpers import containers_of, run, tool_context

pytestmark = pytest.mark.docker


async def call(tool: Tool, sandbox: Sandbox, session: Session, **input: Any) -> ToolOutput:
    context, _ = tool_context(sandbox, session.workspace_path)
    return await tool.execute(input, context)


def text(output: ToolOutput) -> str:
    return "".join(block.text for block in output.content if isinstance(block, TextBlock))


async def test_a_1500_level_write_is_a_plain_error_and_the_session_lives_on(
    docker_client: docker.DockerClient, provider: DockerSandboxProvider, sandbox: Sandbox, session: Session
) -> None:
    started = asyncio.Event()
    running = asyncio.ensure_future(
        run(
            sandbox,
            "echo started; while [ ! -e go ]; do sleep 0.05; done; echo alive",
            on_chunk=lambda _stream, _data: started.set(),
        )
    )
    await asyncio.wait_for(started.wait(), 60)
    assert isinstance(sandbox, ContainerSandbox)
    container = sandbox.container_id
    assert container is not None

    with pytest.raises(FileOpError) as info:
        await call(WriteFileTool(), sandbox, session, path="/".join(["a"] * 1500) + "/f.txt", content="deep")
    assert info.value.code == "ENAMETOOLONG" and "1500 directories deep" in str(info.value)

    await sandbox.write("go", "")
    ran = await asyncio.wait_for(running, 30)
    assert ran.result.exit_code == 0 and ran.out == "started\nalive\n"
    assert sandbox.container_id == container  # not recreated
    assert container in [c.id for c in containers_of(docker_client, provider.instance)]


async def test_a_newline_in_a_name_is_one_escaped_line(sandbox: Sandbox, session: Session) -> None:
    made = await run(sandbox, "printf x > \"$(printf 'a\\nid_rsa@ -> ..')\"; printf x > b")
    assert made.result.exit_code == 0, made.err
    listing = text(await call(ListDirTool(), sandbox, session))
    assert listing.split("\n") == ["a\\nid_rsa@ -> ..", "b"]


async def test_bidi_control_and_undecodable_names_show_escaped(sandbox: Sandbox, session: Session) -> None:
    await sandbox.write("invoice\u202efdp.exe", "x")
    made = await run(
        sandbox, "touch \"$(printf 'caf\\351')\" \"$(printf 'bell\\007')\"; ln -s \"$(printf 'x\\ry')\" link"
    )
    assert made.result.exit_code == 0, made.err
    lines = text(await call(ListDirTool(), sandbox, session)).split("\n")
    assert lines == ["bell\\x07", "caf\\udce9", "invoice\\u202efdp.exe", "link@ -> x\\ry"]
