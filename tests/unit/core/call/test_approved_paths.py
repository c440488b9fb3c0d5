"""The path a confirmation shows (resolved in the sandbox) is the path the tool is told to use.

The fake sandbox uses an ``approved`` path instead of the path as written and records it, so
these tests see what reaches the sandbox; the agent's side (no link followed) is tested in
tests/unit/sandbox/test_agent_approved.py and, racing a real swap, in
tests/integration/test_docker_approved.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dispatcher.config.load import parse_policy
from dispatcher.core import ConfirmationPolicy, Decision, Session, ToolDispatcher, ToolUseBlock
from dispatcher.core.sandbox_api import ExecRequest, ExecResult, OutputCallback
from dispatcher.core.types import ToolResultBlock
from dispatcher.sandbox.fake import FakeSandbox, FakeSandboxProvider
from dispatcher.tools import builtin_factories
from tests.events import ToolConfirmationRequested
from tests.unit.core.toolkit import next_event

ASK_EVERYTHING = {"default": {"READ": "prompt", "WRITE": "prompt", "EXECUTE": "prompt"}}


def make(provider: FakeSandboxProvider, policy: dict[str, Any] | None) -> ToolDispatcher:
    d = ToolDispatcher(
        provider,
        policy=parse_policy(policy) if policy else ConfirmationPolicy.preset("autonomous"),
    )
    for factory in builtin_factories():
        d.register(factory, builtin=True)
    d.seal()
    return d


@pytest.fixture
async def asking(provider: FakeSandboxProvider) -> AsyncIterator[ToolDispatcher]:
    d = make(provider, ASK_EVERYTHING)
    yield d
    await d.aclose()


@pytest.fixture
def sandbox(provider: FakeSandboxProvider, session: Session) -> FakeSandbox:
    sb = provider.sandbox_for(session)
    sb.links["cur"] = "v2"  # cur -> v2, as `ln -s v2 cur` made it
    sb.files["/workspace/v2/a.txt"] = b"old text\n"
    return sb


async def allow(d: ToolDispatcher, session: Session, name: str, input_: dict[str, Any]) -> tuple[Any, Any]:
    """Dispatch, allow the question, and return (the question, the result)."""
    bus = d.open_session(session)
    async with bus.subscribe() as sub:
        task = asyncio.ensure_future(d.dispatch(ToolUseBlock("tu_1", name, input_), session))
        asked = await next_event(sub, ToolConfirmationRequested)
        d.resolve_confirmation(session.session_id, asked.payload.request_id, Decision.ALLOW)
        result: ToolResultBlock = await task
    return asked, result


async def test_write_file_writes_the_path_the_question_showed(
    asking: ToolDispatcher, session: Session, sandbox: FakeSandbox
) -> None:
    asked, result = await allow(asking, session, "write_file", {"path": "cur/new.txt", "content": "x"})
    assert asked.payload.projected_modifications == ("v2/new.txt",)
    assert not result.is_error, result
    assert sandbox.approved == [("write", "v2/new.txt")]
    assert sandbox.files["/workspace/v2/new.txt"] == b"x"
    assert "/workspace/cur/new.txt" not in sandbox.files
    assert result.files_modified[0].endswith("v2/new.txt")  # what was written, where it really is


async def test_every_file_tool_and_shell_cwd_get_the_approved_path(
    asking: ToolDispatcher, session: Session, sandbox: FakeSandbox
) -> None:
    requests: list[ExecRequest] = []

    async def record(request: ExecRequest, on_output: OutputCallback, cancel: asyncio.Event) -> ExecResult:
        requests.append(request)
        return ExecResult(exit_code=0)

    sandbox.exec_handler = record
    for name, input_ in (
        ("read_file", {"path": "cur/a.txt"}),
        ("patch_file", {"path": "cur/a.txt", "old": "old", "new": "new"}),
        ("list_dir", {"path": "cur"}),
        ("shell", {"command": "true", "cwd": "cur"}),
    ):
        _, result = await allow(asking, session, name, input_)
        assert not result.is_error, (name, result)
    assert sandbox.approved == [
        ("read", "v2/a.txt"),
        ("read", "v2/a.txt"),  # patch_file: the fake's patch reads and writes the approved path
        ("write", "v2/a.txt"),
        ("list", "v2"),
    ]
    assert sandbox.files["/workspace/v2/a.txt"] == b"new text\n"
    assert [(r.cwd, r.approved_cwd) for r in requests] == [("cur", "v2")]


async def test_without_a_question_or_grants_nothing_is_resolved_or_pinned(
    provider: FakeSandboxProvider, session: Session, sandbox: FakeSandbox
) -> None:
    d = make(provider, None)  # autonomous: the fast path
    try:
        result = await d.dispatch(
            ToolUseBlock("tu_1", "write_file", {"path": "cur/b", "content": "y"}), session
        )
    finally:
        await d.aclose()
    assert not result.is_error, result
    assert sandbox.approved == []
    assert [op for op, _ in sandbox.calls] == ["write"]  # no resolve round trip


async def test_a_name_that_is_not_utf8_is_shown_escaped_and_used_exactly(
    asking: ToolDispatcher, session: Session, sandbox: FakeSandbox
) -> None:
    # As list_dir shows a name with the byte 0xe9: the model gives it back escaped.
    asked, result = await allow(asking, session, "write_file", {"path": "caf\\udce9/x", "content": "z"})
    assert asked.payload.projected_modifications == ("caf\\udce9/x",)  # one visible line
    assert not result.is_error, result
    assert sandbox.approved == [("write", "caf\udce9/x")]  # the name itself, not U+FFFD
