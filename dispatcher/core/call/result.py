"""How a call's end becomes its result (steps 8-10 of spec 000 §4): completed or failed, the
event and the final audit record, and the block the model gets, with the sandbox's notices first
and within the result budgets."""

from __future__ import annotations

from dispatcher.core.audit import COMPLETED, DENIED
from dispatcher.core.call import record as call_record
from dispatcher.core.call.run_state import RunState
from dispatcher.core.errors import (
    FailureReason,
    ToolError,
    ToolErrorClass,
    ToolExecutionError,
    ToolPermissionDenied,
    ToolValidationError,
)
from dispatcher.core.events.payloads import ToolCompleted, ToolFailed, ToolInputInvalid
from dispatcher.core.text.result_size import fit_chars, fit_result, image_overflow
from dispatcher.core.text.truncate import truncate_head_tail
from dispatcher.core.types import TextBlock, ToolOutput, ToolResultBlock

__all__ = ["complete", "fail"]


def complete(run: RunState, output: ToolOutput) -> ToolResultBlock:
    """The result of a call whose tool returned: completed, or failed if the tool said so."""
    if not output.success:
        return fail(run, ToolExecutionError(_first_text(output) or "Tool reported failure", output=output))
    overflow = image_overflow(output.content, run.config.result_budget_bytes)
    if overflow is not None:  # an image the transport could not carry: this call's error only
        return fail(run, ToolExecutionError(overflow))
    duration = run.run_ms()
    run.emit(ToolCompleted(tool_name=run.tool_name, duration_ms=round(duration, 3)))
    call_record.record(run, COMPLETED, "ok")
    return _block(run, output, is_error=False, error_class=None)


def fail(run: RunState, exc: ToolError, *, denied: bool = False) -> ToolResultBlock:
    """The error result of a call: its event, its final audit record (``denied``: refused before
    it ran; a permission refusal while it ran, the sandbox's, is one too), the message first in
    what the model reads."""
    error_class = exc.error_class
    denied = denied or isinstance(exc, ToolPermissionDenied)
    if denied:
        call_record.refused(run, exc.reason)
    message = exc.message
    if isinstance(exc, ToolValidationError):
        run.emit(ToolInputInvalid(tool_name=run.tool_name, errors=tuple(exc.validation_errors)))
    else:
        partial = _first_text(exc.output) if exc.output is not None else ""
        run.emit(
            ToolFailed(
                tool_name=run.tool_name,
                error_class=error_class.value,
                message=message,
                duration_ms=round(run.run_ms(), 3),
                partial_output=truncate_head_tail(partial, 4_000) if partial else "",
                reason=exc.reason,
            )
        )
    call_record.record(run, DENIED if denied else COMPLETED, error_class.value, exc.reason)
    output = exc.output
    if output is None:
        output = ToolOutput([TextBlock(message)], success=False)
    elif not _first_text(output).startswith(message) and error_class is not ToolErrorClass.EXECUTION_ERROR:
        output.content = [TextBlock(message), *output.content]
    return _block(run, output, True, error_class, exc.reason)


def _block(
    run: RunState,
    output: ToolOutput,
    is_error: bool,
    error_class: ToolErrorClass | None,
    reason: FailureReason | None = None,
) -> ToolResultBlock:
    content = fit_chars(output.content, run.config.result_budget_chars)  # per result, not per block
    metadata = dict(output.metadata)
    if run.notices:  # first, where neither truncation nor a hasty reader misses them
        content = (*(TextBlock(f"[sandbox: {n}]") for n in run.notices), *content)
        metadata["sandbox_notices"] = list(run.notices)
    block = ToolResultBlock(
        tool_use_id=run.tool_use.id,
        content=content,
        is_error=is_error,
        error_class=error_class,
        metadata=metadata,
        files_modified=tuple(output.files_modified or ()),
        command_executed=output.command_executed,
        reason=reason or "",
    )
    return fit_result(block, run.config.result_budget_bytes)  # bytes, images, valid UTF-8


def _first_text(output: ToolOutput) -> str:
    return next((b.text for b in output.content if isinstance(b, TextBlock)), "")
