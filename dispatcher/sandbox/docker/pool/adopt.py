"""Adopting a warm pool's container (``warm_pool.py``) for a session: its workspace mounted through a slot.

A bind mount is fixed when a container is created, so a pooled container cannot be given its
session's workspace the usual way. Instead each one is created with an empty per-slot directory
of the server's (``<state>/run/pool/<slot>``, root-owned, mode 0755, made a shared mount) bound at
``/workspace`` with ``rslave`` propagation. Adopting it for a session:

1. the session's workspace is pinned exactly as a launch pins it (``ContainerLauncher.pin_mounts``:
   walked from the tenant's root without following a link) and the pinned fd is bind-mounted onto
   the slot, from the host; the mount propagates into the container, over its empty ``/workspace``;
2. a marker file with a random name is made through the pinned fd, and the container's agent must
   see it at ``/workspace/<name>`` before the session gets the container; the marker is removed.

So the server never follows a path a sandbox could have changed (the slot's path is the server's
own; what is mounted is the pinned fd), and what the container sees is confirmed by its agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import secrets
from collections.abc import Callable, Collection

from dispatcher.core.sandbox_api import FileOpError, SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import WORKSPACE_ROOT
from dispatcher.sandbox.container.host import AgentLink
from dispatcher.sandbox.docker.launch import ContainerLauncher
from dispatcher.sandbox.workspace_pin import bind_mount, detach_mount, make_shared_mount

log = logging.getLogger(__name__)

_SLOT_NAME = re.compile(r"[0-9a-f]{16}")
"""A slot's name: ``secrets.token_hex(8)``."""
_MARKER_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class SlotMounts:
    """The host side of the slots, with mount(2): the seam unit tests replace (they run without it)."""

    def __init__(self, can_mount: Callable[[], bool] = lambda: os.geteuid() == 0) -> None:
        self._can_mount = can_mount

    def available(self) -> bool:
        """mount(2) works (the server runs as root)."""
        return self._can_mount()

    def make(self, slots_dir: str) -> str:
        """A new empty slot directory, root-owned and made a shared mount (blocking).

        Raises:
            SandboxError: it could not be made.
        """
        os.makedirs(slots_dir, mode=0o700, exist_ok=True)
        slot = os.path.join(slots_dir, secrets.token_hex(8))
        os.mkdir(slot, 0o755)
        try:
            make_shared_mount(slot)
        except OSError as exc:
            self.release(slot)
            raise SandboxError(f"cannot make a warm pool slot: {exc}") from exc
        return slot

    def attach(self, slot: str, fd: int) -> None:
        """Mount the directory pinned by ``fd`` on the slot (blocking); OSError when it fails."""
        bind_mount(f"/proc/self/fd/{fd}", slot)

    def release(self, slot: str) -> None:
        """Unmount everything on the slot (a workspace, then its own mount) and remove it."""
        for _ in range(4):
            try:
                detach_mount(slot)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOENT):
                    log.warning("could not unmount warm pool slot %s: %s", slot, exc)
                break
        with contextlib.suppress(OSError):
            os.rmdir(slot)

    def owns(self, slots_dir: str, path: str) -> bool:
        """Whether ``path`` (a pooled container's /workspace source, as Docker reports it) names one
        of the slots this server makes in ``slots_dir``."""
        return os.path.dirname(path) == slots_dir and _SLOT_NAME.fullmatch(os.path.basename(path)) is not None

    def release_stale(self, slots_dir: str, keep: Collection[str] = ()) -> None:
        """Slots a previous run of this server left, but those of re-adopted containers (``keep``;
        the others' pooled containers were removed as orphans)."""
        with contextlib.suppress(OSError):
            for name in os.listdir(slots_dir):
                if os.path.join(slots_dir, name) not in keep:
                    self.release(os.path.join(slots_dir, name))


async def adopt(
    launcher: ContainerLauncher,
    mounts: SlotMounts,
    session: Session,
    *,
    container_id: str,
    slot: str,
    link: AgentLink,
) -> None:
    """Mount the session's workspace on a pooled container's slot, confirm its agent sees it
    there, and open the session's egress listener.

    Raises:
        SandboxError: the workspace could not be mounted, or the container does not see it.
    """
    await _see_and_open(launcher, session, container_id, link, mounts, slot)


async def readopt(
    launcher: ContainerLauncher, session: Session, *, container_id: str, link: AgentLink
) -> None:
    """A restarted server re-adopting a pooled container: its new agent must see, at /workspace,
    the session's workspace as pinned now (the slot's mount outlived the old server, or it did
    not); then the session's egress listener is opened.

    Raises:
        SandboxError: it does not see it.
    """
    await _see_and_open(launcher, session, container_id, link, None, None)


async def _see_and_open(
    launcher: ContainerLauncher,
    session: Session,
    container_id: str,
    link: AgentLink,
    mounts: SlotMounts | None,
    slot: str | None,
) -> None:
    """Pin the workspace (mounted on ``slot``, given one), confirm the agent sees it, open the
    session's egress listener."""
    loop = asyncio.get_running_loop()
    fd, marker = await loop.run_in_executor(None, _pin_and_mark, launcher, session, mounts, slot)
    await _confirm(link, fd, marker)
    # Never made with a CA bundle (such sessions launch their own): nothing to ask the container.
    await launcher.open_tunnels(container_id, session, link, ca_mounted=False)


async def _confirm(link: AgentLink, fd: int, marker: str) -> None:
    """The agent sees ``marker`` (made through ``fd``, the pinned workspace) at /workspace;
    the marker is removed and ``fd`` closed either way."""
    try:
        try:
            seen = await link[1].stat(marker)
        except FileOpError as exc:
            raise SandboxError(f"the pooled container does not see its session's workspace ({exc})") from None
        if seen.kind != "file":
            raise SandboxError(f"the pooled container sees {marker} as a {seen.kind}")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(marker, dir_fd=fd)
        os.close(fd)


def _pin_and_mark(
    launcher: ContainerLauncher, session: Session, mounts: SlotMounts | None, slot: str | None
) -> tuple[int, str]:
    """Pin the workspace, mount it on ``slot`` (given one), make the marker (blocking); (pinned
    fd, marker)."""
    pins, empty_root = launcher.pin_mounts(session)
    if empty_root or len(pins) != 1 or pins[0].target != WORKSPACE_ROOT or pins[0].read_only:
        for pin in pins:
            os.close(pin.fd)
        raise SandboxError("the session's workspace is not one read-write mount")
    fd = pins[0].fd
    try:
        if mounts is not None and slot is not None:
            mounts.attach(slot, fd)
        marker = f".dispatcher-adopt-{secrets.token_hex(12)}"
        os.close(os.open(marker, _MARKER_FLAGS, 0o600, dir_fd=fd))
    except OSError as exc:
        os.close(fd)
        raise SandboxError(f"cannot mount the workspace into a pooled container: {exc}") from exc
    return fd, marker
