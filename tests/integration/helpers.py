"""Helpers for the Docker integration tests (fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import docker

from dispatcher.core.sandbox_api import ExecRequest, ExecResult, Sandbox
from dispatcher.core.types import ToolContext
from dispatcher.sandbox.container.labels import LABEL_INSTANCE


def containers_of(client: docker.DockerClient, instance: str) -> list[Any]:
    """Containers (running or not) carrying ``instance``'s label."""
    # ignore_removed: a container removed between the list and its inspect is simply gone.
    return list(
        client.containers.list(
            all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"}, ignore_removed=True
        )
    )


def runsc_available(client: docker.DockerClient) -> bool:
    return "runsc" in (client.info().get("Runtimes") or {})


@dataclass
class Ran:
    """An exec's result with the output it streamed."""

    result: ExecResult
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def out(self) -> str:
        return self.stdout.decode(errors="replace")

    @property
    def err(self) -> str:
        return self.stderr.decode(errors="replace")


async def run(
    sandbox: Sandbox,
    command: str,
    *,
    timeout: float = 30.0,
    grace: float = 3.0,
    cancel: asyncio.Event | None = None,
    on_chunk: Callable[[str, bytes], None] | None = None,
    **kw: Any,
) -> Ran:
    """Run ``command`` in ``sandbox`` and collect its output."""
    ran = Ran(ExecResult(exit_code=None))
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}

    def on_output(stream: str, data: bytes) -> None:
        chunks[stream].append(data)
        if on_chunk is not None:
            on_chunk(stream, data)

    ran.result = await sandbox.exec(
        ExecRequest(command, timeout=timeout, grace_seconds=grace, **kw), on_output, cancel or asyncio.Event()
    )
    ran.stdout, ran.stderr = b"".join(chunks["stdout"]), b"".join(chunks["stderr"])
    return ran


def tool_context(
    sandbox: Sandbox, workspace_path: str, *, cancel: asyncio.Event | None = None
) -> tuple[ToolContext, list[tuple[str, str]]]:
    """A ToolContext as the dispatcher would build it, and the output deltas it records."""
    deltas: list[tuple[str, str]] = []
    context = ToolContext(
        session_id="integration",
        turn_id="turn-1",
        tool_use_id=f"toolu_{time.monotonic_ns()}",
        workspace_path=workspace_path,
        cancel_event=cancel or asyncio.Event(),
        logger=logging.LoggerAdapter(logging.getLogger("tests.integration"), {}),
        workspace_files=sandbox,
        sandbox=sandbox,
        emit_output=lambda stream, text: deltas.append((stream, text)),
    )
    return context, deltas
