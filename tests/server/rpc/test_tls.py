"""Serving over TLS (and mutual TLS) with certificates made here by openssl."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from dispatcher import cli
from dispatcher.cli import output as cli_output
from dispatcher.client import AsyncDispatcherClient, RequestFailed
from tests.server.conftest import TOKEN_ALPHA, ServerFactory

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    d = tmp_path / "pki"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "1", "-subj", "/CN=test-ca", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", "-extfile", "san.ext", cwd=d)  # fmt: skip
    return d


async def test_tls(make_server: ServerFactory, pki: Path) -> None:
    h = await make_server(tls={"cert_file": str(pki / "server.pem"), "key_file": str(pki / "server.key")})
    async with AsyncDispatcherClient(h.target, token=TOKEN_ALPHA, tls_ca=str(pki / "ca.pem")) as client:
        session = await client.create_session()
        assert not (await client.call(session.session_id, "echo", {"text": "secure"})).is_error
    async with AsyncDispatcherClient(h.target, token=TOKEN_ALPHA, timeout=3) as plain:
        with pytest.raises(RequestFailed) as err:
            await plain.list_sessions()
        assert err.value.code == "UNAVAILABLE"


async def test_mutual_tls(make_server: ServerFactory, pki: Path) -> None:
    tls = {
        "cert_file": str(pki / "server.pem"),
        "key_file": str(pki / "server.key"),
        "client_ca_file": str(pki / "ca.pem"),
    }
    h = await make_server(tls=tls)
    ca = str(pki / "ca.pem")
    async with AsyncDispatcherClient(
        h.target,
        token=TOKEN_ALPHA,
        tls_ca=ca,
        tls_cert=str(pki / "client.pem"),
        tls_key=str(pki / "client.key"),
    ) as client:
        assert (await client.create_session()).session_id
    async with AsyncDispatcherClient(h.target, token=TOKEN_ALPHA, tls_ca=ca, timeout=3) as anonymous:
        with pytest.raises(RequestFailed) as err:
            await anonymous.list_sessions()
        assert err.value.code == "UNAVAILABLE"


async def test_cli_speaks_mutual_tls(
    make_server: ServerFactory, pki: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tls = {
        "cert_file": str(pki / "server.pem"),
        "key_file": str(pki / "server.key"),
        "client_ca_file": str(pki / "ca.pem"),
    }
    h = await make_server(tls=tls)
    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_ALPHA)
    base = ["--server", h.target, "--tls-ca", str(pki / "ca.pem")]
    with_cert = [*base, "--tls-cert", str(pki / "client.pem"), "--tls-key", str(pki / "client.key")]
    assert await asyncio.to_thread(cli.main, ["call", *with_cert, "echo", '{"text": "over mtls"}']) == 0
    assert "over mtls" in capsys.readouterr().out
    assert (
        await asyncio.to_thread(cli.main, ["sessions", *base]) == cli_output.EXIT_UNAVAILABLE
    )  # no client cert
