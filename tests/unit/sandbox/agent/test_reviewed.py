"""Review mode's last check is the agent's: a write or patch given ``expect`` (the sha256 of the file
the accepted diff was made from, or "absent") replaces the file only if it still hashes so just
before the rename. A change made after the server's own check is refused, never overwritten."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from dispatcher.sandbox.agent.workspace import OpError, Workspace


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def refused(caught: pytest.ExceptionInfo[OpError]) -> bool:
    return caught.value.code == "changed" and "nothing was written" in caught.value.message


def leftovers(root: Path) -> list[str]:
    return [n for n in os.listdir(root) if n.endswith(".tmp")]


@pytest.mark.parametrize("approved", [False, True])
def test_a_write_over_a_file_that_changed_since_its_review_is_refused(
    workspace: Path, approved: bool
) -> None:
    ws = Workspace(str(workspace))
    (workspace / "f.txt").write_bytes(b"reviewed\n")
    reviewed = sha(b"reviewed\n")
    (workspace / "f.txt").write_bytes(b"changed meanwhile\n")  # by a command in the sandbox
    with pytest.raises(OpError) as caught:
        ws.write("f.txt", b"new\n", ws.resolve_exact("f.txt") if approved else None, reviewed)
    assert refused(caught)
    assert (workspace / "f.txt").read_bytes() == b"changed meanwhile\n" and not leftovers(workspace)
    ws.write("f.txt", b"new\n", None, sha(b"changed meanwhile\n"))  # what it is now: written
    assert (workspace / "f.txt").read_bytes() == b"new\n"


def test_a_file_reviewed_as_absent_must_still_be_absent(workspace: Path) -> None:
    ws = Workspace(str(workspace))
    (workspace / "new.txt").write_bytes(b"made meanwhile\n")
    with pytest.raises(OpError) as caught:
        ws.write("new.txt", b"x", None, "absent")
    assert refused(caught) and (workspace / "new.txt").read_bytes() == b"made meanwhile\n"
    ws.write("other.txt", b"x", None, "absent")
    assert (workspace / "other.txt").read_bytes() == b"x"


def test_a_file_grown_past_any_review_is_refused_without_reading_it(workspace: Path) -> None:
    ws = Workspace(str(workspace))
    with open(workspace / "big.bin", "wb") as f:  # sparse: 1 GiB that costs nothing to make
        f.truncate(1 << 30)
    with pytest.raises(OpError) as caught:
        ws.write("big.bin", b"x", None, sha(b""))
    assert refused(caught) and (workspace / "big.bin").stat().st_size == 1 << 30
