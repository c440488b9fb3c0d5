"""Paths: everything that lands outside the workspace (``..``, absolute paths, symbolic links out)
is the same error class everywhere; links inside are followed; ``resolve`` and approved paths."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from dispatcher.core.errors import ToolErrorClass, WorkspaceEscapeError
from dispatcher.core.sandbox_api import Sandbox
from tests.contract.helpers import code_of
from tests.contract.targets import Capability, Target

Op = Callable[[Sandbox, str], Awaitable[object]]
OPS: dict[str, Op] = {
    "read": lambda sb, p: sb.read(p),
    "read_bytes": lambda sb, p: sb.read_bytes(p),
    "write": lambda sb, p: sb.write(p, "x"),
    "append": lambda sb, p: sb.append(p, "x"),
    "stat": lambda sb, p: sb.stat(p),
    "list": lambda sb, p: sb.list(p),
    "delete": lambda sb, p: sb.delete(p),
    "resolve": lambda sb, p: sb.resolve(p),
}


async def _escapes(target: Target, path: str, *, but: tuple[str, ...] = ()) -> None:
    """Every operation on ``path`` (``but`` those) fails as an escape."""
    for name, op in OPS.items():
        if name in but:
            continue
        with pytest.raises(WorkspaceEscapeError) as err:
            await op(target.sandbox, path)
        assert err.value.error_class is ToolErrorClass.PERMISSION_DENIED, name


async def test_dotdot_out_of_the_workspace_is_an_escape(target: Target) -> None:
    await target.sandbox.write("a/f.txt", "x")
    for path in ("../x", "a/../../x", "a/../../../etc/passwd"):
        await _escapes(target, path)
    await _escapes(target, "..", but=("delete",))


async def test_an_absolute_path_outside_is_an_escape(target: Target) -> None:
    for path in ("/etc/passwd", "/tmp/x"):
        await _escapes(target, path)
    await _escapes(target, "/", but=("delete",))


async def test_delete_refuses_the_root_and_its_parents_by_name(target: Target) -> None:
    """Refused as EINVAL before any resolution (not as an escape): nothing is deleted."""
    await target.sandbox.write("a/f.txt", "x")
    for path in (".", "..", "/", "a/..", "a/."):
        assert await code_of(target.sandbox.delete(path)) == "EINVAL", path
    assert await target.sandbox.read("a/f.txt") == "x"


async def test_a_nul_byte_is_refused_as_an_escape(target: Target) -> None:
    await _escapes(target, "a\x00b")


async def test_exists_of_an_escaping_path_is_an_escape_too(target: Target) -> None:
    with pytest.raises(WorkspaceEscapeError):
        await target.sandbox.exists("../x")


async def test_an_absolute_path_inside_the_root_is_the_workspace(target: Target) -> None:
    target.require(Capability.ROOT_PATHS)
    await target.sandbox.write(target.path("abs.txt"), "via the root")
    assert await target.sandbox.read("abs.txt") == "via the root"
    assert await target.sandbox.resolve(target.path("abs.txt")) == "abs.txt"


async def test_a_link_out_by_absolute_target_is_an_escape(target: Target) -> None:
    await target.link("out", "/etc")
    await target.link("pw", "/etc/passwd")
    for path in ("out/passwd", "out/new.txt"):
        await _escapes(target, path)
    for link in ("out", "pw"):  # delete removes the link itself, inside the workspace
        await _escapes(target, link, but=("delete",))


async def test_a_link_out_by_relative_target_is_an_escape(target: Target) -> None:
    await target.sandbox.write("d/f.txt", "x")
    await target.link("d/up", "../..")
    for path in ("d/up/etc/passwd", "d/up/x"):
        await _escapes(target, path)
    await _escapes(target, "d/up", but=("delete",))


async def test_a_link_inside_is_followed(target: Target) -> None:
    await target.sandbox.write("real/f.txt", "through the link")
    await target.link("alias", "real")
    await target.link("file-alias", "real/f.txt")
    assert await target.sandbox.read("alias/f.txt") == "through the link"
    assert await target.sandbox.read("file-alias") == "through the link"
    assert await target.sandbox.resolve("alias/f.txt") == "real/f.txt"
    assert (await target.sandbox.stat("alias/f.txt")).path == target.path("real/f.txt")
    assert (await target.sandbox.stat("alias")).kind == "dir"
    await target.sandbox.write("alias/g.txt", "written through")
    assert await target.sandbox.read("real/g.txt") == "written through"


async def test_list_shows_a_link_as_a_link_with_its_target(target: Target) -> None:
    await target.sandbox.write("real/f.txt", "x")
    await target.link("alias", "real")
    await target.link("out", "/etc")
    entries = {e.name: e for e in (await target.sandbox.list(".")).entries}
    assert (entries["alias"].kind, entries["alias"].target) == ("symlink", "real")
    assert (entries["out"].kind, entries["out"].target) == ("symlink", "/etc")
    assert entries["real"].kind == "dir"


async def test_a_dangling_link_inside(target: Target) -> None:
    await target.link("dangling", "nowhere.txt")
    assert await target.sandbox.resolve("dangling") == "nowhere.txt"
    assert await code_of(target.sandbox.read("dangling")) == "ENOENT"


async def test_deleting_a_link_removes_the_link_not_its_target(target: Target) -> None:
    await target.sandbox.write("real/f.txt", "kept")
    await target.link("alias", "real")
    await target.sandbox.delete("alias")
    assert not await target.sandbox.exists("alias")
    assert await target.sandbox.read("real/f.txt") == "kept"


async def test_resolve_normalises_and_takes_missing_parts_as_written(target: Target) -> None:
    await target.sandbox.write("a/f.txt", "x")
    assert await target.sandbox.resolve(".") == "."
    assert await target.sandbox.resolve("a/./b/../f.txt") == "a/f.txt"
    assert await target.sandbox.resolve("not/yet/there.txt") == "not/yet/there.txt"


async def test_an_approved_path_is_used_as_approved(target: Target) -> None:
    await target.sandbox.write("d/f.txt", "old")
    approved = await target.sandbox.resolve("d/f.txt")
    await target.sandbox.write("d/f.txt", "new", approved=approved)
    assert await target.sandbox.read_bytes("d/f.txt", approved=approved) == b"new"
    assert (await target.sandbox.stat("d/f.txt", approved=approved)).kind == "file"
    assert [e.name for e in (await target.sandbox.list("d", approved="d")).entries] == ["f.txt"]


async def test_a_link_put_on_an_approved_path_is_changed_and_nothing_is_done(target: Target) -> None:
    await target.sandbox.write("d/f.txt", "approved content")
    await target.sandbox.write("other/f.txt", "not approved")
    approved = await target.sandbox.resolve("d/f.txt")
    await target.sandbox.delete("d/f.txt")
    await target.sandbox.delete("d")
    await target.link("d", "other")  # swapped in after the approval
    assert await code_of(target.sandbox.write("d/f.txt", "x", approved=approved)) == "changed"
    assert await code_of(target.sandbox.read_bytes("d/f.txt", approved=approved)) == "changed"
    assert await target.sandbox.read("other/f.txt") == "not approved"


async def test_a_link_with_an_absolute_target_inside_the_root_is_followed(target: Target) -> None:
    target.require(Capability.ROOT_PATHS)
    await target.sandbox.write("real/f.txt", "absolute")
    await target.link("abs-alias", target.path("real"))
    assert await target.sandbox.read("abs-alias/f.txt") == "absolute"
    assert await target.sandbox.resolve("abs-alias/f.txt") == "real/f.txt"
