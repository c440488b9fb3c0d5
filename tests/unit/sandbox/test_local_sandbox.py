"""The local backend end to end: real agent, real files, real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
from pathlib import Path

import pytest

from dispatcher.core.errors import WorkspaceEscapeError
from dispatcher.core.sandbox_api import ExecRequest, ExecResult, FileOpError, SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.local import LocalSandbox, LocalSandboxProvider
from tests.clock import jump_loop_clock
from tests.polling import until

DEADLINE = 5.0


async def run(sb: LocalSandbox, command: str, **kw: object) -> tuple[ExecResult, bytes, bytes]:
    out: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    kw.setdefault("timeout", 10.0)
    result = await sb.exec(
        ExecRequest(command, **kw),  # type: ignore[arg-type]
        lambda stream, data: out[stream].extend(data),
        asyncio.Event(),
    )
    return result, bytes(out["stdout"]), bytes(out["stderr"])


# -- files ------------------------------------------------------------------------------------


async def test_write_read_round_trip_creates_parents(sandbox: LocalSandbox, workspace: Path) -> None:
    await sandbox.write("a/b/c.txt", "héllo\n")
    assert (workspace / "a/b/c.txt").read_text() == "héllo\n"
    assert await sandbox.read("a/b/c.txt") == "héllo\n"
    assert await sandbox.read(str(workspace / "a/b/c.txt")) == "héllo\n"


async def test_write_is_atomic_keeps_mode_and_leaves_no_temp_files(
    sandbox: LocalSandbox, workspace: Path
) -> None:
    script = workspace / "run.sh"
    script.write_text("old")
    script.chmod(0o750)
    inode = script.stat().st_ino
    await sandbox.write_bytes("run.sh", b"new")
    assert script.read_bytes() == b"new"
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert script.stat().st_ino != inode  # replaced by rename, not rewritten in place
    assert sorted(p.name for p in workspace.iterdir()) == ["run.sh"]


async def test_write_through_inner_symlink_updates_its_target(sandbox: LocalSandbox, workspace: Path) -> None:
    (workspace / "real.txt").write_text("old")
    (workspace / "link.txt").symlink_to("real.txt")
    await sandbox.write("link.txt", "new")
    assert (workspace / "link.txt").is_symlink()
    assert (workspace / "real.txt").read_text() == "new"


async def test_read_bytes_cap_and_too_large(workspace: Path) -> None:
    (workspace / "big.bin").write_bytes(b"x" * 5000)
    sb = LocalSandbox(str(workspace), max_frame=4096)
    try:
        assert await sb.read_bytes("big.bin", max_bytes=10) == b"x" * 10
        with pytest.raises(FileOpError) as info:
            await sb.read_bytes("big.bin")
        assert info.value.code == "too_large"
    finally:
        await sb.aclose()


async def test_read_of_non_utf8_text_is_a_decode_error(sandbox: LocalSandbox, workspace: Path) -> None:
    (workspace / "latin1.txt").write_bytes(b"caf\xe9")
    with pytest.raises(FileOpError) as info:
        await sandbox.read("latin1.txt")
    assert info.value.code == "decode"


async def test_fifo_is_refused_without_hanging(sandbox: LocalSandbox, workspace: Path) -> None:
    os.mkfifo(workspace / "pipe")
    with pytest.raises(FileOpError) as info:
        await asyncio.wait_for(sandbox.read_bytes("pipe"), DEADLINE)
    assert info.value.code == "EINVAL"


async def test_append_exists_stat(sandbox: LocalSandbox, workspace: Path) -> None:
    await sandbox.append("log/x.txt", "a")
    await sandbox.append("log/x.txt", "b")
    assert (workspace / "log/x.txt").read_text() == "ab"
    assert await sandbox.exists("log/x.txt") and not await sandbox.exists("nope")
    st = await sandbox.stat("log/../log/x.txt")
    assert (st.path, st.kind, st.size) == (str(workspace / "log/x.txt"), "file", 2)
    assert (await sandbox.stat(".")).path == str(workspace)


async def test_list_is_sorted_bounded_and_typed(sandbox: LocalSandbox, workspace: Path) -> None:
    (workspace / "b.txt").write_text("12345")
    (workspace / "a_dir").mkdir()
    (workspace / "c_link").symlink_to("b.txt")
    (workspace / "d_out").symlink_to("/etc")
    listing = await sandbox.list(".")
    assert [(e.name, e.kind, e.target) for e in listing.entries] == [
        ("a_dir", "dir", None),
        ("b.txt", "file", None),
        ("c_link", "symlink", "b.txt"),
        ("d_out", "symlink", "/etc"),
    ]
    assert listing.entries[1].size == 5 and not listing.truncated
    short = await sandbox.list(".", limit=2)
    assert [e.name for e in short.entries] == ["a_dir", "b.txt"] and short.truncated


async def test_delete_file_link_and_dirs(sandbox: LocalSandbox, workspace: Path) -> None:
    (workspace / "f").write_text("x")
    (workspace / "target").write_text("keep")
    (workspace / "link").symlink_to("target")
    (workspace / "empty").mkdir()
    (workspace / "full").mkdir()
    (workspace / "full/x").write_text("x")
    for name in ("f", "link", "empty"):
        await sandbox.delete(name)
    assert sorted(p.name for p in workspace.iterdir()) == ["full", "target"]
    with pytest.raises(FileOpError) as info:
        await sandbox.delete("full")
    assert info.value.code == "ENOTEMPTY"
    with pytest.raises(FileOpError):
        await sandbox.delete(".")


# -- escapes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "../outside/secret.txt",
        "sub/../../outside/secret.txt",
        "/etc/passwd",
        "/proc/self/root/etc/passwd",
        "to_outside/secret.txt",
        "to_etc/passwd",
        "to_secret",
        "nul\x00byte",
    ],
)
async def test_reads_escaping_the_workspace_are_refused(
    sandbox: LocalSandbox, workspace: Path, outside: Path, path: str
) -> None:
    (workspace / "sub").mkdir()
    (workspace / "to_outside").symlink_to(outside)
    (workspace / "to_etc").symlink_to("/etc")
    (workspace / "to_secret").symlink_to(outside / "secret.txt")
    for op in (sandbox.read_bytes, sandbox.exists, sandbox.stat, sandbox.list):
        with pytest.raises(WorkspaceEscapeError):
            await op(path)


@pytest.mark.parametrize(
    "path", ["to_outside/new.txt", "to_outside/deep/new.txt", "to_secret", "../outside/x"]
)
async def test_writes_escaping_the_workspace_are_refused(
    sandbox: LocalSandbox, workspace: Path, outside: Path, path: str
) -> None:
    (workspace / "to_outside").symlink_to(outside)
    (workspace / "to_secret").symlink_to(outside / "secret.txt")
    with pytest.raises(WorkspaceEscapeError):
        await sandbox.write(path, "pwned")
    with pytest.raises(WorkspaceEscapeError):
        await sandbox.append(path, "pwned")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret\n"


async def test_delete_through_outside_parent_is_refused(
    sandbox: LocalSandbox, workspace: Path, outside: Path
) -> None:
    (workspace / "to_outside").symlink_to(outside)
    with pytest.raises(WorkspaceEscapeError):
        await sandbox.delete("to_outside/secret.txt")
    await sandbox.delete("to_outside")  # the link itself lives inside and may go
    assert (outside / "secret.txt").exists()


async def test_exec_cwd_must_stay_inside(sandbox: LocalSandbox, workspace: Path, outside: Path) -> None:
    (workspace / "to_outside").symlink_to(outside)
    for cwd in ("..", "to_outside", "/tmp"):
        with pytest.raises(WorkspaceEscapeError):
            await run(sandbox, "pwd", cwd=cwd)
    with pytest.raises(FileOpError):
        await run(sandbox, "pwd", cwd="missing")


# -- exec -----------------------------------------------------------------------------------


async def test_exec_stdin_env_cwd_and_exit_code(sandbox: LocalSandbox, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    result, out, err = await run(
        sandbox,
        'cat; echo "$GREETING"; pwd; echo warn >&2; exit 7',
        cwd="sub",
        env={"GREETING": "hi"},
        stdin=b"in\n",
    )
    assert result.exit_code == 7 and result.signal is None
    assert out == f"in\nhi\n{workspace / 'sub'}\n".encode()
    assert err == b"warn\n"


async def test_exec_env_is_minimal(sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    _, out, _ = await run(sandbox, "env")
    names = {line.split("=", 1)[0] for line in out.decode().splitlines()}
    # Commands inherit the agent's environment (PATH and HOME from the server), nothing else of the
    # server's; LC_CTYPE is the agent interpreter's own locale coercion (PEP 538) of a bare C locale.
    assert names <= {
        "PATH",
        "HOME",
        "LANG",
        "TERM",
        "PAGER",
        "GIT_PAGER",
        "PWD",
        "SHLVL",
        "_",
        "OLDPWD",
        "LC_CTYPE",
    }


async def test_four_commands_run_in_parallel(sandbox: LocalSandbox, workspace: Path) -> None:
    # Each waits for all four to have started, which only works if they run at the same time.
    cmd = "touch started.$N; while [ $(ls started.* | wc -l) -lt 4 ]; do sleep 0.01; done; echo $N"
    results = await asyncio.gather(
        *(run(sandbox, cmd, env={"N": str(n)}, timeout=DEADLINE) for n in range(4))
    )
    assert sorted(out for _, out, _ in results) == [b"0\n", b"1\n", b"2\n", b"3\n"]


async def exec_until_ready(sb: LocalSandbox, command: str, ready: bytes, **kw: object) -> ExecResult:
    """Run ``command`` and let its timeout (at most a minute) elapse only once it printed ``ready``
    (the loop's clock jumps): on a busy machine the timeout could come before the shell ran at all."""
    out = bytearray()
    call = asyncio.ensure_future(
        sb.exec(ExecRequest(command, timeout=60.0, **kw), lambda _, data: out.extend(data), asyncio.Event())  # type: ignore[arg-type]
    )
    await until(lambda: bytes(out) == ready or call.done(), f"the command to print {ready!r}")
    jump_loop_clock(60.0)
    result = await call
    assert bytes(out) == ready
    return result


async def test_timeout_terminates_and_keeps_output(sandbox: LocalSandbox) -> None:
    # The grace bounds the wait for the exit SIGTERM causes: a busy machine must not make it a SIGKILL.
    result = await exec_until_ready(sandbox, "echo partial; sleep 30", b"partial\n", grace_seconds=30.0)
    assert result.timed_out and not result.killed and result.signal == signal.SIGTERM


async def test_sigterm_ignoring_group_is_killed_after_grace(sandbox: LocalSandbox) -> None:
    # "stubborn" comes after the trap: SIGTERM finds it set (before it, the shell would die of it).
    result = await exec_until_ready(
        sandbox, "trap '' TERM; echo stubborn; sleep 30", b"stubborn\n", grace_seconds=0.2
    )
    assert result.timed_out and result.killed and result.signal == signal.SIGKILL


async def test_cancel_kills_background_children_too(sandbox: LocalSandbox, workspace: Path) -> None:
    cancel = asyncio.Event()
    out = bytearray()
    call = asyncio.ensure_future(
        sandbox.exec(
            ExecRequest("sleep 30 & echo $!; wait", timeout=30),
            lambda stream, data: out.extend(data),
            cancel,
        )
    )
    await until(lambda: out.endswith(b"\n"), "the background pid")
    cancel.set()
    result = await asyncio.wait_for(call, DEADLINE)
    assert result.cancelled and not result.timed_out
    child = int(out)
    await until(lambda: not _alive(child), "the background child to die")


async def test_background_child_holding_the_pipe_does_not_block_exit(sandbox: LocalSandbox) -> None:
    # Waiting for the child (30 s) would end in the 10 s timeout: an exit code proves it did not.
    result, out, _ = await run(sandbox, "sleep 30 & echo done")
    assert result.exit_code == 0 and not result.timed_out and out == b"done\n"


async def test_large_output_streams_completely(sandbox: LocalSandbox) -> None:
    total = 0
    chunks = 0

    def count(stream: str, data: bytes) -> None:
        nonlocal total, chunks
        total += len(data)
        chunks += 1

    result = await sandbox.exec(
        ExecRequest("head -c 5000000 /dev/zero", timeout=DEADLINE), count, asyncio.Event()
    )
    assert result.exit_code == 0 and total == 5_000_000 and chunks >= 5_000_000 // (64 * 1024)


# -- lifecycle ------------------------------------------------------------------------------


async def test_dead_agent_is_respawned(sandbox: LocalSandbox, workspace: Path) -> None:
    await sandbox.write("x", "1")
    first = sandbox.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    channel = await sandbox.channel()
    await until(lambda: channel.broken, "the channel to notice the dead agent")
    assert await sandbox.read("x") == "1"
    assert sandbox.pid not in (None, first)


async def test_call_in_flight_when_agent_dies_raises_sandbox_error(sandbox: LocalSandbox) -> None:
    out = bytearray()
    call = asyncio.ensure_future(
        sandbox.exec(
            ExecRequest("echo $$; sleep 30", timeout=30), lambda s, d: out.extend(d), asyncio.Event()
        )
    )
    await until(lambda: out.endswith(b"\n"), "the command to start")
    assert sandbox.pid is not None
    try:
        os.kill(sandbox.pid, signal.SIGKILL)
        with pytest.raises(SandboxError):
            await asyncio.wait_for(call, DEADLINE)
    finally:
        os.killpg(int(out), signal.SIGKILL)  # a SIGKILLed agent cannot clean up after itself


async def test_provider_hands_out_one_lazy_sandbox_per_session(tmp_path: Path) -> None:
    provider = LocalSandboxProvider()
    one = Session("s1", str(tmp_path / "one"))
    two = Session("s2", str(tmp_path / "two"))
    try:
        sb1 = provider.sandbox_for(one)
        assert provider.sandbox_for(one) is sb1 and sb1.pid is None  # nothing started yet
        await sb1.write("f", "1")
        sb2 = provider.sandbox_for(two)
        await sb2.write("f", "2")
        assert (tmp_path / "one/f").read_text() == "1" and (tmp_path / "two/f").read_text() == "2"
        pid = sb1.pid
        assert pid is not None
        await provider.close_session("s1")
        assert not _alive(pid)
        with pytest.raises(SandboxError):
            await sb1.read("f")
        assert (tmp_path / "one/f").exists()  # the workspace stays
    finally:
        await provider.aclose()
    with pytest.raises(SandboxError):
        await sb2.read("f")  # aclose stopped every agent


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


async def test_undecodable_file_names_never_break_the_channel(sandbox: LocalSandbox, workspace: Path) -> None:
    with open(os.path.join(os.fsencode(workspace), b"caf\xe9.txt"), "wb") as f:
        f.write(b"x")
    listing = await sandbox.list(".")
    # os.fsdecode's convention: the undecodable byte is a lone surrogate, which list_dir shows escaped.
    assert [e.name for e in listing.entries] == ["caf\udce9.txt"]
    assert await sandbox.read("caf\udce9.txt") == "x"  # the surrogate-escaped name reaches the file
    with pytest.raises(FileOpError) as info:
        await sandbox.read("nope\udce9")
    assert info.value.code == "ENOENT"
    info.value.message.encode("utf-8")  # safe to serialise downstream
    assert not (await sandbox.channel()).broken


async def test_an_agent_that_died_took_its_processes_and_nothing_restarts_to_say_so(
    sandbox: LocalSandbox,
) -> None:
    from dispatcher.core.process_api import ProcessError, ProcessStart

    table = sandbox.processes()
    assert await table.list() == () and sandbox.pid is None  # nothing started to find nothing
    started = await table.start(ProcessStart("p_1", "sleep 60"))
    pid = sandbox.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await until(lambda: sandbox._channel is not None and sandbox._channel.broken, "the channel to break")
    with pytest.raises(ProcessError) as caught:
        await table.read("p_1")
    assert str(caught.value).startswith(
        "process 'p_1' is gone: the session's sandbox was removed since it started (its agent"
        " process had ended)"
    )
    assert await table.list() == () and sandbox.pid is None and sandbox.generation == 1
    await table.start(ProcessStart("p_2", "true"))  # a start brings an agent back
    assert sandbox.generation == 1 and sandbox.pid is not None

    def killed() -> bool:  # the group the killed agent could not kill itself was killed for it
        try:
            os.killpg(started.pid, 0)
        except ProcessLookupError:
            return True
        return _zombies_only(started.pid)

    await until(killed, "the dead agent's process group to be killed")


def _zombies_only(pgid: int) -> bool:
    """Whether every process left in group ``pgid`` is a zombie (ended, not reaped yet)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return False
    return True
