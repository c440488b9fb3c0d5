"""Commands run in the foreground: ``exec`` (its ``output`` frames, then its ``exit``) and
``signal`` to its process group.

Part of the agent protocol's one schema: ``protocol.py`` re-exports every name here and lists the
requests among its ops, so the host imports ``protocol.py`` alone, as for every other op.

An exec may name (``leave_as``) the process of the table that what it leaves running becomes, and
ask (``capture_state``) for the directory and exported environment its shell ended with
(``shell_state.py``); its exit says both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .codec import CHUNK, BadMessage, Env, Reply, Request, check_env, check_relative, take
from .process_messages import check_process_id

SIGNALS = ("TERM", "KILL", "INT")


@dataclass(frozen=True)
class Output(Reply):
    TYPE: ClassVar[str] = "output"
    stream: str
    data: bytes

    def check(self) -> None:
        if not 0 < len(self.data) <= CHUNK:
            raise BadMessage("output chunk size out of bounds")
        if self.stream not in ("stdout", "stderr"):
            raise BadMessage("output frame with an unknown stream")


MAX_STATE = 256 << 10
"""The most bytes of shell state (directory and environment) an exit carries."""


@dataclass(frozen=True)
class Exit(Reply):
    """Exactly one of an exit status (0-255) or the number of the signal that ended the command.

    ``left``: the process ids of what the command left running (``leave_as``; at most one group:
    whatever still holds its output pipes), now processes of the table. With ``capture_state``,
    the state the shell ended in, when it could tell (None when the command replaced or killed
    its shell, or left the workspace): ``cwd`` relative to the root, ``env`` the exported
    variables that differ from what the command started with (travelling as the payload, JSON),
    ``unset`` those it removed."""

    TYPE: ClassVar[str] = "exit"
    exit_code: int | None
    signal: int | None
    left: tuple[str, ...] = ()
    cwd: str | None = None
    env: Env | None = None
    unset: tuple[str, ...] = ()

    def encode(self) -> tuple[dict[str, Any], bytes]:
        header: dict[str, Any] = {"exit_code": self.exit_code, "signal": self.signal}
        if self.left:
            header["left"] = list(self.left)
        if self.cwd is not None:
            header["cwd"] = self.cwd
        if self.unset:
            header["unset"] = list(self.unset)
        if self.env is None:
            return header, b""
        header["env"] = True
        return header, json.dumps(self.env).encode("ascii")

    @classmethod
    def decode(cls, header: Mapping[str, Any], payload: bytes = b"") -> Exit:
        env: Env | None = None
        if take(header, "env", "bool", False):
            try:
                env = json.loads(payload.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                raise BadMessage("exit environment is not JSON") from None
            if not isinstance(env, dict):
                raise BadMessage("exit environment is not an object")
        elif payload:
            raise BadMessage("exit frame with an unannounced payload")
        message = cls(
            take(header, "exit_code", "int | None"),
            take(header, "signal", "int | None"),
            take(header, "left", "tuple[str, ...]", ()),
            take(header, "cwd", "str | None"),
            env,
            take(header, "unset", "tuple[str, ...]", ()),
        )
        message.check()
        return message

    def check(self) -> None:
        for process_id in self.left:
            check_process_id(process_id)
        if self.env is not None:
            check_env(self.env)
        if self.cwd is not None:
            check_relative(self.cwd, "exit cwd")
        if any(not name or "=" in name or "\x00" in name for name in self.unset):
            raise BadMessage("malformed unset variable name")
        if (self.exit_code is None) == (self.signal is None):
            raise BadMessage("exit frame needs exactly one of exit_code or signal")
        if self.exit_code is not None and not 0 <= self.exit_code <= 255:
            raise BadMessage("exit status out of range")
        if self.signal is not None and not 0 < self.signal < 128:
            raise BadMessage("signal number out of range")


@dataclass(frozen=True)
class Delivered(Reply):
    delivered: bool


@dataclass(frozen=True)
class Exec(Request[Exit], op="exec", reply=Exit):
    """``sh -c command``; its output frames come before the ``exit`` that ends it."""

    command: str
    cwd: str = "."
    env: Env = field(default_factory=dict)
    stdin: bytes | None = None  # travels as the payload, announced by the header's bool
    approved_cwd: str | None = None
    leave_as: str | None = None
    """The process id for what the command leaves running (None: the agent makes one up)."""
    capture_state: bool = False
    """Report the directory and exported environment the shell ends with (``Exit``)."""

    def encode(self) -> tuple[dict[str, Any], bytes]:
        header: dict[str, Any] = {
            "command": self.command,
            "cwd": self.cwd,
            "env": dict(self.env),
            "stdin": self.stdin is not None,
        }
        if self.approved_cwd is not None:
            header["approved_cwd"] = self.approved_cwd
        if self.leave_as is not None:
            header["leave_as"] = self.leave_as
        if self.capture_state:
            header["capture_state"] = True
        return header, self.stdin or b""

    @classmethod
    def decode(cls, header: Mapping[str, Any], payload: bytes = b"") -> Exec:
        command = take(header, "command", "str")
        cwd = take(header, "cwd", "str", ".")
        approved_cwd = take(header, "approved_cwd", "str | None")
        env = take(header, "env", "Env", {})
        use_stdin = take(header, "stdin", "bool", False)
        leave_as = take(header, "leave_as", "str | None")
        capture = take(header, "capture_state", "bool", False)
        message = cls(command, cwd, env, payload if use_stdin else None, approved_cwd, leave_as, capture)
        message.check()
        return message

    def check(self) -> None:
        check_env(self.env)
        if self.leave_as is not None:
            check_process_id(self.leave_as)


@dataclass(frozen=True)
class SendSignal(Request[Delivered], op="signal", reply=Delivered):
    """Signal a running command's process group (``TERM``, ``KILL`` or ``INT``)."""

    exec_id: int
    signal: str

    def check(self) -> None:
        if self.signal not in SIGNALS:
            raise BadMessage(f"unknown signal {self.signal!r}")
