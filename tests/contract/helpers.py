"""What the contract's tests share: the error code an operation fails with, a command's output."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass

import pytest

from dispatcher.core.sandbox_api import ExecRequest, ExecResult, FileOpError
from tests.contract.targets import Target


async def code_of(op: Awaitable[object]) -> str:
    """The ``FileOpError`` code ``op`` fails with."""
    with pytest.raises(FileOpError) as err:
        await op
    return err.value.code


@dataclass
class Ran:
    result: ExecResult
    stdout: bytes
    stderr: bytes


async def run(
    target: Target,
    command: str,
    *,
    timeout: float = 30.0,
    grace: float = 3.0,
    cancel: asyncio.Event | None = None,
    started: asyncio.Event | None = None,
    **request: object,
) -> Ran:
    """Run ``command``; ``started`` is set at its first output."""
    out: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    def on_output(stream: str, data: bytes) -> None:
        out[stream].extend(data)
        if started is not None:
            started.set()

    req = ExecRequest(command, timeout=timeout, grace_seconds=grace, **request)  # type: ignore[arg-type]
    result = await target.sandbox.exec(req, on_output, cancel or asyncio.Event())
    return Ran(result, bytes(out["stdout"]), bytes(out["stderr"]))


async def sh(target: Target, command: str) -> bytes:
    """Run ``command``, which must succeed; its stdout."""
    ran = await run(target, command)
    assert ran.result.exit_code == 0, (command, ran)
    return ran.stdout
