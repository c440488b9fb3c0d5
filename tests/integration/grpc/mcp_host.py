"""An MCP host for tests: the official Python SDK's client, connected to ``dispatcher mcp`` over stdio
(a real subprocess) or to the server's streamable HTTP endpoint, answering elicitations from a script."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as mt
from mcp.client.client import Client
from mcp.client.session import ClientRequestContext, ClientSession, ElicitationFnT
from mcp.client.stdio import StdioServerParameters, stdio_client

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Asker:
    """The elicitation callback: records each question and answers with ``reply`` (None: decline)."""

    reply: Callable[[mt.ElicitRequestParams], mt.ElicitResult] = field(
        default=lambda _p: mt.ElicitResult(action="accept", content={"decision": "allow"})
    )
    questions: list[str] = field(default_factory=list)

    async def __call__(
        self, context: ClientRequestContext, params: mt.ElicitRequestParams
    ) -> mt.ElicitResult | mt.ErrorData:
        assert isinstance(params, mt.ElicitRequestFormParams)
        self.questions.append(params.message)
        return self.reply(params)


def mcp_argv(target: str, *extra: str) -> list[str]:
    return ["-m", "dispatcher.cli", "mcp", "--server", target, *extra]


@contextlib.asynccontextmanager
async def stdio_session(
    target: str, token: str, *extra: str, asker: ElicitationFnT | None = None, errlog: Any = None
) -> AsyncIterator[ClientSession]:
    """``dispatcher mcp --server TARGET EXTRA...`` as a subprocess, behind an initialized ClientSession."""
    env = {**os.environ, "DISPATCHER_TOKEN": token, "PYTHONPATH": str(REPO)}
    params = StdioServerParameters(command=sys.executable, args=mcp_argv(target, *extra), env=env)
    with open(os.devnull, "w") if errlog is None else contextlib.nullcontext(errlog) as err:
        async with (
            stdio_client(params, errlog=err) as (read, write),
            ClientSession(read, write, elicitation_callback=asker) as session,
        ):
            await session.initialize()
            yield session


def modern_stdio_client(target: str, token: str, *extra: str, asker: ElicitationFnT | None = None) -> Client:
    """The SDK's high-level ``Client`` on the same subprocess: it negotiates 2026-07-28 by default,
    where approvals come back as ``InputRequiredResult`` and the client retries with the answer."""
    env = {**os.environ, "DISPATCHER_TOKEN": token, "PYTHONPATH": str(REPO)}
    params = StdioServerParameters(command=sys.executable, args=mcp_argv(target, *extra), env=env)
    return Client(params, elicitation_callback=asker)


def text_of(result: mt.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, mt.TextContent))
