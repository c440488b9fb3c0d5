"""``shell {command, timeout_seconds?, cwd?, env?, background?, reset?}``: run ``sh -c`` in the
workspace, streaming its output; or start it in the background as a process of the session.

A session's shell remembers (``tools.shell.persist``, on by default): each command starts in the
directory and with the exported variables the previous one ended with (``ToolContext.processes``,
``core/sessions/processes.py``); ``cwd`` and ``env`` of the input win for that command, ``reset``
forgets. What a foreground command leaves running while holding its output (``cmd &``) becomes a
process of the session (``ExecRequest.leave_as``), and its result says how to read it."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dispatcher.core.errors import (
    FailureReason,
    ToolCancelled,
    ToolExecutionError,
    ToolTimeout,
    WorkspaceEscapeError,
)
from dispatcher.core.sandbox_api import ExecRequest, ExecResult, FileOpError, SandboxError
from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput
from dispatcher.egress.policy import EgressPolicy, Unknown
from dispatcher.tools.background import announce_left, cwd_gone, start_background
from dispatcher.tools.processes import PKILL_WARNING, process_id_for
from dispatcher.tools.text import CommandOutput, DeltaEmitter

DEFAULT_TIMEOUT = 600.0
"""Without the dispatcher (``ToolContext.timeout_seconds`` unset); through it, the call's limit
applies: ``timeouts.shell`` or ``dispatcher.execute_timeout`` (600 s)."""
MAX_TIMEOUT = 600.0
# Head + tail kept for the result; together under the dispatcher's 48,000-character result budget,
# so the result is not truncated a second time.
HEAD_BYTES = 20 * 1024
TAIL_BYTES = 20 * 1024
# The dispatcher's own limit must leave room for SIGTERM grace + SIGKILL wait after our timeout,
# or it would abandon the call before the partial output comes back.
KILL_SEQUENCE_SLACK = 15.0
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_ENV_VARS = 64
MAX_ENV_BYTES = 64 * 1024  # names + values together, UTF-8
PERSISTS = (
    "Each command starts in the directory and with the exported variables the previous shell "
    "command of the session ended with (cd and export persist; functions, aliases, unexported "
    "variables and jobs do not); reset: true starts from the workspace root and the image's "
    "environment again."
)
FORGETS = (
    "Each command starts at the workspace root with the image's environment: cd and export do "
    "not carry over to the next command (chain them with &&)."
)


def check_env(input_: Mapping[str, Any]) -> list[str]:
    """What is wrong with ``env`` beyond the schema: names, value types, NUL, total size."""
    env = input_.get("env")
    if not isinstance(env, Mapping):
        return []
    errors = []
    size = 0
    for name, value in env.items():
        shown = name if len(name) <= 64 else name[:64] + "..."
        if not ENV_NAME.fullmatch(name):
            errors.append(f"$.env: {shown!r} is not a valid variable name ({ENV_NAME.pattern})")
        if not isinstance(value, str):
            errors.append(f"$.env.{shown}: the value must be a string")
            continue
        if "\x00" in value:
            errors.append(f"$.env.{shown}: the value contains a NUL character")
        size += len(name.encode("utf-8", "surrogatepass")) + len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_ENV_BYTES:
        errors.append(f"$.env: {size:,} bytes of names and values, more than {MAX_ENV_BYTES:,}")
    return errors


MAX_HOSTS_SHOWN = 32


def network_sentence(allow: Sequence[str], policy: EgressPolicy) -> str:
    """What a session's sandbox can reach, for the model: nothing, or the allowed hosts."""
    ports = ", ".join(str(p) for p in policy.ports)
    prompt = policy.unknown is Unknown.PROMPT
    if not allow and not prompt:
        return (
            "Network: none. The sandbox reaches no host: pip, npm, git and curl fail at once with "
            "'403 egress refused' saying so; use what is installed or in the workspace."
        )
    hosts = ", ".join(allow[:MAX_HOSTS_SHOWN]) + (" and more" if len(allow) > MAX_HOSTS_SHOWN else "")
    listed = (
        f"to these hosts on ports {ports}: {hosts} ('*.' = any subdomain)" if allow else "to no listed host"
    )
    others = (
        "other hosts are asked about: a human allows or refuses each"
        if prompt
        else "other hosts are refused at once"
    )
    return (
        "Network: only through the sandbox's HTTP(S) proxy (already set in the environment), "
        f"{listed}; {others}. A refusal is a '403 egress refused' that says why."
    )


def describe_network(
    definition: ToolDefinition, allow: Sequence[str], policy: EgressPolicy
) -> ToolDefinition:
    """``definition`` as a session sees it: shell's description says what its network reaches."""
    if definition.name != ShellTool.definition.name:  # the name is the registry's key
        return definition
    return dataclasses.replace(
        definition, description=f"{definition.description} {network_sentence(allow, policy)}"
    )


