"""``egress:`` in the config file, a session's narrowing through the contract, and what is stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.config.load import Config, _build, ensure_default_tenant
from dispatcher.core.capabilities import Capabilities
from dispatcher.core.errors import ConfigError
from dispatcher.core.sessions.session import Session
from dispatcher.egress.networks import DEFAULT_DENY_NETWORKS, parse_networks
from dispatcher.egress.policy import EgressPolicy, Unknown
from dispatcher.server.persistence.stored_policy import policy_to_json, session_fields_from_json
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.wire import convert_policy as cp

T1, T2 = "1" * 64, "2" * 64


def load(tmp_path: Path, data: dict[str, Any]) -> Config:
    return _build(data, source=None, listen=None, home=str(tmp_path / "home"), env={})


def test_the_defaults_reach_nothing(tmp_path: Path) -> None:
    config, _ = ensure_default_tenant(load(tmp_path, {}))
    assert config.egress == EgressPolicy()
    policy = config.tenants[0].egress
    assert (policy.allow, policy.unknown, policy.ports) == ((), Unknown.DENY, (80, 443))
    assert (policy.max_connections, policy.max_bytes) == (16, 2 << 30)
    assert policy.deny_networks == parse_networks(DEFAULT_DENY_NETWORKS)
    assert config.tenants[0].capabilities.egress_allow == ()


def test_a_tenants_keys_are_laid_over_the_top_level(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        {
            "egress": {
                "allow": ["Pkgs.Example.com", "*.example.org"],
                "max_bytes": "1m",
                "deny_networks": ["10.0.0.0/8"],
            },
            "tenants": [
                {
                    "id": "a",
                    "token_sha256": T1,
                    "egress": {"unknown": "prompt", "allow": ["pkgs.example.com"]},
                },
                {"id": "b", "token_sha256": T2},
            ],
        },
    )
    a, b = config.tenants
    assert (a.egress.allow, a.egress.unknown, a.egress.max_bytes) == (
        ("pkgs.example.com",),
        Unknown.PROMPT,
        1 << 20,
    )
    assert a.egress.deny_networks == parse_networks(["10.0.0.0/8"])
    assert a.capabilities.egress_allow == ("pkgs.example.com",)
    assert (b.egress.allow, b.egress.unknown) == (("pkgs.example.com", "*.example.org"), Unknown.DENY)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"allow": ["*"]}, r"egress\.allow\[0\]: .*leading"),
        ({"allow": ["https://pkgs.example.com"]}, r"egress\.allow\[0\]: not a host name"),
        ({"unknown": "ask"}, r"egress\.unknown: "),
        ({"ports": [443, 443]}, r"egress\.ports: a port is listed twice"),
        ({"ports": [0]}, r"egress\.ports\[0\]: "),
        ({"deny_networks": ["10.0.0.1/8"]}, r"egress\.deny_networks: '10\.0\.0\.1/8'"),
        ({"max_bytes": "lots"}, r"egress\.max_bytes: "),
        ({"ca_bundle": "/nonexistent/ca.pem"}, r"egress\.ca_bundle: .*not a readable file"),
        ({"proxy": 1}, r"egress\.proxy: unknown key"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, {"egress": section})


def test_a_session_may_only_narrow_the_list_and_sees_the_effective_one() -> None:
    tenant = Capabilities(egress_allow=("pkgs.example.com", "*.example.org"))
    msg = pb.SessionCapabilities(egress_allow=["a.example.org"])
    requested = cp.capabilities_from_pb(msg, True)
    session = cp.narrow_capabilities(tenant, requested, ["shell"])
    assert session.egress_allow == ("a.example.org",)
    assert list(cp.capabilities_to_pb(session).egress_allow) == ["a.example.org"]
    kept = cp.narrow_capabilities(tenant, cp.capabilities_from_pb(pb.SessionCapabilities(), True), [])
    assert kept.egress_allow == ("pkgs.example.com", "*.example.org")  # empty: the tenant's list
    with pytest.raises(ValueError, match=r"capabilities\.egress_allow\[0\]: 'evil\.example' is not within"):
        cp.narrow_capabilities(tenant, Capabilities(egress_allow=("evil.example",)), [])
    too_many = pb.SessionCapabilities(egress_allow=[f"h{i}.example.org" for i in range(257)])
    with pytest.raises(ValueError, match="at most 256"):
        cp.capabilities_from_pb(too_many, True)
    assert cp.session_capabilities_to_pb(egress_allow=["pkgs.example.com"]) == pb.SessionCapabilities(
        egress_allow=["pkgs.example.com"]
    )


def test_a_stored_session_keeps_its_narrowing_within_its_tenants_list_as_it_is_now() -> None:
    session = Session("ses_1", "/w", capabilities=Capabilities(egress_allow=("a.example.org",)))
    fields = session_fields_from_json(policy_to_json({}, session))
    assert fields["capabilities"].egress_allow == ("a.example.org",)
    now = Capabilities(egress_allow=("*.other.org",))  # the tenant's list changed meanwhile
    assert now.intersect(fields["capabilities"]).egress_allow == ()
    with pytest.raises(ValueError, match="egress_allow"):
        session_fields_from_json({"capabilities": {"egress_allow": "pkgs.example.com"}})
