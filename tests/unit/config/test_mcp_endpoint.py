"""``mcp_endpoint:``: its defaults, its checks, and the one combination refused (with ``tls:``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.config.load import load_config
from dispatcher.core.errors import ConfigError


def _load(tmp_path: Path, text: str) -> object:
    return load_config(_write(tmp_path, text), env={})


def test_off_by_default_and_its_defaults_when_on(tmp_path: Path) -> None:
    assert load_config(None, env={}).mcp_endpoint is None
    config = load_config(_write(tmp_path, "mcp_endpoint: {listen: 127.0.0.1:8765}\n"), env={})
    endpoint = config.mcp_endpoint
    assert endpoint is not None
    assert (endpoint.listen, endpoint.path, endpoint.max_sessions_per_tenant) == ("127.0.0.1:8765", "/mcp", 8)
    assert endpoint.idle_timeout_seconds == 1800 and endpoint.keep_sessions is False


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ("{listen: 127.0.0.1:8765, path: mcp}", "expected a URL path like /mcp"),
        ("{path: /mcp}", "listen"),
        ("{listen: nowhere}", "mcp_endpoint.listen"),
        ("{listen: 127.0.0.1:8765, max_sessions_per_tenant: 0}", "max_sessions_per_tenant"),
        ("{listen: 127.0.0.1:8765, sessions: 3}", "sessions"),
    ],
)
def test_mistakes_are_named(tmp_path: Path, section: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        _load(tmp_path, f"mcp_endpoint: {section}\n")


def test_refused_with_tls(tmp_path: Path) -> None:
    for name in ("cert.pem", "key.pem"):
        (tmp_path / name).write_text("-----BEGIN-----\n")
    text = (
        f"tls: {{cert_file: {tmp_path / 'cert.pem'}, key_file: {tmp_path / 'key.pem'}}}\n"
        "mcp_endpoint: {listen: 127.0.0.1:8765}\n"
    )
    with pytest.raises(ConfigError, match="mcp_endpoint: not served with tls"):
        _load(tmp_path, text)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path
