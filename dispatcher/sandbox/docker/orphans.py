"""The start-up sweep: removing this instance's containers that no live session owns.

A previous run of the server (crashed, or stopped keeping its sessions) leaves containers labelled
with its instance. Each is removed unless a session still owns it: a live session's (even one
whose container is being created), the warm pool's, or the one a restarted session expects to
re-adopt (``expect_container``), kept only when ``adoption_problem`` finds nothing wrong
with it; otherwise that session learns why it will get a fresh one. A session given back with no
stored container (the server died between launching one and storing its id) adopts the newest
container carrying its labels that passes the same checks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.adopt import GONE
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.labels import (
    LABEL_INSTANCE,
    LABEL_POOL,
    LABEL_SESSION,
    LABEL_SPEC,
    LABEL_TENANT,
    pool_fingerprint,
    spec_fingerprint,
)
from dispatcher.sandbox.docker.client import DockerAPI

if TYPE_CHECKING:
    from dispatcher.sandbox.container.sandbox import ContainerSandbox

log = logging.getLogger(__name__)


async def sweep_orphans(
    api: DockerAPI,
    instance: str,
    config: SandboxConfig,
    sandboxes: Mapping[str, ContainerSandbox],
    live_session_ids: Iterable[str],
    *,
    pooled: Callable[[str], bool],
    kept: Callable[[Mapping[str, Any]], None] = lambda container: None,
    gone: Callable[[str], None] = lambda container_id: None,
) -> int:
    """Remove the instance's containers that no session in ``sandboxes`` or ``live_session_ids``
    owns and ``pooled`` does not claim; tell each expecting sandbox whether it may adopt its own,
    ``kept`` each container left (as listed, labels included) and ``gone`` the id of each one
    removed. Returns how many were removed."""
    expected = {s.adopting: s for s in sandboxes.values() if s.adopting}
    # Given back with no stored container: one carrying its labels may be adopted (the newest).
    unstored = {s.session.session_id: s for s in sandboxes.values() if s.unstored and not s.adopting}
    adopting = {s.session.session_id for s in expected.values()} | set(unstored)
    # Every other session with a handle counts as live, even one whose container is being created.
    live = (set(live_session_ids) | set(sandboxes)) - adopting
    owned = {s.container_id for s in sandboxes.values() if s.container_id}
    removed = 0
    listed = await api.list_by_labels({LABEL_INSTANCE: instance})
    for container in sorted(listed, key=lambda c: -float(c.get("Created") or 0)):
        labels = container.get("Labels") or {}
        sandbox = expected.pop(container["Id"], None)
        if sandbox is None and labels.get(LABEL_SESSION) in unstored:
            candidate = unstored[labels[LABEL_SESSION]]
            if adoption_problem(container, candidate.session, instance, config) is None:
                del unstored[labels[LABEL_SESSION]]
                candidate.found(container["Id"])
                candidate.adoptable(float(container.get("Created") or time.time()))
                kept(container)
                continue
        if sandbox is not None:
            problem = adoption_problem(container, sandbox.session, instance, config)
            if problem is None:
                sandbox.adoptable(float(container.get("Created") or time.time()))
                kept(container)
                continue
            sandbox.adoption_failed(problem)
        elif (
            container["Id"] in owned
            or pooled(container["Id"])
            # A pooled one is a live session's only while the pool or the session holds it.
            or (labels.get(LABEL_SESSION) in live and not labels.get(LABEL_POOL))
        ):
            kept(container)
            continue
        if await api.remove(container["Id"]):
            removed += 1
        gone(container["Id"])
    for sandbox in expected.values():
        sandbox.adoption_failed(GONE)
    for sandbox in unstored.values():
        sandbox.unstored = False  # none of its own was left: its first call launches one
    if removed:
        log.info("removed %d orphaned sandbox container(s) of instance %s", removed, instance)
    return removed


def adoption_problem(
    container: Mapping[str, Any], session: Session, instance: str, config: SandboxConfig
) -> str | None:
    """Why a listed container (``containers(all=True)`` form) cannot be the session's; None: it can."""
    labels = container.get("Labels") or {}
    expected = {LABEL_INSTANCE: instance, LABEL_SESSION: session.session_id, LABEL_TENANT: session.tenant_id}
    if any(labels.get(k) != v for k, v in expected.items()):
        return "its container's labels no longer matched the session after the server restarted"
    if labels.get(LABEL_POOL):
        made_for = pool_fingerprint(config, config.user_for(session.sandbox_uid, session.sandbox_gid))
        caps = session.capabilities
        if labels.get(LABEL_SPEC) != made_for or (caps is not None and caps.fs_grants is not None):
            return "the sandbox configuration (image, limits or user) changed across the restart"
    elif labels.get(LABEL_SPEC) != spec_fingerprint(config, session):
        return (
            "the sandbox configuration (image, limits, user, workspace or grants) changed across the restart"
        )
    if container.get("State") not in ("running", "paused"):  # paused: its session was
        return f"its container had stopped ({container.get('State')}) when the server restarted"
    lifetime = config.max_lifetime_seconds
    if lifetime is not None and time.time() - float(container.get("Created") or 0) >= lifetime:
        return f"its container had reached the sandbox's maximum lifetime ({lifetime:g} s)"
    return None
