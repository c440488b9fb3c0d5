"""The ten steps of spec 000 §4 with their events, over the fake sandbox."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from dispatcher.config.load import parse_policy
from dispatcher.core import (
    Capabilities,
    ConfirmationPolicy,
    Decision,
    FsGrant,
    MemoryAuditLog,
    Role,
    Session,
    SideEffect,
    TextBlock,
    ToolDispatcher,
    ToolErrorClass,
    ToolUseBlock,
)
from dispatcher.core.events import bus as ev
from dispatcher.core.events.payloads import to_dict
from dispatcher.sandbox.fake import FakeSandboxProvider
from tests.clock import ManualClock
from tests.events import (
    ToolCalled,
    ToolCompleted,
    ToolConfirmationRequested,
    ToolConfirmationResolved,
    ToolFailed,
    ToolInputInvalid,
    ToolOutputDelta,
    event_of,
    events_of,
    is_event,
)
from tests.unit.core.toolkit import SlowTool, StubbornTool, definition, next_event, types_of


async def run(d: ToolDispatcher, session: Session, name: str, input_: Any, tid: str = "tu_1") -> Any:
    return await d.dispatch(ToolUseBlock(tid, name, input_), session, turn_id="turn_1")


def history(d: ToolDispatcher, session: Session) -> list[ev.Event]:
    return list(d.events(session.session_id).subscribe(after_seq=0)._pending)


async def test_read_file_example_emits_called_then_completed(
    dispatcher: ToolDispatcher, session: Session, provider: FakeSandboxProvider
) -> None:
    dispatcher.open_session(session)
    provider.sandbox_for(session).files["/workspace/README.md"] = b"# Project Foo\n"
    result = await run(dispatcher, session, "read", {"path": "README.md"}, "tu_01HZ_a")
    assert result.tool_use_id == "tu_01HZ_a"
    assert not result.is_error and result.error_class is None
    assert result.content == (TextBlock("# Project Foo\n"),)
    events = history(dispatcher, session)
    assert types_of(events) == [ev.TOOL_CALLED, ev.TOOL_COMPLETED]
    called = event_of(events[0], ToolCalled)
    assert called.payload.tool_name == "read" and called.payload.side_effect == "read"
    assert (called.tool_use_id, called.turn_id, called.session_id) == ("tu_01HZ_a", "turn_1", "s1")
    assert [e.seq for e in events] == sorted({e.seq for e in events})


async def test_unknown_tool_is_not_found_result(dispatcher: ToolDispatcher, session: Session) -> None:
    result = await run(dispatcher, session, "Echo", {"text": "x"})  # names are exact-case
    assert result.is_error and result.error_class is ToolErrorClass.NOT_FOUND
    (failed,) = history(dispatcher, session)
    assert is_event(failed, ToolFailed) and failed.payload.error_class == "not_found"


@pytest.mark.parametrize(
    ("input_", "fragment"),
    [
        ({"seconds": "soon"}, "$.seconds: 'soon' is not of type 'number'"),
        ({}, "$: 'seconds' is a required property"),
        ({"seconds": 1, "extra": 1}, "Additional properties are not allowed"),
        ([1, 2], "$: input must be a JSON object, got list"),
        ("text", "$: input must be a JSON object, got str"),
        (None, "$: input must be a JSON object, got null"),
    ],
)
async def test_invalid_input_reports_every_violation_with_its_path(
    dispatcher: ToolDispatcher, session: Session, input_: Any, fragment: str
) -> None:
    result = await run(dispatcher, session, "slow", input_)
    assert result.is_error and result.error_class is ToolErrorClass.VALIDATION_ERROR
    assert fragment in result.content[0].text
    (invalid,) = history(dispatcher, session)
    assert is_event(invalid, ToolInputInvalid)
    assert any(fragment in e for e in invalid.payload.errors)


async def test_several_violations_are_all_reported(dispatcher: ToolDispatcher, session: Session) -> None:
    result = await run(dispatcher, session, "write", {"path": 3, "content": None})
    text = result.content[0].text
    assert "$.path: 3 is not of type 'string'" in text and "$.content: None is not of type 'string'" in text


@pytest.mark.parametrize(
    "path", ["../../etc/passwd", "/etc/passwd", "sub/../../x", "a\x00b", "/workspace/../etc"]
)
async def test_workspace_escape_is_permission_denied_before_the_sandbox_is_touched(
    dispatcher: ToolDispatcher, session: Session, provider: FakeSandboxProvider, path: str
) -> None:
    result = await run(dispatcher, session, "read", {"path": path})
    assert result.is_error and result.error_class is ToolErrorClass.PERMISSION_DENIED
    assert repr(path) in result.content[0].text
    assert provider.sandbox_for(session).calls == []
    (failed,) = history(dispatcher, session)
    assert is_event(failed, ToolFailed) and failed.payload.error_class == "permission_denied"


async def test_write_prompts_and_a_deny_is_user_denied(
    dispatcher: ToolDispatcher, session: Session, provider: FakeSandboxProvider
) -> None:
    bus = dispatcher.open_session(session)
    async with bus.subscribe() as sub:
        task = asyncio.create_task(run(dispatcher, session, "write", {"path": "src/auth.ts", "content": "x"}))
        asked = await next_event(sub, ToolConfirmationRequested)
        assert asked.payload.projected_modifications == ("src/auth.ts",)
        assert asked.payload.side_effect == "write" and asked.payload.tool_name == "write"
        assert dispatcher.resolve_confirmation("s1", asked.payload.request_id, Decision.DENY) == (
            True,
            Decision.DENY,
        )
        result = await task
    assert result.error_class is ToolErrorClass.USER_DENIED
    assert result.content[0].text == "User denied this operation."
    assert "/workspace/src/auth.ts" not in provider.sandbox_for(session).files
    assert types_of(history(dispatcher, session)) == [
        ev.TOOL_CONFIRMATION_REQUESTED,
        ev.TOOL_CONFIRMATION_RESOLVED,
        ev.TOOL_FAILED,
    ]


async def test_prompt_allow_runs_and_first_answer_wins(
    dispatcher: ToolDispatcher, session: Session, provider: FakeSandboxProvider
) -> None:
    bus = dispatcher.open_session(session)
    async with bus.subscribe() as sub:
        task = asyncio.create_task(run(dispatcher, session, "write", {"path": "a.txt", "content": "hi"}))
        request_id = (await next_event(sub, ToolConfirmationRequested)).payload.request_id
        assert dispatcher.resolve_confirmation("s1", request_id, Decision.ALLOW) == (True, Decision.ALLOW)
        assert dispatcher.resolve_confirmation("s1", request_id, Decision.DENY) == (False, Decision.ALLOW)
        result = await task
    assert not result.is_error and result.files_modified == ("a.txt",)
    assert provider.sandbox_for(session).files["/workspace/a.txt"] == b"hi"
    resolved = events_of(history(dispatcher, session), ToolConfirmationResolved)
    assert [e.payload.decision for e in resolved] == ["allow"]


async def test_confirmation_timeout(provider: FakeSandboxProvider, session: Session) -> None:
    from dispatcher.core import DispatcherConfig
    from tests.unit.core.toolkit import WriteTool

    d = ToolDispatcher(provider, config=DispatcherConfig(confirmation_timeout=0.05))
    d.register(WriteTool)
    result = await run(d, session, "write", {"path": "a", "content": "b"})
    assert result.error_class is ToolErrorClass.CONFIRMATION_TIMEOUT
    resolved = events_of(history(d, session), ToolConfirmationResolved)
    assert to_dict(resolved[0].payload) == {
        "request_id": resolved[0].payload.request_id,
        "decision": "deny",
        "reason": "timeout",
    }
    # A late answer learns that the request already ended as a deny.
    assert d.resolve_confirmation("s1", resolved[0].payload.request_id, Decision.ALLOW) == (
        False,
        Decision.DENY,
    )
    await d.aclose()


async def test_prompt_once_remembers_the_answer_per_tool(
    provider: FakeSandboxProvider, session: Session
) -> None:
    from tests.unit.core.toolkit import ShellLikeTool, WriteTool

    policy = parse_policy({"per_tool": {"write": "prompt_once"}})
    d = ToolDispatcher(provider, policy=policy)
    d.register(WriteTool)
    d.register(ShellLikeTool)
    bus = d.open_session(session)
    async with bus.subscribe() as sub:
        first = asyncio.create_task(run(d, session, "write", {"path": "a", "content": "1"}, "tu_1"))
        rid = (await next_event(sub, ToolConfirmationRequested)).payload.request_id
        d.resolve_confirmation("s1", rid, Decision.ALLOW)
        assert not (await first).is_error
    second = await run(d, session, "write", {"path": "b", "content": "2"}, "tu_2")
    assert not second.is_error
    asked = events_of(history(d, session), ToolConfirmationRequested)
    assert len(asked) == 1  # the second write was not asked about
    await d.aclose()


async def test_remember_flag_approves_the_tool_for_the_session(
    dispatcher: ToolDispatcher, session: Session
) -> None:
    bus = dispatcher.open_session(session)
    async with bus.subscribe() as sub:
        first = asyncio.create_task(run(dispatcher, session, "run", {"command": "ls"}, "tu_1"))
        rid = (await next_event(sub, ToolConfirmationRequested)).payload.request_id
        dispatcher.resolve_confirmation("s1", rid, Decision.ALLOW, remember=True)
        await first
    second = await run(dispatcher, session, "run", {"command": "ls"}, "tu_2")
    assert not second.is_error and second.command_executed == "ls"


async def test_always_prompt_is_not_lowered_by_autonomous_or_remembered(
    provider: FakeSandboxProvider, session: Session
) -> None:
    class Risky:
        definition = definition("risky", SideEffect.NONE, always_prompt=True)

        async def execute(self, input: dict[str, Any], context: Any) -> Any:
            from dispatcher.core import ToolOutput

            return ToolOutput([TextBlock("done")])

        async def cancel(self) -> bool:
            return False

    d = ToolDispatcher(provider, policy=ConfirmationPolicy.preset("autonomous"))
    d.register(Risky)
    bus = d.open_session(session)
    async with bus.subscribe() as sub:
        for i in range(2):
            task = asyncio.create_task(run(d, session, "risky", {}, f"tu_{i}"))
            rid = (await next_event(sub, ToolConfirmationRequested)).payload.request_id
            d.resolve_confirmation("s1", rid, Decision.ALLOW, remember=True)
            assert not (await task).is_error
    await d.aclose()


async def test_policy_deny_never_executes(
    provider: FakeSandboxProvider, session: Session, audit: MemoryAuditLog
) -> None:
    from tests.unit.core.toolkit import ShellLikeTool

    d = ToolDispatcher(provider, policy=parse_policy({"default": {"EXECUTE": "deny"}}), audit=audit)
    d.register(ShellLikeTool)
    result = await run(d, session, "run", {"command": "rm -rf /"})
    assert result.error_class is ToolErrorClass.PERMISSION_DENIED
    assert (
        audit.records[-1]["kind"] == "tool.call.denied" and audit.records[-1]["decision"] == "policy_denied"
    )
    await d.aclose()


async def test_capabilities_are_checked_before_confirmation_and_audited(
    dispatcher: ToolDispatcher, tmp_path: Any, audit: MemoryAuditLog
) -> None:
    caps = Capabilities(
        allowed_tools=frozenset({"read", "write"}), fs_grants=(FsGrant("docs", "r"), FsGrant("src", "rw"))
    )
    session = Session("s2", str(tmp_path), tenant_id="t1", capabilities=caps)
    assert [d.name for d in dispatcher.get_definitions_for_session(session)] == ["read", "write"]
    not_allowed = await run(dispatcher, session, "echo", {"text": "x"})
    assert not_allowed.error_class is ToolErrorClass.PERMISSION_DENIED
    read_ungranted = await run(dispatcher, session, "read", {"path": "secrets/key"})
    assert read_ungranted.error_class is ToolErrorClass.PERMISSION_DENIED
    write_readonly = await run(dispatcher, session, "write", {"path": "docs/x.md", "content": "x"})
    assert write_readonly.error_class is ToolErrorClass.PERMISSION_DENIED
    assert "not granted for write access" in write_readonly.content[0].text
    # No confirmation was ever requested for the denied calls.
    assert ev.TOOL_CONFIRMATION_REQUESTED not in types_of(history(dispatcher, session))
    denied = [r for r in audit.records if r["kind"] == "tool.call.denied"]
    assert [r["decision"] for r in denied] == ["capability_denied", "fs_denied", "fs_denied"]
    assert {r["tenant"] for r in denied} == {"t1"}


async def test_worker_sessions_do_not_see_main_only_tools(
    provider: FakeSandboxProvider, tmp_path: Any
) -> None:
    class Memory:
        definition = definition("memory_add", main_only=True)

        async def execute(self, input: dict[str, Any], context: Any) -> Any:
            raise AssertionError("must not run for a worker")

        async def cancel(self) -> bool:
            return False

    d = ToolDispatcher(provider)
    d.register(Memory)
    worker = Session("w", str(tmp_path), role=Role.WORKER)
    assert d.get_definitions_for_session(worker) == []
    assert [x.name for x in d.get_definitions_for_session(Session("m", str(tmp_path)))] == ["memory_add"]
    assert (await run(d, worker, "memory_add", {})).error_class is ToolErrorClass.NOT_FOUND
    await d.aclose()


async def test_non_tool_error_becomes_opaque_execution_error_with_traceback_logged(
    dispatcher: ToolDispatcher, session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="dispatcher.core"):
        result = await run(dispatcher, session, "raiser", {})
    assert result.error_class is ToolErrorClass.EXECUTION_ERROR
    assert result.content[0].text == "Tool 'raiser' failed with an internal error"
    assert "/srv/private" not in result.content[0].text
    record = next(r for r in caplog.records if r.exc_info)
    assert isinstance(record.exc_info[1], RuntimeError)  # type: ignore[index]


async def test_timeout_keeps_partial_output(provider: FakeSandboxProvider, session: Session) -> None:
    from dispatcher.core import DispatcherConfig

    d = ToolDispatcher(provider, config=DispatcherConfig(default_timeout=0.05))
    d.register(SlowTool)
    result = await run(d, session, "slow", {"seconds": 30})
    assert result.error_class is ToolErrorClass.TIMEOUT
    texts = [b.text for b in result.content]
    assert texts[0].startswith("Tool 'slow' timed out after 0.05 s") and "partial: working" in texts
    failed = history(d, session)[-1]
    assert is_event(failed, ToolFailed) and failed.payload.partial_output == "partial: working"
    await d.aclose()


async def test_per_tool_timeout_overrides_default(provider: FakeSandboxProvider, session: Session) -> None:
    class Quick(SlowTool):
        definition = definition("quick", input_schema=SlowTool.definition.input_schema, timeout_seconds=0.05)

    d = ToolDispatcher(provider)  # default 60 s would not fire
    d.register(Quick)
    assert (await run(d, session, "quick", {"seconds": 30})).error_class is ToolErrorClass.TIMEOUT
    await d.aclose()


async def test_cancel_session_tools_cancels_with_partial_output(
    dispatcher: ToolDispatcher, session: Session
) -> None:
    bus = dispatcher.open_session(session)
    async with bus.subscribe() as sub:
        task = asyncio.create_task(run(dispatcher, session, "slow", {"seconds": 30}))
        await next_event(sub, ToolOutputDelta)
        await dispatcher.cancel_session_tools("s1")
        assert task.done()  # cancel_session_tools returns once the call has ended
    result = task.result()
    assert result.error_class is ToolErrorClass.CANCELLED
    assert "partial: working" in [b.text for b in result.content]
    assert types_of(history(dispatcher, session)) == [ev.TOOL_CALLED, ev.TOOL_OUTPUT_DELTA, ev.TOOL_FAILED]


async def test_a_tool_ignoring_cancel_is_abandoned(
    dispatcher: ToolDispatcher, session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    StubbornTool.release = asyncio.Event()
    bus = dispatcher.open_session(session)
    async with bus.subscribe() as sub:
        task = asyncio.create_task(run(dispatcher, session, "stubborn", {}))
        await next_event(sub, ToolCalled)
        with caplog.at_level(logging.WARNING, logger="dispatcher.core"):
            await dispatcher.cancel_session_tools("s1")  # abandon_after is 0.3 s in the fixture
    result = await task
    assert result.error_class is ToolErrorClass.CANCELLED
    assert any("abandoning tool stubborn" in r.getMessage() for r in caplog.records)


async def test_cancel_tool_uses_only_cancels_the_named_calls(
    dispatcher: ToolDispatcher, session: Session
) -> None:
    bus = dispatcher.open_session(session)
    async with bus.subscribe() as sub:
        a = asyncio.create_task(run(dispatcher, session, "slow", {"seconds": 30}, "a"))
        b = asyncio.create_task(run(dispatcher, session, "slow", {"seconds": 0.3}, "b"))
        await next_event(sub, ToolOutputDelta)
        await next_event(sub, ToolOutputDelta)
        await dispatcher.cancel_tool_uses("s1", ["a"])
    assert (await a).error_class is ToolErrorClass.CANCELLED
    assert not (await b).is_error


async def test_three_reads_run_concurrently_and_return_one_to_one(
    dispatcher: ToolDispatcher, session: Session, provider: FakeSandboxProvider
) -> None:
    box = provider.sandbox_for(session)
    for name in "abc":
        box.files[f"/workspace/{name}.txt"] = name.encode()
    uses = [ToolUseBlock(f"tu_{n}", "read", {"path": f"{n}.txt"}) for n in "abc"]
    results = await dispatcher.dispatch_all(uses, session, turn_id="t")
    assert [(r.tool_use_id, r.content[0]) for r in results] == [
        ("tu_a", TextBlock("a")),
        ("tu_b", TextBlock("b")),
        ("tu_c", TextBlock("c")),
    ]


async def test_concurrency_is_capped_per_session(provider: FakeSandboxProvider, session: Session) -> None:
    from dispatcher.core import DispatcherConfig, ToolOutput

    running = 0
    peak = 0
    gate = asyncio.Event()

    class Counted:
        definition = definition("counted")

        async def execute(self, input: dict[str, Any], context: Any) -> Any:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            if peak >= 2:
                gate.set()
            await gate.wait()
            await asyncio.sleep(0)
            running -= 1
            return ToolOutput([TextBlock("ok")])

        async def cancel(self) -> bool:
            return False

    d = ToolDispatcher(provider, config=DispatcherConfig(concurrency=2))
    d.register(Counted)
    results = await d.dispatch_all([ToolUseBlock(f"t{i}", "counted", {}) for i in range(6)], session)
    assert all(not r.is_error for r in results) and peak == 2
    await d.aclose()


async def test_success_false_output_is_an_execution_error_keeping_content(
    provider: FakeSandboxProvider, session: Session
) -> None:
    from dispatcher.core import ToolOutput

    class Soft:
        definition = definition("soft")

        async def execute(self, input: dict[str, Any], context: Any) -> Any:
            return ToolOutput([TextBlock("file missing")], success=False, metadata={"exit_code": 2})

        async def cancel(self) -> bool:
            return False

    d = ToolDispatcher(provider)
    d.register(Soft)
    result = await run(d, session, "soft", {})
    assert result.is_error and result.error_class is ToolErrorClass.EXECUTION_ERROR
    assert result.content == (TextBlock("file missing"),) and result.metadata == {"exit_code": 2}
    await d.aclose()


async def test_long_results_are_truncated_head_and_tail(
    provider: FakeSandboxProvider, session: Session
) -> None:
    from dispatcher.core import DispatcherConfig
    from tests.unit.core.toolkit import EchoTool

    d = ToolDispatcher(provider, config=DispatcherConfig(result_budget_chars=200))
    d.register(EchoTool)
    text = "HEAD" + "x" * 5000 + "TAIL"
    result = await run(d, session, "echo", {"text": text})
    out = result.content[0].text
    assert (
        len(out) <= 200 and out.startswith("HEAD") and out.endswith("TAIL") and "characters truncated" in out
    )
    await d.aclose()


async def test_secrets_are_redacted_in_events_and_audit(
    dispatcher: ToolDispatcher, session: Session, audit: MemoryAuditLog
) -> None:
    await run(
        dispatcher,
        session,
        "echo",
        {"text": "curl -H 'Authorization: Bearer abcdefghijklmnop' --password=hunter22"},
    )
    called = event_of(history(dispatcher, session)[0], ToolCalled)
    shown = called.payload.input["text"]
    assert "abcdefghijklmnop" not in shown and "hunter22" not in shown and "[REDACTED]" in shown
    assert "hunter22" not in str(audit.records)
    assert [r["kind"] for r in audit.records] == ["tool.call.dispatched", "tool.call.completed"]
    assert audit.records[-1]["outcome"] == "ok"


async def test_factory_makes_a_fresh_instance_per_call(
    provider: FakeSandboxProvider, session: Session
) -> None:
    from dispatcher.core import ToolOutput

    seen: list[int] = []

    class Tracker:
        definition = definition("tracker")

        async def execute(self, input: dict[str, Any], context: Any) -> Any:
            seen.append(id(self))
            await asyncio.sleep(0)
            return ToolOutput([TextBlock("ok")])

        async def cancel(self) -> bool:
            return False

    d = ToolDispatcher(provider)
    d.register(Tracker)
    await d.dispatch_all([ToolUseBlock(f"t{i}", "tracker", {}) for i in range(3)], session)
    assert len(set(seen)) == 3
    await d.aclose()


async def test_close_session_cancels_and_removes_the_sandbox(
    dispatcher: ToolDispatcher, session: Session, provider: FakeSandboxProvider
) -> None:
    bus = dispatcher.open_session(session)
    async with bus.subscribe() as sub:
        task = asyncio.create_task(run(dispatcher, session, "slow", {"seconds": 30}))
        await next_event(sub, ToolCalled)
        await dispatcher.close_session("s1")
    assert (await task).error_class is ToolErrorClass.CANCELLED
    assert provider.closed == ["s1"]
    with pytest.raises(LookupError):
        dispatcher.events("s1")


async def test_unparsed_json_input_is_a_validation_error(
    dispatcher: ToolDispatcher, session: Session
) -> None:
    from dispatcher.core.types import UnparsedInput

    result = await run(dispatcher, session, "echo", UnparsedInput('{"text": ', "Expecting value: column 10"))
    assert result.error_class is ToolErrorClass.VALIDATION_ERROR
    assert "$: input is not valid JSON: Expecting value: column 10" in result.content[0].text


async def test_event_durations_exclude_the_confirmation_wait(
    provider: FakeSandboxProvider, session: Session
) -> None:
    from dispatcher.core import DispatcherConfig
    from tests.unit.core.toolkit import WriteTool

    clock = ManualClock()
    audit = MemoryAuditLog()
    d = ToolDispatcher(provider, config=DispatcherConfig(confirmation_timeout=5, clock=clock), audit=audit)
    d.register(WriteTool)
    bus = d.open_session(session)
    async with bus.subscribe() as sub:
        task = asyncio.create_task(run(d, session, "write", {"path": "a", "content": "b"}))
        rid = (await next_event(sub, ToolConfirmationRequested)).payload.request_id
        clock.advance(200)  # a human taking their time: that is the point of this test
        d.resolve_confirmation("s1", rid, Decision.ALLOW)
        completed = await next_event(sub, ToolCompleted)
    await task
    assert completed.payload.duration_ms == 0  # the clock moved only while the call waited
    assert audit.records[-1]["duration_ms"] == 200_000  # what the caller waited, wait included
    await d.aclose()


async def test_a_closed_session_is_not_brought_back_by_a_late_dispatch(
    dispatcher: ToolDispatcher, session: Session
) -> None:
    from dispatcher.core import UnknownSessionError

    assert not (await run(dispatcher, session, "echo", {"text": "x"})).is_error
    await dispatcher.close_session("s1")
    with pytest.raises(UnknownSessionError, match="closed"):
        await run(dispatcher, session, "echo", {"text": "late"})
    with pytest.raises(UnknownSessionError):
        dispatcher.events("s1")
