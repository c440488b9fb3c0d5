"""An MCP host for tests: the official Python SDK's client, connected to ``dispatcher mcp`` over stdio
(a real subprocess) or to the server's streamable HTTP endpoint, answering elicitations from a script."""

from __future__ import annotations

import contextlib
import os
import sys
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as mt
from mcp.client.client import Client
from mcp.client.session import ClientRequestContext, ClientSession, ElicitationFnT
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

REPO = Path(__file__).resolve().parents[1]


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


@contextlib.asynccontextmanager
async def http_session(
    url: str, token: str, asker: ElicitationFnT | None = None, **query: str
) -> AsyncIterator[ClientSession]:
    """The server's streamable HTTP endpoint at ``url?QUERY``, behind an initialized ClientSession."""
    full = f"{url}?{urllib.parse.urlencode(query)}" if query else url
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with (
        http,
        streamable_http_client(full, http_client=http) as (read, write),
        ClientSession(read, write, elicitation_callback=asker) as session,
    ):
        await session.initialize()
        yield session


@dataclass(frozen=True)
class Host:
    """One way to reach the dispatcher as an MCP server: ``dispatcher mcp`` (stdio) or the endpoint."""

    transport: str
    target: str
    url: str

    def open(
        self,
        token: str,
        *,
        workspace: str | None = None,
        mode: str | None = None,
        asker: ElicitationFnT | None = None,
    ) -> contextlib.AbstractAsyncContextManager[ClientSession]:
        opts = {k: v for k, v in (("workspace", workspace), ("mode", mode)) if v is not None}
        if self.transport == "http":
            return http_session(self.url, token, asker, **opts)
        flags = [arg for k, v in opts.items() for arg in (f"--{k}", v)]
        return stdio_session(self.target, token, *flags, asker=asker)


def modern_stdio_client(target: str, token: str, *extra: str, asker: ElicitationFnT | None = None) -> Client:
    """The SDK's high-level ``Client`` on the same subprocess: it negotiates 2026-07-28 by default,
    where approvals come back as ``InputRequiredResult`` and the client retries with the answer."""
    env = {**os.environ, "DISPATCHER_TOKEN": token, "PYTHONPATH": str(REPO)}
    params = StdioServerParameters(command=sys.executable, args=mcp_argv(target, *extra), env=env)
    return Client(params, elicitation_callback=asker)


def text_of(result: mt.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, mt.TextContent))
