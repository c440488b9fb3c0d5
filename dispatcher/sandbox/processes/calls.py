"""The agent's process messages as ``core.process_api``'s types, and its refusals as
``ProcessError``s whose text tells a model what to do next (``AgentChannel``'s process calls)."""

from __future__ import annotations

import re
from typing import Any, Literal, cast

from dispatcher.core.errors import ToolValidationError
from dispatcher.core.process_api import OutputChunk, ProcessError, ProcessInfo, ProcessOutput
from dispatcher.sandbox.agent.protocol import (
    BadMessage,
    Error,
    ProcData,
    ProcInfo,
    ProcOutput,
    ProcStart,
    Request,
)
from dispatcher.sandbox.agent_link import MAX_MESSAGE, encodable, error_for

MAX_WAIT_SECONDS = 600.0
"""The longest a read waits or a stop's grace lasts (the agent's bound)."""
_PROCESS_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
"""The agent's rule for process ids (``process_messages.check_process_id``)."""
PROCESS_CODES = frozenset({"no_process", "conflict", "too_many", "too_large", "not_running", "proc_limit"})


def check_request(message: Request[Any], what: str) -> None:
    """Refuse, before it is sent, a request the agent would refuse as malformed: an id that
    cannot name a process is an unknown process (or, to start one, the caller's error), anything
    else the caller's error to fix."""
    process_id = getattr(message, "process_id", "")
    if not _PROCESS_ID.fullmatch(process_id):
        if isinstance(message, ProcStart):
            raise ToolValidationError(
                f"process id {process_id!r} is malformed: use letters, digits and '_.:-', at most"
                " 64, starting with a letter or a digit"
            )
        raise no_process(process_id)
    try:
        message.check()
    except BadMessage as exc:
        raise ToolValidationError(f"{what}: {exc}") from None


def no_process(process_id: str, detail: str = "") -> ProcessError:
    return ProcessError(
        "no_process",
        f"no process {process_id!r} in this session{detail}; process_list shows its processes"
        " (the running ones and the newest finished ones)",
    )


_COUNT = re.compile(r"^(\d+) ")


def process_error(error: Error, process_id: str, what: str) -> Exception:
    """The ``ProcessError`` an agent's refusal of a process op stands for, in words a model can
    act on; other errors as any op's (``error_for``)."""
    said = encodable(error.message[:MAX_MESSAGE])
    code = error.code
    if code == "no_process":
        return no_process(process_id)
    if code == "conflict":
        return ProcessError(
            "conflict",
            f"process id {process_id!r} is taken by a process running another command; start this"
            " one under another id (or without one, to get a new id)",
        )
    if code == "too_many":
        match = _COUNT.match(said)
        count = f"{match.group(1)} processes are" if match else "the most processes are"
        return ProcessError(
            "too_many",
            f"{count} running in this session, the most it allows; stop one with process_stop"
            " (process_list shows them)",
        )
    if code == "proc_limit":
        return ProcessError(
            "too_many",
            "the sandbox's process limit is full (commands left processes running); stop some"
            " with process_stop or kill them from shell, then try again",
        )
    if code == "too_large":
        todo = (
            "; wait until it read what it has (process_output shows what it does), or send less"
            if what == "input"
            else "; stop a process with process_stop, or start this one with a smaller output ring"
            if what == "start"
            else ""
        )
        return ProcessError("too_large", f"{said}{todo}")
    if code == "not_running":
        return ProcessError(
            "not_running",
            f"process {process_id!r} takes no more input: it ended or its stdin was closed"
            " (process_output shows how it ended)",
        )
    return error_for(error)


def to_info(record: ProcInfo) -> ProcessInfo:
    return ProcessInfo(
        process_id=record.process_id,
        command=record.command,
        cwd=record.cwd,
        pid=record.pid,
        state=_state(record.state),
        exit_code=record.exit_code,
        signal=record.signal,
        started=record.started,
        ended=record.ended,
        tool_use_id=record.tool_use_id,
        end=record.end,
        first=record.first,
        ring_bytes=record.ring_bytes,
        stdin_open=record.stdin_open,
        origin=cast(Literal["background", "left"], record.origin),  # checked by ``ProcInfo.check``
    )


def to_chunk(frame: ProcData) -> OutputChunk:
    return OutputChunk(_stream(frame.stream), frame.cursor, frame.data, frame.lost)


def _state(state: str) -> Literal["running", "exited", "killed"]:
    return cast(Literal["running", "exited", "killed"], state)  # checked by the protocol


def _stream(stream: str) -> Literal["stdout", "stderr"]:
    return "stdout" if stream == "stdout" else "stderr"


def to_output(reply: ProcOutput) -> ProcessOutput:
    chunks = tuple(OutputChunk(_stream(c.stream), c.cursor, c.data) for c in reply.chunks)
    return ProcessOutput(chunks, reply.next, reply.lost, _state(reply.state), reply.exit_code, reply.signal)
