"""``dispatcher ps SESSION``, ``dispatcher logs SESSION PROCESS [-f] [--after N]`` and
``dispatcher kill SESSION PROCESS [--signal S]``: a session's background processes as a person
(or a script, ``--json``) sees and stops them (``ListProcesses``, ``WatchProcess``,
``SignalProcess``).

``logs`` writes the process's stdout to stdout and its stderr to stderr, as the process wrote
them (bytes, unchanged); what the CLI itself says (bytes lost, how it ended, the cursor to go on
from) goes to stderr in ``[...]``, so ``logs S P > out.log`` keeps only the process's stdout.
"""

from __future__ import annotations

import argparse
import signal as signals
import sys
import time
from collections.abc import Callable, Generator
from typing import Any, BinaryIO

from dispatcher.cli.output import EXIT_OK, json_line
from dispatcher.client import DispatcherClient
from dispatcher.core.process_api import PROCESS_SIGNALS, OutputChunk, ProcessInfo
from dispatcher.core.text.visible import visible
from dispatcher.wire.convert_processes import ProcessTruncated, signal_to_pb

ClientFactory = Callable[[argparse.Namespace], DispatcherClient]
DEFAULT_GRACE = 10.0
"""``kill`` without ``--signal``: TERM, then KILL when the group outlives this many seconds."""


def add_verbs(verbs: Any, client_opts: argparse.ArgumentParser, client: ClientFactory) -> None:
    """Add ``ps``, ``logs`` and ``kill`` to the CLI's sub-parsers."""
    ps = verbs.add_parser(
        "ps",
        parents=[client_opts],
        help="list a session's background processes",
        description="One line per process: id, state (exit code or signal), pid, output bytes, "
        "age, command. Running ones and the most recent finished ones, oldest first.",
    )
    ps.add_argument("session_id", metavar="SESSION")
    ps.set_defaults(func=lambda args: _ps(args, client))

    logs = verbs.add_parser(
        "logs",
        parents=[client_opts],
        help="print a background process's output (stdout to stdout, stderr to stderr)",
        description="The output the process's ring holds from cursor N (default 0: its oldest "
        "byte); with -f, then what comes, until the process ends (Ctrl-C stops following, not "
        "the process). Bytes the ring dropped are reported on stderr, as is the cursor to pass "
        "as --after next time.",
    )
    logs.add_argument("session_id", metavar="SESSION")
    logs.add_argument("process_id", metavar="PROCESS")
    logs.add_argument("-f", "--follow", action="store_true", help="follow live until the process ends")
    logs.add_argument("--after", type=_cursor, default=0, metavar="N", help="from this output cursor")
    logs.set_defaults(func=lambda args: _logs(args, client))

    kill = verbs.add_parser(
        "kill",
        parents=[client_opts],
        help="signal a background process's whole process group",
        description=f"Default: TERM, then KILL if the group outlives {DEFAULT_GRACE:g} s (the "
        "answer waits for its end). Another --signal is sent once, without a KILL after it, "
        "unless --grace is given.",
    )
    kill.add_argument("session_id", metavar="SESSION")
    kill.add_argument("process_id", metavar="PROCESS")
    kill.add_argument(
        "--signal", "-s", type=_signal, default=None, metavar="S", help=f"one of {' '.join(PROCESS_SIGNALS)}"
    )
    kill.add_argument("--grace", type=float, default=None, metavar="SECONDS", help="KILL after this long")
    kill.set_defaults(func=lambda args: _kill(args, client))


