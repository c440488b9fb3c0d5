"""What one call's steps share (``RunState``) and what every call of a dispatcher shares
(``PipelineDeps``). Below the pipeline's steps: approval, review and the call record take a
``RunState`` without importing the pipeline itself."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dispatcher.core.approval.confirmation_policy import ConfirmationPolicy
from dispatcher.core.audit import AuditDecision, AuditSink
from dispatcher.core.call.ordering import MessageOrder
from dispatcher.core.call.settings import DispatcherConfig
from dispatcher.core.events.payloads import EventPayload
from dispatcher.core.observe import NO_OBSERVER, CallObserver
from dispatcher.core.provider_api import SandboxProvider
from dispatcher.core.registry import ToolRegistry
from dispatcher.core.sessions.session import Session
from dispatcher.core.sessions.state import Call, SessionState
from dispatcher.core.text.display import summarize
from dispatcher.core.types import ToolUseBlock

__all__ = ["PipelineDeps", "RunState"]


@dataclass(frozen=True, slots=True)
class PipelineDeps:
    """What every call of one dispatcher shares: passed explicitly, not reached through its owner."""

    config: DispatcherConfig
    registry: ToolRegistry
    provider: SandboxProvider
    policy: ConfirmationPolicy
    audit: AuditSink | None
    observer: CallObserver = NO_OBSERVER  # metrics and traces (core/observe.py)


class RunState:
    """One call's state, shared by its steps; ``pipeline.CallRun`` adds the steps."""

    def __init__(
        self,
        deps: PipelineDeps,
        state: SessionState,
        session: Session,
        tool_use: ToolUseBlock,
        turn_id: str,
        call: Call,
        order: MessageOrder | None = None,
        index: int = 0,
    ) -> None:
        self.deps = deps
        self.order = order  # the gates of the message this call is part of (None: no gate)
        self.index = index  # this call's position in the message
        self.config = deps.config
        self.state = state
        self.session = session
        self.tool_use = tool_use
        self.turn_id = turn_id
        self.call = call
        self.started = self.config.clock()
        self.started_wall = time.time()
        self.ended = False  # the call's last audit record is written (exactly one per call)
        self.run_started: float | None = None  # set at tool.called: durations exclude confirmation waits
        self.tool_name = tool_use.name
        self.decision = AuditDecision.AUTO  # the audit records' decision; steps change it
        self._summary: Any = None
        self.resolved: dict[str, str] = {}  # requires_fs input key -> real path in the workspace
        self.notices: list[str] = []  # what happened to the sandbox meanwhile (recreated, ...)

    # Events and audit -------------------------------------------------------------------

    def emit(self, payload: EventPayload) -> None:
        self.state.bus.publish(payload, turn_id=self.turn_id, tool_use_id=self.tool_use.id)

    def summary(self) -> Any:
        """The input as events, logs and audit report it: bounded, secrets redacted (computed once).

        Never what a human approves: that is ``confirmation_text``, whole and unredacted.
        """
        if self._summary is None:
            self._summary = summarize(self.tool_use.input)
        return self._summary

    def log_extra(self) -> dict[str, str]:
        """Fields every log line about this call carries (structured logs)."""
        return {
            "session_id": self.session.session_id,
            "tool_use_id": self.tool_use.id,
            "tool": self.tool_name,
        }

    def elapsed_ms(self) -> float:
        """Time since the call arrived (audit: what the caller waited)."""
        return (self.config.clock() - self.started) * 1000

    def run_ms(self) -> float:
        """Time since the tool started (events: what the tool took); 0 if it never started."""
        return 0.0 if self.run_started is None else (self.config.clock() - self.run_started) * 1000
