"""GetSessionUsage through the real server: the backend's figures with the egress proxy's counters
added, another tenant's session unknown, asking not counted as activity, and a backend that
measures nothing refused with FAILED_PRECONDITION saying so."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from dispatcher import cli
from dispatcher.client import RequestFailed
from dispatcher.config.load import ensure_default_tenant, load_config
from dispatcher.core.provider_api import ProviderHooks, SessionUsage
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.local import LocalSandboxProvider
from dispatcher.server.app import build_server
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, Harness, base_config


class MeasuredProvider(LocalSandboxProvider):
    """The local backend, with fixed figures for every session's usage."""

    async def usage(self, session: Session) -> SessionUsage:
        return SessionUsage(cpu_percent=42.5, memory_bytes=1234, pids=3, sample_time=10.0, running=True)


async def test_local_backend_refuses_with_failed_precondition(harness: Harness) -> None:
    client = harness.client()
    sid = (await client.create_session()).session_id
    with pytest.raises(RequestFailed) as refused:
        await client.session_usage(sid)
    assert refused.value.code == "FAILED_PRECONDITION"
    assert "reports no usage" in refused.value.details


async def test_usage_adds_egress_counters_and_is_the_tenants_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_ALPHA)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(tmp_path)))
    config, _ = ensure_default_tenant(load_config(path, env={}))

    def provider(hooks: ProviderHooks) -> MeasuredProvider:
        return MeasuredProvider(hooks=hooks)

    server = build_server(config, provider=provider)
    await server.start()
    harness = Harness(server, tmp_path)
    try:
        client = harness.client()
        sid = (await client.create_session()).session_id
        before = (await client.get_session(sid)).last_activity_time
        ctx = server.egress.context(sid)
        assert ctx is not None
        ctx.bytes_sent, ctx.bytes_received = 100, 2000  # as the proxy counts relayed chunks

        used = await client.session_usage(sid)
        assert (used.cpu_percent, used.memory_bytes, used.pids, used.running) == (42.5, 1234, 3, True)
        assert (used.egress_bytes_sent, used.egress_bytes_received) == (100, 2000)
        assert used.sample_time == 10.0
        assert (await client.get_session(sid)).last_activity_time == before  # not activity

        with pytest.raises(RequestFailed) as refused:
            await harness.client(TOKEN_BETA).session_usage(sid)
        assert refused.value.code == "NOT_FOUND"
        with pytest.raises(RequestFailed) as unknown:
            await client.session_usage("ses_nope")
        assert unknown.value.code == "NOT_FOUND"

        totals = await server.usage.by_tenant()
        assert set(totals) == {"alpha"}
        assert (totals["alpha"].sessions, totals["alpha"].memory_bytes) == (1, 1234)

        # `dispatcher top`: the table, and one JSON line per session.
        def top(*flags: str) -> int:
            return cli.main(["top", "--once", "--server", harness.target, *flags])

        capsys.readouterr()
        assert await asyncio.to_thread(top) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split()[:3] == ["SESSION", "CPU%", "CPU"]
        assert table[1].split()[:2] == [sid, "42.5"] and "1.2K" in table[1]
        assert await asyncio.to_thread(top, "--json") == 0
        row = json.loads(capsys.readouterr().out)
        assert (row["session_id"], row["cpu_percent"], row["egress_bytes_received"]) == (sid, 42.5, 2000)
    finally:
        for c in harness.clients:
            await c.close()
        await server.stop(grace=1)
