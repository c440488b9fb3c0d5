"""Foreground commands as agents meet them: no terminal, no stdin, processes they leave behind
kept in the table, and the shell state they end with, reported on its own channel."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.sandbox.agent import protocol as p
from dispatcher.sandbox.agent.process import group_alive as _group_alive
from dispatcher.sandbox.agent.shell_state import parse_exports

from .served_agent import DEADLINE, Link, Served


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    root = tmp_path / "ws"
    root.mkdir()
    agent = Served(str(root))
    yield agent
    agent.close()


@pytest.fixture
def link(served: Served) -> Link:
    return served.link


def _run(link: Link, request: p.Exec) -> tuple[bytes, bytes, p.Exit]:
    rid = link.send(request)
    frames = link.frames(rid)
    out = b"".join(b for h, b in frames[:-1] if h["stream"] == "stdout")
    err = b"".join(b for h, b in frames[:-1] if h["stream"] == "stderr")
    header, payload = frames[-1]
    assert header["type"] == "exit", header
    return out, err, p.Exit.decode(header, payload)


def test_no_terminal_and_no_stdin_unless_the_request_says_otherwise(link: Link) -> None:
    out, _, _ = _run(link, p.Exec('echo "$TERM $PAGER $GIT_PAGER"; cat'))
    assert out == b"dumb cat cat\n"  # and cat read an empty stdin: it did not wait
    out, _, _ = _run(link, p.Exec('echo "$TERM $PAGER $GIT_PAGER"', env={"PAGER": "less", "TERM": "xterm"}))
    assert out == b"xterm less cat\n"


def test_a_background_child_holding_the_pipes_is_kept_reading_and_listed(link: Link) -> None:
    started = time.monotonic()
    out, _, end = _run(
        link, p.Exec("(sleep 0.5; echo from-child; echo oops >&2) & echo parent", leave_as="p_left")
    )
    assert out == b"parent\n" and end.exit_code == 0 and end.left == ("p_left",)
    assert time.monotonic() - started < DEADLINE / 2
    [record] = link.call(p.ProcListRequest()).processes
    assert (record.process_id, record.origin, record.state) == ("p_left", "left", "running")
    after, got = 0, b""
    while True:
        chunk = link.call(p.ProcRead("p_left", after, wait_seconds=DEADLINE))
        after, got = chunk.next, got + b"".join(c.stream.encode() + b":" + c.data for c in chunk.chunks)
        if chunk.state != "running" and not chunk.chunks:
            break
    assert got == b"stdout:from-child\nstderr:oops\n"
    assert (chunk.state, chunk.exit_code, chunk.signal) == ("exited", None, None)


def test_a_left_child_can_be_stopped_with_its_whole_group(link: Link) -> None:
    _, _, end = _run(link, p.Exec("sleep 30 & sleep 30 &"))
    [left] = end.left
    record = link.call(p.ProcSignal(left, "TERM", grace_seconds=2))
    assert record.state == "killed" and not _group_alive(record.pid)


def test_a_daemon_that_let_go_of_the_pipes_is_not_taken(link: Link) -> None:
    _, _, end = _run(link, p.Exec("sleep 30 >/dev/null 2>&1 </dev/null &"))
    assert end.left == () and link.call(p.ProcListRequest()).processes == ()


def test_a_command_that_leaves_nothing_running_leaves_nothing_listed(link: Link) -> None:
    _, _, end = _run(link, p.Exec("echo hi"))
    assert end.left == () and link.call(p.ProcListRequest()).processes == ()


def test_the_shell_state_comes_back_apart_from_the_output(link: Link, served: Served) -> None:
    out, _, end = _run(
        link,
        p.Exec(
            "mkdir -p sub/x && cd sub/x && export FOO='a b' && unset HOME && echo done",
            capture_state=True,
        ),
    )
    assert out == b"done\n" and end.exit_code == 0
    assert end.cwd == "sub/x" and end.env is not None and end.env["FOO"] == "a b" and "HOME" in end.unset
    assert "PWD" not in end.env and "SHLVL" not in end.env


def test_exit_keeps_its_status_and_the_state_of_that_moment(link: Link) -> None:
    _, _, end = _run(link, p.Exec("mkdir -p d; cd d; exit 7", capture_state=True))
    assert (end.exit_code, end.cwd) == (7, "d")


def test_a_command_that_replaces_its_shell_reports_no_state(link: Link) -> None:
    out, _, end = _run(link, p.Exec("cd /; exec echo replaced", capture_state=True))
    assert out == b"replaced\n" and (end.exit_code, end.cwd, end.env) == (0, None, None)


def test_a_directory_outside_the_workspace_is_not_reported(link: Link) -> None:
    _, _, end = _run(link, p.Exec("cd /", capture_state=True))
    assert end.cwd is None and end.env is not None


def test_the_command_sees_none_of_the_wrapping(link: Link) -> None:
    out, _, end = _run(link, p.Exec('echo "$# $0"; ls /proc/$$/fd', capture_state=True))
    first, fds = out.split(b"\n", 1)
    assert first == b"0 sh" and sorted(fds.split()) == [b"0", b"1", b"2"]
    assert end.exit_code == 0


TRICKY = {
    "X": "a'b\"c$d\\e\nnew line `x`\ttab",
    "EMPTY": "",
    "U": "ünï",
    "SP": "  sp  ",
    "Q": "'",
    "BS": "\\",
}


@pytest.mark.parametrize("shell", [["dash"], ["bash", "--posix"], ["busybox", "sh"]], ids=lambda s: s[0])
def test_every_shells_export_listing_is_read_exactly(shell: list[str]) -> None:
    if shutil.which(shell[0]) is None:
        pytest.skip(f"no {shell[0]} here")
    listing = subprocess.run([*shell, "-c", "export -p"], env=TRICKY, capture_output=True, check=True).stdout
    got = parse_exports(os.fsdecode(listing))
    assert got is not None and {k: got.get(k) for k in TRICKY} == TRICKY


def test_a_listing_that_is_not_one_is_refused() -> None:
    assert parse_exports("export A='unterminated\n") is None
    assert parse_exports("A=1\n") is None
    assert parse_exports("export 1A=x\n") is None


@pytest.mark.parametrize("capture_state", [False, True], ids=["plain", "remembering"])
def test_pkill_f_of_a_pattern_in_the_command_spares_the_calling_shell(
    link: Link, capture_state: bool
) -> None:
    """The command is not in its shell's argv, so ``pkill -f`` / ``pgrep -f`` of a pattern it
    names (the classic way to stop a server) does not find, and kill, the shell running it."""
    marker = "no-process-has-this-9d1c"
    out, _, end = _run(
        link,
        p.Exec(f"pgrep -f {marker} || echo none; pkill -f {marker}; echo alive", capture_state=capture_state),
    )
    assert (out, end.exit_code, end.signal) == (b"none\nalive\n", 0, None)
    out, _, _ = _run(link, p.Exec('echo "${__DISPATCHER_COMMAND-unset}"', capture_state=capture_state))
    assert out == b"unset\n"  # and what it runs does not inherit it