def _cursor(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a cursor is a byte count, 0 or more")
    return value


def _signal(text: str) -> str:
    try:
        signal_to_pb(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.upper().removeprefix("SIG")


def signal_name(number: int) -> str:
    """``15`` as ``SIGTERM`` (a number this host does not name: as it is)."""
    try:
        return signals.Signals(number).name
    except ValueError:
        return str(number)


def state_text(info: ProcessInfo) -> str:
    """``running``, ``exited 3``, ``killed SIGTERM`` (``exited`` alone: a group left running by a
    foreground command ends with neither code nor signal)."""
    if info.running:
        return "running"
    if info.signal is not None:
        return f"{info.state} {signal_name(info.signal)}"
    if info.exit_code is not None:
        return f"{info.state} {info.exit_code}"
    return info.state


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def process_line(info: ProcessInfo, now: float, id_width: int = 0) -> str:
    """One line of ``ps``: id, state, pid, output bytes, age (running: since it started; ended:
    since it ended), origin when it was left by a foreground command, command."""
    age = _age(now - (info.ended if info.ended is not None else info.started))
    left = "  (left by a foreground command)" if info.origin == "left" else ""
    command = visible(info.command, escape_backslash=True)
    return (
        f"{info.process_id:<{id_width}}  {state_text(info):<14}  pid {info.pid:<7}  "
        f"{info.end:>10,} B  {age:>4}  {command}{left}"
    )


def process_dict(info: ProcessInfo) -> dict[str, Any]:
    """A process for ``--json``: the record's fields, plus ``signal_name``."""
    return {
        "process_id": info.process_id,
        "command": info.command,
        "cwd": info.cwd,
        "pid": info.pid,
        "state": info.state,
        "exit_code": info.exit_code,
        "signal": info.signal,
        "signal_name": signal_name(info.signal) if info.signal is not None else None,
        "started": info.started,
        "ended": info.ended,
        "tool_use_id": info.tool_use_id,
        "origin": info.origin,
        "output_end": info.end,
        "output_first": info.first,
        "ring_bytes": info.ring_bytes,
        "stdin_open": info.stdin_open,
    }


def _ps(args: argparse.Namespace, client: ClientFactory) -> int:
    with client(args) as c:
        infos = c.list_processes(args.session_id)
    if args.json:
        for info in infos:
            json_line(process_dict(info))
        return EXIT_OK
    if not infos:
        print("no processes", file=sys.stderr)
    width = max((len(i.process_id) for i in infos), default=0)
    now = time.time()
    for info in infos:
        print(process_line(info, now, width))
    return EXIT_OK


def _logs(args: argparse.Namespace, client: ClientFactory) -> int:
    out, err = sys.stdout.buffer, sys.stderr.buffer
    sys.stdout.flush()
    with client(args) as c:
        stop_at: int | None = None
        if not args.follow:
            # What the ring holds now, then stop: the end is the record's cursor at this moment.
            info = next(
                (i for i in c.list_processes(args.session_id) if i.process_id == args.process_id), None
            )
            if info is not None:
                if info.end <= args.after and info.running:
                    _note(err, f"no output after cursor {args.after}; next: --after {args.after}")
                    return EXIT_OK
                # One that ended: the watch ends by itself, with how it ended.
                stop_at = info.end if info.running else None
            # An unknown process: the watch below says NOT_FOUND.
        cursor = args.after
        items = c.watch_process(args.session_id, args.process_id, after=args.after)
        try:
            for item in items:
                if isinstance(item, ProcessInfo):
                    _ended(args, item, err)
                    return EXIT_OK
                if isinstance(item, ProcessTruncated):
                    _lost(args, item, err)
                    continue
                cursor = item.cursor + len(item.data)
                _write(args, item, out, err)
                if stop_at is not None and cursor >= stop_at:
                    break
        finally:
            if isinstance(items, Generator):  # ends the RPC now, not when collected
                items.close()
    if args.json:
        json_line({"kind": "next", "cursor": cursor})
    else:
        _note(err, f"next: --after {cursor}")
    return EXIT_OK


def _write(args: argparse.Namespace, chunk: OutputChunk, out: BinaryIO, err: BinaryIO) -> None:
    if args.json:
        json_line(
            {
                "kind": "output",
                "stream": chunk.stream,
                "cursor": chunk.cursor,
                "bytes": len(chunk.data),
                "text": chunk.data.decode("utf-8", "replace"),
            }
        )
        return
    target = err if chunk.stream == "stderr" else out
    target.write(chunk.data)
    target.flush()


def _lost(args: argparse.Namespace, item: ProcessTruncated, err: BinaryIO) -> None:
    if args.json:
        json_line({"kind": "truncated", "lost_bytes": item.lost, "cursor": item.cursor})
    else:
        _note(
            err, f"{item.lost:,} bytes lost: the output ring dropped them; going on from cursor {item.cursor}"
        )


def _ended(args: argparse.Namespace, info: ProcessInfo, err: BinaryIO) -> None:
    if args.json:
        json_line({"kind": "exited", **process_dict(info)})
    else:
        _note(err, f"{info.process_id} {state_text(info)}; output ends at cursor {info.end}")


def _note(err: BinaryIO, text: str) -> None:
    err.write(f"[{text}]\n".encode())
    err.flush()


def _kill(args: argparse.Namespace, client: ClientFactory) -> int:
    sig = args.signal or "TERM"
    grace = args.grace if args.grace is not None else (DEFAULT_GRACE if args.signal is None else None)
    with client(args) as c:
        info = c.signal_process(args.session_id, args.process_id, sig, grace_seconds=grace)
    if args.json:
        json_line({"signal": sig, "grace_seconds": grace, **process_dict(info)})
    else:
        print(f"{info.process_id} {state_text(info)} (sent SIG{sig})")
    return EXIT_OK
