"""The agent ships as one zipapp (``sandbox_images/build.sh agent``) and runs as the package directory
(the local backend): both start under ``python3 -I`` and speak the protocol."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dispatcher.sandbox.agent.protocol import (
    MAX_HEADER,
    PREFIX,
    PROTOCOL_VERSION,
    Ping,
    Pong,
    Read,
    ReadResult,
    Write,
    decode_header,
    decode_prefix,
    encode_request,
)
from dispatcher.sandbox.local import AGENT_PATH

REPO = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pyz") / "agent.pyz"
    subprocess.run(["bash", str(REPO / "sandbox_images/build.sh"), "agent", str(out)], check=True, timeout=60)
    return out


def test_the_zipapp_holds_the_package_modules_and_nothing_else(pyz: Path) -> None:
    names = set(zipfile.ZipFile(pyz).namelist())
    assert names == {p.name for p in Path(AGENT_PATH).glob("*.py")}
    assert "__main__.py" in names and "protocol.py" in names


@pytest.mark.parametrize("where", ["zipapp", "directory"])
def test_the_agent_starts_isolated_and_answers(where: str, pyz: Path, tmp_path: Path) -> None:
    target = str(pyz) if where == "zipapp" else AGENT_PATH
    version = subprocess.run(
        [sys.executable, "-I", target, "--version"], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert version.stdout.strip() == f"dispatcher-agent protocol {PROTOCOL_VERSION}", version.stderr
    requests: list[Ping | Write | Read] = [Ping(), Write("f.txt", b"hello"), Read("f.txt", 100, True)]
    proc = subprocess.Popen(
        [sys.executable, "-I", target, "--root", str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    answers = []
    try:
        for rid, request in enumerate(requests, 1):  # one at a time: the read follows the write
            proc.stdin.write(encode_request(rid, request))
            proc.stdin.flush()
            header_len, payload_len = decode_prefix(
                proc.stdout.read(PREFIX.size), max_header=MAX_HEADER, max_payload=1 << 20
            )
            header = decode_header(proc.stdout.read(header_len))
            assert header["id"] == rid, header
            answers.append(request.decode_reply(header, proc.stdout.read(payload_len)))
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        proc.stdout.close()
    assert answers[0] == Pong(PROTOCOL_VERSION)
    assert answers[2] == ReadResult(5, b"hello")
