"""A session's code contexts: each a worker process in the session's process table
(``ProcessControl``), named ``code:<language>:<context>:<generation>``.

The table is the one owner of what lives: a context is its running worker, found by listing the
table, so nothing here is remembered between calls and a server restart loses nothing. A restart
ends the worker and starts the next generation (the table answers a finished id with its old
record, so an id is never started twice). The ``:`` in the id keeps the workers out of reach of
the model's process tools (their ids have none) and out of ``process_list``: a context is reached
through ``run_code`` alone. Clients list and remove them (``ListCodeContexts``,
``RemoveCodeContext``).

Bounds: ``max_contexts`` running per session (a start past it is refused, saying which to
remove); a worker ends itself after ``idle_seconds`` without a cell (the reaping); all end with
the session's sandbox.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

from dispatcher.core.process_api import (
    CODE_LANGUAGES,
    CodeContext,
    CodeLanguage,
    ProcessControl,
    ProcessError,
    ProcessInfo,
    ProcessStart,
)
from dispatcher.tools.processes import HIDDEN_PREFIX

Language = CodeLanguage
LANGUAGES = CODE_LANGUAGES
PREFIX = HIDDEN_PREFIX
CONTEXT_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
DEFAULT_CONTEXT = "default"
DEFAULT_MAX_CONTEXTS = 4
DEFAULT_IDLE_SECONDS = 1800.0
RING_BYTES = 4 << 20
"""A worker's output ring: room for a cell's figures in one frame while the reader catches up."""
MARKER_ENV = "DISPATCHER_CODE_MARKER"
_ID = re.compile(r"code:(python|javascript):([A-Za-z0-9_-]{1,32}):([0-9]{1,9})")
_MARKER = re.compile(MARKER_ENV + r"=([0-9a-f]{32})")

_HERE = Path(__file__).resolve().parent
_SOURCES = {"python": "python_worker.py", "javascript": "node_worker.js"}
WORKER_NAME = "<run_code worker>"
PROGRAMS = {"python": "python3", "javascript": "node"}
"""What an image needs on its PATH for each language."""
_BOOTSTRAPS = {
    # Each reads its program's text as the first line of stdin (JSON) and runs it: the command
    # stays short, and the worker goes on reading the same stdin.
    "python": (
        "python3 -I -u -c 'import sys,json;"
        f'exec(compile(json.loads(sys.stdin.buffer.readline()),"{WORKER_NAME}","exec"))\''
    ),
    "javascript": (
        'node -e \'const fs=require("fs"),b=Buffer.alloc(1),a=[];'
        "while(fs.readSync(0,b,0,1)===1&&b[0]!==10)a.push(b[0]);"
        f'require("vm").runInThisContext(JSON.parse(Buffer.from(a).toString()),{{filename:"{WORKER_NAME}"}})(require)\''
    ),
}
"""What an image needs on its PATH for each language."""


def marker_of(ctx: CodeContext) -> str:
    """The worker's frame marker, read back from its command."""
    found = _MARKER.search(ctx.info.command)
    return f"\x1edispatcher-{found.group(1)}:" if found else "\x1edispatcher-:"


def check_name(name: str) -> str:
    """``name`` if it can name a context.

    Raises:
        ValueError: saying what a name may be.
    """
    if not CONTEXT_NAME.fullmatch(name):
        raise ValueError(f"context: {name!r} is not a context name (1 to 32 of A-Z a-z 0-9 _ -)")
    return name


def process_id(language: Language, name: str, generation: int) -> str:
    return f"{PREFIX}{language}:{name}:{generation}"


def parse(process_id_: str) -> tuple[Language, str, int] | None:
    """(language, name, generation) of a worker's id; None: not a worker."""
    found = _ID.fullmatch(process_id_)
    if found is None:
        return None
    language: Language = "python" if found.group(1) == "python" else "javascript"
    return language, found.group(2), int(found.group(3))


def is_worker(process_id_: str) -> bool:
    return process_id_.startswith(PREFIX)


def command(language: Language, idle_seconds: float) -> str:
    """The worker's command line, with a fresh marker; its program follows on stdin."""
    marker = secrets.token_hex(16)
    return (
        f"{MARKER_ENV}={marker} DISPATCHER_CODE_IDLE={idle_seconds:g} MPLBACKEND=Agg "
        f"exec {_BOOTSTRAPS[language]}"
    )


def program(language: Language) -> bytes:
    """The worker's program as its first line of stdin."""
    source = (_HERE / _SOURCES[language]).read_text(encoding="utf-8")
    return (json.dumps(source) + "\n").encode()


def contexts_of(infos: tuple[ProcessInfo, ...]) -> tuple[list[CodeContext], dict[tuple[str, str], int]]:
    """The running contexts among a table's processes, and per (language, name) the highest
    generation the table still knows (running or not)."""
    live: list[CodeContext] = []
    generations: dict[tuple[str, str], int] = {}
    for info in infos:
        parsed = parse(info.process_id)
        if parsed is None:
            continue
        language, name, generation = parsed
        key = (language, name)
        generations[key] = max(generations.get(key, 0), generation)
        if info.running:
            live.append(CodeContext(language, name, generation, info))
    return live, generations


async def list_contexts(control: ProcessControl) -> list[CodeContext]:
    """The session's running contexts, oldest first."""
    live, _ = contexts_of(await control.list())
    return live


async def find(control: ProcessControl, language: Language, name: str) -> CodeContext | None:
    for ctx in await list_contexts(control):
        if (ctx.language, ctx.name) == (language, name):
            return ctx
    return None


async def start(
    control: ProcessControl,
    language: Language,
    name: str,
    *,
    max_contexts: int = DEFAULT_MAX_CONTEXTS,
    idle_seconds: float = DEFAULT_IDLE_SECONDS,
    tool_use_id: str | None = None,
) -> CodeContext:
    """A new worker for (language, name), after any earlier generation.

    Raises:
        ProcessError: ``too_many``: ``max_contexts`` run already (the message names them);
            or the table refused the start.
    """
    live, generations = contexts_of(await control.list())
    others = [c for c in live if (c.language, c.name) != (language, name)]
    if len(others) >= max_contexts:
        names = ", ".join(f"{c.language}:{c.name}" for c in others)
        raise ProcessError(
            "too_many",
            f"{len(others)} code contexts are live ({names}), the most a session may have; "
            "reuse one (context), or end one with restart or RemoveCodeContext",
        )
    generation = generations.get((language, name), 0) + 1
    info = await control.start(
        ProcessStart(
            process_id=process_id(language, name, generation),
            command=command(language, idle_seconds),
            tool_use_id=tool_use_id,
            ring_bytes=RING_BYTES,
        )
    )
    try:
        await control.write_input(info.process_id, program(language))
    except ProcessError as exc:
        if exc.code != "not_running":
            raise
        # The interpreter is not there or failed at once: its first cell tells how it ended.
    return CodeContext(language, name, generation, info)


async def remove(control: ProcessControl, ctx: CodeContext) -> None:
    """End the worker and its whole process group, answering once they are gone; a worker that
    ended already is no error."""
    try:
        await control.signal(ctx.process_id, "KILL", grace_seconds=0.0)
    except ProcessError as exc:
        if exc.code not in ("no_process", "not_running"):
            raise
