"""Address ranges a sandbox's connections never reach, and the server's own ports.

The default ``deny_networks`` is an explicit list, not "whatever is not globally routable": behind
an intercepting proxy a package registry can resolve to a reserved documentation range (it does on
our machines), and an operator must be able to see the list and edit it (a bench takes
``127.0.0.0/8`` out to reach its own file server).

Every address is checked in its canonical form: an IPv4-mapped IPv6 address (``::ffff:10.0.0.1``)
is checked as the IPv4 address it carries, so no spelling of an address slips past its range.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_DENY_NETWORKS",
    "IPAddress",
    "IPNetwork",
    "OwnEndpoints",
    "canonical",
    "denied_by",
    "parse_networks",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_DENY_NETWORKS: tuple[str, ...] = (
    "0.0.0.0/8",  # "this network"; 0.0.0.0 reaches the host itself on Linux
    "127.0.0.0/8",  # loopback
    "10.0.0.0/8",  # RFC 1918
    "172.16.0.0/12",  # RFC 1918
    "192.168.0.0/16",  # RFC 1918
    "169.254.0.0/16",  # link-local, cloud metadata (169.254.169.254) included
    "100.64.0.0/10",  # CGNAT (RFC 6598)
    "224.0.0.0/4",  # multicast
    "255.255.255.255/32",  # broadcast
    "::/128",  # unspecified
    "::1/128",  # loopback
    "fc00::/7",  # unique local
    "fe80::/10",  # link-local
    "ff00::/8",  # multicast
)
"""The default ``egress.deny_networks``."""


def parse_networks(values: Iterable[str]) -> tuple[IPNetwork, ...]:
    """``10.0.0.0/8``-style ranges (a bare address is a single-address range).

    Raises:
        ValueError: naming the entry that is not a range, or has host bits set (``10.0.0.1/8``:
            probably a typo, so not silently widened).
    """
    out = []
    for value in values:
        if not isinstance(value, str):
            raise ValueError(f"expected an address range like 10.0.0.0/8, got {value!r}")
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=True))
        except ValueError as exc:
            raise ValueError(f"{value!r}: {exc}") from None
    return tuple(out)


def canonical(address: IPAddress) -> IPAddress:
    """The address checked and connected to: IPv4-mapped IPv6 as IPv4."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def denied_by(address: IPAddress, networks: Sequence[IPNetwork]) -> IPNetwork | None:
    """The first range of ``networks`` that holds ``address`` (canonical form), or None."""
    address = canonical(address)
    for network in networks:
        if network.version == address.version and address in network:
            return network
    return None


@dataclass(frozen=True, slots=True)
class OwnEndpoints:
    """The server's own listening ports (gRPC, metrics): never a destination, whatever ranges an
    operator takes out of ``deny_networks``."""

    ports: frozenset[int] = frozenset()
    addresses: frozenset[IPAddress] = field(default_factory=frozenset)
    """Addresses the server listens on; an unspecified one (0.0.0.0, ::) means every address."""

    @classmethod
    def of(cls, listens: Iterable[str | None]) -> OwnEndpoints:
        """From ``HOST:PORT`` strings (None: not listening); a host that is a name counts as every
        address, since what it resolves to is not pinned."""
        ports: set[int] = set()
        addresses: set[IPAddress] = set()
        for listen in listens:
            if not listen:
                continue
            host, _, port = listen.rpartition(":")
            ports.add(int(port))
            try:
                addresses.add(canonical(ipaddress.ip_address(host.strip("[]"))))
            except ValueError:
                addresses.add(ipaddress.IPv4Address(0))
        return cls(frozenset(ports), frozenset(addresses))

    def refuses(self, address: IPAddress, port: int) -> bool:
        """Whether ``address``:``port`` may be the server itself."""
        if port not in self.ports:
            return False
        address = canonical(address)
        if address.is_loopback or address.is_unspecified or address in self.addresses:
            return True
        return any(a.is_unspecified for a in self.addresses)
