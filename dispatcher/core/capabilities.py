"""Capability routing (spec 003): which tools a caller may use and which workspace paths it may touch."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dispatcher.core.errors import ConfigError

FsMode = Literal["r", "rw"]


@dataclass(frozen=True, slots=True)
class FsGrant:
    """Access to a path prefix inside the workspace ("." is the whole workspace)."""

    prefix: str
    mode: FsMode


@dataclass(frozen=True, slots=True)
class Capabilities:
    """``None`` means unrestricted; an empty collection means nothing is allowed."""

    allowed_tools: frozenset[str] | None = None
    fs_grants: tuple[FsGrant, ...] | None = None

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None, *, where: str = "capabilities") -> Capabilities:
        """Build from ``{tools: [...], fs: [{path, mode}]}``.

        Raises:
            ConfigError: naming the offending key.
        """
        if section is None:
            return cls()
        if not isinstance(section, Mapping):
            raise ConfigError(f"{where}: must be a mapping")
        unknown = set(section) - {"tools", "fs"}
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown key (allowed: fs, tools)")
        tools = section.get("tools")
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)):
            raise ConfigError(f"{where}.tools: must be a list of tool names")
        grants: list[FsGrant] | None = None
        if section.get("fs") is not None:
            if not isinstance(section["fs"], list):
                raise ConfigError(f"{where}.fs: must be a list of {{path, mode}}")
            grants = []
            for i, item in enumerate(section["fs"]):
                if not isinstance(item, Mapping) or not isinstance(item.get("path"), str):
                    raise ConfigError(f"{where}.fs[{i}].path: must be a string")
                mode = item.get("mode", "r")
                if mode not in ("r", "rw"):
                    raise ConfigError(f"{where}.fs[{i}].mode: must be 'r' or 'rw'")
                grants.append(FsGrant(_norm_prefix(item["path"]), mode))
        return cls(
            allowed_tools=frozenset(tools) if tools is not None else None,
            fs_grants=tuple(grants) if grants is not None else None,
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
        return Capabilities(tools, grants)

    def check_tool(self, name: str) -> bool:
        return self.allowed_tools is None or name in self.allowed_tools

    def check_fs(
        self, path: str, mode: FsMode | Literal["cwd"], *, root: str = "/", relative: bool = False
    ) -> bool:
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
