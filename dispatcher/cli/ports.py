"""``dispatcher preview SESSION PORT [--expires D]`` prints a sandbox port's preview URL
(OpenPort); ``dispatcher port-forward SESSION [LOCAL:]PORT``: a local port whose every connection reaches
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

from dispatcher.cli.output import EXIT_OK, json_line
from dispatcher.client import DispatcherClient
from dispatcher.client.aio import AsyncDispatcherClient
from dispatcher.client.ports import PortConnection, forward

AsyncClientFactory = Callable[[argparse.Namespace], AsyncDispatcherClient]
ClientFactory = Callable[[argparse.Namespace], DispatcherClient]


def add_verbs(
    verbs: Any, client_opts: argparse.ArgumentParser, client: AsyncClientFactory, sync_client: ClientFactory
) -> None:
    """Add ``port-forward`` and ``preview`` to the CLI's sub-parsers."""
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

    preview = verbs.add_parser(
        "preview",
        parents=[client_opts],
        help="open a port of a session's sandbox to browsers and print its URL",
        description="OpenPort: prints the URL with its token as ?token= (a browser opening it once "
        "gets a cookie for that host and the token leaves the address bar); --json prints url, "
        "token and expire_time apart. The server needs preview.listen in its config.",
    )
    preview.add_argument("session_id", metavar="SESSION")
    preview.add_argument("port", type=_port, metavar="PORT")
    preview.add_argument(
        "--expires", type=_duration, default=0, metavar="D", help="expire after D (90s, 15m, 2h, 1d)"
    )
    preview.add_argument("--close", action="store_true", help="close the port instead (ClosePort)")
    preview.set_defaults(func=lambda args: _preview(args, sync_client))


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 0 < port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is a number from 1 to 65535")
    return port


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> int:
    number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    try:
        seconds = int(number) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration like 90s, 15m, 2h or 1d") from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration is not negative")
    return seconds


def _preview(args: argparse.Namespace, client: ClientFactory) -> int:
    with client(args) as c:
        if args.close:
            c.close_port(args.session_id, args.port)
            return EXIT_OK
        opened = c.open_port(args.session_id, args.port, expires_in_seconds=args.expires)
    if args.json:
        expires = opened.expire_time.isoformat() if opened.expire_time is not None else None
        json_line({"url": opened.url, "token": opened.token, "expire_time": expires})
    else:
        print(f"{opened.url}?token={opened.token}" if opened.token else opened.url)
    return EXIT_OK


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
