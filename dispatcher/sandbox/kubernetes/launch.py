"""Making one session's Pod: its workspace claim, the Pod, waiting for it to run, the agent attached.

``PodLauncher`` does one attempt; the provider (``backend.py``) owns the launch slots, the retry
and the metrics, as on Docker. The agent is the Pod's own process, reached over ``pods/attach``
(``attach.py``); ``start_agent`` also re-attaches to a Pod adopted after a restart, whose agent is
the same one the previous server talked to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.session import Session
from dispatcher.egress.gate import EgressGate
from dispatcher.sandbox.agent.protocol import PROTOCOL_VERSION, TUNNEL_PORT
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.docker.config import WORKSPACE_ROOT, SandboxConfig
from dispatcher.sandbox.docker.host import LiveContainer
from dispatcher.sandbox.docker.image_check import ImageUnusable, version_mismatch
from dispatcher.sandbox.kubernetes.api import KubeAPI
from dispatcher.sandbox.kubernetes.attach import ChannelStream
from dispatcher.sandbox.kubernetes.config import KubernetesConfig
from dispatcher.sandbox.kubernetes.manifests import pod_manifest, pod_name, pvc_manifest
from dispatcher.sandbox.kubernetes.pods import cannot_start, pod_running
from dispatcher.sandbox.tunnels import tunnel_setup

log = logging.getLogger(__name__)

POLL_SECONDS = 0.1
"""How often a starting Pod's phase is read (the stand-in and a warm node start one in ~1 s)."""


class PodLauncher:
    """Makes session Pods as the config says, labelled with the server instance."""

    def __init__(
        self,
        config: SandboxConfig,
        kube: KubernetesConfig,
        *,
        instance: str,
        client: Callable[[], Awaitable[KubeAPI]],
        egress: Callable[[], EgressGate | None],
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.kube = kube
        self.instance = instance
        self._client = client
        """The provider's API client, connected on first use."""
        self._egress = egress
        """The server's egress proxy, if any (set on the provider after it is made)."""
        self._clock = clock
        self._claims: set[str] = set()
        """PVCs known to exist (made or found by this process)."""

    async def launch_once(self, session: Session) -> LiveContainer:
        """The session's PVC (made once), a new Pod, running, with its agent attached.

        Raises:
            SandboxError: any step failed; the Pod made, if any, is deleted.
        """
        api = await self._client()
        claim = pvc_manifest(self.config, self.kube, session)
        if claim["metadata"]["name"] not in self._claims:
            await api.ensure_pvc(claim)
            self._claims.add(claim["metadata"]["name"])
        name = pod_name(self.instance, session.session_id)
        await api.create_pod(pod_manifest(self.config, self.kube, session, instance=self.instance, name=name))
        try:
            await self._wait_running(api, name)
            link = await self.start_agent(name, session)
        except BaseException:
            with contextlib.suppress(Exception):
                await api.delete_pod(name)
            raise
        return LiveContainer(name, link[0], link[1], started=self._clock())

    async def _wait_running(self, api: KubeAPI, name: str) -> None:
        deadline = time.monotonic() + self.kube.pod_ready_timeout_seconds
        while True:
            pod = await api.get_pod(name)
            if pod is None:
                raise SandboxError(f"pod {name} was deleted while it started")
            if pod_running(pod):
                return
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Failed", "Succeeded"):
                raise SandboxError(f"pod {name} ended ({phase}) before its agent was attached")
            fatal = cannot_start(pod)
            if fatal is not None:
                raise ImageUnusable(f"pod {name} cannot start: {fatal[0]}: {fatal[1]}")
            if time.monotonic() >= deadline:
                raise SandboxError(
                    f"pod {name} was not running after {self.kube.pod_ready_timeout_seconds:g} s (phase {phase})"
                )
            await asyncio.sleep(POLL_SECONDS)

    async def start_agent(self, container_id: str, session: Session) -> tuple[ChannelStream, AgentChannel]:
        """Attach to the Pod's agent and check it answers and speaks our protocol.

        Raises:
            SandboxError: the attach was refused or the agent did not answer its ping.
        """
        api = await self._client()
        ws, protocol = await api.attach(container_id)
        stream = ChannelStream(ws, protocol, container_id)
        # The agent outlives a server restart, and may still answer the previous link's calls: ids
        # from the clock (µs) start above any id an earlier link used, so those answers are ignored.
        channel = AgentChannel(
            stream.reader, stream.writer, workspace_root=WORKSPACE_ROOT, first_id=time.time_ns() // 1000
        )
        try:
            version = await channel.ping(timeout=self.config.agent_start_timeout)
        except (SandboxError, ConnectionError) as exc:
            with contextlib.suppress(Exception):
                await channel.close()
            stream.close()
            tail = stream.stderr_tail().decode(errors="replace").strip()[-500:]
            raise SandboxError(
                f"the sandbox agent in pod {container_id} did not answer: {exc}; stderr: {tail}"
            ) from exc
        if version != PROTOCOL_VERSION:
            with contextlib.suppress(Exception):
                await channel.close()
            stream.close()
            raise version_mismatch(self.config.image, version)
        egress = self._egress()
        setup = tunnel_setup(egress, session)
        if setup is not None:
            # No host file reaches a Pod: a tenant's egress.ca_bundle is not mounted (yet), so its
            # variables are not set either. A re-attached agent re-homes its listener to this link.
            if egress is not None and egress.ca_bundle(session.tenant_id):
                log.warning("egress.ca_bundle of tenant %s is not mounted into Pods", session.tenant_id)
            try:
                await channel.open_tunnels(setup.serve, port=TUNNEL_PORT, env={})
            except SandboxError:
                with contextlib.suppress(Exception):
                    await channel.close()
                stream.close()
                raise
        return stream, channel
