"""Review mode in a real container (issue 10, point 2): a staged patch is applied in the sandbox
only once accepted, exactly as its diff showed; a rejected write leaves nothing behind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.core.dispatcher import Decision
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.integration.grpc.conftest import unmount_under
from tests.server.conftest import TOKEN_BETA, Harness
from tests.server.helpers import text_of

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def _no_mount_left(tmp_path: Path) -> Iterator[None]:
    """Torn down after the server: the tenant roots it bind-mounted must not outlive the test."""
    yield
    unmount_under(tmp_path)


async def test_review_applies_an_accepted_patch_in_the_sandbox(docker_harness: Harness) -> None:
    client = docker_harness.client(TOKEN_BETA)
    session = await client.create_session(mode="review")
    sid = session.session_id
    root = docker_harness.tmp / "ws-beta" / "default"
    setup = await client.create_session(
        mode="autonomous"
    )  # same workspace: writes the file as the sandbox user
    made = await client.call(
        setup.session_id, "shell", {"command": "printf 'a\\nb\\n' > f.py && chmod 640 f.py"}
    )
    assert not made.is_error, text_of(made)

    uses = [
        ToolUseBlock("p", "patch_file", {"path": "f.py", "old": "b\n", "new": "B\n"}),
        ToolUseBlock("w", "write_file", {"path": "dropped.txt", "content": "no\n"}),
    ]
    task = asyncio.create_task(_results(client, sid, uses))
    requests = {}
    async for event in client.watch(sid):
        if event.type == "tool.confirmation_requested":
            requests[event.tool_use_id] = event
            if len(requests) == 2:
                break
    assert "-b\n+B\n" in str(requests["p"].payload.diff)
    assert (root / "f.py").read_text() == "a\nb\n"  # nothing applied yet
    await client.resolve_confirmation(sid, str(requests["w"].payload.request_id), Decision.DENY)
    await client.resolve_confirmation(sid, str(requests["p"].payload.request_id), Decision.ALLOW)
    results = await asyncio.wait_for(task, 60)
    assert not results["p"].is_error and list(results["p"].files_modified) == ["f.py"]
    assert results["w"].is_error and "rejected" in text_of(results["w"])
    assert (root / "f.py").read_text() == "a\nB\n"
    assert (root / "f.py").stat().st_mode & 0o777 == 0o640  # replaced in place, mode kept
    assert not (root / "dropped.txt").exists()


async def test_review_applies_a_crlf_patch_to_an_lf_file_as_every_mode_does(docker_harness: Harness) -> None:
    """Issue 19: ``old`` with CRLF in an LF file is applied by patch_file in every mode; review
    mode's staging once refused it as not found. Staged, approved, and the file as expected."""
    client = docker_harness.client(TOKEN_BETA)
    root = docker_harness.tmp / "ws-beta" / "default"
    setup = await client.create_session(mode="autonomous")
    made = await client.call(setup.session_id, "shell", {"command": "printf 'x\\na\\nb\\n' > crlf.txt"})
    assert not made.is_error, text_of(made)
    sid = (await client.create_session(mode="review")).session_id
    patch = {"path": "crlf.txt", "old": "a\r\nb", "new": "A\r\nB"}
    task = asyncio.create_task(_results(client, sid, [ToolUseBlock("p", "patch_file", patch)]))
    async for event in client.watch(sid):
        if event.type in ("tool.confirmation_requested", "tool.failed"):
            break
    assert event.type == "tool.confirmation_requested", event.payload  # not refused at staging
    assert "-a\n-b\n+A\n+B\n" in str(event.payload.diff)
    assert (root / "crlf.txt").read_bytes() == b"x\na\nb\n"  # staged, not applied
    await client.resolve_confirmation(sid, str(event.payload.request_id), Decision.ALLOW)
    results = await asyncio.wait_for(task, 60)
    assert not results["p"].is_error, text_of(results["p"])
    assert (root / "crlf.txt").read_bytes() == b"x\nA\nB\n"


async def _results(client: object, sid: str, uses: list[ToolUseBlock]) -> dict[str, ToolResultBlock]:
    out = {}
    async for item in client.dispatch(sid, uses):  # type: ignore[attr-defined]
        if isinstance(item, ToolResultBlock):
            out[item.tool_use_id] = item
    return out


async def test_a_change_after_the_servers_check_is_refused_by_the_agent_not_overwritten(
    docker_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file changes between the server's last check and the write (a command in the sandbox,
    here the host): the agent compares the reviewed hash just before its rename and refuses."""
    from dispatcher.core import approval

    client = docker_harness.client(TOKEN_BETA)
    root = docker_harness.tmp / "ws-beta" / "default"
    setup = await client.create_session(mode="autonomous")
    made = await client.call(setup.session_id, "shell", {"command": "printf 'a\\nb\\n' > f.py"})
    assert not made.is_error, text_of(made)
    real_check = approval.review.check_unchanged

    async def check_then_change(*args: object) -> None:
        await real_check(*args)  # type: ignore[arg-type]
        (root / "f.py").write_text("a\nb\nlater\n")

    monkeypatch.setattr(approval.review, "check_unchanged", check_then_change)
    session = await client.create_session(mode="review")
    sid = session.session_id
    task = asyncio.create_task(
        _results(client, sid, [ToolUseBlock("p", "patch_file", {"path": "f.py", "old": "b\n", "new": "B\n"})])
    )
    async for event in client.watch(sid):
        if event.type == "tool.confirmation_requested":
            await client.resolve_confirmation(sid, str(event.payload.request_id), Decision.ALLOW)
            break
    results = await asyncio.wait_for(task, 60)
    assert results["p"].is_error and "changed after the change to it was reviewed" in text_of(results["p"])
    assert (root / "f.py").read_text() == "a\nb\nlater\n"
    assert not [p.name for p in root.iterdir() if p.name.endswith(".tmp")]
