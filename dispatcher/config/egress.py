"""The ``egress:`` section, at the top level (the default tenant, and every tenant's base) and per
tenant (``tenants[].egress``, its keys laid over the top level's).

    egress:
      allow: [pkgs.example.com, "*.mirror.example.org"]  # exact host, or "*." for any subdomain
      unknown: deny          # deny | prompt: a host not on the list is refused, or asked about
      ports: [80, 443]
      max_connections: 16    # concurrent, per session
      max_bytes: 2g          # per session, both directions together
      deny_networks: [...]   # address ranges never connected to (default: dispatcher.egress.networks)
      ca_bundle: null        # a host file of extra CA certificates the sandbox should trust

The default reaches nothing: ``allow: []``, ``unknown: deny``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from dispatcher.config_base import PositiveInt, Section
from dispatcher.egress.networks import DEFAULT_DENY_NETWORKS, parse_networks
from dispatcher.egress.policy import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_PORTS,
    EgressPolicy,
    Unknown,
    parse_pattern,
)
from dispatcher.sandbox.container.config import Bytes

__all__ = ["EgressSection", "egress_policy"]


def _readable_file(value: object) -> Path:
    if not isinstance(value, str):
        raise ValueError(f"expected a file path, got {value!r}")
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"{path} is not a readable file")
    return path.absolute()


def _unique(values: tuple[int, ...]) -> tuple[int, ...]:
    if len(set(values)) != len(values):
        raise ValueError("a port is listed twice")
    return values


def _networks(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(str(n) for n in parse_networks(values))


HostPattern = Annotated[str, Field(strict=True, min_length=1), AfterValidator(parse_pattern)]
"""``pkgs.example.com`` (exact) or ``*.mirror.example.org`` (any subdomain)."""
Port = Annotated[int, Field(strict=True, ge=1, le=65535)]
Network = Annotated[str, Field(strict=True, min_length=1)]


class EgressSection(Section):
    """``egress:``: which hosts a tenant's sandboxes reach through the server's proxy (README: Egress)."""

    allow: tuple[HostPattern, ...] = ()
    """Hosts the sandbox may connect to: an exact host or ``*.`` + domain for any subdomain."""
    unknown: Literal["deny", "prompt"] = "deny"
    """A host not on the list: refused at once (deny), or asked about on the confirmation stream."""
    ports: Annotated[tuple[Port, ...], AfterValidator(_unique)] = DEFAULT_PORTS
    """Destination ports allowed (for listed hosts and approved ones alike)."""
    max_connections: PositiveInt = DEFAULT_MAX_CONNECTIONS
    """Connections open at once, per session."""
    max_bytes: Bytes = DEFAULT_MAX_BYTES
    """Bytes per session, both directions together (``2g``-style sizes, powers of 1024)."""
    deny_networks: Annotated[tuple[Network, ...], AfterValidator(_networks)] = DEFAULT_DENY_NETWORKS
    """Address ranges never connected to, whatever a name resolves to (default: loopback, RFC 1918,
    link-local, CGNAT, 0.0.0.0/8, multicast and their IPv6 counterparts)."""
    ca_bundle: Annotated[Path, BeforeValidator(_readable_file, json_schema_input_type=str)] | None = None
    """A host file of extra CA certificates the sandbox trusts (mounted read-only), for operators
    behind an intercepting proxy."""

    def over(self, base: EgressSection) -> EgressSection:
        """This section's keys laid over ``base`` (a tenant's over the top level's)."""
        return base.model_copy(update={key: getattr(self, key) for key in self.model_fields_set})


def egress_policy(section: EgressSection) -> EgressPolicy:
    """The proxy's view of a validated section."""
    return EgressPolicy(
        allow=tuple(dict.fromkeys(section.allow)),
        unknown=Unknown(section.unknown),
        ports=section.ports,
        max_connections=section.max_connections,
        max_bytes=section.max_bytes,
        deny_networks=parse_networks(section.deny_networks),
        ca_bundle=str(section.ca_bundle) if section.ca_bundle is not None else None,
    )
