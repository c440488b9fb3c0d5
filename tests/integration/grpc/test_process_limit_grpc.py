"""Issue 12 through the whole gRPC path: after a fork bomb the next shell call is answered, and
what happened to the sandbox reaches the model in the result's text and metadata."""

from __future__ import annotations

import pytest

from tests.server.conftest import Harness
from tests.server.helpers import text_of

pytestmark = pytest.mark.docker


async def test_the_call_after_a_fork_bomb_is_answered_and_says_what_happened(docker_harness: Harness) -> None:
    client = docker_harness.client()
    session = await client.create_session()
    notices: list[str] = []
    for _ in range(8):
        bomb = await client.call(
            session.session_id, "shell", {"command": "b(){ b|b& }; b", "timeout_seconds": 5}
        )
        notices += bomb.metadata.get("sandbox_notices", [])  # it may meet the last round's leftovers
        result = await client.call(session.session_id, "shell", {"command": "echo survived"})
        text = text_of(result)
        assert "the sandbox failed and was reset" not in text, text
        if result.is_error:  # the only acceptable failure: a clear refusal
            assert "process limit (256) is exhausted" in text, text
            continue
        assert text.endswith("survived\n"), text
        notices += result.metadata.get("sandbox_notices", [])
        for notice in result.metadata.get("sandbox_notices", []):
            assert f"[sandbox: {notice}]" in text  # the model reads it, first in the content
    # Whether a round exhausts the limit depends on timing; what must hold is above: every call
    # after a bomb is answered, and any notice is in the text the model reads.
    for notice in notices:
        assert notice.startswith(("the sandbox's process limit (256) was exhausted by", "the sandbox was")), (
            notice
        )
