"""The Python interpreter of ``run_code``, run in the sandbox as a process of the session
(``python3 -I -u``, this text the first line of its stdin): never imported by the server.

It reads one request per line on stdin (``{"id", "code"}``, JSON) and runs each cell in one
namespace that lives as long as the process: variables, imports and the working directory persist.
What the cell prints goes to the process's stdout and stderr as it is; the worker's own messages
are frames on stdout, ``MARKER + JSON + "\\n"``, where MARKER comes from the environment
(``DISPATCHER_CODE_MARKER``, removed before any cell runs) and is random per worker, so a cell's
output cannot be taken for a frame by accident. Frames: ``ready`` once, then per cell ``start`` on both
streams (what follows is the cell's output), ``end`` on stderr and ``done`` on stdout (the last
expression's value by MIME type or the error, and the figures left open, as PNG): the streams are
read apart, so each says where the cell's part of it ends.

SIGINT interrupts a cell (KeyboardInterrupt, the namespace stays); no request for
``DISPATCHER_CODE_IDLE`` seconds ends the worker (the session's idle contexts are reaped so).
Standard library only, Python 3.8 or newer.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import io
import json
import linecache
import os
import signal
import sys
import traceback
import types
import warnings
from typing import Any

MARKER = "\x1edispatcher-" + os.environ.pop("DISPATCHER_CODE_MARKER", "") + ":"
IDLE = float(os.environ.pop("DISPATCHER_CODE_IDLE", "0") or 0)
MAX_TEXT = 64 * 1024
MAX_FIGURES = 8
WORKER_FILE = "<run_code worker>"  # the name contexts.py compiles this text under


def frame(message: dict[str, Any], fd: int = 1) -> None:
    """One frame on stdout (``fd`` 2: stderr), after whatever the cell printed before it."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    data = (MARKER + json.dumps(message, separators=(",", ":")) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def cut(text: str) -> str:
    if len(text) <= MAX_TEXT:
        return text
    return text[:MAX_TEXT] + f"\n[... {len(text) - MAX_TEXT:,} more characters]"


def rich(value: Any) -> dict[str, str]:
    """The value's representations by MIME type, as IPython's display would find them."""
    data: dict[str, str] = {}
    for mime, method in (
        ("text/html", "_repr_html_"),
        ("text/markdown", "_repr_markdown_"),
        ("application/json", "_repr_json_"),
        ("image/png", "_repr_png_"),
    ):
        if isinstance(value, type):
            continue
        function = getattr(value, method, None)
        if not callable(function):
            continue
        try:
            shown = function()
        except Exception:
            continue
        if shown is None:
            continue
        if mime == "image/png":
            if isinstance(shown, bytes):
                data[mime] = base64.b64encode(shown).decode()
        elif mime == "application/json":
            data[mime] = cut(json.dumps(shown, default=str))
        elif isinstance(shown, str):
            data[mime] = cut(shown)
    try:
        data["text/plain"] = cut(repr(value))
    except Exception as exc:
        data["text/plain"] = f"<repr failed: {type(exc).__name__}: {exc}>"
    return data


def figures() -> list[str]:
    """The figures matplotlib holds open, as base64 PNG, then closed: only if the cell's code
    imported pyplot (importing it here would cost every cell a second)."""
    pyplot: Any = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    shown = []
    try:
        for number in pyplot.get_fignums()[:MAX_FIGURES]:
            buffer = io.BytesIO()
            pyplot.figure(number).savefig(buffer, format="png")
            shown.append(base64.b64encode(buffer.getvalue()).decode())
        pyplot.close("all")
    except Exception as exc:
        sys.stderr.write(f"[run_code: a figure could not be drawn: {type(exc).__name__}: {exc}]\n")
    return shown


def user_traceback(error: BaseException) -> list[str]:
    """The traceback without the worker's own frames: it begins in the cell."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == WORKER_FILE:
        tb = tb.tb_next
    return traceback.format_exception(type(error), error, tb)


def run(namespace: dict[str, Any], code: str, count: int) -> dict[str, Any]:
    """Run one cell; its answer (the ``done`` frame without id)."""
    filename = f"<cell {count}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    answer: dict[str, Any] = {"count": count, "result": None, "error": None}
    try:
        tree = ast.parse(code, filename, "exec")
        last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        if last is not None:
            tree.body.pop()
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
            if value is not None:
                namespace["_"] = value
                answer["result"] = rich(value)
    except KeyboardInterrupt as error:
        answer["error"] = {"name": "KeyboardInterrupt", "value": "", "traceback": user_traceback(error)}
        answer["interrupted"] = True
    except BaseException as error:  # SystemExit too: the context stays
        answer["error"] = {
            "name": type(error).__name__,
            "value": cut(str(error)),
            "traceback": user_traceback(error),
        }
    return answer


def idle_exit(signum: int, frame_: types.FrameType | None) -> None:
    os._exit(0)


def main() -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    warnings.filterwarnings("ignore", message=".*non-interactive.*")
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    count = 0
    frame({"type": "ready", "language": "python", "version": sys.version.split()[0], "pid": os.getpid()})
    stdin = sys.stdin.buffer
    sys.stdin = io.StringIO("")  # input() in a cell reads end of file, never the next request
    while True:
        try:
            if IDLE > 0:
                signal.signal(signal.SIGALRM, idle_exit)
                signal.setitimer(signal.ITIMER_REAL, IDLE)
            line = stdin.readline()
            if IDLE > 0:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except KeyboardInterrupt:
            continue  # an interrupt between cells: nothing to stop
        if not line:
            return
        try:
            request = json.loads(line)
            code, cell_id = str(request["code"]), str(request["id"])
        except (ValueError, KeyError, TypeError):
            continue
        count += 1
        answer: dict[str, Any] = {}
        try:
            frame({"type": "start", "id": cell_id, "count": count})
            frame({"type": "start", "id": cell_id}, 2)
            answer = run(namespace, code, count)
            answer["figures"] = figures()
        except KeyboardInterrupt:
            answer = {"count": count, "result": None, "interrupted": True}
            answer["error"] = {"name": "KeyboardInterrupt", "value": "", "traceback": []}
        frame({"type": "end", "id": cell_id}, 2)
        frame({"type": "done", "id": cell_id, **answer})


main()
