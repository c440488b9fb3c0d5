"""Staging a call (spec 004 review and audit modes): what a previewing write would leave, kept
off the disk as a ``StagedChange`` of the session (``core/staging/area.py``), and the call's result.

Which calls are staged, and what they would change, is the tools' to say: a ``Previewable`` tool
(``core/types.py``) computes the file its call would leave from the file as it is; nothing here
knows a tool by name or an input but the path ``requires_fs`` marks ``rw``.

The file "as it is" is the session's view: the content already staged for that path, else the
file on disk at the path resolved in the sandbox. So a patch staged after a staged write of the
same file applies over the written content, and both are one change (same id, same base). The
change keeps the sha256 of the disk's file when it was first staged: it is applied only over
exactly that (``core/staging/apply.py``). A change that would not apply is refused at staging
(the tool's own error), and a staging beyond the session's bounds
(``dispatcher.max_staged_changes`` / ``max_staged_bytes``) is the call's error naming the bound.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import time
from typing import TYPE_CHECKING, Any

from dispatcher.core.errors import ToolExecutionError
from dispatcher.core.registry import RegisteredTool, written_input
from dispatcher.core.sandbox_api import FileOpError, Sandbox, SandboxError
from dispatcher.core.staging.area import ABSENT, READ_LIMIT, ChangeKind, StagedChange, new_change_id
from dispatcher.core.text.truncate import truncate_head_tail
from dispatcher.core.text.visible import visible
from dispatcher.core.types import Previewable, TextBlock, ToolOutput

if TYPE_CHECKING:
    from dispatcher.core.call.run_state import RunState

__all__ = ["sha256_of", "stage", "unified_diff"]

DIFF_MAX_LINES = 5_000
"""Most lines per side difflib is given: its matching grows far faster than linearly (two
crafted 20,000-line sides took 74 s), so beyond this the change names the sizes instead."""
DIFF_CHARS = 64_000
"""A longer diff is kept head and tail (the staged content itself is whole)."""


async def stage(run: RunState, registered: RegisteredTool, input_: dict[str, Any]) -> ToolOutput:
    """Stage the change ``input_`` (a call of a ``Previewable`` tool) would make; the call's output.

    Raises:
        ToolError: the change would not apply (the tool's own error), the file cannot be read,
            or the session's staging bounds would be passed.
    """
    tool = registered.factory()
    if not isinstance(tool, Previewable):  # registered as previewing: its factory changed its mind
        raise ToolExecutionError(f"tool {registered.definition.name!r} no longer offers preview()")
    key = written_input(registered.definition)
    sandbox = run.deps.provider.sandbox_for(run.session)
    given = str(input_[key])
    path = run.resolved.get(key)
    if path is None:
        path = await _resolve(sandbox, given)
    area = run.state.staging
    async with area.lock:  # read, preview and put back as one step: a concurrent call sees it whole
        existing = area.by_path(path)
        disk = await _current(sandbox, given, path)
        after = tool.preview(input_, existing.data if existing is not None else disk)
        # Off the event loop: even bounded, a diff of thousands of lines takes a noticeable while.
        diff = truncate_head_tail(await asyncio.to_thread(unified_diff, path, disk, after), DIFF_CHARS)
        change = StagedChange(
            change_id=existing.change_id if existing is not None else new_change_id(),
            path=path,
            kind=existing.kind
            if existing is not None
            else ChangeKind.CREATE
            if disk is None
            else ChangeKind.MODIFY,
            base_sha256=existing.base_sha256 if existing is not None else sha256_of(disk),
            data=after,
            diff=diff,
            staged_at=time.time(),
            tool_name=registered.definition.name,
            tool_use_id=run.tool_use.id,
        )
        _check_bounds(run, change, existing)
        await area.put(change)
    return _output(change, updated=existing is not None, mode=run.state.mode)


def _check_bounds(run: RunState, change: StagedChange, existing: StagedChange | None) -> None:
    area, config = run.state.staging, run.config
    count = len(area) + (0 if existing is not None else 1)
    if count > config.max_staged_changes:
        raise ToolExecutionError(
            f"{change.path} was not staged: this session already holds {len(area)} staged changes, "
            f"its limit (dispatcher.max_staged_changes). Nothing was written; a human must apply or "
            "discard staged changes first (ListStagedChanges, ApplyStagedChanges, DiscardStagedChanges)."
        )
    total = area.total_bytes() - (existing.size if existing is not None else 0) + change.size
    if total > config.max_staged_bytes:
        raise ToolExecutionError(
            f"{change.path} was not staged: the session's staged changes would hold {total:,} bytes, "
            f"more than its limit of {config.max_staged_bytes:,} (dispatcher.max_staged_bytes). "
            "Nothing was written; a human must apply or discard staged changes first."
        )


def _output(change: StagedChange, *, updated: bool, mode: str) -> ToolOutput:
    shown = visible(change.path, escape_backslash=True)
    how = "per file" if mode == "review" else "together with the session's other staged changes"
    verb = "updated the change already staged for" if updated else "staged the change to"
    text = (
        f"Staged for review as {change.change_id}, not yet on disk: {verb} {shown} "
        f"({len(change.data):,} bytes, {change.kind.value}). A human applies it ({how}) or discards "
        "it. read_file and list_dir in this session show the staged content; shell sees the disk "
        "as it is."
    )
    return ToolOutput(
        content=[TextBlock(text)],
        metadata={
            "staged": change.change_id,
            "path": shown,
            "kind": change.kind.value,
            "bytes": len(change.data),
        },
    )


async def _resolve(sandbox: Sandbox, given: str) -> str:
    try:
        return await sandbox.resolve(given)
    except SandboxError as exc:
        raise ToolExecutionError(
            f"The sandbox failed while checking {given!r}; it will be recreated", exc
        ) from exc


async def _current(sandbox: Sandbox, given: str, real: str) -> bytes | None:
    try:
        data = await sandbox.read_bytes(given, max_bytes=READ_LIMIT + 1, approved=real)
    except FileOpError as exc:
        if exc.code == "ENOENT":
            return None
        raise ToolExecutionError(f"cannot read {real} to stage the change: {exc.message}") from exc
    except SandboxError as exc:
        raise ToolExecutionError(
            f"The sandbox failed while staging {real!r}; it will be recreated", exc
        ) from exc
    if len(data) > READ_LIMIT:  # a cut file would be diffed and hashed wrongly: refuse
        raise ToolExecutionError(
            f"{real} is larger than {READ_LIMIT >> 20} MiB: a change to it cannot be staged; "
            "nothing was written"
        )
    return data


def unified_diff(path: str, before: bytes | None, after: bytes) -> str:
    """The change from ``before`` (None: no file) to ``after`` as a unified diff, or a line naming
    the sizes of a binary or very long file."""
    old_name = f"a/{path}" if before is not None else "/dev/null"
    old = before or b""
    if b"\x00" in old or b"\x00" in after or not (_is_text(old) and _is_text(after)):
        return f"Binary file {path}: {len(old):,} bytes -> {len(after):,} bytes\n"
    old_lines = old.decode("utf-8").splitlines(keepends=True)
    new_lines = after.decode("utf-8").splitlines(keepends=True)
    if max(len(old_lines), len(new_lines)) > DIFF_MAX_LINES:
        return (
            f"File {path}: {len(old_lines):,} lines -> {len(new_lines):,} lines; too long to diff "
            f"(over {DIFF_MAX_LINES:,} lines)\n"
        )
    lines = difflib.unified_diff(
        old_lines,
        new_lines,
        fromfile=old_name,
        tofile=f"b/{path}",
    )
    out = "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )
    return out or f"No change to {path}\n"


def _is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def sha256_of(data: bytes | None) -> str:
    """What ``expect_sha256`` compares: the content's sha256, ``ABSENT`` for no file."""
    return ABSENT if data is None else hashlib.sha256(data).hexdigest()
