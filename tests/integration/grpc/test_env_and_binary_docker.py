"""Issue 8 points 2-3 through gRPC on Docker: binary write_file, the image's environment, shell cwd/env."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.core.errors import ToolErrorClass
from tests.integration.conftest import ProviderFactory
from tests.integration.grpc.conftest import docker_server
from tests.server.conftest import Harness, base_config, deep_merge
from tests.server.helpers import text_of

pytestmark = pytest.mark.docker

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4 + b"\r\n\x1a\n"


@pytest.fixture
async def harness(make_provider: ProviderFactory, tmp_path: Path) -> AsyncIterator[Harness]:
    """The server on Docker; tenant alpha runs writes and commands without asking."""
    data: dict[str, Any] = deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker"}})
    data["tenants"][0]["tool_confirmation"] = {"default": {"EXECUTE": "auto", "WRITE": "auto"}}
    async with docker_server(make_provider, tmp_path, data) as harness:
        yield harness


async def test_binary_write_file_round_trip(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    encoded = base64.b64encode(PNG).decode()
    write = await client.call(
        session.session_id, "write_file", {"path": "img/a.png", "content": encoded, "encoding": "base64"}
    )
    assert not write.is_error, text_of(write)
    shell = await client.call(
        session.session_id, "shell", {"command": "sha256sum img/a.png; file -b img/a.png"}
    )
    digest, kind = text_of(shell).splitlines()
    assert digest.split()[0] == hashlib.sha256(PNG).hexdigest() and kind.startswith("PNG image")
    read = await client.call(session.session_id, "read_file", {"path": "img/a.png"})
    assert read.content[0].type == "image" and read.content[0].data == PNG


async def test_bad_base64_is_refused_and_nothing_is_written(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    result = await client.call(
        session.session_id, "write_file", {"path": "x.bin", "content": "QR==", "encoding": "base64"}
    )
    assert result.is_error and result.error_class is ToolErrorClass.VALIDATION_ERROR
    listing = await client.call(session.session_id, "shell", {"command": "ls -A"})
    assert "x.bin" not in text_of(listing)


async def test_binary_read_file_says_how_to_get_it(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    await client.call(session.session_id, "shell", {"command": "head -c 2000 /bin/sh > prog"})
    result = await client.call(session.session_id, "read_file", {"path": "prog"})
    assert result.is_error and "DownloadFiles" in text_of(result) and "base64" in text_of(result)


async def test_image_env_cwd_and_env_reach_the_command(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    await client.call(session.session_id, "shell", {"command": "mkdir -p pkg/src"})
    result = await client.call(
        session.session_id,
        "shell",
        {
            "command": 'pwd; echo "$PYTHONUNBUFFERED $GREETING"; python3 -c "import os; print(os.getcwd())"',
            "cwd": "pkg/src",
            "env": {"GREETING": "hi there"},
        },
    )
    assert not result.is_error, text_of(result)
    assert text_of(result).splitlines() == ["/workspace/pkg/src", "1 hi there", "/workspace/pkg/src"]


@pytest.mark.parametrize("cwd", ["..", "/etc", "pkg/../../..", "out"])
async def test_cwd_escape_is_permission_denied(harness: Harness, cwd: str) -> None:
    client = harness.client()
    session = await client.create_session()
    # "out" is a symlink the sandbox made, pointing outside the workspace.
    await client.call(session.session_id, "shell", {"command": "mkdir -p pkg && ln -s /etc out"})
    result = await client.call(session.session_id, "shell", {"command": "touch escaped", "cwd": cwd})
    assert result.is_error and result.error_class is ToolErrorClass.PERMISSION_DENIED, text_of(result)


async def test_bad_env_name_is_a_validation_error(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    result = await client.call(session.session_id, "shell", {"command": "true", "env": {"BAD-NAME": "x"}})
    assert result.is_error and result.error_class is ToolErrorClass.VALIDATION_ERROR
