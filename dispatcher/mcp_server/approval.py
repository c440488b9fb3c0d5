"""A confirmation request as an MCP elicitation, and the answer back as a decision.

The question is the text a person watching the session sees in ``dispatcher watch`` (tool, input,
side-effect class, projected paths, the diff in review mode): one rendering, ``cli/output.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mcp_types as mt

from dispatcher.cli.output import confirmation_lines
from dispatcher.core.approval.broker import Decision
from dispatcher.core.events.payloads import ToolConfirmationRequested

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decision": {
            "type": "string",
            "title": "Decision",
            "description": "allow runs the call; deny refuses it (the model is told the user denied it)",
            "enum": ["allow", "deny"],
            "default": "allow",
        },
        "remember": {
            "type": "boolean",
            "title": "Remember for this session",
            "description": "give the same answer to this tool's next calls without asking",
            "default": False,
        },
    },
    "required": ["decision"],
}
"""What the host's form asks: the decision and whether to remember it for the session."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What goes to ``ResolveConfirmation``."""

    decision: Decision
    remember: bool


def question(session_id: str, p: ToolConfirmationRequested) -> mt.ElicitRequestFormParams:
    """The elicitation for one confirmation request."""
    text = (
        f"The agent's call needs your approval (session {session_id}).\n"
        + confirmation_lines(p, "")
        + f"\n\nAnother client may answer too (`dispatcher approve {session_id} {p.request_id}`): "
        "the first answer wins."
    )
    return mt.ElicitRequestFormParams(mode="form", message=text, requested_schema=SCHEMA)


def waiting_note(session_id: str, p: ToolConfirmationRequested) -> str:
    """Said to a client that cannot be asked: where the call's approval can be given instead."""
    return (
        f"{p.tool_name} waits for approval (request {p.request_id}): answer with "
        f"`dispatcher approve {session_id} {p.request_id}` (or `dispatcher deny ...`, or from "
        f"`dispatcher watch {session_id}`) before the server's confirmation timeout"
    )


def answer(result: mt.ElicitResult) -> Answer:
    """accept/decline/cancel to allow/deny/deny; an accepted form may still say deny."""
    if result.action != "accept":
        return Answer(Decision.DENY, remember=False)
    content = result.content or {}
    decision = Decision.DENY if content.get("decision") == "deny" else Decision.ALLOW
    return Answer(decision, remember=content.get("remember") is True)
