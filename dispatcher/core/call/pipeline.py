"""One tool call through the ten steps of spec 000 §4: lookup, validation, scope, policy and
confirmation, the run under timeout and cancellation, and the canonical result (its making:
``result.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, cast

from dispatcher.core import eager
from dispatcher.core.approval.confirmation_policy import Mode
from dispatcher.core.audit import DISPATCHED, AuditDecision
from dispatcher.core.call import approve, review
from dispatcher.core.call import record as call_record
from dispatcher.core.call import result as call_result
from dispatcher.core.call.run_state import PipelineDeps as PipelineDeps
from dispatcher.core.call.run_state import RunState
from dispatcher.core.call.timeouts import call_timeout
from dispatcher.core.capabilities import Capabilities
from dispatcher.core.errors import (
    FailureReason,
    ToolCancelled,
    ToolError,
    ToolErrorClass,
    ToolExecutionError,
    ToolNotFound,
    ToolPermissionDenied,
    ToolTimeout,
    ToolValidationError,
    WorkspaceEscapeError,
)
from dispatcher.core.events.payloads import (
    ToolCalled,
    ToolOutputDelta,
)
from dispatcher.core.jsonlimits import shape_problem
from dispatcher.core.observe import log_fields
from dispatcher.core.paths import resolve_workspace_path
from dispatcher.core.registry import RegisteredTool
from dispatcher.core.sandbox_api import Sandbox, SandboxError, collect_notices
from dispatcher.core.schema import validation_errors
from dispatcher.core.staging.files import StagedFiles
from dispatcher.core.text.visible import unescape
from dispatcher.core.types import (
    Role,
    Tool,
    ToolContext,
    ToolDefinition,
    ToolOutput,
    ToolResultBlock,
    UnparsedInput,
)

__all__ = ["CallRun", "PipelineDeps"]  # PipelineDeps: from run_state, re-exported

log = logging.getLogger("dispatcher.core")
_UNRESTRICTED = Capabilities()
_VALIDATION_ERRORS_SHOWN = 20
_VALIDATION_ERROR_CHARS = 500  # jsonschema messages quote the offending value whole
_FOREVER = 10.0**9  # a gate has no time limit of its own: the calls it waits for have theirs


class CallRun(RunState):
    """The steps of one call; what they share is ``RunState``'s, so each step stays small."""

    def audit(self, kind: str, outcome: str | None = None) -> None:
        """One audit record; ``outcome`` None: the call is about to run (``tool.call.dispatched``).
        With an outcome, the call's one final record, and the observer told (``record.py``)."""
        call_record.record(self, kind, outcome)

    # The pipeline ---------------------------------------------------------------------------

    async def execute(self) -> ToolResultBlock:
        # The sandbox reports what the model must know about it (recreated, processes killed);
        # the tool's task inherits this context, so its reports land here too.
        with (
            collect_notices() as self.notices,
            log_fields(
                tenant=self.session.tenant_id,
                session=self.session.session_id,
                tool_use_id=self.tool_use.id,
                tool=self.tool_name,
            ),
        ):
            try:
                return await self._execute()
            except asyncio.CancelledError:
                call_record.abandoned(self)
                raise

    async def _execute(self) -> ToolResultBlock:
        try:
            registered = self.lookup()  # step 1
            input_ = self.validate(registered)  # step 2
            await self.wait_turn()  # the message's ordering: the calls this one depends on end first
            sandbox = self.deps.provider.sandbox_for(self.session)
            self.check_scope(registered.definition, input_, sandbox.workspace_root)  # step 3, lexical
            mode = self.policy_mode(registered.definition)  # a deny needs no sandbox
            staged = approve.stages(self, registered.definition)  # review/audit: kept off the disk
            caps = self.session.capabilities or _UNRESTRICTED
            if mode is not Mode.AUTO or caps.fs_grants is not None or staged:
                # Step 3 where the files are. Skipped only when nobody is asked, no grant
                # narrows the workspace and nothing is staged (a change is kept by its real path):
                # the agent then refuses an escape at use all the same, and the round trip
                # (~0.4 ms) stays off the fast path.
                await self.resolve_scope(registered.definition, input_, sandbox)
            await approve.confirm(self, registered.definition, input_, mode)  # step 4
        except ToolError as exc:
            return call_result.fail(self, exc, denied=True)
        if self.call.cancel_event.is_set():
            return call_result.fail(
                self, ToolCancelled("Tool call was cancelled before it started"), denied=True
            )
        async with self.state.semaphore:  # the per-session concurrency cap
            if self.call.cancel_event.is_set():
                return call_result.fail(
                    self, ToolCancelled("Tool call was cancelled before it started"), denied=True
                )
            self.run_started = self.config.clock()
            self.emit(
                ToolCalled(
                    tool_name=self.tool_name,
                    side_effect=registered.definition.side_effect.value,
                    input=self.summary(),
                )
            )  # step 5
            self.audit(DISPATCHED)  # before the tool starts: a call the server dies in is on record
            try:
                if staged:  # steps 6-7: what the tool would write, staged (core/call/review.py)
                    output = await review.stage(self, registered, input_)
                else:
                    output = await self.run_tool(registered, input_, sandbox)  # steps 6-7
            except ToolError as exc:
                return call_result.fail(self, exc)
        return call_result.complete(self, output)  # steps 8-10

    def lookup(self) -> RegisteredTool:
        registered = self.deps.registry.get(self.tool_use.name)
        if registered is None or (registered.definition.main_only and self.session.role is not Role.MAIN):
            raise ToolNotFound(f"Unknown tool {self.tool_use.name!r}")
        caps = self.session.capabilities or _UNRESTRICTED
        if not caps.check_tool(self.tool_use.name):
            self.decision = AuditDecision.CAPABILITY_DENIED
            raise ToolPermissionDenied(
                f"Tool {self.tool_use.name!r} is not allowed for this session",
                reason=FailureReason.CAPABILITY_DENIED,
            )
        return registered

    def validate(self, registered: RegisteredTool) -> dict[str, Any]:
        # The shape first: jsonschema, and everything after it, recurses and walks every value.
        problem = shape_problem(self.tool_use.input)
        errors = [f"$: input is refused: {problem}"] if problem else self._schema_errors(registered)
        check = registered.definition.check_input
        if not errors and check is not None:
            errors = check(self.tool_use.input)[:_VALIDATION_ERRORS_SHOWN]
        if errors:
            given = self.tool_use.input
            raise ToolValidationError(
                "Invalid input for tool " + repr(self.tool_name) + ": " + "; ".join(errors),
                errors,
                reason=given.reason if isinstance(given, UnparsedInput) else FailureReason.INVALID_ARGS,
            )
        input_: dict[str, Any] = self.tool_use.input
        return _unescaped_paths(registered.definition, input_)

    def _schema_errors(self, registered: RegisteredTool) -> list[str]:
        """The schema violations, bounded: a few, each cut (messages quote the bad value)."""
        errors = validation_errors(registered.validator, self.tool_use.input)
        shown = [
            e if len(e) <= _VALIDATION_ERROR_CHARS else e[:_VALIDATION_ERROR_CHARS] + "..."
            for e in errors[:_VALIDATION_ERRORS_SHOWN]
        ]
        if len(errors) > _VALIDATION_ERRORS_SHOWN:
            shown.append(f"... and {len(errors) - _VALIDATION_ERRORS_SHOWN:,} more")
        return shown

    def check_scope(self, definition: ToolDefinition, input_: dict[str, Any], root: str) -> None:
        caps = self.session.capabilities or _UNRESTRICTED
        for key, mode in definition.requires_fs:
            value = input_.get(key)
            if not isinstance(value, str):
                continue
            resolved = resolve_workspace_path(value, root)
            if not caps.check_fs(resolved, mode, root=root):
                self.decision = AuditDecision.FS_DENIED
                verb = "write" if mode == "rw" else "read"
                raise ToolPermissionDenied(f"Path {value!r} is not granted for {verb} access in this session")

    async def resolve_scope(
        self, definition: ToolDefinition, input_: dict[str, Any], sandbox: Sandbox
    ) -> None:
        """Resolve each path in the sandbox and check the grants on where it really is.

        Runs before confirmation: a human is never asked about a call that cannot run, and the
        question shows the real path. The agent checks the grants again when it opens the file.
        """
        caps = self.session.capabilities or _UNRESTRICTED
        for key, mode in definition.requires_fs:
            value = input_.get(key)
            if not isinstance(value, str):
                continue
            try:
                real = await sandbox.resolve(value)
            except WorkspaceEscapeError:
                self.decision = AuditDecision.WORKSPACE_ESCAPE
                raise
            except SandboxError as exc:
                raise ToolExecutionError(
                    f"The sandbox failed while checking {value!r}; it will be recreated",
                    exc,
                    reason=FailureReason.SANDBOX_FAILED,
                ) from exc
            if not caps.check_fs(real, mode, relative=True):
                self.decision = AuditDecision.FS_DENIED
                verb = "write" if mode == "rw" else "read"
                raise ToolPermissionDenied(
                    f"Path {value!r} (really {real!r}) is not granted for {verb} access in this session"
                )
            self.resolved[key] = real

    async def wait_turn(self) -> None:
        """Wait for the calls of the message this one must follow (``core/call/ordering.py``).

        Raises:
            ToolCancelled: the call was cancelled meanwhile.
        """
        order = self.order
        plan = self.state.mode == approve.ApprovalMode.PLAN  # steps are numbered in message order
        if order is None or not order.waits_for(self.index, plan=plan):
            return
        waiter = asyncio.ensure_future(order.wait(self.index, plan=plan))
        try:
            if not await self.call.wait(waiter, _FOREVER):
                raise ToolCancelled("Tool call was cancelled while it waited for the calls before it")
        finally:
            waiter.cancel()

    def policy_mode(self, definition: ToolDefinition) -> Mode:
        """The confirmation mode of this call (``core/call/approve.py``); raises on a policy deny."""
        return approve.policy_mode(self, definition)

    async def run_tool(
        self, registered: RegisteredTool, input_: dict[str, Any], sandbox: Sandbox
    ) -> ToolOutput:
        definition = registered.definition
        limit, timeout = call_timeout(definition, input_, self.config)
        tool = registered.factory()  # step 6: a fresh instance per call
        context = ToolContext(
            session_id=self.session.session_id,
            turn_id=self.turn_id,
            tool_use_id=self.tool_use.id,
            workspace_path=self.session.workspace_path,
            cancel_event=self.call.cancel_event,
            logger=logging.LoggerAdapter(
                _tool_logger(definition.name),
                {"session_id": self.session.session_id, "tool_use_id": self.tool_use.id},
            ),
            # Reads see the session's staged changes; shell (``sandbox``) sees the disk.
            workspace_files=StagedFiles(sandbox, self.state.staging) if self.state.staging else sandbox,
            sandbox=sandbox,
            emit_output=self._emit_output,
            timeout_seconds=limit,
            resolved=dict(self.resolved),  # the tool uses exactly what was checked and approved
            processes=self.state.processes,
        )
        if self.state.processes.needs_resume:  # the first call after a restart
            await self.state.processes.resume(sandbox.processes)
        # Started now: a tool that finishes without waiting (a NONE tool, a refusal) is answered
        # without a loop turn, a waiter or a timer; one that waits is supervised as its task.
        started = eager.start(tool.execute(input_, context))
        if started.done_now:
            return _tool_result(started.outcome, self.tool_name, self.log_extra())
        task = started.task
        try:
            return await self._supervise(tool, task, timeout)
        except asyncio.CancelledError:
            # Our own task was cancelled (server shutdown, client gone): still stop the tool.
            self.call.cancel()
            stopper = asyncio.ensure_future(self._stop(tool, task))
            self.state.cleanups.add(stopper)
            stopper.add_done_callback(self.state.cleanups.discard)
            raise

    def _emit_output(self, stream: str, text: str) -> asyncio.Future[None] | None:
        self.emit(ToolOutputDelta(stream=stream, text=text))
        return self.state.bus.room(self.turn_id, self.tool_use.id)  # the caller's stream is full

    async def _supervise(self, tool: Tool, task: asyncio.Future[ToolOutput], timeout: float) -> ToolOutput:
        if await self.call.wait(cast("asyncio.Future[Any]", task), timeout):
            return _tool_result(task.result, self.tool_name, self.log_extra())
        if not self.call.cancel_event.is_set():
            self.call.cancel(ToolErrorClass.TIMEOUT)
        reason = self.call.cancel_reason
        partial = await self._stop(tool, task)
        if reason is ToolErrorClass.TIMEOUT:
            raise ToolTimeout(f"Tool {self.tool_name!r} timed out after {timeout:g} s", output=partial)
        raise ToolCancelled(f"Tool {self.tool_name!r} was cancelled", output=partial)

    async def _stop(self, tool: Tool, task: asyncio.Future[ToolOutput]) -> ToolOutput | None:
        """Ask the tool to stop, wait for it up to abandon_after, and return what it produced."""
        try:
            async with asyncio.timeout(self.config.abandon_after):
                with contextlib.suppress(Exception):
                    await tool.cancel()
                await asyncio.wait({task})
        except TimeoutError:
            log.warning(
                "abandoning tool %s after %.0f s: it did not honour cancellation",
                self.tool_name,
                self.config.abandon_after,
                extra=self.log_extra(),
            )
            task.cancel()
            return None
        if task.cancelled():
            return None
        exc = task.exception()
        if exc is None:
            return task.result()
        return exc.output if isinstance(exc, ToolError) else None


