"""Paths are resolved in the sandbox before confirmation; grants apply to where a path really is."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.config.load import parse_policy
from dispatcher.core import (
    Capabilities,
    Decision,
    FsGrant,
    MemoryAuditLog,
    Session,
    ToolDispatcher,
    ToolErrorClass,
    ToolUseBlock,
)
from dispatcher.core.events import bus as ev
from dispatcher.sandbox.fake import FakeSandboxProvider
from tests.events import ToolConfirmationRequested
from tests.unit.core.toolkit import WriteTool, next_event, types_of

GRANTS = Capabilities(fs_grants=(FsGrant("pub", "r"), FsGrant("src", "rw")))


async def run(d: ToolDispatcher, session: Session, name: str, input_: Any) -> Any:
    return await d.dispatch(ToolUseBlock("tu_1", name, input_), session, turn_id="turn_1")


def history(d: ToolDispatcher, session: Session) -> list[ev.Event]:
    return list(d.events(session.session_id).subscribe(after_seq=0)._pending)


async def test_a_symlink_escape_is_denied_before_anyone_is_asked(
    dispatcher: ToolDispatcher, session: Session, provider: FakeSandboxProvider, audit: MemoryAuditLog
) -> None:
    provider.sandbox_for(session).links["out"] = "../../etc"
    result = await run(dispatcher, session, "write", {"path": "out/passwd", "content": "x"})
    assert result.error_class is ToolErrorClass.PERMISSION_DENIED
    assert types_of(history(dispatcher, session)) == [ev.TOOL_FAILED]  # no question, no tool.called
    assert [(r["kind"], r["decision"]) for r in audit.records] == [("tool.call.denied", "workspace_escape")]
    assert not any(op == "write" for op, _ in provider.sandbox_for(session).calls)


async def test_grants_are_checked_on_the_resolved_path(
    dispatcher: ToolDispatcher, tmp_path: Any, provider: FakeSandboxProvider, audit: MemoryAuditLog
) -> None:
    session = Session("s2", str(tmp_path), tenant_id="t1", capabilities=GRANTS)
    sandbox = provider.sandbox_for(session)
    sandbox.links["pub/docs"] = "../secret"
    sandbox.files["/workspace/secret/key"] = b"k"
    sandbox.files["/workspace/pub/readme"] = b"hello"
    read = await run(dispatcher, session, "read", {"path": "pub/docs/key"})
    assert read.error_class is ToolErrorClass.PERMISSION_DENIED
    assert "'secret/key'" in read.content[0].text
    write = await run(dispatcher, session, "write", {"path": "pub/docs/new", "content": "x"})
    assert write.error_class is ToolErrorClass.PERMISSION_DENIED
    assert ev.TOOL_CALLED not in types_of(history(dispatcher, session))
    assert ev.TOOL_CONFIRMATION_REQUESTED not in types_of(history(dispatcher, session))
    assert [r["decision"] for r in audit.records] == ["fs_denied", "fs_denied"]
    assert not any(op in ("read", "write") for op, _ in sandbox.calls)
    ok = await run(dispatcher, session, "read", {"path": "pub/readme"})
    assert not ok.is_error and ok.content[0].text == "hello"


async def test_a_link_into_a_grant_is_allowed_and_the_question_shows_the_real_path(
    dispatcher: ToolDispatcher, tmp_path: Any, provider: FakeSandboxProvider
) -> None:
    session = Session("s3", str(tmp_path), capabilities=GRANTS)
    provider.sandbox_for(session).links["src/current"] = "v2"
    bus = dispatcher.open_session(session)
    async with bus.subscribe() as sub:
        task = asyncio.create_task(
            run(dispatcher, session, "write", {"path": "src/current/a", "content": "x"})
        )
        asked = await next_event(sub, ToolConfirmationRequested)
        assert asked.payload.projected_modifications == ("src/v2/a",)
        dispatcher.resolve_confirmation("s3", asked.payload.request_id, Decision.ALLOW)
        result = await task
    assert not result.is_error


async def test_a_policy_deny_does_not_touch_the_sandbox(provider: FakeSandboxProvider, tmp_path: Any) -> None:
    d = ToolDispatcher(provider, policy=parse_policy({"default": {"WRITE": "deny"}}))
    d.register(WriteTool)
    session = Session("s4", str(tmp_path))
    result = await run(d, session, "write", {"path": "a", "content": "x"})
    assert result.error_class is ToolErrorClass.PERMISSION_DENIED
    assert provider.sandbox_for(session).calls == []
    await d.aclose()
