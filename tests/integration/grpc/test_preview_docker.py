"""ConnectPort and the preview gateway on the Docker backend (marker ``docker``): a server the
model started in its container is reached with no port of the container published, bytes
byte-identical, a WebSocket in order; and a port named after one of the server's own (its gRPC
port) reaches the container's loopback, where nothing listens, never the host's.

Needs the sandbox image with the protocol 9 agent (``tunnel_connect``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import aiohttp
import docker
import pytest

from dispatcher.client import AsyncDispatcherClient, RequestFailed
from dispatcher.server.preview.gateway import HEADER
from tests.integration.conftest import ProviderFactory
from tests.integration.grpc.conftest import docker_server
from tests.server.conftest import Harness, base_config, deep_merge
from tests.server.helpers import until

pytestmark = pytest.mark.docker

PORT_SERVER = (Path(__file__).resolve().parents[2] / "contract" / "port_server.py").read_text()


async def _serve(harness: Harness, mode: str) -> tuple[AsyncDispatcherClient, str, int, Path]:
    client = harness.client()
    info = await client.create_session(f"preview-{mode}")
    root = Path(info.workspace_path)
    (root / "port_server.py").write_text(PORT_SERVER)
    started = await client.call(
        info.session_id,
        "shell",
        {"command": f"python3 port_server.py {mode} {mode}.port", "background": True},
    )
    assert not started.is_error, started
    await until((root / f"{mode}.port").exists, f"the {mode} server to listen", timeout=30)
    return client, info.session_id, int((root / f"{mode}.port").read_text()), root


async def test_connect_port_and_the_preview_reach_the_container_and_nothing_else(
    make_provider: ProviderFactory, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    data = deep_merge(
        base_config(tmp_path),
        {"sandbox": {"backend": "docker"}, "preview": {"listen": "127.0.0.1:0", "domain": "localhost"}},
    )
    async with docker_server(make_provider, tmp_path, data) as harness:
        client, sid, port, root = await _serve(harness, "http")
        # No port of the container is published.
        for container in docker_client.containers.list(
            filters={"label": f"dispatcher.session={sid}"}, ignore_removed=True
        ):
            assert not container.attrs["HostConfig"].get("PortBindings")

        blob = os.urandom(1 << 20) * 20
        (root / "blob.bin").write_bytes(blob)
        conn = await client.connect_port(sid, port)
        await conn.write(b"GET /blob.bin HTTP/1.0\r\nHost: x\r\n\r\n")
        await conn.shut_write()
        got = bytearray()
        while data_ := await conn.read():
            got += data_
        await conn.close()
        assert hashlib.sha256(bytes(got).split(b"\r\n\r\n", 1)[1]).digest() == hashlib.sha256(blob).digest()

        opened = await client.open_port(sid, port)
        assert harness.server.previews is not None
        base = f"http://127.0.0.1:{harness.server.previews.listen_port}"
        host = {"Host": f"{port}-{sid}.localhost", HEADER: opened.token}
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/blob.bin", headers=host) as response:
                assert response.status == 200 and await response.read() == blob
            async with http.ws_connect(base + "/ws", headers=host) as ws:
                for i in range(1000):
                    await ws.send_str(str(i))
                assert [await ws.receive_str() for _ in range(1000)] == [str(i) for i in range(1000)]

            # The server's own gRPC port, named as a sandbox port: the container's loopback answers
            # (nothing there), never the host's.
            own = await client.open_port(sid, harness.server.port)
            own_host = {"Host": f"{harness.server.port}-{sid}.localhost", HEADER: own.token}
            async with http.get(base + "/", headers=own_host) as response:
                assert response.status == 502
        with pytest.raises(RequestFailed) as err:
            await client.connect_port(sid, harness.server.port)
        assert err.value.code == "UNAVAILABLE"
