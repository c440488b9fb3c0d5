"""Issue 22, item 5 through gRPC (local sandbox): review and audit sessions stage previewing writes,
the agent goes on at once, the session's reads see the staged content, and a human lists, applies
(per file in review, all or nothing in audit) or discards the changes. The Docker test is
tests/integration/grpc/test_review_docker.py; a restart keeping them, tests/server/persistence/test_restart.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from dispatcher.client import AsyncDispatcherClient, RequestFailed
from dispatcher.core.types import ToolResultBlock
from dispatcher.v1 import dispatcher_pb2 as pb
from tests.events import StagedApplied, StagedDiscarded, ToolConfirmationRequested
from tests.server.conftest import TOKEN_BETA, Harness, ServerFactory
from tests.server.helpers import next_event, text_of


async def _rpc(client: AsyncDispatcherClient, name: str, request: Any) -> Any:
    return await client._unary(getattr(client._stub, name), request)


async def _list(client: AsyncDispatcherClient, sid: str) -> list[pb.StagedChange]:
    resp = await _rpc(client, "ListStagedChanges", pb.ListStagedChangesRequest(session_id=sid))
    return list(resp.changes)


async def _apply(client: AsyncDispatcherClient, sid: str, *ids: str) -> pb.ApplyStagedChangesResponse:
    reply: pb.ApplyStagedChangesResponse = await _rpc(
        client, "ApplyStagedChanges", pb.ApplyStagedChangesRequest(session_id=sid, ids=ids)
    )
    return reply


async def _call(
    client: AsyncDispatcherClient, sid: str, name: str, tool_input: dict[str, Any]
) -> ToolResultBlock:
    return await asyncio.wait_for(client.call(sid, name, tool_input), 20)


async def test_review_stages_reads_back_lists_applies_one_and_refuses_one_changed_underneath(
    harness: Harness,
) -> None:
    client = harness.client()  # alpha: writes ask in cautious mode, shell runs unasked
    sid = (await client.create_session(mode="review")).session_id
    root = harness.tmp / "ws-alpha" / "default"
    (root / "notes.txt").write_text("one\ntwo\n")

    staged = await _call(client, sid, "patch_file", {"path": "notes.txt", "old": "two", "new": "TWO"})
    assert not staged.is_error and "not yet on disk" in text_of(staged)
    change_id = staged.metadata["staged"]
    created = await _call(client, sid, "write_file", {"path": "new.txt", "content": "fresh\n"})
    assert not created.is_error, text_of(created)
    assert text_of(await _call(client, sid, "read_file", {"path": "notes.txt"})) == "one\nTWO\n"
    assert (root / "notes.txt").read_text() == "one\ntwo\n" and not (root / "new.txt").exists()
    listing = text_of(await _call(client, sid, "list_dir", {}))
    assert "new.txt" in listing.splitlines() and "new.txt (6 bytes)" in listing
    on_disk = await _call(client, sid, "shell", {"command": "cat notes.txt; ls"})
    assert text_of(on_disk) == "one\ntwo\nnotes.txt\n"  # shell sees the disk

    changes = await _list(client, sid)
    assert [(c.id, c.path, c.kind) for c in changes] == [
        (change_id, "notes.txt", pb.STAGED_CHANGE_KIND_MODIFY),
        (created.metadata["staged"], "new.txt", pb.STAGED_CHANGE_KIND_CREATE),
    ]
    assert "--- a/notes.txt" in changes[0].diff and "-two\n+TWO\n" in changes[0].diff
    assert "--- /dev/null" in changes[1].diff and changes[1].size == 6
    assert changes[0].stage_time.seconds > 0

    applied = await _apply(client, sid, change_id)
    assert list(applied.applied_ids) == [change_id] and not applied.refused
    assert (root / "notes.txt").read_text() == "one\nTWO\n"
    event = await next_event(client, sid, StagedApplied)
    assert event.tool_use_id == "" and event.payload.change_ids == (change_id,)

    (root / "new.txt").write_text("made by someone else\n")  # underneath the staged creation
    refused = await _apply(client, sid)
    assert not refused.applied_ids and [r.id for r in refused.refused] == [created.metadata["staged"]]
    assert "new.txt was created on disk" in refused.refused[0].reason
    assert (root / "new.txt").read_text() == "made by someone else\n"
    assert [c.id for c in await _list(client, sid)] == [created.metadata["staged"]]  # still staged
    audit = (harness.tmp / "home" / "audit.jsonl").read_text()
    assert audit.count('"kind": "staged.applied"') == 2 and '"decision": "staged"' in audit


async def test_audit_applies_all_or_nothing_and_discards(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    sid = (await client.create_session(mode="audit")).session_id
    root = harness.tmp / "ws-beta" / "default"
    (root / "b.txt").write_text("b1\n")
    for path in ("a.txt", "b.txt"):
        result = await _call(client, sid, "write_file", {"path": path, "content": "v2\n"})
        assert not result.is_error and result.metadata["staged"], text_of(result)
    (root / "b.txt").write_text("b changed\n")

    nothing = await _apply(client, sid)
    assert not nothing.applied_ids and len(nothing.refused) == 2
    assert not (root / "a.txt").exists() and (root / "b.txt").read_text() == "b changed\n"
    by_path = {r.path: r.reason for r in nothing.refused}
    assert "b.txt changed on disk" in by_path["b.txt"] and "as a whole" in by_path["a.txt"]

    b_id = next(c.id for c in await _list(client, sid) if c.path == "b.txt")
    discarded = await _rpc(
        client, "DiscardStagedChanges", pb.DiscardStagedChangesRequest(session_id=sid, ids=[b_id])
    )
    assert list(discarded.discarded_ids) == [b_id]
    assert (await next_event(client, sid, StagedDiscarded)).payload.paths == ("b.txt",)
    assert list((await _apply(client, sid)).applied_ids) and (root / "a.txt").read_text() == "v2\n"
    assert await _list(client, sid) == []
    with pytest.raises(RequestFailed) as unknown:
        await _apply(client, sid, "stg_unknown")
    assert unknown.value.code == "NOT_FOUND" and "stg_unknown" in unknown.value.details


async def test_staging_beyond_the_bounds_is_the_calls_error(make_server: ServerFactory) -> None:
    harness = await make_server(dispatcher={"max_staged_changes": 1, "max_staged_bytes": 4096})
    client = harness.client(TOKEN_BETA)
    sid = (await client.create_session(mode="review")).session_id
    assert not (await _call(client, sid, "write_file", {"path": "a", "content": "1"})).is_error
    second = await _call(client, sid, "write_file", {"path": "b", "content": "2"})
    assert second.is_error and "dispatcher.max_staged_changes" in text_of(second)
    big = await _call(client, sid, "write_file", {"path": "a", "content": "x" * 5000})
    assert big.is_error and "dispatcher.max_staged_bytes" in text_of(big)
    assert [c.size for c in await _list(client, sid)] == [1]


async def test_another_tenant_cannot_see_or_apply_a_sessions_staged_changes(harness: Harness) -> None:
    owner, other = harness.client(TOKEN_BETA), harness.client()
    sid = (await owner.create_session(mode="review")).session_id
    assert not (await _call(owner, sid, "write_file", {"path": "a", "content": "1"})).is_error
    for call in (_list(other, sid), _apply(other, sid)):
        with pytest.raises(RequestFailed) as failed:
            await call
        assert failed.value.code == "NOT_FOUND"


async def test_resolve_confirmation_says_whether_the_answer_was_remembered(harness: Harness) -> None:
    """Issue 22: ``approve --remember`` must not claim what did not happen."""
    client = harness.client(TOKEN_BETA)  # beta: shell asks
    sid = (await client.create_session(mode="review")).session_id
    for remember in (False, True):
        after = (await client.get_session(sid)).last_event_seq
        task = asyncio.create_task(_call(client, sid, "shell", {"command": "true"}))
        request = await next_event(client, sid, ToolConfirmationRequested, after_seq=after)
        req = pb.ResolveConfirmationRequest(
            session_id=sid,
            request_id=str(request.payload.request_id),
            decision=pb.DECISION_ALLOW,
            remember=remember,
        )
        resp = await _rpc(client, "ResolveConfirmation", req)
        assert resp.applied and resp.remembered is remember
        assert not (await task).is_error
        again = await _rpc(client, "ResolveConfirmation", req)  # too late: nothing more remembered
        assert not again.applied and not again.remembered


async def test_cli_shows_applies_and_discards_staged_changes(
    harness: Harness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatcher import cli
    from dispatcher.cli.output import EXIT_BY_CODE, EXIT_TOOL_ERROR

    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_BETA)

    async def run(*argv: str) -> int:
        return await asyncio.to_thread(cli.main, [*argv[:1], "--server", harness.target, *argv[1:]])

    client = harness.client(TOKEN_BETA)
    sid = (await client.create_session(mode="review")).session_id
    root = harness.tmp / "ws-beta" / "default"
    (root / "a.txt").write_text("old\n")
    a = (await _call(client, sid, "write_file", {"path": "a.txt", "content": "new\n"})).metadata["staged"]
    b = (await _call(client, sid, "write_file", {"path": "b.txt", "content": "b\n"})).metadata["staged"]
    assert [(c.id, c.kind) for c in await client.list_staged(sid)] == [(a, "modify"), (b, "create")]

    assert await run("staged", sid) == 0
    shown = capsys.readouterr().out
    assert f"{a}  modify  a.txt  (4 bytes, staged " in shown and "-old\n+new\n" in shown
    assert f"{b}  create  b.txt" in shown and "--- /dev/null" in shown
    assert await run("staged", sid, "apply", a) == 0
    assert capsys.readouterr().out == f"applied {a}\n" and (root / "a.txt").read_text() == "new\n"
    (root / "b.txt").write_text("theirs\n")
    assert await run("staged", sid, "apply", "--json") == EXIT_TOOL_ERROR
    refused = json.loads(capsys.readouterr().out)
    assert refused["applied"] == [] and refused["refused"][0]["id"] == b
    assert await run("staged", sid, "discard") == 0
    assert capsys.readouterr().out == f"discarded 1: {b}\n" and await client.list_staged(sid) == []
    assert await run("staged", sid, "apply", "stg_nope") == EXIT_BY_CODE["NOT_FOUND"]


async def test_approve_remember_says_what_was_remembered(
    harness: Harness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatcher import cli

    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_BETA)
    client = harness.client(TOKEN_BETA)
    sid = (await client.create_session(mode="review")).session_id
    call = asyncio.create_task(_call(client, sid, "shell", {"command": "true"}))
    request = await next_event(client, sid, ToolConfirmationRequested)
    argv = ["approve", "--server", harness.target, sid, str(request.payload.request_id), "--remember"]
    assert await asyncio.to_thread(cli.main, argv) == 0
    out = capsys.readouterr()
    assert out.out == "applied: allow\n" and "remembered for the rest of the session" in out.err
    assert not (await call).is_error
    late = await asyncio.to_thread(cli.main, argv)  # answered already: nothing more is remembered
    out = capsys.readouterr()
    assert late == 1 and "not applied" in out.out and "nothing was remembered" in out.err
