"""A dispatcher with the built-in tools over one fake sandbox session, and the events it published:
the rig of the process and shell-memory tool tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from dispatcher.core import ConfirmationPolicy, Session, ToolDispatcher, ToolUseBlock
from dispatcher.core.events.bus import Event
from dispatcher.core.sessions.state import SessionState
from dispatcher.core.types import ToolResultBlock
from dispatcher.sandbox.fake import FakeSandbox, FakeSandboxProvider
from dispatcher.sandbox.fake.processes import FakeProcesses, Limits
from dispatcher.tools import builtin_factories
from tests.blocks import text_at


@dataclass
class Rig:
    dispatcher: ToolDispatcher
    provider: FakeSandboxProvider
    session: Session
    sandbox: FakeSandbox
    state: SessionState
    events: list[Event] = field(default_factory=list)
    calls: int = 0

    @property
    def table(self) -> FakeProcesses:
        return self.sandbox.table

    async def call(self, name: str, tool_use_id: str | None = None, **input: Any) -> ToolResultBlock:
        self.calls += 1
        use = ToolUseBlock(tool_use_id or f"tu{self.calls}", name, input)
        return await self.dispatcher.dispatch(use, self.session, turn_id="turn")

    async def background(self, command: str = "serve", tool_use_id: str | None = None) -> str:
        result = await self.call("shell", tool_use_id, command=command, background=True)
        assert not result.is_error, text_at(result)
        process_id = result.metadata["process_id"]
        assert isinstance(process_id, str)
        return process_id


@contextlib.asynccontextmanager
async def make_rig(
    tmp_path: Any,
    limits: Limits | None = None,
    *,
    shell_persist: bool = True,
    policy: ConfirmationPolicy | None = None,
    **sandbox: Any,
) -> AsyncIterator[Rig]:
    provider = FakeSandboxProvider()
    dispatcher = ToolDispatcher(provider, policy=policy or ConfirmationPolicy.preset("autonomous"))
    for factory in builtin_factories(shell_persist=shell_persist):
        dispatcher.register(factory, builtin=True)
    dispatcher.seal()
    session = Session("s1", str(tmp_path))
    fake = provider.sandboxes["s1"] = FakeSandbox(table=FakeProcesses(limits), **sandbox)
    dispatcher.open_session(session)
    state = dispatcher.session_state("s1")
    rig = Rig(dispatcher, provider, session, fake, state)
    state.bus.sink = rig.events.append
    yield rig
    await dispatcher.aclose()
