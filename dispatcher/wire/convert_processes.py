"""Proto <-> domain for a session's background processes (``core/process_api.py``): the process
record, the signals, and the items of a WatchProcess stream. Both directions: the server uses one,
the Python client the other; the client's results are the core's own types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from dispatcher.core.process_api import (
    CODE_LANGUAGES,
    PROCESS_SIGNALS,
    CodeContext,
    CodeLanguage,
    OutputChunk,
    ProcessInfo,
    ProcessState,
    Stream,
)
from dispatcher.v1 import dispatcher_pb2 as pb

__all__ = [
    "ProcessTruncated",
    "WatchItem",
    "code_context_from_pb",
    "code_context_to_pb",
    "process_from_pb",
    "process_to_pb",
    "signal_from_pb",
    "signal_to_pb",
    "watch_item_from_pb",
    "watch_items_to_pb",
]

_STATE_TO_PB: dict[str, pb.ProcessState.ValueType] = {
    "running": pb.PROCESS_STATE_RUNNING,
    "exited": pb.PROCESS_STATE_EXITED,
    "killed": pb.PROCESS_STATE_KILLED,
}
_STATE_FROM_PB = {v: k for k, v in _STATE_TO_PB.items()}
_STREAM_TO_PB: dict[str, pb.OutputStream.ValueType] = {
    "stdout": pb.OUTPUT_STREAM_STDOUT,
    "stderr": pb.OUTPUT_STREAM_STDERR,
}
_STREAM_FROM_PB = {v: k for k, v in _STREAM_TO_PB.items()}
_SIGNAL_TO_PB: dict[str, pb.ProcessSignal.ValueType] = {
    name: pb.ProcessSignal.Value(f"PROCESS_SIGNAL_{name}") for name in PROCESS_SIGNALS
}
_SIGNAL_FROM_PB = {v: k for k, v in _SIGNAL_TO_PB.items()}


@dataclass(frozen=True, slots=True)
class ProcessTruncated:
    """A watch's marker: ``lost`` bytes the ring dropped before they could be sent; the output
    resumes at ``cursor``."""

    lost: int
    cursor: int


WatchItem = OutputChunk | ProcessTruncated | ProcessInfo
"""What a client's watch yields: output, a loss, and last the record of the ended process."""


def signal_from_pb(value: int) -> str | None:
    """A request's signal by name (unset: ``TERM``); None for a value this server does not know."""
    if value == pb.PROCESS_SIGNAL_UNSPECIFIED:
        return "TERM"
    return _SIGNAL_FROM_PB.get(cast(pb.ProcessSignal.ValueType, value))


def signal_to_pb(name: str) -> pb.ProcessSignal.ValueType:
    """``TERM`` (or ``SIGTERM``, any case) as the enum value.

    Raises:
        ValueError: not one of ``PROCESS_SIGNALS``, naming them.
    """
    key = name.upper().removeprefix("SIG")
    if key not in _SIGNAL_TO_PB:
        raise ValueError(f"signal {name!r}: expected one of {', '.join(PROCESS_SIGNALS)}")
    return _SIGNAL_TO_PB[key]


def process_to_pb(info: ProcessInfo) -> pb.Process:
    msg = pb.Process(
        process_id=info.process_id,
        command=info.command,
        cwd=info.cwd,
        pid=info.pid,
        state=_STATE_TO_PB.get(info.state, pb.PROCESS_STATE_UNSPECIFIED),
        tool_use_id=info.tool_use_id or "",
        origin=info.origin,
        output_end=info.end,
        output_first=info.first,
        ring_bytes=info.ring_bytes,
        stdin_open=info.stdin_open,
    )
    if info.exit_code is not None:
        msg.exit_code = info.exit_code
    if info.signal is not None:
        msg.signal = info.signal
    msg.start_time.FromNanoseconds(round(info.started * 1e9))
    if info.ended is not None:
        msg.end_time.FromNanoseconds(round(info.ended * 1e9))
    return msg


def process_from_pb(msg: pb.Process) -> ProcessInfo:
    # A newer server's unknown state reads as running: the client keeps asking rather than stop.
    state: ProcessState = cast(ProcessState, _STATE_FROM_PB.get(msg.state, "running"))
    return ProcessInfo(
        process_id=msg.process_id,
        command=msg.command,
        cwd=msg.cwd,
        pid=msg.pid,
        state=state,
        exit_code=msg.exit_code if msg.HasField("exit_code") else None,
        signal=msg.signal if msg.HasField("signal") else None,
        started=msg.start_time.ToNanoseconds() / 1e9,
        ended=msg.end_time.ToNanoseconds() / 1e9 if msg.HasField("end_time") else None,
        tool_use_id=msg.tool_use_id or None,
        end=msg.output_end,
        first=msg.output_first,
        ring_bytes=msg.ring_bytes,
        stdin_open=msg.stdin_open,
        origin="left" if msg.origin == "left" else "background",
    )


def watch_items_to_pb(item: OutputChunk | ProcessInfo) -> list[pb.WatchProcessResponse]:
    """One item of ``ProcessControl.watch`` as stream messages: a chunk after a loss is two (the
    ``truncated`` marker first), an empty chunk carrying only a loss is the marker alone."""
    if isinstance(item, ProcessInfo):
        return [pb.WatchProcessResponse(exited=process_to_pb(item))]
    out = []
    if item.lost:
        out.append(
            pb.WatchProcessResponse(truncated=pb.ProcessTruncated(lost_bytes=item.lost, cursor=item.cursor))
        )
    if item.data:
        chunk = pb.ProcessOutputChunk(
            stream=_STREAM_TO_PB.get(item.stream, pb.OUTPUT_STREAM_UNSPECIFIED),
            cursor=item.cursor,
            data=item.data,
        )
        out.append(pb.WatchProcessResponse(output=chunk))
    return out


def watch_item_from_pb(resp: pb.WatchProcessResponse) -> WatchItem | None:
    """A stream message as the client's item; None for a kind this client does not know."""
    kind = resp.WhichOneof("item")
    if kind == "output":
        o = resp.output
        stream: Stream = cast(Stream, _STREAM_FROM_PB.get(o.stream, "stdout"))
        return OutputChunk(stream=stream, cursor=o.cursor, data=bytes(o.data))
    if kind == "truncated":
        return ProcessTruncated(lost=resp.truncated.lost_bytes, cursor=resp.truncated.cursor)
    if kind == "exited":
        return process_from_pb(resp.exited)
    return None


def code_context_to_pb(ctx: CodeContext) -> pb.CodeContext:
    return pb.CodeContext(language=ctx.language, context=ctx.name, process=process_to_pb(ctx.info))


def code_context_from_pb(msg: pb.CodeContext) -> CodeContext:
    """A context as the server sent it (its generation read from the process id: 0 if none)."""
    info = process_from_pb(msg.process)
    language: CodeLanguage = next((lang for lang in CODE_LANGUAGES if lang == msg.language), "python")
    tail = info.process_id.rsplit(":", 1)[-1]
    return CodeContext(language, msg.context, int(tail) if tail.isdigit() else 0, info)