class ShellTool:
    """Runs one shell command; a fresh instance per call. ``persist``: the session's shell
    remembers its directory and exported variables between calls (``tools.shell.persist``)."""

    definition = ToolDefinition(
        name="shell",
        description=(
            "Run a shell command (sh -c) in the workspace directory and return its combined "
            "stdout and stderr (metadata: stdout_bytes, stderr_bytes, the head and tail of stderr). A non-zero exit status is reported as an error with the output. "
            "Default timeout: the server's limit for shell (600 s unless configured); "
            "timeout_seconds can only shorten it. Long output keeps its "
            "beginning and end. The command sees the sandbox image's environment (e.g. PATH, HOME, "
            "LANG, PYTHONUNBUFFERED); cwd runs it in a subdirectory of the workspace instead of "
            "its root (it must exist and stay inside the workspace); env adds or overrides "
            "variables for this command only. "
            f"{PERSISTS} "
            "For a dev server, a watcher or anything long, use background: true: the result comes "
            "at once with the process's id (metadata.process_id); read its output with "
            "process_output, write to its stdin with process_input, stop it with process_stop, "
            "list them with process_list. A foreground command that leaves processes running "
            "while they hold its output (`cmd &`) no longer loses them: they become processes of "
            "the session and the result names them. "
            f"{PKILL_WARNING} "
            "Background processes keep running after the command returns, until the session ends "
            "or its sandbox is recreated; a timeout or "
            "cancel kills only the command's own process group. The sandbox has a process limit "
            "(sandbox.pids_limit, 256 processes and threads by default) shared by everything in it: "
            "when leftover processes fill it, they are all killed (background ones included) and "
            "the command runs, and the result says so; if that does not free it, the result is an "
            "error saying the process limit is exhausted. A result that starts with [sandbox: ...] "
            "says the sandbox was recreated: its /tmp files and processes are gone, the workspace "
            "is intact. The command sees the disk as it is: in a review or audit session, writes "
            "staged by write_file or patch_file are not there until a human applies them."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "command": {"type": "string", "minLength": 1, "description": "The command line to run."},
                "timeout_seconds": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": MAX_TIMEOUT,
                    "description": "Kill the command after this many seconds (default: the server's limit).",
                },
                "cwd": {
                    "type": "string",
                    "minLength": 1,
                    "description": (
                        "Working directory, relative to the workspace root (default: where the "
                        "previous command ended, or the root)."
                    ),
                },
                "env": {
                    "type": "object",
                    "maxProperties": MAX_ENV_VARS,
                    "description": (
                        "Extra environment variables for this command: a map of name to string value. "
                        f"Names match {ENV_NAME.pattern}; at most {MAX_ENV_VARS} variables and "
                        f"{MAX_ENV_BYTES // 1024} KiB in all."
                    ),
                },
                "background": {
                    "type": "boolean",
                    "description": (
                        "Start the command as a background process of the session and answer at "
                        "once with its id; its output is kept for process_output (timeout_seconds "
                        "does not apply)."
                    ),
                },
                "reset": {
                    "type": "boolean",
                    "description": (
                        "Forget the directory and variables earlier commands left: start from the "
                        "workspace root and the image's environment."
                    ),
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.EXECUTE,
        requires_fs=(("cwd", "cwd"),),
        kill_slack_seconds=KILL_SEQUENCE_SLACK,
        check_input=check_env,
    )

    grace_seconds = 3.0
    """Between SIGTERM and SIGKILL on timeout or cancel (design §5)."""

    def __init__(self, persist: bool = True) -> None:
        self.persist = persist
        if not persist:  # the description says what the model can count on
            self.definition = dataclasses.replace(
                ShellTool.definition, description=ShellTool.definition.description.replace(PERSISTS, FORGETS)
            )
        self._cancel = asyncio.Event()
        self._running = False

    async def cancel(self) -> bool:
        """Ask the running command to stop; the sandbox does SIGTERM, grace, SIGKILL."""
        if not self._running:
            return False
        self._cancel.set()
        return True

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Run the command; non-zero exit, timeout and cancel raise with the output attached."""
        command: str = input["command"]
        limit = context.timeout_seconds or DEFAULT_TIMEOUT
        timeout = min(float(input.get("timeout_seconds", limit)), limit)
        if context.cancel_event.is_set() or self._cancel.is_set():
            raise ToolCancelled("cancelled before the command started")
        memory = context.processes
        if memory is not None and input.get("reset"):
            memory.shell_reset()
        remembered: str | None = None
        env: dict[str, str] = {}
        if memory is not None and self.persist:
            remembered, kept = memory.shell_start()
            env.update(kept)
        env.update(input.get("env", {}))
        cwd: str = input.get("cwd") or remembered or "."
        if input.get("background"):
            return await start_background(command, cwd, env, context, remembered="cwd" not in input)
        notes: list[str] = []
        try:
            return await self._run(command, cwd, env, timeout, context, notes)
        except (FileOpError, WorkspaceEscapeError) as exc:
            if "cwd" in input or remembered is None or not cwd_gone(exc):
                raise
        # The directory the previous command ended in is gone (or a link now leads out of the
        # workspace): forget it, and run at the root.
        assert memory is not None
        memory.shell_reset(cwd_only=True)
        notes.append(
            f"the directory {remembered} the previous command ended in is gone: ran at the workspace root"
        )
        return await self._run(command, ".", env, timeout, context, notes)

    async def _run(
        self,
        command: str,
        cwd: str,
        env: dict[str, str],
        timeout: float,
        context: ToolContext,
        notes: list[str],
    ) -> ToolOutput:
        buffer = CommandOutput(HEAD_BYTES, TAIL_BYTES)
        deltas = DeltaEmitter(context.emit_output)
        memory = context.processes

        def on_output(stream: str, data: bytes) -> asyncio.Future[None] | None:
            buffer.feed(stream, data)
            return deltas.feed(stream, data)  # a future: the caller is behind; the sandbox waits

        relay = asyncio.ensure_future(self._relay(context.cancel_event))
        started = time.monotonic()
        self._running = True
        try:
            result = await context.sandbox.exec(
                ExecRequest(
                    command=command,
                    timeout=timeout,
                    cwd=cwd,
                    approved_cwd=context.resolved.get("cwd"),  # as confirmed: used exactly
                    env=env,
                    grace_seconds=self.grace_seconds,
                    tool_use_id=context.tool_use_id,
                    leave_as=process_id_for(context.tool_use_id, salt="left:") if memory else None,
                    capture_state=memory is not None and self.persist,
                ),
                on_output,
                self._cancel,
            )
        except SandboxError as exc:
            raise self._sandbox_failure(exc, command, buffer, timeout, time.monotonic() - started) from exc
        finally:
            self._running = False
            relay.cancel()
            await asyncio.gather(relay, return_exceptions=True)
            deltas.close()
        if memory is not None and self.persist:
            note = memory.shell_ended(result.shell_state)
            if note is not None:
                notes.append(note)
        lines = [f"[{note}]" for note in notes]
        if result.left:
            lines.append(await announce_left(result.left, context))
        return _outcome(command, result, buffer, timeout, lines)

    async def _relay(self, outer: asyncio.Event) -> None:
        await outer.wait()
        self._cancel.set()

    def _sandbox_failure(
        self, exc: SandboxError, command: str, buffer: CommandOutput, timeout: float, elapsed: float
    ) -> Exception:
        note = f"the sandbox failed and was reset: {exc}"
        output = _output(command, buffer, {"exit_code": None, "sandbox_error": str(exc)}, note)
        if self._cancel.is_set():
            return ToolCancelled("command cancelled; " + note, output=output)
        if elapsed >= timeout:
            return ToolTimeout(f"command timed out after {timeout:g} s; " + note, output=output)
        return ToolExecutionError(note, underlying=exc, output=output, reason=FailureReason.SANDBOX_FAILED)


def _output(
    command: str,
    buffer: CommandOutput,
    metadata: dict[str, Any],
    note: str | None,
    lines: list[str] | None = None,
) -> ToolOutput:
    text = buffer.combined.text()
    if lines:
        separator = "" if not text or text.endswith("\n") else "\n"
        text = f"{text}{separator}" + "\n".join(lines)
    if note is not None:
        separator = "" if not text or text.endswith("\n") else "\n"
        text = f"{text}{separator}[{note}]"
    metadata["output_bytes"] = buffer.combined.total
    if buffer.combined.omitted:
        metadata["output_omitted_bytes"] = buffer.combined.omitted
    metadata.update(buffer.metadata())
    return ToolOutput(
        content=[TextBlock(text or "(no output)")],
        success=note is None,
        metadata=metadata,
        command_executed=command,
    )


def _outcome(
    command: str, result: ExecResult, buffer: CommandOutput, timeout: float, lines: list[str]
) -> ToolOutput:
    metadata: dict[str, Any] = {"exit_code": result.exit_code, "duration_ms": round(result.duration_ms, 1)}
    if result.left:
        metadata["left_processes"] = list(result.left)
    if result.signal is not None:
        metadata["signal"] = result.signal
    if result.timed_out:
        metadata["timed_out"] = True
    if result.killed:
        metadata["killed"] = True
    how = "killed with SIGKILL" if result.killed else "terminated"
    if result.cancelled:
        note = f"cancelled; the command was {how}"
        raise ToolCancelled("command cancelled", output=_output(command, buffer, metadata, note, lines))
    if result.timed_out:
        note = f"timed out after {timeout:g} s; the command was {how}"
        raise ToolTimeout(
            f"command timed out after {timeout:g} s", output=_output(command, buffer, metadata, note, lines)
        )
    if result.exit_code == 0:
        return _output(command, buffer, metadata, None, lines)
    status = (
        f"exit code {result.exit_code}"
        if result.exit_code is not None
        else f"killed by signal {result.signal}"
    )
    raise ToolExecutionError(
        f"command failed ({status})", output=_output(command, buffer, metadata, status, lines)
    )
