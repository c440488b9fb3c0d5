"""Prometheus metrics (issue 9 point 2): the /metrics endpoint, bounded labels, its lifetime, and a
real Prometheus server scraping it and answering a query through its HTTP API."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.client import RequestFailed
from dispatcher.core.errors import ConfigError
from dispatcher.observe_config import parse_observe
from tests.polling import until
from tests.server.conftest import Harness, ServerFactory

METRICS_ON = {"metrics": {"listen": "127.0.0.1:0"}}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def samples(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric's samples in the text format."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name) :]] = float(value)
    return out


async def calls_of_every_kind(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session("metrics")
    for _ in range(3):
        assert not (await client.call(session.session_id, "echo", {"text": "hi"})).is_error
    unknown = await client.call(session.session_id, 'evil\u2028{tool="x"} 1e9', {})
    assert unknown.is_error
    invalid = await client.call(session.session_id, "echo", {"text": 5})
    assert invalid.is_error
    with pytest.raises(RequestFailed):
        await harness.client(token="not-a-token").list_sessions()


async def test_metrics_count_calls_sessions_and_rpcs_with_bounded_labels(make_server: ServerFactory) -> None:
    harness = await make_server(**METRICS_ON)
    port = harness.server.observability.metrics_port
    assert port
    await calls_of_every_kind(harness)
    text = await asyncio.to_thread(scrape, port)
    calls = samples(text, "dispatcher_tool_calls_total")
    assert calls == {
        '{outcome="ok",tool="echo"}': 3.0,
        '{outcome="not_found",tool="_unknown"}': 1.0,
        '{outcome="validation_error",tool="echo"}': 1.0,
    }
    assert "evil" not in text  # a name the caller made up is never a label
    assert samples(text, "dispatcher_tool_call_duration_seconds_count") == {
        '{tool="echo"}': 4.0,
        '{tool="_unknown"}': 1.0,
    }
    assert samples(text, "dispatcher_sessions_open")['{tenant="alpha"}'] == 1.0
    assert samples(text, "dispatcher_sessions_open")['{tenant="beta"}'] == 0.0
    rpcs = samples(text, "dispatcher_rpc_requests_total")
    assert rpcs['{code="OK",method="/dispatcher.v1.ToolDispatcher/Dispatch"}'] == 5.0
    assert rpcs['{code="UNAUTHENTICATED",method="/dispatcher.v1.ToolDispatcher/ListSessions"}'] == 1.0
    for name in (
        "process_cpu_seconds_total",
        "dispatcher_confirmation_wait_seconds_count",
        "dispatcher_sandbox_launch_seconds_count",
    ):
        assert name in text, name


async def test_the_metrics_endpoint_stops_with_the_server(make_server: ServerFactory) -> None:
    harness = await make_server(**METRICS_ON)
    port = harness.server.observability.metrics_port
    assert "dispatcher_tool_calls" in await asyncio.to_thread(scrape, port)
    await harness.server.stop(grace=1)
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(scrape, port)


async def test_metrics_are_off_by_default(harness: Harness) -> None:
    assert harness.server.observability.metrics_port == 0 and not harness.server.observability.interceptors


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        ({"metrics": {"listen": "9464"}}, "metrics.listen: expected HOST:PORT"),
        ({"metrics": {"listen": "127.0.0.1:99999"}}, "metrics.listen: expected HOST:PORT"),
        ({"metrics": {"listen": 9464}}, "metrics.listen: expected HOST:PORT"),
        ({"metrics": {"port": 1}}, "metrics.port: unknown key"),
        ({"metrics": "on"}, "metrics: must be a mapping"),
        ({"tracing": {"otlp_endpoint": "localhost"}}, "tracing.otlp_endpoint: expected a URL"),
    ],
)
def test_bad_observability_config_names_the_key(section: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_observe(section)
    assert fragment in str(info.value)


def test_metrics_listen_flag_is_validated_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dispatcher.cli import main

    monkeypatch.setenv("DISPATCHER_HOME", str(tmp_path / "home"))
    assert main(["serve", "--listen", "127.0.0.1:0", "--metrics-listen", "nope"]) == 2
    assert "--metrics-listen: expected HOST:PORT, got 'nope'" in capsys.readouterr().err


# --- a real Prometheus ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        if os.environ.get("DISPATCHER_REQUIRE_DOCKER") == "1":
            pytest.fail("prometheus is not installed (scripts/bootstrap.sh installs it)")
        pytest.skip("prometheus is not installed (scripts/bootstrap.sh installs it)")
    return found


@pytest.fixture
def prometheus(prometheus_binary: str, tmp_path: Path) -> Iterator[Any]:
    """Start Prometheus on loopback scraping the targets given to the returned function."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> str:
        config = tmp_path / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "500ms", "evaluation_interval": "500ms"},
                    "scrape_configs": [
                        {
                            "job_name": "dispatcher",
                            "scrape_interval": "500ms",
                            "scrape_timeout": "400ms",
                            "static_configs": [{"targets": [target]}],
                        }
                    ],
                }
            )
        )
        web = f"127.0.0.1:{free_port()}"
        log = (tmp_path / "prometheus.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    prometheus_binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address={web}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )
        )
        log.close()
        return f"http://{web}"

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, ConnectionError):
        return []  # not up yet
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


async def test_a_real_prometheus_scrapes_the_tool_call_counter(
    make_server: ServerFactory, prometheus: Any, tmp_path: Path
) -> None:
    harness = await make_server(**METRICS_ON)
    base = prometheus(f"127.0.0.1:{harness.server.observability.metrics_port}")
    await calls_of_every_kind(harness)
    wanted = 'dispatcher_tool_calls_total{tool="echo",outcome="ok"}'

    async def value() -> str | None:
        result = await asyncio.to_thread(query, base, wanted)
        return result[0]["value"][1] if result else None

    seen: list[str | None] = []

    async def scraped() -> bool:
        seen.append(await value())
        return seen[-1] == "3"

    await until(scraped, f"Prometheus to report {wanted} = 3", timeout=60, interval=0.2)
    up = await asyncio.to_thread(query, base, 'up{job="dispatcher"}')
    assert up and up[0]["value"][1] == "1"
    sessions = await asyncio.to_thread(query, base, 'dispatcher_sessions_open{tenant="alpha"}')
    assert sessions and sessions[0]["value"][1] == "1"
