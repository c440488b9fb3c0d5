"""The few Kubernetes API calls the backend makes, through ``kubernetes_asyncio``.

Why that library: it is the official client generated for asyncio (aiohttp underneath), so its
``pods/attach`` is a WebSocket on the caller's event loop, with no thread per session (the
``kubernetes`` package attaches through a blocking ``websocket-client`` thread; ``lightkube`` has
no attach; ``kr8s`` wraps the sync client). It loads kubeconfigs and in-cluster service accounts
(token rotation included). Two quirks: the ``v5.channel.k8s.io`` subprotocol is asked for with the
header in lower case (``sec-websocket-protocol``: the library only adds its v4 default when that
key is absent), and the negotiated subprotocol is read from the handshake's response headers.

Objects go in and come out as plain dicts (``_preload_content=False``), so nothing depends on
the generated models. Errors become ``SandboxError`` naming the API's own message.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.stream import WsApiClient

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.container.kubernetes_config import KubernetesConfig

Obj = dict[str, Any]

CHANNEL_PROTOCOLS = "v5.channel.k8s.io,v4.channel.k8s.io"
"""Offered in this order: v5 when the server has it (1.30+), else v4 (the same channels)."""


class KubeAPI:
    """Pods, PVCs, CA bundle ConfigMaps and the NetworkPolicy in one namespace."""

    def __init__(self, configuration: client.Configuration, namespace: str) -> None:
        # One connection per attached session: no pool limit (aiohttp's default is 100).
        configuration.connection_pool_maxsize = 0
        self.namespace = namespace
        self._api = client.ApiClient(configuration)
        self._ws = WsApiClient(configuration)
        self._core = client.CoreV1Api(self._api)
        self._net = client.NetworkingV1Api(self._api)
        self._attach = client.CoreV1Api(self._ws)

    @classmethod
    async def connect(cls, kube: KubernetesConfig) -> KubeAPI:
        """Credentials from ``kube.kubeconfig``, or in-cluster when it is null.

        Raises:
            SandboxError: no usable credentials.
        """
        configuration = client.Configuration()
        try:
            if kube.kubeconfig is None:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            else:
                await config.load_kube_config(
                    config_file=kube.kubeconfig, context=kube.context, client_configuration=configuration
                )
        except (config.ConfigException, OSError) as exc:
            where = kube.kubeconfig or "the in-cluster service account"
            raise SandboxError(f"cannot load Kubernetes credentials from {where}: {exc}") from exc
        return cls(configuration, kube.namespace)

    async def aclose(self) -> None:
        await self._api.close()
        await self._ws.close()

    # -- pods ------------------------------------------------------------------------------

    async def create_pod(self, body: Obj) -> Obj:
        return await self._call("create pod", self._core.create_namespaced_pod, self.namespace, body)

    async def get_pod(self, name: str) -> Obj | None:
        """The Pod, or None when there is none of that name."""
        try:
            return await self._call("read pod", self._core.read_namespaced_pod, name, self.namespace)
        except _NotFound:
            return None

    async def list_pods(self, labels: dict[str, str]) -> list[Obj]:
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        found = await self._call(
            "list pods", self._core.list_namespaced_pod, self.namespace, label_selector=selector
        )
        items: list[Obj] = found.get("items") or []
        return items

    async def delete_pod(self, name: str, grace_seconds: int = 0) -> bool:
        """Delete the Pod now (grace 0: its processes are killed); False if it was gone."""
        try:
            await self._call(
                "delete pod",
                self._core.delete_namespaced_pod,
                name,
                self.namespace,
                grace_period_seconds=grace_seconds,
            )
        except _NotFound:
            return False
        return True

    async def attach(self, name: str) -> tuple[aiohttp.ClientWebSocketResponse, str]:
        """The Pod's process's stdin/stdout/stderr as a WebSocket, and the subprotocol agreed.

        Raises:
            SandboxError: the handshake was refused (no such Pod, not running, forbidden).
        """
        try:
            # Typed as returning the output text; with _preload_content=False it is the connection.
            connect: Any = self._attach.connect_get_namespaced_pod_attach
            connecting = await connect(
                name,
                self.namespace,
                container="agent",
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                _preload_content=False,
                _headers={"sec-websocket-protocol": CHANNEL_PROTOCOLS},
            )
            ws: aiohttp.ClientWebSocketResponse = await connecting
        except aiohttp.WSServerHandshakeError as exc:
            raise SandboxError(f"attaching to pod {name} was refused ({exc.status}: {exc.message})") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise SandboxError(f"attaching to pod {name} failed: {exc}") from exc
        # The library does not pass protocols= to aiohttp, so ws.protocol is None: ask the handshake.
        response = getattr(ws, "_response", None)
        protocol = response.headers.get("Sec-WebSocket-Protocol", "") if response is not None else ""
        return ws, protocol

    # -- workspace claims and the network policy -------------------------------------------

    async def ensure_pvc(self, body: Obj) -> bool:
        """Create the claim unless it exists; True if it was created."""
        return await self._ensure(
            "create persistentvolumeclaim",
            self._core.create_namespaced_persistent_volume_claim,
            self.namespace,
            body,
        )

    async def ensure_network_policy(self, body: Obj) -> bool:
        return await self._ensure(
            "create networkpolicy", self._net.create_namespaced_network_policy, self.namespace, body
        )

    async def create_configmap(self, body: Obj) -> Obj | None:
        """Create it; None when one of that name exists (409)."""
        try:
            return await self._call(
                "create configmap", self._core.create_namespaced_config_map, self.namespace, body
            )
        except _Conflict:
            return None

    async def get_configmap(self, name: str) -> Obj | None:
        try:
            return await self._call(
                "read configmap", self._core.read_namespaced_config_map, name, self.namespace
            )
        except _NotFound:
            return None

    async def list_configmaps(self, labels: dict[str, str]) -> list[Obj]:
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        found = await self._call(
            "list configmaps", self._core.list_namespaced_config_map, self.namespace, label_selector=selector
        )
        items: list[Obj] = found.get("items") or []
        return items

    async def delete_configmap(self, name: str) -> bool:
        """False if it was gone."""
        try:
            await self._call(
                "delete configmap", self._core.delete_namespaced_config_map, name, self.namespace
            )
        except _NotFound:
            return False
        return True

    async def check_access(self) -> None:
        """One cheap request that needs the namespace and the right to list Pods in it.

        Raises:
            SandboxError: the API server is unreachable or refuses.
        """
        await self._call("list pods", self._core.list_namespaced_pod, self.namespace, limit=1)

    # -- internals -------------------------------------------------------------------------

    async def _ensure(self, what: str, method: Any, *args: Any) -> bool:
        try:
            await self._call(what, method, *args)
        except _Conflict:
            return False
        return True

    async def _call(self, what: str, method: Any, *args: Any, **kw: Any) -> Obj:
        """A generated call, made with ``_preload_content=False`` (then the library checks no
        status): the body as a dict.

        Raises:
            SandboxError: the API answered an error (``_NotFound``, ``_Conflict``) or is unreachable.
        """
        try:
            response = await method(*args, _preload_content=False, **kw)
            async with response:
                status, data = response.status, await response.read()
        except ApiException as exc:  # refused before sending (bad arguments)
            raise SandboxError(f"kubernetes: {what} failed: {exc.reason}") from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise SandboxError(f"kubernetes: {what} failed: {exc}") from exc
        try:
            body = json.loads(data or b"{}")
        except ValueError:
            body = {"message": data[:200].decode(errors="replace")}
        if not isinstance(body, dict):
            body = {}
        if 200 <= status < 300:
            return body
        message = str(body.get("message") or status)
        if status == 404:
            raise _NotFound(f"{what}: {message}")
        if status == 409:
            raise _Conflict(f"{what}: {message}")
        raise SandboxError(f"kubernetes: {what} failed ({status}): {message}")


class _NotFound(SandboxError):
    pass


class _Conflict(SandboxError):
    pass
