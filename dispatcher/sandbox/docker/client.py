"""The transport boundary to the Docker daemon: async wrappers around the blocking ``docker`` SDK.

Every SDK call runs in a small dedicated thread pool (never on the event loop), idempotent calls
are retried with ``tenacity`` on transient failures, and this is the one place where SDK and HTTP
exceptions become ``SandboxError``. Starting an exec is never retried: the command may have run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.container.host import ContainerNotFound

log = logging.getLogger(__name__)

T = TypeVar("T")

_TRANSIENT_STATUS = {408, 429, 502, 503, 504}


class DockerUnavailable(SandboxError):
    """The daemon did not answer (after retries)."""


def is_transient(exc: BaseException) -> bool:
    """True for failures worth another try: the daemon was briefly unreachable or overloaded."""
    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return True
    if isinstance(exc, docker.errors.APIError) and not isinstance(exc, docker.errors.NotFound):
        return exc.status_code in _TRANSIENT_STATUS
    return False


def _translate(exc: BaseException, what: str) -> SandboxError:
    if isinstance(exc, docker.errors.NotFound):
        return ContainerNotFound(f"{what}: {exc.explanation or exc}")
    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return DockerUnavailable(f"{what}: docker daemon unreachable: {exc}")
    if isinstance(exc, docker.errors.DockerException):
        detail = getattr(exc, "explanation", None) or str(exc)
        return SandboxError(f"{what}: {detail}")
    return SandboxError(f"{what}: {type(exc).__name__}: {exc}")


class DockerAPI:
    """Async facade over one ``docker.APIClient`` with bounded retries."""

    def __init__(
        self,
        client: docker.APIClient | None = None,
        *,
        max_workers: int = 8,
        attempts: int = 4,
        timeout: float = 60.0,
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="docker-api")
        self._attempts = attempts

    @property
    def client(self) -> docker.APIClient:
        if self._client is None:
            # Honours DOCKER_HOST & co; the pool must be as large as our thread pool.
            self._client = docker.from_env(timeout=int(self._timeout), max_pool_size=16).api
        return self._client

    async def run(self, what: str, fn: Callable[..., T], *args: Any, retry: bool = True, **kw: Any) -> T:
        """Run a blocking SDK call in the pool; retry transient failures when ``retry``.

        Raises:
            SandboxError: the call failed (``ContainerNotFound`` for 404s).
        """
        loop = asyncio.get_running_loop()
        call = functools.partial(fn, *args, **kw)
        try:
            if not retry:
                return await loop.run_in_executor(self._pool, call)
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self._attempts),
                wait=wait_exponential(multiplier=0.05, max=1.0),
                retry=retry_if_exception(is_transient),
                reraise=True,
            ):
                with attempt:
                    return await loop.run_in_executor(self._pool, call)
        except SandboxError:
            raise
        except Exception as exc:
            raise _translate(exc, what) from exc
        raise AssertionError("unreachable")  # pragma: no cover - AsyncRetrying always yields

    # -- containers ----------------------------------------------------------------------

    async def ping(self) -> bool:
        try:
            return bool(await self.run("ping", lambda: self.client.ping(), retry=False))
        except SandboxError:
            return False

    async def image_exists(self, image: str) -> bool:
        try:
            await self.run("inspect image", lambda: self.client.inspect_image(image))
        except ContainerNotFound:
            return False
        return True

    async def create_container(self, name: str, spec: Mapping[str, Any]) -> str:
        """Create a container from ``spec`` (``host_config`` as create_host_config kwargs).

        A retry after a lost response finds the first attempt's container by name.
        """

        def create() -> str:
            kwargs = dict(spec)
            host_config = kwargs.pop("host_config", None)
            if host_config is not None:
                kwargs["host_config"] = self.client.create_host_config(**host_config)
            try:
                return str(self.client.create_container(name=name, **kwargs)["Id"])
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # an earlier attempt did create it
                    return str(self.client.inspect_container(name)["Id"])
                raise

        return await self.run("create container", create)

    async def start(self, container_id: str) -> None:
        await self.run("start container", lambda: self.client.start(container_id))

    async def remove(self, container_id: str) -> bool:
        """Force-remove (kills first); False if it was already gone."""
        try:
            await self.run(
                "remove container", lambda: self.client.remove_container(container_id, force=True, v=True)
            )
        except ContainerNotFound:
            return False
        except SandboxError as exc:
            # 409 "removal already in progress" means someone else is doing our job.
            if "already in progress" in str(exc):
                return True
            raise
        return True

    async def stop(self, container_id: str, timeout: int = 1) -> None:
        with contextlib.suppress(ContainerNotFound):
            await self.run("stop container", lambda: self.client.stop(container_id, timeout=timeout))

    async def pause(self, container_id: str) -> None:
        """Freeze every process of the container (cgroup freezer); already paused: nothing."""
        try:
            await self.run("pause container", lambda: self.client.pause(container_id))
        except ContainerNotFound:
            raise
        except SandboxError as exc:
            if "already paused" not in str(exc):
                raise

    async def unpause(self, container_id: str) -> None:
        """Thaw it; not paused (someone ran ``docker unpause``): nothing."""
        try:
            await self.run("unpause container", lambda: self.client.unpause(container_id))
        except ContainerNotFound:
            raise
        except SandboxError as exc:
            if "not paused" not in str(exc):
                raise

    async def inspect(self, container_id: str) -> Mapping[str, Any]:
        result: Mapping[str, Any] = await self.run(
            "inspect container", lambda: self.client.inspect_container(container_id)
        )
        return result

    async def stats(self, container_id: str) -> Mapping[str, Any]:
        """One sample of the container's cgroup counters, with the previous one (``precpu_stats``)
        about a second earlier: the daemon waits for it, so this takes about a second."""
        result: Mapping[str, Any] = await self.run(
            "container stats", lambda: self.client.stats(container_id, decode=False, stream=False)
        )
        return result

    async def list_by_labels(self, labels: Mapping[str, str | None]) -> list[Mapping[str, Any]]:
        """Every container (running or not) carrying all ``labels`` (None: any value)."""
        filters = [k if v is None else f"{k}={v}" for k, v in labels.items()]
        result: list[Mapping[str, Any]] = await self.run(
            "list containers", lambda: self.client.containers(all=True, filters={"label": filters})
        )
        return result

    # -- exec ----------------------------------------------------------------------------

    async def exec_create(self, container_id: str, cmd: Sequence[str], **kw: Any) -> str:
        # Creating an exec runs nothing, so it is safe to retry.
        result = await self.run("create exec", lambda: self.client.exec_create(container_id, list(cmd), **kw))
        return str(result["Id"])

    async def exec_attach(self, exec_id: str) -> tuple[socket.socket, bytes]:
        """Start an exec attached to stdin/stdout/stderr; the raw socket and bytes already read.

        Not retried: once the request is sent the command may be running.
        """
        return await self.run("start exec", self._exec_attach_sync, exec_id, retry=False)

    def _exec_attach_sync(self, exec_id: str) -> tuple[socket.socket, bytes]:
        api = self.client
        # APIClient.exec_start(socket=True) hides the HTTP response, and with it any stream bytes
        # http.client buffered while reading the 101 headers; this is the same request, kept whole.
        res = api._post_json(
            api._url("/exec/{0}/start", exec_id),
            headers={"Connection": "Upgrade", "Upgrade": "tcp"},
            data={"Tty": False, "Detach": False},
            stream=True,
        )
        api._raise_for_status(res)
        fp = res.raw._fp.fp
        raw = fp.raw
        original = getattr(raw, "_sock", raw)
        if not isinstance(original, socket.socket):
            res.close()
            raise SandboxError(f"start exec: unsupported docker transport {type(raw).__name__}")
        original.setblocking(False)
        try:
            leftover = fp.peek() or b""  # non-blocking: only what is already buffered
        finally:
            original.setblocking(True)
        # A private duplicate for asyncio: the SDK's file objects hold references to the original,
        # which would otherwise keep the connection open after the transport closes it.
        sock = original.dup()
        raw.close()
        original.close()
        return sock, bytes(leftover)

    async def exec_inspect(self, exec_id: str) -> Mapping[str, Any]:
        result: Mapping[str, Any] = await self.run("inspect exec", lambda: self.client.exec_inspect(exec_id))
        return result

    async def exec_run(self, container_id: str, cmd: Sequence[str], *, user: str = "") -> tuple[int, bytes]:
        """Run a short command to completion (used for signals in the fallback path)."""
        exec_id = await self.exec_create(container_id, cmd, user=user, stdout=True, stderr=True)
        output = await self.run("start exec", lambda: self.client.exec_start(exec_id), retry=False)
        info = await self.exec_inspect(exec_id)
        return int(info.get("ExitCode") or 0), bytes(output)

    async def aclose(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
