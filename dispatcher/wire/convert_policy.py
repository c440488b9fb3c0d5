"""Proto <-> domain conversion of a session's policy: approval mode, capabilities, plan steps.

Shapes only, both directions (the server uses one, the Python client the other); the checks that a
request only narrows its tenant's capabilities are ``narrow_capabilities`` (server side).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from dispatcher.core.approval.modes import ApprovalMode
from dispatcher.core.blocks import GrantMode
from dispatcher.core.capabilities import Capabilities, FsGrant
from dispatcher.core.sessions.state import PlanStep
from dispatcher.core.types import SideEffect
from dispatcher.egress.policy import narrow
from dispatcher.v1 import dispatcher_pb2 as pb

MAX_SESSION_TOOLS = 1024
MAX_SESSION_GRANTS = 64
MAX_GRANT_PATH_CHARS = 4096
MAX_SESSION_EGRESS = 256


def mode_from_pb(value: int) -> ApprovalMode | None:
    """The mode of an enum value (UNSPECIFIED: cautious); None for an unknown value."""
    if value == pb.APPROVAL_MODE_UNSPECIFIED:
        return ApprovalMode.CAUTIOUS
    try:
        name = pb.ApprovalMode.Name(value)  # type: ignore[arg-type]
    except ValueError:
        return None
    return ApprovalMode(name.removeprefix("APPROVAL_MODE_").lower())


def mode_to_pb(mode: str) -> pb.ApprovalMode.ValueType:
    return pb.ApprovalMode.Value("APPROVAL_MODE_" + str(mode).upper())


def capabilities_from_pb(
    msg: pb.SessionCapabilities, present: bool, *, check: bool = True
) -> Capabilities | None:
    """The requested capabilities (None: not given). Shapes are checked here (``check``; a client
    reading what the server sent takes it as it is), the tenant's limits in ``narrow_capabilities``.

    Raises:
        ValueError: naming the offending field.
    """
    if not present:
        return None
    tools: frozenset[str] | None = None
    if msg.HasField("tools"):
        if check and len(msg.tools.names) > MAX_SESSION_TOOLS:
            raise ValueError(f"capabilities.tools: at most {MAX_SESSION_TOOLS} names")
        tools = frozenset(msg.tools.names)
    grants: tuple[FsGrant, ...] | None = None
    if msg.HasField("fs"):
        if check and len(msg.fs.grants) > MAX_SESSION_GRANTS:
            raise ValueError(f"capabilities.fs: at most {MAX_SESSION_GRANTS} grants")
        out = []
        for i, grant in enumerate(msg.fs.grants):
            where = f"capabilities.fs.grants[{i}]"
            mode: GrantMode
            if grant.access == pb.FS_ACCESS_READ_WRITE:
                mode = "rw"
            elif grant.access == pb.FS_ACCESS_READ or not check:
                mode = "r"
            else:
                raise ValueError(f"{where}.access: must be FS_ACCESS_READ or FS_ACCESS_READ_WRITE")
            path = _grant_path(grant.path, where) if check else grant.path
            out.append(FsGrant(path, mode))
        grants = tuple(out)
    egress: tuple[str, ...] | None = None
    if msg.egress_allow:  # empty: the tenant's list
        if check and len(msg.egress_allow) > MAX_SESSION_EGRESS:
            raise ValueError(f"capabilities.egress_allow: at most {MAX_SESSION_EGRESS} patterns")
        egress = tuple(msg.egress_allow)
    return Capabilities(tools, grants, egress)


def _grant_path(path: str, where: str) -> str:
    if len(path) > MAX_GRANT_PATH_CHARS or "\x00" in path:
        raise ValueError(f"{where}.path: at most {MAX_GRANT_PATH_CHARS} characters, no NUL")
    if posixpath.isabs(path):
        raise ValueError(f"{where}.path: must be relative to the workspace, got {path!r}")
    norm = posixpath.normpath(path or ".")
    if norm == ".." or norm.startswith("../"):
        raise ValueError(f"{where}.path: {path!r} leaves the workspace")
    return norm


def capabilities_to_pb(caps: Capabilities | None) -> pb.SessionCapabilities:
    msg = pb.SessionCapabilities()
    if caps is None:
        return msg
    if caps.allowed_tools is not None:
        msg.tools.CopyFrom(pb.ToolNames(names=sorted(caps.allowed_tools)))
    if caps.fs_grants is not None:
        msg.fs.CopyFrom(
            pb.FsGrants(
                grants=[
                    pb.FsGrant(
                        path=g.prefix,
                        access=pb.FS_ACCESS_READ_WRITE if g.mode == "rw" else pb.FS_ACCESS_READ,
                    )
                    for g in caps.fs_grants
                ]
            )
        )
    msg.egress_allow.extend(caps.egress_allow or ())
    return msg


def session_capabilities_to_pb(
    tools: Iterable[str] | None = None,
    fs: Iterable[tuple[str, str]] | None = None,
    egress_allow: Iterable[str] | None = None,
) -> pb.SessionCapabilities | None:
    """Client side: the request message (None when none is given)."""
    if tools is None and fs is None and not egress_allow:
        return None
    msg = pb.SessionCapabilities(egress_allow=list(egress_allow or ()))
    if tools is not None:
        msg.tools.CopyFrom(pb.ToolNames(names=list(tools)))
    if fs is not None:
        grants = []
        for path, mode in fs:
            if mode not in ("r", "rw"):
                raise ValueError(f"fs grant {path!r}: mode must be 'r' or 'rw', got {mode!r}")
            access = pb.FS_ACCESS_READ_WRITE if mode == "rw" else pb.FS_ACCESS_READ
            grants.append(pb.FsGrant(path=path, access=access))
        msg.fs.CopyFrom(pb.FsGrants(grants=grants))
    return msg


def narrow_capabilities(
    tenant: Capabilities, requested: Capabilities | None, known_tools: Iterable[str]
) -> Capabilities:
    """The session's capabilities: ``requested`` within the tenant's, intersected.

    A request that would widen them is refused, not silently narrowed: an agent that asked for a
    tool must learn at once that it will not get it.

    Raises:
        ValueError: naming the tool or grant the tenant does not have.
    """
    if requested is None:
        return tenant
    if requested.allowed_tools is not None:
        known = set(known_tools)
        for name in sorted(requested.allowed_tools):
            if name not in known:
                raise ValueError(f"capabilities.tools: no tool named {name!r}")
            if not tenant.check_tool(name):
                raise ValueError(f"capabilities.tools: {name!r} is not allowed to this tenant")
    for i, grant in enumerate(requested.fs_grants or ()):
        if not tenant.check_fs(grant.prefix, grant.mode, relative=True):
            access = "read-write" if grant.mode == "rw" else "read"
            raise ValueError(
                f"capabilities.fs.grants[{i}]: {access} access to {grant.prefix!r} is more than this "
                "tenant's grants allow"
            )
    if requested.egress_allow is not None:
        wanted = narrow(tenant.egress_allow or (), requested.egress_allow, where="capabilities.egress_allow")
        requested = Capabilities(requested.allowed_tools, requested.fs_grants, wanted)
    return tenant.intersect(requested)


def plan_step_to_pb(step: PlanStep) -> pb.PlanStep:
    return pb.PlanStep(
        step=step.step,
        turn_id=step.turn_id,
        tool_use_id=step.tool_use_id,
        tool_name=step.tool_name,
        side_effect=pb.SideEffect.Value("SIDE_EFFECT_" + SideEffect(step.side_effect).name),
        input_summary=step.input_summary,
        projected_modifications=list(step.projected_modifications),
    )


def plan_step_from_pb(msg: pb.PlanStep) -> PlanStep:
    name = pb.SideEffect.Name(msg.side_effect).removeprefix("SIDE_EFFECT_").lower()
    return PlanStep(
        step=msg.step,
        turn_id=msg.turn_id,
        tool_use_id=msg.tool_use_id,
        tool_name=msg.tool_name,
        side_effect=name,
        input_summary=msg.input_summary,
        projected_modifications=tuple(msg.projected_modifications),
    )
