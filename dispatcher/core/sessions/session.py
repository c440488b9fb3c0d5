"""A session as the dispatch core knows it: identity, workspace, and the rules that apply to it."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from dispatcher.core.blocks import Role

if TYPE_CHECKING:
    from dispatcher.core.approval.confirmation_policy import ConfirmationPolicy
    from dispatcher.core.capabilities import Capabilities


class SessionStatus(StrEnum):
    """Where a session is in its life; ``core/sessions/registry.py`` owns the transitions.

    ``OPEN -> CLOSING -> CLOSED``, and ``OPEN <-> PAUSED`` (held, its sandbox frozen, resumed by
    its next call or ResumeSession), ``OPEN|PAUSED -> CLOSING -> EXPIRED`` (ended by a clock: like
    ``CLOSED`` but remembered with when and why). Open and paused sessions take requests; a closing
    one is cancelling its calls and stopping its sandbox, and is already "not found" to clients.
    """

    OPEN = "open"
    PAUSED = "paused"
    CLOSING = "closing"
    CLOSED = "closed"
    EXPIRED = "expired"

    @property
    def alive(self) -> bool:
        """Takes requests (open or paused)."""
        return self in (SessionStatus.OPEN, SessionStatus.PAUSED)


@dataclass(frozen=True, slots=True)
class Session:
    """Immutable description of one session; runtime state lives in the dispatcher."""

    session_id: str
    workspace_path: str
    """Absolute host path of the workspace (bind-mounted at /workspace in the sandbox)."""
    tenant_id: str = "default"
    role: Role = Role.MAIN
    labels: Mapping[str, str] = field(default_factory=dict)
    policy: ConfirmationPolicy | None = None
    """None: the dispatcher's policy."""
    capabilities: Capabilities | None = None
    """None: every tool, the whole workspace read-write. A session's own narrower request is
    already intersected in (``Capabilities.intersect``)."""
    approval_mode: str = "cautious"
    """Spec 004's approval mode (``core/call/approve.py``): cautious, autonomous, manual, plan, review
    or audit; applied over ``policy``."""
    workspace_root: str | None = None
    """The tenant's workspace root on the host (from the config, trusted). When set, the workspace
    is ``workspace_name`` below it, and a sandbox provider must reach it by walking down from this
    root without following any link, at every launch: a sandbox may have swapped a component."""
    workspace_name: str = ""
    """The workspace's normalised relative path under ``workspace_root`` (``a/b``)."""
    sandbox_uid: int | None = None
    """Host uid the session's sandbox runs as (None: the provider's configured user)."""
    sandbox_gid: int | None = None
    """Host gid the session's sandbox runs as (None: the provider's configured group)."""


def new_session_id() -> str:
    """A new session's id: unguessable, made by the server (or by a warm pool ahead of it)."""
    return f"ses_{secrets.token_hex(12)}"
