"""Resolve a name once, check every address it gave, connect to exactly an address that was checked.

A second lookup between check and connect is what DNS rebinding exploits (first answer public,
second answer 127.0.0.1), so the connection is made to the checked ``IPAddress`` itself, with
``AI_NUMERICHOST``: nothing below can turn it back into a lookup. Both the resolver and the
connector are injectable, so that tests can hand out private-range answers without any packet
leaving loopback: a test connector makes every connection attempt observable.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dispatcher.egress.networks import IPAddress, IPNetwork, OwnEndpoints, canonical, denied_by
from dispatcher.egress.policy import Reason, Refusal, is_ip_literal

__all__ = [
    "Connected",
    "Connector",
    "Resolver",
    "SystemResolver",
    "TcpConnector",
    "check_addresses",
    "connect_checked",
    "resolve_checked",
]

MAX_ADDRESSES = 32
"""Addresses of one name that are checked and tried; a longer answer is cut (never unchecked)."""


class Resolver(Protocol):
    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        """The addresses of ``host`` (a name, never an IP literal), in preference order.

        Raises:
            OSError: the name does not resolve.
        """
        ...


class Connector(Protocol):
    async def connect(
        self, address: IPAddress, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to exactly ``address``:``port``.

        Raises:
            OSError: it could not be made.
        """
        ...


class SystemResolver:
    """The host's resolver (``getaddrinfo``), off the event loop's thread."""

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
        out: list[IPAddress] = []
        for _family, _type, _proto, _name, sockaddr in infos:
            address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
            if address not in out:
                out.append(address)
        return out


ORIGIN_READ_LIMIT = 256 << 10
"""The origin connection's ``StreamReader`` limit: reading stops once twice this much waits for
the sandbox. asyncio's 64 KiB default stops (and restarts) reading after every 256 KiB receive of
a fast download; this bounds what a connection buffers at 512 KiB instead."""


class TcpConnector:
    """Connects with a numeric host only: the address given is the address reached."""

    async def connect(
        self, address: IPAddress, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(
            str(address), port, flags=socket.AI_NUMERICHOST, limit=ORIGIN_READ_LIMIT
        )


def check_addresses(
    addresses: Sequence[IPAddress], port: int, networks: Sequence[IPNetwork], own: OwnEndpoints
) -> tuple[IPAddress, ...]:
    """``addresses`` (canonical) when every one may be reached.

    One refused address refuses the name: a name that resolves into a private range as well as out
    of it is steering, not load balancing.

    Raises:
        Refusal: ADDRESS_REFUSED or OWN_PORT, naming the address.
    """
    out: list[IPAddress] = []
    for raw in addresses[:MAX_ADDRESSES]:
        address = canonical(raw)
        network = denied_by(address, networks)
        if network is not None:
            raise Refusal(Reason.ADDRESS_REFUSED, f"{address} (in {network})")
        if own.refuses(address, port):
            raise Refusal(Reason.OWN_PORT, f"{address}:{port}")
        if address not in out:
            out.append(address)
    if not out:
        raise Refusal(Reason.UNRESOLVED, "no address", status=502)
    return tuple(out)


async def resolve_checked(
    host: str,
    port: int,
    *,
    resolver: Resolver,
    networks: Sequence[IPNetwork],
    own: OwnEndpoints,
    timeout: float,
) -> tuple[IPAddress, ...]:
    """The checked addresses of normalised ``host`` (an IP literal is checked as it is, unresolved).

    Raises:
        Refusal: UNRESOLVED (502) when the name does not resolve in ``timeout`` seconds; as
            ``check_addresses`` otherwise.
    """
    if is_ip_literal(host):
        return check_addresses([ipaddress.ip_address(host)], port, networks, own)
    try:
        async with asyncio.timeout(timeout):
            addresses = await resolver.resolve(host, port)
    except (OSError, TimeoutError, UnicodeError) as exc:
        raise Refusal(Reason.UNRESOLVED, type(exc).__name__, status=502) from None
    return check_addresses(addresses, port, networks, own)


@dataclass(frozen=True, slots=True)
class Connected:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    address: IPAddress


async def connect_checked(
    addresses: Sequence[IPAddress], port: int, *, connector: Connector, timeout: float
) -> Connected:
    """The first of the checked ``addresses`` that accepts within ``timeout`` seconds (in all).

    Raises:
        Refusal: CONNECT_FAILED (502), or (504) when the time ran out.
    """
    last = "no address"
    try:
        async with asyncio.timeout(timeout):
            for address in addresses:
                try:
                    reader, writer = await connector.connect(address, port)
                except OSError as exc:
                    last = f"{address}: {exc.strerror or type(exc).__name__}"
                    continue
                return Connected(reader, writer, address)
    except TimeoutError:
        raise Refusal(Reason.CONNECT_FAILED, f"no answer in {timeout:g} s", status=504) from None
    raise Refusal(Reason.CONNECT_FAILED, last, status=502)
