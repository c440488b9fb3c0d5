"""Issue 8 points 2-3 over the local backend: binary writes, honest reads, shell cwd/env, limits."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.config.load import load_config
from dispatcher.core import ConfirmationPolicy, Session, ToolDispatcher, ToolErrorClass, ToolUseBlock
from dispatcher.core.errors import ConfigError
from dispatcher.core.sandbox_api import FileOpError
from dispatcher.core.types import ToolResultBlock
from dispatcher.sandbox.agent.processes import command_env
from dispatcher.sandbox.local import LocalSandboxProvider
from dispatcher.tools import builtin_factories
from dispatcher.tools.read_file import READ_CAP, ReadFileTool
from dispatcher.tools.write_file import DEFAULT_MAX_WRITE_BYTES, decode_base64
from tests.unit.tools.conftest import Harness, text_of

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) + b"\r\n\x00\xff"


async def _dispatcher(max_write_bytes: int = DEFAULT_MAX_WRITE_BYTES) -> ToolDispatcher:
    d = ToolDispatcher(LocalSandboxProvider(), policy=ConfirmationPolicy.preset("autonomous"))
    for factory in builtin_factories(max_write_bytes=max_write_bytes):
        d.register(factory, builtin=True)
    d.seal()
    return d


@pytest.fixture
async def dispatcher() -> AsyncIterator[ToolDispatcher]:
    d = await _dispatcher()
    yield d
    await d.aclose()


async def _call(d: ToolDispatcher, workspace: Path, name: str, **input_: object) -> ToolResultBlock:
    session = Session("s1", str(workspace))
    d.open_session(session)  # idempotent
    return await d.dispatch(ToolUseBlock("tu", name, input_), session)


def _text(result: ToolResultBlock) -> str:
    return "".join(block.text for block in result.content if block.type == "text")


# -- write_file: base64 -----------------------------------------------------------------------


async def test_base64_write_keeps_every_byte(dispatcher: ToolDispatcher, workspace: Path) -> None:
    encoded = base64.b64encode(PNG).decode()
    result = await _call(
        dispatcher, workspace, "write_file", path="img/a.png", content=encoded, encoding="base64"
    )
    assert not result.is_error, _text(result)
    assert (workspace / "img/a.png").read_bytes() == PNG
    assert result.metadata["bytes"] == len(PNG)


async def test_base64_with_line_breaks_is_accepted(dispatcher: ToolDispatcher, workspace: Path) -> None:
    encoded = base64.encodebytes(PNG).decode()  # MIME style: a newline every 76 characters
    result = await _call(
        dispatcher, workspace, "write_file", path="a.bin", content=encoded, encoding="base64"
    )
    assert not result.is_error and (workspace / "a.bin").read_bytes() == PNG


@pytest.mark.parametrize(
    "bad",
    ["not base64!", "QUJD=", "QUJ", "QQ=x", "QR==", "YWJj-_", "QUJDé"],
    ids=["alphabet", "padding", "unpadded", "junk-after-pad", "stray-bits", "urlsafe", "non-ascii"],
)
async def test_bad_base64_is_a_validation_error_and_writes_nothing(
    dispatcher: ToolDispatcher, workspace: Path, bad: str
) -> None:
    (workspace / "keep.bin").write_bytes(b"old")
    result = await _call(dispatcher, workspace, "write_file", path="keep.bin", content=bad, encoding="base64")
    assert result.is_error and result.error_class is ToolErrorClass.VALIDATION_ERROR, _text(result)
    assert "base64" in _text(result)
    assert (workspace / "keep.bin").read_bytes() == b"old"


def test_decode_base64_refuses_what_b64decode_would_accept() -> None:
    assert decode_base64("QQ==") == b"A"
    for lenient in ("QR==", "Q Q = =x"):
        with pytest.raises(ValueError):
            decode_base64(lenient)


async def test_default_encoding_is_utf8_text(dispatcher: ToolDispatcher, workspace: Path) -> None:
    result = await _call(dispatcher, workspace, "write_file", path="t.txt", content="QQ==", encoding="utf-8")
    assert not result.is_error and (workspace / "t.txt").read_text() == "QQ=="


async def test_write_limit_is_stated_configurable_and_enforced(workspace: Path) -> None:
    d = await _dispatcher(max_write_bytes=1000)
    try:
        (definition,) = [t for t in d.registry.definitions() if t.name == "write_file"]
        assert "1,000 bytes" in definition.description
        big = await _call(d, workspace, "write_file", path="big.txt", content="x" * 1001)
        assert big.is_error and big.error_class is ToolErrorClass.VALIDATION_ERROR
        assert "1,000" in _text(big) and "dispatcher.max_write_bytes" in _text(big)
        assert not (workspace / "big.txt").exists()
        b64 = base64.b64encode(bytes(1001)).decode()
        big64 = await _call(d, workspace, "write_file", path="big.bin", content=b64, encoding="base64")
        assert big64.error_class is ToolErrorClass.VALIDATION_ERROR
        ok = await _call(
            d,
            workspace,
            "write_file",
            path="ok.bin",
            content=base64.b64encode(bytes(1000)).decode(),
            encoding="base64",
        )
        assert not ok.is_error and (workspace / "ok.bin").stat().st_size == 1000
    finally:
        await d.aclose()


def test_max_write_bytes_config_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("dispatcher: {max_write_bytes: 2048}\n")
    assert load_config(path, home=str(tmp_path), env={}).dispatcher.max_write_bytes == 2048
    path.write_text("dispatcher: {max_write_bytes: 8388608}\n")  # as base64, more than a 6 MiB input
    with pytest.raises(ConfigError, match="max_write_bytes"):
        load_config(path, home=str(tmp_path), env={})
    path.write_text("server: {max_request_bytes: 1048576}\n")  # the defaults come down with it
    loaded = load_config(path, home=str(tmp_path), env={}).dispatcher
    assert loaded.max_input_bytes < 1 << 20 and loaded.max_write_bytes * 4 // 3 < loaded.max_input_bytes


# -- read_file: binary and big files ------------------------------------------------------------


async def test_binary_read_says_how_to_get_the_bytes(harness: Harness, workspace: Path) -> None:
    (workspace / "prog.bin").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(100))
    with pytest.raises(FileOpError) as info:
        await harness.run(ReadFileTool(), path="prog.bin")
    message = info.value.message
    assert info.value.code == "binary" and "108 bytes" in message
    assert "DownloadFiles" in message and "base64" in message


async def test_big_file_line_count_is_not_passed_off_as_the_whole(harness: Harness, workspace: Path) -> None:
    lines = "".join(f"line {i}\n" for i in range(1, 60_001))  # ~650 KiB, far past READ_CAP
    (workspace / "huge.log").write_text(lines)
    output = await harness.run(ReadFileTool(), path="huge.log", limit=2)
    seen = output.metadata["lines_read"]
    assert seen < 60_000 and output.metadata["lines"] is None
    assert output.metadata["bytes"] == len(lines)
    text = text_of(output)
    assert f"of the first {seen} (of about" in text and f"{len(lines):,} bytes" in text
    assert f"{READ_CAP // 1024} KiB" in text


async def test_small_file_line_count_is_exact(harness: Harness, workspace: Path) -> None:
    (workspace / "a.txt").write_text("a\nb\nc\n")
    output = await harness.run(ReadFileTool(), path="a.txt")
    assert output.metadata["lines"] == 3 and output.metadata["bytes"] == 6


# -- shell: cwd and env --------------------------------------------------------------------------


async def test_shell_cwd_and_env(dispatcher: ToolDispatcher, workspace: Path) -> None:
    (workspace / "sub/dir").mkdir(parents=True)
    result = await _call(
        dispatcher,
        workspace,
        "shell",
        command='pwd; printf "%s|%s\\n" "$GREETING" "$EMPTY"',
        cwd="sub/dir",
        env={"GREETING": "hello world", "EMPTY": ""},
    )
    assert not result.is_error, _text(result)
    out = _text(result)
    assert out.splitlines()[0].endswith("/sub/dir") and "hello world|" in out


@pytest.mark.parametrize("cwd", ["..", "../..", "/etc", "sub/../../x"])
async def test_shell_cwd_escape_is_permission_denied(
    dispatcher: ToolDispatcher, workspace: Path, cwd: str
) -> None:
    (workspace / "sub").mkdir()
    result = await _call(dispatcher, workspace, "shell", command="touch escaped", cwd=cwd)
    assert result.is_error and result.error_class is ToolErrorClass.PERMISSION_DENIED, _text(result)
    assert not (workspace.parent / "escaped").exists()


async def test_shell_cwd_through_a_symlink_out_is_permission_denied(
    dispatcher: ToolDispatcher, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "link").symlink_to(outside)
    result = await _call(dispatcher, workspace, "shell", command="touch escaped", cwd="link")
    assert result.is_error and result.error_class is ToolErrorClass.PERMISSION_DENIED, _text(result)
    assert not (outside / "escaped").exists()


async def test_shell_missing_cwd_is_a_clear_error(dispatcher: ToolDispatcher, workspace: Path) -> None:
    result = await _call(dispatcher, workspace, "shell", command="true", cwd="nope")
    assert result.is_error and "working directory does not exist" in _text(result)


@pytest.mark.parametrize(
    "env",
    [{"1BAD": "x"}, {"A-B": "x"}, {"": "x"}, {"A=B": "x"}, {"OK": 1}, {"OK": "a\x00b"}, {"X": "y" * 70_000}],
    ids=["digit-first", "dash", "empty", "equals", "not-string", "nul", "too-big"],
)
async def test_shell_bad_env_is_a_validation_error(
    dispatcher: ToolDispatcher, workspace: Path, env: dict[str, object]
) -> None:
    result = await _call(dispatcher, workspace, "shell", command="touch ran", env=env)
    assert result.is_error and result.error_class is ToolErrorClass.VALIDATION_ERROR, _text(result)
    assert not (workspace / "ran").exists()


async def test_shell_too_many_env_vars_is_a_validation_error(
    dispatcher: ToolDispatcher, workspace: Path
) -> None:
    env = {f"V{i}": "x" for i in range(65)}
    result = await _call(dispatcher, workspace, "shell", command="true", env=env)
    assert result.error_class is ToolErrorClass.VALIDATION_ERROR


def test_shell_description_documents_cwd_and_env() -> None:
    (shell,) = [f() for f in builtin_factories() if f().definition.name == "shell"]
    description = shell.definition.description
    assert "cwd" in description and "env" in description and "environment" in description
    assert {"cwd", "env"} <= set(shell.definition.input_schema["properties"])


def test_commands_inherit_the_agent_environment() -> None:
    env = command_env({"PATH": "/x/bin", "PYTHONUNBUFFERED": "1", "DISPATCHER_AGENT_SECRET": "s"})
    assert env["PATH"] == "/x/bin" and env["PYTHONUNBUFFERED"] == "1"
    assert "DISPATCHER_AGENT_SECRET" not in env
    assert env["HOME"] == "/tmp" and env["LANG"] == "C.UTF-8"  # defaults for what is missing


async def test_shell_cwd_is_resolved_before_anyone_is_asked(workspace: Path, tmp_path: Path) -> None:
    """A cwd that leaves through a symlink is refused before a confirmation request is made."""
    from dispatcher.core import DispatcherConfig

    (tmp_path / "outside").mkdir()
    (workspace / "link").symlink_to(tmp_path / "outside")
    d = ToolDispatcher(
        LocalSandboxProvider(),
        config=DispatcherConfig(confirmation_timeout=0.05),  # a wrongly asked question ends quickly
        policy=ConfirmationPolicy.preset("cautious"),
    )
    for factory in builtin_factories():
        d.register(factory, builtin=True)
    d.seal()
    try:
        result = await _call(d, workspace, "shell", command="touch escaped", cwd="link")
        assert result.error_class is ToolErrorClass.PERMISSION_DENIED, _text(result)
        events = d.events("s1").subscribe(after_seq=0)._pending
        asked = [e for e in events if e.type == "tool.confirmation_requested"]
        assert asked == []
    finally:
        await d.aclose()
