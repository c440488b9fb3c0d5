"""``dispatcher serve`` with ``mcp_endpoint`` on still stops on SIGTERM as without it: in-flight calls
drain, then everything stops (the HTTP server must not take the signal for itself)."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import httpx2

from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.server.persistence.test_restart import local_config
from tests.server.serve_process import start_serve

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_sigterm_drains_then_stops_with_the_endpoint_on(tmp_path: Path) -> None:
    port = _free_port()
    sp = start_serve(tmp_path, data=local_config(mcp_endpoint={"listen": f"127.0.0.1:{port}"}))
    try:
        token = (sp.home / "token").read_text().strip()
        headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        opened = httpx2.post(f"http://127.0.0.1:{port}/mcp", json=INIT, headers=headers)
        assert opened.status_code == 200
        with sp.client() as client:
            (mcp_session,) = client.list_sessions()
            stream = client.dispatch(
                mcp_session.session_id,
                [ToolUseBlock("slow", "shell", {"command": "echo a; sleep 1; echo b"})],
            )
            items: list[object] = []
            for item in stream:
                items.append(item)
                if getattr(item, "type", "") == "tool.output_delta":
                    sp.proc.send_signal(signal.SIGTERM)
                    break
            items.extend(stream)
        result = items[-1]
        assert isinstance(result, ToolResultBlock) and not result.is_error, items
        assert sp.proc.wait(timeout=20) == 0
        assert any('"stopped"' in line for line in sp.stderr)
    finally:
        sp.close()
