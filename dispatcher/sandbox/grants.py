"""The session's fs grants as the in-sandbox agent takes them (``--grants JSON``).

The host checks grants before a call runs, on the path the sandbox resolved; the agent checks them
again on every descriptor it opens, so a link changed in between cannot widen them.
"""

from __future__ import annotations

import json

from dispatcher.core.sessions.session import Session


def agent_grant_args(session: Session) -> list[str]:
    """``["--grants", JSON]`` for a session with fs grants; ``[]`` when the whole workspace is open."""
    caps = session.capabilities
    if caps is None or caps.fs_grants is None:
        return []
    grants = [{"path": g.prefix, "mode": g.mode} for g in caps.fs_grants]
    return ["--grants", json.dumps(grants, separators=(",", ":"))]
