"""``dispatcher mcp``: a session's tools as an MCP server on stdio, for hosts that start servers as
processes. It is a client of a running dispatcher (``--server``, the token as every verb reads it):
it creates a session at start (or attaches with ``--session``) and closes what it created when the
host closes stdin or stops it (unless ``--keep``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from dispatcher.cli.output import EXIT_OK, EXIT_USAGE
from dispatcher.client.aio import AsyncDispatcherClient
from dispatcher.config import default_target
from dispatcher.core.approval.modes import parse_mode

SIGNAL_CLOSE_SECONDS = 10.0
"""How long a signalled ``dispatcher mcp`` waits for its session to close before it exits anyway."""
MCP_LABEL = "dispatcher.mcp"
"""Label on the sessions ``dispatcher mcp`` creates (value: the transport), for ``dispatcher sessions``."""


def add_verbs(verbs: Any, client_opts: argparse.ArgumentParser) -> None:
    """Add ``mcp`` to the CLI's sub-parsers."""
    p = verbs.add_parser(
        "mcp",
        parents=[client_opts],
        help="serve a session's tools to an MCP host over stdio",
        description=(
            "An MCP server on stdin/stdout for hosts that start servers as processes. Tools run in "
            "the session's sandbox under its approval mode; approvals are asked through the host "
            "(elicitation) when it supports it, else answered with `dispatcher approve`."
        ),
    )
    p.add_argument("--session", metavar="ID", help="attach to this session instead of creating one")
    p.add_argument("--workspace", metavar="NAME", help="the new session's workspace (default: default)")
    p.add_argument("--mode", metavar="MODE", help="the new session's approval mode (default: the server's)")
    p.add_argument("--tools", metavar="A,B", help="offer only these tools (a new session may use no others)")
    p.add_argument("--keep", action="store_true", help="leave the created session open on exit")
    p.set_defaults(func=_mcp)


def _mcp(args: argparse.Namespace) -> int:
    if args.session and (args.workspace or args.mode):
        print(
            "dispatcher mcp: --workspace and --mode are for a new session, not with --session",
            file=sys.stderr,
        )
        return EXIT_USAGE
    tools = [t.strip() for t in args.tools.split(",") if t.strip()] if args.tools else None
    if args.tools is not None and not tools:
        print(
            "dispatcher mcp: --tools names no tool (expected e.g. --tools read_file,shell)", file=sys.stderr
        )
        return EXIT_USAGE
    if args.mode:
        try:
            parse_mode(args.mode)
        except ValueError as exc:
            print(f"dispatcher mcp: --mode: {exc}", file=sys.stderr)
            return EXIT_USAGE
    asyncio.run(_serve(args, tools))
    return EXIT_OK


async def _serve(args: argparse.Namespace, tools: list[str] | None) -> None:
    from mcp.server.stdio import stdio_server

    from dispatcher.mcp_server.bridge import SessionBridge

    client = AsyncDispatcherClient(
        args.server or default_target(),
        home=args.home,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )
    try:
        if args.session:
            info = await client.get_session(args.session)
        else:
            info = await client.create_session(
                args.workspace or "default", mode=args.mode, tools=tools, labels={MCP_LABEL: "stdio"}
            )
        closes = not args.session and not args.keep
        print(f"dispatcher mcp: session {info.session_id} ({info.workspace})", file=sys.stderr, flush=True)
        _on_signals(client, info.session_id, closes)
        bridge = SessionBridge(client, info.session_id, tools=tools)
        server = bridge.server()
        try:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
        finally:
            await bridge.aclose()
        # The host closed stdin: the usual end.
        if closes:
            await client.close_session(info.session_id)
        elif not args.session:
            print(f"dispatcher mcp: kept session {info.session_id}", file=sys.stderr, flush=True)
    finally:
        await client.close()


def _on_signals(client: AsyncDispatcherClient, session_id: str, closes: bool) -> None:
    """SIGTERM/SIGHUP/SIGINT (a host stopping its server without closing stdin first, or Ctrl-C):
    close what was created, then end the process at once.

    Not a cancel of the serving task: the SDK reads stdin on a worker thread that no cancel reaches,
    and the loop would wait for that read forever.
    """
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    async def stop() -> None:
        try:
            if closes:
                await asyncio.wait_for(client.close_session(session_id), SIGNAL_CLOSE_SECONDS)
        except Exception as exc:
            print(f"dispatcher mcp: could not close session {session_id}: {exc}", file=sys.stderr, flush=True)
        finally:
            os._exit(EXIT_OK)

    def on_signal() -> None:
        if not stopping:
            stopping.append(loop.create_task(stop()))

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
