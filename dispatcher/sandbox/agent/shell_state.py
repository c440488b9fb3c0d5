"""A shell that remembers, the agent's half: what directory and exported environment an exec's
shell ended with, for the host to start the next call there.

The state travels on its own channel, never through the command's output: the shell runs the
command with ``eval`` and an ``EXIT`` trap writes ``pwd -P``, a NUL, then ``export -p`` to a file
the agent made for this exec (on the container's tmpfs, in a directory only the agent's user may
enter). The file is opened by the trap itself, after the command ended, so no descriptor of it is
ever inherited: a background child cannot hold it, the command cannot close or overwrite it by
accident, and its output is untouched. The command and the file's name reach the shell as
positional parameters, never spliced into the script, so no quoting can go wrong; they are
shifted away (the command sees ``$#`` as 0) and kept in variables that are not exported.

What the command does decides what is known: ``exit N`` runs the trap (the state is that of the
moment it exited, N is kept); ``exec prog`` replaces the shell and a fatal signal ends it without
the trap, and a command that sets its own ``EXIT`` trap replaces this one: then nothing is known
(``cwd`` and ``env`` None) and the host keeps what it had.

The exported variables are reported as a difference from what the command started with (changed
or new, and removed), less what a shell sets on its own (``PWD``, ``SHLVL``, ``_``): the host
merges that into what it keeps. A directory outside the workspace is not reported (a command
cannot start there). At most ``MAX_STATE`` bytes are read.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile

from .protocol import MAX_STATE

COMMAND_VARIABLE = "__DISPATCHER_COMMAND"
"""Where an exec's shell finds its command: not in its argv, where ``pkill -f``/``pgrep -f`` of a
pattern the command names would find (and kill) the shell running it. The shell copies it into an
unexported variable and unsets it, so the command's processes do not inherit it."""
_PLAIN = f'__dispatcher_command=${COMMAND_VARIABLE}; unset {COMMAND_VARIABLE}; eval "$__dispatcher_command"'
_SCRIPT = (
    f"__dispatcher_state=$1; __dispatcher_command=${COMMAND_VARIABLE}; unset {COMMAND_VARIABLE}; shift; "
    "trap '__dispatcher_rc=$?; "
    '{ pwd -P && printf "\\000" && export -p; } >"$__dispatcher_state" 2>/dev/null; '
    "exit $__dispatcher_rc' EXIT; "
    'eval "$__dispatcher_command"'
)
"""Builtins only in the trap (``pwd``, ``printf``, ``export -p``): remembering costs no process."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SHELL_OWN = frozenset({"PWD", "SHLVL", "_"})
"""Variables a shell sets by itself: never reported as the command's."""


def command_argv(state_path: str | None) -> list[str]:
    """The argv of an exec's shell, its command in ``COMMAND_VARIABLE`` of its environment; with
    ``state_path``, the shell leaves its state there when it exits."""
    if state_path is None:
        return ["/bin/sh", "-c", _PLAIN]
    return ["/bin/sh", "-c", _SCRIPT, "sh", state_path]


class StateFiles:
    """Where states are written: one private directory, made when first needed."""

    def __init__(self) -> None:
        self._dir: str | None = None

    def new(self) -> str:
        """A fresh, empty path for one exec's state."""
        if self._dir is None or not os.path.isdir(self._dir):
            self._dir = tempfile.mkdtemp(prefix="dispatcher-agent-state-")
        fd, path = tempfile.mkstemp(dir=self._dir)
        os.close(fd)
        os.unlink(path)  # the trap creates it: an empty file would read as a state
        return path


def take_state(
    path: str, root: str, started_env: dict[str, str]
) -> tuple[str | None, dict[str, str] | None, tuple[str, ...]]:
    """(cwd relative to ``root``, changed or new variables, removed names) from the state at
    ``path``, which is removed; (None, None, ()) when there is none or it cannot be read."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_STATE + 1)
    except OSError:
        return None, None, ()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    where, sep, listing = raw.partition(b"\n\0")
    if not sep or len(raw) > MAX_STATE:
        return None, None, ()
    env = parse_exports(os.fsdecode(listing))
    if env is None:
        return None, None, ()
    changed = {
        k: v for k, v in env.items() if k not in SHELL_OWN and started_env.get(k) != v and "\x00" not in v
    }
    unset = tuple(sorted(k for k in started_env if k not in env and k not in SHELL_OWN))
    return _relative(os.fsdecode(where), root), changed, unset


def parse_exports(text: str) -> dict[str, str] | None:
    """The variables ``export -p`` printed (``export NAME=WORD`` lines, quoted as dash, bash and
    busybox quote them); None when the text is not that."""
    env: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        for prefix in ("export ", "declare -x "):
            if text.startswith(prefix, i):
                i += len(prefix)
                break
        else:
            return None
        j = i
        while j < n and text[j] not in "=\n":
            j += 1
        name = text[i:j]
        if not _NAME.fullmatch(name):
            return None
        if j >= n or text[j] == "\n":  # exported, never given a value
            i = j + 1
            continue
        value, i = _word(text, j + 1)
        if value is None:
            return None
        env[name] = value
        i += 1
    return env


def _word(text: str, i: int) -> tuple[str | None, int]:
    """One shell word from ``i`` to the end of its line: (its value, where it ended)."""
    out: list[str] = []
    n = len(text)
    while i < n and text[i] != "\n":
        c = text[i]
        if text.startswith("$'", i):  # bash's ANSI-C quoting
            value, i = _ansi_c(text, i + 2)
            if value is None:
                return None, i
            out.append(value)
        elif c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                return None, i
            out.append(text[i + 1 : end])
            i = end + 1
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '$`"\\':
                    i += 1
                out.append(text[i])
                i += 1
            if i >= n:
                return None, i
            i += 1
        elif c == "\\" and i + 1 < n:
            out.append(text[i + 1])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out), i


_ESCAPES = {"n": 10, "t": 9, "r": 13, "a": 7, "b": 8, "e": 27, "E": 27, "f": 12, "v": 11}


def _ansi_c(text: str, i: int) -> tuple[str | None, int]:
    """A ``$'...'`` word's value from just after its opening quote: (value, after its end)."""
    raw = bytearray()
    n = len(text)
    while i < n and text[i] != "'":
        c = text[i]
        if c != "\\" or i + 1 >= n:
            raw += os.fsencode(c)
            i += 1
            continue
        e = text[i + 1]
        octal = re.match(r"[0-7]{1,3}", text[i + 1 : i + 4])
        hexa = re.match(r"x([0-9A-Fa-f]{1,2})", text[i + 1 : i + 4])
        if octal:
            raw.append(int(octal.group(), 8) & 0xFF)
            i += 1 + len(octal.group())
        elif hexa:
            raw.append(int(hexa.group(1), 16))
            i += 1 + len(hexa.group())
        else:
            raw += bytes([_ESCAPES[e]]) if e in _ESCAPES else os.fsencode(e)
            i += 2
    if i >= n:
        return None, i
    return os.fsdecode(bytes(raw)), i + 1


def _relative(cwd: str, root: str) -> str | None:
    real_root = os.path.realpath(root)
    if cwd == real_root:
        return "."
    if cwd.startswith(real_root.rstrip("/") + "/"):
        return cwd[len(real_root.rstrip("/")) + 1 :]
    return None
