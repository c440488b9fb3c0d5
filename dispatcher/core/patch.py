"""What a str_replace patch does to a file: the one definition, for every caller.

``patched`` computes the file after the replacement; ``apply_patch`` reads the file through a
``WorkspaceFileAPI``, patches it and writes it back only over the bytes it read. ``patch_file``
previews with ``patched`` (what review and audit modes stage) and runs with ``apply_patch``, and every
``WorkspaceFileAPI.patch`` a custom tool calls is ``apply_patch``: one semantics, however a patch
arrives.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

from dispatcher.core.sandbox_api import FileOpError

__all__ = ["apply_patch", "patched", "replaced"]


class ReadWrite(Protocol):
    """What a patch needs of a ``WorkspaceFileAPI``: its whole-file read and its checked write."""

    async def read_bytes(
        self, path: str, *, max_bytes: int | None = None, approved: str | None = None
    ) -> bytes: ...

    async def write_bytes(
        self, path: str, data: bytes, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None: ...


async def apply_patch(
    files: ReadWrite,
    path: str,
    old: str,
    new: str,
    *,
    approved: str | None = None,
    replace_all: bool = False,
) -> int:
    """Replace the one occurrence of ``old`` in ``path`` with ``new`` (``patched``), atomically;
    with ``replace_all``, every occurrence. Returns how many were replaced.

    The file is read, changed here and written back whole, only over the bytes it was read as:
    a change made meanwhile is refused by the sandbox just before its rename, never lost.

    Raises:
        FileOpError: the read's or the write's errors (``ENOENT``, ``EISDIR``, ...), ``patched``'s
            (``no_match``, ``multiple_matches``, ``decode``), or ``changed`` (written meanwhile);
            in every case the file is as it was.
    """
    current = await files.read_bytes(path, approved=approved)
    after, count = replaced(current, old, new, path, replace_all=replace_all)
    try:
        await files.write_bytes(
            path, after, approved=approved, expect_sha256=hashlib.sha256(current).hexdigest()
        )
    except FileOpError as exc:
        if exc.code != "changed":
            raise
        raise FileOpError(
            "changed",
            f"{path} changed while it was being patched (written meanwhile, or replaced by a "
            "link); nothing was written. Read the file again and repeat the call.",
        ) from exc
    return count


def patched(data: bytes, old: str, new: str, path: str, *, replace_all: bool = False) -> bytes:
    """``data`` with the one occurrence of ``old`` replaced by ``new`` (``replaced``)."""
    return replaced(data, old, new, path, replace_all=replace_all)[0]


def replaced(data: bytes, old: str, new: str, path: str, *, replace_all: bool = False) -> tuple[bytes, int]:
    """``data`` with the one occurrence of ``old`` replaced by ``new``, and how many were replaced.

    With ``replace_all``, every occurrence (at least one): occurrences are counted without overlap,
    left to right, as ``bytes.replace`` finds them.

    As given first; when that finds nothing and ``old`` spans lines, with the other line ending.
    Models send ``\n``: in a CRLF file, ``old`` then matches with ``\r\n`` and ``new`` is put in
    with ``\r\n`` too, so the file keeps one line ending (and the other way round). Matching is
    on the UTF-8 bytes: UTF-8 is self-synchronising, so a byte match is a character match.

    Raises:
        FileOpError: ``no_match`` (no attempt matched), ``multiple_matches`` (an attempt matched
            more than once, without ``replace_all``), ``decode`` (the text cannot be UTF-8).
    """
    attempts = [(old, new)]
    if "\n" in old:
        crlf = "\r\n" in old
        attempts.append((_lf(old), _lf(new)) if crlf else (old.replace("\n", "\r\n"), _crlf(new)))
    for old_text, new_text in attempts:
        needle = _encode(old_text, path)
        count = data.count(needle) if needle else 0
        if count == 1 or (count > 1 and replace_all):
            return data.replace(needle, _encode(new_text, path)), count
        if count > 1:
            raise FileOpError(
                "multiple_matches",
                f"{path}: the text to replace occurs {count} times. `old` must occur exactly once; "
                "include more surrounding lines to make it unique, or set replace_all to replace "
                "every occurrence. The file was not changed.",
            )
    raise FileOpError(
        "no_match",
        f"`old` was not found in {path}. It must match the file exactly, including whitespace and "
        f"indentation; read the file again and copy the text. {_newline_note(data, old)}The file "
        "was not changed.",
    )


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n")


def _crlf(text: str) -> str:
    return _lf(text).replace("\n", "\r\n")


def _encode(text: str, path: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise FileOpError("decode", f"{path}: text cannot be encoded as UTF-8") from None


def _newline_note(data: bytes, old: str) -> str:
    """Why the line endings may be the reason ``old`` did not match ('' when they are not)."""
    file_crlf, file_lf = b"\r\n" in data, b"\n" in data.replace(b"\r\n", b"")
    if file_crlf and file_lf:
        return (
            "The file mixes CRLF (\\r\\n) and LF (\\n) line endings, so `old` must use the same "
            "ending as each line it spans. "
        )
    if "\r" in old and not file_crlf:
        return "`old` contains \\r but the file has no CRLF line endings. "
    return ""
