"""The YAML config: embedded defaults, precedence of flags > env > file, errors naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import DEFAULT_LISTEN, client_token, default_target, hash_token
from dispatcher.config.load import ensure_default_tenant, load_config
from dispatcher.core.approval.confirmation_policy import Mode
from dispatcher.core.errors import ConfigError
from dispatcher.core.types import SideEffect
from dispatcher.server.app import load_tool_factory


def _load(tmp_path: Path, data: Any, **kw: Any) -> Any:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return load_config(path, env=kw.pop("env", {}), **kw)


def test_embedded_defaults(tmp_path: Path) -> None:
    config = load_config(None, env={})
    assert config.listen == DEFAULT_LISTEN == "127.0.0.1:50051"
    assert config.home == Path("~/.dispatcher").expanduser()
    assert config.sandbox_backend == "docker"
    assert config.policy.default[SideEffect.WRITE] is Mode.PROMPT
    assert config.policy.default[SideEffect.READ] is Mode.AUTO


def test_default_tenant_token_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    config = load_config(None, home=str(tmp_path / "h"), env={})
    served, generated = ensure_default_tenant(config)
    token_file = tmp_path / "h" / "token"
    assert generated and token_file.read_text().strip() == generated
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert served.tenants[0].tenant_id == "default"
    assert served.tenants[0].token_sha256 == (hash_token(generated),)
    assert served.tenants[0].workspace_root == tmp_path / "h" / "workspaces"
    again, generated_again = ensure_default_tenant(config)
    assert generated_again is None and again.tenants[0].token_sha256 == served.tenants[0].token_sha256
    assert client_token(env={"DISPATCHER_HOME": str(tmp_path / "h")}) == generated
    assert client_token(env={"DISPATCHER_HOME": str(tmp_path / "h"), "DISPATCHER_TOKEN": "t"}) == "t"


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    data = {"listen": "127.0.0.1:1111", "home": str(tmp_path / "file-home")}
    assert _load(tmp_path, data).listen == "127.0.0.1:1111"
    env = {"DISPATCHER_LISTEN": "127.0.0.1:2222", "DISPATCHER_HOME": str(tmp_path / "env-home")}
    from_env = _load(tmp_path, data, env=env)
    assert (from_env.listen, from_env.home) == ("127.0.0.1:2222", tmp_path / "env-home")
    from_flags = _load(tmp_path, data, env=env, listen="0.0.0.0:3333", home=str(tmp_path / "flag-home"))
    assert (from_flags.listen, from_flags.home) == ("0.0.0.0:3333", tmp_path / "flag-home")
    assert default_target({"DISPATCHER_LISTEN": "127.0.0.1:9"}) == "127.0.0.1:9"


def test_spec_000_tool_confirmation_section(tmp_path: Path) -> None:
    section = yaml.safe_load(
        """
tool_confirmation:
  default:
    NONE: auto
    READ: auto
    WRITE: prompt
    EXECUTE: prompt
    NETWORK: prompt
  per_tool:
    git_status: auto
    npm_install: prompt
  trusted_workspaces:
    - ~/code/myproject
  trusted_workspace_overrides:
    EXECUTE: prompt
"""
    )
    config = _load(tmp_path, section)
    assert config.policy.per_tool["git_status"] is Mode.AUTO
    assert config.policy.trusted_workspace_overrides[SideEffect.EXECUTE] is Mode.PROMPT
    assert config.policy.trusted_workspaces == (str(Path("~/code/myproject").expanduser()),)


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"lisen": "x"}, "lisen"),
        ({"listen": "nohostport"}, "listen"),
        ({"server": {"grace_seconds": -1}}, "server.grace_seconds"),
        ({"server": {"max_message_bytes": "big"}}, "server.max_message_bytes"),
        ({"server": {"nope": 1}}, "server.nope"),
        ({"dispatcher": {"concurrency": 1.5}}, "dispatcher.concurrency"),
        ({"log": {"format": "xml"}}, "log.format"),
        ({"tool_confirmation": {"default": {"WRITE": "maybe"}}}, "tool_confirmation.default.WRITE"),
        ({"tool_confirmation": {"defaults": {}}}, "tool_confirmation.defaults"),
        ({"sandbox": {"backend": "vm"}}, "sandbox.backend"),
        ({"sandbox": {"pids_limit": "many"}}, "sandbox.pids_limit"),
        ({"sandbox": {"backend": "local", "image": "x"}}, "sandbox.image"),
        ({"tools": ["no_colon"]}, "tools[0]"),
        ({"tls": {"cert_file": "/no/such.pem", "key_file": "/no/such.key"}}, "tls.cert_file"),
        ({"tls": {"cert": "x"}}, "tls.cert"),
        ({"tenants": {"a": 1}}, "tenants"),
        ({"tenants": [{"id": "a"}]}, "tenants[0].token_sha256"),
        ({"tenants": [{"id": "a b", "token_sha256": "0" * 64}]}, "tenants[0].id"),
        ({"tenants": [{"id": "a", "token_sha256": "abc"}]}, "tenants[0].token_sha256"),
        (
            {"tenants": [{"id": "a", "token_sha256": "0" * 64, "quotas": {"max_sessions": 0}}]},
            "tenants[0].quotas.max_sessions",
        ),
        (
            {"tenants": [{"id": "a", "token_sha256": "0" * 64, "fs": [{"path": "src", "mode": "w"}]}]},
            "tenants[0].fs[0].mode",
        ),
        (
            {
                "tenants": [
                    {"id": "a", "token_sha256": "0" * 64, "tool_confirmation": {"default": {"X": "auto"}}}
                ]
            },
            "tenants[0].tool_confirmation.default.X",
        ),
        (
            {"tenants": [{"id": "a", "token_sha256": "0" * 64}, {"id": "b", "token_sha256": "0" * 64}]},
            "tenants[1].token_sha256",
        ),
        ({"tenants": [{"id": "a", "token_sha256": "0" * 64, "colour": "red"}]}, "tenants[0].colour"),
    ],
)
def test_errors_name_the_bad_key(tmp_path: Path, data: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, data)
    assert str(err.value).startswith(key + ":") or f"{key}:" in str(err.value), str(err.value)


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", env={})
    with pytest.raises(ConfigError, match="invalid YAML"):
        _load(tmp_path, "a: [1,\n")
    with pytest.raises(ConfigError, match="top level"):
        _load(tmp_path, "- 1\n")


def test_custom_tool_entries() -> None:
    factory = load_tool_factory("tests.server.tools:make_echo_tool")
    assert factory().definition.name == "echo"
    with pytest.raises(ConfigError, match="tools: cannot load"):
        load_tool_factory("tests.server.tools:nope")
    with pytest.raises(ConfigError, match="tools: cannot load"):
        load_tool_factory("no.such.module:x")


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"sessions": {"ttl_seconds": 1e13}}, "sessions.ttl_seconds"),
        ({"sessions": {"idle_timeout_seconds": 9e18}}, "sessions.idle_timeout_seconds"),
        (
            {"tenants": [{"id": "a", "token_sha256": "0" * 64, "max_session_ttl_seconds": 1e13}]},
            "tenants[0].max_session_ttl_seconds",
        ),
    ],
)
def test_a_session_clock_past_ten_years_is_refused_at_load(
    tmp_path: Path, data: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError, match="315360000") as err:
        _load(tmp_path, data)
    assert key in str(err.value), str(err.value)
