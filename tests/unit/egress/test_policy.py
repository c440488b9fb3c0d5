"""Host patterns, a session's narrowing, the decision before any lookup, and the default ranges."""

from __future__ import annotations

import ipaddress

import pytest

from dispatcher.egress.networks import DEFAULT_DENY_NETWORKS, OwnEndpoints, denied_by, parse_networks
from dispatcher.egress.policy import (
    EgressPolicy,
    Reason,
    Unknown,
    Verdict,
    covers,
    decide,
    explain,
    matches,
    meet,
    narrow,
    normalize_host,
    parse_pattern,
    session_policy,
)


def test_patterns_are_exact_hosts_or_leading_wildcards() -> None:
    assert parse_pattern("Pkgs.Example.com.") == "pkgs.example.com"
    assert parse_pattern("*.Mirror.Example.org") == "*.mirror.example.org"
    assert parse_pattern("[2001:db8::1]") == "2001:db8::1"
    for bad in (
        "*",
        "*.org",
        "a.*.org",
        "http://pkgs.example.com",
        "pkgs.example.com:443",
        "pkgs.example.com/simple",
        "a..b",
        "",
    ):
        with pytest.raises(ValueError):
            parse_pattern(bad)


def test_a_wildcard_matches_subdomains_only_and_never_an_ip_literal() -> None:
    assert matches("*.example.org", "a.example.org")
    assert matches("*.example.org", "a.b.example.org")
    assert not matches("*.example.org", "example.org")
    assert not matches("*.example.org", "badexample.org")
    assert matches("pkgs.example.com", normalize_host("PKGS.EXAMPLE.COM."))
    assert not matches("pkgs.example.com", "files.pkgs.example.com")
    assert not matches("*.0.0.1", "127.0.0.1")


def test_a_session_may_only_narrow_its_tenants_list() -> None:
    tenant = ("pkgs.example.com", "*.example.org")
    assert narrow(tenant, ["a.example.org", "Pkgs.Example.com"]) == ("a.example.org", "pkgs.example.com")
    assert narrow(tenant, ["*.b.example.org"]) == ("*.b.example.org",)
    with pytest.raises(ValueError, match=r"egress_allow\[0\]: 'example.org' is not within"):
        narrow(tenant, ["example.org"])
    with pytest.raises(ValueError, match=r"egress_allow\[1\]"):
        narrow(tenant, ["pkgs.example.com", "*"])
    with pytest.raises(ValueError, match="not within"):
        narrow((), ["pkgs.example.com"])


def test_meet_keeps_what_both_lists_allow() -> None:
    assert meet(["*.example.org"], ["a.example.org", "pkgs.example.com"]) == ("a.example.org",)
    assert meet(["a.example.org"], ["*.example.org"]) == ("a.example.org",)
    assert meet([], ["pkgs.example.com"]) == ()
    assert covers("*.example.org", "*.b.example.org") and not covers("*.b.example.org", "*.example.org")


def test_the_port_is_checked_before_the_list_and_before_asking() -> None:
    policy = EgressPolicy(allow=("pkgs.example.com",), unknown=Unknown.PROMPT)
    assert decide(policy, policy.allow, "pkgs.example.com", 443).verdict is Verdict.ALLOW
    refused = decide(policy, policy.allow, "pkgs.example.com", 22)
    assert (refused.verdict, refused.reason) == (Verdict.REFUSE, Reason.PORT_NOT_ALLOWED)
    assert decide(policy, policy.allow, "other.org", 443).verdict is Verdict.ASK
    assert decide(policy, policy.allow, "other.org", 443, {"other.org"}).reason is Reason.REMEMBERED
    deny = EgressPolicy(allow=("pkgs.example.com",))
    assert (
        decide(deny, (), "pkgs.example.com", 443).reason is Reason.NOT_LISTED
    )  # the session narrowed it away


def test_refusal_text_names_host_why_and_what_is_allowed() -> None:
    text = explain(Reason.NOT_LISTED, "evil.example", 443, allow=["pkgs.example.com"], ports=[80, 443])
    assert text == (
        "egress refused: evil.example:443: evil.example is not on this session's egress allow list "
        "(allowed: pkgs.example.com)"
    )
    nothing = explain(Reason.NOT_LISTED, "pkgs.example.com", 443, allow=[], ports=[80, 443])
    assert "no host is allowed: this sandbox has no network access" in nothing
    port = explain(
        Reason.PORT_NOT_ALLOWED, "pkgs.example.com", 22, allow=["pkgs.example.com"], ports=[80, 443]
    )
    assert port.endswith("port 22 is not allowed (allowed ports: 80, 443)")


def test_default_deny_networks_is_the_issues_explicit_list() -> None:
    assert set(DEFAULT_DENY_NETWORKS) >= {
        "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
        "100.64.0.0/10", "0.0.0.0/8", "224.0.0.0/4", "::1/128", "fc00::/7", "fe80::/10",
    }  # fmt: skip
    nets = parse_networks(DEFAULT_DENY_NETWORKS)
    for address in ("169.254.169.254", "100.64.0.1", "::ffff:10.0.0.1", "::ffff:127.0.0.1", "fd00::1", "::"):
        assert denied_by(ipaddress.ip_address(address), nets) is not None, address
    # documentation ranges are not refused: registries behind an intercepting proxy resolve there
    for address in ("192.0.2.10", "198.51.100.7", "203.0.113.5", "2001:db8::5", "151.101.0.223"):
        assert denied_by(ipaddress.ip_address(address), nets) is None, address


def test_a_range_with_host_bits_is_refused_not_widened() -> None:
    with pytest.raises(ValueError, match=r"10\.0\.0\.1/8"):
        parse_networks(["10.0.0.1/8"])


def test_the_servers_own_ports_are_refused_on_its_own_addresses() -> None:
    own = OwnEndpoints.of(["127.0.0.1:50051", None, "[::1]:9464"])
    assert own.refuses(ipaddress.ip_address("127.0.0.1"), 50051)
    assert own.refuses(ipaddress.ip_address("127.0.0.2"), 9464)
    assert own.refuses(ipaddress.ip_address("::ffff:127.0.0.1"), 50051)
    assert not own.refuses(ipaddress.ip_address("127.0.0.1"), 443)
    assert not own.refuses(ipaddress.ip_address("203.0.113.5"), 50051)
    anywhere = OwnEndpoints.of(["0.0.0.0:50051"])
    assert anywhere.refuses(ipaddress.ip_address("203.0.113.5"), 50051)


@pytest.mark.parametrize("unknown", list(Unknown))
def test_a_narrowed_session_never_asks_and_remembers_nothing(unknown: Unknown) -> None:
    tenant = EgressPolicy(allow=("a.example.org", "*.b.example.org"), unknown=unknown)
    narrowed = session_policy(tenant, ("x.b.example.org",))
    assert (narrowed.allow, narrowed.unknown) == (("x.b.example.org",), Unknown.DENY)
    for host in ("x.b.example.org", "a.example.org", "y.b.example.org", "other.org"):
        decision = decide(narrowed, narrowed.allow, host, 443, {host})  # even a remembered yes
        expected = Verdict.ALLOW if host == "x.b.example.org" else Verdict.REFUSE
        assert decision.verdict is expected, host
    # Not narrowed: no list, or the tenant's whole list (in any order or spelling).
    assert session_policy(tenant, None) == tenant
    whole = session_policy(tenant, ("*.b.example.org", "a.example.org"))
    assert (set(whole.allow), whole.unknown) == (set(tenant.allow), unknown)
