"""Who may be reached: host patterns, ports, a session's narrowing of its tenant's list, and the
decision for one destination with the reason it was taken (a closed set of slugs).

A session's narrowing (``egress_allow``) is a hard bound: an allow-list that nothing widens. A session
whose list is narrower than its tenant's refuses every other host at once, whatever the tenant's
``unknown`` says: nobody is asked, so neither an approval mode that runs the network class unasked
(autonomous, ``NETWORK: auto``) nor a human's yes reaches a host outside it (``session_policy``).

A pattern is an exact host (``pkgs.example.com``, or an IP literal) or ``*.`` and a domain
(``*.mirror.example.org``: any subdomain, not the domain itself), matched case-insensitively with a
trailing dot ignored, as OpenSandbox's egress policy does. ``*`` alone is refused: "everything" is
not a list an operator can read, and ``deny_networks`` is the only other fence.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from dispatcher.egress.networks import DEFAULT_DENY_NETWORKS, IPNetwork, canonical, parse_networks

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_PORTS",
    "EgressPolicy",
    "PolicyDecision",
    "Reason",
    "Refusal",
    "Unknown",
    "Verdict",
    "covers",
    "decide",
    "effective",
    "explain",
    "matches",
    "meet",
    "narrow",
    "normalize_host",
    "parse_pattern",
    "session_policy",
]

DEFAULT_PORTS = (80, 443)
DEFAULT_MAX_CONNECTIONS = 16
DEFAULT_MAX_BYTES = 2 << 30
MAX_HOST_CHARS = 253
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
_SHOWN_HOSTS = 8


class Unknown(enum.StrEnum):
    """What happens to a host that is not on the list."""

    DENY = "deny"
    PROMPT = "prompt"


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    REFUSE = "refuse"
    ASK = "ask"
    """Not on the list under ``unknown: prompt``: a human decides."""


class Reason(enum.StrEnum):
    """Why a connection attempt ended as it did (audit records; refusal texts)."""

    LISTED = "listed"
    REMEMBERED = "remembered"
    """A human allowed the host for the rest of the session."""
    APPROVED = "approved"
    """A human allowed this one connection."""
    NOT_LISTED = "not_listed"
    PORT_NOT_ALLOWED = "port_not_allowed"
    ADDRESS_REFUSED = "address_refused"
    OWN_PORT = "own_port"
    CONNECTIONS_QUOTA = "connections_quota"
    BYTES_QUOTA = "bytes_quota"
    PROMPT_DENIED = "prompt_denied"
    PROMPT_TIMEOUT = "prompt_timeout"
    BAD_REQUEST = "bad_request"
    HEADER_TOO_LARGE = "header_too_large"
    UNRESOLVED = "unresolved"
    CONNECT_FAILED = "connect_failed"


class Refusal(Exception):
    """A connection attempt that ends before any byte reaches a destination."""

    def __init__(self, reason: Reason, detail: str = "", *, status: int = 403) -> None:
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.reason = reason
        self.detail = detail
        self.status = status
        """The HTTP status the sandbox gets: 403 for policy, 400/431 for a malformed request,
        502/504 for a destination that cannot be reached."""


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """A tenant's ``egress:`` section as the proxy applies it."""

    allow: tuple[str, ...] = ()
    """Normalised patterns (``parse_pattern``)."""
    unknown: Unknown = Unknown.DENY
    ports: tuple[int, ...] = DEFAULT_PORTS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Tunnels open at once, per session."""
    max_bytes: int = DEFAULT_MAX_BYTES
    """Bytes per session, both directions together, over its whole life."""
    deny_networks: tuple[IPNetwork, ...] = parse_networks(DEFAULT_DENY_NETWORKS)
    ca_bundle: str | None = None
    """A host file of extra CA certificates the sandbox trusts (mounted read-only)."""


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    verdict: Verdict
    reason: Reason


def normalize_host(host: str) -> str:
    """``host`` lower-cased, without a trailing dot or IPv6 brackets, checked to be a DNS name or an
    IP literal (in canonical form: ``::ffff:10.0.0.1`` is ``10.0.0.1``).

    Raises:
        ValueError: anything else (a scheme, a port, a path, control characters, empty labels).
    """
    text = host.strip().lower().removesuffix(".")
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if not text or len(text) > MAX_HOST_CHARS:
        raise ValueError(f"not a host name: {host[:80]!r}")
    try:
        return str(canonical(ipaddress.ip_address(text)))
    except ValueError:
        pass
    if not all(_LABEL.match(label) for label in text.split(".")):
        raise ValueError(f"not a host name: {host[:80]!r}")
    return text


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def parse_pattern(pattern: str) -> str:
    """One allow-list entry, normalised.

    Raises:
        ValueError: not an exact host or ``*.`` and a domain of at least two labels.
    """
    if not isinstance(pattern, str):
        raise ValueError(f"expected a host pattern, got {pattern!r}")
    if pattern.startswith("*."):
        domain = normalize_host(pattern[2:])
        if is_ip_literal(domain) or "." not in domain:
            raise ValueError(f"{pattern!r}: '*.' needs a domain of at least two labels, like *.example.org")
        return "*." + domain
    if "*" in pattern:
        raise ValueError(f"{pattern!r}: a wildcard is only allowed as a leading '*.'")
    return normalize_host(pattern)


def matches(pattern: str, host: str) -> bool:
    """Whether normalised ``host`` is what normalised ``pattern`` names; a wildcard never matches an
    IP literal."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and not is_ip_literal(host)
    return pattern == host


