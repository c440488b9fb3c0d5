"""Names that are not valid UTF-8 (and other odd names) are reachable through the file tools.

list_dir shows such a byte as ``\\udcXX`` and a backslash as ``\\\\``; a path given back in that
form reaches the very file (read_file, write_file, patch_file, list_dir), and nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatcher.client import AsyncDispatcherClient
from tests.integration.grpc.single_tenant import Serve, serve_fixture  # noqa: F401  (fixture `serve`)
from tests.server.helpers import text_of

pytestmark = [pytest.mark.docker, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

ODD = [b"bad\xff.txt", b"back\\slash.txt", b"lat\xe9n1.txt", b"lit\\udcff.txt"]


async def _call(client: AsyncDispatcherClient, session_id: str, tool: str, **input_: str) -> str:
    result = await client.call(session_id, tool, input_)
    assert not result.is_error, text_of(result)
    return text_of(result)


def _read(path: bytes) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


@pytest.mark.parametrize("raw", ODD, ids=lambda r: r.decode("ascii", "backslashreplace"))
async def test_a_listed_name_reaches_its_file(serve: Serve, raw: bytes) -> None:
    client = await serve((1000, 1000))
    session = await client.create_session("w")
    workspace = Path(session.workspace_path)
    os.mkdir(os.path.join(bytes(workspace), b"d"))
    target = os.path.join(bytes(workspace), b"d", raw)
    with open(target, "wb") as fh:
        fh.write(b"one\ntwo\n")
    os.chown(target, 1000, 1000)
    os.chown(os.path.join(bytes(workspace), b"d"), 1000, 1000)

    listing = await _call(client, session.session_id, "list_dir", path="d")
    (shown,) = [line.split()[-1] for line in listing.splitlines() if "txt" in line]
    path = f"d/{shown}"
    assert "two" in await _call(client, session.session_id, "read_file", path=path)
    await _call(client, session.session_id, "patch_file", path=path, old="two", new="TWO")
    assert _read(target) == b"one\nTWO\n"
    await _call(client, session.session_id, "write_file", path=path, content="new\n")
    assert _read(target) == b"new\n"
    assert os.listdir(os.path.join(bytes(workspace), b"d")) == [raw]  # the same file, nothing else


async def test_a_new_file_can_be_given_a_byte_name(serve: Serve) -> None:
    client = await serve((1000, 1000))
    session = await client.create_session("w")
    await _call(client, session.session_id, "write_file", path="made\\udcfe.txt", content="x\n")
    assert os.listdir(bytes(Path(session.workspace_path))) == [b"made\xfe.txt"]
