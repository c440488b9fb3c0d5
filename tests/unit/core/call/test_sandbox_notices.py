"""What a sandbox reports about itself during a call (recreated, leftovers killed) reaches that
call's result, first in its content and in its metadata, and no other call's."""

from __future__ import annotations

import asyncio
import json

from dispatcher.core import ConfirmationPolicy, Session, ToolDispatcher, ToolUseBlock
from dispatcher.core.approval.confirmation_policy import Mode
from dispatcher.core.sandbox_api import (
    ExecRequest,
    ExecResult,
    OutputCallback,
    ProcessLimitExhausted,
    collect_notices,
    report_notice,
)
from dispatcher.core.types import TextBlock
from dispatcher.sandbox.fake import FakeSandboxProvider
from dispatcher.tools import ShellTool

RECREATED = "the sandbox was recreated for this call: the previous one was removed (test)"


async def _exec(request: ExecRequest, on_output: OutputCallback, cancel: asyncio.Event) -> ExecResult:
    if request.command == "noted":
        report_notice(RECREATED)
        report_notice(RECREATED)  # said once however often reported
    if request.command == "refused":
        report_notice("the sandbox's process limit (256) was exhausted by 9 leftover processes")
        raise ProcessLimitExhausted("cannot start the command: the process limit is exhausted", processes=9)
    await asyncio.sleep(0.01)  # overlap with the other calls
    on_output("stdout", b"out\n")
    return ExecResult(exit_code=0)


async def test_notice_reaches_only_the_call_that_met_it(tmp_path: object) -> None:
    provider = FakeSandboxProvider()
    dispatcher = ToolDispatcher(provider, policy=ConfirmationPolicy(per_tool={"shell": Mode.AUTO}))
    dispatcher.register(ShellTool)
    session = Session(session_id="s", workspace_path=str(tmp_path), tenant_id="t")
    provider.sandbox_for(session).exec_handler = _exec
    try:
        plain, noted, refused = await dispatcher.dispatch_all(
            [
                ToolUseBlock("a", "shell", {"command": "plain"}),
                ToolUseBlock("b", "shell", {"command": "noted"}),
                ToolUseBlock("c", "shell", {"command": "refused"}),
            ],
            session,
        )
    finally:
        await dispatcher.aclose()
    assert not plain.is_error and plain.content == (TextBlock("out\n"),)
    assert "sandbox_notices" not in plain.metadata
    assert not noted.is_error
    assert noted.content == (TextBlock(f"[sandbox: {RECREATED}]"), TextBlock("out\n"))
    assert json.loads(json.dumps(dict(noted.metadata)))["sandbox_notices"] == [RECREATED]
    assert refused.is_error and refused.error_class is not None
    texts = [b.text for b in refused.content if isinstance(b, TextBlock)]
    assert texts[0].startswith("[sandbox: the sandbox's process limit (256) was exhausted")
    assert any("cannot start the command: the process limit is exhausted" in t for t in texts)


def test_outside_a_call_a_notice_goes_nowhere() -> None:
    assert report_notice("lost") is False
    with collect_notices() as notices:
        assert report_notice("kept") is True
    assert notices == ["kept"]


def test_shell_description_states_the_background_and_process_limit_rules() -> None:
    text = ShellTool.definition.description
    assert "Background processes" in text and "keep running after the command returns" in text
    assert "process limit" in text and "256" in text and "[sandbox: ...]" in text
