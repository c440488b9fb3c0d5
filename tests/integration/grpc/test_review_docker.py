"""Review and audit modes in a real container (issue 22, item 5): writes are staged, the sandbox's
files stay as they were until a human applies them, and the apply is a compare-and-swap done by
the in-container agent just before its rename (per file in review, all or nothing in audit)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.client import AsyncDispatcherClient
from dispatcher.v1 import dispatcher_pb2 as pb
from tests.integration.grpc.conftest import unmount_under
from tests.server.conftest import TOKEN_BETA, Harness
from tests.server.helpers import text_of

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def _no_mount_left(tmp_path: Path) -> Iterator[None]:
    """Torn down after the server: the tenant roots it bind-mounted must not outlive the test."""
    yield
    unmount_under(tmp_path)


async def _sh(client: AsyncDispatcherClient, sid: str, command: str) -> str:
    result = await client.call(sid, "shell", {"command": command})
    assert not result.is_error, text_of(result)
    return text_of(result)


async def _apply(client: AsyncDispatcherClient, sid: str, *ids: str) -> Any:
    return await client._unary(
        client._stub.ApplyStagedChanges, pb.ApplyStagedChangesRequest(session_id=sid, ids=ids)
    )


async def _list(client: AsyncDispatcherClient, sid: str) -> list[Any]:
    resp = await client._unary(client._stub.ListStagedChanges, pb.ListStagedChangesRequest(session_id=sid))
    return list(resp.changes)


async def test_review_stages_in_the_sandbox_and_applies_per_file(docker_harness: Harness) -> None:
    client = docker_harness.client(TOKEN_BETA)
    root = docker_harness.tmp / "ws-beta" / "default"
    setup = (await client.create_session(mode="autonomous")).session_id  # same workspace, runs unasked
    await _sh(client, setup, "printf 'a\\nb\\n' > f.py && chmod 640 f.py")
    sid = (await client.create_session(mode="review")).session_id

    patched = await client.call(sid, "patch_file", {"path": "f.py", "old": "b\n", "new": "B\n"})
    created = await client.call(sid, "write_file", {"path": "pkg/new.txt", "content": "new\n"})
    assert not patched.is_error and not created.is_error, text_of(patched) + text_of(created)
    assert (root / "f.py").read_text() == "a\nb\n" and not (root / "pkg").exists()
    assert text_of(await client.call(sid, "read_file", {"path": "f.py"})) == "a\nB\n"
    assert "pkg/" in text_of(await client.call(sid, "list_dir", {}))
    assert await _sh(client, setup, "cat f.py; ls") == "a\nb\nf.py\n"  # the sandbox's disk: unchanged

    changes = await _list(client, sid)
    assert [c.path for c in changes] == ["f.py", "pkg/new.txt"] and "-b\n+B\n" in changes[0].diff
    applied = await _apply(client, sid, patched.metadata["staged"])
    assert list(applied.applied_ids) == [patched.metadata["staged"]]
    assert (root / "f.py").read_text() == "a\nB\n"
    assert (root / "f.py").stat().st_mode & 0o777 == 0o640  # replaced in place, mode kept

    await _sh(client, setup, "mkdir -p pkg && echo theirs > pkg/new.txt")  # a command, underneath
    refused = await _apply(client, sid)
    assert not refused.applied_ids and "pkg/new.txt was created on disk" in refused.refused[0].reason
    assert (root / "pkg" / "new.txt").read_text() == "theirs\n"
    assert not [p.name for p in root.rglob("*") if ".tmp" in p.name]


async def test_review_applies_a_crlf_patch_to_an_lf_file_as_every_mode_does(docker_harness: Harness) -> None:
    """Issue 19: ``old`` with CRLF in an LF file is applied by patch_file in every mode."""
    client = docker_harness.client(TOKEN_BETA)
    root = docker_harness.tmp / "ws-beta" / "default"
    setup = (await client.create_session(mode="autonomous")).session_id
    await _sh(client, setup, "printf 'x\\na\\nb\\n' > crlf.txt")
    sid = (await client.create_session(mode="review")).session_id
    staged = await client.call(sid, "patch_file", {"path": "crlf.txt", "old": "a\r\nb", "new": "A\r\nB"})
    assert not staged.is_error, text_of(staged)  # not refused at staging
    (change,) = await _list(client, sid)
    assert "-a\n-b\n+A\n+B\n" in change.diff and (root / "crlf.txt").read_bytes() == b"x\na\nb\n"
    assert len((await _apply(client, sid)).applied_ids) == 1
    assert (root / "crlf.txt").read_bytes() == b"x\nA\nB\n"


async def test_audit_writes_nothing_when_one_file_changed_underneath(docker_harness: Harness) -> None:
    client = docker_harness.client(TOKEN_BETA)
    root = docker_harness.tmp / "ws-beta" / "default"
    setup = (await client.create_session(mode="autonomous")).session_id
    await _sh(client, setup, "echo one > one.txt && echo two > two.txt")
    sid = (await client.create_session(mode="audit")).session_id
    for path in ("one.txt", "two.txt"):
        result = await client.call(sid, "write_file", {"path": path, "content": "staged\n"})
        assert not result.is_error and result.metadata["staged"], text_of(result)
    await _sh(client, setup, "echo changed > two.txt")
    outcome = await _apply(client, sid)
    assert not outcome.applied_ids and len(outcome.refused) == 2
    assert (root / "one.txt").read_text() == "one\n" and (root / "two.txt").read_text() == "changed\n"


async def test_a_change_after_the_servers_check_is_refused_by_the_agent_not_overwritten(
    docker_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The residual window of an audit apply: a file changes between the server's check of the
    batch and its write. The agent compares the base hash just before its rename and refuses;
    the response says exactly what was written."""
    from dispatcher.core.staging import apply as staged_apply

    client = docker_harness.client(TOKEN_BETA)
    root = docker_harness.tmp / "ws-beta" / "default"
    setup = (await client.create_session(mode="autonomous")).session_id
    await _sh(client, setup, "echo a > a.txt && echo b > b.txt")
    sid = (await client.create_session(mode="audit")).session_id
    ids = []
    for path in ("a.txt", "b.txt"):
        ids.append(
            (await client.call(sid, "write_file", {"path": path, "content": "new\n"})).metadata["staged"]
        )
    real_check = staged_apply._changed_underneath

    async def check_then_change(*args: Any) -> dict[str, str]:
        found = await real_check(*args)
        (root / "b.txt").write_text("later\n")  # after the check, before the writes
        return found

    monkeypatch.setattr(staged_apply, "_changed_underneath", check_then_change)
    outcome = await _apply(client, sid)
    assert list(outcome.applied_ids) == [ids[0]] and [r.id for r in outcome.refused] == [ids[1]]
    assert "b.txt changed on disk" in outcome.refused[0].reason
    assert (root / "a.txt").read_text() == "new\n" and (root / "b.txt").read_text() == "later\n"
    assert [c.id for c in await _list(client, sid)] == [ids[1]]
    assert not [p.name for p in root.iterdir() if ".tmp" in p.name]
