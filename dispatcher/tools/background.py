"""A shell command as a process of the session: started in the background
(``shell {background: true}``), or left running by a foreground command (``ExecResult.left``).
Either way the session announces it (``process.started``) and follows its end
(``core/sessions/processes.py``)."""

from __future__ import annotations

import dataclasses

from dispatcher.core.errors import WorkspaceEscapeError
from dispatcher.core.process_api import ProcessError, ProcessStart
from dispatcher.core.sandbox_api import FileOpError, SandboxError
from dispatcher.core.types import TextBlock, ToolContext, ToolOutput
from dispatcher.tools.processes import control_of, explained, process_id_for

ID_ATTEMPTS = 3
"""Process ids tried for one background start when another call's process holds the shorter one."""
GONE_CWD = ("ENOENT", "ENOTDIR")


def cwd_gone(exc: Exception) -> bool:
    """The command's directory is not there (any more), or a link now leads out of the workspace."""
    return isinstance(exc, WorkspaceEscapeError) or (isinstance(exc, FileOpError) and exc.code in GONE_CWD)


async def start_background(
    command: str, cwd: str, env: dict[str, str], context: ToolContext, *, remembered: bool
) -> ToolOutput:
    """``shell {background: true}``: start the command as a process of the session; its id
    comes from the call's, so a retried call starts it once. ``remembered``: ``cwd`` is where
    the previous command ended (not the input's): if it is gone, start at the root instead."""
    control = control_of(context)
    note = ""
    for attempt in range(ID_ATTEMPTS):
        process_id = process_id_for(context.tool_use_id, attempt)
        start = ProcessStart(
            process_id=process_id,
            command=command,
            cwd=cwd,
            approved_cwd=context.resolved.get("cwd"),
            env=env,
            tool_use_id=context.tool_use_id,
        )
        try:
            info = await control.start(start)
        except ProcessError as exc:
            if exc.code == "conflict":
                continue  # another call's process holds this id
            raise explained(exc) from None
        except (FileOpError, WorkspaceEscapeError) as exc:
            if not remembered or cwd == "." or not cwd_gone(exc) or context.processes is None:
                raise
            context.processes.shell_reset(cwd_only=True)
            note = f"\n[the directory {cwd} the previous command ended in is gone: started at the workspace root]"
            cwd = "."
            info = await control.start(dataclasses.replace(start, cwd="."))
        if info.tool_use_id not in (None, context.tool_use_id):
            continue  # the same command, started by another call under this id
        break
    else:
        raise ProcessError("conflict", f"no free process id for call {context.tool_use_id}")
    if context.processes is not None:
        context.processes.started(info, control)
    text = (
        f"started in the background as {info.process_id} (pid {info.pid}, in {info.cwd}); "
        f'read its output with process_output {{"process_id": "{info.process_id}"}} '
        "(wait_seconds waits for more), write to its stdin with process_input, stop it with "
        "process_stop" + note
    )
    return ToolOutput(
        content=[TextBlock(text)],
        metadata={"process_id": info.process_id, "pid": info.pid, "background": True},
        command_executed=command,
    )


async def announce_left(left: tuple[str, ...], context: ToolContext) -> str:
    """The processes a foreground command left running: announced as the session's, and the
    line that tells the model how to read them."""
    try:
        control = context.sandbox.processes()
        infos = {info.process_id: info for info in await control.list()}
    except (ProcessError, SandboxError):
        infos, control = {}, None
    if context.processes is not None and control is not None:
        for process_id in left:
            if process_id in infos:
                context.processes.started(infos[process_id], control, context.tool_use_id)
    ids = ", ".join(left)
    if len(left) == 1:
        return f"[left 1 process running: {ids}; read it with process_output]"
    return f"[left {len(left)} processes running: {ids}; read them with process_output]"
