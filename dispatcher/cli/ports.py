"""``dispatcher port-forward SESSION [LOCAL:]PORT``: a local port whose every connection reaches
``127.0.0.1:PORT`` inside the session's sandbox, one ConnectPort stream per connection (like
``kubectl port-forward``). Runs until Ctrl-C; a connection the server refuses (nothing listens
there yet) is closed and the reason printed on stderr, and the next one is tried afresh.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable
from typing import Any

from dispatcher.cli.output import EXIT_OK
from dispatcher.client.aio import AsyncDispatcherClient
from dispatcher.client.ports import PortConnection, forward

AsyncClientFactory = Callable[[argparse.Namespace], AsyncDispatcherClient]


def add_verbs(verbs: Any, client_opts: argparse.ArgumentParser, client: AsyncClientFactory) -> None:
    """Add ``port-forward`` to the CLI's sub-parsers."""
    pf = verbs.add_parser(
        "port-forward",
        parents=[client_opts],
        help="forward a local port to a port inside a session's sandbox",
        description="Listen on --address:LOCAL (default: the same number as PORT; 0 or an empty "
        "LOCAL: any free port) and carry each connection to 127.0.0.1:PORT inside the session's "
        "sandbox. Prints the local address once listening; runs until Ctrl-C.",
    )
    pf.add_argument("session_id", metavar="SESSION")
    pf.add_argument("ports", metavar="[LOCAL:]PORT", type=_ports)
    pf.add_argument("--address", default="127.0.0.1", help="the local address to listen on")
    pf.set_defaults(func=lambda args: _port_forward(args, client))


def _ports(text: str) -> tuple[int, int]:
    local, _, remote = text.rpartition(":")
    try:
        port = int(remote)
        local_port = int(local) if local else (0 if ":" in text else port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected [LOCAL:]PORT, numbers") from None
    if not 0 < port <= 65535 or not 0 <= local_port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: ports are from 1 to 65535 (LOCAL 0: any)")
    return local_port, port


def _port_forward(args: argparse.Namespace, client: AsyncClientFactory) -> int:
    local_port, port = args.ports

    async def run() -> None:
        async with client(args) as c:

            async def connect() -> PortConnection:
                return await c.connect_port(args.session_id, port)

            def listening(bound: int) -> None:
                print(f"Forwarding from {args.address}:{bound} -> {port}", flush=True)

            def error(message: str) -> None:
                print(f"[port-forward: {message}]", file=sys.stderr, flush=True)

            await forward(connect, args.address, local_port, on_listening=listening, on_error=error)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return EXIT_OK
