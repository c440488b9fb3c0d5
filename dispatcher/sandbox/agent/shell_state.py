"""A shell that remembers, the agent's half: what directory and exported environment an exec's
shell ended with, for the host to start the next call there.

The state travels on its own channel, never through the command's output: the shell runs the
command with ``eval`` and an ``EXIT`` trap writes ``pwd -P``, a NUL, then ``env -0`` to a file
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
import tempfile

from .protocol import MAX_STATE

_SCRIPT = (
    "__dispatcher_state=$1; __dispatcher_command=$2; shift 2; "
    "trap '__dispatcher_rc=$?; "
    '{ pwd -P && printf "\\000" && env -0; } >"$__dispatcher_state" 2>/dev/null; '
    "exit $__dispatcher_rc' EXIT; "
    'eval "$__dispatcher_command"'
)
SHELL_OWN = frozenset({"PWD", "SHLVL", "_"})
"""Variables a shell sets by itself: never reported as the command's."""


def wrapped(command: str, state_path: str) -> list[str]:
    """The argv that runs ``command`` and leaves its shell's state at ``state_path``."""
    return ["/bin/sh", "-c", _SCRIPT, "sh", state_path, command]


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
    env: dict[str, str] = {}
    for item in listing.split(b"\0"):
        name, eq, value = item.partition(b"=")
        if eq and name:
            env[os.fsdecode(name)] = os.fsdecode(value)
    changed = {
        k: v for k, v in env.items() if k not in SHELL_OWN and started_env.get(k) != v and "\x00" not in v
    }
    unset = tuple(sorted(k for k in started_env if k not in env and k not in SHELL_OWN))
    return _relative(os.fsdecode(where), root), changed, unset


def _relative(cwd: str, root: str) -> str | None:
    real_root = os.path.realpath(root)
    if cwd == real_root:
        return "."
    if cwd.startswith(real_root.rstrip("/") + "/"):
        return cwd[len(real_root.rstrip("/")) + 1 :]
    return None
