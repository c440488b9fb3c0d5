"""Capability routing (spec 003): which tools a caller may use and which workspace paths it may touch."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass

from dispatcher.core.blocks import FsMode, GrantMode
from dispatcher.egress.policy import meet


@dataclass(frozen=True, slots=True)
class FsGrant:
    """Access to a path prefix inside the workspace ("." is the whole workspace)."""

    prefix: str
    mode: GrantMode


@dataclass(frozen=True, slots=True)
class Capabilities:
    """``None`` means unrestricted; an empty collection means nothing is allowed."""

    allowed_tools: frozenset[str] | None = None
    fs_grants: tuple[FsGrant, ...] | None = None
    egress_allow: tuple[str, ...] | None = None
    """Host patterns the sandbox may reach through the egress proxy (``dispatcher.egress.policy``);
    a tenant's are its ``egress.allow``, a session's the effective list (None: not narrowed)."""

    @classmethod
    def of(
        cls, tools: Iterable[str] | None = None, fs: Iterable[tuple[str, GrantMode]] | None = None
    ) -> Capabilities:
        """From tool names and ``(path, mode)`` grants (None: unrestricted); paths are normalised."""
        return cls(
            allowed_tools=frozenset(tools) if tools is not None else None,
            fs_grants=tuple(FsGrant(_norm_prefix(path), mode) for path, mode in fs)
            if fs is not None
            else None,
        )

    def intersect(self, other: Capabilities | None) -> Capabilities:
        """What both allow: used to narrow a tenant's capabilities for one session."""
        if other is None:
            return self
        tools = _meet(self.allowed_tools, other.allowed_tools)
        if self.fs_grants is None:
            grants = other.fs_grants
        elif other.fs_grants is None:
            grants = self.fs_grants
        else:
            grants = tuple(g for g in other.fs_grants if self.check_fs(g.prefix, g.mode, relative=True))
        return Capabilities(tools, grants, _meet_hosts(self.egress_allow, other.egress_allow))

    def check_tool(self, name: str) -> bool:
        return self.allowed_tools is None or name in self.allowed_tools

    def check_fs(self, path: str, mode: FsMode, *, root: str = "/", relative: bool = False) -> bool:
        """True when some grant covers ``path`` (absolute under ``root``, or relative) for ``mode``.

        Mode ``cwd`` (a command's working directory) also accepts the directories above a grant, as
        the agent does: a shell may start where it sees its grants; the mounts bound what it touches.
        """
        if self.fs_grants is None:
            return True
        rel = _norm_prefix(path if relative else posixpath.relpath(path, root))
        for grant in self.fs_grants:
            if mode == "rw" and grant.mode != "rw":
                continue
            if grant.prefix == "." or rel == grant.prefix or rel.startswith(grant.prefix + "/"):
                return True
            if mode == "cwd" and (rel == "." or grant.prefix.startswith(rel + "/")):
                return True
        return False


def _norm_prefix(path: str) -> str:
    norm = posixpath.normpath(path.strip("/") or ".")
    return "." if norm in ("", ".") else norm


def _meet(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    if a is None:
        return b
    if b is None:
        return a
    return a & b


def _meet_hosts(a: tuple[str, ...] | None, b: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if a is None:
        return b
    if b is None:
        return a
    return meet(a, b)
