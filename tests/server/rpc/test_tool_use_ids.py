"""tool_use ids are opaque strings: one with ":" in it comes back whole on every Dispatch path."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from dispatcher.v1 import dispatcher_pb2 as pb
from tests.events import ToolFailed
from tests.server.conftest import Harness
from tests.server.helpers import next_event
from tests.server.rpc.test_disconnect import _start_and_abandon

ID = "toolu:01"


async def test_an_id_with_a_colon_comes_back_whole(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    result = await client.call(session.session_id, "echo", {"text": "hi"}, tool_use_id=ID)
    assert result.tool_use_id == ID and not result.is_error


async def test_an_internal_error_result_keeps_an_id_with_a_colon(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A core bug (dispatch raising) still yields one result, under the caller's own id."""
    core = harness.server.dispatcher
    real = core.dispatch

    async def dispatch(tool_use: Any, *args: Any, **kwargs: Any) -> ToolResultBlock:
        if tool_use.id == ID:
            raise RuntimeError("injected core bug")
        return await real(tool_use, *args, **kwargs)

    monkeypatch.setattr(core, "dispatch", dispatch)
    client = harness.client()
    session = await client.create_session()
    items = [
        item
        async for item in client.dispatch(
            session.session_id,
            [ToolUseBlock(ID, "echo", {"text": "a"}), ToolUseBlock("b:2:c", "echo", {"text": "b"})],
        )
    ]
    results = {r.tool_use_id: r for r in items if isinstance(r, ToolResultBlock)}
    assert set(results) == {ID, "b:2:c"}
    assert results[ID].is_error and results[ID].error_class == "execution_error"
    assert "internal error" in "".join(getattr(b, "text", "") for b in results[ID].content)


async def test_disconnect_cancels_a_call_whose_id_has_a_colon(harness: Harness) -> None:
    watcher = harness.client()
    session = await watcher.create_session()
    await _start_and_abandon(harness, session.session_id, pb.ToolUse(id=ID, name="block", input_json="{}"))
    failed = await next_event(watcher, session.session_id, ToolFailed)
    assert failed.tool_use_id == ID and str(failed.payload.error_class) == "cancelled"