@functools.cache
def _tool_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"dispatcher.tool.{name}")


def _tool_result(result: Callable[[], ToolOutput], tool_name: str, extra: dict[str, str]) -> ToolOutput:
    """The tool's output (``result`` gives it or raises), with any non-ToolError turned into an
    opaque execution error."""
    try:
        output = result()
    except ToolError:
        raise
    except SandboxError as exc:
        log.error("sandbox failure in tool %s: %s", tool_name, exc, extra=extra)
        raise ToolExecutionError(
            f"The sandbox failed while running {tool_name!r}; it will be recreated",
            exc,
            reason=FailureReason.SANDBOX_FAILED,
        ) from exc
    except Exception as exc:
        log.exception("tool %s raised an unexpected exception", tool_name, extra=extra)
        raise ToolExecutionError(
            f"Tool {tool_name!r} failed with an internal error", exc, is_user_visible=False
        ) from exc
    if not isinstance(output, ToolOutput):
        log.error("tool %s returned %r instead of a ToolOutput", tool_name, type(output), extra=extra)
        raise ToolExecutionError(f"Tool {tool_name!r} returned an invalid result", is_user_visible=False)
    return output


def _unescaped_paths(definition: ToolDefinition, input_: dict[str, Any]) -> dict[str, Any]:
    """Paths as list_dir shows them (``\\udcff`` for a byte that is not UTF-8, ``\\\\`` for a
    backslash) back to the names themselves, before any check sees them: every name a listing
    shows is reachable. A copy; the call's input as sent is what events and audit show."""
    changed = {
        key: unescape(value)
        for key, _ in definition.requires_fs
        if isinstance(value := input_.get(key), str) and "\\" in value
    }
    return {**input_, **changed} if changed else input_
