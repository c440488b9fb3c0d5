"""What a human approves is exactly what runs (design §4.2), in real containers (runc and runsc).

The race: a confirmation shows where a path really is; while it waits, a process of the same
session swaps a directory on that path for a link to another directory of the workspace; then
the human approves. The call must use the approved path or fail saying it changed, and touch
nothing elsewhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import pytest

from dispatcher.config.load import parse_policy
from dispatcher.core import Decision, Session, ToolDispatcher, ToolUseBlock
from dispatcher.core.sandbox_api import Sandbox
from dispatcher.core.types import ToolResultBlock
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.tools import builtin_factories
from tests.blocks import text_at
from tests.events import EventOf, ToolConfirmationRequested, is_event
from tests.integration.conftest import ProviderFactory
from tests.integration.helpers import run, runsc_available

pytestmark = pytest.mark.docker

ASK_EVERYTHING = {"default": {"READ": "prompt", "WRITE": "prompt", "EXECUTE": "prompt"}}
SWAP = "mv d d.old && ln -s other d"  # what a background process of the session does meanwhile


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest, docker_client: docker.DockerClient) -> str:
    if request.param == "runsc" and not runsc_available(docker_client):
        pytest.skip("runsc is not registered with dockerd")
    return str(request.param)


@pytest.fixture
async def setup(
    make_provider: ProviderFactory, runtime: str
) -> AsyncIterator[tuple[ToolDispatcher, Session, Sandbox]]:
    provider = make_provider(SandboxConfig(runtime=runtime))
    d = ToolDispatcher(provider, policy=parse_policy(ASK_EVERYTHING))
    for factory in builtin_factories():
        d.register(factory, builtin=True)
    d.seal()
    session = make_provider.session("approved")
    sandbox = provider.sandbox_for(session)
    made = await run(sandbox, "mkdir d other && echo approved > d/f && echo elsewhere > other/f")
    assert made.result.exit_code == 0, made.err
    try:
        yield d, session, sandbox
    finally:
        await d.aclose()


async def approve(
    d: ToolDispatcher, session: Session, sandbox: Sandbox, name: str, input_: dict[str, Any], swap: str
) -> tuple[EventOf[ToolConfirmationRequested], ToolResultBlock]:
    """Dispatch, wait for the question, run ``swap`` in the sandbox, then allow."""
    bus = d.open_session(session)
    async with bus.subscribe() as sub:
        task = asyncio.ensure_future(d.dispatch(ToolUseBlock("tu-1", name, input_), session))
        try:
            async with asyncio.timeout(60):
                asked = await anext(e async for e in sub if is_event(e, ToolConfirmationRequested))
            if swap:
                swapped = await run(sandbox, swap)
                assert swapped.result.exit_code == 0, swapped.err
            d.resolve_confirmation(session.session_id, asked.payload.request_id, Decision.ALLOW)
            return asked, await task
        finally:
            task.cancel()


def workspace(session: Session) -> Path:
    return Path(session.workspace_path)


def assert_changed(result: ToolResultBlock, done: str) -> None:
    assert result.is_error, result
    text = text_at(result)
    assert "changed after it was approved" in text and f"nothing was {done}" in text, text


async def test_write_file_writes_the_approved_path_or_nothing(
    setup: tuple[ToolDispatcher, Session, Sandbox],
) -> None:
    d, session, sandbox = setup
    asked, result = await approve(d, session, sandbox, "write_file", {"path": "d/f", "content": "new"}, SWAP)
    assert asked.payload.projected_modifications == ("d/f",)
    assert_changed(result, "written")
    assert (workspace(session) / "other" / "f").read_text() == "elsewhere\n"
    assert (workspace(session) / "d.old" / "f").read_text() == "approved\n"


async def test_write_file_of_a_new_file_is_made_in_the_approved_directory_or_not_at_all(
    setup: tuple[ToolDispatcher, Session, Sandbox],
) -> None:
    d, session, sandbox = setup
    _, result = await approve(d, session, sandbox, "write_file", {"path": "d/new", "content": "x"}, SWAP)
    assert_changed(result, "written")
    assert not (workspace(session) / "other" / "new").exists()


async def test_patch_file_patches_the_approved_file_or_nothing(
    setup: tuple[ToolDispatcher, Session, Sandbox],
) -> None:
    d, session, sandbox = setup
    input_ = {"path": "d/f", "old": "elsewhere", "new": "pwned"}
    asked, result = await approve(d, session, sandbox, "patch_file", input_, SWAP)
    assert asked.payload.projected_modifications == ("d/f",)
    assert_changed(result, "read")  # patch_file reads the approved file first: refused there
    assert (workspace(session) / "other" / "f").read_text() == "elsewhere\n"


async def test_read_file_reads_the_approved_file_or_nothing(
    setup: tuple[ToolDispatcher, Session, Sandbox],
) -> None:
    d, session, sandbox = setup
    _, result = await approve(d, session, sandbox, "read_file", {"path": "d/f"}, SWAP)
    assert_changed(result, "read")
    assert "elsewhere" not in str(result.content)
    swap_other = "mv other o2 && ln -s d.old other"
    _, listed = await approve(d, session, sandbox, "list_dir", {"path": "other"}, swap_other)
    assert_changed(listed, "listed")


async def test_shell_runs_in_the_approved_directory_or_not_at_all(
    setup: tuple[ToolDispatcher, Session, Sandbox],
) -> None:
    d, session, sandbox = setup
    input_ = {"command": "touch made && pwd -P", "cwd": "d"}
    _, result = await approve(d, session, sandbox, "shell", input_, SWAP)
    assert_changed(result, "run")
    assert not (workspace(session) / "other" / "made").exists()


async def test_a_link_resolved_at_approval_is_the_path_used(
    setup: tuple[ToolDispatcher, Session, Sandbox],
) -> None:
    d, session, sandbox = setup
    made = await run(sandbox, "mkdir -p real/dir && ln -s real/dir link")
    assert made.result.exit_code == 0, made.err
    asked, result = await approve(
        d, session, sandbox, "write_file", {"path": "link/f", "content": "via link"}, ""
    )
    assert asked.payload.projected_modifications == ("real/dir/f",)
    assert not result.is_error, result
    assert (workspace(session) / "real" / "dir" / "f").read_text() == "via link"
    # The link moved after approval: what was approved (real/dir) is still what is used.
    _, again = await approve(
        d, session, sandbox, "shell", {"command": "pwd -P", "cwd": "link"}, "ln -sfn other link"
    )
    assert not again.is_error, again
    assert text_at(again).strip() == "/workspace/real/dir"
