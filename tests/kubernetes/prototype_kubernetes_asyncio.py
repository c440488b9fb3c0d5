"""Prototype for issue 24's client choice: kubernetes_asyncio creates a Pod on the stand-in, lists
it by label and attaches to it over WebSocket from asyncio (aiohttp on the caller's loop, no
thread per stream). Not a test (kubernetes_asyncio is not a dependency yet); run it with
``pip install kubernetes_asyncio`` then
``PYTHONPATH=. python3 tests/kubernetes/prototype_kubernetes_asyncio.py``.

Found: the v4 default is replaced by passing the header in lower case (the library checks
``'sec-websocket-protocol' not in headers``); ``ws.protocol`` stays None because the library
does not pass ``protocols=`` to aiohttp, so the backend must read the negotiated subprotocol from
the response headers to know whether v5's close is available.
"""

import asyncio
import tempfile
import threading
from pathlib import Path
from typing import Any

import docker
from kubernetes_asyncio import client, config
from kubernetes_asyncio.stream import WsApiClient

from tests.kube_standin import StandIn


async def main(kubeconfig: Path) -> None:
    await config.load_kube_config(config_file=str(kubeconfig))
    async with client.ApiClient() as api:
        core = client.CoreV1Api(api)
        body = client.V1Pod(
            metadata=client.V1ObjectMeta(name="proto", labels={"dispatcher.session": "p1"}),
            spec=client.V1PodSpec(
                restart_policy="Never",
                containers=[
                    client.V1Container(
                        name="main",
                        image="dispatcher-sandbox:latest",
                        command=["cat"],
                        stdin=True,
                        stdin_once=True,
                    )
                ],
            ),
        )
        await core.create_namespaced_pod("sb", body)
        for _ in range(100):
            pod = await core.read_namespaced_pod("proto", "sb")
            if pod.status.phase == "Running":
                break
            await asyncio.sleep(0.1)
        pods = await core.list_namespaced_pod("sb", label_selector="dispatcher.session=p1")
        print("listed", [p.metadata.name for p in pods.items])
    async with WsApiClient(header_name="sec-websocket-protocol", header_value="v5.channel.k8s.io") as ws_api:
        core = client.CoreV1Api(ws_api)
        # _preload_content=False: the raw aiohttp WebSocket, driven from this event loop.
        # Typed as returning str (the preloaded body); unpreloaded, it is the WebSocket's context.
        ws_ctx: Any = await core.connect_get_namespaced_pod_attach(
            "proto", "sb", stdin=True, stdout=True, stderr=True, _preload_content=False
        )
        async with ws_ctx as ws:
            print("subprotocol", ws.protocol, "threads", threading.active_count())
            await ws.send_bytes(b"\x00hello from kubernetes_asyncio\n")
            await ws.send_bytes(b"\xff\x00")
            async for msg in ws:
                print("channel", msg.data[0], msg.data[1:])


tmp = Path(tempfile.mkdtemp())
with StandIn(docker.from_env(), tmp / "state", instance="proto") as s:
    s.create_namespace("sb")
    asyncio.run(main(s.kubeconfig(tmp / "kc", namespace="sb")))