def covers(pattern: str, other: str) -> bool:
    """Whether every host ``other`` matches is matched by ``pattern`` too."""
    if pattern == other:
        return True
    if not pattern.startswith("*."):
        return False
    suffix = pattern[1:]
    return other.endswith(suffix) and not is_ip_literal(other)


def meet(a: Sequence[str], b: Sequence[str]) -> tuple[str, ...]:
    """The patterns both lists allow: each entry of one that an entry of the other covers."""
    out = [p for p in b if any(covers(q, p) for q in a)]
    out += [p for p in a if any(covers(q, p) for q in b) and p not in out]
    return tuple(sorted(set(out)))


def effective(tenant: Sequence[str], session: Sequence[str] | None) -> tuple[str, ...]:
    """A session's effective list: its tenant's, narrowed by the session's own (None: not narrowed)."""
    return tuple(tenant) if session is None else meet(tenant, session)


def session_policy(tenant: EgressPolicy, session: Sequence[str] | None) -> EgressPolicy:
    """The policy a session's proxy applies: its tenant's, with ``allow`` its effective list.

    A session narrower than its tenant (``session`` leaves out a host its tenant's list names) gets
    ``unknown: deny``: its list is a bound no approval mode and no answer widens. A session whose list
    is its tenant's whole list is not narrowed and keeps the tenant's ``unknown``.
    """
    allow = effective(tenant.allow, session)
    narrowed = not all(any(covers(p, t) for p in allow) for t in tenant.allow)
    return dataclasses.replace(tenant, allow=allow, unknown=Unknown.DENY if narrowed else tenant.unknown)


def narrow(
    tenant: Sequence[str], requested: Iterable[str], *, where: str = "egress_allow"
) -> tuple[str, ...]:
    """A session's own list: ``requested`` (each normalised) inside ``tenant``'s.

    A pattern that would widen the list is refused, not dropped: an agent must learn at once that it
    will not reach the host it asked for.

    Raises:
        ValueError: naming the entry that is malformed or outside the tenant's list.
    """
    out = []
    for i, raw in enumerate(requested):
        try:
            pattern = parse_pattern(raw)
        except ValueError as exc:
            raise ValueError(f"{where}[{i}]: {exc}") from None
        if not any(covers(t, pattern) for t in tenant):
            raise ValueError(f"{where}[{i}]: {pattern!r} is not within this tenant's egress allow list")
        out.append(pattern)
    return tuple(sorted(set(out)))


def decide(
    policy: EgressPolicy, allow: Sequence[str], host: str, port: int, remembered: Collection[str] = ()
) -> PolicyDecision:
    """The decision for normalised ``host``:``port`` before any name is resolved.

    ``policy`` is the session's (``session_policy``) and ``allow`` its effective list; ``remembered``
    the hosts a human allowed for the rest of the session, which count only where a human may be asked
    (``unknown: prompt``). The port is checked first: no answer from a human opens a port the tenant
    closed.
    """
    if port not in policy.ports:
        return PolicyDecision(Verdict.REFUSE, Reason.PORT_NOT_ALLOWED)
    if any(matches(p, host) for p in allow):
        return PolicyDecision(Verdict.ALLOW, Reason.LISTED)
    if policy.unknown is not Unknown.PROMPT:
        return PolicyDecision(Verdict.REFUSE, Reason.NOT_LISTED)
    if host in remembered:
        return PolicyDecision(Verdict.ALLOW, Reason.REMEMBERED)
    return PolicyDecision(Verdict.ASK, Reason.NOT_LISTED)


def explain(
    reason: Reason, host: str, port: int, *, allow: Sequence[str], ports: Sequence[int], detail: str = ""
) -> str:
    """The one line a refused agent reads (403 reason phrase and body): which host, why, and what
    is allowed. ``host`` must already be normalised (no control characters)."""
    if reason in (Reason.BAD_REQUEST, Reason.HEADER_TOO_LARGE):
        return _one_line(f"bad proxy request: {detail or reason}")
    target = (f"[{host}]:{port}" if ":" in host else f"{host}:{port}") if host else "connection"
    more = len(allow) - _SHOWN_HOSTS
    shown = ", ".join(allow[:_SHOWN_HOSTS]) + (f" and {more} more" if more > 0 else "")
    allowed = f"allowed: {shown}" if allow else "no host is allowed: this sandbox has no network access"
    port_list = ", ".join(str(p) for p in ports)
    why = {
        Reason.NOT_LISTED: f"{host} is not on this session's egress allow list ({allowed})",
        Reason.PORT_NOT_ALLOWED: f"port {port} is not allowed (allowed ports: {port_list})",
        Reason.ADDRESS_REFUSED: f"{detail} is in a refused address range (deny_networks)",
        Reason.OWN_PORT: "that is the dispatcher server's own port",
        Reason.CONNECTIONS_QUOTA: f"the session's quota is reached: {detail} (max_connections)",
        Reason.BYTES_QUOTA: f"the session's quota is reached: {detail} (max_bytes)",
        Reason.PROMPT_DENIED: f"a human denied the connection ({allowed})",
        Reason.PROMPT_TIMEOUT: f"nobody answered the confirmation request in time ({allowed})",
        Reason.UNRESOLVED: "the name does not resolve" + (f" ({detail})" if detail else ""),
        Reason.CONNECT_FAILED: "the connection failed" + (f" ({detail})" if detail else ""),
    }.get(reason, detail or str(reason))
    failed = reason in (Reason.UNRESOLVED, Reason.CONNECT_FAILED)
    return _one_line(f"egress {'failed' if failed else 'refused'}: {target}: {why}")


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else " " for c in text)
