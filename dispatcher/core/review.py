"""Review mode (spec 004): a write is staged and shown as a diff; it is applied only once a human
accepts it, per file (``ResolveConfirmation``) or per batch (``ResolveConfirmations``).

Which calls are staged, and what they would change, is the tools' to say: a ``Previewable`` tool
(``core/types.py``) computes the file its call would leave from the file as it is; nothing here
knows a tool by name or an input but the path ``requires_fs`` marks ``rw``.

Staging reads the file where the call will write it (the path resolved in the sandbox), asks the
tool for the change and publishes it as the ``diff`` of a ``tool.confirmation_requested`` event.
Nothing is written before the answer. On accept the call runs as usual, at the path that was
resolved and shown, and only if the file is still what the diff was made from (otherwise it is
refused unchanged and the model is told to call again): checked here first, then again by the
sandbox just before it renames the new file into place (``expect_sha256``); the tool writes the
file atomically (temp file + rename in the sandbox). On reject nothing is written and the result
says so. A change that would not apply is refused at staging: no question is asked about a change
that cannot happen.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dispatcher.core.errors import ToolExecutionError, ToolUserDenied
from dispatcher.core.registry import RegisteredTool, written_input
from dispatcher.core.sandbox_api import FileOpError, Sandbox, SandboxError
from dispatcher.core.truncate import truncate_head_tail
from dispatcher.core.types import Previewable

if TYPE_CHECKING:
    from dispatcher.core.run_state import RunState

__all__ = ["Staged", "check_unchanged", "stage"]

READ_LIMIT = 8 << 20
"""Most bytes of the current file staging reads to diff against."""
DIFF_MAX_LINES = 5_000
"""Most lines per side difflib is given: its matching grows far faster than linearly (two
crafted 20,000-line sides took 74 s), so beyond this the request names the sizes instead and the
input itself, shown whole, is what is reviewed."""
DIFF_CHARS = 64_000
"""A longer diff is shown head and tail (the input itself is shown whole in ``input_summary``)."""


@dataclass(frozen=True, slots=True)
class Staged:
    """A write waiting for its review: where, what it would change, and what the file was."""

    path: str  # as resolved in the sandbox, workspace-relative
    given: str  # as the call wrote it
    before_sha256: str
    diff: str


async def stage(run: RunState, registered: RegisteredTool, input_: dict[str, Any]) -> Staged:
    """The change ``input_`` (a call of a ``Previewable`` tool) would make, without making it.

    Raises:
        ToolError: the change would not apply (the tool's own error), or the file cannot be read.
    """
    tool = registered.factory()
    if not isinstance(tool, Previewable):  # registered as previewing: its factory changed its mind
        raise ToolExecutionError(f"tool {registered.definition.name!r} no longer offers preview()")
    key = written_input(registered.definition)
    sandbox = run.deps.provider.sandbox_for(run.session)
    given = str(input_[key])
    path = run.resolved.get(key) or given
    before = await _current(sandbox, given, path)
    after = tool.preview(input_, before)
    # Off the event loop: even bounded, a diff of thousands of lines takes a noticeable while.
    diff = await asyncio.to_thread(_diff, path, before, after)
    return Staged(path, given, _sha(before), truncate_head_tail(diff, DIFF_CHARS))


async def check_unchanged(run: RunState, staged: Staged) -> None:
    """After the accept: refuse if the file changed since it was diffed (what was reviewed is not
    what would be written).

    Raises:
        ToolUserDenied: the file changed.
    """
    sandbox = run.deps.provider.sandbox_for(run.session)
    if _sha(await _current(sandbox, staged.given, staged.path)) != staged.before_sha256:
        raise ToolUserDenied(
            f"{staged.path} changed after the change to it was reviewed; nothing was written. "
            "Read the file again and repeat the call to have it reviewed again."
        )


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
            f"{real} is larger than {READ_LIMIT >> 20} MiB: review mode cannot show a change to it; "
            "nothing was written"
        )
    return data


def _diff(path: str, before: bytes | None, after: bytes) -> str:
    old_name = f"a/{path}" if before is not None else "/dev/null"
    old = before or b""
    if b"\x00" in old or b"\x00" in after or not (_is_text(old) and _is_text(after)):
        return f"Binary file {path}: {len(old):,} bytes -> {len(after):,} bytes\n"
    old_lines = old.decode("utf-8").splitlines(keepends=True)
    new_lines = after.decode("utf-8").splitlines(keepends=True)
    if max(len(old_lines), len(new_lines)) > DIFF_MAX_LINES:
        return (
            f"File {path}: {len(old_lines):,} lines -> {len(new_lines):,} lines; too long to diff "
            f"(over {DIFF_MAX_LINES:,} lines): review the input, shown whole\n"
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


def _sha(data: bytes | None) -> str:
    return "absent" if data is None else hashlib.sha256(data).hexdigest()
