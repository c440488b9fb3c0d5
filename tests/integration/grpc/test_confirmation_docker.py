"""What a human approves is exactly what runs, in a real container (issue 7, point 2)."""

from __future__ import annotations

import pytest

from dispatcher.core.dispatcher import Decision
from tests.events import ToolCalled
from tests.server.conftest import TOKEN_BETA, Harness
from tests.server.helpers import next_event
from tests.server.rpc.test_hostile_input import ask_and_answer, audit_records, shown_input

pytestmark = pytest.mark.docker


async def test_the_approved_command_is_the_one_shown_and_it_runs(docker_harness: Harness) -> None:
    client = docker_harness.client(TOKEN_BETA)  # beta: EXECUTE prompts
    session = await client.create_session()
    command = "echo build ok password=$(touch /workspace/X)"
    request, result = await ask_and_answer(client, session.session_id, command, Decision.ALLOW)
    assert shown_input(request) == command
    assert "[REDACTED]" not in str(request.payload.input_summary)
    assert not result.is_error, result
    assert (docker_harness.tmp / "ws-beta" / "default" / "X").exists()  # what was shown is what ran
    called = await next_event(client, session.session_id, ToolCalled)
    assert called.payload.input == {"command": "echo build ok password=[REDACTED] /workspace/X)"}
    assert audit_records(docker_harness)[-1]["input"] == called.payload.input
