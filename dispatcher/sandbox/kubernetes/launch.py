"""Making one session's Pod: its workspace claim (and its tenant's CA bundle, ``ca.py``), the Pod,
waiting for it to run, the agent attached.

``PodLauncher`` does one attempt; the provider (``backend.py``) owns the launch slots, the retry
and the metrics, as on Docker. The agent is the Pod's own process, reached over ``pods/attach``
(``attach.py``); ``start_agent`` also re-attaches to a Pod adopted after a restart, whose agent is
the same one the previous server talked to.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.egress.gate import EgressGate
from dispatcher.sandbox.agent.protocol import PROTOCOL_VERSION
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.container.config import WORKSPACE_ROOT, SandboxConfig
from dispatcher.sandbox.container.egress import open_tunnels
from dispatcher.sandbox.container.host import LiveContainer
from dispatcher.sandbox.container.image import ImageUnusable, version_mismatch
from dispatcher.sandbox.container.kubernetes_config import KubernetesConfig
from dispatcher.sandbox.container.labels import LABEL_INSTANCE
from dispatcher.sandbox.kubernetes.api import KubeAPI, Obj
from dispatcher.sandbox.kubernetes.attach import ChannelStream
from dispatcher.sandbox.kubernetes.ca import (
    LABEL_CA,
    CaMaps,
    configmap_manifest,
    mounted_ca,
    read_bundle,
    same_content,
)
from dispatcher.sandbox.kubernetes.manifests import label_value, pod_manifest, pod_name, pvc_manifest
from dispatcher.sandbox.kubernetes.pods import cannot_start, pod_running

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
        self.cas = CaMaps()
        """The egress CA bundles' ConfigMaps (``ca.py``)."""

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
        ca = self._ca_manifest(session)
        ca_name = ca["metadata"]["name"] if ca is not None else None
        with self.cas.using(ca_name):
            if ca is not None:
                await self._ensure_ca(api, ca)
            manifest = pod_manifest(
                self.config, self.kube, session, instance=self.instance, name=name, ca=ca_name
            )
            await api.create_pod(manifest)
        try:
            await self._wait_running(api, name)
            link = await self.start_agent(name, session, ca_mounted=ca is not None)
        except BaseException:
            with contextlib.suppress(Exception):
                await api.delete_pod(name)
            raise
        return LiveContainer(name, link[0], link[1], started=self._clock())

    def _ca_manifest(self, session: Session) -> Obj | None:
        """The ConfigMap of the tenant's egress CA bundle as read now; None: it has none (or
        there is no egress proxy).

        Raises:
            SandboxError: the file cannot be read or is too big for a ConfigMap.
        """
        gate = self._egress()
        path = gate.ca_bundle(session.tenant_id) if gate is not None else None
        if path is None:
            return None
        label = label_value(self.instance)
        return configmap_manifest(self.kube.namespace, self.instance, read_bundle(path), instance_label=label)

    async def _ensure_ca(self, api: KubeAPI, wanted: Obj) -> None:
        """The bundle's ConfigMap exists with these bytes (made once per process, checked if found).

        Raises:
            SandboxError: one of that name holds something else, or the API refused.
        """
        name = wanted["metadata"]["name"]
        if name in self.cas.known:
            return
        if await api.create_configmap(wanted) is None:
            found = await api.get_configmap(name)
            if found is not None and not same_content(found, wanted):
                raise SandboxError(
                    f"configmap {name} exists but does not hold the egress CA bundle it is named for "
                    "(delete it: the server makes it again)"
                )
            if found is None:  # deleted between the two calls: once more
                await api.create_configmap(wanted)
        self.cas.known.add(name)

    async def sweep_cas(self) -> int:
        """Delete this instance's CA ConfigMaps that none of its Pods mounts and no launch used
        while this ran; how many were deleted."""
        api = await self._client()
        instance = {LABEL_INSTANCE: label_value(self.instance)}
        deleted = 0
        with self.cas.guard() as in_use:
            # Listed after the guard began: a Pod created before is listed, a launch after is seen.
            mounted = {mounted_ca(pod) for pod in await api.list_pods(instance)}
            for item in await api.list_configmaps({**instance, LABEL_CA: "true"}):
                name = item["metadata"]["name"]
                if name in mounted or name in in_use:
                    continue
                self.cas.forget([name])
                if await api.delete_configmap(name):
                    deleted += 1
        return deleted

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

    async def start_agent(
        self, container_id: str, session: Session, *, ca_mounted: bool | None = None
    ) -> tuple[ChannelStream, AgentChannel]:
        """Attach to the Pod's agent and check it answers and speaks our protocol.

        ``ca_mounted``: whether the Pod mounts its tenant's CA bundle; None (re-attaching after a
        restart): read from the Pod's spec.

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
        # A re-attached agent re-homes its listener to this link.
        has_ca = functools.partial(self._has_ca, api, container_id, ca_mounted)
        await open_tunnels(self._egress(), session, channel, stream, has_ca)
        return stream, channel

    async def _has_ca(self, api: KubeAPI, name: str, mounted: bool | None) -> bool:
        """Whether the bundle is there to name: known for a Pod made here; read from the spec of
        one made by an earlier server (maybe before the tenant had a bundle). Variables naming a
        missing file would break every TLS client in it; none break nothing that worked before."""
        if mounted is not None:
            return mounted
        pod = await api.get_pod(name)
        if pod is not None and mounted_ca(pod) is not None:
            return True
        log.warning(
            "pod %s (re-attached) mounts no egress CA bundle: its commands are not told of one; "
            "it gets one when the session's sandbox is next recreated",
            name,
        )
        return False
