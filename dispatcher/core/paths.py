"""Lexical workspace scoping (spec 000 §5.1), done before anything touches a file.

Symlinks are resolved where the files are (inside the sandbox); this check catches what can be
known from the string alone, so that a hostile path is refused before a container is even made.
"""

from __future__ import annotations

import posixpath

from dispatcher.core.errors import WorkspaceEscapeError

MAX_PATH_CHARS = 4096


def resolve_workspace_path(path: str, workspace_root: str) -> str:
    """Return the absolute, normalised path of ``path`` under ``workspace_root``.

    ``..`` segments are resolved during the check, so ``a/../../etc`` is refused even though
    ``a/..`` alone is fine.

    Raises:
        WorkspaceEscapeError: the path is empty of meaning, too long, holds NUL, or escapes the root.
    """
    if "\x00" in path:
        raise WorkspaceEscapeError(f"Path {path!r} contains a NUL byte")
    if len(path) > MAX_PATH_CHARS:
        raise WorkspaceEscapeError(f"Path {path[:64]!r}... is longer than {MAX_PATH_CHARS} characters")
    root = posixpath.normpath(workspace_root)
    candidate = path if posixpath.isabs(path) else posixpath.join(root, path)
    parts: list[str] = []
    entered = False
    for segment in candidate.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not parts:
                raise WorkspaceEscapeError(f"Path {path!r} escapes workspace boundary")
            parts.pop()
        else:
            parts.append(segment)
        # Checked at every step: once inside the root a path may not wander out and come back in,
        # and before reaching it an absolute path may only walk down the root's own ancestors.
        resolved = "/" + "/".join(parts)
        if _inside(resolved, root):
            entered = True
        elif entered or not _is_ancestor(resolved, root):
            raise WorkspaceEscapeError(f"Path {path!r} escapes workspace boundary")
    resolved = "/" + "/".join(parts)
    if not _inside(resolved, root):
        raise WorkspaceEscapeError(f"Path {path!r} escapes workspace boundary")
    return resolved


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _is_ancestor(path: str, root: str) -> bool:
    """True for the directories above ``root`` that an absolute path passes through on its way in."""
    return root.startswith(path.rstrip("/") + "/") or path == "/"
