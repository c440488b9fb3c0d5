"""A minimal client of the stand-in for its own tests: JSON over HTTPS, with the run's token."""

from __future__ import annotations

import os
import ssl
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.kube_standin import StandIn
from tests.polling import until

Obj = dict[str, Any]

IMAGE = "dispatcher-sandbox:latest"


def require_docker() -> bool:
    return os.environ.get("DISPATCHER_REQUIRE_DOCKER") == "1"


def unavailable(reason: str) -> None:
    """Skip, or fail when CI requires everything (DISPATCHER_REQUIRE_DOCKER=1)."""
    if require_docker():
        pytest.fail(f"DISPATCHER_REQUIRE_DOCKER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def pod(name: str, command: list[str], *, labels: dict[str, str] | None = None, **container: Any) -> Obj:
    """A one-container Pod of the sandbox image that runs ``command`` and is never restarted."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": IMAGE, "command": command, **container}],
        },
    }


@dataclass
class Kube:
    standin: StandIn
    namespace: str
    session: aiohttp.ClientSession
    ssl: ssl.SSLContext

    @classmethod
    @asynccontextmanager
    async def connect(cls, standin: StandIn, namespace: str, token: str | None = None) -> AsyncIterator[Kube]:
        context = ssl.create_default_context(cafile=str(standin.ca_path))
        headers = {"Authorization": f"Bearer {token or standin.token}"}
        # Before CPython 3.12.8 an SSL transport whose peer never completes the TLS shutdown leaks
        # its socket (a ResourceWarning at garbage collection, an error under filterwarnings);
        # aiohttp's cleanup aborts such transports when the session closes. Later Pythons fixed it.
        connector = aiohttp.TCPConnector(enable_cleanup_closed=sys.version_info < (3, 12, 8))
        async with aiohttp.ClientSession(headers=headers, connector=connector) as session:
            yield cls(standin, namespace, session, context)

    def url(self, plural: str, name: str = "", *, group: str = "") -> str:
        base = f"{self.standin.url}/apis/{group}/v1" if group else f"{self.standin.url}/api/v1"
        return f"{base}/namespaces/{self.namespace}/{plural}" + (f"/{name}" if name else "")

    async def request(self, method: str, url: str, **kw: Any) -> tuple[int, Obj]:
        async with self.session.request(method, url, ssl=self.ssl, **kw) as response:
            return response.status, await response.json()

    async def create(self, plural: str, body: Obj, *, group: str = "") -> Obj:
        status, obj = await self.request("POST", self.url(plural, group=group), json=body)
        assert status == 201, obj
        return obj

    async def get(self, plural: str, name: str, *, group: str = "") -> Obj:
        status, obj = await self.request("GET", self.url(plural, name, group=group))
        assert status == 200, obj
        return obj

    async def names(self, plural: str, selector: str = "", *, group: str = "") -> list[str]:
        status, obj = await self.request(
            "GET", self.url(plural, group=group), params={"labelSelector": selector}
        )
        assert status == 200, obj
        return [item["metadata"]["name"] for item in obj["items"]]

    async def delete(self, plural: str, name: str, *, group: str = "") -> Obj:
        status, obj = await self.request("DELETE", self.url(plural, name, group=group))
        assert status == 200, obj
        return obj

    async def wait_phase(self, name: str, *phases: str, timeout: float = 60) -> Obj:
        """The Pod once its phase is one of ``phases``."""
        seen: Obj = {}

        async def reached() -> bool:
            seen.update(await self.get("pods", name))
            return seen["status"].get("phase") in phases

        await until(reached, f"pod {name} in phase {phases}", timeout=timeout, interval=0.05)
        return seen

    async def wait_gone(self, name: str, timeout: float = 60) -> None:
        async def gone() -> bool:
            status, _ = await self.request("GET", self.url("pods", name))
            return status == 404

        await until(gone, f"pod {name} deleted", timeout=timeout, interval=0.05)
