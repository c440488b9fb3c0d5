"""Making one session's container: its mounts pinned and staged, the container created and started,
what it sees checked, and the agent attached (``agent/attach.py``).

``ContainerLauncher`` does one attempt; the provider (``backend.py``) owns the launch slots, the
retry and the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import os
import re
import secrets
import stat
from collections.abc import Callable
from typing import Any

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.egress.gate import EgressGate
from dispatcher.sandbox.container.config import CA_TARGET, WORKSPACE_ROOT, SandboxConfig
from dispatcher.sandbox.container.egress import open_tunnels
from dispatcher.sandbox.container.host import AgentLink
from dispatcher.sandbox.container.labels import (
    LABEL_INSTANCE,
    LABEL_SESSION,
    LABEL_SPEC,
    LABEL_TENANT,
    spec_fingerprint,
)
from dispatcher.sandbox.docker.agent.attach import attach_agent, has_ca, rejoin_agent
from dispatcher.sandbox.docker.agent.listener import LABEL_AGENT_LINK, AgentListener, AgentSockets
from dispatcher.sandbox.docker.client import DockerAPI
from dispatcher.sandbox.docker.host_view import file_seen_from_host, seen_from_host
from dispatcher.sandbox.grants import agent_grant_args
from dispatcher.sandbox.workspace_pin import PinnedMount, Stage, pin_session_mounts, split_relative

log = logging.getLogger(__name__)

NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]+")
"""What may not appear in a container or mount name."""
MAX_CA_BYTES = 16 << 20


class ContainerLauncher:
    """Makes session containers as the config says, labelled with the server instance."""

    def __init__(
        self,
        config: SandboxConfig,
        *,
        instance: str,
        api: DockerAPI,
        run_dir: str,
        egress: Callable[[], EgressGate | None] = lambda: None,
    ) -> None:
        self.config = config
        self._egress = egress
        """The server's egress proxy, if any: the agent listens for it on ``TUNNEL_PORT``."""
        self.instance = instance
        self.api = api
        self._run_dir = run_dir
        """Where staging mounts live: only the server can write there."""
        self.can_mount = os.geteuid() == 0
        """mount(2) works: bind the pinned fds; otherwise verify the container's view after start."""
        self._cpu_turn = itertools.count()
        self.sockets = AgentSockets(
            os.path.join(os.path.dirname(run_dir), "agent"),
            enabled=config.agent_socket and config.runtime in (None, "runc"),
        )
        """Where containers' agents connect (``agent/listener.py``); not ``usable``: attached through
        the daemon."""

    def listen(self) -> AgentListener | None:
        """A listener for a new container's agent (blocking); None when it is attached through the
        daemon instead."""
        if not self.sockets.usable:
            return None
        try:
            return self.sockets.listen()
        except OSError as exc:
            log.warning(
                "cannot listen for agents in %s (%s): attaching them through the daemon",
                self.sockets.root,
                exc,
            )
            self.sockets.usable = False
            return None

    async def launch_once(self, session: Session) -> tuple[AgentLink | None, str]:
        """Pin and stage the mounts, create and start the container, check its view, attach the agent.

        Raises:
            SandboxError: any step failed; the container made, if any, is removed.
        """
        loop = asyncio.get_running_loop()
        # Pinned at every launch (the first and every recreation): a sandbox of the same tenant may
        # have swapped any component of the workspace since the last one.
        stage = await loop.run_in_executor(None, self._stage_mounts, session)
        container_id: str | None = None
        listener: AgentListener | None = None
        try:
            ca = await loop.run_in_executor(None, self._stage_ca, session)
            listener = await loop.run_in_executor(None, self.listen)
            container_id = await self._create_container(session, stage, ca, listener)
            await self.api.start(container_id)
            if not stage.staged:
                await self._verify_mounts(container_id, stage)
            # The started container holds its own copy of every bind mount.
            await loop.run_in_executor(None, stage.release)
            link = await self.start_agent(container_id, session, ca_mounted=ca is not None, listener=listener)
            return link, container_id
        except BaseException:
            await loop.run_in_executor(None, stage.release)
            if container_id is not None:
                with contextlib.suppress(Exception):
                    await self.api.remove(container_id)
                self.sockets.forget(container_id)
            elif listener is not None:
                self.sockets.discard(listener)
            raise
        finally:
            if listener is not None:
                listener.close()

    def _container_spec(
        self, session: Session, mounts: list[dict[str, Any]], listener: AgentListener | None
    ) -> dict[str, Any]:
        labels = {
            LABEL_SESSION: session.session_id,
            LABEL_TENANT: session.tenant_id,
            LABEL_SPEC: spec_fingerprint(self.config, session),
        }
        if listener is not None:
            labels[LABEL_AGENT_LINK] = listener.name
        return self.spec(self.config.user_for(session.sandbox_uid, session.sandbox_gid), labels, mounts)

    def spec(self, user: str, labels: dict[str, str], mounts: list[dict[str, Any]]) -> dict[str, Any]:
        """The create request of a container running as ``user`` with these labels and mounts
        (a session's, or a warm pool's, ``pool/``), hardened as the config says."""
        cfg = self.config
        labels = {**cfg.extra_labels, **labels, LABEL_INSTANCE: self.instance}
        exec_flag = "exec" if cfg.tmp_exec else "noexec"
        host_config: dict[str, Any] = {
            "mounts": mounts,
            "network_mode": cfg.network_mode,
            "cap_drop": list(cfg.cap_drop),
            "cap_add": list(cfg.cap_add) or None,
            "security_opt": ["no-new-privileges:true"] if cfg.no_new_privileges else None,
            "read_only": cfg.read_only,
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,{exec_flag},size={cfg.tmpfs_size},mode=1777"},
            "pids_limit": cfg.pids_limit,
            "mem_limit": cfg.mem_limit,
            "memswap_limit": cfg.mem_limit,  # equal: no swap to hide a memory bomb in
            "nano_cpus": cfg.nano_cpus,
            "cpuset_cpus": self._next_cpuset(),
            "init": cfg.init,
            "runtime": cfg.runtime,
            "ipc_mode": "private",
        }
        return {
            "image": cfg.image,
            # The container only has to stay up; commands come through the agent or docker exec.
            "command": ["sleep", "2147483647"],
            "user": user,
            "working_dir": WORKSPACE_ROOT,
            "labels": labels,
            "hostname": "sandbox",
            "network_disabled": cfg.network_mode == "none",
            "host_config": host_config,
        }

    def _next_cpuset(self) -> str | None:
        """The CPUs of the next container: as many as ``nano_cpus`` allows, taken in turn.

        ``nproc`` (and every runtime that sizes its thread pools with ``sched_getaffinity``)
        then sees the CPU limit instead of the host's CPU count; successive containers get the
        next CPUs round-robin so they spread over the host. None: no pinning.
        """
        if not self.config.pin_cpus:
            return None
        cpus = sorted(os.sched_getaffinity(0))
        wanted = -(-self.config.nano_cpus // 1_000_000_000)  # a fraction of a CPU still needs one
        if wanted >= len(cpus):
            return None
        start = next(self._cpu_turn) * wanted
        return ",".join(str(cpus[(start + i) % len(cpus)]) for i in range(wanted))

    def _stage_ca(self, session: Session) -> str | None:
        """The tenant's CA bundle as the server read it, copied where only the server writes (so
        the file mounted is the one checked, whatever the path points to later); None: none."""
        gate = self._egress()
        path = gate.ca_bundle(session.tenant_id) if gate is not None else None
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                info = os.fstat(f.fileno())
                if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_CA_BYTES:
                    raise SandboxError(f"egress.ca_bundle {path!r} is not a regular file of at most 16 MiB")
                data = f.read(MAX_CA_BYTES + 1)
        except OSError as exc:
            raise SandboxError(f"egress.ca_bundle {path!r} cannot be read: {exc.strerror}") from None
        directory = os.path.join(self._run_dir, "ca")
        os.makedirs(directory, mode=0o755, exist_ok=True)
        target = os.path.join(directory, hashlib.sha256(data).hexdigest()[:32] + ".crt")
        if not os.path.exists(target):
            temp = f"{target}.{secrets.token_hex(4)}"
            with open(temp, "xb") as out:
                out.write(data)
            os.chmod(temp, 0o444)
            os.replace(temp, target)
        return target

    async def _create_container(
        self, session: Session, stage: Stage, ca: str | None, listener: AgentListener | None
    ) -> str:
        mounts = self._mounts(stage)
        if ca is not None:
            mounts.append({"Type": "bind", "Source": ca, "Target": CA_TARGET, "ReadOnly": True})
        if listener is not None:
            mounts.append(listener.mount)
        spec = self._container_spec(session, mounts, listener)
        container_id = await self.api.create_container(self.container_name(session.session_id), spec)
        if listener is not None:
            self.sockets.made(container_id, listener)
        return container_id

    def container_name(self, session_id: str) -> str:
        """A new container's name for the session (a warm pool's names its own after the session
        it is made for): unique, and readable in ``docker ps``."""
        return "-".join(
            ("dispatcher", self.instance[:12], NAME_UNSAFE.sub("_", session_id)[:40], secrets.token_hex(3))
        )

    def _owner(self, session: Session) -> tuple[int, int] | None:
        """uid/gid that directories the server makes for the sandbox are handed to."""
        uid = session.sandbox_uid if session.sandbox_uid is not None else self.config.uid
        gid = session.sandbox_gid if session.sandbox_gid is not None else self.config.gid
        if not self.config.chown_workspace or uid is None:
            return None
        return uid, gid if gid is not None else -1

    def _stage_mounts(self, session: Session) -> Stage:
        """Pin the workspace and its grant directories, and stage them for Docker (blocking).

        Raises:
            SandboxError: a symlink or non-directory on the way, or a mount failed.
        """
        pins, tmpfs = self.pin_mounts(session)
        stage = Stage(self._run_dir, pins, empty_root=tmpfs)
        if self.can_mount:
            stage.bind_all(NAME_UNSAFE.sub("_", session.session_id)[:40])
        else:
            stage.use_paths(markers=self.config.runtime == "runsc")
        return stage

    def pin_mounts(self, session: Session) -> tuple[list[PinnedMount], bool]:
        """``pin_session_mounts`` for the session's workspace and grants (blocking).

        Raises:
            SandboxError: a symlink or non-directory on the way.
        """
        if session.workspace_root is not None:
            root = session.workspace_root
            parts = split_relative(session.workspace_name, "workspace")
        else:  # a Session built by hand (tests, embedding): its path is trusted as given
            root, parts = session.workspace_path, []
        caps = session.capabilities
        grants = None
        if caps is not None and caps.fs_grants is not None:
            grants = [(g.prefix, g.mode) for g in caps.fs_grants]
        return pin_session_mounts(root, parts, grants, owner=self._owner(session), target=WORKSPACE_ROOT)

    @staticmethod
    def _mounts(stage: Stage) -> list[dict[str, Any]]:
        mounts: list[dict[str, Any]] = []
        if stage.empty_root:
            # Grants without ".": nothing of the workspace but the granted directories exists.
            mounts.append(
                {
                    "Type": "tmpfs",
                    "Target": WORKSPACE_ROOT,
                    "ReadOnly": True,
                    "TmpfsOptions": {"SizeBytes": 1 << 20, "Mode": 0o755},
                }
            )
        for pin, source in zip(stage.pinned, stage.sources, strict=True):
            mounts.append(
                {
                    "Type": "bind",
                    "Source": source,
                    "Target": pin.target,
                    "ReadOnly": pin.read_only,
                    "BindOptions": {"Propagation": "rprivate"},
                }
            )
        return mounts

    async def running_pid(self, container_id: str) -> int | None:
        """The host pid of a running, unpaused runc container's init, when this server may look
        into it from the host (root): a re-adopted container is then checked through
        ``/proc/<pid>/root`` and its waiting agent rejoined, with no ``docker exec``. None
        otherwise (gVisor shows its own inodes and keeps its sockets to itself)."""
        if os.geteuid() != 0:
            return None
        info = await self.api.inspect(container_id)
        state = info.get("State") or {}
        pid = state.get("Pid")
        if (
            (info.get("HostConfig") or {}).get("Runtime") != "runc"
            or not state.get("Running")
            or state.get("Paused")
            or not isinstance(pid, int)
            or pid <= 0
        ):
            return None
        return pid

    async def confirm_view(self, container_id: str, session: Session, *, pid: int | None = None) -> None:
        """A container kept across a restart sees the session's mounts as they are pinned now: a
        bind mount holds the directory it was made from, so one renamed, and another put at the
        session's path, while no server ran would be served under the wrong name (re-adoption).
        Given its init's ``pid`` (``running_pid``), it is looked at from the host; otherwise
        asked of the container.

        Raises:
            SandboxError: it does not, or the mounts cannot be pinned.
        """
        why = "its container no longer saw the session's workspace (moved or replaced while the server was down)"
        loop = asyncio.get_running_loop()
        pins, tmpfs = await loop.run_in_executor(None, self.pin_mounts, session)
        stage = Stage(self._run_dir, pins, empty_root=tmpfs)
        try:
            if pid is not None:
                if not await loop.run_in_executor(
                    None, seen_from_host, pid, stage.identities(), container_id
                ):
                    raise SandboxError(why)
                return
            await loop.run_in_executor(None, lambda: stage.use_paths(markers=self.config.runtime == "runsc"))
            await self._verify_mounts(container_id, stage, why)
        finally:
            await loop.run_in_executor(None, stage.release)

    async def _verify_mounts(
        self,
        container_id: str,
        stage: Stage,
        why: str = "the workspace changed while its container was created (a symlink was swapped in);"
        " refusing to use it",
    ) -> None:
        """The container must see exactly the pinned directories (without mount(2), after a
        launch; at every re-adoption); ``why`` is the error's message.

        runc shows the host's device and inode numbers; gVisor shows its own, so there a marker
        file made through each pinned fd must be visible at the mount's target.

        Raises:
            SandboxError: it does not (a component was swapped between the walk and Docker's use).
        """
        if not stage.pinned:
            return
        if self.config.runtime == "runsc":
            paths = [f"{target}/{name}" for target, name in stage.markers]
            cmd = ["sh", "-c", 'for f; do test -e "$f" || exit 1; done', "sh", *paths]
            code, _ = await self.api.exec_run(container_id, cmd)
            ok = code == 0
        else:
            expected = stage.identities()
            targets = [target + "/." for target, _, _ in expected]
            code, out = await self.api.exec_run(container_id, ["stat", "-c", "%d %i", *targets])
            seen = [line.split() for line in out.decode(errors="replace").splitlines()]
            ok = code == 0 and seen == [[str(dev), str(ino)] for _, dev, ino in expected]
        if not ok:
            raise SandboxError(why)

    async def start_agent(
        self,
        container_id: str,
        session: Session,
        *,
        ca_mounted: bool | None = None,
        listener: AgentListener | None = None,
    ) -> AgentLink | None:
        """Attach the agent; None when the image cannot run it (the docker exec fallback applies).

        ``ca_mounted``: whether the container has the tenant's CA bundle at ``CA_TARGET``; None
        (a container adopted after a restart): asked of the container itself. ``listener``: the
        one mounted in a container just made (``listen``).

        Raises:
            SandboxError: the agent started but did not answer its first ping.
        """
        user = self.config.user_for(session.sandbox_uid, session.sandbox_gid)
        # The session's grants: the agent enforces them on every descriptor it opens.
        link = await self.attach_agent(container_id, user, agent_grant_args(session), listener=listener)
        if link is not None:
            await self.open_tunnels(container_id, session, link, ca_mounted=ca_mounted)
        return link

    async def rejoin_agent(self, container_id: str, session: Session, pid: int) -> AgentLink | None:
        """The agent waiting in a re-adopted container whose init is ``pid`` (``running_pid``),
        given its channel by the server (``agent/rejoin.py``), its egress listener opened; None
        when there is none to rejoin (start one: ``start_agent``).

        Raises:
            SandboxError: it took the channel but did not answer, or refused the egress listener.
        """
        user = self.config.user_for(session.sandbox_uid, session.sandbox_gid)
        link = await rejoin_agent(self.config, container_id, pid, user, agent_grant_args(session))
        if link is not None:
            loop = asyncio.get_running_loop()
            ca = await loop.run_in_executor(None, file_seen_from_host, pid, CA_TARGET, container_id)
            await self.open_tunnels(container_id, session, link, ca_mounted=ca)
        return link

    def needs_ca(self, session: Session) -> bool:
        """Whether the session's container must be created with its tenant's egress CA bundle."""
        gate = self._egress()
        return gate is not None and gate.ca_bundle(session.tenant_id) is not None

    async def attach_agent(
        self, container_id: str, user: str, grant_args: list[str], *, listener: AgentListener | None = None
    ) -> AgentLink | None:
        """``start_agent`` for a container running as ``user`` (a warm pool's: no session yet);
        see ``agent.attach.attach_agent``.

        Raises:
            SandboxError: the agent started but did not answer its first ping.
        """
        return await attach_agent(
            self.api, self.config, container_id, user, grant_args, sockets=self.sockets, listener=listener
        )

    async def open_tunnels(
        self, container_id: str, session: Session, link: AgentLink, *, ca_mounted: bool | None = None
    ) -> None:
        """The session's egress listener in its agent, when the server has an egress proxy
        (``ca_mounted``: see ``start_agent``).

        Raises:
            SandboxError: the agent refused it (the link is closed).
        """
        stream, channel = link
        await open_tunnels(
            self._egress(), session, channel, stream, has_ca(self.api, container_id, ca_mounted)
        )
