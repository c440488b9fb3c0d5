"""The agent resolves paths for the host and enforces the session's fs grants where files are opened."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from dispatcher.core import (
    Capabilities,
    ConfirmationPolicy,
    FsGrant,
    MemoryAuditLog,
    Session,
    ToolDispatcher,
    ToolErrorClass,
    ToolUseBlock,
)
from dispatcher.core.errors import ToolPermissionDenied, WorkspaceEscapeError
from dispatcher.core.events import bus as ev
from dispatcher.core.sandbox_api import ExecRequest
from dispatcher.sandbox.agent.protocol import parse_grants
from dispatcher.sandbox.agent.workspace import OpError, Workspace
from dispatcher.sandbox.grants import agent_grant_args
from dispatcher.sandbox.local import LocalSandbox, LocalSandboxProvider
from dispatcher.tools import builtin_factories

GRANTS = Capabilities(fs_grants=(FsGrant("pub", "r"), FsGrant("src", "rw")))


@pytest.fixture
def tree(workspace: Path) -> Path:
    """pub (read), src (read-write), secret (no grant) and the link pub/docs -> ../secret."""
    for name in ("pub", "src", "secret"):
        (workspace / name).mkdir()
    (workspace / "pub" / "readme").write_text("public\n")
    (workspace / "secret" / "key").write_text("hidden\n")
    (workspace / "pub" / "docs").symlink_to("../secret")
    return workspace


@pytest.fixture
async def granted(tree: Path) -> AsyncIterator[LocalSandbox]:
    session = Session("s1", str(tree), capabilities=GRANTS)
    sb = LocalSandbox(str(tree), kill_wait=1.0, agent_args=agent_grant_args(session))
    yield sb
    await sb.aclose()


async def test_resolve_answers_the_real_relative_path(
    sandbox: LocalSandbox, tree: Path, outside: Path
) -> None:
    (tree / "out").symlink_to(outside)
    assert await sandbox.resolve("pub/docs/key") == "secret/key"
    assert await sandbox.resolve("pub/docs/new/file") == "secret/new/file"  # not there yet: as written
    assert await sandbox.resolve(".") == "." and await sandbox.resolve(str(tree / "src")) == "src"
    with pytest.raises(WorkspaceEscapeError):
        await sandbox.resolve("out/secret.txt")
    with pytest.raises(WorkspaceEscapeError):
        await sandbox.resolve("../x")


async def test_every_operation_is_refused_through_a_link_out_of_its_grant(
    granted: LocalSandbox, tree: Path
) -> None:
    attempts = [
        granted.read("pub/docs/key"),
        granted.write("pub/docs/key", "pwned"),
        granted.append("pub/docs/key", "pwned"),
        granted.list("pub/docs"),
        granted.stat("pub/docs/key"),
        granted.exists("pub/docs/key"),
        granted.delete("pub/docs/key"),
        granted.write("pub/new", "read-only grant"),
        granted.delete("pub/readme"),
        granted.exec(ExecRequest("cat key", timeout=5, cwd="pub/docs"), lambda *_: None, asyncio.Event()),
    ]
    for attempt in attempts:
        with pytest.raises(ToolPermissionDenied, match="not granted"):
            await attempt
    assert (tree / "secret" / "key").read_text() == "hidden\n"
    assert (tree / "pub" / "readme").exists() and not (tree / "pub" / "new").exists()


async def test_granted_operations_still_work(granted: LocalSandbox, tree: Path) -> None:
    assert await granted.read("pub/readme") == "public\n"
    assert [e.name for e in (await granted.list("pub")).entries] == ["docs", "readme"]
    await granted.write("src/a/b.txt", "x")
    await granted.append("src/a/b.txt", "y")
    await granted.write("src/a/b.txt", "z")
    assert (tree / "src" / "a" / "b.txt").read_text() == "z"
    assert await granted.exists("src/a/b.txt") and not await granted.exists("src/nope")
    assert (await granted.stat("src/a/b.txt")).size == 1
    out: list[bytes] = []
    result = await granted.exec(
        ExecRequest("pwd", timeout=5, cwd="src/a"), lambda _, data: out.append(data), asyncio.Event()
    )
    assert result.exit_code == 0 and b"".join(out).decode().strip() == str(tree / "src" / "a")
    # A command may start above its grants (it sees them from there); not beside them.
    at_root = await granted.exec(ExecRequest("true", timeout=5), lambda *_: None, asyncio.Event())
    assert at_root.exit_code == 0
    with pytest.raises(ToolPermissionDenied):
        await granted.exec(ExecRequest("true", timeout=5, cwd="secret"), lambda *_: None, asyncio.Event())
    await granted.delete("src/a/b.txt")
    with pytest.raises(ToolPermissionDenied):
        await granted.read(".")  # the root itself is not granted


def test_the_check_holds_at_the_moment_of_use(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link swapped in after the path was resolved is caught on the opened descriptor."""
    ws = Workspace(str(tree), parse_grants('[{"path": "pub", "mode": "r"}, {"path": "src", "mode": "rw"}]'))
    # As if pub/docs were a plain directory when checked and became a link before the open.
    monkeypatch.setattr(ws, "resolve", lambda path: os.path.join(ws.root, path))
    (tree / "secret" / "sub").mkdir()
    for op in (
        lambda: ws.read("pub/docs/key", 100, False),
        lambda: ws.stat("pub/docs/key"),
        lambda: ws.exists("pub/docs/key"),
        lambda: ws.list("pub/docs/sub", 10),
        lambda: ws.open_cwd("pub/docs/sub"),
    ):
        with pytest.raises(OpError) as caught:
            op()
        assert caught.value.code == "denied"
    (tree / "src" / "docs").symlink_to("../secret")
    writes: tuple[Callable[[], object], ...] = (
        lambda: ws.write("src/docs/key", b"pwned"),
        lambda: ws.append("src/docs/key", b"pwned"),
    )
    for write in writes:
        with pytest.raises((OpError, OSError)):  # "denied", or the walk refusing the link: never followed
            write()
    assert (tree / "secret" / "key").read_text() == "hidden\n"


def test_bad_grants_are_refused() -> None:
    assert parse_grants(None) is None
    assert parse_grants('[{"path": "/src/", "mode": "rw"}]') == [("src", "rw")]
    for raw in ('{"path": "a"}', '[{"path": "../a", "mode": "r"}]', '[{"path": "a", "mode": "x"}]'):
        with pytest.raises(ValueError):
            parse_grants(raw)


async def test_through_the_dispatcher_the_escape_is_refused_before_the_tool_runs(tree: Path) -> None:
    provider = LocalSandboxProvider()
    audit = MemoryAuditLog()
    d = ToolDispatcher(provider, policy=ConfirmationPolicy.preset("autonomous"), audit=audit)
    for factory in builtin_factories():
        d.register(factory, builtin=True)
    session = Session("s1", str(tree), capabilities=GRANTS)
    try:
        bus = d.open_session(session)
        result = await d.dispatch(ToolUseBlock("tu1", "read_file", {"path": "pub/docs/key"}), session)
        assert result.error_class is ToolErrorClass.PERMISSION_DENIED
        assert "hidden" not in str(result.content)
        assert ev.TOOL_CALLED not in [e.type for e in bus.subscribe(after_seq=0)._pending]
        assert [r["kind"] for r in audit.records] == ["tool.call.denied"]
        ok = await d.dispatch(ToolUseBlock("tu2", "read_file", {"path": "pub/readme"}), session)
        assert not ok.is_error
    finally:
        await d.aclose()
