"""Audit before the call runs (issue 9 point 4): a call still running when ``dispatcher serve`` is
killed -9 has its ``tool.call.dispatched`` record (redacted input) in the audit file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

from dispatcher.core.types import ToolUseBlock
from tests.events import ToolFailed, is_event
from tests.polling import until, until_sync
from tests.server.conftest import Harness
from tests.server.persistence.test_shutdown import _agent_processes
from tests.server.serve_process import start_serve


def records(home: Path) -> list[dict[str, Any]]:
    path = home / "audit.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_call_running_when_the_server_is_killed_has_its_dispatched_record(tmp_path: Path) -> None:
    serve = start_serve(tmp_path)
    pids: list[int] = []
    try:
        with serve.client() as client:
            session = client.create_session()
            workspace = Path(session.workspace_path)
            command = "echo $$ > sleep.pid; exec sleep 300  # --password=hunter22"
            stream = iter(
                client.dispatch(session.session_id, [ToolUseBlock("tu_sleep", "shell", {"command": command})])
            )
            assert getattr(next(stream), "type", "") == "tool.called"
            until_sync(
                lambda: (
                    (workspace / "sleep.pid").is_file()
                    and (workspace / "sleep.pid").read_text().strip() != ""
                ),
                "the sleep to start",
            )
            pids.append(int((workspace / "sleep.pid").read_text()))
            pids.extend(_agent_processes(session.workspace_path))
            os.kill(serve.proc.pid, signal.SIGKILL)
            serve.proc.wait()
        mine = [r for r in records(serve.home) if r.get("tool_use_id") == "tu_sleep"]
        assert [r["kind"] for r in mine] == ["tool.call.dispatched"]
        (dispatched,) = mine
        assert dispatched["tool"] == "shell" and dispatched["session"] == session.session_id
        assert "sleep 300" in dispatched["input"]["command"] and "hunter22" not in json.dumps(dispatched)
        assert "outcome" not in dispatched
    finally:
        serve.close()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_a_client_gone_mid_call_leaves_a_completed_record_and_a_failed_event(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session("gone")
    started = asyncio.Event()

    async def consume() -> None:
        async for item in client.dispatch(session.session_id, [ToolUseBlock("tu_b", "block", {})]):
            if getattr(item, "type", "") == "tool.output_delta":
                started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    home = harness.tmp / "home"
    await until(
        lambda: (
            [r["kind"] for r in records(home) if r.get("tool_use_id") == "tu_b"][-1:]
            == ["tool.call.completed"]
        )
    )
    mine = [r for r in records(home) if r.get("tool_use_id") == "tu_b"]
    assert [r["kind"] for r in mine] == ["tool.call.dispatched", "tool.call.completed"]
    assert mine[-1]["outcome"] == "cancelled"
    async for event in harness.client().watch(session.session_id):
        if is_event(event, ToolFailed):
            assert event.tool_use_id == "tu_b" and event.payload.error_class == "cancelled"
            break
