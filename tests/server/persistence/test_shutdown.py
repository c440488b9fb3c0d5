"""Graceful shutdown of a real ``dispatcher serve`` process on SIGTERM / SIGINT."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dispatcher.client import RequestFailed
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.server.serve_process import ServeProcess, start_serve


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    sp = start_serve(tmp_path)
    yield sp
    sp.close()


def _agent_processes(workspace: str) -> list[int]:
    """Pids of local sandbox agents serving ``workspace``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if workspace.encode() in cmdline and any(b"agent" in part for part in cmdline):
            pids.append(int(entry.name))
    return pids


def test_token_file_is_private(serve: ServeProcess) -> None:
    token = serve.home / "token"
    assert token.stat().st_mode & 0o777 == 0o600
    with serve.client() as client:
        assert client.create_session().session_id


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_in_flight_call_finishes_then_sandboxes_stop(serve: ServeProcess, sig: signal.Signals) -> None:
    with serve.client() as client:
        session = client.create_session()
        assert not client.call(session.session_id, "shell", {"command": "true"}).is_error
        assert _agent_processes(session.workspace_path), "the local sandbox agent should be running"
        items: list[object] = []
        stream = client.dispatch(
            session.session_id, [ToolUseBlock("slow", "shell", {"command": "echo a; sleep 1; echo b"})]
        )
        for item in stream:
            items.append(item)
            if getattr(item, "type", "") == "tool.output_delta":
                serve.proc.send_signal(sig)
                break
        # health turns NOT_SERVING and new work is refused while the call drains
        with grpc.insecure_channel(serve.target) as channel:
            status = _health(channel)
            assert status in (health_pb2.HealthCheckResponse.NOT_SERVING, None)
        with pytest.raises(RequestFailed) as err:
            client.create_session("late")
        assert err.value.code == "UNAVAILABLE"
        items.extend(stream)
    result = items[-1]
    assert isinstance(result, ToolResultBlock) and not result.is_error, items
    assert "b" in "".join(getattr(b, "text", "") for b in result.content)
    assert serve.proc.wait(timeout=20) == 0
    assert not _agent_processes(session.workspace_path)
    assert any('"stopped"' in line for line in serve.stderr)


def test_calls_past_the_grace_are_cancelled(tmp_path: Path) -> None:
    sp = start_serve(tmp_path, grace=1.5)
    try:
        with sp.client() as client:
            session = client.create_session()
            stream = client.dispatch(session.session_id, [ToolUseBlock("forever", "block", {})])
            for item in stream:
                if getattr(item, "type", "") == "tool.output_delta":
                    began = time.monotonic()
                    sp.proc.send_signal(signal.SIGTERM)
                    break
            rest = list(stream)
        result = rest[-1]
        assert isinstance(result, ToolResultBlock) and str(result.error_class) == "cancelled"
        assert sp.proc.wait(timeout=20) == 0
        assert time.monotonic() - began < 10
    finally:
        sp.close()


def _health(channel: grpc.Channel) -> int | None:
    try:
        return int(
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        )
    except grpc.RpcError:
        return None  # already stopped listening
